"""`kernel-agent gate`: re-verify the whole serving kernel set (CI): JUnit and a markdown summary."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from ...harness.env import versions
from ...harness.manifest import ManifestEntry
from ...kernels import baseline as kernels_baseline
from ...sanitizer.report import merge_gpu, write_junit
from ...sanitizer.runner import run_many
from ...sanitizer.verdict import SanitizerMode, Verdict, quote_untrusted
from .. import ui
from .common import OP_NAMES, command, cuda_available, default_ledger, open_ledger
from .promotion_sections import md_word
from .views import (
    field_failure_line,
    versions_line,
)


def register(sub) -> None:
    g = sub.add_parser("gate", help="re-verify the whole serving kernel set (CI): JUnit + markdown summary")
    g.add_argument("--serving-dir", default=None, help="serving set folder (default kernels/serving)")
    g.add_argument("--junit", default=None, help="write JUnit XML here")
    g.add_argument("--summary", default=None, help="write the markdown summary here (and to $GITHUB_STEP_SUMMARY)")
    g.add_argument("--quick", action="store_true", help="quick sanitizer subset")
    g.add_argument(
        "--since-versions",
        action="store_true",
        help="only entries measured under other torch/triton/driver versions than this machine's",
    )
    g.add_argument("--no-baselines", action="store_true", help="do not re-check the baselines (the fallbacks)")
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--gpu", choices=["auto", "on", "off"], default="auto")
    g.add_argument(
        "--ledger",
        default=None,
        help="fail while a field failure recorded here is unresolved (default runs/ledger.db or "
        "KERNEL_AGENT_LEDGER; no file at the default: not read)",
    )
    command("gate")(cmd_gate)


# -- gate --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateItem:
    """One kernel the gate re-verifies."""

    op: str
    label: str  # op/bucket/dtype/gpu for a serving kernel, op/baseline for a baseline
    path: str  # what is judged: the file, or a promoted configuration rebuilt from its base
    shown: str = ""  # the name in the summary when it is not `path` (a configuration has no file of its own)
    error: str = ""  # why there is nothing to judge (a configuration whose base or hash no longer agrees)


def serving_gate_item(d: str, e: ManifestEntry) -> GateItem:
    """The gate's item for a kernel entry: its file, or its configuration rebuilt and checked against the
    hash that was judged (serving.entry_path), which is a failure of its own when they disagree."""
    from ...harness.serving import (
        serving,  # here: the serving set imports torch, which comes after the flags are checked
    )

    label = f"{e.op}/{e.bucket}/{e.dtype}/{e.gpu}"
    shown = os.path.join(d, serving.entry_name(e))
    if e.variant is None:
        return GateItem(e.op, label, shown)
    try:
        return GateItem(e.op, label, str(serving.entry_path(e, d)), shown)
    except serving.ServingError as err:
        return GateItem(e.op, label, shown, shown, error=str(err))


def cmd_gate(args) -> int:
    from ...harness.serving import (
        serving,  # here: the serving set imports torch, which comes after the flags are checked
    )

    field_failures = unresolved_field_failures(args)  # a missing --ledger is a usage error before any judging
    d = args.serving_dir or str(serving.serving_dir())
    entries = serving.load_manifest(d).kernels()  # the baseline and torch choices hold no kernel of their own
    now = versions()
    stale = [(e, diffs) for e in entries if (diffs := _version_changes(e, now))]
    if args.since_versions:
        entries = [e for e, _ in stale]
    items = [serving_gate_item(d, e) for e in entries]
    if not args.no_baselines and not args.since_versions:
        base_dir = os.path.dirname(kernels_baseline.__file__)
        items += [GateItem(op, f"{op}/baseline", os.path.join(base_dir, f"{op}.py")) for op in OP_NAMES]
    gpu = args.gpu == "on" or (args.gpu == "auto" and cuda_available())
    mode = SanitizerMode.QUICK if args.quick else SanitizerMode.FULL
    verdicts = _judge_gate_items(items, mode, gpu, args.jobs)
    md = _gate_markdown(
        verdicts,
        stale,
        now,
        mode + ("+gpu" if gpu else ""),
        d,
        [serving.describe_entry(e) for e in entries if e.variant is not None],
        field_failures,
    )
    _write_gate_documents(args, verdicts, field_failures, md)
    ok = all(v.passed for v in verdicts) and not field_failures
    ui.line(
        f"gate {'PASSED' if ok else 'FAILED'}: {sum(v.passed for v in verdicts)}/{len(verdicts)} kernel(s) "
        f"passed"
        + (f"; {len(stale)} measured under other versions" if stale else "")
        + (f"; {len(field_failures)} unresolved field failure(s)" if field_failures else ""),
        style="bold green" if ok else "bold red",
    )
    for v in verdicts:
        if not v.passed:
            ui.line(f"  FAIL {os.path.relpath(v.file)}: {v.summary()}", style="red")
    for r in field_failures:
        ui.line(f"  FIELD FAILURE {field_failure_line(r)}", style="red")
    return 0 if ok else 1


def unresolved_field_failures(args) -> list:
    """The unresolved field failures of the ledger `--ledger` (or KERNEL_AGENT_LEDGER) names, which must exist;
    of runs/ledger.db where neither names one and that file exists; else none (the gate as it was before
    the serving guard recorded anything)."""
    named = args.ledger or os.environ.get("KERNEL_AGENT_LEDGER")
    if not named and not os.path.exists(default_ledger()):
        return []
    return open_ledger(args, read=True).field_failures(unresolved_only=True)


def _write_gate_documents(args, verdicts: List[Verdict], field_failures: list, md: str) -> None:
    """The JUnit XML (each field failure a failed case of its own), the markdown summary, the CI step summary."""
    if args.junit:
        cases = [
            (f"{r.op}.{r.bucket}.{r.dtype}.{r.gpu}", f"field failure: {r.kind} {r.shape_class}", field_failure_line(r))
            for r in field_failures
        ]
        write_junit(verdicts, args.junit, failed_cases=cases)
    if args.summary:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary)), exist_ok=True)
        with open(args.summary, "w") as f:
            f.write(md)
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        with open(step, "a") as f:
            f.write(md)


# How often the gate says, through a pipe, that it is still working: as often as the run's plain status line.
GATE_STATUS_EVERY_S = 60.0


def _judge_gate_items(items: List[GateItem], mode: SanitizerMode, gpu: bool, jobs: int) -> List[Verdict]:
    """A verdict per item, op by op: a missing file fails, the rest are sanitized (and GPU-checked)."""
    verdicts: List[Verdict] = []
    title = f"gate: {len(items)} kernel(s), {mode}{' + gpu' if gpu else ''}, {jobs} at a time"
    if not ui.is_tty():  # the bar says it on a terminal; a pipe gets the line at once
        ui.line(title)
    # through a pipe, a status line every minute: one op's full pass can take minutes before its first verdict
    with ui.Progress(title, len(items), plain_status_every_s=GATE_STATUS_EVERY_S) as prog:
        by_op: Dict[str, List[GateItem]] = defaultdict(list)
        for it in items:
            by_op[it.op].append(it)
        for op, its in by_op.items():
            for it in its:
                if it.error:
                    verdicts.append(Verdict(it.shown or it.path, op, mode, error=it.error))
                    prog.advance(f"FAIL {it.label}: {it.error}")
                elif not os.path.exists(it.path):
                    verdicts.append(Verdict(it.path, op, mode, error=f"serving file missing: {it.path}"))
                    prog.advance(f"FAIL {it.label}: file missing")
            present = [it for it in its if not it.error and os.path.exists(it.path)]
            label = {os.path.abspath(it.path): it.label for it in present}

            judged = {mode: 0, SanitizerMode.GPU: 0}

            def done(
                v: Verdict,
                stage: SanitizerMode = mode,
                shown: Dict[str, str] = label,
                judged: Dict[SanitizerMode, int] = judged,
                op: str = op,
                n: int = len(present),
                last: SanitizerMode = SanitizerMode.GPU if gpu else mode,
            ) -> None:
                # each kernel as it is judged (through a pipe too: a CI log shows the gate moving)
                prog.note(
                    f"  {stage} {'PASS' if v.passed else 'FAIL'} {shown.get(v.file, v.file)} "
                    f"({v.duration_s:.0f}s, seed {v.seed}): {v.summary()[:120]}"
                )
                judged[stage] += 1
                prog.working_on(f"{op}: {judged[stage]}/{n} kernel(s) through {stage}")
                if stage == last:  # the kernel is done once its last stage has judged it: counted now
                    prog.advance()

            prog.working_on(f"{op}: 0/{len(present)} kernel(s) through {mode}")
            vs = run_many([it.path for it in present], op, mode, jobs=jobs, on_done=done)
            if gpu:
                prog.working_on(f"{op}: 0/{len(present)} kernel(s) through gpu")
                on_gpu = lambda v: done(v, SanitizerMode.GPU)  # noqa: E731
                gs = run_many([it.path for it in present], op, SanitizerMode.GPU, jobs=1, on_done=on_gpu)
                vs = [merge_gpu(a, b) for a, b in zip(vs, gs)]
            for it, v in zip(present, vs):
                v.file = it.shown or it.path
                verdicts.append(v)  # (its line came, and it was counted done, as it was judged)
    return verdicts


def _version_changes(e: ManifestEntry, now: Dict[str, Any]) -> List[str]:
    """'torch A -> B' for each of torch, Triton and the driver that differs from what the entry was measured on."""
    old = e.versions or {}
    return [
        f"{k} {old.get(k)} -> {now.get(k)}"
        for k in ("torch", "triton", "driver")
        if old.get(k) and now.get(k) and old.get(k) != now.get(k)
    ]


def _gate_markdown(
    verdicts, stale: List[Tuple[ManifestEntry, List[str]]], now, mode, d, configs=(), field_failures=()
) -> str:
    ok = all(v.passed for v in verdicts) and not field_failures
    lines = [
        f"## kernel-agent gate: {'passed' if ok else 'FAILED'}",
        "",
        f"Serving set `{d}`, sanitizer mode {mode}; {versions_line(now)}. Each kernel's inputs came from the "
        f"seed base shown: `kernel-agent sanitize --op OP --seed N FILE` gives it the same inputs.",
        "",
        "| kernel | result | FpSan | seed | first failure |",
        "|---|---|---|---:|---|",
    ]
    for v in verdicts:
        f = v.first_failure
        eq = {True: "equivalent", False: "not equivalent", None: "-"}[v.fpsan_equivalent]
        # a check's detail and the run's error can carry the candidate's own messages: quoted as data
        why = (
            f"`{md_word(f.name)}`: {quote_untrusted(f.detail, 200, markdown=True)}"
            if f
            else quote_untrusted(v.error, 200, markdown=True)
            if v.error
            else ""
        )
        seed = "" if v.seed is None else str(v.seed)
        lines.append(f"| `{os.path.relpath(v.file)}` | {'pass' if v.passed else '**FAIL**'} | {eq} | {seed} | {why} |")
    if stale:
        lines += ["", "Measured under other versions (re-checked above; re-benchmark on the GPU to re-promote):"]
        lines += [f"- `{e.file or e.op + '/' + e.bucket}`: {', '.join(diffs)}" for e, diffs in stale]
    if configs:
        lines += ["", "Promoted configurations (no file: rebuilt from their base, checked against the judged hash):"]
        lines += [f"- `{c}`" for c in configs]
    if field_failures:
        lines += [
            "",
            f"**{len(field_failures)} unresolved field failure(s):** the serving guard retired these kernels on "
            "real inputs (the trusted implementation serves those shape classes); `kernel-agent demote` of the "
            "bucket resolves them.",
            "",
        ]
        lines += [f"- {field_failure_line(r, markdown=True)}" for r in field_failures]
    return "\n".join(lines) + "\n"

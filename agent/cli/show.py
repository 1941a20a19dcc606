"""`kernel-agent show`: one run or one candidate in detail (verdicts, timings, diff, model exchange)."""

from __future__ import annotations

import collections
import json
import os
import re
import sys
from typing import Any, Dict, List

from ... import agent  # the door to the modules that import torch: each is read when first used
from ...harness.bench.figures import CLOCK_WORDS, candidate_results, fmt_ms, fmt_spread, fmt_x
from ...harness.ledger.ledger import RunStatus
from ...sanitizer.verdict import SanitizerMode
from .. import ui
from ..throughput import session_lines
from .common import (
    UsageError,
    command,
    open_ledger,
)
from .views import (
    candidate_doc,
    config_lines,
    diagnosis_lines,
    field_failure_line,
    judged_base,
    model_usage_line,
    run_doc,
    run_end_note,
    run_field_failures,
    unified_diff,
    versions_line,
)


def register(sub) -> None:
    s = sub.add_parser("show", help="a run or a candidate: verdicts, timings, diff, model exchange")
    s.add_argument("what", help="a run id (r...) or a candidate id (a number or c<number>)")
    s.add_argument("--ledger", default=None)
    s.add_argument("--json", action="store_true")
    s.add_argument("--source", action="store_true", help="print the candidate's whole source")


@command("show")
def cmd_show(args) -> int:
    led = open_ledger(args, read=True)
    what = args.what
    if re.fullmatch(r"c?\d+", what):
        return _show_candidate(led, int(what.lstrip("c")), args)
    run = led.get_run(what)
    if run is None:
        raise UsageError(f"no run or candidate {what!r} in the ledger")
    return _show_run(led, run, args)


def _show_run(led, run, args) -> int:
    if args.json:
        sys.stdout.write(json.dumps(run_doc(led, run), indent=2, default=str) + "\n")
        return 0
    summary = led.run_summary(run.id)
    cands = led.candidates(run_id=run.id)
    target = agent.recorded_target(run.notes)  # where it promoted
    started = run.started_at.strftime("%Y-%m-%d %H:%M")
    ended = run_end_note(run)
    # wall: start to end; a run that has not ended (interrupted, killed) the time its sessions ran
    elapsed = summary.wall_s if run.finished_at is not None else run.notes.elapsed_s
    ui.line(
        f"run {run.id} [{run.status}{ended}] proposer {run.proposer}, ops {run.ops}, started {started} UTC"
        + (f", wall {ui.duration(float(elapsed))}" if elapsed is not None else "")
        + (f", gpu {run.gpu_name}" if run.gpu_name else ", no GPU"),
        style="bold",
    )
    ui.line(f"versions: {versions_line(run.versions)}")
    rows = []
    results = {r.candidate_id: r for r in candidate_results(led.figures(run_id=run.id))}
    replayed = {c.id for c in cands} - led.judged_now(run.id)
    for c in cands:
        why = c.stored_verdict.failure()
        timing = _timing_words(results.get(c.id))
        eq = {True: "equiv", False: "not equiv", None: ""}[c.fpsan_equivalent]
        status = f"{c.status} (replayed)" if c.id in replayed else c.status  # judged by an earlier run
        bucket = os.path.basename(os.path.dirname(c.path)) if c.path else ""  # (the loop writes it there)
        rows.append([c.id, c.op, bucket, c.label or "", status, eq, timing, ui.clip(why, 90)])
    ui.table("candidates", ["id", "op", "bucket", "label", "status", "FpSan", "timing", "why"], rows)
    if summary.pruned:
        ui.line(
            f"{summary.pruned} proposal(s) kept off the GPU by the search's screens "
            f"(`kernel-agent show {summary.run_id}` says why)"
        )
    for line in diagnosis_lines(led, run.id):  # what bounds each incumbent, and why proposals were pruned
        ui.line(line)
    for p in summary.promotions:
        ui.line(f"promoted: {p.op} {p.bucket} {p.dtype} candidate #{p.candidate_id}: {p.reason}", style="green")
    for r in run_field_failures(led, run.id):  # what the serving guard found on what it promoted, or it resolved
        ui.line(f"field failure: {field_failure_line(r)}", style="green" if r.resolved else "red")
    if target is not None:
        ui.line(target.describe() if run.status == RunStatus.RUNNING else target.outcome())
    if model_usage_line(summary):
        ui.line(model_usage_line(summary))
    for line in session_lines(run.notes):
        ui.line(f"throughput, {line}")
    return 0


def _short_incumbent(label) -> str:
    """An incumbent's label for a narrow column (a serving kernel's file name is in --json)."""
    if label is None:
        return "none"
    return "serving" if label.startswith("serving:") else label


def _timing_words(result) -> str:
    """A candidate's judged speedup in a run (harness/bench/figures.py), as the report and history show it."""
    if result is None or result.speedup is None:
        return ""
    return (
        f"{fmt_x(result.speedup)} over {_short_incumbent(result.incumbent_label or 'mixed')} "
        f"({result.clocks.replace('event', 'events')})"
    )


def _show_candidate(led, cid: int, args) -> int:
    c = led.candidate(cid)
    if c is None:
        raise UsageError(f"no candidate {cid} in the ledger")
    if args.json:
        sys.stdout.write(json.dumps(candidate_doc(led, c), indent=2, default=str) + "\n")
        return 0
    eq = {True: "FpSan-equivalent to the baseline", False: "not structurally equivalent", None: "FpSan undecided"}[
        c.fpsan_equivalent
    ]
    ui.line(
        f"candidate #{c.id} {c.label} [{c.op}, {c.status}] by {c.proposer}; {eq}; hash {c.source_hash[:12]}",
        style="bold",
    )
    _print_checks(led.checks(cid))
    figs = led.figures(candidate_id=cid, judged_only=False)
    if figs:
        ui.table(
            "timings (against the incumbent timed beside it)",
            ["run", "shape", "ms", "spread", "incumbent", "its ms", "speedup", "clock", "of ceiling"],
            [
                [
                    f.run_id or "",
                    f.shape_key,
                    fmt_ms(f.kernel_ms),
                    fmt_spread(f.kernel_spread_ms),
                    _short_incumbent(f.incumbent_label),
                    fmt_ms(f.incumbent_ms),
                    fmt_x(f.speedup),
                    CLOCK_WORDS[f.clock],
                    f"{f.kernel.fraction(f.clock):.0%}" if f.kernel.fraction(f.clock) else "",
                ]
                for f in figs
            ],
        )
    unusable = any(x.get("name") == "reply" for x in (c.verdict or {}).get("checks", []))
    if unusable:  # no source came back: a diff would show the whole parent deleted
        ui.line(f"no source: the model's reply was unusable ({(c.verdict or {}).get('error', '')[:200]})")
    else:
        promo = next((p for p in led.promotions(op=c.op) if p.candidate_id == c.id), None)
        base = judged_base(led, c, promo.replaced_candidate_id if promo else None)
        diff = unified_diff(base.label, base.source, f"candidate #{c.id}", c.source)
        for line in filter(None, config_lines(base.source, c.source)):  # a configuration change says so first
            ui.line(line.replace("`", ""))
        if base.note:
            ui.line(base.note)
        ui.line(f"diff against {base.label} (what it was judged against):", style="bold")
        sys.stdout.write((diff or "(identical)\n") if not args.source else c.source)
    for r in led.field_failures(op=c.op, source_hash=c.source_hash):
        ui.line(f"field failure: {field_failure_line(r)}", style="green" if r.resolved else "red")
    _print_model_exchanges(led.model_calls(candidate_id=cid))
    return 0


def _print_checks(checks) -> None:
    if checks:
        # one row per check, from the most thorough mode that ran it (the quick stage repeats the full
        # stage's checks on fewer cases), and one line per mode with its totals
        rank = {mode: i for i, mode in enumerate(SanitizerMode)}  # (declared from the least thorough)
        best: Dict[str, Any] = {}
        for k in checks:
            if k.name not in best or rank.get(k.mode, 0) >= rank.get(best[k.name].mode, 0):
                best[k.name] = k
        order = list(dict.fromkeys(k.name for k in checks))
        by_mode: Dict[str, List[Any]] = {}
        for k in checks:
            by_mode.setdefault(k.mode, []).append(k)
        totals = "; ".join(
            f"{mode}: "
            + ", ".join(
                f"{n} {ui.STATUS_MARK.get(st, st)}"
                for st, n in sorted(collections.Counter(k.status for k in ks).items())
            )
            + f" in {sum(k.duration_s for k in ks):.1f}s"
            for mode, ks in by_mode.items()
        )
        ui.table(
            f"checks ({totals})",
            ["mode", "check", "result", "time", "detail"],
            [
                [
                    best[n].mode,
                    n,
                    ui.STATUS_MARK.get(best[n].status, best[n].status),
                    f"{best[n].duration_s:.1f}s",
                    best[n].detail,
                ]
                for n in order
            ],
            wrap=["detail"],
        )  # the detail (a failure, its --seed) is the point


def _print_model_exchanges(calls) -> None:
    for m in calls:
        ui.line(
            f"model exchange: {m.model}, {m.prompt_tokens}+{m.completion_tokens} tokens, {m.latency_s:.1f}s"
            + (f", error: {m.error}" if m.error else ""),
            style="bold",
        )
        try:
            msgs = json.loads(m.prompt)
            user = next((x["content"] for x in msgs if x.get("role") == "user"), "")
        except (ValueError, TypeError):
            user = m.prompt
        sys.stdout.write("--- prompt (user) ---\n" + user[:3000] + ("\n[...]\n" if len(user) > 3000 else "\n"))
        sys.stdout.write("--- reply ---\n" + (m.response or "(none)")[:3000] + "\n")

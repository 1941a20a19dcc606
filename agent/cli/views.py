"""The documents the read commands print with `--json` (`history`, `show`) and the web view
(`kernel-agent serve`, agent/web.py) serves: one reading of the ledger for both, so that a page and the
command line never disagree. Nothing here has SQL of its own: it reads through harness/ledger/ledger.py, and
every timing through harness/bench/figures.py.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ... import agent  # the door to the modules that import torch: each is read when first used
from ...harness.bench.diagnosis import Diagnosis
from ...harness.bench.figures import Leaderboard, TrendPoint, best_result, candidate_results
from ...harness.ledger.ledger import Ledger, Run, RunStatus, RunSummary
from ...sanitizer.canonical import as_written, judged_or_as_read
from ...sanitizer.config_variant import split_stored, steps_over
from ...sanitizer.verdict import CheckStatus, SanitizerMode, quote_untrusted
from ..throughput import session_lines


def run_end_note(run: Run) -> str:
    """Why a run that is over ended (the loop's stop reason), as ': REASON' after its status; '' otherwise."""
    stop = run.notes.stop
    return f": {stop}" if stop and run.status != RunStatus.RUNNING else ""


def versions_line(v: Dict[str, Any]) -> str:
    """The versions a run or a gate was judged under, as one phrase; those not recorded (no CUDA or driver on a
    machine without a GPU) are left out rather than printed as None."""
    return ", ".join(
        f"{name} {v[key]}"
        for key, name in (
            ("torch", "torch"),
            ("triton", "triton"),
            ("cuda", "CUDA"),
            ("driver", "driver"),
            ("python", "python"),
        )
        if v.get(key)
    )


# -- history ------------------------------------------------------------------------------------


def speedup_trend(led, op: str, runs) -> List[TrendPoint]:
    """Per run (oldest first) that judged a candidate of `op`: its best candidate, by the geometric mean
    of the judged figures over its bucket's shapes (each over the incumbent timed beside it)."""
    out = []
    for r in sorted(runs, key=lambda r: r.started_at):
        best = best_result(candidate_results(led.figures(op=op, run_id=r.id)))
        if best is not None:
            out.append(TrendPoint(r.id, r.started_at, best))
    return out


def run_row(led: Ledger, r: Run) -> Dict[str, Any]:
    """One run as `history` lists it: its counts and each session's throughput line."""
    s = led.run_summary(r.id)
    return {
        "id": r.id,
        "status": r.status,
        "proposer": r.proposer,
        "ops": r.ops,
        "started": r.started_at.isoformat(),
        "gpu": r.gpu_name,
        "candidates": s.candidates,
        "by_status": s.candidates_by_status,
        "judged_now": s.judged_now,
        "judged_now_by_status": s.judged_now_by_status,
        "replayed": s.replayed,
        "promotions": len(s.promotions),
        "throughput": session_lines(r.notes),
    }


@dataclass
class History:
    """What `history` shows: the runs that match its filters, and for one op its leaderboard and trend."""

    runs: List[Run]
    rows: List[Dict[str, Any]]
    board: Optional[Leaderboard] = None
    trend: Optional[List[TrendPoint]] = None

    def to_json(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {"runs": self.rows}
        if self.board is not None:
            doc["leaderboard"] = self.board.to_json()
        if self.trend is not None:
            doc["trend"] = [t.to_json() for t in self.trend]
        return doc


def history_data(
    led: Ledger,
    op: Optional[str] = None,
    status: Optional[str] = None,
    since=None,
    until=None,
    proposer: Optional[str] = None,
    gpu: Optional[str] = None,
    limit: Optional[int] = 20,
    leaderboard: bool = False,
    trend: bool = False,
) -> History:
    """The runs newest first (`Ledger.runs` filters them), and with `op` its leaderboard and trend."""
    runs = led.runs(op=op, status=status, since=since, until=until, proposer=proposer, gpu=gpu, limit=limit)
    # both need an op (`history` refuses them without --op)
    board = led.leaderboard(op) if leaderboard else None  # type: ignore[arg-type]
    points = speedup_trend(led, op, runs) if trend else None  # type: ignore[arg-type]
    return History(runs, [run_row(led, r) for r in runs], board, points)


# -- a run and a candidate ------------------------------------------------------------------------


def model_usage_line(summary: RunSummary) -> str:
    """What the run's code-model calls cost, per candidate it judged ('' for a run that made none):
    'model: 12 calls (1 failed), 45,000 tokens, 3,750 per judged candidate'."""
    m = summary.model
    if not m.calls:
        return ""
    failed = f" ({m.errors} failed)" if m.errors else ""
    judged = summary.judged_now
    per = f", {m.total_tokens / judged:,.0f} per judged candidate" if judged else ", no candidate judged"
    return f"model: {m.calls} calls{failed}, {m.total_tokens:,} tokens{per}"


def run_doc(led: Ledger, run: Run) -> Dict[str, Any]:
    """`show RUN --json`: the run's summary, configuration, versions, where it promoted, why it ended, its
    candidates, the diagnosis of each incumbent and the proposals pruned before the GPU (also as the lines
    `show` prints, which the web view shows)."""
    target = agent.recorded_target(run.notes)
    summary = led.run_summary(run.id)
    return {
        "run": summary.to_json(),
        "model_usage": model_usage_line(summary) or None,
        "config": run.config,
        "versions": run.versions,
        "serving": target.to_json() if target is not None else None,
        "throughput": session_lines(run.notes),
        "ended": run_end_note(run)[2:] or None,
        "candidates": _run_candidates(led, run.id),
        "diagnoses": [dict(r.document, incumbent=r.incumbent) for r in led.diagnoses(run_id=run.id)],
        "pruned": [
            {"op": p.op, "bucket": p.bucket, "label": p.label, "reason": p.reason} for p in led.pruned(run_id=run.id)
        ],
        "diagnosis_lines": diagnosis_lines(led, run.id),
        "field_failures": [field_failure_doc(r) for r in run_field_failures(led, run.id)],
    }


def _run_candidates(led: Ledger, run_id: str) -> List[Dict[str, Any]]:
    """A run's candidates, each marked `replayed` when an earlier run judged it (as `show RUN` says)."""
    now = led.judged_now(run_id)
    return [dict(candidate_doc(led, c, full=False), replayed=c.id not in now) for c in led.candidates(run_id=run_id)]


def candidate_doc(led: Ledger, c, full: bool = True) -> Dict[str, Any]:
    """`show C --json`: a candidate's verdict, checks (a failed one with the commands that reproduce it) and
    every benchmark of it, judged or not; `full` adds its source, the diff against what it was derived from,
    its promotions and demotions, and the model exchanges that produced it."""
    doc = {
        "id": c.id,
        "op": c.op,
        "bucket": os.path.basename(os.path.dirname(c.path)) if c.path else None,
        "label": c.label,
        "status": c.status,
        "proposer": c.proposer,
        "fpsan_equivalent": c.fpsan_equivalent,
        "hash": c.source_hash,
        "parent_id": c.parent_id,
        "verdict": c.verdict,
        "checks": [
            {"name": k.name, "status": k.status, "detail": k.detail, "mode": k.mode, "duration_s": k.duration_s}
            for k in led.checks(c.id)
        ],
        # every benchmark of it, judged or not (a candidate rejected after timing shows its figures too)
        "figures": [f.to_json() for f in led.figures(candidate_id=c.id, judged_only=False)],
    }
    if not full:
        return doc
    for k in doc["checks"]:
        k["reproduce"] = reproduce_check(led, c, k["mode"]) if k["status"] == CheckStatus.FAILED else None
    unusable = any(x.get("name") == "reply" for x in (c.verdict or {}).get("checks", []))
    promos = led.promotions(op=c.op)
    promo = next((p for p in promos if p.candidate_id == c.id), None)
    base = judged_base(led, c, promo.replaced_candidate_id if promo else None)
    doc.update(
        source=c.source,
        diff_against=base.label,
        diff_note=base.note or None,
        diff=None if unusable else unified_diff(base.label, base.source, f"candidate #{c.id}", c.source),
        config_change=[s.describe() for s in steps_over(base.source, c.source) or ()],
        promotions=[promotion_doc(p) for p in promos if c.id in (p.candidate_id, p.replaced_candidate_id)],
        field_failures=[field_failure_doc(r) for r in led.field_failures(op=c.op, source_hash=c.source_hash)],
        model_calls=[
            {
                "model": m.model,
                "prompt": m.prompt,
                "response": m.response,
                "prompt_tokens": m.prompt_tokens,
                "completion_tokens": m.completion_tokens,
                "latency_s": m.latency_s,
                "error": m.error,
            }
            for m in led.model_calls(candidate_id=c.id)
        ],
    )
    return doc


def promotion_doc(p) -> Dict[str, Any]:
    return {
        "id": p.id,
        "run_id": p.run_id,
        "op": p.op,
        "bucket": p.bucket,
        "dtype": p.dtype,
        "gpu": p.gpu_name,
        "candidate_id": p.candidate_id,
        "replaced_candidate_id": p.replaced_candidate_id,
        "old_ms": p.old_ms,
        "new_ms": p.new_ms,
        "gain": p.gain,
        "spread": p.spread,
        "reason": p.reason,
        "versions": p.versions,
        "created_at": p.created_at.isoformat(),
        "active": p.active,
        "demoted_at": p.demoted_at.isoformat() if p.demoted_at else None,
        "demote_reason": p.demote_reason,
    }


def diagnosis_lines(led, run_id: str, markdown: bool = False) -> List[str]:
    """What bounded each incumbent the run diagnosed (harness/bench/diagnosis.py), and the proposals it kept off the
    GPU with why: for `show` (plain lines) and `report` (markdown)."""
    out: List[str] = ["## Diagnoses", ""] if markdown else []
    latest = {}
    for row in led.diagnoses(run_id=run_id):
        latest[(row.op, row.bucket, row.dtype)] = row  # the last one of each bucket (after a promotion, say)
    for (op, bucket, dtype), row in latest.items():
        d = Diagnosis.from_json(row.document)
        head = f"{op} {bucket} {dtype}, incumbent {row.incumbent}"
        out += (
            ([f"**{head}**", ""] + [f"- {ln.lstrip('- ')}" for ln in d.lines()] + [""])
            if markdown
            else [f"diagnosis: {head}"] + [f"  {ln}" for ln in d.lines()]
        )
    pruned = led.pruned(run_id=run_id)
    if pruned:
        out += (
            [f"Pruned before the GPU: {len(pruned)} proposal(s)", ""]
            if markdown
            else [f"pruned before the GPU: {len(pruned)} proposal(s)"]
        )
        out += [
            f"- {p.op} {p.bucket} `{p.label}`: {p.reason}" if markdown else f"  {p.op} {p.bucket} {p.label}: {p.reason}"
            for p in pruned
        ]
        out += [""] if markdown else []
    return out if len(out) > 2 or not markdown else []


# -- the diff a candidate is shown with, and the commands that reproduce a verdict ---------------------


def config_lines(old: str, new: str) -> List[str]:
    """A launch-configuration change in words, one line per `_config` override (none for a code change): the
    serving set records such a promotion as its base and these lines, not as a copy of the file."""
    steps = steps_over(old, new)
    if not steps:
        return []
    return (
        ["A launch-configuration change (the kernels are untouched):", ""]
        + [f"- `{s.describe()}`" for s in steps]
        + [""]
    )


@dataclass(frozen=True)
class JudgedBase:
    """What a candidate was judged against, for its diff: a label, the source, and when that source is not
    today's baseline file although it was a baseline (the file has changed since), a note saying so."""

    label: str
    source: str
    note: str = ""


def judged_base(led, c, replaced_candidate_id: Optional[int] = None) -> JudgedBase:
    """The incumbent candidate `c` was judged against (not today's baseline, which may have changed since):
    the promoted kernel its promotion replaced (`replaced_candidate_id`), else its parent, else the source a
    configuration variant was made of (recovered exactly from the variant's own text), else the incumbent
    whose hash its benchmark recorded, found in the ledger; the baseline file as it is now only when nothing
    says otherwise (the note says when the hashes show it is not the one judged)."""
    for cid in (replaced_candidate_id, c.parent_id):
        p = led.candidate(cid) if cid else None
        if p is not None:
            return JudgedBase(f"candidate #{p.id}", p.source)
    today, baseline_label = agent.baseline_source(c.op), f"kernels/baseline/{c.op}.py"
    split = split_stored(c.source)
    recorded = _incumbent_hash(led, c.id)
    wanted = as_written(split[0]).hash if split is not None else recorded
    if wanted is None or wanted in (
        as_written(today).hash,
        judged_or_as_read(today).hash,
    ):  # judged texts are canonical
        return JudgedBase(baseline_label, today)
    known = led.find_candidate_by_hash(c.op, wanted)
    if known is not None and known.id != c.id:
        return JudgedBase(f"candidate #{known.id}", known.source)
    changed = f"{baseline_label} has changed since the candidate was judged"
    if split is not None:
        return JudgedBase(
            baseline_label, split[0], f"({changed}: the diff is against the source the candidate was made of)"
        )
    return JudgedBase(
        baseline_label,
        today,
        f"({changed}, and the ledger does not hold the source it was judged "
        f"against, hash {wanted[:12]}: the diff is against today's file)",
    )


def _incumbent_hash(led, cid: int) -> Optional[str]:
    """The source hash of the incumbent a benchmark of the candidate recorded (the loop records it since
    this version), or None."""
    for b in led.bench_results(candidate_id=cid):
        h = (b.extra or {}).get("incumbent_hash")
        if b.label != "candidate" and not b.label.startswith("anchor:") and h:
            return h
    return None


def unified_diff(old_label: str, old: str, new_label: str, new: str) -> str:
    """The diff between the canonical texts (a candidate is stored as one; the baseline's comments and
    docstrings are not a change)."""
    old, new = judged_or_as_read(old).text, judged_or_as_read(new).text
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=old_label, tofile=new_label, n=3
        )
    )


def seed_of(led, cid: int, mode: SanitizerMode = SanitizerMode.FULL) -> Optional[int]:
    """The seed base the sanitizer (`mode`) drew its inputs from, where its `load` check recorded it."""
    for k in led.checks(cid, mode=mode):
        m = re.search(r"seed base (\d+)", k.detail or "")
        if k.name == "load" and m:
            return int(m.group(1))
    return None


def extract_command(cid: int, ledger_flag: str, dest: str) -> str:
    """A command that writes candidate #cid's source, as the ledger holds it, to `dest`."""
    return (
        f"kernel-agent show {cid} --json{ledger_flag} | python3 -c 'import json, sys; "
        f'sys.stdout.write(json.load(sys.stdin)["source"])\' > {shlex.quote(dest)}'
    )


def reproduce_check(led: Ledger, c, mode: SanitizerMode) -> str:
    """The commands that run the stage (`mode`) that failed a check again, on the same inputs where the
    stage recorded its seed: the source out of the ledger, then the sanitizer."""
    dest = f"candidate-{c.id}.py"
    seed = seed_of(led, c.id, mode if mode != SanitizerMode.GPU else SanitizerMode.FULL)
    flags = {SanitizerMode.QUICK: " --quick", SanitizerMode.GPU: " --gpu on"}.get(mode, "")
    return (
        extract_command(c.id, f" --ledger {shlex.quote(led.shown)}", dest)
        + "\n"
        + f"kernel-agent sanitize --op {c.op} {dest}{flags}"
        + (f" --seed {seed}" if seed is not None else "")
    )


# -- the serving set, as the ledger records it ----------------------------------------------------------


def _geomean(xs: List[Optional[float]]) -> Optional[float]:
    known = [x for x in xs if x is not None and x > 0]
    if not xs or len(known) < len(xs):
        return None
    return math.exp(sum(math.log(x) for x in known) / len(known))


def _over_baseline(p, promos_by_candidate: Dict[int, Any]) -> Optional[float]:
    """A promoted kernel's speedup over the baseline: its promotion's (old over new time), times that of the
    promoted kernel it replaced, and so on down to the one that replaced the baseline."""
    x, seen = 1.0, set()
    while p is not None and p.id not in seen:
        seen.add(p.id)
        if not p.new_ms:
            return None
        x *= p.old_ms / p.new_ms
        if p.replaced_candidate_id is None:
            return x
        p = promos_by_candidate.get(p.replaced_candidate_id)
    return None


def manifest_rows() -> Dict[str, Any]:
    """What the serving folder serves (`kernels/serving/manifest.json`, as `serving.get` reads it), whichever
    ledger recorded its promotions: on a fresh clone the committed kernels serve before any run is recorded.
    {"path": the file, "entries": one per key, "error": why it cannot be read, or None}."""
    from ...harness.serving import serving  # here: the serving set imports torch; flags are checked first

    path = str(serving.serving_dir() / serving.MANIFEST_NAME)
    try:
        entries = serving.load_manifest().entries
    except serving.ServingError as e:
        return {"path": path, "entries": [], "error": str(e)}
    return {
        "path": path,
        "error": None,
        "entries": [
            {
                "op": e.op,
                "bucket": e.bucket,
                "dtype": e.dtype,
                "gpu": e.gpu,
                "serves": e.impl,
                "gain": e.gain,
                "promoted_at": e.promoted_at,
                "file": e.file or (f"{e.variant.base} + configuration" if e.variant is not None else None),
                "reason": e.reason,
            }
            for e in sorted(entries, key=lambda e: e.key())
        ],
    }


def serving_doc(led: Ledger) -> Dict[str, Any]:
    """`history --serving --json`: per (op, bucket, dtype, GPU) what serves it by the ledger's record (the
    active promotion; torch or the baseline by the benchmarks that timed them side by side, as `dispatch`
    chooses), its speedup over the baseline and against torch, the versions it was judged on; every field
    failure the serving guard recorded; every promotion and demotion, newest first; and per op each run's
    best candidate (`history --trend`)."""
    from ...harness.serving import serving  # here: the serving set imports torch; flags are checked first
    from ...harness.serving.dispatch import choices_from_rows  # here: as the serving set

    promos = led.promotions()
    active: Dict[tuple, Any] = {}
    for promo in promos:  # newest first: the newest active promotion of a key serves it
        active.setdefault((promo.op, promo.bucket, promo.dtype, serving.gpu_slug(promo.gpu_name)), promo)
    by_candidate = {p.candidate_id: p for p in reversed(promos)}
    choices = {
        (c.op, c.bucket, c.dtype, serving.gpu_slug(c.gpu or "")): c
        for c in choices_from_rows(led.bench_results(), {k: p.candidate_id for k, p in active.items()})
    }
    buckets = []
    for key in sorted(set(active) | set(choices)):
        p, ch = active.get(key), choices.get(key)
        figs = (
            [f for f in led.figures(candidate_id=p.candidate_id, run_id=p.run_id) if f.bucket == p.bucket]
            if p is not None
            else []
        )
        buckets.append(
            {
                "op": key[0],
                "bucket": key[1],
                "dtype": key[2],
                "gpu": p.gpu_name if p is not None else ch.gpu,  # type: ignore[union-attr]
                "serves": ch.impl if ch is not None else (serving.KERNEL if p is not None else serving.BASELINE),
                "candidate_id": p.candidate_id if p is not None else None,
                "over_baseline": _over_baseline(p, by_candidate) if p is not None else None,  # type: ignore[arg-type]
                # torch's time over the Triton side's: above 1 the Triton side is faster
                "vs_torch": ch.ratio if ch is not None else _geomean([f.anchor_ratio() for f in figs]),
                "torch_reason": ch.reason if ch is not None else None,
                "versions": p.versions if p is not None else None,
                "promoted_at": p.created_at.isoformat() if p is not None else None,
                "run_id": p.run_id if p is not None else None,
                "reason": p.reason if p is not None else None,
            }
        )
    runs = led.runs(limit=None)
    ops = sorted({o for r in runs for o in r.op_list})
    return {
        "buckets": buckets,
        "field_failures": [field_failure_doc(r) for r in led.field_failures()],
        "manifest": manifest_rows(),
        "promotions": [promotion_doc(p) for p in promos],
        "trend": {op: [t.to_json() for t in speedup_trend(led, op, runs)] for op in ops},
    }


# -- field failures -----------------------------------------------------------------------------


def field_failure_doc(r) -> Dict[str, Any]:
    """A field failure as `history --field-failures --json` and the web view's API give it."""
    return {
        "id": r.id,
        **r.failure().to_json(),
        "first_seen": r.first_seen.isoformat(),
        "last_seen": r.last_seen.isoformat(),
        "count": r.count,
        "resolved_at": r.resolved_at.isoformat() if r.resolved_at else None,
        "resolved_by": r.resolved_by,
    }


def _code(text: str) -> str:
    """A name as a markdown code span (backticks taken out: it cannot close its span)."""
    return "`" + " ".join(str(text).replace("`", "'").split()) + "`"


def field_failure_words(ff, markdown: bool = False) -> str:
    """A FieldFailure (harness/field_failures.py) in one line: the op, bucket, dtype and GPU, the kernel, the shape
    class, the kind and the detail (quoted: a crash's message can carry the kernel's own text)."""
    name = _code if markdown else str
    return (
        f"{name(ff.op)} {name(ff.bucket)} {ff.dtype} {ff.gpu}: kernel {name(ff.kernel)}, class {name(ff.shape_class)}: "
        f"{ff.kind.value}: {quote_untrusted(ff.detail, 200, markdown=markdown)}"
    )


def field_failure_line(r, markdown: bool = False) -> str:
    """A recorded field failure in one line: what failed (`field_failure_words`), how often and since when, and
    what resolved it. The same line in `gate`, `history`, `show` and `pr`."""
    name = _code if markdown else str
    seen = f"seen {r.count}x, first {r.first_seen:%Y-%m-%d %H:%M} UTC"
    resolved = f"; resolved by {name(r.resolved_by or '?')} at {r.resolved_at:%Y-%m-%d %H:%M} UTC" if r.resolved else ""
    return f"{field_failure_words(r.failure(), markdown)} ({seen}{resolved})"


def run_field_failures(led, run_id: str) -> list:
    """The field failures a run is part of: those of the kernels it promoted, and those it resolved (a demotion)."""
    promoted = {p.candidate_id for p in led.promotions(run_id=run_id) if p.candidate_id is not None}
    hashes = {c.source_hash for c in (led.candidate(cid) for cid in promoted) if c is not None}
    return [r for r in led.field_failures() if r.source_hash in hashes or r.resolved_by == run_id]

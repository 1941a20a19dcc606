"""`kernel-agent report`: a pull-request-ready markdown summary of a run, with its plots."""

from __future__ import annotations

import os
import shlex
from typing import Any, Dict, List

from ...harness.bench.figures import (
    candidate_results,
    fmt_ms,
    fmt_x,
)
from ...harness.ledger.ledger import CandidateStatus
from ...sanitizer.verdict import CheckStatus, quote_untrusted
from .. import ui
from .common import UsageError, check_writable, command, open_ledger
from .plots import STALE_PLOTS, have_matplotlib, run_plots
from .promotion_sections import (
    diff_section,
    md_word,
    portable_paths,
    promoted_kernels,
    promotion_header,
    short_label,
    timings_section,
    verdict_section,
)
from .views import (
    diagnosis_lines,
    versions_line,
)


def register(sub) -> None:
    r = sub.add_parser("report", help="pull-request-ready markdown summary of a run (with PNG plots)")
    r.add_argument("run", help="run id")
    r.add_argument("--out", default=None, help="output folder (default runs/<run>/report)")
    r.add_argument("--ledger", default=None)
    command("report")(cmd_report)


# -- report ------------------------------------------------------------------------------------


def cmd_report(args) -> int:
    led = open_ledger(args, read=True)
    run = led.get_run(args.run)
    if run is None:
        raise UsageError(f"no run {args.run!r} in the ledger")
    out = args.out or os.path.join("runs", run.id, "report")
    check_writable(out, "--out", folder=True)
    path = write_report(led, run, out)
    ui.line(f"wrote {path}")
    return 0


def write_report(led, run, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    summary = led.run_summary(run.id)
    # every figure below (tables, headlines, plots) is one of these: harness/bench/figures.py
    results = candidate_results(led.figures(run_id=run.id))
    stack = versions_line(run.versions)
    lines = [
        f"# kernel-agent run `{run.id}`",
        "",
        f"- proposer: **{run.proposer}**, ops: {run.ops}, status: {run.status}",
        f"- GPU: {run.gpu_name or 'none (verified, not benchmarked)'}; {stack}",
        # counted as `run` and `history` count them: what the run judged, apart from what it replayed
        f"- candidates judged by this run: {summary.judged_now} ({_judged_words(summary)}); "
        f"replayed from earlier runs: {summary.replayed}",
        f"- reproduce: `{reproduce_command(run.config or {})}` ("
        + (
            "the search proposes the same candidates from the same seed and ledger"
            if run.proposer == "search"
            else "a code model's replies differ from run to run; each candidate's exchange is in `show ID`"
        )
        + "; each check's detail names the seed base that gives its inputs again: "
        "`kernel-agent sanitize --op OP --seed N FILE`)",
        "",
    ]
    if summary.checks_failed:
        lines += [
            "Rejections by the check that caught them: "
            + ", ".join(f"`{k}` {n}" for k, n in sorted(summary.checks_failed.items())),
            "",
        ]
    for name in STALE_PLOTS:  # plots an earlier version wrote here would sit beside the new ones
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    plots = run_plots(led, run, out_dir)
    if plots:
        lines += ["## Speedup", ""] + [f"![{alt}]({os.path.basename(p)})" for alt, p in plots] + [""]
    elif results and not have_matplotlib():
        lines += ["(No plots: they need matplotlib, `pip install -e '.[report]'`.)", ""]
    lines += _candidate_table(led, run, results)
    lines += diagnosis_lines(led, run.id, markdown=True)
    lines += _results_table(results)
    promos = led.promotions(run_id=run.id)
    if not promos:
        lines += ["No kernel was promoted in this run.", ""]
    for pk in promoted_kernels(led, run, results):
        lines += promotion_header(pk)
        if pk.candidate is None:
            continue
        lines += timings_section(pk) + verdict_section(led, pk) + diff_section(pk)
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write(portable_paths("\n".join(lines) + "\n"))
    return path


def _judged_words(summary) -> str:
    """'verified 2' and, apart, what the run left unjudged: it read `judged by this run: 0 (proposed 1)`."""
    counts = summary.judged_now_by_status
    judged = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if n and k != CandidateStatus.PROPOSED)
    unjudged = counts.get(CandidateStatus.PROPOSED, 0)
    return (judged or "none") + (f"; {unjudged} left unjudged, for a later run or --resume" if unjudged else "")


def reproduce_command(config: Dict[str, Any]) -> str:
    """The `kernel-agent run` that makes a run with this recorded configuration again."""
    words = ["kernel-agent run", f"--ops {','.join(config.get('ops') or ['all'])}"]
    if config.get("proposer"):
        words.append(f"--proposer {config['proposer']}")
    model = config.get("model")
    if isinstance(model, dict):  # the recorded endpoint: its model and URL are flags (its key was never stored)
        words.append(f"--model {shlex.quote(str(model.get('model', '')))}")
        if model.get("base_url"):
            words.append(f"--base-url {shlex.quote(str(model['base_url']))}")
    elif model:
        words.append(f"--model {shlex.quote(str(model))}")
    if config.get("max_candidates") is not None:
        words.append(f"--candidates {config['max_candidates']}")
    if config.get("time_limit_s"):
        words.append(f"--time-limit {config['time_limit_s']:.0f}s")
    if config.get("dtype"):
        words.append(f"--dtype {config['dtype']}")
    if config.get("bench_shapes") and config["bench_shapes"] != "serving":
        words.append(f"--shapes {shlex.quote(str(config['bench_shapes']))}")
    return " ".join(words + [f"--seed {config.get('seed', 0)}"])


_IMPLAUSIBLE = " (implausible: a time above a measured ceiling; left out of the plots and the trend)"


def _results_table(results) -> List[str]:
    """Every benchmark of a candidate in the run, with the figures it was judged on."""
    if not results:
        return []
    lines = [
        "## Benchmarks",
        "",
        "Each candidate over the incumbent timed beside it: per shape incumbent ms -> candidate ms (speedup), "
        "and the geometric mean of the speedups over the shapes timed.",
        "",
        "| # | op | bucket | over | speedup | per shape | clock |",
        "|---:|---|---|---|---:|---|---|",
    ]
    for r in sorted(results, key=lambda r: r.candidate_id):
        shapes = "; ".join(
            f"{f.shape_key}: {fmt_ms(f.incumbent_ms)} -> {fmt_ms(f.kernel_ms)} ({fmt_x(f.speedup)})"
            if f.incumbent is not None
            else f"{f.shape_key}: {fmt_ms(f.kernel_ms)} (no incumbent)"
            for f in r.figures
        )
        lines.append(
            f"| {r.candidate_id} | {md_word(r.op)} | {md_word(r.bucket)} | "
            f"{md_word(short_label(r.incumbent_label))} | {fmt_x(r.speedup)} | {shapes}"
            f"{_IMPLAUSIBLE if r.implausible else ''} | "
            f"{r.clocks.replace('event', 'events')} |"
        )
    return lines + [""]


def _candidate_table(led, run, results=()) -> List[str]:
    """Every candidate the run proposed, with its verdict (one line each; a replay says so)."""
    cands = led.candidates(run_id=run.id)
    if not cands:
        return []
    speedups = {r.candidate_id: r for r in results}
    replayed = {p.candidate_id for p in led.proposals(run_id=run.id) if p.duplicate}
    lines = ["## Candidates", "", "| # | op | label | status | verdict |", "|---:|---|---|---|---|"]
    for c in cands:
        v = c.stored_verdict
        failed = v.first_failure
        if failed:  # a check's detail can carry the candidate's own text: quoted as data
            why = f"{md_word(failed.name)}: {quote_untrusted(portable_paths(failed.detail), 160, markdown=True)}"
        elif v.error:
            why = quote_untrusted(portable_paths(v.error), 160, markdown=True)
        elif c.status == CandidateStatus.PROPOSED:
            why = "not judged yet (`kernel-agent run --resume` finishes it)"
        else:
            n = sum(1 for x in v.checks if x.status == CheckStatus.PASSED)
            eq = {True: "FpSan-equivalent", False: "not structurally equivalent", None: "FpSan undecided"}[
                c.fpsan_equivalent
            ]
            why = f"passed {n} checks; {eq}" + (
                "; benchmarked" if c.status in (CandidateStatus.BENCHMARKED, CandidateStatus.PROMOTED) else ""
            )
            r = speedups.get(c.id)
            if r is not None and r.speedup is not None:
                why += f": {fmt_x(r.speedup)} over {md_word(short_label(r.incumbent_label))}"
        if c.id in replayed:
            why = f"judged by an earlier run: {why}"
        lines.append(f"| {c.id} | {md_word(c.op)} | {md_word(c.label or '')} | {md_word(c.status)} | {why} |")
    return lines + [""]

"""The surfaces reviewers touch: `history`, `report` (pull-request markdown + plots) and `gate` (CI)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..harness.env import versions
from ..harness.figures import (
    CLOCK_PHRASES,
    CLOCK_WORDS,
    CandidateResult,
    Leaderboard,
    TrendPoint,
    best_per_bucket,
    candidate_results,
    fmt_ms,
    fmt_saved,
    fmt_spread,
    fmt_x,
)
from ..harness.ledger import CandidateStatus
from ..harness.manifest import ManifestEntry
from ..kernels import baseline as kernels_baseline
from ..sanitizer.report import merge_gpu, write_junit
from ..sanitizer.runner import run_many
from ..sanitizer.verdict import CheckStatus, SanitizerMode, Verdict, fence_for, quote_untrusted
from . import ui
from .cli_common import OP_NAMES, UsageError, check_writable, command, cuda_available, default_ledger, open_ledger
from .views import (  # noqa: F401
    JudgedBase,
    config_lines,
    diagnosis_lines,
    field_failure_doc,
    field_failure_line,
    history_data,
    judged_base,
    serving_doc,
    speedup_trend,
    unified_diff,
    versions_line,
)


def register(sub) -> None:
    r = sub.add_parser("report", help="pull-request-ready markdown summary of a run (with PNG plots)")
    r.add_argument("run", help="run id")
    r.add_argument("--out", default=None, help="output folder (default runs/<run>/report)")
    r.add_argument("--ledger", default=None)
    command("report")(cmd_report)

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


# -- history -----------------------------------------------------------------------------------


def history(args, led) -> int:
    if (args.leaderboard or args.trend) and not args.op:
        raise UsageError("--leaderboard and --trend need --op")
    if getattr(args, "serving", False):
        return _print_serving(serving_doc(led), args.json)
    if getattr(args, "field_failures", False):
        return _print_field_failures(led.field_failures(op=args.op), args.json)
    h = history_data(
        led,
        op=args.op,
        status=args.status,
        since=args.since,
        until=args.until,
        proposer=args.proposer,
        gpu=getattr(args, "gpu", None),
        limit=args.limit,
        leaderboard=args.leaderboard,
        trend=args.trend,
    )
    doc = h.to_json()
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    _print_runs(h.rows)
    if args.leaderboard and h.board is not None:  # history_data made it
        _print_leaderboard(args.op, h.board)
    if args.trend and h.trend is not None:  # history_data made it
        _print_trend(args.op, h.trend)
    return 0


def _print_runs(runs: List[Dict[str, Any]]) -> None:
    """`history`'s table of runs, one row each (history_data's rows)."""
    # the counts before the text columns: at 80 columns a text column is cut or left out, never a count
    ui.table(
        f"runs ({len(runs)}); judged: by the run itself, of which rej(ected), ver(ified), bench(marked); "
        f"replay: judged by earlier runs",
        [
            "run",
            "status",
            "judged",
            "rej",
            "ver",
            "bench",
            "promoted",
            "replay",
            "proposer",
            "started (UTC)",
            "ops",
            "gpu",
        ],
        [
            [
                r["id"],
                r["status"],
                r["judged_now"],
                r["judged_now_by_status"].get(CandidateStatus.REJECTED, 0),
                r["judged_now_by_status"].get(CandidateStatus.VERIFIED, 0),
                r["judged_now_by_status"].get(CandidateStatus.BENCHMARKED, 0),
                r["promotions"],
                r["replayed"],
                r["proposer"],
                r["started"][:16].replace("T", " "),
                r["ops"],
                r["gpu"] or "-",
            ]
            for r in runs
        ],
        justify=["left"] * 2 + ["right"] * 6 + ["left"] * 4,
    )


def _print_leaderboard(op: str, board: Leaderboard) -> None:
    """`history --leaderboard`: the candidates of `op` faster than the incumbent timed beside them."""
    rows = [
        [
            e.figure.bucket,
            e.figure.shape_key,
            f"#{e.figure.candidate_id} {e.label or ''}".strip(),
            fmt_ms(e.figure.kernel_ms),
            _short_label(e.figure.incumbent_label),
            fmt_ms(e.figure.incumbent_ms),
            fmt_x(e.figure.speedup),
            CLOCK_WORDS[e.figure.clock],
            fmt_ms(e.figure.anchor_ms),
            e.figure.dtype,
            e.figure.gpu_name,
        ]
        for e in board.entries
    ]
    ui.table(
        f"leaderboard: {op} (candidates faster than the incumbent timed beside them)",
        ["bucket", "shape", "candidate", "ms", "over", "its ms", "speedup", "clock", "anchor ms", "dtype", "gpu"],
        rows,
    )
    if board.unbeaten:
        ui.line(f"no candidate beat its incumbent at: {'; '.join(board.unbeaten)}")


def _print_trend(op: str, trend: List[TrendPoint]) -> None:
    """`history --trend`: each run's best candidate of `op`, as the geometric mean of its bucket's speedups."""
    ui.table(
        f"speedup trend: {op} (each run's best candidate, geometric mean over its bucket's shapes)",
        ["run", "started", "candidate", "bucket", "speedup", "over", "clock"],
        [
            [
                t.run_id,
                t.started_at.isoformat()[:16].replace("T", " "),
                f"#{t.best.candidate_id}",
                t.best.bucket,
                fmt_x(t.speedup),
                _short_label(t.best.incumbent_label),
                t.best.clocks.replace("event", "events"),
            ]
            for t in trend
        ],
    )


def _print_serving(doc: Dict[str, Any], as_json: bool) -> int:
    """`history --serving`: what serves each bucket by the ledger's record, and the promotions and demotions."""
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    ui.table(
        "serving set (by the ledger: promotions, and torch against the Triton side where both were timed)",
        ["op", "bucket", "dtype", "gpu", "serves", "promoted", "over baseline", "torch/it", "promoted in"],
        [
            [
                b["op"],
                b["bucket"],
                b["dtype"],
                b["gpu"] or "-",
                b["serves"],
                f"#{b['candidate_id']}" if b["candidate_id"] is not None else "",
                fmt_x(b["over_baseline"]),
                f"{b['vs_torch']:.3f}" if b["vs_torch"] else "",
                b["run_id"] or "",
            ]
            for b in doc["buckets"]
        ],
    )
    for p in doc["promotions"]:
        ui.line(
            f"{p['created_at'][:16].replace('T', ' ')} #{p['candidate_id']} {p['op']} {p['bucket']} {p['dtype']}: "
            f"{p['reason']}"
            + (f"; demoted {p['demoted_at'][:16].replace('T', ' ')}: {p['demote_reason']}" if p["demoted_at"] else "")
        )
    return 0


def _print_field_failures(rows: list, as_json: bool) -> int:
    """`history --field-failures`: the unresolved first (what `gate` fails on), then the resolved, one line each."""
    if as_json:
        sys.stdout.write(json.dumps([field_failure_doc(r) for r in rows], indent=2) + "\n")
        return 0
    if not rows:
        ui.line("no field failures in this ledger")
        return 0
    open_ones = [r for r in rows if not r.resolved]
    ui.line(f"field failures: {len(open_ones)} unresolved, {len(rows) - len(open_ones)} resolved", style="bold")
    for r in open_ones:
        ui.line(f"  UNRESOLVED {field_failure_line(r)}", style="red")
    for r in rows:
        if r.resolved:
            ui.line(f"  resolved {field_failure_line(r)}")
    return 0


def _short_label(label) -> str:
    """An incumbent's label for a narrow column: a serving kernel's file name is in the JSON output."""
    if label is None:
        return "mixed"
    return "serving" if label.startswith("serving:") else label


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
    # every figure below (tables, headlines, plots) is one of these: harness/figures.py
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
    for name in _STALE_PLOTS:  # plots an earlier version wrote here would sit beside the new ones
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    plots = run_plots(led, run, out_dir)
    if plots:
        lines += ["## Speedup", ""] + [f"![{alt}]({os.path.basename(p)})" for alt, p in plots] + [""]
    elif results and not _have_matplotlib():
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


def portable_paths(text: str) -> str:
    """A document to share, without this machine's folders: paths in the working folder or the repository
    relative to it, paths under the home folder from ~."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root, shown in ((os.getcwd(), ""), (repo, ""), (os.path.expanduser("~"), "~/")):
        if root not in ("", os.sep):
            text = text.replace(root.rstrip(os.sep) + os.sep, shown)
    return text


# -- the sections of one promoted kernel: shared by `report` and `pr` (agent/pr.py) -----------------


@dataclass(frozen=True)
class PromotedKernel:
    """A promotion of the run with what its sections show. candidate: the promoted candidate (None for a
    promotion without one in the ledger); result: its benchmark in the run as judged (harness/figures.py;
    None when the run did not time it, a promotion by hand say); replaced: what it replaces, as a label
    and source (the replaced candidate, else the op's baseline file) for the diff."""

    promotion: Any
    candidate: Optional[Any]
    result: Optional[CandidateResult]
    replaced_label: str
    replaced_source: str
    replaced_note: str = ""  # when the source is not today's file of that name (JudgedBase.note)

    @property
    def replaced_what(self) -> str:
        pr = self.promotion
        return "the baseline" if pr.replaced_candidate_id is None else f"candidate #{pr.replaced_candidate_id}"


def promoted_kernels(led, run, results: List[CandidateResult]) -> List[PromotedKernel]:
    """The run's promotions in the order they were made, each with its judged result from `results`."""
    from .search import baseline_source  # here: the search imports torch; flags are checked first

    out = []
    for pr in sorted(led.promotions(run_id=run.id), key=lambda p: p.id):
        c = led.candidate(pr.candidate_id) if pr.candidate_id else None
        res = next(
            (
                r
                for r in results
                if r.candidate_id == pr.candidate_id
                and (r.op, r.bucket, r.dtype, r.gpu_name) == (pr.op, pr.bucket, pr.dtype, pr.gpu_name)
            ),
            None,
        )
        if c is not None:
            base = judged_base(led, c, pr.replaced_candidate_id)
        else:
            old = led.candidate(pr.replaced_candidate_id) if pr.replaced_candidate_id else None
            base = (
                JudgedBase(f"candidate #{old.id}", old.source)
                if old is not None
                else JudgedBase(f"kernels/baseline/{pr.op}.py", baseline_source(pr.op))
            )
        out.append(PromotedKernel(pr, c, res, base.label, base.source, base.note))
    return out


def promotion_header(pk: PromotedKernel) -> List[str]:
    """The heading, the rule's decision and the headline speedup over what it replaces."""
    pr, res = pk.promotion, pk.result
    if res is not None and res.speedup is not None:
        n = len(res.figures)
        head = (
            f"Replaces {pk.replaced_what}: **{fmt_x(res.speedup)}** ({fmt_saved(res.speedup)}), the geometric "
            f"mean over {n} shape{'s' if n != 1 else ''} of the speedups below, on {_clock_phrase(res.clocks)}; "
            f"the rule's noise {pr.spread:.1%}."
        )
    else:  # no benchmark of it in this run (a promotion by hand, say): the rule's record
        head = (
            f"Replaces {pk.replaced_what}: {fmt_saved(1 / (1 - pr.gain)) if pr.gain < 1 else ''} as the rule "
            f"recorded it (noise {pr.spread:.1%}); no benchmark of it in this run."
        )
    return [
        f"## Promoted: `{pr.op}` bucket `{pr.bucket}`, {pr.dtype}, {pr.gpu_name}",
        "",
        f"The rule: {pr.reason}",
        "",
        head + (" Demoted later: " + (pr.demote_reason or "") if pr.demoted_at else ""),
        "",
    ]


def timings_section(pk: PromotedKernel) -> List[str]:
    """Per shape: the incumbent, the candidate and the torch anchor timed side by side, clock named."""
    if pk.result is None or pk.candidate is None:
        return []
    lines = [
        "### Timings",
        "",
        "Each shape: the candidate against the incumbent timed beside it, on the clock the rule judged "
        "them by; speedup = incumbent ms / candidate ms, vs anchor = anchor ms / kernel ms (the torch "
        "anchor of the same benchmark), of ceiling: the kernel's fraction of the measured hardware "
        "ceiling at that time.",
        "",
        "| shape | kernel | ms | spread ms | clock | speedup | vs anchor | of ceiling |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for f in pk.result.figures:
        lines += _timing_rows(f, pk.candidate.id)
    return lines


def verdict_section(led, pk: PromotedKernel) -> List[str]:
    """FpSan equivalence in words, FpSan's own detail, and every check the candidate passed."""
    c = pk.candidate
    if c is None:
        return []
    eq = {
        True: "**FpSan-equivalent** to the baseline (bitwise identical under the payload algebra)",
        False: "**not structurally equivalent** under FpSan; passed the extended numeric suite",
        None: "FpSan equivalence undecided",
    }[c.fpsan_equivalent]
    lines = ["", "### Sanitizer verdict", "", eq + ".", ""]
    # check details and FpSan's detail can carry the candidate's own messages: quoted as data
    if (c.verdict or {}).get("fpsan_detail"):
        lines += [f"> FpSan: {quote_untrusted(portable_paths(c.verdict['fpsan_detail']), 400, markdown=True)}", ""]
    lines += ["| mode | check | result | detail |", "|---|---|---|---|"]
    for k in led.checks(c.id):
        detail = quote_untrusted(portable_paths(k.detail), 160, markdown=True) if k.detail else ""
        lines.append(f"| {_md_word(k.mode)} | {_md_word(k.name)} | {_md_word(k.status)} | {detail} |")
    return lines


def diff_section(pk: PromotedKernel) -> List[str]:
    """The unified diff against what it replaces (a configuration change is a few lines of `_config`), after
    the configuration in a line when that is all the change is."""
    c = pk.candidate
    if c is None:
        return []
    diff = unified_diff(pk.replaced_label, pk.replaced_source, f"candidate #{c.id} ({c.label})", c.source)
    fence = fence_for(diff)  # the candidate's source may hold backticks: the block must outlast them
    return [
        "",
        f"### Diff against {pk.replaced_label}",
        "",
        *([pk.replaced_note, ""] if pk.replaced_note else []),
        *config_lines(pk.replaced_source, c.source),
        f"{fence}diff",
        diff.rstrip() or "(identical)",
        fence,
        "",
    ]


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401 - optional extra (report): whether the plots can be drawn

        return True
    except ImportError:
        return False


def _timing_rows(f, cid: int) -> List[str]:
    """One shape of a promoted candidate's benchmark: the incumbent, the candidate and the anchor, each
    on the clock its comparison uses (the anchor on events where it has no graph time)."""
    rows = []
    for who, name in ((f.incumbent, None), (f.kernel, f"candidate #{cid}"), (f.anchor, None)):
        if who is None:
            continue
        clock = f.anchor_clock if who is f.anchor else f.clock
        speed = fmt_x(f.speedup) if who is f.kernel else ""
        ratio = fmt_x(f.anchor_ratio(who)) if who is not f.anchor else ""
        frac = who.fraction(clock)
        rows.append(
            f"| {f.shape_key} | {name or _md_word(who.label, extra=':')} | {fmt_ms(who.ms(clock))} | "
            f"{fmt_spread(who.spread_ms(clock))} | {CLOCK_WORDS[clock]} | {speed} | {ratio} | "
            f"{f'{frac:.0%} ({who.ceiling_kind})' if frac else ''} |"
        )
    return rows


def _clock_phrase(clocks: str) -> str:
    return " and ".join(CLOCK_PHRASES[c] for c in clocks.split("+"))


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
            f"| {r.candidate_id} | {_md_word(r.op)} | {_md_word(r.bucket)} | "
            f"{_md_word(_short_label(r.incumbent_label))} | {fmt_x(r.speedup)} | {shapes}"
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
            why = f"{_md_word(failed.name)}: {quote_untrusted(portable_paths(failed.detail), 160, markdown=True)}"
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
                why += f": {fmt_x(r.speedup)} over {_md_word(_short_label(r.incumbent_label))}"
        if c.id in replayed:
            why = f"judged by an earlier run: {why}"
        lines.append(f"| {c.id} | {_md_word(c.op)} | {_md_word(c.label or '')} | {_md_word(c.status)} | {why} |")
    return lines + [""]


def _md_word(text, extra: str = "") -> str:
    """A name recorded by the sanitizer (check, mode, status) or a benchmark label (extra=':'), shown bare
    when it is a plain word."""
    t = str(text or "")
    return t if re.fullmatch(rf"[A-Za-z0-9_.+{extra}-]{{1,80}}", t) else quote_untrusted(t, 80, markdown=True)


_STALE_PLOTS = ("best_time.png",)


def run_plots(led, run, out_dir: str):
    """The plots of a run (`_plots`), from its judged figures and promotions: what `report` writes and the
    web view shows."""
    return _plots(run, candidate_results(led.figures(run_id=run.id)), out_dir, led.promotions(run_id=run.id))


def _plots(run, results, out_dir: str, promotions=()):
    """speedup.png: per shape, the run's best candidate of each bucket over the incumbent timed beside it
    (and the torch anchor over the same incumbent); progress.png: each judged candidate's speedup over
    the run. Both read the judged figures (`results`); they need matplotlib."""
    best = best_per_bucket(results)
    if not best:
        return []
    try:
        import matplotlib  # optional extra (report): without it there are no plots

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # after the backend is chosen: pyplot reads it when first imported
    except ImportError:
        return []
    return [_speedup_plot(plt, run, best, out_dir), _progress_plot(plt, run, results, promotions, out_dir)]


def _speedup_plot(plt, run, best, out_dir: str) -> Tuple[str, str]:
    figs = [(r, f) for r in best.values() for f in r.figures]
    fig, ax = plt.subplots(figsize=(max(6.5, 2.6 * len(figs)), 5.0))
    x = list(range(len(figs)))
    sp = [f.speedup for _, f in figs]
    an = [f.anchor_speedup for _, f in figs]
    bars = ax.bar([i - 0.2 for i in x], sp, width=0.4, label="best candidate of the bucket / incumbent")
    abars = ax.bar(
        [i + 0.2 for i in x], [a or 0.0 for a in an], width=0.4, alpha=0.6, label="torch anchor / the same incumbent"
    )
    for b, val in list(zip(bars, sp)) + list(zip(abars, an)):
        if val:
            ax.annotate(
                fmt_x(val),
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(
        [
            f"{r.op} {r.bucket}\n{f.shape_key}\n#{r.candidate_id} over {_short_label(f.incumbent_label)}, "
            f"{CLOCK_WORDS[f.clock]}"
            for r, f in figs
        ],
        fontsize=7,
    )
    ax.set_ylabel("speedup over the incumbent (higher is better)")
    ax.set_ylim(0, max([v for v in sp + an if v] + [1.0]) * 1.15)
    ax.set_title(f"run {run.id}: speedup per shape of each bucket's best candidate", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    fig.tight_layout()
    p = os.path.join(out_dir, "speedup.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return "speedup per shape", p


def _progress_plot(plt, run, results, promotions, out_dir: str) -> Tuple[str, str]:
    fig, _ = progress_figure(plt, run, results, promotions)
    p = os.path.join(out_dir, "progress.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return "each candidate's speedup over the run", p


def progress_figure(plt, run, results, promotions) -> Tuple[Any, Any]:
    """Each judged candidate's speedup against the minutes into the run, labelled, with a note per promotion."""
    judged = [r for r in results if r.speedup is not None and not r.implausible and r.started_at is not None]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    labelled = []  # (minutes, speedup, text) of each point, labelled once the axes' limits are final
    for key in sorted({(r.op, r.bucket) for r in judged}):
        rs = [r for r in judged if (r.op, r.bucket) == key]
        mins = [(r.started_at - run.started_at).total_seconds() / 60 for r in rs]
        ax.plot(mins, [r.speedup for r in rs], "o", label=f"{key[0]} {key[1]}")
        labelled += [(m, r.speedup, f"#{r.candidate_id}") for m, r in zip(mins, rs)]
    ax.axhline(1.0, color="k", lw=0.8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.05 * (hi - lo))
    notes = []
    for i, pr in enumerate(sorted(promotions, key=lambda p: p.created_at)):
        # from here on the bucket's candidates are timed beside the promoted kernel; each note a line lower than
        # the one before, so that promotions close in time do not write over each other
        m = (pr.created_at - run.started_at).total_seconds() / 60
        ax.axvline(m, color="g", lw=0.8, ls=":")
        notes.append(
            ax.annotate(
                f"#{pr.candidate_id} promoted ({pr.bucket}):\nlater ones are over it",
                (m, 0.97 - 0.09 * (i % 8)),
                xycoords=("data", "axes fraction"),
                fontsize=6,
                color="g",
                xytext=(3, 0),
                textcoords="offset points",
                va="top",
            )
        )
    ax.set_xlabel("minutes into the run (when the benchmark was recorded)")
    ax.set_ylabel("speedup over the incumbent timed beside it")
    ax.set_title("each judged candidate: geometric mean over its bucket's shapes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    _label_points(fig, ax, labelled, avoid=_notes_inside(fig, ax, notes))
    return fig, ax


def _notes_inside(fig, ax, notes) -> List[Any]:
    """Each promotion note turned to the left of its line where it would run past the axes' right edge (into
    the legend, which sits there: a promotion late in the run was written under it); their boxes."""
    renderer = fig.canvas.get_renderer()
    right = ax.get_window_extent(renderer).x1
    boxes = []
    for note in notes:
        if note.get_window_extent(renderer).x1 > right:
            note.set_horizontalalignment("right")
            note.set_position((-3, 0))  # (the text's offset from its point, in points)
        boxes.append(note.get_window_extent(renderer))
    return boxes


# where a point's label may go, in points from it: right and up first, then below, further up, to the left
LABEL_OFFSETS = [(3, 3), (3, -9), (3, 10), (3, -16), (-18, 3), (-18, -9), (3, 17), (3, -23), (-18, 10), (-18, -16)]


def _label_points(fig, ax, points: List[Tuple[float, float, str]], avoid: Sequence[Any] = ()) -> None:
    """Label each point where its label overlaps no label placed before it nor a box of `avoid` (the first of
    LABEL_OFFSETS that is free; the first one where none is): labels of candidates judged close together were
    written over each other."""
    renderer = fig.canvas.get_renderer()
    placed: List[Any] = list(avoid)
    for x, y, text in sorted(points):
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(text, (x, y), fontsize=6, xytext=(dx, dy), textcoords="offset points")
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in placed):
                break
            label.remove()
        else:  # nowhere free: the first place, as before
            label = ax.annotate(text, (x, y), fontsize=6, xytext=LABEL_OFFSETS[0], textcoords="offset points")
            box = label.get_window_extent(renderer)
        placed.append(box)


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
    from ..harness import serving  # here: the serving set imports torch, which comes after the flags are checked

    label = f"{e.op}/{e.bucket}/{e.dtype}/{e.gpu}"
    shown = os.path.join(d, serving.entry_name(e))
    if e.variant is None:
        return GateItem(e.op, label, shown)
    try:
        return GateItem(e.op, label, str(serving.entry_path(e, d)), shown)
    except serving.ServingError as err:
        return GateItem(e.op, label, shown, shown, error=str(err))


def cmd_gate(args) -> int:
    from ..harness import serving  # here: the serving set imports torch, which comes after the flags are checked

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
            f"`{_md_word(f.name)}`: {quote_untrusted(f.detail, 200, markdown=True)}"
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

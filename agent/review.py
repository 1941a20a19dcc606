"""The surfaces reviewers touch: `history`, `report` (pull-request markdown + plots) and `gate` (CI)."""
from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict
from typing import Any, Callable, Dict, List

from ..sanitizer.verdict import fence_for, quote_untrusted
from . import ui


def register(sub, command) -> None:
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
    g.add_argument("--since-versions", action="store_true",
                   help="only entries measured under other torch/triton/driver versions than this machine's")
    g.add_argument("--no-baselines", action="store_true", help="do not re-check the baselines (the fallbacks)")
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--gpu", choices=["auto", "on", "off"], default="auto")
    command("gate")(cmd_gate)


# -- history -----------------------------------------------------------------------------------

def history(args, led) -> int:
    if (args.leaderboard or args.trend) and not args.op:
        from .errors import UsageError
        raise UsageError("--leaderboard and --trend need --op")
    runs = led.runs(op=args.op, status=args.status, since=args.since, until=args.until, proposer=args.proposer,
                    limit=args.limit)
    doc: Dict[str, Any] = {"runs": []}
    for r in runs:
        s = led.run_summary(r.id)
        doc["runs"].append({"id": r.id, "status": r.status, "proposer": r.proposer, "ops": r.ops,
                            "started": r.started_at.isoformat(), "gpu": r.gpu_name,
                            "candidates": s.get("candidates", 0), "by_status": s.get("candidates_by_status", {}),
                            "promotions": len(s.get("promotions", []))})
    if args.leaderboard:
        doc["leaderboard"] = led.leaderboard(args.op)
    if args.trend:
        doc["trend"] = speedup_trend(led, args.op, runs)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    ui.table(f"runs ({len(runs)})", ["run", "status", "proposer", "ops", "started (UTC)", "gpu", "cands", "rejected",
                                     "verified", "bench", "promoted"],
             [[r["id"], r["status"], r["proposer"], r["ops"], r["started"][:16].replace("T", " "), r["gpu"] or "-",
               r["candidates"], r["by_status"].get("rejected", 0), r["by_status"].get("verified", 0),
               r["by_status"].get("benchmarked", 0), r["promotions"]] for r in doc["runs"]],
             justify=["left"] * 6 + ["right"] * 5)
    if args.leaderboard:
        rows = [[e.get("bucket"), e.get("shape_key"), e.get("dtype"), e.get("gpu_name"),
                 f"#{e.get('candidate_id')} {e.get('label') or ''}".strip(), _f(e.get("best_ms")),
                 _f(e.get("baseline_ms")), _x(e.get("speedup")), _f(e.get("anchor_ms")), e.get("clock", "")]
                for e in doc["leaderboard"]]
        ui.table(f"leaderboard: {args.op}", ["bucket", "shape", "dtype", "gpu", "best", "ms", "baseline ms",
                                             "speedup", "anchor ms", "timed by"], rows)
    if args.trend:
        ui.table(f"speedup trend: {args.op}", ["run", "started", "best speedup over the baseline"],
                 [[t["run"], t["started"][:16], _x(t["speedup"])] for t in doc["trend"]])
    return 0


def _f(x) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) else ""


def _x(x) -> str:
    return f"{x:.3f}x" if isinstance(x, (int, float)) else ""


def _is_incumbent(b) -> bool:
    return b.label in ("baseline", "incumbent") or b.label.startswith("serving:")


def judged_times(rows) -> Dict[tuple, Callable[[Any], float]]:
    """Per (op, shape, dtype): how to read a row's time (`ledger.row_time`, as the promotion rule does)."""
    from ..harness.ledger import row_time
    groups: Dict[tuple, list] = defaultdict(list)
    for b in rows:
        groups[(b.op, b.shape_key, b.dtype)].append(b)
    return {k: row_time(g) for k, g in groups.items()}


def speedup_trend(led, op: str, runs) -> List[Dict[str, Any]]:
    """Per run (oldest first): the best geometric-mean speedup of a candidate over the incumbent measured in it
    (the incumbent's best time per shape)."""
    out = []
    for r in sorted(runs, key=lambda r: r.started_at):
        rows = [b for b in led.bench_results(run_id=r.id, op=op) if not b.implausible]
        t = judged_times(rows)
        base: Dict[tuple, float] = {}
        for b in rows:
            if _is_incumbent(b):
                k = (b.op, b.shape_key, b.dtype)
                base[k] = min(base.get(k, float("inf")), t[k](b))
        best: Dict[int, List[float]] = defaultdict(list)
        for b in rows:
            k = (b.op, b.shape_key, b.dtype)
            if b.label == "candidate" and k in base:
                best[b.candidate_id].append(base[k] / t[k](b))
        if best:
            import math
            sp = max(math.exp(sum(math.log(x) for x in v) / len(v)) for v in best.values())
            out.append({"run": r.id, "started": r.started_at.isoformat(), "speedup": sp})
    return out


# -- report ------------------------------------------------------------------------------------

def cmd_report(args) -> int:
    from .commands import _ledger
    led = _ledger(args, read=True)
    run = led.get_run(args.run)
    if run is None:
        from .errors import UsageError
        raise UsageError(f"no run {args.run!r} in the ledger")
    out = args.out or os.path.join("runs", run.id, "report")
    path = write_report(led, run, out)
    ui.line(f"wrote {path}")
    return 0


def write_report(led, run, out_dir: str) -> str:
    from ..harness.ledger import row_clock, row_ms, row_spread
    from .commands import unified_diff
    from .search import baseline_source
    os.makedirs(out_dir, exist_ok=True)
    summary = led.run_summary(run.id)
    v = run.versions
    stack = ", ".join(f"{name} {v[key]}" for key, name in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"),
                                                            ("driver", "driver"), ("python", "python")) if v.get(key))
    lines = [f"# kernel-agent run `{run.id}`", "",
             f"- proposer: **{run.proposer}**, ops: {run.ops}, status: {run.status}",
             f"- GPU: {run.gpu_name or 'none (verified, not benchmarked)'}; {stack}",
             f"- candidates: {summary.get('candidates', 0)} "
             f"({', '.join(f'{k} {n}' for k, n in sorted(summary.get('candidates_by_status', {}).items()))})",
             ""]
    if summary.get("failed_checks"):
        lines += ["Rejections by the check that caught them: " +
                  ", ".join(f"`{k}` {n}" for k, n in sorted(summary["failed_checks"].items())), ""]
    plots = _plots(led, run, out_dir)
    if plots:
        lines += ["## Speedup", ""] + [f"![{alt}]({os.path.basename(p)})" for alt, p in plots] + [""]
    elif led.bench_results(run_id=run.id) and not _have_matplotlib():
        lines += ["(No plots: they need matplotlib, `pip install -e '.[report]'`.)", ""]
    lines += _candidate_table(led, run)
    promos = led.promotions(run_id=run.id)
    if not promos:
        lines += ["No kernel was promoted in this run.", ""]
    for pr in promos:
        c = led.candidate(pr.candidate_id) if pr.candidate_id else None
        lines += [f"## Promoted: `{pr.op}` bucket `{pr.bucket}`, {pr.dtype}, {pr.gpu_name}", "",
                  f"{pr.reason}", "",
                  f"Replaces {'the baseline' if pr.replaced_candidate_id is None else f'candidate #{pr.replaced_candidate_id}'}: "
                  f"{pr.old_ms:.4f} ms -> {pr.new_ms:.4f} ms ({pr.gain:+.1%}, noise {pr.spread:.1%})."
                  + (" Demoted later: " + (pr.demote_reason or "") if pr.demoted_at else ""), ""]
        if c is None:
            continue
        # the figures the rule judged: CUDA-graph replays where every kernel of the shape has them
        lines += ["### Timings", "", "| shape | dtype | kernel | ms | spread ms | timed by | vs anchor | of ceiling |",
                  "|---|---|---|---:|---:|---|---:|---:|"]
        rows = [b for b in led.bench_results(run_id=run.id, op=pr.op) if b.bucket == pr.bucket and b.dtype == pr.dtype
                and b.candidate_id in (None, c.id)]  # not the rows timed beside another candidate
        by_shape: Dict[str, list] = {}
        for b in rows:
            by_shape.setdefault(b.shape_key, []).append(b)
        for shape, group in by_shape.items():
            clock = row_clock(group)
            anchor = next((row_ms(b, clock) for b in group if b.label.startswith("anchor")), None)
            for b in group:
                who = f"candidate #{c.id}" if b.label == "candidate" else b.label
                ms, spread = row_ms(b, clock), row_spread(b, clock)
                ratio = f"{anchor / ms:.2f}x" if anchor else ""
                frac = f"{b.fraction_of_ceiling:.0%} ({b.ceiling_kind}, events)" if b.fraction_of_ceiling else ""
                lines.append(f"| {shape} | {b.dtype} | {who} | {ms:.4f} | "
                             f"{f'{spread:.4f}' if spread is not None else ''} | "
                             f"{'graph' if clock == 'graph' else 'events'} | {ratio} | {frac} |")
        eq = {True: "**FpSan-equivalent** to the baseline (bitwise identical under the payload algebra)",
              False: "**not structurally equivalent** under FpSan; passed the extended numeric suite",
              None: "FpSan equivalence undecided"}[c.fpsan_equivalent]
        lines += ["", "### Sanitizer verdict", "", eq + ".", ""]
        # check details and FpSan's detail can carry the candidate's own messages: quoted as data
        if (c.verdict or {}).get("fpsan_detail"):
            lines += [f"> FpSan: {quote_untrusted(c.verdict['fpsan_detail'], 400, markdown=True)}", ""]
        lines += ["| mode | check | result | detail |", "|---|---|---|---|"]
        for k in led.checks(c.id):
            detail = quote_untrusted(k.detail, 160, markdown=True) if k.detail else ""
            lines.append(f"| {_md_word(k.mode)} | {_md_word(k.name)} | {_md_word(k.status)} | {detail} |")
        old = led.candidate(pr.replaced_candidate_id) if pr.replaced_candidate_id else None
        if old is not None:
            olabel, osrc = f"candidate #{old.id}", old.source
        else:
            olabel, osrc = f"kernels/baseline/{pr.op}.py", baseline_source(pr.op)
        diff = unified_diff(olabel, osrc, f"candidate #{c.id} ({c.label})", c.source)
        fence = fence_for(diff)  # the candidate's source may hold backticks: the block must outlast them
        lines += ["", f"### Diff against {olabel}", "", f"{fence}diff", diff.rstrip() or "(identical)", fence, ""]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _candidate_table(led, run) -> List[str]:
    """Every candidate the run proposed, with its verdict (one line each; a replay says so)."""
    cands = led.candidates(run_id=run.id)
    if not cands:
        return []
    replayed = {p.candidate_id for p in led.proposals(run_id=run.id) if p.duplicate}
    lines = ["## Candidates", "", "| # | op | label | status | verdict |", "|---:|---|---|---|---|"]
    for c in cands:
        v = c.verdict or {}
        failed = next((x for x in v.get("checks", []) if x.get("status") == "failed"), None)
        if failed:  # a check's detail can carry the candidate's own text: quoted as data
            why = f"{_md_word(failed.get('name'))}: {quote_untrusted(failed.get('detail', ''), 160, markdown=True)}"
        elif v.get("error"):
            why = quote_untrusted(v["error"], 160, markdown=True)
        elif c.status == "proposed":
            why = "not judged yet (`kernel-agent run --resume` finishes it)"
        else:
            n = sum(1 for x in v.get("checks", []) if x.get("status") == "passed")
            eq = {True: "FpSan-equivalent", False: "not structurally equivalent", None: "FpSan undecided"}[
                c.fpsan_equivalent]
            why = f"passed {n} checks; {eq}" + ("; benchmarked" if c.status in ("benchmarked", "promoted") else "")
        if c.id in replayed:
            why = f"judged by an earlier run: {why}"
        lines.append(f"| {c.id} | {_md_word(c.op)} | {_md_word(c.label or '')} | {_md_word(c.status)} | {why} |")
    return lines + [""]


def _md_word(text) -> str:
    """A name recorded by the sanitizer (check, mode, status), shown bare when it is a plain word."""
    t = str(text or "")
    return t if re.fullmatch(r"[A-Za-z0-9_.+-]{1,60}", t) else quote_untrusted(t, 60, markdown=True)


def _plots(led, run, out_dir: str):
    """speedup per shape (best candidate over the baseline) and best time over the run; needs matplotlib."""
    rows = led.bench_results(run_id=run.id)
    if not rows:
        return []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    rows = [b for b in rows if not b.implausible]
    t = judged_times(rows)  # graph replays for small kernels, as the rule judges them
    base: Dict[tuple, float] = {}
    anchor: Dict[tuple, float] = {}
    for b in rows:  # each one's best time in the run
        key = (b.op, b.shape_key, b.dtype)
        table = base if _is_incumbent(b) else anchor if b.label.startswith("anchor") else None
        if table is not None:
            table[key] = min(table.get(key, float("inf")), t[key](b))
    best: Dict[tuple, float] = {}
    timeline: Dict[tuple, List[tuple]] = defaultdict(list)
    for b in sorted(rows, key=lambda b: b.id):
        key = (b.op, b.shape_key, b.dtype)
        if b.label != "candidate":
            continue
        best[key] = min(best.get(key, float("inf")), t[key](b))
        timeline[key].append((b.created_at, best[key]))
    keys = [k for k in best if k in base]
    out = []
    if keys:
        fig, ax = plt.subplots(figsize=(max(6.0, 2.4 * len(keys)), 4.5))
        labels = [f"{k[0]}\n" + "\n".join(",".join(k[1].split(",")[i:i + 3]) for i in range(0, len(k[1].split(",")), 3))
                  for k in keys]
        sp = [base[k] / best[k] for k in keys]
        an = [base[k] / anchor[k] if k in anchor else 0 for k in keys]
        x = range(len(keys))
        ax.bar([i - 0.2 for i in x], sp, width=0.4, label="best candidate / incumbent")
        ax.bar([i + 0.2 for i in x], an, width=0.4, label="torch anchor / incumbent", alpha=0.6)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("speedup over the incumbent (higher is better)")
        ax.set_title(f"run {run.id}: speedup per shape")
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(out_dir, "speedup.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(("speedup per shape", p))
        fig, ax = plt.subplots(figsize=(7, 4))
        for k in keys:
            pts = timeline[k]
            t0 = pts[0][0]
            ax.step([(t - t0).total_seconds() / 60 for t, _ in pts], [base[k] / ms for _, ms in pts], where="post",
                    label=f"{k[0]} {k[1]}")
        ax.set_xlabel("minutes into the run")
        ax.set_ylabel("best speedup so far")
        ax.set_title("best time over the run")
        ax.legend(fontsize=6)
        fig.tight_layout()
        p = os.path.join(out_dir, "best_time.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(("best time over the run", p))
    return out


# -- gate --------------------------------------------------------------------------------------

def cmd_gate(args) -> int:
    from ..harness import serving
    from ..harness.env import versions
    from ..sanitizer.report import merge_gpu, write_junit
    from ..sanitizer.runner import run_many
    from ..sanitizer.verdict import Verdict
    from .cli import _cuda_available
    d = args.serving_dir or str(serving.serving_dir())
    manifest = serving.load_manifest(d)
    entries = manifest.get("entries", [])
    now = versions()
    stale = []
    for e in entries:
        old = e.get("versions") or {}
        diffs = [f"{k} {old.get(k)} -> {now.get(k)}" for k in ("torch", "triton", "driver")
                 if old.get(k) and now.get(k) and old.get(k) != now.get(k)]
        e["_stale"] = diffs
        if diffs:
            stale.append(e)
    if args.since_versions:
        entries = stale
    items: List[tuple] = []  # (op, label, path)
    for e in entries:
        items.append((e["op"], f"{e['op']}/{e['bucket']}/{e['dtype']}/{e['gpu']}", os.path.join(d, e["file"])))
    if not args.no_baselines and not args.since_versions:
        import kernel_agent.kernels.baseline as kb
        base_dir = os.path.dirname(kb.__file__)
        from ..harness.ops import OPS
        for op in OPS:
            items.append((op, f"{op}/baseline", os.path.join(base_dir, f"{op}.py")))
    gpu = args.gpu == "on" or (args.gpu == "auto" and _cuda_available())
    mode = "quick" if args.quick else "full"
    verdicts: List[Verdict] = []
    with ui.Progress(f"gate: {len(items)} kernel(s), {mode}{' + gpu' if gpu else ''}", len(items)) as prog:
        by_op: Dict[str, List[tuple]] = defaultdict(list)
        for it in items:
            by_op[it[0]].append(it)
        for op, its in by_op.items():
            missing = [it for it in its if not os.path.exists(it[2])]
            for it in missing:
                v = Verdict(it[2], op, mode, error=f"serving file missing: {it[2]}")
                verdicts.append(v)
                prog.advance(f"FAIL {it[1]}: file missing")
            present = [it for it in its if os.path.exists(it[2])]
            vs = run_many([it[2] for it in present], op, mode, jobs=args.jobs)
            if gpu:
                gs = run_many([it[2] for it in present], op, "gpu", jobs=1)
                vs = [merge_gpu(a, b) for a, b in zip(vs, gs)]
            for it, v in zip(present, vs):
                v.file = it[2]
                verdicts.append(v)
                prog.advance(f"{'PASS' if v.passed else 'FAIL'} {it[1]}: {v.summary()[:120]}")
    ok = all(v.passed for v in verdicts)
    md = _gate_markdown(verdicts, stale, now, mode + ("+gpu" if gpu else ""), d)
    if args.junit:
        write_junit(verdicts, args.junit)
    if args.summary:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary)), exist_ok=True)
        with open(args.summary, "w") as f:
            f.write(md)
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        with open(step, "a") as f:
            f.write(md)
    ui.line(f"gate {'PASSED' if ok else 'FAILED'}: {sum(v.passed for v in verdicts)}/{len(verdicts)} kernel(s) "
            f"passed" + (f"; {len(stale)} measured under other versions" if stale else ""),
            style="bold green" if ok else "bold red")
    for v in verdicts:
        if not v.passed:
            ui.line(f"  FAIL {os.path.relpath(v.file)}: {v.summary()}", style="red")
    return 0 if ok else 1


def _gate_markdown(verdicts, stale, now, mode, d) -> str:
    ok = all(v.passed for v in verdicts)
    lines = [f"## kernel-agent gate: {'passed' if ok else 'FAILED'}", "",
             f"Serving set `{d}`, sanitizer mode {mode}; torch {now.get('torch')}, triton {now.get('triton')}, "
             f"driver {now.get('driver')}.", "", "| kernel | result | FpSan | first failure |", "|---|---|---|---|"]
    for v in verdicts:
        f = v.first_failure
        eq = {True: "equivalent", False: "not equivalent", None: "-"}[v.fpsan_equivalent]
        # a check's detail and the run's error can carry the candidate's own messages: quoted as data
        why = (f"`{_md_word(f.name)}`: {quote_untrusted(f.detail, 200, markdown=True)}" if f else
               quote_untrusted(v.error, 200, markdown=True) if v.error else "")
        lines.append(f"| `{os.path.relpath(v.file)}` | {'pass' if v.passed else '**FAIL**'} | {eq} | {why} |")
    if stale:
        lines += ["", "Measured under other versions (re-checked above; re-benchmark on the GPU to re-promote):"]
        lines += [f"- `{e['file']}`: {', '.join(e['_stale'])}" for e in stale]
    return "\n".join(lines) + "\n"

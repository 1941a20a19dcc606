"""How fast a `kernel-agent run` judges candidates, read from its ledger; and the CPU sanitizer's cost.

    python scripts/throughput.py report LEDGER RUN [--json OUT]
        one row per session of the run (the run, then each `--resume`): time to the first benchmarked
        candidate, candidates judged (per GPU-hour), GPU occupancy after the first 3 minutes, how far
        past its time limit the session ended, what it left unjudged, median seconds per stage, GPU
        seconds per candidate (median per stage and in total; the target is 12 s), benchmarks stopped early
        by the sequential test, model tokens per judged candidate.
    python scripts/throughput.py sanitize [--seed N] [--json OUT]
        the full sanitizer on each of the five baselines, one after another, as `kernel-agent run`
        starts it (a sandboxed child), with its median: the CPU-side cost of one candidate. The inputs
        are drawn from a secret seed, as in a run, unless --seed fixes them (the same draws, so that two
        versions of the sanitizer can be compared on equal work).

scripts/gpu_throughput.sh runs the first on a GPU machine; results/README.md quotes both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

TARGETS = {
    "first benchmark": "<= 120 s",
    "judged per GPU-hour": ">= 120",
    "GPU busy after 3 min": ">= 70%",
    "past the limit": "<= 15 s",
    "GPU s per candidate (median)": "<= 12 s",
}


def _fmt(v, spec: str = "{:.0f}") -> str:
    return "-" if v is None else spec.format(v)


def report(ledger_path: str, run_id: str) -> dict:
    from kernel_agent.harness.ledger.ledger import Ledger

    ledger = Ledger(ledger_path)
    run = ledger.get_run(run_id)
    if run is None:
        raise SystemExit(f"no run {run_id!r} in {ledger_path}")
    sessions = run.notes.sessions or []
    statuses: dict = {}
    for c in ledger.candidates(run_id=run_id):
        statuses[c.status] = statuses.get(c.status, 0) + 1
    ledger.close()
    rows = [_session_row(s) for s in sessions]
    doc = {"run": run_id, "status": run.status, "candidates": statuses, "sessions": rows}
    print(f"run {run_id} ({run.status}): candidates by status {statuses}")
    _print_sessions(rows)
    print("targets (first run): " + "; ".join(f"{k} {v}" for k, v in TARGETS.items()))
    return doc


def _session_row(s: dict) -> dict:
    """The figures of one session of the run (the run's notes record each session: the run and each resume)."""
    n_gpus = s.get("n_gpus") or 0
    hours = s["wall_s"] * max(1, n_gpus) / 3600.0
    return {
        "session": "resume" if s.get("resumed") else "run",
        "time limit s": s.get("time_limit_s"),
        "wall s": round(s["wall_s"], 1),
        "first benchmark s": s.get("first_benchmark_s"),
        "judged": s.get("judged"),
        "judged per GPU-hour" if n_gpus else "judged per hour": round(s["judged"] / hours) if hours else None,
        "GPU busy after 3 min": s.get("gpu_busy_fraction"),
        "past the limit s": s.get("past_limit_s"),
        "left unjudged": s.get("unjudged"),
        "benchmarks": s.get("benchmarks"),
        "raced out": s.get("raced_out"),
        "median s per stage": s.get("stage_s", {}),
        "stopped early": s.get("stopped_early"),
        "GPU s per candidate": s.get("gpu_s", {}),
        "GPU busy s": s.get("gpu_busy_s"),
        "tokens per judged": round(s["tokens"] / s["judged"]) if s.get("tokens") and s.get("judged") else None,
        "sanitizer processes": s.get("cpu_slots"),
        "GPUs": n_gpus,
    }


def _print_sessions(rows: list) -> None:
    """The sessions as a table, then each one's median time per stage and GPU seconds per candidate."""
    from kernel_agent.agent.throughput import gpu_seconds_words

    head = [
        "session",
        "limit s",
        "wall s",
        "first bench s",
        "judged",
        "judged/h (per GPU)",
        "GPU busy",
        "past limit s",
        "unjudged",
        "benchmarks (raced out)",
    ]
    print(" | ".join(head))
    for r in rows:
        rate = r.get("judged per GPU-hour", r.get("judged per hour"))
        print(
            " | ".join(
                [
                    r["session"],
                    _fmt(r["time limit s"]),
                    _fmt(r["wall s"]),
                    _fmt(r["first benchmark s"]),
                    _fmt(r["judged"]),
                    _fmt(rate),
                    _fmt(r["GPU busy after 3 min"], "{:.0%}"),
                    _fmt(r["past the limit s"], "{:+.1f}"),
                    _fmt(r["left unjudged"]),
                    f"{_fmt(r['benchmarks'])} ({_fmt(r['raced out'])})",
                ]
            )
        )
    for r in rows:
        print(
            f"{r['session']}: median s per stage: "
            + ", ".join(f"{k} {v:.1f}" for k, v in r["median s per stage"].items())
        )
        if r["GPU s per candidate"]:
            print(f"{r['session']}: {gpu_seconds_words(r['GPU s per candidate'], r['GPU busy s'], r['judged'] or 0)}")
        print(
            f"{r['session']}: benchmarks stopped early by the sequential test {_fmt(r['stopped early'])}; "
            f"model tokens per judged candidate {_fmt(r['tokens per judged'])}"
        )


def sanitize_baselines(seed=None) -> dict:
    """Full sanitizer on each baseline in a child process, one at a time (wall seconds and the checks' sum)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from kernel_agent.ops import NAMES, OPS  # noqa: F401  (OPS loads every op: fails early on a broken install)
    from kernel_agent.sanitizer import runner

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for op in NAMES:
        path = os.path.join(root, "kernels", "baseline", f"{op}.py")
        t0 = time.time()
        v = runner.run_isolated(path, op, "full", seed=seed)
        wall = time.time() - t0
        checks = sum(c.duration_s or 0.0 for c in v.checks)
        rows.append(
            {
                "op": op,
                "passed": v.passed,
                "wall_s": round(wall, 1),
                "checks_s": round(checks, 1),
                "summary": v.summary(),
            }
        )
        print(
            f"{op:24s} {'passed' if v.passed else 'FAILED'}  {wall:6.1f} s wall  {checks:6.1f} s in checks", flush=True
        )
    med = statistics.median(r["wall_s"] for r in rows)
    print(
        f"median full-sanitizer time per candidate over the five baselines: {med:.1f} s "
        f"({os.cpu_count()} cores; target <= 25 s)"
    )
    return {"baselines": rows, "median_wall_s": med, "cores": os.cpu_count(), "seed": seed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("ledger")
    r.add_argument("run")
    r.add_argument("--json")
    s = sub.add_parser("sanitize")
    s.add_argument("--json")
    s.add_argument("--seed", type=int, help="the inputs' seed base (default: a secret one per baseline, as in a run)")
    args = ap.parse_args(argv)
    doc = report(args.ledger, args.run) if args.cmd == "report" else sanitize_baselines(args.seed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

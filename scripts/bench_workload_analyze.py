"""How long `kernel-agent workload analyze` takes on a large trace, and how much memory: the trace is made by
scripts/gen_workload_trace.py (seeded) when it is not there yet, then analysed by the command line in a child
process whose wall time, CPU time and peak resident memory are recorded with the machine's load.

    python scripts/bench_workload_analyze.py [--requests 1000000] [--rate 40] [--out results/cpu/workload_analyze_1m]

writes OUT.json (the figures) and OUT.txt (one line each, and the command's output).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--trace", help="default runs/workload_<requests>.jsonl")
    p.add_argument("--out", default=os.path.join("results", "cpu", "workload_analyze_1m"))
    a = p.parse_args(argv)
    trace = a.trace or os.path.join("runs", f"workload_{a.requests}.jsonl")
    if not os.path.isfile(trace):
        _generate_trace(trace, a.requests, a.rate)
    cmd = [
        sys.executable,
        "-m",
        "kernel_agent.agent.cli",
        "workload",
        "analyze",
        trace,
        "--model",
        a.model,
        "--json",
        a.out + ".analysis.json",
    ]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    load_before = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the generator's, when it ran: taken off below
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    doc = json.load(open(a.out + ".analysis.json")) if proc.returncode == 0 else {}
    sched = doc.get("kv", {}).get("bf16", {}).get("schedule", {})
    fig = {
        "requests": a.requests,
        "rate": a.rate,
        "trace_bytes": os.path.getsize(trace),
        "model": a.model,
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        # the largest child's (the generator's is far smaller)
        "peak_rss_mib": round(after.ru_maxrss / 1024, 1),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "steps": sched.get("steps"),
        "step_groups": sched.get("groups"),
        "command": " ".join(cmd[1:]),
    }
    _write_figures(a.out, fig, proc.stdout + proc.stderr)
    return proc.returncode


def _generate_trace(trace: str, requests: int, rate: float) -> None:
    """The seeded trace of `requests` requests arriving at `rate` a second (scripts/gen_workload_trace.py)."""
    os.makedirs(os.path.dirname(os.path.abspath(trace)), exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "gen_workload_trace.py"),
            str(requests),
            trace,
            "--rate",
            str(rate),
        ],
        check=True,
    )


def _write_figures(out: str, fig: dict, output: str) -> None:
    """OUT.json (the figures), OUT.txt (one line each, then the command's output); the figures printed too."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(fig, f, indent=2)
        f.write("\n")
    with open(out + ".txt", "w") as f:
        f.write("".join(f"{k}: {v}\n" for k, v in fig.items()) + "\n" + output)
    print(json.dumps(fig))
    if os.path.exists(out + ".analysis.json"):
        os.unlink(out + ".analysis.json")  # tens of kB of buckets and points: the figures are the result


if __name__ == "__main__":
    sys.exit(main())

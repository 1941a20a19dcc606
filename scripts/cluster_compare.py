"""The same short CPU-only `kernel-agent run` on a one-node and on a two-node local Ray cluster (one CPU
per node), and on this machine's own placement for reference: candidates judged per minute of each.

    python scripts/cluster_compare.py [--candidates 20] [--ops quantize_kv] [--seed 7] [--per-round 2]
                                      [--time-limit 60m] [--configs 1,2,local] [--out FILE.json]

Each configuration runs the built-in search proposer with the same seed, ops and candidate cap on a
ledger, candidates folder and serving set of its own (so nothing is replayed from another run and the
repository's serving set is not touched). A cluster's nodes are started here with `ray start --block`,
each in a process group of its own on free ports (agent/local_ray_cluster.py, which the cluster tests
start theirs with), and stopped by killing those groups, never with `ray stop` (which would stop every
Ray node of the machine). The cluster is up before its run starts: its start is
not measured. Nothing here needs a GPU: the sanitizer runs in Triton's interpreter.

Printed: one row per configuration (nodes, CPUs, candidates judged, the run's wall seconds as the loop
measured them, judged per minute, the process's wall seconds including its start), and each run's stop
reason: a run that ended before the cap (the time limit) is noted under the table.
Run it on an otherwise quiet machine with at least 2 free cores: the nodes share its cores with
whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from kernel_agent.agent.local_ray_cluster import LocalRayCluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
# the judges run Triton in its interpreter on every node, as on a CPU-only machine
ENV = dict(
    os.environ,
    TRITON_INTERPRET="1",
    PYTHONUNBUFFERED="1",
    PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
)


class LocalCluster(LocalRayCluster):
    """A Ray cluster of `n` one-CPU nodes on this machine, up on entering and stopped on leaving. It is
    watched from a child process: this one never joins it."""

    def __init__(self, n: int):
        super().__init__(prefix="kacc", env=ENV)
        self.n = n

    def __enter__(self) -> "LocalCluster":
        try:
            self.start_head(["--num-cpus", "1", "--num-gpus", "0"])
            self.wait_for(1)
            for k in range(1, self.n):
                self.start(f"node{k + 1}", ["--address", self.address, "--num-cpus", "1", "--num-gpus", "0"])
            self.wait_for(self.n)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_once(args, work: str, cluster: Optional[str]) -> Dict:
    """One `kernel-agent run` with its own ledger, candidates and serving set; its summary document."""
    os.makedirs(work, exist_ok=True)
    cmd = CLI + [
        "run",
        "--proposer",
        "search",
        "--ops",
        args.ops,
        "--candidates",
        str(args.candidates),
        "--per-round",
        str(args.per_round),
        "--seed",
        str(args.seed),
        "--time-limit",
        args.time_limit,
        "--ledger",
        os.path.join(work, "ledger.db"),
        "--candidates-dir",
        os.path.join(work, "candidates"),
        "--json",
    ]
    cmd += ["--cluster", cluster] if cluster else ["--jobs", str(args.local_jobs)]
    env = dict(ENV, KERNEL_AGENT_SERVING_DIR=os.path.join(work, "serving"))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    process_s = time.time() - t0
    with open(os.path.join(work, "run.err"), "w") as f:
        f.write(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"run exited {proc.returncode}: {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout)
    doc["process_s"] = process_s
    return doc


def measure(args, config: str, work: str) -> Dict:
    """One configuration: '1' or '2' (nodes of a local cluster) or 'local' (this machine, --jobs)."""
    if config == "local":
        doc = run_once(args, work, None)
        nodes, cpus = 0, args.local_jobs
    else:
        with LocalCluster(int(config)) as cluster:
            doc = run_once(args, work, cluster.address)
        nodes = cpus = int(config)
    th = doc.get("throughput") or {}
    judged, wall = int(th.get("judged", 0)), float(th.get("wall_s") or doc.get("wall_s") or 0.0)
    return {
        "config": "local placement" if config == "local" else f"Ray, {nodes} node(s)",
        "nodes": nodes,
        "cpus": cpus,
        "judged": judged,
        "wall_s": round(wall, 1),
        "judged_per_min": round(judged / wall * 60.0, 2) if wall > 0 else None,
        "process_s": round(doc["process_s"], 1),
        "candidates_by_status": doc.get("candidates_by_status"),
        "run_id": doc.get("run_id"),
        "stop_reason": doc.get("stop_reason"),
        "stage_s": th.get("stage_s"),
    }


def print_table(rows: List[Dict]) -> None:
    head = ["configuration", "nodes", "CPUs", "judged", "wall s", "judged/min", "process s"]
    table = [
        [
            r["config"],
            str(r["nodes"] or "-"),
            str(r["cpus"]),
            str(r["judged"]),
            f"{r['wall_s']:.1f}",
            "-" if r["judged_per_min"] is None else f"{r['judged_per_min']:.2f}",
            f"{r['process_s']:.1f}",
        ]
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *table)]
    for line in [head, ["-" * w for w in widths]] + table:
        print(" | ".join(x.ljust(w) for x, w in zip(line, widths)))
    for r in rows:  # a rate over a run cut short is still a rate, but its judged count is not the cap's
        if not str(r["stop_reason"] or "").startswith("candidate budget"):
            print(f"note: {r['config']} did not end at the candidate cap: {r['stop_reason']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", type=int, default=20, help="the run's candidate cap (default 20)")
    ap.add_argument("--ops", default="quantize_kv")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--per-round", type=int, default=2)
    # about 70 s a candidate on one 2-core machine's CPU (quick + full): 20 take about 25 minutes on one node
    ap.add_argument("--time-limit", default="60m", help="each run's limit; the cap should end it first")
    ap.add_argument("--configs", default="1,2,local", help="which, in order: 1, 2 (nodes) and local")
    ap.add_argument("--local-jobs", type=int, default=1, help="sanitizer processes of the local run (default 1)")
    ap.add_argument("--out", help="write the rows and settings as JSON here")
    ap.add_argument("--keep", help="keep each run's ledger and output under this folder (default: removed)")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if any(c not in ("1", "2", "local") for c in configs):
        ap.error("--configs: a comma list of 1, 2 and local")
    base = args.keep or tempfile.mkdtemp(prefix="cluster_compare_")
    rows = []
    try:
        for c in configs:
            print(f"{c}: running ...", file=sys.stderr, flush=True)
            rows.append(measure(args, c, os.path.join(base, f"config-{c}")))
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print_table(rows)
    settings = {k: getattr(args, k) for k in ("candidates", "ops", "seed", "per_round", "time_limit", "local_jobs")}
    doc = {
        "settings": settings,
        "rows": rows,
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

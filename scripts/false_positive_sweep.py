"""The sanitizer's false-positive rate: correct kernels judged on many random seeds, each in full.

    python scripts/false_positive_sweep.py [--kernels baselines,serving,good | FILE ...] [--seeds 50]
                                           [--first 0] [--jobs 1] [--mode full] [--checks a,b] [--timeout S]
                                           [--out results/cpu/false_positive_sweep.jsonl] [--summary]

Every kernel named is correct (the baselines, the promoted serving set, the correct candidate suite),
so every failed verdict is a false positive of the sanitizer. Each verdict comes from the normal runner
(sanitizer/runner.py `run_isolated`: a judge process of its own, the candidate in its sandbox), with
the seed base given explicitly so that a failure is reproduced by
`kernel-agent sanitize --op OP --seed SEED FILE`.

Seed i of the sweep is a 40-bit number drawn from a generator seeded with i (so seeds are spread over
the whole range, as the secret per-run seeds are, and the same i always gives the same seed). Work runs
seed-major (seed 0 for every kernel, then seed 1, ...) so a sweep stopped early covers all its kernels
evenly. One JSON line per verdict is appended to --out as soon as it is known; a (kernel, seed, mode,
checks) already in the file is not run again, so an interrupted sweep resumes where it stopped.
`--summary` prints the table of an existing file without running anything.

Nothing here needs a GPU: the checks run in Triton's interpreter (TRITON_INTERPRET=1 is set for the
judges by the runner). Run it at low priority on a shared machine (`nice -n 19`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterable, List, Optional, Tuple

from kernel_agent.agent.seed_sweep import checkout_commit, read_results, sweep_seed
from kernel_agent.ops import OPS
from kernel_agent.sanitizer.runner import run_isolated

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GROUPS = {
    "baselines": "kernels/baseline/[!_]*.py",
    "serving": "kernels/serving/*.py",
    "good": "tests/candidates/good/*/*.py",
}
DEFAULT_OUT = "results/cpu/false_positive_sweep.jsonl"


def op_of(path: str) -> str:
    """The op a kernel file implements, from where it lives: kernels/baseline/OP.py,
    kernels/serving/OP__BUCKET__...py, tests/candidates/*/OP/NAME.py."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    parts = rel.split(os.sep)
    name = os.path.basename(rel)[:-3]
    if parts[:2] == ["kernels", "baseline"]:
        op = name
    elif parts[:2] == ["kernels", "serving"]:
        op = name.split("__")[0]
    else:
        op = parts[-2]
    if op not in OPS:
        raise ValueError(f"{rel}: cannot tell its op (got {op!r}; ops: {', '.join(OPS)})")
    return op


def kernel_files(names: Iterable[str]) -> List[str]:
    """Group names (baselines, serving, good) expanded in order, and files as given; relative to the root."""
    files: List[str] = []
    for name in names:
        found = sorted(glob.glob(os.path.join(ROOT, GROUPS[name]))) if name in GROUPS else [name]
        for f in found:
            if not os.path.isfile(f):
                raise ValueError(f"no such kernel file or group: {name} (groups: {', '.join(GROUPS)})")
            rel = os.path.relpath(os.path.abspath(f), ROOT)
            if rel not in files:
                files.append(rel)
    return files


def _key(kernel: str, seed: int, mode: str, checks: str) -> Tuple[str, int, str, str]:
    return kernel, int(seed), mode, checks


def is_timeout(row: Dict) -> bool:
    """A verdict that ran out of time judged nothing (a loaded machine, not the kernel): it is neither a pass
    nor a false positive, and a resumed sweep judges it again."""
    return row["verdict"] == "timeout" or (row["verdict"] == "fail" and "time limit" in row.get("detail", ""))


def judge(
    kernel: str, seed: int, mode: str, checks: Optional[List[str]], commit: str, timeout_s: Optional[float] = None
) -> Dict:
    """One verdict of the normal runner, as the row the results file holds."""
    t0 = time.time()
    v = run_isolated(os.path.join(ROOT, kernel), op_of(kernel), mode, timeout_s, checks=checks, seed=seed)
    bad = v.first_failure
    timed_out = (v.error or "").startswith("not verified") or (bad is not None and "time limit" in bad.detail)
    return {
        "kernel": kernel,
        "op": op_of(kernel),
        "seed": seed,
        "mode": mode,
        "checks": ",".join(checks or []),
        "verdict": "pass" if v.passed else "timeout" if timed_out else "fail",
        "failed_check": bad.name if bad else ("verdict" if not v.passed else ""),
        "detail": (bad.detail if bad else v.error or "")[:600],
        "seconds": round(time.time() - t0, 1),
        "commit": commit,
    }


def summary(rows: List[Dict]) -> str:
    """One line per kernel: seeds judged, passes, failures and the checks that failed, verdicts that ran out
    of time (not judged); then the totals."""
    per: Dict[str, Dict] = {}
    for r in rows:
        s = per.setdefault(r["kernel"], {"seeds": set(), "pass": 0, "fail": 0, "timeout": 0, "checks": {}, "secs": 0.0})
        if is_timeout(r):
            s["timeout"] += 1
            continue
        s["seeds"].add(r["seed"])
        s[r["verdict"]] += 1
        s["secs"] += r.get("seconds", 0.0)
        if r["verdict"] == "fail":
            s["checks"][r["failed_check"]] = s["checks"].get(r["failed_check"], 0) + 1
    width = max([len(k) for k in per] + [6])
    lines = [f"{'kernel':<{width}}  seeds  pass  fail  timed_out  mean_s  failing checks"]
    for k, s in sorted(per.items()):
        n = s["pass"] + s["fail"]
        checks = ", ".join(f"{c} x{m}" for c, m in sorted(s["checks"].items())) or "-"
        lines.append(
            f"{k:<{width}}  {len(s['seeds']):>5}  {s['pass']:>4}  {s['fail']:>4}  {s['timeout']:>9}  "
            f"{s['secs'] / max(n, 1):>6.1f}  {checks}"
        )
    total = sum(s["pass"] + s["fail"] for s in per.values())
    fails = sum(s["fail"] for s in per.values())
    timeouts = sum(s["timeout"] for s in per.values())
    lines.append(
        f"{len(per)} kernels, {total} verdicts, {fails} failed ({fails / max(total, 1):.2%} false "
        f"positives); {timeouts} more ran out of time and judged nothing"
    )
    return "\n".join(lines)


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="kernel files (default: the groups of --kernels)")
    p.add_argument("--kernels", default="baselines,serving,good", help=f"groups: {', '.join(GROUPS)}")
    p.add_argument("--seeds", type=int, default=50, help="seeds per kernel")
    p.add_argument("--first", type=int, default=0, help="index of the first seed")
    p.add_argument("--jobs", type=int, default=1, help="verdicts judged in parallel")
    p.add_argument(
        "--mode",
        choices=("full", "quick", "gpu"),
        default="full",
        help="full: the CPU checks (interpreter); gpu: the GPU checks (a CUDA GPU)",
    )
    p.add_argument("--checks", default="", help="only these checks (comma-separated; default: all)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per verdict (default: the runner's, 600 in full mode; more on a loaded machine)",
    )
    p.add_argument("--out", default=os.path.join(ROOT, DEFAULT_OUT))
    p.add_argument("--summary", action="store_true", help="print the table of --out and exit")
    p.add_argument("--commit", default="", help="the commit the verdicts are of (default: the checkout's)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    a = _parse(argv)
    if a.summary:
        print(summary(read_results(a.out)))
        return 0
    try:
        kernels = kernel_files(a.files or [g for g in a.kernels.split(",") if g])
        for k in kernels:
            op_of(k)
    except ValueError as e:
        print(f"false_positive_sweep: {e}", file=sys.stderr)
        return 2
    checks = [c for c in a.checks.split(",") if c] or None
    done = {_key(r["kernel"], r["seed"], r["mode"], r["checks"]) for r in read_results(a.out) if not is_timeout(r)}
    todo = [
        (k, sweep_seed(i))
        for i in range(a.first, a.first + a.seeds)
        for k in kernels
        if _key(k, sweep_seed(i), a.mode, a.checks) not in done
    ]
    print(f"{len(kernels)} kernels x {a.seeds} seeds: {len(todo)} verdicts to judge, {a.jobs} at a time", flush=True)
    commit, lock = a.commit or checkout_commit(ROOT), threading.Lock()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def one(item):
        row = judge(item[0], item[1], a.mode, checks, commit, a.timeout)
        with lock, open(a.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"{row['verdict']}  {row['seconds']:>6.1f}s  seed {row['seed']}  {row['kernel']}"
            + (f"  [{row['failed_check']}] {row['detail'][:300]}" if row["failed_check"] else ""),
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        list(pool.map(one, todo))
    print(summary(read_results(a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

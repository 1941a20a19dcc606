"""Where the GPU checks' time goes: one candidate's gpu_differential, gpu_domain and determinism run in this
process as `sanitize --gpu on` runs them (the candidate in its sandboxed executor), with every case's time split
into drawing the inputs, the reference, the candidate's call (of which: the kernel in the executor, the rest the
copies to and from it), the comparison and the baseline's call for the error budget. Prints a table per check and
the slowest cases; writes the same as JSON.

Usage, on a GPU machine from the repository root:
PYTHONPATH=$PWD TRITON_INTERPRET=0 python3 scripts/gpu_check_profile.py [--op OP] [--file F] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import torch

from kernel_agent.ops import get_op
from kernel_agent.sanitizer import execution, executor, gpu

PHASES = ("make_case", "reference", "candidate_transfer", "candidate_kernel", "compare", "baseline", "other")


class Profile:
    def __init__(self) -> None:
        self.check = ""
        self.case: dict = {}
        self.cases: list = []
        self.totals: dict = collections.defaultdict(lambda: collections.defaultdict(float))
        self.kernel_s = 0.0  # the executor's own time for the call in flight

    def add(self, phase: str, seconds: float) -> None:
        self.case[phase] = self.case.get(phase, 0.0) + seconds
        self.totals[self.check][phase] += seconds

    def new_case(self, label: str) -> None:
        self.case = {"check": self.check, "case": label}
        self.cases.append(self.case)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(profile: Profile, phase: str, fn):
    def wrapper(*a, **k):
        if phase == "make_case":
            profile.new_case(str(a[0]))
        _sync()
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _sync()
            profile.add(phase, time.perf_counter() - t0)

    return wrapper


def instrument(profile: Profile, op) -> None:
    """Timers around the op's draws, references and comparisons, and the GPU checks' calls."""
    for name, phase in (("make_case", "make_case"), ("reference", "reference"), ("compare", "compare")):
        object.__setattr__(op, name, _timed(profile, phase, getattr(op, name)))
    plain_call = gpu._call
    plain_evidence = executor._evidence

    def evidence(reply, *a, **k):
        res = plain_evidence(reply, *a, **k)
        profile.kernel_s = res.elapsed_s
        return res

    def call(subject, fn, case):
        _sync()
        t0 = time.perf_counter()
        profile.kernel_s = 0.0
        try:
            return plain_call(subject, fn, case)
        finally:
            _sync()
            dt = time.perf_counter() - t0
            if isinstance(fn, executor.Executor):
                kernel = min(dt, profile.kernel_s)
                profile.add("candidate_kernel", kernel)
                profile.add("candidate_transfer", dt - kernel)
            else:
                profile.add("baseline", dt)

    gpu._call = call
    executor._evidence = evidence


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="decode_attention_int8")
    ap.add_argument("--file", help="the candidate (default: the op's baseline)")
    ap.add_argument("--json", help="write the profile here")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script under the interpreter")
    args = ap.parse_args()
    op = get_op(args.op)
    path = os.path.abspath(args.file or f"kernels/baseline/{args.op}.py")
    profile = Profile()
    instrument(profile, op)
    with open(path, "rb") as f:
        subject = gpu.Subject(op, path, f.read(), baseline=execution.baseline_fn(args.op), seed_base=0)
    subject.deadline = time.time() + 900
    subject.executor = executor.Executor(path, args.op, args.device, deadline=subject.deadline)
    wall = {}
    try:
        gpu.check_load(subject, None)
        for name, check in (
            ("gpu_differential", gpu.check_gpu_differential),
            ("gpu_domain", gpu.check_gpu_domain),
            ("determinism", gpu.check_determinism),
        ):
            profile.check = name
            t0 = time.perf_counter()
            note = check(subject, device=args.device)
            wall[name] = time.perf_counter() - t0
            print(f"{name}: {wall[name]:.1f} s: {note[:160]}", flush=True)
    finally:
        subject.executor.close()
    print(f"\n{'check':18s} {'wall':>7s} " + " ".join(f"{p:>18s}" for p in PHASES))
    for name, t in wall.items():
        phases = profile.totals[name]
        phases["other"] = t - sum(phases.values())  # set_args, resets, cache frees, the branch coverage
        print(f"{name:18s} {t:7.1f} " + " ".join(f"{phases.get(p, 0.0):18.1f}" for p in PHASES))
    print("\nslowest cases:")
    for c in sorted(profile.cases, key=lambda c: -sum(v for k, v in c.items() if k not in ("check", "case")))[:15]:
        parts = " ".join(f"{k}={v:.1f}" for k, v in c.items() if k not in ("check", "case") and v >= 0.05)
        print(f"  {c['check']:16s} {c['case'][:60]:60s} {parts}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"op": args.op, "file": path, "wall": wall, "totals": profile.totals, "cases": profile.cases}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The judge: `python -m kernel_agent.sanitizer.worker`, one process per candidate.

It never imports the candidate. It draws the inputs from a secret seed, computes the
references and the comparisons, runs the trusted baseline, and sends each case to the
candidate's executor (sanitizer/executor.py), a sandboxed process of its own, whose
answers are evidence. It rewrites a JSON progress file after every check, so that when
it is killed at its time limit the parent still knows which checks finished and which
one was running (sanitizer/runner.py); the candidate cannot write that file.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import secrets
import signal
import sys
import time
from typing import Callable, List, Optional

from .. import sanitizer  # the package door: sanitizer.checks and sanitizer.gpu load torch and triton on first use
from ..isolation.lease import wait_for_grant
from .canonical import judged_or_as_read
from .executor import Executor
from .static_gate import check_source
from .verdict import CheckOutcome, SanitizerMode, Verdict


def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """If the parent is killed (even with SIGKILL), take this process down with it (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--mode", default=SanitizerMode.FULL, type=SanitizerMode, choices=list(SanitizerMode))
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep-going", action="store_true")
    ap.add_argument("--checks", default="", help="comma-separated subset of checks (static_gate and load always run)")
    ap.add_argument("--seed", type=int, default=None, help="the base of every input seed (default: a secret one)")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds by which the candidate is judged")
    ap.add_argument("--skip-gate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--gpu-lease",
        action="store_true",
        help="gpu mode: ask the parent for the GPU before the first check on it (isolation/lease.py)",
    )
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    _die_with_parent()
    only = [c for c in args.checks.split(",") if c] or None
    if args.mode != SanitizerMode.GPU:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere
    seed_base = args.seed if args.seed is not None else secrets.randbelow(1 << 40)
    deadline = args.deadline or time.time() + 600
    with open(args.file, "rb") as f:  # bytes: the gate judges how Python would read them
        raw = f.read()
    # a verdict cut short still names its inputs, and the text it is about (the loop holds it to the candidate's)
    progress = {
        "file": args.file,
        "op": args.op,
        "mode": args.mode,
        "running": None,
        "checks": [],
        "started": time.time(),
        "seed": seed_base,
        "source_hash": judged_or_as_read(raw).hash,
    }
    _write(args.out, progress)

    # The candidate's process is started first, so that its imports overlap with this one's; it is
    # not started at all for a file that the static gate rejects.
    gate_ok = args.skip_gate or check_source(raw, args.op).passed
    executor = None
    if gate_ok and args.mode != SanitizerMode.GPU:
        executor = Executor(args.file, args.op, "cpu", deadline=deadline, skip_gate=args.skip_gate)

    def on_start(name: str):
        progress["running"] = name
        _write(args.out, progress)

    def on_check(outcome: CheckOutcome):
        progress["checks"].append(outcome.to_json())
        progress["running"] = None
        _write(args.out, progress)

    try:
        verdict = _judge(args, executor, only, seed_base, deadline, on_check, on_start)
    finally:
        if executor is not None:
            executor.close()
    doc = dict(verdict.to_json(), seed=seed_base, source_hash=progress["source_hash"], complete=True)
    _write(args.out, doc)
    return 0


def _judge(
    args: argparse.Namespace,
    executor: Optional[Executor],
    only: Optional[List[str]],
    seed_base: int,
    deadline: float,
    on_check: Callable[[CheckOutcome], None],
    on_start: Callable[[str], None],
) -> Verdict:
    """Run the checks of args.mode on the candidate: on the GPU, or through its executor in the interpreter."""
    # the checks through the package door: torch and triton load after the executor has started (and the
    # interpreter's checks after TRITON_INTERPRET is set)
    if args.mode == SanitizerMode.GPU:
        return sanitizer.gpu.sanitize_gpu(
            args.file,
            args.op,
            on_check=on_check,
            on_start=on_start,
            only=only,
            seed_base=seed_base,
            deadline=deadline,
            skip_gate=args.skip_gate,
            before_gpu=(lambda: wait_for_grant("gpu")) if args.gpu_lease else None,
        )
    return sanitizer.checks.sanitize_file(
        args.file,
        args.op,
        args.mode,
        on_check=on_check,
        on_start=on_start,
        fail_fast=False if args.keep_going else None,
        only=only,
        executor=executor,
        seed_base=seed_base,
        skip_gate=args.skip_gate,
    )


if __name__ == "__main__":
    sys.exit(main())

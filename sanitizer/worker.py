"""Entry point of the isolated sanitizer process: `python -m kernel_agent.sanitizer.worker`.

It runs one candidate's checks and rewrites a JSON progress file after every check,
so that when the candidate crashes the process or hangs, the parent still knows which
checks finished and which one was running (sanitizer/runner.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _write(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """If the parent is killed (even with SIGKILL), take this process down with it (Linux)."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--mode", default="full", choices=["quick", "full", "gpu"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep-going", action="store_true")
    ap.add_argument("--checks", default="", help="comma-separated subset of checks (static_gate and load always run)")
    args = ap.parse_args(argv)
    _die_with_parent()
    only = [c for c in args.checks.split(",") if c] or None
    if args.mode != "gpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere
    from .verdict import CheckOutcome, Verdict

    progress = {"file": args.file, "op": args.op, "mode": args.mode, "running": None, "checks": [],
                "started": time.time()}

    def on_start(name: str):
        progress["running"] = name
        _write(args.out, progress)

    def on_check(outcome: CheckOutcome):
        progress["checks"].append(outcome.to_json())
        progress["running"] = None
        _write(args.out, progress)

    _write(args.out, progress)
    if args.mode == "gpu":
        from .gpu import sanitize_gpu
        verdict: Verdict = sanitize_gpu(args.file, args.op, on_check=on_check, on_start=on_start, only=only)
    else:
        from .checks import sanitize_file
        verdict = sanitize_file(args.file, args.op, args.mode, on_check=on_check, on_start=on_start,
                                fail_fast=False if args.keep_going else None, only=only)
    doc = verdict.to_json()
    doc["complete"] = True
    _write(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

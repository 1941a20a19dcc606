"""`kernel-agent sanitize`: the sanitizer on candidate files (CI gating), and the sandbox this host gives
(`--sandbox`)."""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List

from ...isolation.sandbox import host_protections
from ...sanitizer.report import merge_gpu, verdicts_json, write_junit
from ...sanitizer.runner import run_many
from ...sanitizer.verdict import SanitizerMode, Verdict
from .. import ui
from .common import OPS_HELP, UsageError, check_files, check_op, command, cuda_available

# The command modules add their subcommands' parsers in this order (the order `--help` lists them).


def register(sub) -> None:
    s = sub.add_parser("sanitize", help="run the sanitizer on candidate files")
    s.add_argument("--op", help=OPS_HELP + " (required with FILE)")
    s.add_argument("files", nargs="*", metavar="FILE")
    s.add_argument("--json", action="store_true", help="print one JSON document")
    s.add_argument("--junit", metavar="PATH", help="write JUnit XML")
    s.add_argument("--quick", action="store_true", help="the agent's inner-loop subset (seconds per file)")
    s.add_argument("--keep-going", action="store_true", help="run every check even after one fails")
    s.add_argument("--jobs", type=int, default=1, help="files sanitized in parallel (default 1)")
    s.add_argument("--timeout", type=float, default=None, help="seconds per file (default 120 quick, 600 full)")
    s.add_argument(
        "--gpu",
        choices=["auto", "on", "off"],
        default="auto",
        help="GPU checks: auto runs them when a CUDA GPU is present",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the inputs' seed base, to reproduce a failure (default: a secret one per file)",
    )
    s.add_argument(
        "--sandbox", action="store_true", help="print the protections the candidate sandbox has on this host and exit"
    )


@command("sanitize")
def cmd_sanitize(args) -> int:
    if args.sandbox:
        return _print_sandbox()
    if not args.op:
        raise UsageError("sanitize: --op is required")
    check_op(args.op)
    if not args.files:
        raise UsageError("sanitize: give at least one FILE (or --sandbox)")
    check_files(args.files)
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    mode = SanitizerMode.QUICK if args.quick else SanitizerMode.FULL
    gpu = args.gpu == "on" or (args.gpu == "auto" and cuda_available())
    if args.gpu == "on" and not cuda_available():
        raise UsageError("--gpu on: no CUDA GPU on this machine")
    total = len(args.files) * (2 if gpu else 1)
    with ui.Progress(f"sanitize {args.op} ({mode}{' + gpu' if gpu else ''})", total) as prog:
        lock = threading.Lock()

        def done(v):
            # one file without a terminal: the report below says the same, so no progress line too
            if not args.json and (total > 1 or ui.is_tty()):
                with lock:
                    prog.advance(
                        f"{'PASS' if v.passed else 'FAIL'} {os.path.relpath(v.file)} ({v.mode}, {v.duration_s:.0f}s)"
                    )

        def cpu_checks():
            return run_many(
                args.files,
                args.op,
                mode,
                jobs=args.jobs,
                timeout_s=args.timeout,
                keep_going=args.keep_going,
                on_done=done,
                seed=args.seed,
            )

        if gpu:  # the CPU checks and the device's at once: each judge is a process of its own
            with ThreadPoolExecutor(max_workers=2) as pool:
                on_cpu = pool.submit(cpu_checks)
                gpu_mode = SanitizerMode.GPU
                on_gpu = pool.submit(
                    run_many, args.files, args.op, gpu_mode, args.jobs, args.timeout, on_done=done, seed=args.seed
                )
                verdicts = [merge_gpu(v, g) for v, g in zip(on_cpu.result(), on_gpu.result())]
        else:
            verdicts = cpu_checks()
    if args.junit:
        write_junit(verdicts, args.junit)
    print_verdicts(verdicts, as_json=args.json, op=args.op, mode=mode + ("+gpu" if gpu else ""))
    return 0 if all(v.passed for v in verdicts) else 1


def _print_sandbox() -> int:
    """What the sandbox around candidate code gives on this host (entered once, in a throwaway child)."""
    prot = host_protections(gpu=cuda_available())
    print("candidate sandbox on this host:")
    for line in prot.active:
        print(f"  + {line}")
    for line in prot.missing:
        print(f"  - not available: {line}")
    return 0 if prot.active and not prot.missing else 1


def print_verdicts(verdicts: List[Verdict], as_json: bool, op: str, mode: str) -> None:
    """`sanitize`'s output: one JSON document, or per file a line and a table of its checks."""
    if as_json:
        sys.stdout.write(json.dumps(verdicts_json(verdicts, op, mode), indent=2) + "\n")
        return
    for v in verdicts:
        mark = "PASS" if v.passed else "FAIL"
        ui.line(
            f"{mark} {os.path.relpath(v.file)} [{v.op}, {v.mode}, {v.duration_s:.1f}s]: {v.summary()}",
            style="bold green" if v.passed else "bold red",
        )
        ui.table(
            "",
            ["check", "result", "time", "detail"],
            [[c.name, ui.STATUS_MARK[c.status], f"{c.duration_s:.1f}s", c.detail] for c in v.checks],
            justify=["left", "left", "right", "left"],
        )
    n_pass = sum(v.passed for v in verdicts)
    ui.line(f"{n_pass}/{len(verdicts)} file(s) passed", style="bold")

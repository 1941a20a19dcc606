"""Run the sanitizer on candidates in isolated processes, each with a time limit.

Every candidate is hostile until judged. Per candidate this starts a judge process
(worker.py: trusted, it never imports the candidate) that runs the candidate in a
sandboxed executor of its own (executor.py, sandbox.py). A crash (segfault, abort, GPU
fault), a hang or a runaway allocation becomes a failed verdict that names the check
that was running, never an outage of the caller; a verdict that lacks a check fails.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence

from .. import sanitizer  # the package door: sanitizer.checks loads the checks (and torch) on first use
from ..isolation import sandbox
from ..isolation.isolation import map_tracked, run_tracked, signal_name
from ..isolation.lease import OnReady, run_gated
from .verdict import CheckOutcome, CheckStatus, SanitizerMode, Verdict

DEFAULT_TIMEOUT = {SanitizerMode.QUICK: 120.0, SanitizerMode.FULL: 600.0, SanitizerMode.GPU: 900.0}


def expected_checks(mode: SanitizerMode, only: Optional[Sequence[str]] = None) -> List[str]:
    """The checks a complete verdict of this mode holds (a verdict missing one fails)."""
    # through the package door: the checks load torch, which the command line's startup does without
    if mode == SanitizerMode.GPU:
        names = ["static_gate", "load"] + [n for n in sanitizer.gpu.GPU_CHECK_NAMES if not only or n in only]
    else:
        names = [n for n in sanitizer.checks.CHECK_NAMES if not only or n in only or n in ("static_gate", "load")]
    return names


# long: one judged file in order: start the judge, wait, read its verdict, or say how the child died
def run_isolated(
    path: str,
    op: str,
    mode: SanitizerMode = SanitizerMode.FULL,
    timeout_s: Optional[float] = None,
    keep_going: bool = False,
    env: Optional[dict] = None,
    checks: Optional[Sequence[str]] = None,
    seed: Optional[int] = None,
    skip_gate: bool = False,
    on_ready: Optional[OnReady] = None,
) -> Verdict:
    """Judge one file in a child process (the judge, which runs the candidate in a sandboxed executor of
    its own); always returns a Verdict. `env`: variables for the children on top of the allowlist (e.g.
    the GPU they may see). `seed`: the inputs' seed base (default: a secret one per call). `skip_gate`:
    tests only, to show that the layers behind the static gate hold on their own. `on_ready` (gpu mode):
    the judge starts without the GPU and asks for it through this (isolation/lease.py)."""
    mode = SanitizerMode(mode)  # (a caller may name it by its word)
    timeout_s = timeout_s or DEFAULT_TIMEOUT[mode]
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="ka-sanitize-") as tmp:
        os.chmod(tmp, 0o700)
        out = os.path.join(tmp, "verdict.json")
        t0 = time.time()
        # the judge's own deadline leaves it time to write the verdict before this process kills it
        cmd = [
            sys.executable,
            "-m",
            "kernel_agent.sanitizer.worker",
            "--op",
            op,
            "--file",
            path,
            "--mode",
            mode.value,
            "--out",
            out,
            "--deadline",
            f"{t0 + max(5.0, timeout_s - 5.0):.3f}",
        ]
        if keep_going:
            cmd.append("--keep-going")
        if checks:
            cmd += ["--checks", ",".join(checks)]
        if seed is not None:
            cmd += ["--seed", str(int(seed))]
        if skip_gate:
            cmd.append("--skip-gate")
        gated = on_ready is not None and mode == SanitizerMode.GPU
        if gated:
            cmd.append("--gpu-lease")
        child_env = sandbox.env_for(tmp, env)
        if mode != SanitizerMode.GPU:
            child_env["TRITON_INTERPRET"] = "1"
        if gated and on_ready is not None:
            rc, log = run_gated(cmd, timeout_s, child_env, tmp, on_ready)
        else:
            rc, log = run_tracked(cmd, timeout_s, env=child_env, cwd=tmp)
        timed_out = rc is None
        elapsed = time.time() - t0
        doc = None
        if os.path.exists(out):
            try:
                with open(out) as f:
                    doc = json.load(f)
            except (OSError, json.JSONDecodeError):
                doc = None
    tail = log.strip().splitlines()[-3:]
    if doc and doc.get("complete"):
        v = Verdict.from_json(doc)
        v.file = path
        missing = [n for n in expected_checks(mode, checks) if n not in {c.name for c in v.checks}]
        if missing:  # a verdict is complete only with every check of its mode, run, skipped or failed
            v.checks.append(
                CheckOutcome("verdict", CheckStatus.FAILED, f"incomplete verdict: no result for {', '.join(missing)}")
            )
        return v
    v = Verdict(path, op, mode, duration_s=elapsed)
    running = None
    if doc:
        v.seed = doc.get("seed")
        v.source_hash = doc.get("source_hash") or ""
        v.checks = [CheckOutcome.from_json(c) for c in doc.get("checks", [])]
        running = doc.get("running")
    where = f" during check `{running}`" if running else ""
    if timed_out:
        # slowness is not a fault: the verdict says the candidate could not be verified, not that it is wrong
        v.stop_for_time_limit(f"({timeout_s:.0f}s){where} (a hang, or too slow to check here)")
        reason = v.error
    elif rc is not None and rc < 0:  # None is a time-out, above
        reason = f"crashed with {signal_name(rc)}{where}"
    else:
        last = tail[-1] if tail else ""
        reason = f"the sanitizer process exited with code {rc}{where}: {last[:300]}"
    v.checks.append(CheckOutcome(running or "isolation", CheckStatus.FAILED, reason, elapsed))
    v.error = reason
    return v


def run_many(
    paths: Sequence[str],
    op: str,
    mode: SanitizerMode = SanitizerMode.FULL,
    jobs: int = 1,
    timeout_s: Optional[float] = None,
    keep_going: bool = False,
    on_done: Optional[Callable[[Verdict], None]] = None,
    checks: Optional[Sequence[str]] = None,
    seed: Optional[int] = None,
) -> List[Verdict]:
    """Sanitize several files, `jobs` processes at a time; results in input order."""

    def one(p: str) -> Verdict:
        v = run_isolated(p, op, mode, timeout_s, keep_going, checks=checks, seed=seed)
        if on_done:
            on_done(v)
        return v

    return map_tracked(one, paths, jobs)

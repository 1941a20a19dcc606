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
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

from .verdict import FAILED, CheckOutcome, Verdict

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_TIMEOUT = {"quick": 120.0, "full": 600.0, "gpu": 900.0}

# Children live in sessions of their own (so a terminal's Ctrl-C does not reach them half-way);
# the parent tracks them to take them down when it is interrupted.
_live: set = set()
_live_lock = threading.Lock()
_stopping = threading.Event()  # set while `map_tracked` is being interrupted: no new child starts


def kill_all() -> None:
    """Kill every child `run_tracked` started in this process (sanitizer and benchmark children) that is
    still running."""
    with _live_lock:
        procs = list(_live)
    for p in procs:
        _kill_group(p)


def stop_all() -> None:
    """The hard stop: no child starts from now on (until `resume_starting`), and every running one is
    killed."""
    _stopping.set()
    kill_all()


def resume_starting() -> None:
    _stopping.clear()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def expected_checks(mode: str, only: Optional[Sequence[str]] = None) -> List[str]:
    """The checks a complete verdict of this mode holds (a verdict missing one fails)."""
    if mode == "gpu":
        from .gpu import GPU_CHECK_NAMES
        names = ["static_gate", "load"] + [n for n in GPU_CHECK_NAMES if not only or n in only]
    else:
        from .checks import CHECK_NAMES
        names = [n for n in CHECK_NAMES if not only or n in only or n in ("static_gate", "load")]
    return names


def run_isolated(path: str, op: str, mode: str = "full", timeout_s: Optional[float] = None,
                 keep_going: bool = False, env: Optional[dict] = None,
                 checks: Optional[Sequence[str]] = None, seed: Optional[int] = None,
                 skip_gate: bool = False, on_ready=None) -> Verdict:
    """Judge one file in a child process (the judge, which runs the candidate in a sandboxed executor of
    its own); always returns a Verdict. `env`: variables for the children on top of the allowlist (e.g.
    the GPU they may see). `seed`: the inputs' seed base (default: a secret one per call). `skip_gate`:
    tests only, to show that the layers behind the static gate hold on their own. `on_ready` (gpu mode):
    the judge starts without the GPU and asks for it through this (sanitizer/lease.py)."""
    from . import sandbox
    timeout_s = timeout_s or DEFAULT_TIMEOUT[mode]
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="ka-sanitize-") as tmp:
        os.chmod(tmp, 0o700)
        out = os.path.join(tmp, "verdict.json")
        t0 = time.time()
        # the judge's own deadline leaves it time to write the verdict before this process kills it
        cmd = [sys.executable, "-m", "kernel_agent.sanitizer.worker", "--op", op, "--file", path, "--mode", mode,
               "--out", out, "--deadline", f"{t0 + max(5.0, timeout_s - 5.0):.3f}"]
        if keep_going:
            cmd.append("--keep-going")
        if checks:
            cmd += ["--checks", ",".join(checks)]
        if seed is not None:
            cmd += ["--seed", str(int(seed))]
        if skip_gate:
            cmd.append("--skip-gate")
        if on_ready is not None and mode == "gpu":
            cmd.append("--gpu-lease")
        child_env = sandbox.env_for(tmp, env)
        if mode != "gpu":
            child_env["TRITON_INTERPRET"] = "1"
        if "--gpu-lease" in cmd:
            from .lease import run_gated
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
            v.checks.append(CheckOutcome("verdict", FAILED, f"incomplete verdict: no result for {', '.join(missing)}"))
        return v
    v = Verdict(path, op, mode, duration_s=elapsed)
    running = None
    if doc:
        v.checks = [CheckOutcome(c["name"], c["status"], c.get("detail", ""), c.get("duration_s", 0.0))
                    for c in doc.get("checks", [])]
        running = doc.get("running")
    where = f" during check `{running}`" if running else ""
    if timed_out:
        # slowness is not a fault: the verdict says the candidate could not be verified, not that it is wrong
        reason = f"not verified: time limit ({timeout_s:.0f}s){where} (a hang, or too slow to check here)"
    elif rc < 0:
        reason = f"crashed with {_signal_name(rc)}{where}"
    else:
        last = tail[-1] if tail else ""
        reason = f"the sanitizer process exited with code {rc}{where}: {last[:300]}"
    v.checks.append(CheckOutcome(running or "isolation", FAILED, reason, elapsed))
    v.error = reason
    return v


LOG_TAIL = 64 << 10


def run_tracked(cmd: Sequence[str], timeout_s: float, env: Optional[dict] = None,
                cwd: Optional[str] = None) -> Tuple[Optional[int], str]:
    """Run a child in a session of its own, killed (with its whole group) at the time limit or when
    this process is interrupted; tracked so that `kill_all` reaches it from any thread. Its output goes
    to a file, not a pipe, so a grandchild that keeps the output open cannot hold this call, and every
    wait has a bound. Returns (exit code, None when it timed out; the last 64 KiB of its output)."""
    with tempfile.TemporaryFile() as log:
        with _live_lock:  # checked and registered under the lock, so `kill_all` cannot miss a child
            if _stopping.is_set():
                raise ChildProcessError("interrupted: no new child is started")
            proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            _live.add(proc)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:  # Ctrl-C in the parent: take the child (its own session) down too
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)  # whatever the child left in its group goes too
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            with _live_lock:
                _live.discard(proc)
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - LOG_TAIL))
        text = log.read().decode(errors="replace")
    return (None if timed_out else proc.returncode), text


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def map_tracked(fn: Callable[[T], R], items: Sequence[T], workers: int) -> List[R]:
    """`[fn(x) for x in items]` on `workers` threads, where `fn` runs children through `run_tracked`
    (one or several in turn). On Ctrl-C (or any error) the items not started are cancelled, every
    running child is killed and no new one starts, so the threads return at once."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]  # run_tracked kills its own child on Ctrl-C
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        return list(pool.map(fn, items))
    except BaseException:
        _stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        kill_all()
        try:
            pool.shutdown(wait=True)
        finally:
            _stopping.clear()
        raise
    finally:
        pool.shutdown(wait=True)


def run_many(paths: Sequence[str], op: str, mode: str = "full", jobs: int = 1, timeout_s: Optional[float] = None,
             keep_going: bool = False, on_done: Optional[Callable[[Verdict], None]] = None,
             checks: Optional[Sequence[str]] = None, seed: Optional[int] = None) -> List[Verdict]:
    """Sanitize several files, `jobs` processes at a time; results in input order."""
    def one(p: str) -> Verdict:
        v = run_isolated(p, op, mode, timeout_s, keep_going, checks=checks, seed=seed)
        if on_done:
            on_done(v)
        return v

    return map_tracked(one, paths, jobs)

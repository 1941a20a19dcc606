"""Run the sanitizer on candidates in isolated processes, each with a time limit.

Every candidate is untrusted: it runs in its own process group, and a crash (segfault,
abort, GPU fault), a hang or a runaway allocation becomes a failed verdict that names
the check that was running, never an outage of the caller.
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


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def run_isolated(path: str, op: str, mode: str = "full", timeout_s: Optional[float] = None,
                 keep_going: bool = False, env: Optional[dict] = None,
                 checks: Optional[Sequence[str]] = None) -> Verdict:
    """Sanitize one file in a child process; always returns a Verdict."""
    timeout_s = timeout_s or DEFAULT_TIMEOUT[mode]
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory(prefix="ka-sanitize-") as tmp:
        out = os.path.join(tmp, "verdict.json")
        cmd = [sys.executable, "-m", "kernel_agent.sanitizer.worker", "--op", op, "--file", path, "--mode", mode,
               "--out", out]
        if keep_going:
            cmd.append("--keep-going")
        if checks:
            cmd += ["--checks", ",".join(checks)]
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("PYTHONHASHSEED", "0")
        child_env["PYTHONUNBUFFERED"] = "1"
        if mode != "gpu":
            child_env["TRITON_INTERPRET"] = "1"
        t0 = time.time()
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
        return v
    v = Verdict(path, op, mode, duration_s=elapsed)
    running = None
    if doc:
        v.checks = [CheckOutcome(c["name"], c["status"], c.get("detail", ""), c.get("duration_s", 0.0))
                    for c in doc.get("checks", [])]
        running = doc.get("running")
    where = f" during check `{running}`" if running else ""
    if timed_out:
        reason = f"timed out after {timeout_s:.0f}s{where} (a hang, or far too slow)"
    elif rc < 0:
        reason = f"crashed with {_signal_name(rc)}{where}"
    else:
        last = tail[-1] if tail else ""
        reason = f"the sanitizer process exited with code {rc}{where}: {last[:300]}"
    v.checks.append(CheckOutcome(running or "isolation", FAILED, reason, elapsed))
    v.error = reason
    return v


def run_tracked(cmd: Sequence[str], timeout_s: float, env: Optional[dict] = None,
                cwd: Optional[str] = None) -> Tuple[Optional[int], str]:
    """Run an untrusted child in a session of its own, killed (with its whole group) at the time
    limit or when this process is interrupted; tracked so that `kill_all` reaches it from any
    thread. Returns (exit code, None when it timed out; its output)."""
    with _live_lock:  # checked and registered under the lock, so `kill_all` cannot miss a child
        if _stopping.is_set():
            raise ChildProcessError("interrupted: no new child is started")
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        _live.add(proc)
    timed_out = False
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        log, _ = proc.communicate()
    except BaseException:  # Ctrl-C in the parent: take the child (its own session) down too
        _kill_group(proc)
        raise
    finally:
        with _live_lock:
            _live.discard(proc)
    return (None if timed_out else proc.returncode), (log or b"").decode(errors="replace")


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
             checks: Optional[Sequence[str]] = None) -> List[Verdict]:
    """Sanitize several files, `jobs` processes at a time; results in input order."""
    def one(p: str) -> Verdict:
        v = run_isolated(p, op, mode, timeout_s, keep_going, checks=checks)
        if on_done:
            on_done(v)
        return v

    return map_tracked(one, paths, jobs)

"""Children with a time limit and a hard kill, and the process-wide stop that takes them all down.

Every child that may run candidate code (the sanitizer's judge, the benchmark child) starts through
`run_tracked`: in a session of its own, its output in a file, killed with its whole group at its time limit
or when this process is interrupted. `stop_all` is the hard stop of a run's deadline: no child starts until
`resume_starting`, and every running one is killed. The sanitizer runner, the benchmark worker and the loop's
placement use this module; what a child may do once started is the sandbox's business (sandbox.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")
R = TypeVar("R")

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


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


LOG_TAIL = 64 << 10


def run_tracked(
    cmd: Sequence[str], timeout_s: float, env: Optional[dict] = None, cwd: Optional[str] = None
) -> Tuple[Optional[int], str]:
    """Run a child in a session of its own, killed (with its whole group) at the time limit or when
    this process is interrupted; tracked so that `kill_all` reaches it from any thread. Its output goes
    to a file, not a pipe, so a grandchild that keeps the output open cannot hold this call, and every
    wait has a bound. Returns (exit code, None when it timed out; the last 64 KiB of its output)."""
    with tempfile.TemporaryFile() as log:
        with _live_lock:  # checked and registered under the lock, so `kill_all` cannot miss a child
            if _stopping.is_set():
                raise ChildProcessError("interrupted: no new child is started")
            proc = subprocess.Popen(
                list(cmd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
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

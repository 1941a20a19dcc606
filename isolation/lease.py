"""The GPU lease handshake between a child process and the parent that places it.

Most of a GPU child's life does not touch the GPU: the process starts, imports torch and Triton,
loads the kernel files through the static gate. A gated child does all that first, then asks its
parent for the GPU phase by phase and waits until it is granted:

  - "gpu": the GPU, shared with other correctness work (compiling, checking outputs);
  - "alone": the GPU with nothing else on it (a benchmark's timing).

The child asks by creating `ready-<phase>` in its working directory, and goes on once the parent has
created `go-<phase>` there. The parent watches for the requests and decides (agent/placement.py
keeps the GPU's leases). The waiting is done by the trusted code of the child (the judge, or the
benchmark worker before it times); a candidate's own code reaches the GPU only through calls that code
makes inside a granted phase.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional, Sequence, Tuple

from .isolation import run_tracked

PHASES = ("gpu", "alone")

# on_ready(phase, still_wanted) -> granted: blocks until the phase is granted (True) or refused (False);
# `still_wanted()` turns False once the child has ended, and the decision must then come back soon.
OnReady = Callable[[str, Callable[[], bool]], bool]


def ready_file(phase: str) -> str:
    return f"ready-{phase}"


def go_file(phase: str) -> str:
    return f"go-{phase}"


def wait_for_grant(phase: str, poll_s: float = 0.005) -> float:
    """(child side) Ask for `phase` and wait until the parent grants it; returns the seconds waited."""
    if phase not in PHASES:
        raise ValueError(f"unknown GPU phase {phase!r}")
    t0 = time.time()
    with open(ready_file(phase), "w") as f:
        f.write("ready\n")
    while not os.path.exists(go_file(phase)):
        time.sleep(poll_s)
    return time.time() - t0


def run_gated(
    cmd: Sequence[str], timeout_s: float, env: dict, cwd: str, on_ready: OnReady
) -> Tuple[Optional[int], str]:
    """(parent side) `isolation.run_tracked`, with a watcher that answers the child's requests in `cwd`
    through `on_ready`. The watcher has ended when this returns, so the caller's lease bookkeeping
    sees every grant that happened. A refused phase leaves the child waiting until its time limit, or
    until a stop kills it."""
    child_done = threading.Event()

    def watch():
        for phase in PHASES:
            ready = os.path.join(cwd, ready_file(phase))
            while not os.path.exists(ready):
                if child_done.wait(0.02):
                    return
            if not on_ready(phase, lambda: not child_done.is_set()):
                return
            try:
                with open(os.path.join(cwd, go_file(phase)), "w") as f:
                    f.write("go\n")
            except OSError:
                return  # the child took its directory away: it waits until its time limit

    watcher = threading.Thread(target=watch, name="ka-gpu-lease", daemon=True)
    watcher.start()
    try:
        return run_tracked(cmd, timeout_s, env=env, cwd=cwd)
    finally:
        child_done.set()
        watcher.join()


__all__ = ["PHASES", "OnReady", "ready_file", "go_file", "wait_for_grant", "run_gated"]

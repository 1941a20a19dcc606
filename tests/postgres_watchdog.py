"""Stops the PostgreSQL server of a test process once that process is gone, however it ended.

`python tests/postgres_watchdog.py PID PGDATA [CONTROLLER]`, started by tests/conftest.py before the server:
pg_ctl starts the postmaster in a session of its own, so neither a Ctrl-C at the terminal nor the death of the
test process reaches it, and pgserver's own stop runs only at a normal exit (an atexit hook, the fixture's
teardown). This watchdog, in a session of its own too, waits until PID is no longer its parent (the test
process ended: a normal exit, SIGTERM, SIGKILL), or until CONTROLLER (pytest-xdist's, whose workers a kill
leaves running) is gone, then ends the postmaster recorded in PGDATA/postmaster.pid and removes PGDATA. The
test process ends the watchdog itself after stopping the server at a normal teardown.
"""

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Optional

POLL_S = 0.5
SHUTDOWN_GRACE_S = 10.0


def postmaster_pid(pgdata: Path) -> Optional[int]:
    """The postmaster's pid, the first line of postmaster.pid (absent once the server stopped cleanly)."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(pgdata: Path) -> None:
    """SIGQUIT, PostgreSQL's immediate shutdown (the postmaster ends its backends and exits), then SIGKILL if
    it is still there after SHUTDOWN_GRACE_S."""
    pid = postmaster_pid(pgdata)
    if pid is None or not alive(pid):
        return
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def main(argv) -> int:
    parent, pgdata = int(argv[1]), Path(argv[2])
    controller = int(argv[3]) if len(argv) > 3 else None  # pytest-xdist's: its workers outlive it when killed
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the tests first; the watchdog stops after
    # reparented once the test process is gone
    while os.getppid() == parent and (controller is None or alive(controller)):
        time.sleep(POLL_S)
    stop(pgdata)
    shutil.rmtree(pgdata, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

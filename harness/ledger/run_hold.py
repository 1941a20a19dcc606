"""A run's hold on a SQLite ledger: one `kernel-agent run` records in a ledger file at a time.

Two runs on one ledger file at once would propose the same candidates in the same order and judge each twice;
the second is refused instead (`LedgerHeld`), naming the run that holds the ledger. The hold is an exclusive
`flock` on `<ledger>.run-lock` beside the file, which the kernel releases when the process that took it exits,
however it exits (a kill -9), so a killed run never leaves a lock that blocks the next one; the file holds the
holder's run, pid, host and start, for the message.

A PostgreSQL ledger takes no hold: it is the ledger a team or a cluster shares (docs/CLUSTER.md), and several
runs writing it at once is what it is for; each step is its own transaction there.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Callable, Optional

from .ledger import Ledger, LedgerError


class LedgerHeld(LedgerError):
    """Another run records in this ledger now."""


def _holder_text(info: dict) -> str:
    """'run r-1 (pid 12, host h, since 20:11:36 UTC)' from what a holder wrote about itself."""
    where = ", ".join(
        x
        for x in (
            f"pid {info['pid']}" if info.get("pid") else "",
            f"host {info['host']}" if info.get("host") else "",
            f"since {info['started']}" if info.get("started") else "",
        )
        if x
    )
    who = f"run {info['run']}" if info.get("run") else "a run that is starting"
    return f"{who} ({where})" if where else who


def _refusal(ledger: Ledger, info: dict, resume_command: Callable[[str], str]) -> LedgerHeld:
    resume = f"`{resume_command(info['run'])}`" if info.get("run") else "`--resume` and its run id"
    return LedgerHeld(
        f"ledger {ledger.location} is held by {_holder_text(info)}: one run records in a ledger at a time; wait "
        f"for it to end, or stop it (Ctrl-C) and continue it with {resume}, or pass another --ledger"
    )


class RunHold:
    """Held from before a run is recorded until it ends. `take()` raises `LedgerHeld` where another run
    holds the ledger; `name(run_id)` says which run holds it now; `release()` lets go."""

    def __init__(self, ledger: Ledger, resume_command: Optional[Callable[[str], str]] = None):
        self.ledger = ledger
        # the command that resumes a run, as the refusal prints it
        self.resume_command = resume_command or (lambda run_id: f"kernel-agent run --resume {run_id}")
        self.info: dict = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}
        self._fd: Optional[int] = None

    def take(self) -> "RunHold":
        if self.ledger.url is None:  # a server ledger is shared by design: no hold (the module's docstring)
            self._take_file()
        return self

    def _lock_path(self) -> str:
        return str(self.ledger.path) + ".run-lock"

    def _take_file(self) -> None:
        try:
            fd = os.open(self._lock_path(), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise LedgerError(f"ledger {self.ledger.location}: cannot create {self._lock_path()} ({e.strerror})")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                info = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                info = {}
            os.close(fd)
            raise _refusal(self.ledger, info if isinstance(info, dict) else {}, self.resume_command) from None
        self._fd = fd
        self._write_file(fd)

    def _write_file(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.info).encode(), 0)

    def name(self, run_id: str) -> None:
        """The run this hold is for, once the ledger has given it an id."""
        self.info["run"] = run_id
        if self._fd is not None:
            self._write_file(self._fd)

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor of the file's description releases the flock
            self._fd = None

    def __enter__(self) -> "RunHold":
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

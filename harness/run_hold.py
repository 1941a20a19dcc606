"""A run's hold on its ledger: one `kernel-agent run` records in a ledger at a time.

Two runs on one ledger at once would propose the same candidates in the same order and judge each twice;
the second is refused instead (`LedgerHeld`), naming the run that holds the ledger. The hold is one the
operating system or the database server lets go of when its holder ends, however it ends (a kill -9, a
lost machine), so a killed run never leaves a lock that blocks the next one:

- a SQLite ledger: an exclusive `flock` on `<ledger>.run-lock` beside the file, which the kernel releases
  when the process that took it exits; the file holds the holder's run, pid, host and start, for the message;
- a PostgreSQL ledger: a session-level advisory lock (`RUN_LOCK_KEY`) on a connection of its own, which the
  server releases when that connection ends; the holder's description is that connection's
  `application_name`, read back from `pg_stat_activity`.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Any, Callable, Optional

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from .ledger import Ledger, LedgerError

# The advisory lock a run holds on a PostgreSQL ledger for as long as it runs ("karunlck" in ASCII), apart
# from the transaction-scoped write lock every recording step takes.
RUN_LOCK_KEY = int.from_bytes(b"karunlck", "big")
APP_PREFIX = "kernel-agent run"


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
        self._conn: Any = None
        self._engine: Any = None

    def take(self) -> "RunHold":
        if self.ledger.url is None:
            self._take_file()
        else:
            self._take_server()
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

    def _take_server(self) -> None:
        assert self.ledger.url is not None
        self._engine = create_engine(self.ledger.url, poolclass=NullPool)
        self._conn = self._engine.connect()
        got = self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": RUN_LOCK_KEY}).scalar()
        self._conn.commit()
        if not got:
            holder = self._conn.execute(
                text(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND l.classid = :hi AND l.objid = :lo"
                ),
                {"hi": RUN_LOCK_KEY >> 32, "lo": RUN_LOCK_KEY & 0xFFFFFFFF},
            ).scalar()
            self.release()
            info = _parse_app_name(holder or "")
            raise _refusal(self.ledger, info, self.resume_command)
        self._write_server()

    def _write_server(self) -> None:
        # application_name holds at most 63 bytes: the prefix, run, pid and host, in words (the host may be cut)
        words = [APP_PREFIX, self.info.get("run") or "-", str(self.info["pid"]), self.info["host"]]
        self._conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": " ".join(words)[:63]})
        self._conn.commit()

    def name(self, run_id: str) -> None:
        """The run this hold is for, once the ledger has given it an id."""
        self.info["run"] = run_id
        if self._fd is not None:
            self._write_file(self._fd)
        elif self._conn is not None:
            self._write_server()

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor of the file's description releases the flock
            self._fd = None
        if self._conn is not None:
            self._conn.close()  # the server releases a session lock with its session
            self._conn = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> "RunHold":
        return self.take()

    def __exit__(self, *exc) -> None:
        self.release()


def _parse_app_name(name: str) -> dict:
    """What `_write_server` wrote in a holder's application_name."""
    words = name[len(APP_PREFIX) :].split() if name.startswith(APP_PREFIX) else []
    if len(words) < 3:
        return {}
    return {"run": words[0] if words[0] != "-" else None, "pid": words[1], "host": words[2]}


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

"""`kernel-agent serve`: the read-only web view of the ledger (agent/web.py), on this machine by default."""

from __future__ import annotations

import socket
import sys

from .. import ui
from .common import UsageError, command, open_ledger

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def register(sub) -> None:
    s = sub.add_parser("serve", help="a read-only web view of the ledger: runs, candidates, the serving set")
    s.add_argument(
        "--ledger", default=None, help="the ledger: a SQLite file (default runs/ledger.db) or a postgresql:// URL"
    )
    s.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 opens it to the network)",
    )
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 picks a free one")
    command("serve")(cmd_serve)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), or a one-line usage error (port taken, unknown address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        raise UsageError(f"serve: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def cmd_serve(args) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a port is 0 to 65535")
    # the ledger first: a missing or corrupt one is one line at once, before the web view's imports (torch among them)
    led = open_ledger(args, read=True)
    led.schema_version()  # a file that is not a ledger fails here, in one line, before anything listens
    try:
        from . import web  # here: an optional dependency (the [web] extra) loads only where it is used
    except ImportError as e:
        raise UsageError(f"serve needs the web extra ({e.name} is missing): pip install 'kernel-agent[web]'") from None
    sock = _listen(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    where = (
        "this machine only (--host 0.0.0.0 opens it to the network)"
        if args.host in (DEFAULT_HOST, "localhost", "::1")
        else f"every machine that can reach {args.host}"
    )

    def announce() -> None:
        ui.line(
            f"serving {led.shown} read-only at http://{shown}:{port}/ (listening on {host}: {where}); Ctrl-C stops it"
        )
        sys.stdout.flush()

    web.serve(led, sock, announce)
    return 0

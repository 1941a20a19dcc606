"""`kernel-agent ledger upgrade`: migrate an older ledger to this version's schema.

Upgrading is a command of its own, not a side effect of `run`: a shared ledger is read by drivers on
several machines, and one that is upgraded refuses the older kernel-agents still writing it, so the
person who upgrades it should be the one who decided to. A SQLite file is copied to
`<file>.v<version>.bak` first.
"""

from __future__ import annotations

import os

from ...harness.ledger.ledger import SCHEMA_VERSION, server_url, sqlite_path, upgrade_ledger
from .. import ui
from .common import UsageError, command, default_ledger


def register(sub) -> None:
    led = sub.add_parser("ledger", help="the ledger itself: `ledger upgrade` migrates an older one")
    actions = led.add_subparsers(dest="ledger_action", metavar="ACTION")
    up = actions.add_parser(
        "upgrade",
        help=f"migrate the ledger to schema version {SCHEMA_VERSION} (a SQLite file is copied to FILE.vN.bak first)",
    )
    up.add_argument(
        "--ledger", default=None, help="the ledger: a SQLite file (default runs/ledger.db) or a postgresql:// URL"
    )
    up.add_argument("--no-backup", action="store_true", help="do not copy a SQLite file before upgrading it")
    command("ledger")(cmd_ledger)


def cmd_ledger(args) -> int:
    if args.ledger_action != "upgrade":
        raise UsageError("ledger: give an action: upgrade")
    location = args.ledger or default_ledger()
    if server_url(location) is None and not os.path.isfile(sqlite_path(location)):
        raise UsageError(f"no ledger at {location}")
    done = upgrade_ledger(location, backup=not args.no_backup)
    if not done.reached:
        ui.line(f"ledger {done.location} is at schema version {done.version}: nothing to upgrade")
        return 0
    kept = f"; the version-{done.from_version} file is kept as {done.backup}" if done.backup else ""
    ui.line(
        f"ledger {done.location} upgraded from schema version {done.from_version} to {done.version}{kept}",
        style="bold green",
    )
    return 0

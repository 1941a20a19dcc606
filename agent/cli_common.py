"""What every command module shares: the command table, flag checks, the ledger the flags name.

The command modules (commands.py, review.py, pr.py, serving_cmd.py, ci_templates.py) import this module and
never each other's parsers; agent/cli.py, the entry point, imports them all. Nothing here imports torch, so a
usage error comes at once.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List

from ..harness.ledger import Ledger, server_url, sqlite_path
from ..harness.ops import NAMES as OP_NAMES  # the registry's names load without torch
from .errors import UsageError

OPS_HELP = ", ".join(OP_NAMES)

COMMANDS: Dict[str, Callable[[Any], int]] = {}  # subcommand name -> handler(args) -> exit code


def command(name: str):
    """Decorator: `fn` handles the subcommand `name`."""
    def register(fn):
        COMMANDS[name] = fn
        return fn
    return register


def default_ledger() -> str:
    return os.environ.get("KERNEL_AGENT_LEDGER", os.path.join("runs", "ledger.db"))


def open_ledger(args, read: bool = False) -> Ledger:
    """The ledger of `--ledger` / KERNEL_AGENT_LEDGER / runs/ledger.db. `read`: a command that only reads
    it refuses a path that does not exist (a typo would otherwise create an empty ledger there)."""
    path = args.ledger or default_ledger()
    if read and server_url(path) is None and not os.path.exists(sqlite_path(path)):
        raise UsageError(f"no ledger at {path} (`kernel-agent run` creates it; --ledger or KERNEL_AGENT_LEDGER names "
                         f"another)")
    # one ledger per command and mode, however often its steps ask (bench records after every shape), kept on
    # args so that `main` closes it whichever way the command ends
    opened = args.__dict__.setdefault("_ledgers", {})
    if read not in opened:
        opened[read] = Ledger(path, read_only=read)
    return opened[read]


def check_op(name: str) -> str:
    if name not in OP_NAMES:
        raise UsageError(f"unknown op {name!r}; expected one of {OPS_HELP}")
    return name


def parse_ops(text: str) -> List[str]:
    """`--ops`: a comma list of ops, or all."""
    ops = list(OP_NAMES) if text in ("all", "") else [o.strip() for o in text.split(",") if o.strip()]
    for o in ops:
        if o not in OP_NAMES:
            raise UsageError(f"unknown op {o!r}; expected one of {OPS_HELP} (or all)")
    return ops


def parse_duration(text: str) -> float:
    """`--time-limit`: seconds from 90s, 30m, 8h, 1d or a bare number of seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m:
        raise UsageError(f"bad duration {text!r}: use e.g. 90s, 30m, 8h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def check_files(paths: List[str]) -> List[str]:
    for p in paths:
        if not os.path.isfile(p):
            raise UsageError(f"no such file: {p}")
    return paths


def cuda_available() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        import torch  # here, not at the top: flags are checked before torch is imported
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False

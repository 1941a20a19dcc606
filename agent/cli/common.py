"""What every command module shares: the command table, flag checks, the ledger the flags name.

The command modules (commands.py, review.py, pr.py, serving_cmd.py, ci_templates.py) import this module and
never each other's parsers; agent/cli.py, the entry point, imports them all. Nothing here imports torch, so a
usage error comes at once.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from typing import Any, Callable, Dict, List, Optional

from ...harness.ledger.ledger import Ledger, server_url, sqlite_path
from ...ops import NAMES as OP_NAMES  # the registry's names load without torch
from ..errors import UsageError

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


def command_name() -> str:
    """How the hints name this command so that they paste as they are: `kernel-agent` where the shell finds
    this one under that name (its venv active, say), else the path it was started by (`.venv/bin/kernel-agent`
    after the quick start, whose venv is not active)."""
    started = sys.argv[0] if sys.argv else ""
    if os.path.basename(started) != "kernel-agent":  # `python -m kernel_agent.agent.cli`, or a test
        return "kernel-agent"
    found = shutil.which("kernel-agent")
    if found and os.path.realpath(found) == os.path.realpath(started):
        return "kernel-agent"
    shown = os.path.relpath(started)
    return shlex.quote(started if shown.startswith(os.pardir + os.sep + os.pardir) else shown)


def ledger_flag(path: Optional[str]) -> str:
    """' --ledger PATH' for a hint's command, or '' where the default ledger is the one meant."""
    return f" --ledger {shlex.quote(path)}" if path and path != default_ledger() else ""


def hint(command: str, ledger: Optional[str] = None) -> str:
    """A command to paste: 'kernel-agent show r-1 --ledger l.db', named as `command_name` says."""
    return f"{command_name()} {command}{ledger_flag(ledger)}"


def check_ledger_exists(path: str) -> None:
    """A command that needs what a ledger holds (a read, a resume, a demotion) refuses a path that does not
    exist: a typo would otherwise create an empty ledger there."""
    if server_url(path) is None and not os.path.exists(sqlite_path(path)):
        raise UsageError(
            f"no ledger at {path} (`kernel-agent run` creates it; --ledger or KERNEL_AGENT_LEDGER names another)"
        )


def open_ledger(args, read: bool = False, existing: bool = False) -> Ledger:
    """The ledger of `--ledger` / KERNEL_AGENT_LEDGER / runs/ledger.db. `read`: opened read-only. `read` or
    `existing`: the ledger must exist already (`check_ledger_exists`)."""
    path = getattr(args, "ledger", None) or default_ledger()
    if read or existing:
        check_ledger_exists(path)
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
    ops = list(OP_NAMES) if text == "all" else [o.strip() for o in text.split(",") if o.strip()]
    if not ops:  # (an unset $OPS in a script): all five ops would be a surprise of hours
        raise UsageError(f"no op named in {text!r}; name one or more of {OPS_HELP} (comma list), or all")
    for o in ops:
        if o not in OP_NAMES:
            raise UsageError(f"unknown op {o!r}; expected one of {OPS_HELP} (or all)")
    return ops


# the units a duration may carry, in the words people write them (`8h`, `8 hours`, `90min`)
DURATION_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
}


def parse_duration(text: str) -> float:
    """`--time-limit`: seconds from 90s, 30m, 8h, 1d, `8 hours` or `90min`; more than none. A bare number is
    refused: `8` meant as hours would otherwise run for 8 seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    if m and float(m.group(1)) <= 0:
        raise UsageError(f"bad duration {text!r}: a run needs some time, e.g. 90s, 30m, 8h")
    if m and not m.group(2):
        raise UsageError(f"bad duration {text!r}: give a unit, e.g. {m.group(1)}h, {m.group(1)}m or {m.group(1)}s")
    if not m or m.group(2).lower() not in DURATION_UNITS:
        raise UsageError(f"bad duration {text!r}: use e.g. 90s, 30m, 8h")
    return float(m.group(1)) * DURATION_UNITS[m.group(2).lower()]


def check_writable(path: str, flag: str, folder: bool, why: str = "") -> None:
    """A destination a command writes (a folder it fills, or a file), checked before the work so that a long
    replay or a report is not thrown away: it must be writable where it exists, else the nearest folder above
    it that exists must be a writable folder (the rest is made). `why` ends the line: what is written there."""
    probe = os.path.abspath(path)
    if os.path.exists(probe):
        if folder and not os.path.isdir(probe):
            raise UsageError(f"{flag} {path}: is a file, not a folder")
        if not folder and os.path.isdir(probe):
            raise UsageError(f"{flag} {path}: is a folder; give the file to write")
        if not os.access(probe, os.W_OK | (os.X_OK if folder else 0)):
            raise UsageError(f"{flag} {path}: is read-only{why}")
        return
    probe = os.path.dirname(probe)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"{flag} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {probe} is read-only{why}")


def check_files(paths: List[str]) -> List[str]:
    """Candidate files: each a file (not a folder) of UTF-8 text, which is what the sanitizer judges."""
    for p in paths:
        if os.path.isdir(p):
            raise UsageError(f"{p}: is a folder; give the kernel's .py file")
        if not os.path.isfile(p):
            raise UsageError(f"no such file: {p}")
        try:
            with open(p, encoding="utf-8") as f:
                f.read()
        except UnicodeDecodeError:
            raise UsageError(f"{p}: not a text file (not UTF-8); give the kernel's Python source") from None
        except OSError as e:
            raise UsageError(f"{p}: cannot be read ({e.strerror or e})") from None
    return paths


def cuda_available() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        import torch  # here, not at the top: flags are checked before torch is imported

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# What a config file (`run --config`) may hold: its sections and each section's keys. Anything else is a typo
# that would otherwise be ignored without a word (`candidatez = 3` would leave the budget at its default).
CONFIG_KEYS: Dict[str, tuple] = {
    "model": ("name", "base_url", "api_key", "temperature", "max_tokens", "timeout_s", "max_retries", "concurrency"),
    "run": (
        "ops",
        "candidates",
        "per_round",
        "time_limit",
        "tokens",
        "jobs",
        "gpus",
        "dtype",
        "shapes",
        "seed",
        "in_place",
        "target_model",
        "target_points",
        "workload",
        "kv_budget",
    ),
    "cluster": ("address", "gpu_model"),
}


def read_config(path: str) -> Dict[str, Any]:
    """A TOML config file, its sections and keys checked against CONFIG_KEYS (no torch: a usage error at once)."""
    import tomllib  # deferred: only a run with a config file reads one

    if os.path.isdir(path):
        raise UsageError(f"--config {path}: is a folder; give the TOML file")
    if not os.path.isfile(path):
        raise UsageError(f"no such config file: {path}")
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"config file {path}: {e}") from None
    for section, body in doc.items():
        if section not in CONFIG_KEYS:
            raise UsageError(
                f"config file {path}: unknown section [{section}]; expected {', '.join(f'[{k}]' for k in CONFIG_KEYS)}"
            )
        if not isinstance(body, dict):
            raise UsageError(f"config file {path}: {section} must be a section ([{section}])")
        unknown = [k for k in body if k not in CONFIG_KEYS[section]]
        if unknown:
            raise UsageError(
                f"config file {path}: unknown key {unknown[0]!r} in [{section}]; expected one of "
                f"{', '.join(CONFIG_KEYS[section])}"
            )
    return doc


def check_counts(**counts: Any) -> None:
    """Counts given by flags or the config file (--candidates, --per-round, --jobs, --gpus, --tokens): whole
    numbers of at least 1."""
    for name, v in counts.items():
        if v is None:
            continue
        flag = name.replace("_", "-")
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                v = int(str(v))
            except ValueError:
                raise UsageError(f"{flag}: expected an integer, got {v!r}") from None
        if v < 1:
            raise UsageError(f"--{flag} must be at least 1, got {v}")

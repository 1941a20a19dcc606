"""The `kernel-agent` command line.

    kernel-agent run       the overnight loop: propose, sanitize, benchmark, promote
    kernel-agent sanitize  the sanitizer on candidate files (CI gating)
    kernel-agent bench     GPU timings against the incumbent and the torch anchor
    kernel-agent history   runs, filters, per-op leaderboards, speedup trend
    kernel-agent show      one run or one candidate in detail
    kernel-agent report    a pull-request-ready markdown summary of a run
    kernel-agent gate      re-verify the serving kernel set (CI)
    kernel-agent promote / demote   change the serving kernel set by hand
    kernel-agent ledger upgrade     migrate an older ledger to this version's schema
    kernel-agent serve     a read-only web view of the ledger (the [web] extra)
    kernel-agent workload  import a serving trace, replay it into shape buckets, plan its KV cache

Usage errors print one line and exit 2; failures of what was checked exit 1.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Optional

from ... import __version__
from ...harness.ledger.ledger import LedgerError
from .. import ui
from . import (
    bench,
    ci,
    demote,
    dispatch,
    gate,
    history,
    ledger,
    pr,
    promote,
    report,
    run,
    sanitize,
    serve,
    serving,
    show,
    workload,
)
from .common import COMMANDS, UsageError

# The command modules add their parsers in this order (the order `--help` lists them).
COMMAND_MODULES = (
    sanitize,
    run,
    bench,
    history,
    show,
    promote,
    demote,
    report,
    gate,
    pr,
    ci,
    dispatch,
    serving,
    ledger,
    serve,
    workload,
)


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, as every other bad input (not the whole usage text)."""

    def error(self, message: str):
        where = self.prog.replace("kernel-agent", "", 1).strip()
        ui.error(f"{where + ': ' if where else ''}{message} (`{self.prog} --help` lists the flags)")
        self.exit(2)


def _values_starting_with_minus(argv: List[str]) -> List[str]:
    """`--time-limit -5m` as `--time-limit=-5m`: a value that starts with '-' and a digit is a value (a bad one,
    which the flag's own check then names), never a flag; argparse would take it for an unknown flag."""
    out: List[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.fullmatch(r"-\d.*", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="kernel-agent", description="Makes Triton GPU kernels faster without making them wrong.")
    p.add_argument("--version", action="version", version=f"kernel-agent {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    for module in COMMAND_MODULES:
        module.register(sub)
    return p


# What a shell reports for a process ended by SIGPIPE (128 + 13): the output was cut short, as `| head` does.
EXIT_BROKEN_PIPE = 141


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_values_starting_with_minus(list(sys.argv[1:] if argv is None else argv)))
    if not args.command:
        parser.print_help()
        return 2
    handler = COMMANDS[args.command]
    try:
        return handler(args)
    except UsageError as e:
        ui.error(str(e))
        return 2
    except KeyboardInterrupt:
        ui.error("interrupted")
        return 130
    except BrokenPipeError:  # `kernel-agent show RUN | head`: the reader stopped reading; quiet, but not a success
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that flushing stdout at exit does not fail again
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 - one line, not a traceback wall
        if os.environ.get("KERNEL_AGENT_DEBUG"):
            raise
        if isinstance(e, (LedgerError, ValueError, FileNotFoundError)):
            ui.error(str(e).splitlines()[0] if str(e) else type(e).__name__)
            return 2
        ui.error(
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
            f"(set KERNEL_AGENT_DEBUG=1 for the traceback)"
        )
        return 1
    finally:
        for led in getattr(args, "_ledgers", {}).values():  # its connections (a PostgreSQL server counts them)
            led.close()

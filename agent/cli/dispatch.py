"""`kernel-agent dispatch`: which trusted implementation (promoted kernel, baseline, torch) serves each bucket,
and why."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict

from ...harness.manifest import Manifest
from .. import ui
from .common import check_op, command, open_ledger


def register(sub) -> None:
    d = sub.add_parser(
        "dispatch",
        help="which implementation (promoted kernel, baseline, torch) serves each "
        "bucket, from the ledger's benchmarks; --write records it",
    )
    d.add_argument("--op", default=None, help="one op (default: every op with a torch implementation)")
    d.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    d.add_argument("--gpu", default=None, help="one GPU name (default: every GPU in the ledger)")
    d.add_argument(
        "--ledger", default=None, help="the ledger: a SQLite file (default runs/ledger.db) or a postgresql:// URL"
    )
    d.add_argument("--serving-dir", default=None, help="serving set folder (default kernels/serving)")
    d.add_argument("--write", action="store_true", help="record the choices in the serving manifest")
    d.add_argument("--json", action="store_true")
    command("dispatch")(cmd_dispatch)


def cmd_dispatch(args) -> int:
    if args.op:
        check_op(args.op)
    from ...harness.serving import (
        serving,  # here: the serving set imports torch, which comes after the flags are checked
    )
    from ...harness.serving.dispatch import measured_choices, record_choices  # here: as the serving set

    led = open_ledger(args, read=True)
    if args.write:  # a demotion is recorded in the ledger: open it for writing, once it is known to exist
        led = open_ledger(args)
    choices = measured_choices(
        led, ops=[args.op] if args.op else None, dtype=args.dtype, gpu=args.gpu, dir=args.serving_dir
    )
    written: Dict[tuple, Any] = {}
    if args.write:
        written = {
            (c.op, c.bucket, c.dtype, c.gpu): e for c, e in record_choices(choices, dir=args.serving_dir, led=led)
        }
    manifest = serving.load_manifest(args.serving_dir)
    serves = [_manifest_serves(manifest, c) for c in choices]
    if args.json:
        doc = [_choice_json(c, s, bool(written.get((c.op, c.bucket, c.dtype, c.gpu)))) for c, s in zip(choices, serves)]
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return 0
    if not choices:
        ui.line(
            "no bucket has the baseline and a servable torch implementation timed side by side in this ledger "
            "(`kernel-agent bench --op OP` times both)"
        )
        return 0
    ui.table(
        "measured: torch against the Triton side",
        ["op", "bucket", "dtype", "gpu", "faster", "against", "torch/it", "shapes", "manifest"],
        [_choice_row(c, s) for c, s in zip(choices, serves)],
        justify=["left"] * 6 + ["right"] * 2 + ["left"],
    )
    if not args.write:
        ui.line("(--write records these in the serving manifest; a bucket with a promoted kernel keeps it)")
    return 0


def _manifest_serves(manifest: "Manifest", c) -> str:
    """What the serving manifest serves choice c's bucket with: its impl, the promoted kernel, or (default)."""
    entry = manifest.find(c.op, c.bucket, c.dtype, c.gpu)
    if entry is None:
        return "(default)"
    return f"kernel #{entry.candidate_id}" if entry.is_kernel else entry.impl


def _choice_row(c, serves: str) -> list:
    """The table's row of one measured choice."""
    from ...harness.serving import serving  # here: as in cmd_dispatch

    return [
        c.op,
        c.bucket,
        c.dtype,
        c.gpu,
        c.impl if c.impl != serving.KERNEL else c.triton_side,
        c.triton_side,
        f"{c.ratio:.3f}",
        len(c.shapes),
        serves,
    ]


def _choice_json(c, serves: str, written: bool) -> Dict[str, Any]:
    """The --json document's entry of one measured choice."""
    return {
        "op": c.op,
        "bucket": c.bucket,
        "dtype": c.dtype,
        "gpu": c.gpu,
        "measured_faster": c.impl,
        "reason": c.reason,
        "measured": c.measured(),
        "manifest": serves,
        "written": written,
    }

"""`kernel-agent demote`: a kernel out of the serving set."""

from __future__ import annotations

import os
import shlex
from typing import Optional

from ... import agent  # the door to the modules that import torch: each is read when first used
from ...harness import env
from ...harness.ledger.ledger import Ledger, RunNotesRecord, RunStatus
from ...harness.manifest import Manifest
from .. import ui
from ..placement import Devices, LocalDevices
from .common import (
    UsageError,
    check_op,
    command,
    default_ledger,
    open_ledger,
)


def register(sub) -> None:
    d = sub.add_parser("demote", help="remove a kernel from the serving set")
    d.add_argument("--op", required=True)
    d.add_argument("--bucket", required=True)
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--gpu", default=None, help="GPU name (default: this machine's)")
    d.add_argument("--reason", required=True)
    d.add_argument("--ledger", default=None)
    d.add_argument(
        "--in-place",
        action="store_true",
        help="write the serving folder as it is (default, where git tracks it: a commit on a branch "
        "kernel-agent/<run>, the checkout untouched)",
    )


@command("demote")
def cmd_demote(args, devices: Optional[Devices] = None) -> int:
    """Remove a bucket's promoted kernel from the serving set and mark its promotion demoted, written where a
    promotion goes (agent/publish.py): a commit on a branch of its own where git tracks the serving folder,
    else (or with --in-place) in place. The GPU is `--gpu`, else this machine's (`devices`)."""
    from ...harness.serving import serving  # here: torch, after the flags

    check_op(args.op)
    gname = args.gpu or (devices or LocalDevices()).name() or "cpu"
    led = _demote_ledger(args)
    plan = agent.plan_target(in_place=args.in_place)  # git missing is an error before anything is recorded
    served = serving.lookup(args.op, args.bucket, args.dtype, gname, dir=plan.source_dir)
    promo = _active_promotion(led, args.op, args.bucket, args.dtype, gname) if led is not None else None
    if served is None and promo is None:
        if led is not None and led.field_failures(
            unresolved_only=True, op=args.op, bucket=args.bucket, dtype=args.dtype, gpu=gname
        ):
            # the kernel that failed in the field serves no more (replaced, or removed by hand): resolved all the same
            _resolve_field_failures(led, args, gname, f"demote with nothing served: {args.reason}")
            return 0
        raise UsageError(
            f"nothing serves {args.op} {args.bucket} {args.dtype} on {gname}"
            + _served_elsewhere(serving.load_manifest(plan.source_dir), args)
        )
    led = led or open_ledger(args)
    # a demotion by hand is a run of its own (proposer 'manual'), as a promotion by hand is
    run = led.start_run(
        {
            "command": "demote",
            "op": args.op,
            "bucket": args.bucket,
            "dtype": args.dtype,
            "reason": args.reason,
            "in_place": args.in_place,
        },
        env.versions(),
        "manual",
        [args.op],
        gname,
        {},
    )
    target = plan.open(run.id)
    try:
        removed = serving.remove(args.op, args.bucket, args.dtype, gname, dir=target.dir)
        if promo is not None:
            led.demote(promo.id, args.reason)
        target.commit(
            f"Demote {args.op} {args.bucket} {args.dtype} on {gname}\n\n{args.reason}\n\n"
            f"The baseline serves the bucket again (kernel-agent run {run.id}).\n"
        )
    finally:
        info = target.close()
    led.set_run_status(run.id, RunStatus.FINISHED, finished=True, notes=RunNotesRecord(serving=info.to_json()))
    what = "removed from the serving set" if removed else "no serving entry (the ledger's promotion is marked demoted)"
    ui.line(f"demoted {args.op} {args.bucket} {args.dtype} on {gname}: {args.reason}; {what}; the baseline serves it")
    _resolve_field_failures(led, args, gname, run.id)
    ui.line(info.outcome())
    return 0


def _demote_ledger(args) -> Optional[Ledger]:
    """The ledger a demotion records in, if there is one yet. A ledger named (--ledger, KERNEL_AGENT_LEDGER) must
    exist: a typo creates none. The default one may not exist yet (a fresh clone, whose committed serving set
    holds before any run): None, and it is made once the demotion has something to record."""
    named = bool(getattr(args, "ledger", None) or os.environ.get("KERNEL_AGENT_LEDGER"))
    return open_ledger(args, existing=True) if named or os.path.exists(default_ledger()) else None


def _resolve_field_failures(led, args, gname: str, by: str) -> int:
    """Resolve the bucket's unresolved field failures (every kernel's that served it: the bucket is the baseline's
    now), and say how many."""
    n = led.resolve_field_failures(args.op, args.bucket, args.dtype, gname, by=by)
    ui.line(
        f"resolved {n} field failure(s) of {args.op} {args.bucket} {args.dtype} on {gname}"
        if n
        else "no unresolved field failure of this bucket"
    )
    return n


def _served_elsewhere(manifest: Manifest, args) -> str:
    """'; it is served on GPU (--gpu 'GPU' names it)' when the serving set has the bucket on other GPUs: on a
    machine without one, `demote` takes the GPU from `--gpu`."""
    gpus = sorted({e.gpu for e in manifest.entries if (e.op, e.bucket, e.dtype) == (args.op, args.bucket, args.dtype)})
    return f"; it is served on {', '.join(gpus)} (--gpu {shlex.quote(gpus[0])} names it)" if gpus else ""


def _active_promotion(led, op: str, bucket: str, dtype: str, gname: str):
    """The ledger's active promotion of a bucket on a GPU, whatever the spelling of the GPU's name (the manifest
    names GPUs by slug)."""
    from ...harness.serving import serving  # here: torch, after the flags

    promo = led.active_promotion(op, bucket, dtype, gname)
    if promo is None:
        promo = next(
            (
                p
                for p in led.promotions(op=op, active_only=True)
                if p.bucket == bucket and p.dtype == dtype and serving.gpu_slug(p.gpu_name) == serving.gpu_slug(gname)
            ),
            None,
        )
    return promo

"""`kernel-agent dispatch`: which trusted implementation serves each bucket, and why; `kernel-agent serving
warmup`: the serving guard's first-use checks made before traffic (harness/warmup.py)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Dict, List

from ..harness.field_failures import FieldFailure
from ..harness.model_step import KV_MODES, ModelConfigError, load_model_config, parse_names, parse_points
from ..harness.warmup import PlannedCall, guard_warmup, op_calls, plan_model, plan_shapes
from . import ui
from .cli_common import UsageError, check_op, command, cuda_available, open_ledger
from .views import field_failure_words

if TYPE_CHECKING:
    from ..harness.manifest import Manifest


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
    _register_serving(sub)


def _register_serving(sub) -> None:
    s = sub.add_parser("serving", help="the serving set in use: `serving warmup` verifies shape classes before traffic")
    actions = s.add_subparsers(dest="serving_action", metavar="ACTION")
    w = actions.add_parser(
        "warmup",
        help="make the serving guard's first-use check of every shape class a model's decode step (or a list of "
        "shapes) calls, with real inputs, before any request does; failures are recorded as field failures",
    )
    w.add_argument(
        "--model",
        metavar="CONFIG",
        help="a model's decode step, as `bench --model` takes it: a preset (llama-3-8b, llama-3-70b-tp8, "
        "qwen2.5-7b, mistral-7b) or a JSON config file",
    )
    w.add_argument("--points", default="32x8192", help="--model: BATCHxCONTEXT points, e.g. 32x8192,8x32768")
    w.add_argument("--kv", default=",".join(KV_MODES), help="--model: KV cache modes, bf16 and/or int8")
    w.add_argument(
        "--shapes",
        metavar="OP:SHAPE;...",
        help="op shapes instead of a model, e.g. 'matmul:M=32,N=6144,K=4096;quantize_kv:32,16,128'",
    )
    w.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    w.add_argument("--seed", type=int, default=0, help="seed of the example inputs")
    w.add_argument("--serving-dir", default=None, help="serving set folder (default kernels/serving)")
    w.add_argument(
        "--ledger", default=None, help="record field failures here (default runs/ledger.db or KERNEL_AGENT_LEDGER)"
    )
    w.add_argument("--no-ledger", action="store_true", help="print field failures without recording them")
    w.add_argument("--plan", action="store_true", help="print the calls it would verify and exit")
    command("serving")(cmd_serving)


def cmd_serving(args) -> int:
    if args.serving_action != "warmup":
        raise UsageError("serving: give an action: warmup")
    planned = warmup_plan(args)
    if args.plan:
        for p in planned:
            ui.line(f"{p.key} {p.dtype}" + (f" ({p.why})" if p.why else ""))
        return 0
    warmup = guard_warmup()  # no guard: one line, before any input is made
    led = None if args.no_ledger else open_ledger(args)
    found: List[FieldFailure] = []

    def sink(ff: FieldFailure) -> None:
        found.append(ff)
        if led is not None:
            led.record_field_failure(ff)

    device = "cuda" if cuda_available() else "cpu"
    for op, calls in op_calls(planned, device, args.seed):
        warmup(op, calls, dir=args.serving_dir, sink=sink)
        ui.line(f"{op}: {len(calls)} call(s) verified on {device}")
    for ff in found:
        ui.line(f"  FIELD FAILURE {field_failure_words(ff)}", style="red")
    where = "" if led is None else f" (recorded in {led.location}: `kernel-agent gate` fails until a demote)"
    ui.line(
        f"warmup: {len(planned)} call(s), {len(found)} field failure(s){where if found else ''}",
        style="bold red" if found else "bold green",
    )
    return 1 if found else 0


def warmup_plan(args) -> List[PlannedCall]:
    """The calls `serving warmup` makes: a model's decode step (--model) or the shapes given (--shapes)."""
    if bool(args.model) == bool(args.shapes):
        raise UsageError("serving warmup: give --model CONFIG or --shapes OP:SHAPE;..., one of the two")
    if args.shapes:
        return plan_shapes(args.shapes, args.dtype)
    try:
        cfg = load_model_config(args.model)
        points = parse_points(args.points)
        kv_modes = parse_names(args.kv, KV_MODES, "--kv")
    except ModelConfigError as e:
        raise UsageError(str(e)) from None
    return plan_model(cfg, points, kv_modes, args.dtype)


def cmd_dispatch(args) -> int:
    if args.op:
        check_op(args.op)
    from ..harness import serving  # here: the serving set imports torch, which comes after the flags are checked
    from ..harness.dispatch import measured_choices, record_choices  # here: as the serving set

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
    from ..harness import serving  # here: as in cmd_dispatch

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

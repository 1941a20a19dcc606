"""`kernel-agent serving warmup`: the serving guard's first-use checks made before traffic
(harness/workload/warmup.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ...harness.field_failures import FieldFailure
from ...harness.workload.model_step import KV_MODES, ModelConfigError, load_model_config, parse_names, parse_points
from ...harness.workload.warmup import PlannedCall, guard_warmup, op_calls, plan_model, plan_shapes
from .. import ui
from .common import UsageError, command, cuda_available, open_ledger
from .views import field_failure_words

if TYPE_CHECKING:
    pass


def register(sub) -> None:
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

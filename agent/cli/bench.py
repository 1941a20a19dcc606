"""`kernel-agent bench`: GPU timings of an op's kernels against the incumbent and the torch anchor, or a model's
decode step (`--model`)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

from ...harness import env
from ...harness.bench.bench_records import BenchKernel, BenchOutcome, BenchSpec, Measurement
from ...harness.ledger.ledger import RunStatus
from ...harness.workload.model_step import (
    KV_MODES,
    STACKS,
    ModelConfigError,
    Point,
    load_model_config,
    parse_bytes,
    parse_names,
    parse_points,
    run_kv_budget,
    run_model_bench,
)
from ...ops import get_op
from .. import ui
from ..placement import ChildEvaluator, Devices, Evaluator, LocalDevices
from .common import (
    UsageError,
    check_files,
    command,
    cuda_available,
    open_ledger,
    parse_ops,
)


def register(sub) -> None:
    b = sub.add_parser(
        "bench",
        help="time kernels on the GPU against the incumbent and the torch anchor, or a model's decode step (--model)",
    )
    b.add_argument("--op", help="an op, or all (required unless --model)")
    b.add_argument("files", nargs="*", metavar="FILE", help="candidate files (default: the baseline only)")
    b.add_argument("--shapes", default="serving", help="serving | tiny | explicit shapes 'a,b,c;d,e,f'")
    b.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    b.add_argument("--json", action="store_true", help="print the JSON document instead of the tables")
    b.add_argument(
        "--model",
        metavar="CONFIG",
        help="time one decode step of a model: a preset (llama-3-8b, "
        "llama-3-70b-tp8, qwen2.5-7b, mistral-7b) or a JSON config file",
    )
    b.add_argument("--batch", type=int, help="--model: sequences per step (default 32)")
    b.add_argument("--context", type=int, help="--model: tokens per sequence (default 8192)")
    b.add_argument("--points", help="--model: several BATCHxCONTEXT points, e.g. 32x8192,8x32768,64x2048")
    b.add_argument("--kv", help="--model: KV cache modes, bf16 and/or int8 (default bf16,int8)")
    b.add_argument(
        "--stacks",
        help="--model: torch, baseline, serving, hybrid (cuBLAS matmuls with the baseline "
        "attention), flashinfer (cuBLAS matmuls with FlashInfer's paged decode; "
        "the flashinfer extra) and/or unguarded (the serving stack with its guard off: "
        "with serving, the guard's cost) (default torch,baseline,serving)",
    )
    b.add_argument(
        "--kv-budget",
        metavar="SIZE",
        help="--model: a KV-cache memory budget per GPU (e.g. 60GiB): each "
        "KV mode runs the most sequences of --context tokens whose "
        "cache fits it, and tokens/s are compared at equal memory",
    )
    b.add_argument("--seed", type=int, default=0, help="--model: seed of the random weights, cache and input")
    b.add_argument("--out", help="also write the JSON document to this file")
    b.add_argument("--ledger", default=None, help="record the results in this ledger (default runs/ledger.db)")
    b.add_argument("--no-ledger", action="store_true")
    b.add_argument("--remeasure-ceilings", action="store_true")
    b.add_argument(
        "--processes",
        type=int,
        default=1,
        help="time each shape in this many processes, one after the other, and report a spread that "
        "includes the differences between them (default 1)",
    )


@command("bench")
def cmd_bench(args, evaluator: Optional[Evaluator] = None, devices: Optional[Devices] = None) -> int:
    """Time the baseline, the anchor and candidate files per shape, each shape in `args.processes` benchmark
    children (`evaluator`; default: sandboxed children of this process) on this machine's GPU (`devices`)."""
    if args.model:
        return _bench_model(args)
    model_flags = [
        f
        for f, v in (
            ("--batch", args.batch),
            ("--context", args.context),
            ("--points", args.points),
            ("--kv", args.kv),
            ("--stacks", args.stacks),
            ("--kv-budget", args.kv_budget),
        )
        if v is not None
    ]
    if model_flags:
        raise UsageError(f"{', '.join(model_flags)}: only with --model")
    if not args.op:
        raise UsageError("bench: give --op (an op, or all) or --model")
    from ...harness.bench.bench import NO_GPU, load_ceilings, resolve_shapes  # here: torch, after the flags

    evaluator, devices = evaluator or ChildEvaluator(), devices or LocalDevices()
    ops = parse_ops(args.op)
    check_files(args.files)
    if args.files and len(ops) > 1:
        raise UsageError("candidate files need a single --op")
    if args.processes < 1:
        raise UsageError("--processes must be at least 1")
    if not devices.available():
        ui.error(NO_GPU)
        return 2
    if args.remeasure_ceilings:
        load_ceilings(remeasure=True)
    doc: Dict[str, Any] = {"results": [], "errors": []}
    for name in ops:
        op = get_op(name)
        try:
            shapes = resolve_shapes(op, args.shapes)
        except ValueError as e:
            raise UsageError(str(e))
        kernels = [BenchKernel("baseline")] + [
            BenchKernel(f"candidate:{os.path.basename(f)}", os.path.abspath(f)) for f in args.files
        ]
        with ui.Progress(f"bench {name}", len(shapes)) as prog:
            for s in shapes:
                _bench_one_shape(args, evaluator, name, s.key(), kernels, doc)
                prog.advance(f"{name} {s.key()}")
    if doc.get("run_id"):
        open_ledger(args).set_run_status(doc["run_id"], RunStatus.FINISHED, finished=True)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print_bench(doc)
    return 1 if doc["errors"] else 0


def _bench_one_shape(
    args, evaluator: Evaluator, name: str, shape_key: str, kernels: List[BenchKernel], doc: Dict[str, Any]
) -> None:
    """Time one shape in `args.processes` children, add what they measured to `doc`, record it and write it out."""
    from ...harness.bench.bench import merge_processes, with_reported_times  # here: torch, after the flags

    # references: what serving engines run (FlashInfer's paged decode), shown beside the torch anchor
    spec = BenchSpec(name, (shape_key,), args.dtype, tuple(kernels), references=True)
    outs = [BenchOutcome.from_json(evaluator.bench(spec.to_json())) for _ in range(args.processes)]
    doc["ceilings"] = outs[-1].ceilings or doc.get("ceilings")
    errors = [o.error for o in outs if o.error]
    if errors:
        doc["errors"].append(f"{name} {shape_key}: {errors[0]}")
    good = [o for o in outs if not o.error] or outs[:1]  # what a failed one measured still shows
    n = min(len(o.results) for o in good)
    results = [merge_processes([o.results[i] for o in good]) for i in range(n)]
    doc["results"] += [with_reported_times(r) for r in results]
    if not args.no_ledger:
        _record_bench_doc(args, doc, results)
    if args.out:  # after every shape: a cut-short run keeps what it measured
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


def _record_bench_doc(args, doc, results) -> None:
    from ...harness.bench.bench import record_shape_result  # here: torch, after the flags

    led = open_ledger(args)
    if not doc.get("run_id"):
        run = led.start_run(
            {"command": "bench", "shapes": args.shapes, "dtype": args.dtype, "files": args.files},
            env.versions(),
            "bench",
            parse_ops(args.op),
            (doc.get("ceilings") or {}).get("gpu"),
            {},
        )
        doc["run_id"] = run.id
    for res in results:
        record_shape_result(led, doc["run_id"], res)


_BENCH_COLUMNS = [
    "op",
    "shape",
    "dtype",
    "kernel",
    "median ms",
    "spread",
    "graph ms",
    "reported (run to run)",
    "anchor/this",
    "flashinfer/this",
    "rate",
    "of ceiling",
]


def print_bench(doc) -> None:
    c = doc.get("ceilings") or {}
    if c:
        ui.line(f"{c.get('gpu')}: ceilings copy {c.get('copy_tbps')} TB/s, bf16 matmul {c.get('bf16_tflops')} TFLOP/s")
    rows = []
    for res in doc["results"]:
        ms = res["measurements"]
        anchor = next((m for m in ms if m["label"].startswith("anchor")), None)
        fi = next((m for m in ms if m["label"].startswith("anchor:flashinfer") and not m.get("error")), None)
        rows += [_bench_row(res, m, anchor, fi) for m in ms]
    ui.table("", _BENCH_COLUMNS, rows, justify=["left"] * 4 + ["right"] * 8)
    for res in doc["results"]:  # what the table has no column for: e.g. which SDPA backend ran
        for m in res["measurements"]:
            if m.get("note") and not m.get("error"):
                ui.line(f"{res['op']} {res['shape']} {m['label']}: {m['note']}")
    for e in doc.get("errors", []):
        ui.line(f"error: {e}", style="red")


def _bench_row(res: Dict[str, Any], m: Dict[str, Any], anchor: Optional[Dict], fi: Optional[Dict]) -> list:
    """The table's row of measurement m of shape result res, against the shape's torch anchor and FlashInfer."""
    from ...harness.bench.bench import reported_time  # here: torch, after the flags

    if m.get("error"):
        return [res["op"], res["shape"], res["dtype"], m["label"], "error", "", "", "", "", "", m["error"][:60]]
    ratio = f"{anchor['median_ms'] / m['median_ms']:.2f}x" if anchor and not anchor.get("error") else ""
    fi_ratio = f"{fi['median_ms'] / m['median_ms']:.2f}x" if fi else ""
    rate = f"{m['tflops']:.0f} TF/s" if m.get("ceiling_kind") == "compute" else f"{m['tbps']:.2f} TB/s"
    rep_ms, rep_spread, rep_kind = reported_time(Measurement.from_json(m))
    graph = ""
    if m.get("graph_ms"):
        graph = f"{m['graph_ms']:.4f}" + (
            f" ±{m['graph_spread_ms']:.4f}" if m.get("graph_spread_ms") is not None else ""
        )
    return [
        res["op"],
        res["shape"],
        res["dtype"],
        m["label"],
        f"{m['median_ms']:.4f}",
        f"±{m['spread_ms']:.4f}",
        graph,
        f"{rep_ms:.4f} ±{rep_spread:.4f} {rep_kind}",
        ratio,
        fi_ratio,
        rate,
        f"{m['fraction_of_ceiling']:.0%}" + (" IMPLAUSIBLE" if m.get("implausible") else ""),
    ]


# -- bench --model ---------------------------------------------------------------------------------


def _bench_model(args) -> int:
    """`bench --model CONFIG`: one decode step of a model per stack and KV cache (harness/workload/model_step.py)."""
    # the flags and the config are checked before torch is imported: a usage error comes at once
    if args.op:
        raise UsageError("bench: give --op or --model, not both")
    if args.files:
        raise UsageError("bench --model takes no candidate FILE (it times the baselines and the serving set)")
    if args.points and (args.batch is not None or args.context is not None):
        raise UsageError("bench --model: give --points, or --batch and --context, not both")
    if args.kv_budget and (args.points or args.batch is not None):
        raise UsageError(
            "bench --model --kv-budget: the budget sets the batch; give --context, not --points or --batch"
        )
    try:
        cfg = load_model_config(args.model)
        budget = parse_bytes(args.kv_budget) if args.kv_budget else None
        if args.points:
            points = parse_points(args.points)
        else:
            batch = 32 if args.batch is None else args.batch
            context = 8192 if args.context is None else args.context
            if batch < 1 or context < 1:
                raise ModelConfigError(f"--batch and --context must be at least 1, got {batch} and {context}")
            points = [Point(batch, context)]
        stacks = parse_names(args.stacks or "torch,baseline,serving", STACKS, "--stacks")
        kv_modes = parse_names(args.kv or ",".join(KV_MODES), KV_MODES, "--kv")
    except ModelConfigError as e:
        raise UsageError(str(e))
    if args.out and os.path.isdir(args.out):
        raise UsageError(f"--out {args.out}: is a folder; give a file path")
    if not cuda_available():
        ui.error("bench --model needs a CUDA GPU")
        return 2
    to_stdout = args.json

    def to_stderr(text: str) -> None:  # the document goes to stdout: the progress lines go beside it
        sys.stderr.write(text + "\n")

    log: Callable[[str], None] = to_stderr if to_stdout else ui.line
    if budget is not None:
        result = run_kv_budget(cfg, budget, points[0].context, stacks, kv_modes, seed=args.seed, log=log)
    else:
        result = run_model_bench(cfg, points, stacks, kv_modes, seed=args.seed, log=log)
    doc = result.to_json()
    if budget is not None:
        doc["kv_budget_bytes"] = budget
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    if to_stdout:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print_model_bench(result, budget)
    return 0


KV_LABEL = {"bf16": "bf16", "int8": "int8 (quantize_kv)"}


def print_model_bench(result, budget: Optional[int] = None) -> None:
    """The step table (ms/step, tokens/s, vs torch and vs flashinfer), at a KV budget the equal-memory table,
    the op shares, what served each op in the serving stack, and the int8 cache's accuracy."""
    cfg = result.config
    tp = f", tensor parallel {cfg.tp} (one GPU's shard; all-reduces not timed)" if cfg.tp > 1 else ""
    ui.line(
        f"{cfg.name}: decode step of {cfg.layers} layers (hidden {cfg.hidden}, {cfg.heads} heads, {cfg.kv_heads} "
        f"KV heads, D {cfg.head_dim}, MLP {cfg.intermediate}{tp}) on {result.gpu}; one layer as a CUDA graph, "
        f"x {cfg.layers}",
        style="bold",
    )
    rows = []
    for p in result.points:
        for t in p.timings:
            kv = "bf16 (reference)" if t.stack == "torch" else KV_LABEL[t.kv]
            rows.append(
                [
                    f"B={p.batch} ctx={p.context}",
                    t.stack,
                    kv,
                    f"{t.step_ms:.2f}",
                    f"{t.tokens_per_s:,.0f}",
                    f"{t.vs_torch:.3f}x" if t.vs_torch is not None else "",
                    f"{t.vs_flashinfer:.3f}x" if t.vs_flashinfer is not None else "",
                ]
            )
    ui.table(
        "",
        ["point", "stack", "KV cache", "ms/step", "tokens/s", "vs torch", "vs flashinfer"],
        rows,
        justify=["left", "left", "left", "right", "right", "right", "right"],
    )
    _print_guard_cost_and_budget(result, budget)
    labels = ["qkv", "quantize_kv", "attention", "o", "gate_up", "down", "other"]
    shown = [lb for lb in labels if any(lb in t.shares for p in result.points for t in p.timings)]
    rows = [
        [f"B={p.batch} ctx={p.context}", t.stack, t.kv]
        + [f"{t.shares[lb]:.1%}" if lb in t.shares else "" for lb in shown]
        for p in result.points
        for t in p.timings
    ]
    ui.table(
        "share of each op in the step (each op call timed alone; other: norms, SiLU, residuals, cache writes)",
        ["point", "stack", "KV"] + shown,
        rows,
        justify=["left"] * 3 + ["right"] * len(shown),
    )
    served = [
        [f"B={p.batch} ctx={p.context}", s.kv, s.label, s.op, s.bucket, s.implementation]
        for p in result.points
        for s in p.served
    ]
    if served:
        ui.table(
            "what served each op in the serving stack", ["point", "KV", "call", "op", "bucket", "served by"], served
        )
    for p in result.points:
        if p.accuracy is not None:
            ui.line(f"B={p.batch} ctx={p.context}: {p.accuracy.describe()}")


def _print_guard_cost_and_budget(result, budget: Optional[int]) -> None:
    """The lines after the step table: the guard's cost where it was timed, the equal-memory table at a budget."""
    for line in guard_cost_lines(result):
        ui.line(line)
    if budget is not None:
        _print_equal_memory(result, budget)


def guard_cost_lines(result) -> List[str]:
    """At each point and KV mode timed with both the serving stack and the `unguarded` one (the same
    dispatcher, its guard off), the guard's steady-state cost: the serving layer's time over the unguarded one's."""
    lines = []
    for p in result.points:
        by_key = {(t.stack, t.kv): t for t in p.timings}
        for kv in result.kv_modes:
            on, off = by_key.get(("serving", kv)), by_key.get(("unguarded", kv))
            if on is not None and off is not None:
                cost = on.layer_ms / off.layer_ms - 1
                lines.append(
                    f"B={p.batch} ctx={p.context} {kv}: the serving guard's steady-state cost {cost:+.2%} "
                    f"({on.layer_ms * 1e3:.1f} us a layer with it, {off.layer_ms * 1e3:.1f} us without)"
                )
    return lines


def _print_equal_memory(result, budget: int) -> None:
    """tokens/s per GPU of every stack and KV mode at the budget, against torch's bf16 stack at the budget's
    bf16 batch: the serving cost of a token at equal memory."""
    torch_bf16 = next(
        (t.tokens_per_s for p in result.points for t in p.timings if t.stack == "torch" and t.kv == "bf16"), None
    )
    rows = [
        [
            KV_LABEL[t.kv] if t.stack != "torch" else "bf16 (reference)",
            f"{p.batch}",
            t.stack,
            f"{t.tokens_per_s:,.0f}",
            f"{t.tokens_per_s / torch_bf16:.3f}x" if torch_bf16 else "",
        ]
        for p in result.points
        for t in p.timings
    ]
    ui.table(
        f"at a KV budget of {budget / 2**30:.1f} GiB per GPU, context {result.points[0].context}: tokens/s at "
        f"equal memory",
        ["KV cache", "sequences", "stack", "tokens/s", "vs torch bf16"],
        rows,
        justify=["left", "right", "left", "right", "right"],
    )

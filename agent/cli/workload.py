"""`kernel-agent workload`: import a serving trace, replay it into decode steps and shape buckets (`analyze`),
and choose a KV-cache format and page size for it (`plan`). docs/WORKLOADS.md says what each reads and writes."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional

from ...harness.workload.kv_plan import (
    CACHE_FORMATS,
    DEFAULT_MAX_ERROR,
    DEFAULT_PAGE_SIZES,
    ESTIMATE_BASIS,
    KvPlanError,
    estimate_options,
    install_plan,
    make_plan,
    write_plan,
)
from ...harness.workload.model_step import (
    KV_MODES,
    ModelConfigError,
    Point,
    load_model_config,
    parse_bytes,
    parse_names,
    run_point,
)
from ...harness.workload.workload import DEFAULT_KV_BUDGET, DEFAULT_MAX_BATCH, Analysis, analyze, measured_ratios
from ...harness.workload.workload_trace import IMPORTERS, TraceError, import_trace, read_header
from .. import ui
from .common import UsageError, check_writable, command, cuda_available, open_ledger


def register(sub) -> None:
    w = sub.add_parser("workload", help="a serving trace: import it, replay it into shape buckets, plan its KV cache")
    ws = w.add_subparsers(dest="workload_command", metavar="ACTION")
    i = ws.add_parser("import", help="convert another tool's trace into a workload trace (JSON Lines)")
    i.add_argument(
        "format",
        choices=sorted(IMPORTERS),
        help="vllm: its serving benchmark result (--save-result); "
        "sglang: bench_serving's --output-file with "
        "--output-details (the last run); flashinfer-bench: its "
        "trace JSON Lines",
    )
    i.add_argument("source")
    i.add_argument("--out", required=True, metavar="TRACE", help="the workload trace to write")
    a = ws.add_parser(
        "analyze", help="replay a trace: its (batch, context) points, op calls, buckets and their shares of the time"
    )
    _common_flags(a)
    a.add_argument("--kv", default="bf16", help="KV cache modes, bf16 and/or int8 (default bf16)")
    a.add_argument(
        "--no-arrivals",
        action="store_true",
        help="every request waits from the start (the engine never idle) instead of arriving when the trace says",
    )
    a.add_argument("--json", metavar="OUT", help="also write the JSON document to this file")
    a.add_argument(
        "--ledger",
        metavar="PATH|URL",
        help="a ledger whose benchmarks measured buckets' incumbents: those "
        "buckets take their measured time instead of the roofline's",
    )
    p = ws.add_parser("plan", help="choose the KV cache format and page size for a trace at a memory budget")
    _common_flags(p)
    p.add_argument(
        "--max-error",
        type=float,
        default=DEFAULT_MAX_ERROR,
        help=f"the largest relative error of the attention output against a bf16 cache (default {DEFAULT_MAX_ERROR:g})",
    )
    p.add_argument(
        "--page-sizes",
        default=",".join(map(str, DEFAULT_PAGE_SIZES)),
        help="page sizes to try, tokens (default %(default)s)",
    )
    p.add_argument(
        "--measure",
        choices=["auto", "on", "off"],
        default="auto",
        help="time each option on the GPU with bench --model's machinery (auto: when there is one)",
    )
    p.add_argument("--out", default=os.path.join("runs", "kv_plan.json"), help="the plan file (default %(default)s)")
    p.add_argument(
        "--install",
        action="store_true",
        help="also write the plan into the serving folder (kv_plan.json beside its manifest), where serving reads it",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    command("workload")(cmd_workload)


def _common_flags(p) -> None:
    p.add_argument("trace", help="a workload trace (JSON Lines; `workload import` makes one)")
    p.add_argument(
        "--model",
        required=True,
        metavar="CONFIG",
        help="the served model: a preset (llama-3-8b, ...) or a JSON config (see `bench --model`)",
    )
    p.add_argument(
        "--kv-budget", default=DEFAULT_KV_BUDGET, metavar="SIZE", help="KV-cache memory per GPU (default %(default)s)"
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help="most sequences in a step (the engine's max_num_seqs; default %(default)s)",
    )


def _check_output(flag: str, path: Optional[str], make_folder: bool = False) -> None:
    """A file the command will write at the end: refused now (not after a long replay) when it is a folder or
    its folder does not exist (and will not be made)."""
    if not path:
        return
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; give the file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not make_folder and not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: no folder {folder}")
    check_writable(path, flag, folder=False)


def cmd_workload(args) -> int:
    if not args.workload_command:
        raise UsageError("workload: give an action: import, analyze or plan")
    _check_output(
        "--out" if args.workload_command != "analyze" else "--json",
        args.out if args.workload_command != "analyze" else args.json,
        make_folder=args.workload_command == "plan",
    )
    try:
        if args.workload_command == "import":
            return _import(args)
        model = load_model_config(args.model)
        budget = parse_bytes(args.kv_budget)
        if args.max_batch < 1:
            raise UsageError(f"--max-batch must be at least 1, got {args.max_batch}")
        if args.workload_command == "analyze":
            return _analyze(args, model, budget)
        return _plan(args, model, budget)
    except (TraceError, ModelConfigError, KvPlanError) as e:
        raise UsageError(str(e).splitlines()[0]) from None


def _import(args) -> int:
    n = import_trace(args.format, args.source, args.out)
    ui.line(f"wrote {args.out}: {n} record(s) from {args.format} {args.source}")
    return 0


class _Bar:
    """The progress bar of a pass over a trace: MiB read of the file, per KV mode."""

    def __init__(self, path: str):
        self.size = max(1, os.path.getsize(path)) if os.path.isfile(path) else 1
        self.progress: Optional[ui.Progress] = None
        self.done = 0

    def __call__(self, label: str, done: int, size: int) -> None:
        if self.progress is None or self.progress.description != label:
            self.close()
            self.progress = ui.Progress(label, total=math.ceil(self.size / 2**20)).__enter__()
            self.done = 0
        mib = math.ceil(self.size / 2**20) if done >= self.size else done // 2**20  # the bar's total at the end
        if mib > self.done and ui.is_tty():
            self.progress.advance("", mib - self.done)
            self.done = mib

    def close(self) -> None:
        if self.progress is not None:
            self.progress.__exit__(None, None, None)
            self.progress = None


def _layout_note(trace: str, model) -> None:
    """A trace that names its KV layout (FlashInfer-Bench's definitions do) and a --model of other heads: said,
    since the steps are then costed at the model's heads."""
    layout = read_header(trace).extra.get("kv_layout")
    if isinstance(layout, dict):
        mine = {"heads": model.heads, "kv_heads": model.kv_heads, "head_dim": model.head_dim}
        other = {k: layout.get(k) for k in mine}
        if other != mine:
            ui.line(f"note: the trace was recorded with {other}; --model {model.name} has {mine}")


def _analyze(args, model, budget: int) -> int:
    kv_modes = parse_names(args.kv, KV_MODES, "--kv")
    _layout_note(args.trace, model)
    ratios = measured_ratios(open_ledger(args, read=True).bench_results()) if args.ledger else None
    bar = _Bar(args.trace)
    name = os.path.basename(args.trace)
    try:
        result = analyze(
            args.trace,
            model,
            kv_modes,
            budget,
            args.max_batch,
            arrivals=not args.no_arrivals,
            progress=lambda kv, done, size: bar(f"replay {name} ({kv} cache, MiB read)", done, size),
            ratios=ratios,
        )
    finally:
        bar.close()
    doc = analysis_doc(args.trace, model, budget, result)
    if ratios is not None:
        doc["timing"] += (
            f"; buckets whose incumbent the ledger {args.ledger} measured take that measurement "
            f"(measured_ratio: its measured over roofline time)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    for kv, a in result.items():
        _print_analysis(kv, a)
    if args.json:
        ui.line(f"wrote {args.json}")
    return 0


def analysis_doc(trace: str, model, budget: int, result: Dict[str, Analysis]) -> Dict[str, Any]:
    return {
        "trace": trace,
        "model": model.to_json(),
        "kv_budget_bytes": budget,
        "timing": "roofline estimate (nominal H200 ceilings: harness.workload.model_step.NOMINAL_TBPS, NOMINAL_TFLOPS)",
        "kv": {kv: a.to_json() for kv, a in result.items()},
    }


def _print_analysis(kv: str, a: Analysis) -> None:
    s = a.schedule
    what = "simulated from its requests" if s.source == "requests" else "the engine's recorded steps"
    ui.line(
        f"{kv} cache: {s.steps:,} decode steps ({what}), {s.decode_tokens:,} tokens, mean batch "
        f"{s.decode_tokens / max(s.steps, 1):.1f}, {s.tokens_per_s():,.0f} tokens/s by the roofline"
        + ("; " if s.source == "requests" else "")
        + (
            f"{s.finished:,}/{s.requests:,} requests finished"
            + (f", {s.dropped:,} too long for the budget" if s.dropped else "")
            + f"; peak {s.peak_pages:,} of {s.budget_pages:,} pages"
            if s.source == "requests"
            else ""
        ),
        style="bold",
    )
    ui.table(
        f"op calls by bucket ({kv} cache, share of step time)",
        ["op", "bucket", "calls", "share", "time from", "heaviest shape"],
        [
            [
                b.op,
                b.bucket,
                f"{b.calls:,}",
                f"{b.share:.1%}",
                "roofline" if b.measured_ratio is None else f"ledger ({b.measured_ratio:.2f}x roofline)",
                b.shape.key() if b.shape is not None else "",
            ]
            for b in a.buckets
        ],
        justify=["left", "left", "right", "right", "left", "left"],
    )
    top = a.to_json()["distribution"]["histogram"]
    rows = sorted(top, key=lambda r: -r["time"])[:8]
    ui.table(
        f"(batch, context) of the steps ({kv} cache, heaviest ranges)",
        ["batch", "context", "steps", "time"],
        [[r["batch"], r["context"], f"{r['steps']:.1%}", f"{r['time']:.1%}"] for r in rows],
        justify=["right", "right", "right", "right"],
    )


def _page_sizes(text: str) -> List[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--page-sizes {text!r}: expected a comma list of integers, e.g. 16,32,64") from None
    bad = [p for p in sizes if not 1 <= p <= 256 or p & (p - 1)]
    if bad or not sizes:
        raise UsageError(f"--page-sizes {text!r}: page sizes are powers of two from 1 to 256")
    return sizes


def _plan(args, model, budget: int) -> int:
    sizes = _page_sizes(args.page_sizes)
    if not (args.max_error >= 0 and math.isfinite(args.max_error)):
        raise UsageError(f"--max-error must be a number of at least 0, got {args.max_error}")
    gpu = args.measure == "on" or (args.measure == "auto" and cuda_available())
    if args.measure == "on" and not cuda_available():
        raise UsageError("--measure on: no CUDA GPU on this machine")
    say = (lambda text: None) if args.json else ui.line  # --json: the document alone on stdout (its basis says it)
    measure, basis = (
        (_gpu_measure(say), "measured on the GPU (bench --model's step at each option's heaviest point)")
        if gpu
        else (None, ESTIMATE_BASIS)
    )
    if not gpu:
        say("no GPU: the options are estimated by the roofline and the int8 error on the CPU, not measured")
    options = estimate_options(
        args.trace,
        model,
        budget,
        args.max_error,
        sizes,
        CACHE_FORMATS,
        args.max_batch,
        measure,
        basis,
        progress=lambda what: say(f"replaying the trace: {what}"),
    )
    plan = make_plan(args.trace, model, budget, args.max_error, options, basis)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_plan(plan, args.out)
    installed = install_plan(plan) if args.install else None
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
        return 0
    ui.table(
        f"KV-cache options for {model.name} at {budget / 2**30:.1f} GiB per GPU ({basis})",
        ["cache", "page", "tokens/s per GPU", "mean batch", "error vs bf16", "within --max-error"],
        [
            [
                o.kv,
                str(o.page_size),
                f"{o.tokens_per_s:,.0f}",
                f"{o.mean_batch:.1f}",
                f"{o.error:.2e}",
                "yes" if o.within_error else "no",
            ]
            for o in options
        ],
        justify=["left", "right", "right", "right", "right", "left"],
    )
    for k, why in plan.not_offered.items():
        ui.line(f"{k}: not offered ({why})")
    ui.line(
        f"plan: {plan.kv_format} cache, {plan.page_size}-token pages -> {args.out}"
        + (f" and {installed}" if installed else ""),
        style="bold green",
    )
    return 0


def _gpu_measure(log):
    """(cfg, kv, batch, ctx) -> {step_ms, error}: the serving stack's step in that KV mode timed at that point
    (harness.workload.model_step.run_point); for int8 the error is its Int8Accuracy (against its own bf16 step)."""

    def measure(cfg, kv: str, batch: int, ctx: int) -> Dict[str, float]:
        res = run_point(cfg, Point(batch, ctx), ("serving",), (kv,), log=log)
        t = next(t for t in res.timings if t.stack == "serving" and t.kv == kv)
        err = res.accuracy.attn_rel_error if res.accuracy is not None else (0.0 if kv == "bf16" else float("nan"))
        return {"step_ms": t.step_ms, "error": err}

    return measure

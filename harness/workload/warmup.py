"""What `kernel-agent serving warmup` verifies before traffic: the op calls of a model's decode step, or a
list of op shapes, each with real inputs, handed to the serving guard.

The serving guard verifies a promoted kernel on the first real call of each shape class it serves; a warm-up
makes those first calls before any request does. The calls are planned without torch (a model config's
decode step, `step_op_calls`, or shapes parsed by each op's registry entry), then materialised as the
op's own example inputs (`Op.make_case`: the contract's arguments, drawn from a seed, on the device), so
that the guard sees what a serving stack would pass: the same shapes, dtypes and layouts.

The guard itself lives in `harness/serving/serving_guard.py` (`warmup(op, calls, dir=..., sink=...)`); `guard_warmup`
is the one place that finds it, and says in one line when this kernel-agent has none.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ... import ops  # the package door: its torch-bound names (dtype_from_name) load on first use
from ...ops import NAMES as OP_NAMES
from ...ops import get_op
from .model_step import ModelConfig, Point, step_op_calls

# Where the guard's warm-up is looked up: the guard's own module, else the serving set's.
GUARD_MODULES = ("..serving.serving_guard", "..serving.serving")


class WarmupError(ValueError):
    """A bad warm-up request, or no guard to hand it to (one line; the command line exits 2 on it)."""


@dataclass(frozen=True)
class PlannedCall:
    """One op call to warm up: the op, its shape (a registry shape record) and the dtype of its inputs."""

    op: str
    shape: Any  # the op's Shape subclass
    dtype: str
    why: str = ""  # where it comes from: the model's role ('qkv', 'attention', ...) at a point, or 'shapes'

    @property
    def key(self) -> str:
        return f"{self.op}:{self.shape.key()}"


def plan_model(cfg: ModelConfig, points: Sequence[Point], kv_modes: Sequence[str], dtype: str) -> List[PlannedCall]:
    """The registry op calls of one decode step of `cfg` at each point and KV mode, each distinct call once
    (the four matmuls of a layer are three shapes when two share one; both KV modes call the same matmuls)."""
    planned: Dict[str, PlannedCall] = {}
    for point in points:
        for kv in kv_modes:
            for call in step_op_calls(cfg, point.batch, point.context, kv, dtype):
                p = PlannedCall(call.op, call.shape, dtype, f"{call.label} at {point} ({kv} cache)")
                planned.setdefault(p.key, _checked(p))
    return list(planned.values())


def plan_shapes(text: str, dtype: str) -> List[PlannedCall]:
    """`--shapes 'OP:SHAPE;OP:SHAPE'`: each an op of the registry and a shape as `bench --shapes` writes one
    (positional 'a,b,c' in field order, or 'k=v,...'), each distinct call once."""
    planned: Dict[str, PlannedCall] = {}
    items = [t.strip() for t in (text or "").split(";") if t.strip()]
    if not items:
        raise WarmupError("--shapes: give OP:SHAPE items separated by ';', e.g. 'matmul:M=32,N=6144,K=4096'")
    for item in items:
        op_name, sep, shape_text = item.partition(":")
        op_name = op_name.strip()
        if not sep or not shape_text.strip():
            raise WarmupError(f"--shapes: {item!r} is not OP:SHAPE (e.g. 'quantize_kv:T=32,H=16,D=128')")
        if op_name not in OP_NAMES:
            raise WarmupError(f"--shapes: unknown op {op_name!r} in {item!r}; expected one of {', '.join(OP_NAMES)}")
        try:
            shape = get_op(op_name).parse_shape(shape_text)
        except ValueError as e:
            raise WarmupError(f"--shapes: {e}") from None
        planned.setdefault(f"{op_name}:{shape.key()}", _checked(PlannedCall(op_name, shape, dtype, "shapes")))
    return list(planned.values())


def _checked(p: PlannedCall) -> PlannedCall:
    """`p`, once its op is known to take inputs of its dtype."""
    op = get_op(p.op)
    if ops.dtype_from_name(p.dtype) not in op.dtypes:
        names = ", ".join(ops.DTYPE_NAMES[d] for d in op.dtypes)
        raise WarmupError(f"{p.op} takes no {p.dtype} inputs (it takes {names})")
    return p


def call_inputs(planned: PlannedCall, device: Any, seed: int = 0) -> Dict[str, Any]:
    """The keyword arguments of one real call of `planned.op` (its contract's names), on `device`: the op's own
    example inputs for the shape (`Op.make_case`, contiguous, from `seed`)."""
    dtype = ops.dtype_from_name(_checked(planned).dtype)
    args = dict(get_op(planned.op).make_case(planned.shape, dtype, seed=seed, device=device).args)
    table = args.get("block_table")
    if table is not None and table.shape[1] == -(-planned.shape.ctx // planned.shape.block_size) + 1:
        # The registry's paged example keeps one always-unused spare column (ops/paged.py, make_paged_layout);
        # a serving stack's table holds the context's blocks only (model_step.py, make_kv_state), and the
        # dispatcher reads ctx, so the bucket and the shape class, from its width: the call is made as served.
        args["block_table"] = table[:, :-1].contiguous()
    return args


def op_calls(planned: Sequence[PlannedCall], device: Any, seed: int = 0) -> Iterator[Tuple[str, List[Dict[str, Any]]]]:
    """Each op with its calls' inputs materialised, op by op in the order planned (one op's inputs alive at a
    time: a large model's are gigabytes)."""
    seeds = {id(p): seed + i for i, p in enumerate(planned)}
    for op in dict.fromkeys(p.op for p in planned):
        yield op, [call_inputs(p, device, seeds[id(p)]) for p in planned if p.op == op]


def guard_warmup() -> Callable[..., Any]:
    """The serving guard's `warmup(op, calls, dir=..., sink=...)`; WarmupError (one line) where this
    kernel-agent has no serving guard."""
    for name in GUARD_MODULES:
        try:
            module: Optional[Any] = importlib.import_module(name, __package__)
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}{name}":  # the guard's own imports failing is not its absence
                raise
            continue
        warmup = getattr(module, "warmup", None)
        if callable(warmup):
            return warmup
    raise WarmupError(
        "serving warmup: this kernel-agent has no serving guard (harness/serving/serving_guard.py's warmup)"
    )


__all__ = [
    "GUARD_MODULES",
    "WarmupError",
    "PlannedCall",
    "plan_model",
    "plan_shapes",
    "call_inputs",
    "op_calls",
    "guard_warmup",
]

"""A run's configuration and what it targets: `RunConfig` (stored with the run, read back on a resume), the
targets it asks proposals for (one per op and bucket, or a model's decode step weighted by share), and the
`Budget` that says when to stop (candidates, the time limit, tokens), with the one sentence a run ends on at
its time limit (`time_limit_reached`)."""

from __future__ import annotations

import collections
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..harness.workload import model_step
from ..ops import NAMES, get_op
from ..ops.common import Shape

ALL_OPS = NAMES  # the op registry, in its order


@dataclass
class RunConfig:
    ops: List[str] = field(default_factory=lambda: list(ALL_OPS))
    dtype: str = "bfloat16"
    proposer: str = "search"
    model: Optional[Dict[str, Any]] = None  # ModelConfig fields
    max_candidates: Optional[int] = 10  # None: no cap (the time limit is the budget)
    per_round: int = 2  # proposals asked of the proposer at a time for one target
    time_limit_s: float = 1800.0
    token_budget: Optional[int] = None
    jobs: Optional[int] = None  # sanitizer processes (default: the usable cores, less one per GPU)
    seed: int = 0
    margin: float = 0.02
    bench_shapes: str = "serving"
    compute_sanitizer: bool = True
    gpus: Optional[int] = None  # GPUs used for evaluation (default: every visible one)
    candidates_dir: str = os.path.join("kernels", "candidates")
    # a model's decode step (harness.workload.model_step.ModelConfig fields) whose op calls are the targets, each
    # bucket weighted by its share of the step, at these points ('BATCHxCONTEXT,...')
    target_model: Optional[Dict[str, Any]] = None
    target_points: str = "32x8192"
    # a workload's weighted points instead of target_points' equal ones: [kv, batch, context, weight] per point
    # (harness.workload.workload.workload_points), and the trace they came from (`run --workload`)
    target_weights: Optional[List[List[Any]]] = None
    target_workload: Optional[Dict[str, Any]] = None
    # write the serving folder in place even where git tracks it (default: a branch of the run's own)
    in_place: bool = False

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        if d.get("model"):
            d["model"] = {k: v for k, v in d["model"].items() if k != "api_key"}  # never store secrets
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RunConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Target:
    op: str
    bucket: str
    shapes: List[Shape]
    weight: float = 1.0  # the share of proposals it gets (its share of a model's decode step; else equal)


def time_limit_reached(cfg: RunConfig) -> str:
    """Why a run stopped at its time limit: the one sentence, whether the budget or the hard stop saw it first."""
    return f"time limit reached ({cfg.time_limit_s:.0f}s)"


class Budget:
    def __init__(self, cfg: RunConfig, used_candidates: int, elapsed_before: float):
        self.cfg = cfg
        self.used = used_candidates
        self.t0 = time.time() - elapsed_before

    def elapsed(self) -> float:
        return time.time() - self.t0

    def exhausted(self, tokens: int = 0) -> Optional[str]:
        if self.cfg.max_candidates is not None and self.used >= self.cfg.max_candidates:
            return f"candidate budget reached ({self.cfg.max_candidates})"
        if self.elapsed() >= self.cfg.time_limit_s:
            return time_limit_reached(self.cfg)
        if self.cfg.token_budget is not None and tokens >= self.cfg.token_budget:
            return f"token budget reached ({self.cfg.token_budget})"
        return None


SHAPE_SUITES = ("serving", "tiny", "near_serving")


def run_shapes(op_name: str, spec: str, ops: Sequence[str]) -> List[Shape]:
    """The shapes a run targets for one op. `spec` is a suite name (serving, near_serving, tiny), or
    explicit shapes 'a,b,c;d,e,f' for a run over one op, or 'op:a,b,c;op:d,e,f' naming the op of
    each shape (ops not named keep their serving shapes). ValueError with a readable message."""
    op = get_op(op_name)
    if spec in SHAPE_SUITES:
        return op.shapes(spec)
    parts = [p.strip() for p in spec.split(";") if p.strip()]
    if not parts:
        raise ValueError(f"no shapes in {spec!r}")
    named = [p for p in parts if re.match(r"^[a-z_0-9]+:", p)]
    if not named:
        if len(ops) > 1:
            raise ValueError(
                f"explicit shapes for a run over several ops need the op of each shape: "
                f"'op:a,b,c;op:d,e,f' (e.g. '{ops[0]}:{parts[0]}')"
            )
        return [op.parse_shape(p) for p in parts]
    if len(named) != len(parts):
        raise ValueError(f"name the op of every shape or of none: {spec!r}")
    for p in named:
        if p.split(":", 1)[0] not in ops:
            raise ValueError(f"shape {p!r} names an op this run does not include ({', '.join(ops)})")
    mine = [p.split(":", 1)[1] for p in named if p.split(":", 1)[0] == op_name]
    return [op.parse_shape(p) for p in mine] if mine else op.shapes("serving")


def weighted_pick(weights: Sequence[float], asked: Sequence[int], exhausted: Set[int], start: int) -> Optional[int]:
    """The next target to ask the proposer for: of those not exhausted, the one furthest behind its weight
    (fewest requests per unit of weight), ties in turn from `start`. With equal weights this is
    round-robin; a bucket with twice the share of a model's step gets twice the proposals."""
    n = len(weights)
    live = [i for i in ((start + k) % n for k in range(n)) if i not in exhausted]
    if not live:
        return None
    return min(live, key=lambda j: (asked[j] + 1) / max(weights[j], 1e-9))


def weighted_points(cfg: RunConfig) -> List[Tuple[str, int, int, float]]:
    """(kv, batch, context, weight) of the decode steps a run targets: a workload's weighted points
    (`run --workload`), else every point of `target_points` in both KV modes, all of equal weight."""
    if cfg.target_weights:
        return [(str(kv), int(b), int(c), float(w)) for kv, b, c, w in cfg.target_weights]
    points = model_step.parse_points(cfg.target_points)
    n = len(points) * len(model_step.KV_MODES)
    return [(kv, p.batch, p.context, 1.0 / n) for p in points for kv in model_step.KV_MODES]


def model_targets(cfg: RunConfig) -> List[Target]:
    """The buckets a model's decode step calls at the run's weighted points (`weighted_points`), each
    weighted by its roofline share of the step at each point times the point's weight
    (harness.workload.model_step.step_op_calls), heaviest first; ops outside `cfg.ops` are left out."""
    model = model_step.ModelConfig.from_mapping(cfg.target_model or {})
    shapes: Dict[Tuple[str, str], List[Shape]] = {}
    weight: Dict[Tuple[str, str], float] = collections.defaultdict(float)
    for kv, batch, context, w in weighted_points(cfg):
        for call in model_step.step_op_calls(model, batch, context, kv, cfg.dtype):
            if call.op not in cfg.ops:
                continue
            key = (call.op, call.bucket)
            if call.shape not in shapes.setdefault(key, []):
                shapes[key].append(call.shape)
            weight[key] += call.share * w
    if not shapes:
        raise ValueError(f"the decode step of {model.name} calls none of the ops {', '.join(cfg.ops)}")
    keys = sorted(shapes, key=lambda k: -weight[k])
    return [Target(op, bucket, shapes[(op, bucket)], weight[(op, bucket)]) for op, bucket in keys]


def targets_for(cfg: RunConfig) -> List[Target]:
    if cfg.target_model:
        return model_targets(cfg)
    per_op = []
    for name in cfg.ops:
        op = get_op(name)
        by_bucket: Dict[str, List[Shape]] = {}
        for s in run_shapes(name, cfg.bench_shapes, cfg.ops):
            by_bucket.setdefault(op.bucket(s), []).append(s)
        per_op.append([Target(name, b, shapes) for b, shapes in by_bucket.items()])
    # interleaved across ops (each op's first bucket, then each op's second, ...): a budget that runs
    # out part-way through the targets has still reached every op (the stream asks them in this order)
    return [ts[i] for i in range(max(map(len, per_op), default=0)) for ts in per_op if i < len(ts)]

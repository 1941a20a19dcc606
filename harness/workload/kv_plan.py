"""A KV-cache plan for a workload: the cache format and page size that serve its trace fastest at a fixed
KV memory budget per GPU, within an accuracy budget (`kernel-agent workload plan`; docs/WORKLOADS.md).

Each option (format x page size) replays the trace with every request waiting from the start (the
engine's throughput when it is never idle: `harness.workload.workload.simulate`, arrivals=False) under the same
budget: a format of fewer bytes per token holds more sequences, a larger page wastes more of each
sequence's last page. Its tokens/s per GPU are the roofline's (no GPU), or the roofline's scaled by what
`bench --model`'s machinery measured at the option's heaviest point (`harness.workload.model_step.run_point`).

Formats: bf16 and int8 (codes and a float32 scale per token and head, the quantize_kv contract). FP8 is
not offered: the serving set has no FP8 decode kernel, so no plan could be served by it.

Accuracy: the relative error of the attention output with the cache in that format against bf16, ||int8 -
bf16|| / ||bf16||. Without a GPU, measured on the CPU on seeded normal data at the model's heads (an
estimate: real activations have outliers that per-token scales absorb differently); on a GPU, the
serving stack's own int8 step against its bf16 step (`Int8Accuracy`). bf16 is the reference (error 0).

The plan file is JSON; the serving set's is `kv_plan.json` in its folder (`serving_plan`). `load_plan` checks
it (its version, format, page size, model, that the choice is among its options) and raises KvPlanError in
one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from .model_step import ModelConfig, ModelConfigError
from .workload import DEFAULT_MAX_BATCH, StepModel, bucket_shares, replay_trace

PLAN_VERSION = 1
CACHE_FORMATS = ("bf16", "int8")
NOT_OFFERED = {"fp8": "no served FP8 decode path: the serving set has no FP8 KV-cache kernel"}
DEFAULT_PAGE_SIZES = (16, 32, 64)
DEFAULT_MAX_ERROR = 0.02  # the int8 cache measured about 0.0097 on the H200 (results/h200/serving_gain)
ESTIMATE_BASIS = "roofline estimate (no GPU: not measured)"


class KvPlanError(ValueError):
    """A plan file that cannot be used, in one line."""


@dataclass
class PlanOption:
    kv: str
    page_size: int
    tokens_per_s: float  # per GPU, the trace replayed never idle
    mean_batch: float
    steps: int
    error: float  # relative error of the attention output against bf16 (0 for bf16)
    within_error: bool = True
    basis: str = ESTIMATE_BASIS
    point: Optional[List[int]] = None  # [batch, context] of the option's heaviest step group
    measured_ratio: Optional[float] = None  # measured / roofline step time at that point (a GPU)

    def to_json(self) -> Dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


@dataclass
class KvPlan:
    model: Dict[str, Any]
    kv_budget_bytes: int
    max_error: float
    kv_format: str
    page_size: int
    basis: str
    options: List[PlanOption]
    trace: Dict[str, Any] = field(default_factory=dict)
    not_offered: Dict[str, str] = field(default_factory=lambda: dict(NOT_OFFERED))

    def chosen(self) -> PlanOption:
        return next(o for o in self.options if (o.kv, o.page_size) == (self.kv_format, self.page_size))

    def to_json(self) -> Dict[str, Any]:
        return {
            "kv_plan": PLAN_VERSION,
            "model": self.model,
            "kv_budget_bytes": self.kv_budget_bytes,
            "max_error": self.max_error,
            "kv_format": self.kv_format,
            "page_size": self.page_size,
            "basis": self.basis,
            "trace": self.trace,
            "options": [o.to_json() for o in self.options],
            "not_offered": self.not_offered,
        }

    def summary_lines(self) -> List[str]:
        """The plan in a few markdown lines: the choice, then every option (a pull request's section)."""
        best = self.chosen()
        lines = [
            f"KV-cache plan for {self.model.get('name')} at {self.kv_budget_bytes / 2**30:.1f} GiB per GPU "
            f"(error budget {self.max_error:g}; {self.basis}): **{self.kv_format} cache, {self.page_size}-token "
            f"pages**, {best.tokens_per_s:,.0f} tokens/s per GPU.",
            "",
            "| cache | page | tokens/s per GPU | mean batch | error vs bf16 | within budget |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for o in self.options:
            lines.append(
                f"| {o.kv} | {o.page_size} | {o.tokens_per_s:,.0f} | {o.mean_batch:.1f} | {o.error:.2e} | "
                f"{'yes' if o.within_error else 'no'} |"
            )
        lines += [""] + [f"{k} not offered: {v}." for k, v in self.not_offered.items()]
        return lines


def choose(options: Sequence[PlanOption], max_error: float) -> PlanOption:
    """The fastest option within the error budget; on a tie the more accurate format (bf16 before int8), then
    the smaller page. bf16 is always within (it is the reference), so there is always a choice."""
    within = [o for o in options if o.within_error]
    if not within:
        raise KvPlanError(f"no option is within the error budget {max_error:g}")
    return max(within, key=lambda o: (round(o.tokens_per_s, 6), -CACHE_FORMATS.index(o.kv), -o.page_size))


def int8_error_estimate(model: ModelConfig, context: int, seed: int = 0, batch: int = 2) -> float:
    """The attention output's relative error with an int8 cache (the quantize_kv rule) against bf16, on the
    CPU, on seeded normal data at the model's head shape and up to 2048 tokens of context."""
    import torch  # keeps the CLI's startup light (torch)

    from ...ops.quantize_kv import quantize_eager  # the contract's own rule, not a copy

    g = torch.Generator().manual_seed(seed)
    L, Hkv, D = max(1, min(context, 2048)), model.shard_kv_heads, model.head_dim
    group = model.shard_heads // Hkv
    q = torch.randn(batch, Hkv, group, D, generator=g).bfloat16().float()
    k, v = (torch.randn(batch, L, Hkv, D, generator=g).bfloat16() for _ in range(2))

    def attend(kk, vv):
        s = torch.einsum("bhgd,blhd->bhgl", q, kk) / math.sqrt(D)
        return torch.einsum("bhgl,blhd->bhgd", torch.softmax(s, -1), vv)

    codes_k, sk = quantize_eager(k)
    codes_v, sv = quantize_eager(v)
    ref = attend(k.float(), v.float())
    out = attend(codes_k.float() * sk[..., None], codes_v.float() * sv[..., None])
    return float((out - ref).norm() / ref.norm())


Measure = Callable[[ModelConfig, str, int, int], Dict[str, float]]  # (cfg, kv, batch, ctx) -> step_ms, error


def estimate_options(
    trace: str,
    model: ModelConfig,
    budget_bytes: int,
    max_error: float,
    page_sizes: Sequence[int] = DEFAULT_PAGE_SIZES,
    formats: Sequence[str] = CACHE_FORMATS,
    max_batch: int = DEFAULT_MAX_BATCH,
    measure: Optional[Measure] = None,
    basis: str = ESTIMATE_BASIS,
    progress: Optional[Callable[[str], None]] = None,
) -> List[PlanOption]:
    """Every (format, page size) option replayed on the trace; with `measure` (a GPU), each option's tokens/s
    scaled by measured over roofline step time at its heaviest point, and its error the measured one."""
    options = []
    error_cache: Dict[int, float] = {}
    for page in page_sizes:
        cfg = dataclasses.replace(model, page_size=page)
        for kv in formats:
            if progress:
                progress(f"{kv} cache, {page}-token pages")
            sched = replay_trace(trace, cfg, kv, budget_bytes, max_batch, arrivals=False)
            cost = StepModel(cfg, kv)
            _, points = bucket_shares(sched, cfg, cost=cost)
            top = points[0]
            opt = PlanOption(
                kv,
                page,
                sched.tokens_per_s(),
                sched.decode_tokens / max(sched.steps, 1),
                sched.steps,
                0.0,
                basis=basis,
                point=[top.batch, top.context],
            )
            if measure is not None:
                got = measure(cfg, kv, top.batch, top.context)
                opt.measured_ratio = got["step_ms"] / cost.ms(top.batch, top.context // page)
                opt.tokens_per_s /= opt.measured_ratio
                opt.error = got["error"] if kv != "bf16" else 0.0
            elif kv != "bf16":
                if top.context not in error_cache:
                    error_cache[top.context] = int8_error_estimate(cfg, top.context)
                opt.error = error_cache[top.context]
            opt.within_error = opt.error <= max_error
            options.append(opt)
    return options


def trace_identity(path: str, requests: Optional[int] = None) -> Dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"path": path, "sha256": h.hexdigest(), **({"requests": requests} if requests is not None else {})}


def make_plan(
    trace: str, model: ModelConfig, budget_bytes: int, max_error: float, options: List[PlanOption], basis: str
) -> KvPlan:
    best = choose(options, max_error)
    return KvPlan(
        model.to_json(), budget_bytes, max_error, best.kv, best.page_size, basis, options, trace_identity(trace)
    )


def write_plan(plan: KvPlan, path: str) -> None:
    tmp = f"{path}.partial-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(plan.to_json(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def plan_from_json(doc: Any, where: str = "plan") -> KvPlan:
    """A plan document checked: KvPlanError naming the first problem."""
    if not isinstance(doc, dict) or doc.get("kv_plan") != PLAN_VERSION:
        raise KvPlanError(f'{where}: not a KV-cache plan of version {PLAN_VERSION} ("kv_plan": {PLAN_VERSION})')
    try:
        model = ModelConfig.from_mapping(doc.get("model"), "plan")
    except ModelConfigError as e:
        raise KvPlanError(f"{where}: {e}") from None
    fmt, page, budget = doc.get("kv_format"), doc.get("page_size"), doc.get("kv_budget_bytes")
    if fmt not in CACHE_FORMATS:
        raise KvPlanError(f"{where}: kv_format {fmt!r} is not one the serving set serves ({', '.join(CACHE_FORMATS)})")
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= 256 or page & (page - 1):
        raise KvPlanError(f"{where}: page_size {page!r} is not a power of two from 1 to 256")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise KvPlanError(f"{where}: kv_budget_bytes must be a positive integer, got {budget!r}")
    fields_ = {f.name for f in dataclasses.fields(PlanOption)}
    try:
        options = [PlanOption(**{k: v for k, v in o.items() if k in fields_}) for o in doc.get("options") or []]
    except (TypeError, AttributeError):
        raise KvPlanError(f"{where}: options must be a list of option objects") from None
    plan = KvPlan(
        model.to_json(),
        budget,
        float(doc.get("max_error", DEFAULT_MAX_ERROR)),
        fmt,
        page,
        str(doc.get("basis", "")),
        options,
        dict(doc.get("trace") or {}),
        dict(doc.get("not_offered") or {}),
    )
    if not any((o.kv, o.page_size) == (fmt, page) for o in options):
        raise KvPlanError(f"{where}: the chosen {fmt} cache with {page}-token pages is not among its options")
    return plan


SERVING_PLAN_FILE = "kv_plan.json"  # in the serving folder, beside its manifest (`workload plan --install`)


def _serving_plan_path(dir: Optional[str]) -> str:
    from ..serving.serving import serving_dir  # keeps the CLI's startup light (the serving set imports torch)

    return os.path.join(str(dir) if dir is not None else str(serving_dir()), SERVING_PLAN_FILE)


def install_plan(plan: KvPlan, dir: Optional[str] = None) -> str:
    """Writes the plan into the serving folder (`dir`, else the serving set's); returns its path."""
    path = _serving_plan_path(dir)
    write_plan(plan, path)
    return path


def serving_plan(dir: Optional[str] = None) -> Optional[KvPlan]:
    """The serving set's KV-cache plan, the cache format and page size its workload is served with
    (`<serving folder>/kv_plan.json`), checked; None when the set has none."""
    path = _serving_plan_path(dir)
    return load_plan(path) if os.path.isfile(path) else None


def load_plan(path: str) -> KvPlan:
    """A plan file, checked (KvPlanError in one line)."""
    if not os.path.isfile(path):
        raise KvPlanError(f"no such plan file: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KvPlanError(f"{path}: not JSON ({getattr(e, 'msg', e)})") from None
    return plan_from_json(doc, path)


__all__ = [
    "PLAN_VERSION",
    "CACHE_FORMATS",
    "NOT_OFFERED",
    "DEFAULT_PAGE_SIZES",
    "DEFAULT_MAX_ERROR",
    "ESTIMATE_BASIS",
    "KvPlanError",
    "PlanOption",
    "KvPlan",
    "choose",
    "int8_error_estimate",
    "estimate_options",
    "trace_identity",
    "make_plan",
    "write_plan",
    "plan_from_json",
    "SERVING_PLAN_FILE",
    "install_plan",
    "serving_plan",
    "load_plan",
]

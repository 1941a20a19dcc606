"""Which trusted implementation serves each bucket, chosen from the benchmarks in the ledger.

Every benchmark times the incumbent beside the op's torch anchor. Where the anchor is a servable
implementation of the contract (Op.torch_impl), torch competes for the bucket with the Triton side:
the promoted kernel (timed beside torch in the benchmark that promoted it) or, where none was
promoted, the baseline. The faster one serves (serving.set_choice); a promoted kernel that torch
beats is demoted, so the serving set never runs slower than torch where both were measured. A
bucket's figure is
the geometric mean over its shapes of the median, over the benchmarks that timed both side by side,
of torch's time over the baseline's, each pair on one clock (CUDA-graph replays where both rows have
them, as the promotion rule reads them). Why side by side only: the two were then timed in one
process, interleaved, on the same inputs, so drift between benchmarks cancels out of the ratio.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ...ops import NAMES, get_op
from ..ledger.ledger import BenchResult, Ledger, row_clock, row_ms
from . import serving


@dataclass(frozen=True)
class ShapeTimes:
    """One shape's figures: the medians over the benchmarks that timed both side by side."""

    shape: str
    baseline_ms: float  # the Triton side: the baseline, or the promoted kernel (Choice.kernel_candidate)
    torch_ms: float
    clock: str  # 'graph' when every pair was read on graph replays, else 'event' (mixed: 'mixed')
    benchmarks: int

    @property
    def ratio(self) -> float:
        """torch's time over the baseline's (below 1: torch is faster)."""
        return self.torch_ms / self.baseline_ms


@dataclass(frozen=True)
class Choice:
    """The implementation that serves one (op, bucket, dtype, GPU), with the figures behind it."""

    op: str
    bucket: str
    dtype: str
    gpu: str
    impl: str  # serving.BASELINE | serving.TORCH | serving.KERNEL
    torch_label: str
    shapes: Tuple[ShapeTimes, ...] = field(default_factory=tuple)
    kernel_candidate: Optional[int] = None  # the promoted kernel's candidate id when it was the Triton side

    @property
    def triton_side(self) -> str:
        return f"kernel #{self.kernel_candidate}" if self.kernel_candidate is not None else "the baseline"

    @property
    def ratio(self) -> float:
        """Geometric mean over the shapes of torch's time over the baseline's."""
        return math.exp(sum(math.log(s.ratio) for s in self.shapes) / len(self.shapes))

    @property
    def reason(self) -> str:
        name = self.torch_label.split(":", 1)[-1]
        n = len(self.shapes)
        clocks = sorted({s.clock for s in self.shapes})
        if n == 1:
            s = self.shapes[0]
            times = f"{name} {s.torch_ms:.4f} ms, {self.triton_side} {s.baseline_ms:.4f} ms on {s.shape}"
        else:
            times = f"geometric mean over {n} shapes of {name}'s time over {self.triton_side}'s {self.ratio:.3f}"
        bench = max(s.benchmarks for s in self.shapes)
        winner = f"torch ({name})" if self.impl == serving.TORCH else self.triton_side
        return (
            f"{winner} is faster: {times} ({'/'.join(clocks)} times, median of up to {bench} "
            f"benchmark{'s' if bench != 1 else ''} side by side)"
        )

    def measured(self) -> dict:
        """The figures as the manifest records them."""
        return {
            "torch_label": self.torch_label,
            "against": self.triton_side,
            "torch_over_it": round(self.ratio, 4),
            "shapes": {
                s.shape: {
                    "its_ms": round(s.baseline_ms, 5),
                    "torch_ms": round(s.torch_ms, 5),
                    "clock": s.clock,
                    "benchmarks": s.benchmarks,
                }
                for s in self.shapes
            },
        }


def choices_from_rows(rows: Iterable[BenchResult], promoted: Optional[Dict[tuple, int]] = None) -> List[Choice]:
    """The choice for every (op, bucket, dtype, GPU) whose rows hold its Triton side and a servable torch
    anchor timed side by side (same run, same candidate or none, same shape). `promoted`: (op, bucket,
    dtype, GPU slug) -> the candidate id of the kernel promoted there; its Triton side is that kernel (its
    rows labelled 'candidate'), elsewhere the baseline (rows labelled 'baseline': a benchmark records the
    incumbent so when no kernel was promoted)."""
    promoted = promoted or {}
    sessions: Dict[tuple, Dict[str, BenchResult]] = defaultdict(dict)
    for r in rows:
        if r.implausible:
            continue
        op = get_op(r.op)
        kernel = promoted.get((r.op, r.bucket, r.dtype, serving.gpu_slug(r.gpu_name or "")))
        if (
            kernel is None
            and r.label == "baseline"
            or kernel is not None
            and r.label == "candidate"
            and r.candidate_id == kernel
        ):
            role = "triton"
        elif op.torch_label and r.label == op.torch_label:
            role = "torch"
        else:
            continue
        key = (r.op, r.bucket, r.dtype, r.gpu_name, r.shape_key, r.run_id, r.candidate_id)
        prev = sessions[key].get(role)
        if prev is None or r.id > prev.id:  # a benchmark records each contender once per shape
            sessions[key][role] = r
    per_shape: Dict[tuple, Dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for key, pair in sessions.items():
        if "triton" not in pair or "torch" not in pair:
            continue
        b, t = pair["triton"], pair["torch"]
        clock = row_clock([b, t])
        s = per_shape[key[:5]]
        s["baseline"].append(row_ms(b, clock))
        s["torch"].append(row_ms(t, clock))
        s["clock"].append(clock)
    by_bucket: Dict[tuple, List[ShapeTimes]] = defaultdict(list)
    for (op, bucket, dtype, gpu, shape), s in sorted(per_shape.items()):
        clocks = set(s["clock"])
        by_bucket[(op, bucket, dtype, gpu)].append(
            ShapeTimes(
                shape,
                statistics.median(s["baseline"]),
                statistics.median(s["torch"]),
                clocks.pop() if len(clocks) == 1 else "mixed",
                len(s["baseline"]),
            )
        )
    out = []
    for (op, bucket, dtype, gpu), shapes in sorted(by_bucket.items()):
        kernel = promoted.get((op, bucket, dtype, serving.gpu_slug(gpu or "")))
        c = Choice(op, bucket, dtype, gpu, serving.BASELINE, get_op(op).torch_label, tuple(shapes), kernel)
        triton = serving.KERNEL if kernel is not None else serving.BASELINE
        out.append(dataclasses.replace(c, impl=serving.TORCH if c.ratio < 1.0 else triton))
    return out


def promoted_kernels(dir=None) -> Dict[tuple, int]:
    """(op, bucket, dtype, GPU slug) -> candidate id of each promoted kernel in the serving set."""
    return {e.key(): e.candidate_id for e in serving.load_manifest(dir).kernels() if e.candidate_id is not None}


def measured_choices(
    led: Ledger,
    ops: Optional[Sequence[str]] = None,
    bucket: Optional[str] = None,
    dtype: Optional[str] = None,
    gpu: Optional[str] = None,
    dir=None,
) -> List[Choice]:
    """The choices the ledger's benchmarks support, optionally for some ops, one bucket, dtype or GPU,
    against the promoted kernels of the serving set in `dir`."""
    names = ops if ops is not None else [name for name in NAMES if get_op(name).torch_label]
    rows: List[BenchResult] = []
    for name in names:
        if not get_op(name).torch_label:
            continue
        # the bucket and dtype are selected by the ledger's (op, bucket, dtype) index; the GPU by its slug, here
        rows += [
            r
            for r in led.bench_results(op=name, bucket=bucket, dtype=dtype)
            if gpu is None or serving.gpu_slug(r.gpu_name or "") == serving.gpu_slug(gpu)
        ]
    return choices_from_rows(rows, promoted_kernels(dir))


def record_choices(
    choices: Iterable[Choice], dir=None, led: Optional[Ledger] = None
) -> List[Tuple[Choice, Optional[serving.ManifestEntry]]]:
    """Write each choice into the serving manifest: the entry written, or None where nothing changed (a
    promoted kernel that is still the faster keeps its entry). A promoted kernel that torch beats is
    demoted, in the ledger too when `led` is given."""
    out: List[Tuple[Choice, Optional[serving.ManifestEntry]]] = []
    for c in choices:
        if c.impl == serving.KERNEL:
            out.append((c, None))
            continue
        entry = serving.set_choice(
            c.op, c.bucket, c.dtype, c.gpu, c.impl, c.reason, c.measured(), dir=dir, replace_kernel=c.kernel_candidate
        )
        if entry is not None and c.kernel_candidate is not None and led is not None:
            promo = next(
                (
                    p
                    for p in led.promotions(op=c.op, active_only=True)
                    if p.bucket == c.bucket
                    and p.dtype == c.dtype
                    and p.candidate_id == c.kernel_candidate
                    and serving.gpu_slug(p.gpu_name) == serving.gpu_slug(c.gpu)
                ),
                None,
            )
            if promo is not None:
                led.demote(promo.id, f"torch serves the bucket: {c.reason}")
        out.append((c, entry))
    return out


__all__ = ["Choice", "ShapeTimes", "choices_from_rows", "promoted_kernels", "measured_choices", "record_choices"]

"""What the built-in search does not send to the GPU, and why.

Two screens, both on the CPU, both recorded in the ledger (`pruned_proposal`) with their reason so that no
later run proposes the same source again and a run's summary counts them:

- compile time (harness/bench/compile_probe.py, sm_90 compiled in a sandbox): a proposal whose main kernel
  spills registers where the incumbent's does not (or spills more), needs more shared memory than an H200
  program may use, does not compile for sm_90 for want of resources, or leaves SMs idle (fewer programs
  than SMs) at a shape where the incumbent fills them;
- measured history: a log-additive model of speed over the configuration's fields, fitted to the
  ledger's benchmarks of earlier variants of this bucket (speed = incumbent time / candidate time, one
  effect per field value away from the incumbent's, ridge-regularised least squares). A proposal whose
  every changed field value was measured before and whose predicted speed is below PREDICTED_FLOOR is
  not benchmarked: the GPU time goes to proposals that can win.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..harness.bench.compile_probe import INCUMBENT_TIMEOUT_S, CompileProfile, profile_source
from ..harness.bench.diagnosis import SHARED_PER_PROGRAM, SM_COUNT
from ..sanitizer.canonical import as_written
from .proposal import Proposal, ProposeContext

if TYPE_CHECKING:
    from ..harness.ledger.ledger import Ledger

PREDICTED_FLOOR = 0.8
# a proposal's compile, whose incumbent's took seconds: matmul 128x256 tiles on 2 warps ground 200 s in ptxas
COMPILE_TIMEOUT_S = 120.0
SLOW_COMPILE = 4.0  # a proposal whose compile outlasts the incumbent's this many times over is not sent on
_RIDGE = 0.1
_CFG = re.compile(r"(?:^|\+)cfg-([0-9-]+)$")


def label_config(label: Optional[str], n_fields: int) -> Optional[tuple]:
    """The configuration a search label names (`cfg-...`, or a rewrite composed with one), else None."""
    m = _CFG.search(label or "")
    if not m:
        return None
    values = tuple(int(v) for v in m.group(1).split("-") if v)
    return values if len(values) == n_fields else None


def fit_speed_model(measured: Sequence[Tuple[tuple, float]], base: tuple) -> Callable[[tuple], Optional[float]]:
    """A predictor of speed for a configuration, from (configuration, measured speed) pairs: log speed is
    a sum of one effect per (field, value) that differs from `base`. It answers None for a configuration
    with a changed field value no measurement had (no evidence, no prediction)."""
    features = sorted({(i, v) for cfg, _ in measured for i, v in enumerate(cfg) if v != base[i]})
    index = {f: j for j, f in enumerate(features)}

    def row(cfg: tuple) -> Optional[np.ndarray]:
        x = np.zeros(len(features))
        for i, v in enumerate(cfg):
            if v != base[i]:
                if (i, v) not in index:
                    return None
                x[index[(i, v)]] = 1.0
        return x

    if not features:
        return lambda cfg: 1.0 if tuple(cfg) == tuple(base) else None
    xs = np.array([row(c) for c, _ in measured])
    ys = np.array([math.log(s) for _, s in measured])
    w = np.linalg.solve(xs.T @ xs + _RIDGE * np.eye(len(features)), xs.T @ ys)

    def predict(cfg: tuple) -> Optional[float]:
        x = row(tuple(cfg))
        return None if x is None else float(math.exp(x @ w))

    return predict


def compile_objection(candidate: CompileProfile, incumbent: CompileProfile) -> str:
    """Why the compiled candidate would run badly on an H200, against the incumbent compiled alike; ''."""
    if candidate.error:
        if "OutOfResources" in candidate.error or "out of resource" in candidate.error.lower():
            return f"does not fit an H200 program: {candidate.error}"
        # ptxas grinds for minutes on a kernel that spills heavily; a loaded machine slows every compile alike
        if "timed out" in candidate.error and 0 < incumbent.wall_s * SLOW_COMPILE < COMPILE_TIMEOUT_S:
            return (
                f"its sm_90 compile did not finish within {COMPILE_TIMEOUT_S:.0f} s on the CPU, where the "
                f"incumbent's took {incumbent.wall_s:.0f} s"
            )
        return ""  # a compile failure of another kind is the sanitizer's to report, with its reproduction
    inc = {(x.shape, x.kernel): x for x in incumbent.launches}
    for x in candidate.launches:
        before = inc.get((x.shape, x.kernel))
        if x.shared_bytes > SHARED_PER_PROGRAM:
            return (
                f"{x.kernel} needs {x.shared_bytes} bytes of shared memory at {x.shape}, over the {SHARED_PER_PROGRAM} "
                f"an H200 program may use"
            )
        if before is None:
            continue
        if (x.spill_bytes or 0) > (before.spill_bytes or 0):
            return (
                f"{x.kernel} spills {x.spill_bytes} bytes per thread at {x.shape} ({x.registers} registers; "
                f"the incumbent spills {before.spill_bytes or 0})"
            )
        if x.programs < SM_COUNT <= before.programs:
            return (
                f"{x.kernel} runs {x.programs} programs for {SM_COUNT} SMs at {x.shape}, where the incumbent "
                f"fills them with {before.programs}"
            )
    return ""


@dataclass
class Screen:
    """The screens for one run, over its ledger. `profile` compiles a source (tests pass a fake)."""

    ledger: Ledger
    run_id: Optional[str]
    profile: Optional[Callable[..., CompileProfile]] = profile_source  # None: no compile screen
    _incumbents: Dict[Tuple[str, str, str], CompileProfile] = field(default_factory=dict)

    def seen_before(self, ctx: ProposeContext) -> set:
        """Hashes of the sources pruned for this bucket by any run."""
        return {r.source_hash for r in self.ledger.pruned(op=ctx.op, bucket=ctx.bucket, dtype=ctx.dtype)}

    def _profile(self, ctx: ProposeContext, source: str, timeout_s: float) -> CompileProfile:
        return self.profile(source, ctx.op, [s.key() for s in ctx.shapes], ctx.dtype, timeout_s)  # type: ignore[misc]

    def compile_reason(self, ctx: ProposeContext, source: str) -> str:
        if self.profile is None:
            return ""
        key = (ctx.op, ctx.bucket, as_written(ctx.incumbent_source).hash)
        if key not in self._incumbents:
            self._incumbents[key] = self._profile(ctx, ctx.incumbent_source, INCUMBENT_TIMEOUT_S)
        return compile_objection(self._profile(ctx, source, COMPILE_TIMEOUT_S), self._incumbents[key])

    def measured(self, ctx: ProposeContext, n_fields: int) -> List[Tuple[tuple, float]]:
        """(configuration, speed against the incumbent it was timed beside) of each benchmarked variant."""
        ratios: Dict[int, List[float]] = {}
        by_run: Dict[Tuple[Optional[str], int, str], Dict[str, float]] = {}
        for r in self.ledger.bench_results(op=ctx.op, bucket=ctx.bucket, dtype=ctx.dtype):
            if r.candidate_id is not None and not r.implausible and r.median_ms > 0:
                role = (
                    "candidate"
                    if r.label == "candidate"
                    else "incumbent"
                    if r.label == "baseline" or r.label.startswith("serving:")
                    else None
                )
                if role:
                    by_run.setdefault((r.run_id, r.candidate_id, r.shape_key), {})[role] = r.median_ms
        for (_, cid, _), t in by_run.items():
            if "candidate" in t and "incumbent" in t:
                ratios.setdefault(cid, []).append(t["incumbent"] / t["candidate"])
        out = []
        for cid, rs in ratios.items():
            c = self.ledger.candidate(cid)
            cfg = label_config(c.label if c else None, n_fields)
            if cfg is not None:
                out.append((cfg, math.exp(sum(math.log(x) for x in rs) / len(rs))))
        return out

    def speed_model(self, ctx: ProposeContext, base: tuple) -> Callable[[tuple], Optional[float]]:
        """The fitted predictor for this bucket (None for every configuration when nothing was measured)."""
        measured = self.measured(ctx, len(base))
        return fit_speed_model(measured, base) if measured else (lambda cfg: None)

    def record(self, ctx: ProposeContext, proposal: Proposal, reason: str) -> None:
        self.ledger.record_pruned(
            self.run_id, ctx.op, ctx.bucket, ctx.dtype, proposal.label, as_written(proposal.source).hash, reason
        )

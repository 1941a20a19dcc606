"""The built-in proposer: a search over launch configurations plus safe source rewrites.

It needs no network, so `kernel-agent run` works out of the box. Every baseline keeps
its launch configuration in one host function, `_config(...)`, returning a tuple; the
op says which tuples there are (Op.tuning_space) and how its baseline calls `_config`
(Op.config_args). A variant is the incumbent (the serving kernel of the bucket when one
is promoted and it keeps a `_config`, otherwise the baseline) with that function renamed
and a new `_config` that returns a different tuple wherever the old one would return the
tuple the target shapes use: the kernels are untouched, so a variant is as correct as its
parent (and the sanitizer still checks it). The search is a hill climb: start from the
incumbent's tuple, propose untried neighbours (one field changed, within what the
hardware can hold; after them, a block shape one step past the grid where the tuple sits at its edge), and move
to the best measured one. When a variant is promoted it
becomes the incumbent and the climb continues from it.

Beside configurations it proposes the rewrites of the catalog (agent/rewrites.py) whose precondition holds
for the incumbent, the structural moves that suit the bucket's shapes first, then those that help what bounds it
(ProposeContext.diagnosis), alternating with the
configurations; a rewrite measured faster than the climb's best is kept, and the configurations proposed
after it are composed with it (and a better configuration with the rewrites). With a `Screen`
(agent/screen.py), proposals whose compiled kernel cannot run well on an H200, or that a model fitted to
the ledger's timings predicts far slower, are recorded as pruned instead of proposed.
"""

from __future__ import annotations

import importlib
import itertools
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..ops import get_op
from ..ops.common import Shape
from ..ops.tuning import Space
from ..sanitizer.canonical import as_written
from ..sanitizer.config_reader import ConfigUnreadable, read_config
from ..sanitizer.config_variant import baseline_source, has_config, with_config  # noqa: F401 (re-exported)
from .proposal import Proposal, ProposeContext, Proposer
from .rewrites import CATALOG, NotApplicable, RewriteTarget, applicable, apply_rewrite, move_suits, target_for
from .screen import PREDICTED_FLOOR, Screen


def baseline_config(op_name: str, shape) -> tuple:
    mod = importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return tuple(mod._config(*get_op(op_name).config_args(shape, device)))


def source_config(op_name: str, source: str, shape) -> tuple:
    """What a kernel source's `_config` returns for a shape, read from its syntax tree: a promoted kernel
    was written by a model, and this process holds the model's key, so its text is never imported here
    (sanitizer/config_reader.py). ConfigUnreadable when `_config` does what the reader does not evaluate."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return read_config(source, tuple(get_op(op_name).config_args(shape, device)))


def with_evict_first(source: str, names: Sequence[str] = ("k", "v", "x")) -> str:
    """The catalog's evict-first rewrite on the loads assigned to `names` (NotApplicable, a ValueError,
    where there are none)."""
    return apply_rewrite("evict-first", source, RewriteTarget(streaming=True, streamed_names=tuple(names)))


def one_field_neighbours(space: Space, cfg: tuple, shapes: Sequence[Shape]) -> List[tuple]:
    """The configurations one field away from `cfg` that the hardware can hold at every shape."""
    out = []
    for i, values in enumerate(space.values):
        for v in values:
            c = cfg[:i] + (v,) + cfg[i + 1 :]
            if v != cfg[i] and all(space.valid(c, s) for s in shapes):
                out.append(c)
    return out


def past_grid_neighbours(space: Space, cfg: tuple, shapes: Sequence[Shape]) -> List[tuple]:
    """Block shapes one step past the configuration grid: where a BLOCK_* field of `cfg` (a field of powers of
    two) sits at the grid's largest or smallest value, twice or half that (16 at least, what a tensor-core dot
    takes), where the hardware can hold it at every shape. From a best configuration past the grid, the next step."""
    out = []
    for i, (name, values) in enumerate(zip(space.fields, space.values)):
        if not name.startswith("BLOCK_") or not all(v > 0 and v & (v - 1) == 0 for v in values):
            continue
        for past in (2 * cfg[i],) * (cfg[i] >= max(values)) + (cfg[i] // 2,) * (cfg[i] <= min(values)):
            c = cfg[:i] + (past,) + cfg[i + 1 :]
            if past >= 16 and all(space.valid(c, s) for s in shapes):
                out.append(c)
    return out


@dataclass
class _OpState:
    bucket: str
    shapes: List[Shape]
    source: str  # what variants are made from: the incumbent (or the baseline)
    base_cfg: tuple
    best_cfg: tuple
    best_ms: Optional[float] = None
    tried: set = field(default_factory=set)
    rewrites_tried: set = field(default_factory=set)  # rewrite names proposed on this climb
    best_rewrites: Tuple[str, ...] = ()  # the rewrites of the best measured proposal, composed with what follows
    pending: Dict[str, Tuple[tuple, Tuple[str, ...]]] = field(default_factory=dict)  # label -> (cfg, rewrites)
    # the incumbent this climb is for: `source`, unless that could not be tuned and the baseline stood in
    made_for: Optional[str] = None


class SearchProposer(Proposer):
    """Hill climbing over each op's launch-configuration space, one bucket at a time."""

    name = "search"

    def __init__(self, seed: int = 0, screen: Optional[Screen] = None):
        self.rng = random.Random(seed)
        self.state: Dict[Tuple[str, str], _OpState] = {}
        self.screen = screen

    def _state(self, ctx: ProposeContext) -> _OpState:
        """The climb for (op, bucket), from the current incumbent. A new incumbent (a promotion)
        restarts the climb from it, keeping what was tried and its measured time."""
        key = (ctx.op, ctx.bucket)
        st = self.state.get(key)
        base_src = baseline_source(ctx.op)
        incumbent = ctx.incumbent_source if has_config(ctx.incumbent_source or "") else base_src
        if st is not None and st.made_for == incumbent:
            return st
        source, cfgs = incumbent, None
        if source != base_src:
            try:
                cfgs = {source_config(ctx.op, source, s) for s in ctx.shapes}
            except (TypeError, ConfigUnreadable):  # its `_config` takes other arguments than the op passes now
                source = base_src  # (an older kernel), or does what the reader does not evaluate: the climb
                # starts from the baseline, as a variant of this source could not be placed
        if cfgs is None:
            cfgs = {baseline_config(ctx.op, s) for s in ctx.shapes}
        base = sorted(cfgs)[0]
        new = _OpState(ctx.bucket, list(ctx.shapes), source, base, base, tried={base}, made_for=incumbent)
        if st is not None:  # the incumbent changed under the climb
            new.tried |= st.tried
            new.rewrites_tried = st.rewrites_tried
            new.best_ms = ctx.incumbent_ms
            new.pending = st.pending
        self.state[key] = new
        return new

    def _neighbours(self, space: Space, st: _OpState) -> List[tuple]:
        out = [c for c in one_field_neighbours(space, st.best_cfg, st.shapes) if c not in st.tried]
        # two fields at once, when single steps are exhausted
        if not out:
            for (i, vi), (j, vj) in itertools.combinations(
                [(i, v) for i, vals in enumerate(space.values) for v in vals], 2
            ):
                if i >= j:
                    continue
                fields = list(st.best_cfg)
                fields[i], fields[j] = vi, vj
                c = tuple(fields)
                if c not in st.tried and all(space.valid(c, s) for s in st.shapes):
                    out.append(c)
        self.rng.shuffle(out)
        # block shapes past the grid come after the grid's own neighbours: nothing measured predicts them
        return out + [c for c in past_grid_neighbours(space, st.best_cfg, st.shapes) if c not in st.tried]

    def _rewrite_order(self, ctx: ProposeContext, st: _OpState) -> List[str]:
        """Untried catalog rewrites in the order to try them: first the structural moves whose bucket test holds
        at the bucket's shapes (a decode whose capped splits leave SMs idle, a matmul of decode-sized M), then
        those that help the diagnosed bound, catalog order otherwise."""
        bound = ctx.diagnosis.bound if ctx.diagnosis is not None else None
        names = [
            n
            for n in applicable(st.source, target_for(ctx.op))
            if n not in st.rewrites_tried and n not in st.best_rewrites
        ]
        return sorted(names, key=lambda n: (not move_suits(n, ctx.shapes), bound not in CATALOG[n].helps))

    def _make(
        self, ctx: ProposeContext, st: _OpState, space: Space, cfg: tuple, rewrites: Tuple[str, ...]
    ) -> Optional[Proposal]:
        """The incumbent with configuration `cfg` and `rewrites` applied, or None where one does not apply."""
        src = st.source if cfg == st.base_cfg else with_config(st.source, st.base_cfg, cfg, ctx.bucket, space)
        try:
            for name in rewrites:
                src = apply_rewrite(name, src, target_for(ctx.op))
        except NotApplicable:
            return None
        parts = list(rewrites) + ([] if cfg == st.base_cfg else ["cfg-" + "-".join(str(v) for v in cfg)])
        note = ", ".join(
            [CATALOG[r].summary for r in rewrites]
            + ([", ".join(f"{f}={v}" for f, v in zip(space.fields, cfg))] if cfg != st.base_cfg else [])
        )
        return Proposal(ctx.op, src, "+".join(parts), "search", note=note)

    def _candidates(self, ctx: ProposeContext, st: _OpState, space: Space):
        """Proposals in the order to try: a rewrite (on the best configuration), then a configuration (with
        the best rewrites), alternating, each ordered as `_rewrite_order` and the speed model say."""
        predict = self.screen.speed_model(ctx, st.base_cfg) if self.screen else (lambda cfg: None)
        rewrites = self._rewrite_order(ctx, st)
        configs = sorted(self._neighbours(space, st), key=lambda c: -(predict(c) or 1.0))  # stable: shuffled ties
        # a move that rewrites `_config` replaces the tuned configuration (an override of the old policy would
        # never fire, and the sanitizer refuses an override the checks never select), and configurations compose
        # with the kernel rewrites only
        kernel_rewrites = tuple(r for r in st.best_rewrites if not CATALOG[r].edits_config)
        for i in range(max(len(rewrites), len(configs))):
            if i < len(rewrites):
                st.rewrites_tried.add(rewrites[i])
                cfg = st.base_cfg if CATALOG[rewrites[i]].edits_config else st.best_cfg
                yield self._make(ctx, st, space, cfg, st.best_rewrites + (rewrites[i],)), cfg, None
            if i < len(configs):
                st.tried.add(configs[i])
                yield self._make(ctx, st, space, configs[i], kernel_rewrites), configs[i], predict(configs[i])

    def _pruned(self, ctx: ProposeContext, p: Proposal, predicted: Optional[float], seen: set) -> bool:
        """Whether the screen keeps `p` off the GPU (recorded in the ledger with the reason)."""
        if self.screen is None:
            return False
        if as_written(p.source).hash in seen:
            return True  # pruned by an earlier run: its reason is in the ledger already
        reason = ""
        if predicted is not None and predicted < PREDICTED_FLOOR:
            reason = f"predicted {predicted:.2f}x of the incumbent by the model fitted to this bucket's timings"
        else:
            reason = self.screen.compile_reason(ctx, p.source)
        if reason:
            self.screen.record(ctx, p, reason)
        return bool(reason)

    def propose(self, ctx: ProposeContext, n: int) -> List[Proposal]:
        op = get_op(ctx.op)
        space = op.tuning_space
        if space is None:  # nothing to tune, and no `_config` the climb could start from
            return []
        st = self._state(ctx)
        seen = self.screen.seen_before(ctx) if self.screen else set()
        props: List[Proposal] = []
        candidates = self._candidates(ctx, st, space)
        while len(props) < n:  # (a candidate drawn is marked tried: draw only as many as are wanted)
            drawn = next(candidates, None)
            if drawn is None:
                break
            p, cfg, predicted = drawn
            if p is None or self._pruned(ctx, p, predicted, seen):
                continue
            st.pending[p.label] = (cfg, tuple(x for x in p.label.split("+") if x in CATALOG))
            props.append(p)
        return props

    def feedback(self, ctx: ProposeContext, proposal: Proposal, passed: bool, median_ms: Optional[float]) -> None:
        st = self.state.get((ctx.op, ctx.bucket))  # the climb as it is now (a promotion may have moved it)
        if st is None:
            return
        made = st.pending.pop(proposal.label, None)
        if made is None or not passed or median_ms is None:
            return
        if st.best_ms is None or median_ms < st.best_ms:
            st.best_ms, (st.best_cfg, st.best_rewrites) = median_ms, made

    def set_incumbent_time(self, ctx: ProposeContext, median_ms: float) -> None:
        st = self.state.get((ctx.op, ctx.bucket))
        if st is not None and st.best_ms is None:
            st.best_ms = median_ms

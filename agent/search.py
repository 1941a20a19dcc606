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
hardware can hold), and move to the best measured one. When a variant is promoted it
becomes the incumbent and the climb continues from it. Ops that stream their inputs
(Op.streaming) also get one source rewrite: an evict-first cache hint on those loads.
"""
from __future__ import annotations

import ast
import importlib
import itertools
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..harness.config_reader import ConfigUnreadable, read_config
from ..harness.config_variant import baseline_source, has_config, with_config  # noqa: F401 (re-exported)
from ..harness.ops import get_op
from ..harness.ops.common import Shape
from ..harness.ops.tuning import Space
from .proposal import Proposal, ProposeContext, Proposer


def baseline_config(op_name: str, shape) -> tuple:
    mod = importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return tuple(mod._config(*get_op(op_name).config_args(shape, device)))


def source_config(op_name: str, source: str, shape) -> tuple:
    """What a kernel source's `_config` returns for a shape, read from its syntax tree: a promoted kernel
    was written by a model, and this process holds the model's key, so its text is never imported here
    (harness/config_reader.py). ConfigUnreadable when `_config` does what the reader does not evaluate."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return read_config(source, tuple(get_op(op_name).config_args(shape, device)))


def with_evict_first(source: str, names: Sequence[str] = ("k", "v", "x")) -> str:
    """Add eviction_policy="evict_first" to the tl.load calls whose result is assigned to `names`:
    data read exactly once should not push reusable lines out of L2. A hint only: same results."""
    tree = ast.parse(source)
    edits: List[Tuple[int, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in names:
            call = node.value
            while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "to":
                call = call.func.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "load" \
                    and not any(k.arg == "eviction_policy" for k in call.keywords):
                edits.append((call.end_lineno, call.end_col_offset))
    if not edits:
        raise ValueError("no streaming loads to annotate")
    lines = source.splitlines(keepends=True)
    for lineno, col in sorted(edits, reverse=True):
        ln = lines[lineno - 1]
        lines[lineno - 1] = ln[: col - 1] + ', eviction_policy="evict_first")' + ln[col:]
    out = "".join(lines)
    ast.parse(out)
    return out


def one_field_neighbours(space: Space, cfg: tuple, shapes: Sequence[Shape]) -> List[tuple]:
    """The configurations one field away from `cfg` that the hardware can hold at every shape."""
    out = []
    for i, values in enumerate(space.values):
        for v in values:
            c = cfg[:i] + (v,) + cfg[i + 1:]
            if v != cfg[i] and all(space.valid(c, s) for s in shapes):
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
    evict_tried: bool = False
    pending: Dict[str, tuple] = field(default_factory=dict)  # label -> cfg
    # the incumbent this climb is for: `source`, unless that could not be tuned and the baseline stood in
    made_for: Optional[str] = None


class SearchProposer(Proposer):
    """Hill climbing over each op's launch-configuration space, one bucket at a time."""

    name = "search"

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)
        self.state: Dict[Tuple[str, str], _OpState] = {}

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
            new.evict_tried = st.evict_tried
            new.best_ms = ctx.incumbent_ms
            new.pending = st.pending
        self.state[key] = new
        return new

    def _neighbours(self, space: Space, st: _OpState) -> List[tuple]:
        out = [c for c in one_field_neighbours(space, st.best_cfg, st.shapes) if c not in st.tried]
        # two fields at once, when single steps are exhausted
        if not out:
            for (i, vi), (j, vj) in itertools.combinations(
                    [(i, v) for i, vals in enumerate(space.values) for v in vals], 2):
                if i >= j:
                    continue
                c = list(st.best_cfg)
                c[i], c[j] = vi, vj
                c = tuple(c)
                if c not in st.tried and all(space.valid(c, s) for s in st.shapes):
                    out.append(c)
        self.rng.shuffle(out)
        return out

    def propose(self, ctx: ProposeContext, n: int) -> List[Proposal]:
        op = get_op(ctx.op)
        space = op.tuning_space
        if space is None:  # nothing to tune, and no `_config` the climb could start from
            return []
        st = self._state(ctx)
        src = st.source
        props: List[Proposal] = []
        if op.streaming and not st.evict_tried:
            st.evict_tried = True
            try:
                props.append(Proposal(ctx.op, with_evict_first(src), "evict-first", "search",
                                      note="evict_first cache hint on the streaming loads"))
            except ValueError:
                pass
        for cfg in self._neighbours(space, st):
            if len(props) >= n:
                break
            st.tried.add(cfg)
            label = "cfg-" + "-".join(str(v) for v in cfg)
            source = with_config(src, st.base_cfg, cfg, ctx.bucket, space)
            st.pending[label] = cfg
            props.append(Proposal(ctx.op, source, label, "search",
                                  note=", ".join(f"{f}={v}" for f, v in zip(space.fields, cfg))))
        return props[:n]

    def feedback(self, ctx: ProposeContext, proposal: Proposal, passed: bool, median_ms: Optional[float]) -> None:
        st = self.state.get((ctx.op, ctx.bucket))  # the climb as it is now (a promotion may have moved it)
        if st is None:
            return
        cfg = st.pending.pop(proposal.label, None)
        if cfg is None or not passed or median_ms is None:
            return
        if st.best_ms is None or median_ms < st.best_ms:
            st.best_ms, st.best_cfg = median_ms, cfg

    def set_incumbent_time(self, ctx: ProposeContext, median_ms: float) -> None:
        st = self.state.get((ctx.op, ctx.bucket))
        if st is not None and st.best_ms is None:
            st.best_ms = median_ms

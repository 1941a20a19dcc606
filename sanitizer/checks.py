"""The CPU checks of the sanitizer (docs/SANITIZER.md lists them), run on one candidate inside the Triton interpreter.

`sanitize_file(path, op_name, mode)` runs them in order, cheap first, and returns a
Verdict. It executes the candidate's code: call it only inside an isolated worker
(sanitizer/runner.py), which adds the process boundary and the time limit.

Every failure says how to reproduce it: op, shape, dtype, seed, distribution and
layout of the case, the first bad index, observed against expected.
"""

from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import hypothesis
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from ..ops import get_op
from ..ops.common import DTYPE_NAMES, LAYOUTS, SM_SCALE_RANGE, Case, Op, Region, round_to, sm_scale_strategy
from . import host_probe, static_gate, wire
from .branches import DEVICE_ONLY, Side, config_overrides, configs_launched, host_branches, taken, uncovered
from .canonical import JudgedText, TextRefused, judge_text
from .compared import TooManyCompared, compared_joints, compared_scales, compared_values
from .execution import CheckFailed, RunResult, TimedOut, baseline_fn, describe_exception, execute_call
from .executor import Executor, ExecutorError
from .kernel_branches import indicator_sides, kernel_taken
from .verdict import CheckOutcome, CheckStatus, SanitizerMode, Verdict


def cases_n(n: int) -> str:
    """'1 case', '3 cases'."""
    return f"{n} case{'' if n == 1 else 's'}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How much of each check a mode runs (built by keyword: eleven numbers in a row cannot be told apart)."""

    bounds_layouts: Tuple[str, ...]
    bounds_shapes: int  # first n tiny shapes (all of them when larger)
    coverage_shapes: int
    order_shapes: int
    orders: Tuple[str, ...]
    sensitivity_positions: int
    differential_examples: int
    budget_cases: int
    near_serving_shapes: int
    fpsan_cases: int
    extended_examples: int
    fail_fast: bool = True
    branch_search_s: float = 30.0  # what host_branches may spend drawing inputs to take a side never taken
    compared_regions: int = 1 << 30  # the first n (most telling first) cases of compared_values


# Quick mode still runs every near-serving shape: each gates a different dimension (long K, large M, ...).
# Bounds run every layout: a slice of a fused tensor ("fused": unit last stride, rows further apart than
# the last dim) is where a kernel that takes unit stride to mean packed rows reads its neighbours.
# Quick mode draws the first cases of compared_values only (the sizes the comparisons name exactly, first);
# full mode, which a promotion needs, draws them all.
QUICK = Settings(
    bounds_layouts=LAYOUTS,
    bounds_shapes=3,
    coverage_shapes=1,
    order_shapes=1,
    orders=("reverse",),
    sensitivity_positions=1,
    differential_examples=6,
    budget_cases=2,
    near_serving_shapes=99,
    fpsan_cases=1,
    extended_examples=12,
    branch_search_s=10.0,
    compared_regions=32,
)
FULL = Settings(
    bounds_layouts=LAYOUTS,
    bounds_shapes=99,
    coverage_shapes=3,
    order_shapes=3,
    orders=("reverse", "shuffle"),
    sensitivity_positions=3,
    differential_examples=50,
    budget_cases=4,
    near_serving_shapes=99,
    fpsan_cases=3,
    extended_examples=80,
)
MODES = {SanitizerMode.QUICK: QUICK, SanitizerMode.FULL: FULL}


def run_case(
    subject: "Subject",
    fn: Any,
    case: Case,
    *,
    bounds: bool = True,
    order: str = "natural",
    seed: int = 0,
    fpsan: bool = False,
    sentinel: int = 0,
    keep: bool = False,
    keep_inputs: bool = False,
    again: bool = False,
) -> RunResult:
    """Call fn (the candidate's executor, or the trusted baseline in this process) on the case's inputs,
    instrumented; the judge reads the evidence: outputs, bounds and host-code violations, launches, and
    whether an input changed."""
    op = subject.op
    readable = op.readable(case.args) if bounds else {}
    if isinstance(fn, Executor):
        try:
            res = fn.call(
                case,
                bounds=bounds,
                order=order,
                seed=seed,
                fpsan=fpsan,
                sentinel=sentinel,
                readable=readable,
                keep=keep,
                keep_inputs=keep_inputs,
                again=again,
            )
        except ExecutorError as e:
            if e.timed_out:
                raise TimedOut(str(e))
            raise CheckFailed(f"{e}; reproduce: {case.describe()}")
    else:
        res = execute_call(
            fn, case.args, readable, subject.path, bounds=bounds, order=order, seed=seed, fpsan=fpsan, sentinel=sentinel
        )
    if res.ok and not res.fpsan_unsupported and res.launches == 0 and not _all_empty(res.out):
        res.error = "no Triton kernel was launched: the result must be computed by the file's own kernels"
    return res


def _all_empty(out) -> bool:
    """Every output is a tensor with no elements: an empty input needs no launch."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return bool(outs) and all(isinstance(t, torch.Tensor) and t.numel() == 0 for t in outs)


def outputs(out) -> Tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor, for bitwise comparison (NaN == NaN when the bits agree)."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().contiguous().view(ints[t.element_size()]) if t.dtype != torch.bool else t.to(torch.int8)


def first_difference(a, b) -> Optional[Tuple[int, Tuple[int, ...], Any, Any]]:
    """(output number, index, value in a, value in b) of the first bitwise difference."""
    for i, (x, y) in enumerate(zip(outputs(a), outputs(b))):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape:
            return i, (), type(x).__name__, type(y).__name__
        diff = bits(x) != bits(y)
        if bool(diff.any()):
            idx = tuple(int(j) for j in diff.nonzero()[0].tolist())
            return i, idx, _scalar(x[idx]), _scalar(y[idx])
    return None


def _scalar(v: torch.Tensor):
    x = v.item()
    if isinstance(x, float):
        # the bits too: two values that print alike can differ in the last place
        return f"{x:.9g} ({hex(int(bits(v.reshape(1))[0]) & ((1 << (8 * v.element_size())) - 1))})"
    return x


# -- the seed streams ---------------------------------------------------------------------


class SeedStream(Enum):
    """Where each check draws its inputs: every case's seed is the run's secret seed base plus a stream's base
    plus the number of the draw in that stream (Subject.seed). A stream is (generator, base, count): the
    generator its seeds feed ("cpu": torch's, for the checks in the interpreter; "cuda": the device's, for the
    GPU stage, so the two never share a sequence; "numpy": the interpreter's shuffled program order), the
    base, and the most draws it takes
    (tests/test_seed_streams.py holds every op within it). Two streams of one generator share seeds when their
    ranges [base, base + count) meet; KNOWN_OVERLAPS lists the pairs that do and the test refuses a new one.
    A base is part of what a verdict reproduces (`--seed N`, the suites' seed base 0): changing one changes
    the inputs of its check."""

    RUNS = ("cpu", 5, 1)
    ORDER_PERMUTATION = ("numpy", 7, 1)  # order_independence's shuffle (the interpreter adds the grid's size)
    HOST_CODE = ("cpu", 21, 2)
    BOUNDS = ("cpu", 31, 10)  # one per tiny shape
    COVERAGE = ("cpu", 41, 10)  # one per tiny shape
    INPUTS_UNCHANGED = ("cpu", 51, 2)
    NO_STATE = ("cpu", 61, 3)
    ORDER = ("cpu", 71, 10)  # one per tiny shape
    SENSITIVITY = ("cpu", 81, 1)  # one case, drawn again for each change, and the positions' generator
    DIFFERENTIAL_PROPERTY = ("cpu", 91, 1)  # the property test's hypothesis seed
    DIFFERENTIAL = ("cpu", 95, 24)  # every distribution (at most 8) in three dtypes
    NEAR_SERVING = ("cpu", 111, 10)  # one per near-serving shape
    FPSAN = ("cpu", 121, 10)
    EXTENDED = ("cpu", 131, 1)  # the extended suite's hypothesis seed
    DOMAIN = ("cpu", 141, 32)  # one per CPU region of the op's domain
    HOST_BRANCHES = ("cpu", 151, 96)  # one per case of the op's branch pool
    COMPARED_VALUES = ("cpu", 161, 512)  # a size in each dimension that admits it, then the sm_scales
    ERROR_BUDGET = ("cpu", 1001, 4)  # 101 until the differential's draws (from 95) were seen to reach it
    GPU_DIFFERENTIAL = ("cuda", 200, 100)
    GPU_DETERMINISM = ("cuda", 300, 1)
    GPU_PROBES = ("cuda", 400, 100)  # native FpSan's and compute-sanitizer's cases: one per tiny shape
    GPU_DOMAIN = ("cuda", 500, 512)  # the domain's GPU regions, then the compared sizes past the interpreter

    def __init__(self, generator: str, base: int, count: int) -> None:
        self.generator = generator
        self.base = base
        self.count = count

    def seeds(self) -> range:
        """The offsets the stream may take, from its base."""
        return range(self.base, self.base + self.count)


# Streams whose seeds meet, kept so that every check's inputs stay the ones the suites were judged on (which
# check first rejects a faulty candidate can depend on them). Two cases drawn with one seed still differ where
# their shapes, dtypes, distributions or views do: the differential's tiny cases and a near-serving shape; a
# domain region, a branch-pool case and a compared size.
KNOWN_OVERLAPS: FrozenSet[FrozenSet[SeedStream]] = frozenset(
    {
        frozenset({SeedStream.DIFFERENTIAL, SeedStream.NEAR_SERVING}),
        frozenset({SeedStream.DOMAIN, SeedStream.HOST_BRANCHES}),
        frozenset({SeedStream.DOMAIN, SeedStream.COMPARED_VALUES}),
        frozenset({SeedStream.HOST_BRANCHES, SeedStream.COMPARED_VALUES}),
    }
)


# -- the subject ------------------------------------------------------------------------


@dataclass
class Subject:
    op: Op
    path: str
    source: bytes  # the file as it is on disk; what runs is its canonical text (sanitizer/canonical.py)
    fn: Any = None  # the candidate: the Executor that check_load starts (a stand-in in some tests)
    baseline: Optional[Callable] = None
    refs: Dict[int, Any] = field(default_factory=dict)
    fpsan_equivalent: Optional[bool] = None
    fpsan_detail: str = ""
    seed_base: int = 0  # drawn in secret per sanitizer run: the candidate cannot know its inputs in advance
    executor: Optional[Executor] = None  # the sandboxed process that holds the candidate
    skip_gate: bool = False  # tests only: proves that the sandbox and the judge hold on their own
    deadline: Optional[float] = None  # epoch seconds: the GPU checks start executors of their own until then
    specs: Dict[str, None] = field(default_factory=dict)  # kernel specialisations the GPU checks launched
    _judged: Optional[JudgedText] = field(default=None, repr=False)

    def judged(self) -> JudgedText:
        """The file's canonical text (what the executor runs) and its hash, made once from `source`;
        TextRefused when the bytes have none."""
        if self._judged is None:
            self._judged = judge_text(self.source)
        return self._judged

    def seed(self, stream: SeedStream, i: int = 0) -> int:
        """The seed of draw `i` of `stream` in this run."""
        return self.seed_base + stream.base + i

    def ref64(self, case: Case):
        key = id(case)
        if key not in self.refs:
            self.refs[key] = (case, self.op.reference(case.args, torch.float64))
        return self.refs[key][1]


# -- case sets --------------------------------------------------------------------------


def tiny_cases(
    op: Op,
    n: int,
    layouts: Sequence[str],
    dtypes=(torch.float32, torch.float16),
    seed: int = 11,
    largest_first: bool = False,
) -> List[Case]:
    cases = []
    shapes = op.shapes("tiny")
    if largest_first:  # most programs per output first (order and coverage bugs need several)
        shapes = sorted(shapes, key=lambda sh: -_volume(sh))
    for i, shape in enumerate(shapes[:n]):
        for j, layout in enumerate(layouts):
            dtype = dtypes[(i + j) % len(dtypes)]
            cases.append(op.make_case(shape, dtype, seed=seed + i, dist="normal", layout=layout))
    return cases


def _compare_or_fail(subject: Subject, case: Case, out, what: str = ""):
    cmp = subject.op.compare(out, case.args, subject.ref64(case))
    if not cmp.ok:
        raise CheckFailed(f"{what}{cmp.describe()}; reproduce: {case.describe()}")
    return cmp


def _run_or_fail(subject: Subject, case: Case, **kw) -> RunResult:
    r = run_case(subject, subject.fn, case, **kw)
    if not r.ok:
        raise CheckFailed(f"{r.problem()}; reproduce: {case.describe()}")
    return r


# -- the checks -------------------------------------------------------------------------


def check_static(subject: Subject, s: Optional[Settings]) -> str:
    if subject.skip_gate:
        raise CheckSkipped("turned off (a test of the layers behind the gate)")
    g = static_gate.check_source(subject.source, subject.op.name)
    if not g.passed:
        raise CheckFailed(g.describe())
    return g.describe()


def check_load(subject: Subject, s: Optional[Settings]) -> str:
    ex = subject.executor
    if ex is None:
        raise CheckFailed("internal: no executor for the candidate")
    try:
        hello = ex.start()
    except ExecutorError as e:
        raise CheckFailed(f"importing the file failed: {e}")
    if hello.get("load_error"):
        raise CheckFailed(f"importing the file failed: {str(hello['load_error'])[:400]}")
    if ex.violations:
        raise CheckFailed(f"importing the file did what a candidate may not: the sandbox refused {ex.violations[0]}")
    try:
        sig = inspect.Signature(
            [
                inspect.Parameter(
                    str(n), inspect._ParameterKind(int(k)), default=None if d else inspect.Parameter.empty
                )
                for n, k, d in hello.get("signature") or []
            ]
        )
    except (TypeError, ValueError) as e:
        raise CheckFailed(f"the file's op function has no usable signature: {e}")
    subject.fn = ex
    op = subject.op
    try:
        sig.bind(*op.arg_names, **{k: None for k in op.optional_args})
        sig.bind(**{k: None for k in op.arg_names})
    except TypeError as e:
        raise CheckFailed(
            f"signature {subject.op.name}{sig} does not accept the contract's arguments "
            f"({', '.join(op.arg_names + op.optional_args)}): {e}"
        )
    for name in op.optional_args:
        p = sig.parameters.get(name)
        if p is None or p.default is inspect.Parameter.empty:
            raise CheckFailed(
                f"`{name}` must be an optional keyword argument (contract: {op.contract.splitlines()[0]})"
            )
    return (
        f"{subject.op.name}{sig}; inputs from seed base {subject.seed_base} (`--seed {subject.seed_base}` "
        f"reproduces them)"
    )


def check_runs(subject: Subject, s: Settings) -> str:
    op = subject.op
    case = op.make_case(op.one_tiny_shape(), torch.float32, seed=subject.seed(SeedStream.RUNS))
    # bounds on from the first call: in the interpreter a wild pointer is dereferenced, not reported
    r = run_case(subject, subject.fn, case)
    if r.bounds:
        raise CheckFailed(f"{r.bounds[0]}; reproduce: {case.describe()}")
    if r.guard:
        raise CheckFailed(f"host code: {r.guard[0]}; reproduce: {case.describe()}")
    if r.error:
        raise CheckFailed(f"{r.error}; reproduce: {case.describe()}")
    ref = subject.ref64(case)
    for i, (o, rf) in enumerate(zip(outputs(r.out), outputs(ref))):
        if not isinstance(o, torch.Tensor):
            raise CheckFailed(f"output {i} is {type(o).__name__}, not a tensor")
        if tuple(o.shape) != tuple(rf.shape):
            raise CheckFailed(f"output {i} has shape {tuple(o.shape)}, expected {tuple(rf.shape)}")
    if len(outputs(r.out)) != len(op.output_names):
        raise CheckFailed(
            f"returned {len(outputs(r.out))} outputs, the contract has {len(op.output_names)} "
            f"({', '.join(op.output_names)})"
        )
    return f"{r.launches} kernel launch(es) per call"


def check_host_code(subject: Subject, s: Settings) -> str:
    op = subject.op
    n = 0
    for case in tiny_cases(op, 2, ("strided",), seed=subject.seed(SeedStream.HOST_CODE)):
        r = run_case(subject, subject.fn, case)
        n += 1
        if r.guard:
            raise CheckFailed(f"{r.guard[0]}; reproduce: {case.describe()}")
        if r.bounds:
            raise CheckFailed(f"{r.bounds[0]}; reproduce: {case.describe()}")
        if r.error:
            raise CheckFailed(f"{r.error}; reproduce: {case.describe()}")
    return f"host code only allocated, read shapes and made views ({n} calls watched)"


def check_bounds(subject: Subject, s: Settings) -> str:
    cases = tiny_cases(subject.op, s.bounds_shapes, s.bounds_layouts, seed=subject.seed(SeedStream.BOUNDS))
    for case in cases:
        _run_or_fail(subject, case)
    return (
        f"every active load and store stayed inside its tensor on {cases_n(len(cases))} "
        f"(inputs read-only, unowned cache slots unread)"
    )


def check_coverage(subject: Subject, s: Settings) -> str:
    cases = tiny_cases(
        subject.op, s.coverage_shapes, ("contiguous",), seed=subject.seed(SeedStream.COVERAGE), largest_first=True
    )
    for case in cases:
        a = _run_or_fail(subject, case, sentinel=0).out
        b = _run_or_fail(subject, case, sentinel=1).out
        d = first_difference(a, b)
        if d:
            i, idx, va, vb = d
            name = subject.op.output_names[i] if i < len(subject.op.output_names) else f"output {i}"
            raise CheckFailed(
                f"{name}{list(idx)} was never written: it holds the allocation sentinel "
                f"({va} in one run, {vb} in the other); reproduce: {case.describe()}"
            )
        for i, t in enumerate(outputs(a)):
            if t.is_floating_point() and bool(torch.isnan(t).any()):
                idx = tuple(int(j) for j in torch.isnan(t).nonzero()[0].tolist())
                raise CheckFailed(
                    f"{subject.op.output_names[i]}{list(idx)} is NaN (the first sentinel, or a NaN "
                    f"the kernel produced); reproduce: {case.describe()}"
                )
    return f"outputs identical under two allocation sentinels, none left ({cases_n(len(cases))})"


def check_inputs_unchanged(subject: Subject, s: Settings) -> str:
    cases = tiny_cases(subject.op, 2, ("strided", "contiguous"), seed=subject.seed(SeedStream.INPUTS_UNCHANGED))
    for case in cases:
        r = run_case(subject, subject.fn, case)
        if r.mutated:
            raise CheckFailed(f"input(s) {', '.join(r.mutated)} changed during the call; reproduce: {case.describe()}")
        if not r.ok:
            raise CheckFailed(f"{r.problem()}; reproduce: {case.describe()}")
    return f"every input's storage bitwise unchanged ({cases_n(len(cases))})"


def _same_shapes(a: Case, b: Case) -> bool:
    return all(
        (not isinstance(v, torch.Tensor))
        or (isinstance(b.args.get(k), torch.Tensor) and b.args[k].shape == v.shape and b.args[k].dtype == v.dtype)
        for k, v in a.args.items()
    )


def check_no_state(subject: Subject, s: Settings) -> str:
    op = subject.op
    shapes = [sh for sh in op.shapes("tiny") if not getattr(sh, "ragged", False)]
    shape, other = shapes[-1], shapes[0]
    x = op.make_case(shape, torch.float32, seed=subject.seed(SeedStream.NO_STATE, 0))
    y = op.make_case(shape, torch.float32, seed=subject.seed(SeedStream.NO_STATE, 1))
    if not _same_shapes(x, y):
        raise CheckFailed("internal: state cases differ in shape")
    r1 = _run_or_fail(subject, x, keep=True)
    out1 = r1.out
    if not subject.op.compare(out1, x.args, subject.ref64(x)).ok:
        # already wrong on a fresh call: a numeric bug, not state; the numeric checks name it
        raise CheckSkipped("not judged: the first call already differs from the reference (left to the numeric checks)")
    z = op.make_case(other, torch.float32, seed=subject.seed(SeedStream.NO_STATE, 2))  # a different shape in between
    _compare_or_fail(subject, z, _run_or_fail(subject, z).out, "call on another shape: ")
    # fresh values in the same (recycled) buffers: a cache keyed on pointers or shapes answers stale
    for k, v in x.args.items():
        if isinstance(v, torch.Tensor):
            v.copy_(y.args[k])
    subject.refs.pop(id(x), None)
    out2 = _run_or_fail(subject, x).out
    _compare_or_fail(subject, x, out2, "fresh inputs in recycled buffers gave a stale answer: ")
    now = (
        subject.fn.output_digests(r1.handle)
        if isinstance(subject.fn, Executor)
        else [wire.digest(t) for t in outputs(out1)]
    )
    for t, d in zip(outputs(out1), now or []):
        if wire.digest(t) != d:
            raise CheckFailed(
                "a later call overwrote the tensor an earlier call returned (outputs must be new "
                f"tensors); reproduce: {x.describe()}"
            )
    return "fresh inputs in recycled buffers gave fresh answers; earlier outputs untouched"


def check_order(subject: Subject, s: Settings) -> str:
    cases = tiny_cases(
        subject.op, s.order_shapes, ("contiguous",), seed=subject.seed(SeedStream.ORDER), largest_first=True
    )
    for case in cases:
        base = _run_or_fail(subject, case).out
        for order in s.orders:
            other = _run_or_fail(subject, case, order=order, seed=subject.seed(SeedStream.ORDER_PERMUTATION)).out
            d = first_difference(base, other)
            if d:
                i, idx, va, vb = d
                raise CheckFailed(
                    f"running the grid's programs in {order} order changed "
                    f"{subject.op.output_names[i]}{list(idx)} from {va} to {vb} (programs depend on "
                    f"each other: a race on the GPU); reproduce: {case.describe()}"
                )
    return f"bitwise identical under {', '.join(s.orders)} program order ({cases_n(len(cases))})"


def _perturb_positions(t: torch.Tensor, readable: Optional[torch.Tensor], n: int, gen: torch.Generator):
    """Indices to perturb: the last element (where off-by-ones live), the first, then random ones."""
    if readable is not None:
        flat = readable.reshape(-1).nonzero().reshape(-1)
    else:
        flat = torch.arange(t.numel())
    if flat.numel() == 0:
        return []
    picks = [int(flat[-1]), int(flat[0])]
    while len(picks) < n:
        picks.append(int(flat[torch.randint(0, flat.numel(), (1,), generator=gen)]))
    return [tuple(int(i) for i in torch.unravel_index(torch.tensor(p), t.shape)) for p in picks[:n]]


def check_sensitivity(subject: Subject, s: Settings) -> str:
    op = subject.op
    shape = op.shapes("tiny")[2]
    gen = torch.Generator().manual_seed(subject.seed(SeedStream.SENSITIVITY))
    base_case = op.make_case(shape, torch.float32, seed=subject.seed(SeedStream.SENSITIVITY))
    readable = op.readable(base_case.args)
    done = 0
    for name, v in base_case.args.items():
        if not (isinstance(v, torch.Tensor) and v.is_floating_point()):
            continue
        for pos in _perturb_positions(v, readable.get(name), s.sensitivity_positions, gen):
            case = op.make_case(shape, torch.float32, seed=subject.seed(SeedStream.SENSITIVITY))
            t = case.args[name]
            t[pos] = t[pos] + (4.0 * float(t.abs().nan_to_num().max()) + 1.0)
            out = _run_or_fail(subject, case).out
            _compare_or_fail(subject, case, out, f"after changing {name}{list(pos)}: ")
            done += 1
    # the integer inputs the contract makes the output depend on (a block table, the lengths): Op.integer_changes
    changes = op.integer_changes(base_case.args, gen)
    for change in changes:
        case = op.make_case(shape, torch.float32, seed=subject.seed(SeedStream.SENSITIVITY))
        change.apply(case.args)
        out = _run_or_fail(subject, case).out
        _compare_or_fail(subject, case, out, f"after changing {change.what}: ")
    ints = f"; and after {len(changes)} change(s) to integer inputs: " + ", ".join(c.what for c in changes)
    return (
        f"output follows the reference after {done} single-element change{'' if done == 1 else 's'} "
        f"(first, last, random){ints if changes else ''}"
    )


def _draw_case(op: Op, data, big: bool = False) -> Case:
    shape = data.draw(op.shape_strategy(), label="shape")
    dtypes = [
        d
        for d in ("float32", "float16", "bfloat16-via-float32")
        if d.split("-")[0] in {DTYPE_NAMES[x] for x in op.dtypes}
    ]
    mode = data.draw(st.sampled_from(dtypes), label="dtype")
    dists = [d.name for d in op.distributions]
    if big:  # the harsher mix of the extended suite
        dists = [d for d in dists if d != "normal"] or dists
    dist = data.draw(st.sampled_from(dists), label="dist")
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")  # the views past these: check_domain
    seed = data.draw(st.integers(0, 2**20), label="seed")
    dtype = torch.float16 if mode == "float16" else torch.float32
    case = op.make_case(shape, dtype, seed=seed, dist=dist, layout=layout)
    # True first: hypothesis starts from the first choice, so every run passes an explicit scale early
    # (a kernel that ignores it is caught whatever the seed); every other check calls with the default
    if "sm_scale" in op.optional_args and data.draw(st.sampled_from([True, False]), label="custom sm_scale"):
        case.args["sm_scale"] = data.draw(sm_scale_strategy(), label="sm_scale")  # a kernel may ignore it
    if mode.startswith("bfloat16"):
        _bfloat16_values(case)
    return case


def _bfloat16_values(case: Case) -> None:
    """Round a float32 case's values to bfloat16 in place. Triton's interpreter keeps bfloat16 tensors as raw
    16-bit integers and computes on them as integers (tl.dot, +, *: 12.6 comes out as 6.5e10) and converts their
    subnormals wrongly, so a kernel's bfloat16 path runs in the GPU stage (sanitizer/gpu.py)."""
    for v in case.args.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v.copy_(round_to(v, torch.bfloat16))
    case.dist = f"{case.dist} (bfloat16 values in float32)"


def _hypothesis_differential(subject: Subject, examples: int, seed: int, big: bool = False) -> int:
    count = [0]

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
        print_blob=False,
    )
    @given(st.data())
    def prop(data):
        case = _draw_case(subject.op, data, big)
        r = run_case(subject, subject.fn, case)
        if not r.ok:
            raise CheckFailed(f"{r.problem()}; reproduce: {case.describe()}")
        cmp = subject.op.compare(r.out, case.args, subject.ref64(case))
        subject.refs.pop(id(case), None)
        if not cmp.ok:
            raise CheckFailed(f"{cmp.describe()}; reproduce: {case.describe()}")
        count[0] += 1

    try:
        prop()
    except CheckFailed:
        raise
    except Exception as e:  # hypothesis wraps the first failure
        inner: Optional[BaseException] = e
        while inner is not None and not isinstance(inner, CheckFailed):
            inner = inner.__cause__ or (inner.__context__ if inner.__context__ is not inner else None)
        if isinstance(inner, CheckFailed):
            raise inner
        raise CheckFailed(f"property test error: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return count[0]


def _each_distribution(subject: Subject) -> int:
    """Every input distribution in every dtype on a tiny shape, each layout in turn: a bug that only one
    distribution shows in one dtype (NaN codes for an all-zero row, a float16 overflow on tiny rows) is met
    whatever the seed, where the property test's few quick-mode examples may draw others. 'tiny' in each dtype
    reaches that dtype's own subnormals (bfloat16's as values in float32)."""
    op = subject.op
    shape = op.one_tiny_shape()
    dists = [d.name for d in op.distributions]
    modes = [(torch.float32, False), (torch.float16, False), (torch.float32, True)]  # True: bfloat16 values
    draws = [(dist, dtype, bf16) for dist in dists for dtype, bf16 in modes]
    for i, (dist, dtype, bf16) in enumerate(draws):
        case = op.make_case(
            shape, dtype, seed=subject.seed(SeedStream.DIFFERENTIAL, i), dist=dist, layout=LAYOUTS[i % len(LAYOUTS)]
        )
        if bf16:
            _bfloat16_values(case)
        _compare_or_fail(subject, case, _run_or_fail(subject, case).out)
        subject.refs.pop(id(case), None)
    return len(draws)


def check_differential(subject: Subject, s: Settings) -> str:
    fixed = _each_distribution(subject)
    n = _hypothesis_differential(subject, s.differential_examples, seed=subject.seed(SeedStream.DIFFERENTIAL_PROPERTY))
    return (
        f"{fixed} cases, every input distribution in every dtype, and {n} property-based examples match the "
        f"float64 reference (odd shapes, head dims and page sizes, strided and fused-slice views, fp16/fp32/bf16 "
        f"values, adversarial distributions); bf16 path verified on GPU only: the interpreter computes on bf16 "
        f"tensors as integers, so bf16 is drawn as bf16 values in fp32 tensors, and a branch on the bf16 dtype runs "
        f"on the GPU, which draws every distribution in bf16"
    )


def check_error_budget(subject: Subject, s: Settings) -> str:
    op = subject.op
    if op.exact_check:
        raise CheckSkipped(f"not applicable: {op.name} is checked exactly by its contract ({op.exact_check})")
    worst = 0.0
    combos = [
        (torch.float32, "normal"),
        (torch.float16, "outliers"),
        (torch.float16, "normal"),
        (torch.float32, "large"),
    ][: s.budget_cases]
    shapes = op.shapes("tiny")
    for i, (dtype, dist) in enumerate(combos):
        case = op.make_case(
            shapes[(2 + i) % len(shapes)], dtype, seed=subject.seed(SeedStream.ERROR_BUDGET, i), dist=dist
        )
        out_c = _run_or_fail(subject, case).out
        worst = max(worst, _within_error_budget(subject, case, out_c, "", "reduced precision?"))
    return f"error within the budget on {cases_n(len(combos))} (worst {worst:.0%} of the allowance)"


def _within_error_budget(subject: Subject, case: Case, out, what: str = "", why: str = "") -> float:
    """The candidate's error against float64 at most twice the baseline's on the same inputs (Op.error_budget);
    the fraction of the allowance used, or CheckFailed."""
    op = subject.op
    rb = run_case(subject, subject.baseline, case, bounds=False)
    if not rb.ok:
        raise CheckFailed(f"internal: the baseline failed: {rb.problem()}")
    dtype = op.output_dtype(case.args)
    b = op.error_budget(out, rb.out, subject.ref64(case), dtype)
    if not b.ok:
        raise CheckFailed(
            f"{what}error {b.error:.3g} against float64 exceeds the budget {b.allowed:.3g} (2x the "
            f"baseline's {b.trusted_error:.3g}, floor {op.tolerance(dtype).budget_floor:g})"
            f"{': ' + why if why else ''}; reproduce: {case.describe()}"
        )
    return b.used


def check_near_serving(subject: Subject, s: Settings) -> str:
    op = subject.op
    shapes = op.shapes("near_serving")[: s.near_serving_shapes]
    for i, shape in enumerate(shapes):
        # 16-bit, as served: kernels take other paths for float32 (cheats gated on size hide there too)
        case = op.make_case(shape, torch.float16, seed=subject.seed(SeedStream.NEAR_SERVING, i))
        out = _run_or_fail(subject, case).out
        _compare_or_fail(subject, case, out)
        subject.refs.pop(id(case), None)
    return f"correct with bounds checked at {len(shapes)} near-serving shape(s): " + "; ".join(
        sh.key() for sh in shapes
    )


class CheckSkipped(Exception):
    pass


def _region_case(subject: Subject, region: Region, i: int, stream: SeedStream) -> Case:
    """A case of one region of the op's domain; float16 and float32 alternate (a float32 path is taken too)."""
    case = subject.op.make_case(
        region.shape,
        (torch.float16, torch.float32)[i % 2],
        seed=subject.seed(stream, i),
        dist=region.dist,
        layout=region.layout,
    )
    return region.set_args(case)


def check_domain(subject: Subject, s: Settings) -> str:
    """Every CPU region of the op's domain (ops/: Op.domain): the corners the random draws do not
    reach (pages and head dims up to 256, GQA groups up to MQA, pools far larger than the batch, contexts
    past 8192, the views a K/V cache is sliced as). The GPU stage draws the regions only it can afford."""
    regions = subject.op.domain().on("cpu")
    for i, region in enumerate(regions):
        case = _region_case(subject, region, i, SeedStream.DOMAIN)
        r = run_case(subject, subject.fn, case)
        if not r.ok:
            raise CheckFailed(f"{region.name}: {r.problem()}; reproduce: {case.describe()}")
        _compare_or_fail(subject, case, r.out, f"{region.name}: ")
        if region.budget and not subject.op.exact_check:
            _within_error_budget(subject, case, r.out, f"{region.name}: ")
        subject.refs.pop(id(case), None)
    return f"correct on {len(regions)} region(s) of the contract's domain: " + "; ".join(r.name for r in regions)


def compared_regions(subject: Subject) -> List[Region]:
    """The op's value regions for the sizes the candidate compares against (sanitizer/compared.py), read from
    the canonical text the executor runs. CheckFailed when the file names more than the check draws."""
    try:
        text = subject.judged().text
        values, joints = compared_values(text), compared_joints(text)
    except TooManyCompared as e:
        raise CheckFailed(str(e))
    except (SyntaxError, TextRefused, RecursionError) as e:
        raise CheckFailed(f"the judge cannot read the file's comparisons: {type(e).__name__}: {e}")
    return subject.op.joint_regions(joints) + subject.op.value_regions(values)


# Where a compared threshold t may sit in sm_scale's terms: sm_scale itself, or the base-2 exponent's scale
# sm_scale * log2(e) that every exp2 kernel compares (so sm_scale = t / log2(e)). Each is drawn a factor of 2
# either side, first: a clamp at t (`min(sm_scale, 2.0)`) is wrong by only 1.6% at 1/64 past it, which a draw
# of small scores hid inside the tolerance on some seeds; and 1/64 either side (a cheat wrong in a narrow band).
SCALE_FACTORS = (1.0, 1.0 / 1.4426950408889634)
SCALE_SIDES = (2.0, 0.5, 1.0 - 2.0**-6, 1.0 + 2.0**-6)


def compared_scale_values(subject: Subject) -> List[float]:
    """The sm_scale values on both sides of each threshold the candidate compares against (compared_scales),
    within the contract's range; none for an op without an sm_scale argument."""
    if "sm_scale" not in subject.op.optional_args:
        return []
    lo, hi = SM_SCALE_RANGE
    out: List[float] = []
    for t in compared_scales(subject.judged().text):
        for v in (t * f * side for f in SCALE_FACTORS for side in SCALE_SIDES):
            if lo <= v <= hi and v not in out:
                out.append(v)
    return out


def _check_compared_case(subject: Subject, region: Region, i: int, sm_scale: Optional[float] = None) -> None:
    case = _region_case(subject, region, i, SeedStream.COMPARED_VALUES)
    what = region.name if sm_scale is None else f"sm_scale={sm_scale:.6g}"
    if sm_scale is not None:
        case.args["sm_scale"] = sm_scale
    r = run_case(subject, subject.fn, case)
    if not r.ok:
        raise CheckFailed(f"at a value the code compares against ({what}): {r.problem()}; reproduce: {case.describe()}")
    _compare_or_fail(subject, case, r.out, f"at a value the code compares against ({what}): ")
    subject.refs.pop(id(case), None)


def check_compared_values(subject: Subject, s: Settings) -> str:
    """Every size the candidate's code compares against (`D == 192`, `K == 14336`, a GQA group of 7,
    `seq_len % 1024 == 1000`, solved back through constant arithmetic), drawn as each dimension of the
    contract that admits it, the others tiny: a cheat wrong only at a magic size names that size. Sizes the
    interpreter cannot afford are drawn by the GPU stage (gpu_domain). For an op with an sm_scale, each real
    threshold the code compares against (`qk_scale < 0.07`) is drawn as sm_scale on both of its sides."""
    regions = compared_regions(subject)
    cpu = [r for r in regions if r.where == "cpu"][: s.compared_regions]
    for i, region in enumerate(cpu):
        _check_compared_case(subject, region, i)
    try:
        scales = compared_scale_values(subject)[: s.compared_regions]
    except (SyntaxError, TextRefused, RecursionError) as e:
        raise CheckFailed(f"the judge cannot read the file's comparisons: {type(e).__name__}: {e}")
    base = Region("base", subject.op.value_base())
    for i, v in enumerate(scales):
        _check_compared_case(subject, base, i, v)
    gpu = sum(r.where == "gpu" for r in regions)
    left = sum(r.where == "cpu" for r in regions) - len(cpu)
    return (
        f"correct at {len(cpu)} size(s) the code compares against"
        + (f" ({gpu} more on the GPU)" if gpu else "")
        + (f" ({left} more in full mode)" if left else "")
        + ": "
        + ", ".join(r.name for r in cpu)
        + (f"; at {len(scales)} sm_scale(s) either side of a threshold it compares: " if scales else "")
        + ", ".join(f"{v:.4g}" for v in scales)
    )


def _branch_sides(subject: Subject) -> List[Side]:
    """Both sides of every branch the checks must take: the host code's conditional jumps (host_branches), the
    kernel bodies' conditions and the host `min`/`max` indicators (kernel_branches), of the canonical text the
    executor runs (its lines are the ones to compile)."""
    try:
        text = subject.judged().text
        return host_branches(text, subject.path) + indicator_sides(text)
    except (SyntaxError, TextRefused) as e:
        raise CheckFailed(f"the judge cannot compile the file: {e}")


def _untaken(ex: Executor, sides: List[Side]) -> Tuple[List[Side], List[str], List[Side]]:
    """(the sides never taken so far, in source order; the specialisations launched; the device-only sides
    never taken here, which the GPU stage must take)."""
    arcs, specs = ex.coverage()
    took = taken(arcs, sides) | kernel_taken(ex.indicator_coverage(), sides)
    device = [x for x in sides if x.exempt == DEVICE_ONLY and x.key() not in took]
    return uncovered(sides, took), specs, device


def check_host_branches(subject: Subject, s: Settings) -> str:
    """Every side of every branch of the candidate was taken by some call of the checks: host-code jumps, kernel
    `if`s and scalar `tl.where`s, and which argument decides each host `min`/`max` (the executor records them:
    sanitizer/branches.py, sanitizer/kernel_branches.py); a side never taken gets inputs drawn from the op's pool
    of extra shapes and views (Op.branch_pool) until it is, within Settings.branch_search_s, or the candidate is
    refused with file:line and the condition named: a cheat wrong only on inputs the checks never draw hides
    there. A device-only side is listed for the GPU stage."""
    ex = subject.fn
    if not isinstance(ex, Executor):
        raise CheckSkipped("not judged: the candidate runs outside an executor")
    sides = _branch_sides(subject)
    missing, specs, device = _untaken(ex, sides)
    tried, t0 = 0, time.time()
    for i, region in enumerate(subject.op.branch_pool()):
        if not missing or time.time() - t0 > s.branch_search_s:
            break
        case = _region_case(subject, region, i, SeedStream.HOST_BRANCHES)
        r = run_case(subject, subject.fn, case)
        if not r.ok:
            raise CheckFailed(
                f"drawn to take a branch ({missing[0].describe(subject.path)}): {r.problem()}; "
                f"reproduce: {case.describe()}"
            )
        _compare_or_fail(subject, case, r.out, f"drawn to take a branch ({missing[0].describe(subject.path)}): ")
        subject.refs.pop(id(case), None)
        tried += 1
        missing, specs, device = _untaken(ex, sides)
    _configs_or_fail(subject, specs)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckFailed(
            f"the code branches on something no drawn input of the contract's domain takes both "
            f"ways: {missing[0].describe(subject.path)}{more}, after {tried} extra case(s); every branch "
            f"of the host code and the kernels must be exercised both ways by the checks"
        )
    return _branches_summary(subject, sides, device, tried, len(specs))


def _probe_answer(reply: Dict[str, Any]) -> Dict[str, Any]:
    """The executor's answer for one serving-size point, read as evidence of the expected types."""
    return {
        "error": wire.text(reply.get("error"), 600),
        "bytes": max(0, wire.as_int(reply.get("bytes"))),
        "launches": max(0, wire.as_int(reply.get("launches"))),
        "oversized": wire.text(reply.get("oversized"), 300),
        "elapsed_s": wire.seconds(reply.get("elapsed_s")),
    }


def check_serving_sizes(subject: Subject, s: Settings) -> str:
    """The candidate's host code at every serving size of the op (sanitizer/host_probe.py: the domain's regions,
    the GPU's too, the shape suites, each with one dimension at the contract's largest, in every dtype), run on
    fake tensors with its launches counted: where the kernels cannot run on the CPU, what serving sees of the
    host code (a raise, an allocation, a launch per sequence, a stall) is the same as here, and is held to the
    baseline's at the same point."""
    ex = subject.fn
    if not isinstance(ex, Executor) or ex.device != "cpu":
        raise CheckSkipped("not judged: the candidate runs outside a CPU executor")
    pts = host_probe.points(subject.op)
    baseline = subject.baseline or baseline_fn(subject.op.name)
    base = host_probe.baseline_runs(subject.op, baseline, inspect.getsourcefile(baseline) or "")
    judged, most_bytes, most_launches = 0, 0, 0
    served = [(p, b) for p, b in zip(pts, base) if host_probe.served_by_baseline(p, b)]
    # the points this host cannot fake (CUDA tensors where torch cannot make fake ones): said in the verdict
    not_here = sorted({host_probe.unavailable(b) for b in base if host_probe.unavailable(b)})
    step = host_probe.POINTS_PER_REQUEST
    for at in range(0, len(served), step):
        batch = served[at : at + step]
        try:
            answers = ex.probe([p.wire() for p, _ in batch], host_probe.POINT_TIMEOUT_S)
        except ExecutorError as e:
            why = "did not return" if e.timed_out else f"ended ({e})"
            raise CheckFailed(
                f"its host code {why} within {host_probe.POINT_TIMEOUT_S:.0f} s at one of {len(batch)} sizes the "
                f"contract admits, from {batch[0][0].label} to {batch[-1][0].label}: a stall in serving"
            )
        if len(answers) != len(batch):
            raise CheckFailed(f"internal: {len(answers)} answers for {len(batch)} serving sizes")
        for (p, b), answer in zip(batch, answers):
            if isinstance(answer, dict) and answer.get("unavailable"):
                # the baseline's ran in the judge; the executor's process cannot fake this device
                not_here = not_here or [f"in the candidate's process: {wire.text(answer.get('unavailable'), 200)}"]
                continue
            got = _probe_answer(answer if isinstance(answer, dict) else {"error": "no answer"})
            failure = host_probe.judge(p.label, got, b)
            if failure:
                raise CheckFailed(failure)
            judged += 1
            most_bytes, most_launches = max(most_bytes, got["bytes"]), max(most_launches, got["launches"])
    return (
        f"host code run at {judged} serving sizes on fake tensors: no raise; at most {most_bytes / (1 << 30):.3f} "
        f"GiB allocated and {most_launches} launches per call, within the baseline's bounds"
    ) + (f"; not run here: {not_here[0]}" if not_here else "")


def _configs_or_fail(subject: Subject, specs: List[str]) -> None:
    """A launch-configuration override of the search is exempt from branch coverage (it selects a configuration):
    the configuration it selects must have been launched by the checks instead."""
    steps = config_overrides(subject.judged().text).values()
    step = configs_launched(steps, specs)
    if step is not None:
        raise CheckFailed(
            f"the launch configuration {step.describe()} was never launched by the checks: a configuration the "
            f"search selects must be exercised as the branch it replaces would be"
        )


def _branches_summary(subject: Subject, sides: List[Side], untaken: List[Side], tried: int, specs: int) -> str:
    """What was covered, and the exempt branches by reason; each device-only side the checks here never took
    with file:line, condition and value: the sides the GPU stage must take."""
    branches = len({(x.qualname, x.firstlineno, x.jump) for x in sides})
    device = sorted({f"{subject.path}:{x.line}: `{x.condition}` {x.value}" for x in untaken})
    other = sorted({x.exempt for x in sides if x.exempt and x.exempt != DEVICE_ONLY})
    return (
        f"every side of the code's {branches} branch(es) and min/max indicator(s) taken ({tried} extra "
        f"case(s) drawn); exempt: {'; '.join(other) or 'none'}; device-only, for the GPU stage: "
        f"{'; '.join(device) or 'none'}; {specs} kernel specialisation(s) launched"
    )


def check_fpsan(subject: Subject, s: Settings) -> str:
    op = subject.op
    shapes = op.shapes("tiny")
    tested = 0
    # the largest tiny shapes first (fast paths often start at a size), in both dtypes
    order = sorted(range(len(shapes)), key=lambda j: -_volume(shapes[j]))
    for i in range(s.fpsan_cases):
        dtype = (torch.float16, torch.float32)[i % 2]
        case = op.make_case(shapes[order[i % len(order)]], dtype, seed=subject.seed(SeedStream.FPSAN, i))
        rc = run_case(subject, subject.fn, case, bounds=False, fpsan=True)
        rb = run_case(subject, subject.baseline, case, bounds=False, fpsan=True)
        unsupported = rc.fpsan_unsupported + rb.fpsan_unsupported
        if unsupported:
            subject.fpsan_equivalent = None
            raise CheckSkipped(f"FpSan could not run: {unsupported[0]}")
        if not rc.ok:
            raise CheckFailed(f"under FpSan: {rc.problem()}; reproduce: {case.describe()}")
        d = first_difference(rc.out, rb.out)
        if d:
            i_out, idx, vc, vb = d
            out_name = op.output_names[i_out]
            subject.fpsan_equivalent = False
            subject.fpsan_detail = (
                f"not structurally equivalent: {out_name}{list(idx)} differs under FpSan "
                f"(candidate bits {_hexbits(rc.out, i_out, idx)}, baseline "
                f"{_hexbits(rb.out, i_out, idx)}); reproduce: {case.describe()}"
            )
            return subject.fpsan_detail + "; the extended numeric suite decides"
        tested += 1
    subject.fpsan_equivalent = True
    subject.fpsan_detail = f"bitwise identical to the baseline under FpSan on {cases_n(tested)}"
    return subject.fpsan_detail + ": computes the same symbolic function"


def _volume(shape) -> int:
    v = 1
    for x in shape.as_dict().values():
        if isinstance(x, int) and not isinstance(x, bool):
            v *= max(x, 1)
    return v


def _hexbits(out, i, idx) -> str:
    t = outputs(out)[i]
    return hex(int(bits(t)[idx]) & ((1 << (8 * t.element_size())) - 1))


def check_extended(subject: Subject, s: Settings) -> str:
    """Harsh values. FpSan's proof shortens this suite but does not replace it: FpSan compares payloads, which
    order two non-zero values unlike the reals, so a path chosen by such a comparison (a row of whole numbers
    found as `floor(x) == x`) may never be taken under it."""
    proved = getattr(subject, "fpsan_equivalent", None) is True
    examples = max(1, s.extended_examples // 4) if proved else s.extended_examples
    n = _hypothesis_differential(subject, examples, seed=subject.seed(SeedStream.EXTENDED), big=True)
    return f"{n} extra examples with harsh values match the reference" + (
        " (a quarter of the suite: FpSan proved the candidate equivalent)" if proved else ""
    )


def check_sandbox(subject: Subject, s: Settings) -> str:
    """The candidate's process never did what the sandbox refuses (a refusal inside a call already failed
    that call's check; this catches the ones a candidate swallowed between calls)."""
    ex = subject.executor
    if ex is None or not ex.hello:
        raise CheckSkipped("the candidate's process never started")
    if ex.violations:
        raise CheckFailed(
            f"the sandbox refused {len(ex.violations)} action(s) of the candidate, the first: {ex.violations[0]}"
        )
    return sandbox_summary(ex.hello)


def sandbox_summary(hello: Dict[str, Any]) -> str:
    active = [str(a) for a in hello.get("sandbox") or []]
    missing = [str(m) for m in hello.get("missing") or []]
    text = f"no action refused; {len(active)} protections: " + "; ".join(active)
    return text + ("; not available here: " + "; ".join(missing) if missing else "")


CHECKS: List[Tuple[str, Callable[[Subject, Settings], str]]] = [
    ("static_gate", check_static),
    ("load", check_load),
    ("runs", check_runs),
    ("host_code", check_host_code),
    ("bounds", check_bounds),
    ("coverage", check_coverage),
    ("inputs_unchanged", check_inputs_unchanged),
    ("no_state", check_no_state),
    ("order_independence", check_order),
    ("input_sensitivity", check_sensitivity),
    ("differential", check_differential),
    ("error_budget", check_error_budget),
    ("near_serving", check_near_serving),
    ("domain", check_domain),
    ("compared_values", check_compared_values),
    ("serving_sizes", check_serving_sizes),
    ("fpsan", check_fpsan),
    ("extended_numeric", check_extended),
    ("host_branches", check_host_branches),
    ("sandbox", check_sandbox),
]
CHECK_NAMES = [name for name, _ in CHECKS]


def _judge_one(
    subject: Subject, name: str, check: Callable[[Subject, Settings], str], settings: Settings
) -> Tuple[CheckOutcome, bool]:
    """Run one check, then have the executor forget its cases; (the outcome, whether the deadline passed,
    during the check or the reset after it)."""
    t0 = time.time()
    timed_out = False
    try:
        with torch.no_grad():
            detail = check(subject, settings)
        outcome = CheckOutcome(name, CheckStatus.PASSED, detail, time.time() - t0)
    except CheckSkipped as e:
        outcome = CheckOutcome(name, CheckStatus.SKIPPED, str(e), time.time() - t0)
    except TimedOut as e:
        outcome, timed_out = CheckOutcome(name, CheckStatus.FAILED, str(e), time.time() - t0), True
    except CheckFailed as e:
        outcome = CheckOutcome(name, CheckStatus.FAILED, str(e), time.time() - t0)
    except Exception as e:  # noqa: BLE001 - an unexpected error fails the check, with its reason
        outcome = CheckOutcome(name, CheckStatus.FAILED, describe_exception(e, subject.path), time.time() - t0)
    if isinstance(subject.fn, Executor) and outcome.status != CheckStatus.FAILED:
        try:
            subject.fn.reset()  # the executor forgets the check's cases and outputs
        except ExecutorError as e:
            outcome, timed_out = CheckOutcome(name, CheckStatus.FAILED, str(e), time.time() - t0), e.timed_out
    return outcome, timed_out


def sanitize_file(
    path: str,
    op_name: str,
    mode: SanitizerMode = SanitizerMode.FULL,
    on_check: Optional[Callable[[CheckOutcome], None]] = None,
    fail_fast: Optional[bool] = None,
    only: Optional[Sequence[str]] = None,
    on_start: Optional[Callable[[str], None]] = None,
    executor: Optional[Executor] = None,
    seed_base: int = 0,
    skip_gate: bool = False,
) -> Verdict:
    """Judge one candidate file: the checks run here, in the trusted judge process, and the candidate
    runs in `executor`, a sandboxed process of its own (started by the caller; see worker.py)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the CPU checks need TRITON_INTERPRET=1 set before triton is imported")
    op = get_op(op_name)
    mode = SanitizerMode(mode)  # (a caller may name it by its word)
    settings = MODES[mode]
    if fail_fast is None:
        fail_fast = settings.fail_fast
    with open(path, "rb") as f:  # bytes: the gate judges how Python would read them
        source = f.read()
    subject = Subject(
        op,
        os.path.abspath(path),
        source,
        baseline=baseline_fn(op_name),
        seed_base=seed_base,
        executor=executor,
        skip_gate=skip_gate,
    )
    verdict = Verdict(path, op_name, mode)
    _run_checks(subject, verdict, settings, fail_fast, only, on_check, on_start)
    verdict.fpsan_equivalent = subject.fpsan_equivalent
    verdict.fpsan_detail = subject.fpsan_detail
    return verdict


def _run_checks(
    subject: Subject,
    verdict: Verdict,
    settings: Settings,
    fail_fast: bool,
    only: Optional[Sequence[str]],
    on_check: Optional[Callable[[CheckOutcome], None]],
    on_start: Optional[Callable[[str], None]],
) -> None:
    """Every check of CHECKS in order into `verdict`: after a failure, fail-fast skips the rest (and a failed
    gate or load always does); a check past the deadline sets the verdict's time-limit error. Sets the
    verdict's duration_s, the time of all of them."""
    t_all = time.time()
    failed = False
    for name, check in CHECKS:
        if only and name not in only and name not in ("static_gate", "load"):
            continue
        if failed and (fail_fast or name in ("runs",) or subject.fn is None):
            outcome = CheckOutcome(name, CheckStatus.SKIPPED, "not run: an earlier check failed")
        else:
            if on_start:
                on_start(name)
            outcome, timed_out = _judge_one(subject, name, check, settings)
            if timed_out:  # slowness is not a fault: the verdict says the candidate was not verified
                verdict.stop_for_time_limit(
                    f"({time.time() - t_all:.0f}s) during check `{name}` (a hang, or too slow to check here)"
                )
                fail_fast = True
            subject.refs.clear()
            if outcome.status == CheckStatus.FAILED:
                failed = True
                if name in ("static_gate", "load"):
                    fail_fast = True  # nothing else can run meaningfully
        verdict.checks.append(outcome)
        if on_check:
            on_check(outcome)
    verdict.duration_s = time.time() - t_all

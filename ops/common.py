"""What every op module shares: shapes, tolerances, the comparison with a reference.

An op module (matmul.py, attention.py, ...) defines one `Op` instance. Everything
else in kernel-agent (sanitizer, benchmark, agent, serving set) reads the op
through that object, so the contract lives in exactly one place.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch

if TYPE_CHECKING:
    from .tuning import Space

DTYPES: Dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


@dataclass(frozen=True)
class Shape:
    """Base class of the per-op shape records. Subclasses are frozen dataclasses of ints/bools."""

    def key(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool):
                if v:
                    parts.append(f.name)
            elif f.default is not dataclasses.MISSING and v == f.default:
                continue  # a field at its default is left out: keys written before it existed still parse
            else:
                parts.append(f"{f.name}={v}")
        return ",".join(parts)

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return self.key()


@dataclass(frozen=True)
class Tolerance:
    """Per-dtype acceptance policy for a candidate's output against the float64 reference.

    An element is out of tolerance when |out - ref| > atol * rms(ref) + rtol * |ref|:
    the absolute part scales with the output's magnitude so that cancellation near zero
    does not fail a correct kernel, and the relative part catches bad tiles. At most
    `max_bad_fraction` of the elements may be out of tolerance (norm-wise alone hides a
    bad tile; element-wise alone breaks on cancellation). `budget_floor` is the smallest
    norm-wise relative error the error budget ever demands (see sanitizer.numeric).
    """

    rtol: float
    atol: float
    max_bad_fraction: float
    budget_floor: float


@dataclass(frozen=True)
class ElementBound:
    """Each output element against the rounding error of its own computation: |out - ref| may be at most
    rtol * |ref| + tol * conditioning, for every element (no fraction of them may be out). `conditioning`
    (float64, the output's shape) is what that error scales with, `what` names it in a failure. `with_rms`:
    the rms-based bound with its cap on the fraction of elements outside it applies as well, where the
    rounding bound is loose (attention's with large scores in bfloat16). `floor`: an absolute term on top, for
    rounding that no relative model covers (float32 sums whose terms are subnormal)."""

    conditioning: torch.Tensor
    tol: float
    what: str
    with_rms: bool = False
    floor: float = 0.0


@dataclass
class Comparison:
    ok: bool
    rel_error: float  # ||out - ref|| / ||ref||, norm-wise
    bad_fraction: float
    first_bad_index: Optional[Tuple[int, ...]] = None
    observed: Optional[float] = None
    expected: Optional[float] = None
    reason: str = ""

    def describe(self) -> str:
        if self.ok:
            return f"rel_error={self.rel_error:.3g} bad_fraction={self.bad_fraction:.3g}"
        where = ""
        if self.first_bad_index is not None:
            where = (
                f" first bad index {list(self.first_bad_index)}: observed {self.observed!r}, expected {self.expected!r}"
            )
        return f"{self.reason}{where} (rel_error={self.rel_error:.3g}, bad_fraction={self.bad_fraction:.3g})"


@dataclass(frozen=True)
class Budget:
    """The error budget of one output against the float64 reference (Op.error_budget): the norm-wise error of
    the kernel judged and of a trusted one (the baseline) on the same inputs, and what is allowed: twice the
    trusted one's, never under the dtype's `budget_floor`."""

    error: float
    trusted_error: float
    allowed: float

    @property
    def ok(self) -> bool:
        return self.error <= self.allowed  # (a NaN error is over any budget)

    @property
    def used(self) -> float:
        return self.error / self.allowed


def first_index(mask: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """The index of the first True element of `mask` (row-major), or None: where a comparison points."""
    nz = torch.nonzero(mask.reshape(mask.shape), as_tuple=False)
    if nz.numel() == 0:
        return None
    return tuple(int(i) for i in nz[0].tolist())


def output_step(dtype: torch.dtype, on_gpu: bool = False) -> float:
    """The smallest step of a floating-point output dtype, its subnormal spacing (2^-24 for float16, 2^-133 for
    bfloat16, 2^-149 for float32). However exact a kernel's arithmetic, rounding its result to the output dtype
    moves it by up to half a step (round to nearest; one whole step leaves room for a kernel that truncates),
    which near zero no relative tolerance and no bound proportional to the inputs covers: an output of 3e-8
    rounds to float16's 0 or 6e-8. Zero for integer outputs, which are compared exactly.
    On a GPU, float32's smallest normal (2^-126) for float32 and bfloat16 outputs: Triton's exp2 and division
    compile to approximate instructions that flush float32 subnormals to zero (the baselines' own decode
    outputs of 1e-41 come out as 0 on the H100), and bfloat16's subnormals are float32's."""
    if not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    if on_gpu and info.tiny <= torch.finfo(torch.float32).tiny:
        return float(torch.finfo(torch.float32).tiny)
    return float(info.tiny) * float(info.eps)


RMS_MIN_ELEMENTS = 64  # outputs with fewer elements: the rms-based bound is floored at the rounding model


def _element_check(r: torch.Tensor, tol: Tolerance, element: ElementBound, step: float):
    """(bound, allowed fraction 0, how) of the element-wise rounding bound against the float64 reference r."""
    cond = element.conditioning.detach().to(r.device, torch.float64)
    bound = tol.rtol * r.abs() + element.tol * cond + step + element.floor
    floor = f" + {element.floor:.3g}" if element.floor else ""
    return bound, 0.0, f"rtol={tol.rtol:g}, {element.tol:.3g}*{element.what}, {step:.3g}{floor}"


def compare_tensor(
    out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str = "output", element: Optional[ElementBound] = None
) -> Comparison:
    """Compare one output tensor against a float64 reference with `tol`.

    With `element` (the op's bound on each element from its own computation: for a matmul the sum over k
    of |a_ik||b_kj|), no element may exceed its own bound, so a single corrupted element of a large
    output fails, where the fraction cap of the rms-based bound alone would let it through."""
    if not isinstance(out, torch.Tensor):
        return Comparison(False, math.inf, 1.0, reason=f"{name} is {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(
            False, math.inf, 1.0, reason=f"{name} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
        )
    o = out.detach().to(torch.float64)
    r = ref.detach().to(o.device, torch.float64)
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        idx = first_index(~finite)
        return Comparison(
            False,
            math.inf,
            float((~finite).double().mean()),
            idx,
            float(o[idx]),
            float(r[idx]),
            reason=f"{name} has non-finite values",
        )
    diff = (o - r).abs()
    step = output_step(out.dtype, on_gpu=out.is_cuda)
    ref_norm = float(r.norm())
    rel = float((o - r).norm()) / ref_norm if ref_norm > 0 else float(diff.max()) if diff.numel() else 0.0
    checks = [] if element is None else [_element_check(r, tol, element, step)]
    if element is None or element.with_rms:
        rms = float(r.pow(2).mean().sqrt()) if r.numel() else 0.0
        bound = tol.atol * rms + tol.rtol * r.abs() + step
        if element is not None and r.numel() < RMS_MIN_ELEMENTS:
            # a few elements' rms is no measure of their terms' size (a lone element whose terms cancel has an
            # rms far under them): there, never stricter than the rounding model
            bound = torch.maximum(bound, element.conditioning.detach().to(o.device, torch.float64) + step)
        checks.append((bound, tol.max_bad_fraction, f"rtol={tol.rtol:g}, atol={tol.atol:g}*rms, {step:.3g}"))
    frac = 0.0
    for bound, allowed, how in checks:
        bad = diff > bound
        frac = float(bad.double().mean()) if bad.numel() else 0.0
        if frac > allowed:
            idx = first_index(bad)
            return Comparison(
                False,
                rel,
                frac,
                idx,
                float(o[idx]),
                float(r[idx]),
                reason=f"{name}: {int(bad.sum())} element(s) ({frac:.3%}) outside tolerance ({how})",
            )
    return Comparison(True, rel, frac)


@dataclass(frozen=True)
class Distribution:
    name: str
    description: str


STANDARD_DISTRIBUTIONS = (
    Distribution("normal", "standard normal values"),
    Distribution("large", "large magnitudes (as large as the dtype allows without overflowing the output)"),
    Distribution("outliers", "normal values with 1% of elements 30x larger"),
    Distribution("equal_rows", "every row holds one repeated value (ties, uniform softmax)"),
    Distribution("tiny", "magnitudes at the bottom of the dtype's range: its smallest normals and its subnormals"),
    Distribution("integers", "whole numbers, each row within +-(2^k - 1) for its own k (ties, exact products)"),
)

# The exponents (base 2) a 'tiny' row's scale is drawn from, per dtype: float16 rows from its subnormals
# (2^-24 is its smallest, 6e-8) to just under its smallest normal (2^-14); bfloat16 and float32 rows from
# float32's subnormals (a float32 row max under 127 * 2^-126, 1.5e-36, gives a subnormal scale; under
# 127 * 2^-150 one that rounds to 0) to just past its smallest normal (2^-126, 1.2e-38). Each element is a
# standard normal value times its row's 2^e, so a row holds subnormals and zeros (values under the
# smallest subnormal round to 0) beside its larger values.
TINY_EXPONENTS = {torch.float16: (-24, -14), torch.bfloat16: (-146, -118), torch.float32: (-148, -118)}


def tiny_exponent_range(dtype: torch.dtype) -> Tuple[int, int]:
    return TINY_EXPONENTS.get(dtype, TINY_EXPONENTS[torch.float32])


def generator(seed: int, device: torch.device | str) -> Optional[torch.Generator]:
    if torch.device(device).type == "meta":
        return None  # meta tensors (shapes and strides for a compile, harness/bench/compile_probe.py) hold no values
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def fill(
    shape: Sequence[int],
    dist: str,
    gen: torch.Generator,
    device,
    scale: float = 1.0,
    row_dim=-1,
    dtype: torch.dtype = torch.float32,
    int_bits: int = 6,
) -> torch.Tensor:
    """Float32 values from a named distribution. `row_dim` (an int or a tuple) names the
    dims along which 'equal_rows' repeats a value; 'tiny' ignores `scale` and reads `dtype`
    (the dtype the values will be cast to): each last-dim row is scaled by 2^e, e drawn from
    tiny_exponent_range(dtype). 'integers' ignores `scale` too: each last-dim row holds whole numbers within
    +-(2^k - 1), k drawn per row from 1..int_bits, exact in every dtype. A kernel that takes a path of its own
    for whole numbers, powers of two or exact ties (x / scale landing on .5) meets one here; random normal
    values are never whole."""
    shape = tuple(int(s) for s in shape)
    if dist == "tiny":
        lo, hi = tiny_exponent_range(dtype)
        rows = shape[:-1] + (1,) if shape else ()
        e = torch.randint(lo, hi + 1, rows, generator=gen, device=device).to(torch.float64)
        x64 = torch.randn(shape, generator=gen, device=device).to(torch.float64) * torch.exp2(e)
        # float64 first: the cast to float32 rounds each value to float32's subnormals, not to zero
        return x64.to(torch.float32)
    if dist == "integers":
        rows = shape[:-1] + (1,) if shape else ()
        bound = torch.exp2(torch.randint(1, int_bits + 1, rows, generator=gen, device=device).float()) - 1
        u = torch.rand(shape, generator=gen, device=device) * 2 - 1
        return torch.round(u * bound)
    if dist in ("normal", "large"):
        x = torch.randn(shape, generator=gen, device=device) * scale
    elif dist == "outliers":
        x = torch.randn(shape, generator=gen, device=device) * scale
        pick = torch.rand(shape, generator=gen, device=device) < 0.01
        x = torch.where(pick, x * 30.0, x)
    elif dist == "equal_rows":
        reduced = list(shape)
        for d in row_dim if isinstance(row_dim, tuple) else (row_dim,):
            reduced[d] = 1
        x = (torch.randn(reduced, generator=gen, device=device) * scale).expand(shape).contiguous()
    else:
        raise ValueError(f"unknown distribution {dist!r}")
    return x


def strided_like(x: torch.Tensor, gen: Optional[torch.Generator], pad_value: float = float("nan")) -> torch.Tensor:
    """The same values as `x` in a non-contiguous view: each dim is padded inside a larger
    storage filled with `pad_value`, and the last two dims are transposed in memory.
    A kernel that ignores strides, or reads outside the view, sees garbage."""
    shape = list(x.shape)
    if x.dim() >= 2:
        perm = list(range(x.dim()))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        big_shape = [s + 1 for s in (shape[p] for p in perm)]
        storage = torch.full(big_shape, pad_value, dtype=x.dtype, device=x.device)
        view = storage[tuple(slice(0, shape[p]) for p in perm)]
        view.copy_(x.permute(perm))
        inv = [perm.index(i) for i in range(x.dim())]
        out = view.permute(inv)
    else:
        storage = torch.full([shape[0] * 2 + 1], pad_value, dtype=x.dtype, device=x.device)
        out = storage[1::2][: shape[0]]
        out.copy_(x)
    assert torch.equal(out.to(torch.float64).nan_to_num(), x.to(torch.float64).nan_to_num())
    return out


def fused_slice_like(x: torch.Tensor, pad_value: float = float("nan")) -> torch.Tensor:
    """The same values as `x` in the middle third of a tensor three times as wide in its last dim, as
    K is a slice of a fused QKV projection: the last stride is 1 but rows are 3 * D apart, with foreign
    values (`pad_value`) on both sides. A kernel that takes unit last stride to mean packed rows reads them."""
    n = x.shape[-1] if x.dim() else 1
    storage = torch.full((*x.shape[:-1], 3 * n), pad_value, dtype=x.dtype, device=x.device)
    out = storage[..., n : 2 * n]
    out.copy_(x)
    return out


def _pad_value(dtype: torch.dtype):
    """What fills the storage around a view: NaN for floats, the most negative code for integers."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def pair_slice_like(x: torch.Tensor) -> torch.Tensor:
    """The same values as `x` in the first half of a pair along a new dim 1: `kv[:, 0]` of a [T, 2, H, D] K/V
    tensor (vLLM's [num_blocks, 2, block_size, H, D] cache). The leading stride is twice what the other dims
    span, so rows are not H * stride(1) apart; the other half holds foreign values."""
    storage = torch.full((x.shape[0], 2, *x.shape[1:]), _pad_value(x.dtype), dtype=x.dtype, device=x.device)
    out = storage[:, 0]
    out.copy_(x)
    return out


def offset_like(x: torch.Tensor) -> torch.Tensor:
    """The same values as `x` in the second of two stacked copies, `kv_cache[1]` of vLLM's [2, num_blocks, ...]
    cache: a packed view that starts at a storage offset of x.numel() elements (the first copy holds foreign
    values). A kernel that takes its pointer for the start of the storage, or adds an offset of its own in
    int32, shows it."""
    storage = torch.full((2, *x.shape), _pad_value(x.dtype), dtype=x.dtype, device=x.device)
    out = storage[1]
    out.copy_(x)
    return out


def swapped_like(x: torch.Tensor) -> torch.Tensor:
    """The same values as `x` with the two dims before the last swapped in memory: attention's BSHD tensors
    seen as [B, H, S, D], a paged cache in the HND layout ([num_blocks, H, block_size, D]), a query [Hq, B, D];
    a matrix is transposed. The last dim stays unit-stride."""
    if x.dim() < 2:
        return x
    i, j = (x.dim() - 3, x.dim() - 2) if x.dim() >= 3 else (0, 1)
    storage = x.transpose(i, j).contiguous()
    return storage.transpose(i, j)


def expanded_like(x: torch.Tensor, dim: int) -> torch.Tensor:
    """`x`'s first slice along `dim` broadcast over that dim: a view with stride 0 there, as `expand` makes
    (one key head serving every query head, a bias row repeated down a matrix). Its values are that slice's,
    repeated; a kernel that takes a zero stride for a packed tensor, or branches on it, shows it."""
    if x.dim() == 0 or x.shape[dim] == 0:
        return x
    return x.narrow(dim, 0, 1).expand(x.shape)


# The custom sm_scale the attention ops' contracts admit (those with an `sm_scale` argument), which the property
# tests draw log-uniformly: a kernel that branches on a small or large scale is met on both sides.
SM_SCALE_RANGE = (1e-3, 10.0)
SM_SCALE_LIMIT = "1e-3..10 (drawn log-uniformly; default 1/sqrt(D))"


def sm_scale_strategy():
    """A hypothesis strategy of custom sm_scale values, log-uniform over SM_SCALE_RANGE: every decade of the
    contract's range as likely as any other (a uniform draw over [0.05, 1.5] never met a kernel that changes
    its arithmetic under 0.05)."""
    from hypothesis import strategies as st  # deferred: only the sanitizer's property checks draw scales

    lo, hi = (math.log10(x) for x in SM_SCALE_RANGE)
    return st.floats(lo, hi).map(lambda e: float(10.0**e))


# Layouts every check draws; DOMAIN_LAYOUTS adds the views the domain check and the property tests draw as
# well (the contract admits any strides). EXPANDED, the stride-0 views, applies to the inputs an op lists in
# Op.expandable only (an output, or a cache that is written in place, cannot be a broadcast view).
LAYOUTS = ("contiguous", "strided", "fused")
DOMAIN_LAYOUTS = LAYOUTS + ("pair", "bshd", "offset")
EXPANDED = "expanded"


def relaid(x: torch.Tensor, layout: str, gen: Optional[torch.Generator]) -> torch.Tensor:
    """`x`'s values in the view a layout names (strided_like, fused_slice_like, pair_slice_like, swapped_like,
    offset_like)."""
    if layout == "strided":
        return strided_like(x, gen)
    if layout == "fused":
        return fused_slice_like(x)
    if layout == "pair":
        return pair_slice_like(x)
    if layout == "bshd":
        return swapped_like(x)
    if layout == "offset":
        return offset_like(x)
    return x


@dataclass(frozen=True)
class Region:
    """One region of an op's domain that the sanitizer draws a case from. `where`: "cpu" when Triton's
    interpreter can afford it (few programs: a long context or a large page at a tiny batch and head count),
    "gpu" when only the device can (pools past 2^31 elements, long contexts at serving batch sizes). `dist`: the
    distribution of its values, one of the op's `distributions` or `region_distributions` (a long context
    needs keys that carry the attention from far positions: random values average a dropped tail away).
    `args`: arguments set to a value the region names (an sm_scale of 1/D, as muP models pass), over the drawn ones.
    `budget`: the CPU check also holds the output to the error budget (twice the baseline's error on the same
    inputs), where the contract's per-element bound is too loose to see a fault alone (a matmul's bound grows
    with K: at K = 32768 an output 6% off in norm, the last K tile dropped, is inside it). The GPU's regions
    always are."""

    name: str
    shape: Shape
    layout: str = "contiguous"
    where: str = "cpu"
    dist: str = "normal"
    args: Tuple[Tuple[str, Any], ...] = ()
    budget: bool = False

    def set_args(self, case: "Case") -> "Case":
        """The case with the arguments this region names set (the drawn case when it names none)."""
        case.args.update(dict(self.args))
        return case


@dataclass(frozen=True)
class ValueDim:
    """An integer dimension a compared value may be drawn as (Op.value_regions): the shape field it sets (or
    a derived one the op maps in with_value), the contract's range, and the largest value Triton's
    interpreter affords at the op's value_base shape (larger ones are drawn on the GPU)."""

    name: str
    lo: int
    hi: int
    cpu_hi: int


@dataclass(frozen=True)
class Domain:
    """The inputs an op's contract admits, stated once: `limits` (what docs/SANITIZER.md and reports print: each
    dimension's range, the views, the magnitudes, the dtypes) and `regions`, the cases that reach each corner
    of it (the sanitizer's domain checks draw every one of them, on the CPU or on the GPU)."""

    limits: Tuple[Tuple[str, str], ...]
    regions: Tuple[Region, ...]

    def on(self, where: str) -> List[Region]:
        return [r for r in self.regions if r.where == where]


# Magnitudes and views every op's domain admits (each op adds its dimensions).
COMMON_LIMITS = (
    ("dtypes", "float16, bfloat16, float32 (bfloat16 values in float32 tensors on the CPU)"),
    (
        "views",
        "contiguous; strided (padded, last two dims transposed); a fused-QKV slice (rows 3x apart); "
        "a pair slice (`kv[:, 0]` of [T, 2, ...]); BSHD / HND (the dims before the last swapped); "
        "at a storage offset (`kv[1]` of [2, T, ...]); "
        "broadcast (stride-0) views of the inputs each op names (Op.expandable)",
    ),
    (
        "magnitudes",
        "normal, large (as large as the output allows), 30x outliers, equal rows, tiny (fp16 subnormals; "
        "float32 and bfloat16 down to float32's subnormals)",
    ),
)


class ReferenceUnavailable(RuntimeError):
    """A reference anchor that cannot run here (not installed, unsupported shape): one line, shown in its row."""


class Anchor(NamedTuple):
    """A torch computation the benchmark times beside the kernels: `fn` takes the case's arguments."""

    label: str  # 'anchor:<name>'
    fn: Callable[..., Any]


class IntegerChange(NamedTuple):
    """One change to an op's integer inputs (Op.integer_changes): what it does, and a function that applies it in
    place to a case's arguments."""

    what: str
    apply: Callable[[Dict[str, Any]], None]


@dataclass
class Case:
    """One concrete invocation: the inputs and how they were made (for reproduction)."""

    op: str
    shape: Shape
    dtype: torch.dtype
    seed: int
    dist: str
    layout: str  # one of DOMAIN_LAYOUTS
    args: Dict[str, Any]  # positional inputs in contract order, then keyword inputs

    def describe(self) -> str:
        extra = f" sm_scale={self.args['sm_scale']:.6g}" if self.args.get("sm_scale") is not None else ""
        return (
            f"op={self.op} shape={self.shape.key()} dtype={DTYPE_NAMES.get(self.dtype, self.dtype)} "
            f"seed={self.seed} dist={self.dist} layout={self.layout}{extra}"
        )

    def call(self, fn: Callable):
        return fn(**self.args)


class Op:
    """Base class for an op definition. Subclasses fill in the class attributes and methods."""

    name: str = ""
    contract: str = ""  # the op's signature block, shown to models and in errors
    arg_names: Tuple[str, ...] = ()  # positional parameters, in order
    optional_args: Tuple[str, ...] = ()  # keyword parameters with defaults
    output_names: Tuple[str, ...] = ("o",)
    dtypes: Tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
    distributions: Tuple[Distribution, ...] = STANDARD_DISTRIBUTIONS
    # Distributions only the domain's regions draw (Region.dist), for a corner the standard ones cannot show:
    # not drawn by the checks that go over every distribution.
    region_distributions: Tuple[Distribution, ...] = ()
    shape_cls: type = Shape
    anchor_name: str = ""
    # The label of the torch anchor when it is also a servable implementation of the contract (see
    # torch_impl); "" when the anchor only times an ideal the contract cannot serve (a paged cache
    # gathered ahead of time).
    torch_label: str = ""
    # What the built-in search tunes: the launch-configuration space of the baseline's `_config` (see
    # tuning.py and config_args). None: the search has nothing to propose for the op.
    tuning_space: Optional["Space"] = None
    # The op reads its large inputs exactly once (a paged cache, a tensor to quantize): the search then also
    # proposes an evict-first cache hint on those loads, so that they do not push reusable lines out of L2.
    streaming: bool = False
    # What the contract's own check demands when that check is exact (compare() decides correctness outright,
    # and output_error has nothing to measure): the error budget against the baseline then does not apply.
    # "" for ops compared within a tolerance of the float64 reference.
    exact_check: str = ""

    # -- shapes -------------------------------------------------------------------------
    def shapes(self, suite: str) -> List[Shape]:
        suites = self.shape_suites()
        if suite not in suites:
            raise ValueError(f"unknown shape suite {suite!r} for {self.name}; expected one of {', '.join(suites)}")
        return list(suites[suite])

    def shape_suites(self) -> Mapping[str, Sequence[Shape]]:
        raise NotImplementedError

    def parse_shape(self, text: str) -> Shape:
        """Parse 'a,b,c' (positional, in field order) or 'k=v,...' into a shape."""
        fields = [f for f in dataclasses.fields(self.shape_cls)]
        parts = [p.strip() for p in text.split(",") if p.strip()]
        values: Dict[str, Any] = {}
        for i, p in enumerate(parts):
            if "=" in p:
                k, v = p.split("=", 1)
            elif i < len(fields) and fields[i].type in ("int", int) and p.lstrip("-").isdigit():
                k, v = fields[i].name, p  # a bare word is a flag's name wherever it stands (`ragged,full_table`)
            else:
                k, v = p, "1"
            names = {f.name: f for f in fields}
            if k not in names:
                raise ValueError(f"{self.name}: unknown shape field {k!r} in {text!r}; fields are {', '.join(names)}")
            f = names[k]
            if f.type in ("bool", bool):
                values[k] = v.lower() in ("1", "true", "yes")
                continue
            try:
                values[k] = int(v)
            except ValueError:
                raise ValueError(f"{self.name}: {k} must be a whole number in {text!r}, got {v.strip()!r}") from None
            if values[k] < 1:  # every int field of a shape is a size
                raise ValueError(f"{self.name}: {k} must be at least 1 in {text!r}, got {values[k]}")
        missing = [
            f.name
            for f in fields
            if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(
                f"{self.name}: incomplete shape {text!r}: missing {', '.join(missing)} (fields: "
                f"{', '.join(f.name for f in fields)})"
            )
        return self.shape_cls(**values)

    def shape_strategy(self):
        """A hypothesis strategy of interpreter-sized shapes (odd sizes, 1, block sizes +-1)."""
        raise NotImplementedError

    def bucket(self, shape: Shape) -> str:
        """The shape bucket used for promotion and dispatch."""
        raise NotImplementedError

    def shape_of(self, args: Mapping[str, Any]) -> Shape:
        """Recover the shape record from concrete inputs (used by the serving dispatcher)."""
        raise NotImplementedError

    # -- inputs -------------------------------------------------------------------------
    def make_case(
        self,
        shape: Shape,
        dtype: torch.dtype,
        seed: int = 0,
        dist: str = "normal",
        layout: str = "contiguous",
        device="cpu",
    ) -> Case:
        if dist not in {d.name for d in self.distributions + self.region_distributions}:
            raise ValueError(f"{self.name}: unknown distribution {dist!r}")
        if dtype not in self.dtypes:
            raise ValueError(f"{self.name}: unsupported dtype {dtype}")
        gen = generator(seed, device)
        args = self._make_args(shape, dtype, gen, dist, device)
        if layout in ("strided", "fused"):
            args = {
                k: (
                    relaid(v, layout, gen)
                    if isinstance(v, torch.Tensor)
                    and v.is_floating_point()
                    and v.dim() >= 1
                    and k not in self.keep_contiguous()
                    else v
                )
                for k, v in args.items()
            }
        elif layout in ("pair", "bshd", "offset"):  # int8 caches too: laid out as their float twins
            args = {
                k: (
                    relaid(v, layout, gen)
                    if isinstance(v, torch.Tensor)
                    and v.dim() >= 2
                    and (v.is_floating_point() or v.dtype == torch.int8)
                    and k not in self.keep_contiguous()
                    else v
                )
                for k, v in args.items()
            }
        elif layout == EXPANDED or layout.startswith(EXPANDED + ":"):
            args = self._expanded_args(args, layout)
        elif layout.startswith("strided:"):  # one input in the strided view, int8 included; the others packed
            name = layout.split(":", 1)[1]
            v = args.get(name)
            if not (isinstance(v, torch.Tensor) and (v.is_floating_point() or v.dtype == torch.int8)):
                raise ValueError(f"{self.name}: layout {layout!r} names no float or int8 input")
            args = dict(args, **{name: strided_like(v, gen, _pad_value(v.dtype))})
        elif layout in self.joint_layouts:
            args = self.joint_layout_args(args, layout)
        elif layout != "contiguous":
            raise ValueError(
                f"unknown layout {layout!r}; expected one of {', '.join(self.layouts())}, "
                "strided:NAME, expanded:NAME:DIM"
            )
        return Case(self.name, shape, dtype, seed, dist, layout, args)

    def keep_contiguous(self) -> Tuple[str, ...]:
        return ()

    # The inputs the contract admits as broadcast (stride-0) views, each with the dim the "expanded" layout
    # broadcasts it over; "expanded:NAME:DIM" broadcasts one input over another dim. Empty: none.
    expandable: Tuple[Tuple[str, int], ...] = ()

    # Layouts that relate several inputs (views of one storage), each built by joint_layout_args. Empty: none.
    joint_layouts: Tuple[str, ...] = ()

    def joint_layout_args(self, args: Dict[str, Any], layout: str) -> Dict[str, Any]:
        raise ValueError(f"{self.name}: no joint layout {layout!r}")

    def layouts(self) -> Tuple[str, ...]:
        """Every view this op's contract admits, by layout name (DOMAIN_LAYOUTS, and EXPANDED where it has
        expandable inputs, and its joint layouts)."""
        return DOMAIN_LAYOUTS + ((EXPANDED,) if self.expandable else ()) + self.joint_layouts

    def _expanded_args(self, args: Dict[str, Any], layout: str) -> Dict[str, Any]:
        pairs = list(self.expandable)
        if layout != EXPANDED:
            _, name, dim = (layout.split(":") + ["", ""])[:3]
            pairs = [(name, int(dim))] if dim.lstrip("-").isdigit() else []
        names = {n for n, _ in self.expandable}
        if not pairs or any(n not in names for n, _ in pairs):
            raise ValueError(
                f"{self.name}: layout {layout!r}: the contract admits broadcast views of "
                f"{', '.join(sorted(names)) or 'no input'} only"
            )
        return dict(args, **{n: expanded_like(args[n], d) for n, d in pairs})

    def domain(self) -> Domain:
        """The contract's domain and the regions that reach its corners (see Domain)."""
        return Domain(COMMON_LIMITS, ())

    # The integer dimensions a value the candidate compares against is drawn as (value_regions)
    value_dims: Tuple["ValueDim", ...] = ()

    def one_tiny_shape(self) -> Shape:
        """The tiny shape a check draws on where one shape suffices (the run check; every distribution in each
        dtype, on the CPU and on the device): the third of the tiny suite, past the first tile in most ops."""
        tiny = self.shapes("tiny")
        return tiny[2 % len(tiny)]

    def value_base(self) -> Shape:
        """The tiny shape a compared value is drawn into, one dimension at a time."""
        return self.shapes("tiny")[0]

    def with_value(self, base: Shape, dim: str, value: int) -> Shape:
        """`base` with dimension `dim` set to `value` (an op maps a derived dimension, the GQA group, here)."""
        return dataclasses.replace(base, **{dim: value})

    def joint_regions(self, joints: Sequence[Mapping[str, int]]) -> List[Region]:
        """A case per group of sizes one condition compares together, where the names it compares are the
        op's dimensions (by name, any case: `H`, `d`, `group`), all set at once in value_base."""
        dims = {d.name.lower(): d for d in self.value_dims}
        out = []
        for joint in joints:
            picked = {dims[n.lower()]: v for n, v in joint.items() if n.lower() in dims}
            if len(picked) < 2 or not all(d.lo <= v <= d.hi for d, v in picked.items()):
                continue
            shape = self.value_base()
            for d, v in picked.items():
                shape = self.with_value(shape, d.name, v)
            cpu = all(v <= d.cpu_hi for d, v in picked.items())
            out.append(
                Region(", ".join(f"{d.name}={v}" for d, v in picked.items()), shape, where="cpu" if cpu else "gpu")
            )
        return out

    def value_regions(self, values: Sequence[int]) -> List[Region]:
        """A case per (value, dimension of value_dims that admits it): the sizes a candidate's comparisons
        name (sanitizer/compared.py), each drawn where it flips them; on the CPU up to the dimension's
        cpu_hi, past it on the GPU."""
        base, out, seen = self.value_base(), [], set()
        for v in values:
            for d in self.value_dims:
                if d.lo <= v <= d.hi:
                    shape = self.with_value(base, d.name, v)
                    if shape not in seen:
                        seen.add(shape)
                        out.append(Region(f"{d.name}={v}", shape, where="cpu" if v <= d.cpu_hi else "gpu"))
        return out

    def branch_pool(self) -> List[Region]:
        """Extra cases the host-branch coverage check may try, in order, to take a host-code branch the other
        checks (the domain's regions among them) never took: one input at a time in a strided view, each tiny
        shape in every view, then each near-serving shape. An op puts its cheap corners (empty inputs) first."""
        tiny = self.shapes("tiny")
        # one input at a time in the strided view (int8 caches too, which the other draws keep packed), each in
        # float16 then float32: a condition on one input's strides (`k.stride(-1) == 1 and v.stride(-1) == 1`)
        # takes each of its sides only when the others are packed
        probe = self.make_case(tiny[3 % len(tiny)], torch.float32)
        names = [
            k
            for k, v in probe.args.items()
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and (v.is_floating_point() or v.dtype == torch.int8)
        ]
        one = [
            Region(f"{tiny[3 % len(tiny)].key()} {name} strided", tiny[3 % len(tiny)], f"strided:{name}")
            for name in names
            for _ in range(2)
        ]
        extra = [Region(f"{s.key()} {layout}", s, layout) for layout in self.layouts() for s in tiny]
        return one + extra + [Region(s.key(), s) for s in self.shapes("near_serving")]

    def drawn_in_bucket(self, points: Sequence[Shape], rng: random.Random, dtype: torch.dtype) -> Optional[Shape]:
        """A shape drawn at random inside the bucket of `points` (a bucket's benchmark points), for a promotion to
        time beside them: a kernel fast only at the exact benchmark point (a config chosen on one block-table
        width) is then timed where it is slow. Around one point drawn among them, each size in turn (in a
        random order) is drawn below its value there, down to three quarters, where a value keeps the shape
        in the bucket and one the op takes (a GQA group stays whole); sizes the bucket names (a head dim, a
        page under 16) stay. Kept only where it holds at least half the point's work: it costs no more device
        time than the point and is not a launch-bound toy. None when no such shape is found."""
        point = rng.choice(list(points))
        work = self._work(point, dtype)
        sizes = [f.name for f in dataclasses.fields(point) if type(getattr(point, f.name)) is int]
        for _ in range(20):
            shape = point
            for name in rng.sample(sizes, len(sizes)):
                v = getattr(point, name)
                lo = min(v - 1, (3 * v + 3) // 4)
                values = sorted({rng.randrange(lo, v) for _ in range(32)}) if v >= 2 else []
                rng.shuffle(values)
                shape = next(
                    (s for s in (dataclasses.replace(shape, **{name: x}) for x in values) if self._in_bucket(s, point)),
                    shape,
                )
            if shape not in points and self._work(shape, dtype) >= 0.5 * work:
                return shape
        return None

    def _in_bucket(self, shape: Shape, point: Shape) -> bool:
        """Whether `shape` lies in `point`'s bucket and the op takes it (its inputs can be made)."""
        if self.bucket(shape) != self.bucket(point):
            return False
        try:
            self.make_case(shape, self.dtypes[0], device="meta")
        except ValueError:
            return False
        return True

    def _work(self, shape: Shape, dtype: torch.dtype) -> float:
        """What bounds a shape's time: its FLOPs when compute-bound, else the bytes it moves."""
        return self.flops(shape) if self.bound(shape) == "compute" else self.bytes(shape, dtype)

    def _make_args(self, shape, dtype, gen, dist, device) -> Dict[str, Any]:
        raise NotImplementedError

    def integer_changes(self, args: Mapping[str, Any], gen: torch.Generator) -> List[IntegerChange]:
        """Changes to the integer inputs whose values the output depends on by contract (a block table, the
        lengths), each to be applied in place to a fresh copy of `args` (the input-sensitivity check judges the
        output on each against the reference of the changed inputs). None where the op has no such input."""
        return []

    def class_corners(self, args: Mapping[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
        """(what, inputs) of the same shape class as `args` (every tensor's shape, stride and dtype as they are:
        the serving guard's key) whose integer values reach the corners that class admits, for the serving guard
        to verify a class on besides its first call: a kernel wrong only on values the first call never held (a
        sequence that fills its table, a page id past what the drawn pools hold) is then wrong there too. Each
        is a new dict; the tensors it changes are new, the others `args`'s own, which it may write only where the
        call `args` reads nothing (the guard passes its private copies). None where the op's output reads no
        integer input."""
        return []

    def readable(self, args: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
        """Bool masks (same shape as the input) of the elements a kernel may read.
        Inputs not named here may be read anywhere inside their extent."""
        return {}

    # -- references ---------------------------------------------------------------------
    def reference(self, args: Mapping[str, Any], precision: torch.dtype = torch.float32):
        """The PyTorch reference computed in `precision` (float32 or float64) on the inputs'
        device. Returns the output(s) in `precision`; the comparison casts."""
        raise NotImplementedError

    def compare(self, out, args: Mapping[str, Any], ref64=None) -> Comparison:
        if ref64 is None:
            ref64 = self.reference(args, torch.float64)
        dtype = self.output_dtype(args)
        if isinstance(out, torch.Tensor) and out.dtype != dtype:
            return Comparison(False, math.inf, 1.0, reason=f"output dtype {out.dtype}, expected {dtype}")
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref64.shape):
            return compare_tensor(out, ref64, self.tolerance(dtype))  # (says what is wrong with it)
        return compare_tensor(out, ref64, self.tolerance(dtype), element=self.element_bounds(args))

    def element_bounds(self, args: Mapping[str, Any]) -> Optional[ElementBound]:
        """Where the op can bound each output element by the rounding of its own computation, that bound, so
        that no element may be out of it; None: the rms-based bound with its cap on the fraction of elements
        outside it."""
        return None

    def output_dtype(self, args: Mapping[str, Any]) -> torch.dtype:
        return args[self.arg_names[0]].dtype

    def output_error(self, out, ref64) -> float:
        """Norm-wise relative error of `out` against the float64 reference (error budget)."""
        o = out.detach().to(torch.float64)
        r = ref64.detach().to(o.device, torch.float64)
        n = float(r.norm())
        return float((o - r).norm()) / n if n > 0 else float((o - r).abs().max())

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        return TOLERANCES[dtype]

    def error_budget(self, out, trusted, ref64, dtype: torch.dtype) -> Budget:
        """The error budget of `out` against `trusted` (each an op's output: its first tensor is measured) on
        the same inputs, `ref64` their reference, `dtype` the one whose floor applies. The sanitizer's CPU and
        GPU checks and the serving guard all judge by it."""

        def first(o):
            return o[0] if isinstance(o, (tuple, list)) else o

        err, err_trusted = self.output_error(first(out), first(ref64)), self.output_error(first(trusted), first(ref64))
        return Budget(err, err_trusted, max(2.0 * err_trusted, self.tolerance(dtype).budget_floor))

    # -- the torch implementation ---------------------------------------------------------
    def torch_impl(self) -> Optional[Callable[..., Any]]:
        """A function with the op's signature that computes the contract with torch alone (cuBLAS, SDPA,
        torch.compile), or None where torch has no such function. It is trusted without sanitizing: it is
        the reference library. The serving set dispatches to it where it is the fastest, the benchmark
        times it as the anchor, and a promotion must beat it."""
        return None

    def reference_anchors(self, case: Case) -> List[Anchor]:
        """What serving engines run for this op, timed beside the kernels by `bench --op` as a reference point
        and never served or held against a candidate (e.g. FlashInfer's paged decode). An anchor that cannot
        run here raises ReferenceUnavailable with one line; the bench shows that line in its row."""
        return []

    def bench_anchor(self, case: Case) -> Optional[Anchor]:
        """For an op without a torch implementation (torch_impl is None): what the benchmark times as the torch
        anchor of `case`, an ideal torch computes only after preparing the inputs outside the timing (a paged
        cache gathered ahead of time). None where the op has no such anchor."""
        return None

    # -- the built-in search ----------------------------------------------------------------
    def config_args(self, shape: Shape, device) -> tuple:
        """The arguments the baseline's wrapper (kernels/baseline/<name>.py) passes its `_config` for
        `shape` on `device`: the search calls `_config` with them to find the tuple a shape uses."""
        raise NotImplementedError

    # -- cost model ---------------------------------------------------------------------
    def flops(self, shape: Shape) -> float:
        raise NotImplementedError

    def bytes(self, shape: Shape, dtype: torch.dtype) -> float:
        """Fewest bytes the op must move through device memory (inputs read once, outputs written once)."""
        raise NotImplementedError

    def bound(self, shape: Shape) -> str:
        """'compute' or 'memory': which ceiling the roofline fraction is taken against."""
        return "memory"


# Element-wise policy per output dtype. fp32 allows for tf32 dot products on the GPU
# (Triton's default for a float32 tl.dot), which the interpreter does not emulate. rtol is 8-10 times the
# output's own rounding in its normal range (float16 2^-11 = 4.9e-4, bfloat16 2^-8 = 3.9e-3; float32 outputs
# of TF32 dots take float16's); under the normal range output_step covers that rounding instead.
TOLERANCES: Dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(rtol=5e-3, atol=5e-3, max_bad_fraction=1e-4, budget_floor=1e-5),
    torch.float16: Tolerance(rtol=5e-3, atol=5e-3, max_bad_fraction=1e-4, budget_floor=2e-3),
    torch.bfloat16: Tolerance(rtol=3e-2, atol=3e-2, max_bad_fraction=1e-4, budget_floor=1.5e-2),
}


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values representable in `dtype`, kept in float32 (used to feed bf16 data through
    float32 kernels in the interpreter, whose bf16 arithmetic is broken)."""
    return x.to(dtype).to(torch.float32)

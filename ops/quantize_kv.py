"""quantize_kv(x) -> (x_q, scale): per-token, per-head symmetric int8 quantization."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Tuple

import torch

from .common import COMMON_LIMITS, Comparison, Distribution, Domain, Op, Region, Shape, ValueDim, fill, first_index
from .tuning import Space

CONTRACT = """quantize_kv(x) -> (x_q, scale)
  x: [T, H, D] float16 | bfloat16 | float32, any strides (a slice of a fused
  QKV tensor, whose rows are further apart than D, included; a broadcast view
  with stride 0, as `expand` makes, too: x is only read); any row length
  1 <= D <= 4096, else ValueError naming the limit. scale: float32 [T, H] =
  max_d |x[t, h, d]| / 127. x_q: int8 [T, H, D] = x / scale rounded to nearest
  (either tie rule), clamped to [-127, 127]. A row whose max is 0 gives scale 0
  (no NaN). Check, on what a consumer reads (x_q * scale): scale matches to
  float32 rounding; every element satisfies |x_q * scale - x| <= scale / 2 (plus
  float32 slack); a row whose scale is 0 dequantizes to 0 whatever its codes in
  [-127, 127] (the baseline writes 0 there).
  Tiny magnitudes (fp16 subnormals, float32 and bfloat16 rows down to float32's
  subnormals) are in the domain. scale is float32, so a row max under 127 * 2^-126
  (1.5e-36) gives a subnormal scale, and one under 127 * 2^-150 a scale of 0 (as a
  zero row); the codes are x divided by the scale returned, so a code may be
  clamped at +-127 where x / scale is past 127. No inf or NaN anywhere: 127 / max
  overflows float32 for a max under 3.7e-37, which gives wrong codes for a row
  whose scale is subnormal but not 0."""


def quantize_eager(x: torch.Tensor):
    """The contract in eager torch: scale = row max / 127 in float32, codes rounded and clamped."""
    xf = x.float()
    scale = xf.abs().amax(-1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.clamp(torch.round(xf / safe[..., None]), -127, 127).to(torch.int8), scale


_compiled_quantize = None


def torch_quantize_kv(x: torch.Tensor):
    """The contract through torch.compile of the eager quantizer on a GPU (one fused kernel; compiled on
    the first call), the eager quantizer elsewhere."""
    global _compiled_quantize
    if not x.is_cuda:
        return quantize_eager(x)
    if _compiled_quantize is None:
        _compiled_quantize = torch.compile(quantize_eager)
    return _compiled_quantize(x)


FLOAT32_SUBNORMAL = 2.0**-149  # float32's smallest subnormal: one ulp of a subnormal scale


@dataclass(frozen=True)
class QuantizeShape(Shape):
    T: int
    H: int
    D: int


class QuantizeKV(Op):
    name = "quantize_kv"
    contract = CONTRACT
    arg_names = ("x",)
    output_names = ("x_q", "scale")
    shape_cls = QuantizeShape
    anchor_name = "torch.compile of the eager quantizer"
    torch_label = "anchor:torch.compile"
    # the kernel stages nothing in shared memory (one load, one reduction per row), so every pair is valid
    tuning_space = Space(("BLOCK_R", "num_warps"), ((4, 8, 16, 32, 64, 128), (1, 2, 4, 8)), lambda c, s: True)
    streaming = True
    exact_check = "every code within half a step"

    # x is only read: a broadcast view (one head's rows for every head, one token for every token) is admitted
    expandable = (("x", 1),)

    def torch_impl(self):
        return torch_quantize_kv

    distributions = (
        Distribution("normal", "standard normal values"),
        Distribution("large", "magnitudes near the dtype's maximum"),
        Distribution("outliers", "normal values with 1% of elements 30x larger"),
        Distribution("equal_rows", "every row holds one repeated value (every element hits +-127)"),
        Distribution("zero_rows", "a third of the rows are all zero (scale 0, no NaN)"),
        Distribution("tiny", "rows at the bottom of the dtype's range: subnormal values, subnormal scales"),
        Distribution("integers", "rows of whole numbers within +-(2^k - 1), k per row (exact codes and ties)"),
    )

    def config_args(self, shape: QuantizeShape, device) -> tuple:
        return (shape.D,)

    def shape_suites(self):
        S = QuantizeShape
        return {
            "tiny": [S(1, 1, 1), S(7, 3, 16), S(33, 2, 64), S(5, 1, 127), S(16, 8, 128), S(3, 5, 129)],
            # the many-rows cheat's shape; a 576-wide latent cache (MLA); the longest rows of the contract
            "near_serving": [S(4096, 8, 128), S(64, 2, 576), S(8, 2, 4096)],
            # K or V rows of 8 heads of 128, and the 576-wide latent cache of multi-head latent attention
            "serving": [S(65536, 8, 128), S(65536, 1, 576)],
        }

    def shape_strategy(self):
        """Odd row lengths around the block sizes, and long rows (300 to 4096, a 576-wide latent cache among
        them) in few of them: the interpreter's cost grows with the elements, and a row's reduction is what
        long rows test. The lengths reach every row tile (1 to 4096 lanes) and so every rows-per-program
        choice of the baseline's host code."""
        from hypothesis import strategies as st  # deferred: only the sanitizer's property checks draw shapes

        @st.composite
        def shapes(draw):
            D = draw(
                st.sampled_from(
                    [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 256, 300, 576, 1000, 1024, 2047, 4095, 4096]
                )
            )
            if D > 256:
                return QuantizeShape(draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2])), D)
            return QuantizeShape(
                draw(st.sampled_from([1, 2, 7, 16, 17, 33, 100])), draw(st.sampled_from([1, 2, 3, 8])), D
            )

        return shapes()

    value_dims = (ValueDim("D", 1, 4096, 4096), ValueDim("T", 0, 1 << 24, 65536), ValueDim("H", 0, 1024, 1024))

    def value_base(self) -> QuantizeShape:
        return QuantizeShape(33, 3, 16)  # 99 rows: several programs whatever rows a program takes at the size

    def domain(self) -> Domain:
        """The K half of a [T, 2, H, D] K/V tensor (rows not H * stride(1) apart), a [H, T, D] tensor seen as
        [T, H, D], on the CPU; a tensor past 2^31 elements on the GPU."""
        S = QuantizeShape
        cpu = [
            Region("kv[:, 0] of a [T, 2, H, D] tensor", S(7, 3, 16), "pair"),
            Region("kv[:, 0], rows of 128", S(33, 2, 128), "pair"),
            Region("[H, T, D] seen as [T, H, D]", S(17, 3, 64), "bshd"),
            Region("one head's rows broadcast over the heads (stride 0)", S(7, 3, 16), "expanded"),
            Region("one token broadcast over the tokens (stride 0)", S(9, 2, 33), "expanded:x:0"),
            Region("x at a storage offset (kv[1] of [2, T, H, D])", S(7, 3, 16), "offset"),
            # real shapes at proxy extents: 24 to 48 heads, rows of 512
            Region("48 heads", S(3, 48, 16)),
            Region("rows of 512", S(2, 3, 512)),
            Region("rows of 192", S(5, 3, 192)),
        ]
        gpu = [
            Region("x past 2^31 elements", S(2097159, 1, 1024), where="gpu"),
            Region("kv[:, 0] at serving rows", S(65536, 8, 128), "pair", where="gpu"),
            Region("640000 rows of 40 heads", S(16000, 40, 128), where="gpu"),
            Region("rows of 512 at 24 heads", S(8192, 24, 512), where="gpu"),
        ]
        limits = (("row length D", "1..4096"), ("T x H", "0.. (past 2^31 elements on the GPU)")) + COMMON_LIMITS
        return Domain(limits, tuple(cpu + gpu))

    def branch_pool(self):
        S = QuantizeShape
        return [Region("no rows", S(0, 2, 16)), Region("no heads", S(3, 0, 16))] + super().branch_pool()

    def bucket(self, shape: QuantizeShape) -> str:
        return f"{'tsmall' if shape.T * shape.H <= 4096 else 'tlarge'}-d{shape.D}"

    def shape_of(self, args: Mapping[str, Any]) -> QuantizeShape:
        T, H, D = (int(s) for s in args["x"].shape)
        return QuantizeShape(T, H, D)

    def _make_args(self, shape: QuantizeShape, dtype, gen, dist, device) -> Dict[str, Any]:
        shp = (shape.T, shape.H, shape.D)
        if dist == "zero_rows":
            x = fill(shp, "normal", gen, device)
            zero = torch.rand(shape.T, shape.H, generator=gen, device=device) < 1 / 3
            x = torch.where(zero[..., None], torch.zeros_like(x), x)
        elif dist == "large":
            fmax = min(torch.finfo(dtype).max, 1e30)
            x = fill(shp, "normal", gen, device, fmax / 8)
        else:
            x = fill(shp, dist, gen, device, 1.0, row_dim=-1, dtype=dtype)
        return {"x": x.to(dtype)}

    def output_dtype(self, args):
        return torch.int8

    def reference(self, args, precision=torch.float32):
        x = args["x"].detach().to(precision)
        amax = x.abs().amax(dim=-1)
        scale = (amax.to(torch.float32) / 127.0).to(precision)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        x_q = torch.clamp(torch.round(x / safe[..., None]), -127, 127)
        return x_q.to(torch.int8), scale.to(torch.float32)

    def compare(self, out, args, ref64=None) -> Comparison:
        """The contract's own check: exact scales, and every code within half a step of the scale returned."""
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            return Comparison(False, math.inf, 1.0, reason=f"expected a (x_q, scale) tuple, got {type(out).__name__}")
        x_q, scale = out
        x = args["x"]
        T, H, D = x.shape
        for name, t, dt, shp in (("x_q", x_q, torch.int8, (T, H, D)), ("scale", scale, torch.float32, (T, H))):
            if not isinstance(t, torch.Tensor):
                return Comparison(False, math.inf, 1.0, reason=f"{name} is not a tensor")
            if t.dtype != dt or tuple(t.shape) != shp:
                return Comparison(
                    False, math.inf, 1.0, reason=f"{name} is {t.dtype} {tuple(t.shape)}, expected {dt} {shp}"
                )
        # in slabs of rows: the comparison works in float64, eight bytes an element, and the device regions' inputs
        # (2^31 elements) would need 17 GB for x alone, several times over
        rows = max(1, COMPARE_SLAB_ELEMENTS // max(1, H * D))
        slabs = []
        for t0 in range(0, max(T, 1), rows):  # one slab, an empty one, where T is 0
            xf = x[t0 : t0 + rows].detach().to(torch.float64)
            s = scale[t0 : t0 + rows].detach()
            c = _compare_scale(s, xf) or _compare_codes(x_q[t0 : t0 + rows].detach().to(torch.int64), s, xf)
            slabs.append((t0, xf.numel(), float(xf.norm()), c))
            del xf
        return _joined(slabs)

    def output_error(self, out, ref64) -> float:
        # quantization error is fixed by the contract; the budget applies to the codes
        return 0.0

    def flops(self, shape):
        return 4.0 * shape.T * shape.H * shape.D

    def bytes(self, shape: QuantizeShape, dtype) -> float:
        e = torch.empty((), dtype=dtype).element_size()
        n = shape.T * shape.H * shape.D
        return float(n * e + n + shape.T * shape.H * 4)


COMPARE_SLAB_ELEMENTS = 1 << 26  # elements of x compared at once (512 MiB of float64 for each temporary)


def _joined(slabs: List[Tuple[int, int, float, Comparison]]) -> Comparison:
    """One Comparison of the whole tensor from those of its slabs of rows, each (first row, elements, ||x||,
    comparison): the first failure with its index in the whole tensor, the failed fraction of every element, and
    the norm-wise error over all of them."""
    if len(slabs) == 1:
        return slabs[0][3]
    total = sum(n for _, n, _, _ in slabs)
    failed = [(t0, c) for t0, _, _, c in slabs if not c.ok]
    if failed:
        t0, first = failed[0]
        index = (
            None
            if first.first_bad_index is None
            else (first.first_bad_index[0] + t0,) + tuple(first.first_bad_index[1:])
        )
        fraction = sum(c.bad_fraction * n for _, n, _, c in slabs) / total
        error = max(c.rel_error for _, c in failed)
        return dataclasses.replace(first, rel_error=error, bad_fraction=fraction, first_bad_index=index)
    x2 = sum(xn * xn for _, _, xn, _ in slabs)
    err2 = sum((c.rel_error * xn) ** 2 for _, _, xn, c in slabs)
    return Comparison(True, math.sqrt(err2 / x2) if x2 > 0 else max(c.rel_error for *_, c in slabs), 0.0)


def _compare_scale(s: torch.Tensor, xf: torch.Tensor):
    """None when every scale is max|x| / 127 to float32 rounding, else the failed Comparison."""
    amax = xf.abs().amax(dim=-1)
    ref_scale = amax.to(torch.float32) / 127.0  # float32 rounding of the division (to a subnormal, or to 0)
    if not bool(torch.isfinite(s).all()):
        idx = first_index(~torch.isfinite(s))
        return Comparison(
            False, math.inf, 1.0, idx, float(s[idx]), float(ref_scale[idx]), reason="scale has non-finite values"
        )
    # one float32 ulp either way (a kernel may multiply by 1/127 instead of dividing): 2^-22 relative in the
    # normal range, float32's smallest subnormal (2^-149) below it; a zero row's scale is exactly 0
    ulp = torch.clamp(ref_scale.to(torch.float64).abs() * 2.0**-22, min=FLOAT32_SUBNORMAL)
    s_tol = torch.where(amax > 0, ulp, torch.zeros_like(ulp))
    s_err = (s.to(torch.float64) - ref_scale.to(torch.float64)).abs()
    bad_s = s_err > s_tol
    if bool(bad_s.any()):
        idx = first_index(bad_s)
        return Comparison(
            False,
            float(s_err.max()),
            float(bad_s.double().mean()),
            idx,
            float(s[idx]),
            float(ref_scale[idx]),
            reason="scale differs from max|x|/127 beyond float32 rounding",
        )
    return None


def _compare_codes(q: torch.Tensor, s: torch.Tensor, xf: torch.Tensor) -> Comparison:
    """What a consumer reads, code times scale: every code in [-127, 127] and within half a step of x / scale, the
    scale returned; a code clamped at +-127 where x / scale is past 127 on its side (a subnormal scale, rounded
    down, puts the row's max past 127.5 steps). A row whose scale is 0 (checked against max|x| / 127 first: a
    zero row, or a max under 127 * 2^-150) dequantizes to 0 whatever its codes, as the reference's codes (0) do: the
    codes of +-127 that x / 0 gives there are no fault, since no consumer can read them as anything but 0."""
    out_of_range = (q < -127) | (q > 127)
    if bool(out_of_range.any()):
        idx = first_index(out_of_range)
        return Comparison(
            False,
            math.inf,
            float(out_of_range.double().mean()),
            idx,
            int(q[idx]),
            None,
            reason="x_q outside [-127, 127]",
        )
    zero_rows = (s == 0)[..., None].expand_as(q)
    s64 = s.to(torch.float64)[..., None]
    err = (q.to(torch.float64) * s64 - xf).abs()
    # half a step, plus float32 slack on the product and the input
    slack = s64 * 0.5 * (1 + 2.0**-20) + xf.abs() * 2.0**-22
    clamped = (q.abs() == 127) & (q.to(torch.float64) * xf > 0) & (xf.abs() >= 127 * s64)
    bad = (err > slack) & ~clamped & ~zero_rows  # a zero scale reads as 0, the reference's value there
    rel = float(err.norm() / xf.norm()) if float(xf.norm()) > 0 else float(err.max() if err.numel() else 0)
    if bool(bad.any()):
        idx = first_index(bad)
        assert idx is not None  # bad.any()
        expect = float(xf[idx] / s64[idx[:2]][0]) if float(s64[idx[:2]][0]) > 0 else 0.0
        return Comparison(
            False,
            rel,
            float(bad.double().mean()),
            idx,
            int(q[idx]),
            round(expect, 3),
            reason="|x_q * scale - x| exceeds scale / 2",
        )
    return Comparison(True, rel, 0.0)


OP = QuantizeKV()

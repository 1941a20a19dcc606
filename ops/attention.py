"""attention(q, k, v, causal=False, sm_scale=None) -> o: prefill attention with GQA."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping

import torch
import torch.nn.functional as F

from .common import COMMON_LIMITS, SM_SCALE_LIMIT, Domain, ElementBound, Op, Region, Shape, ValueDim, fill
from .tuning import SMEM_LIMIT, Space

CONTRACT = """attention(q, k, v, causal=False, sm_scale=None) -> o
  q: [B, Hq, S, D]; k, v: [B, Hkv, S, D]; float16 | bfloat16 | float32; any
  strides, broadcast views included (stride 0, as `expand` makes: a kv head repeated
  over heads, a query shared by a batch; q, k and v are only read). sm_scale: any
  float from 1e-3 to 10. Any head dim 1 <= D <= 256 (not only powers of two). Hq % Hkv == 0 and
  query head h reads kv head h // (Hq // Hkv) (any GQA group, Hkv = 1 included).
  sm_scale defaults to 1/sqrt(D) of the true D. causal: query i sees keys j <= i.
  o: new [B, Hq, S, D], dtype of q. A shape outside these limits raises
  ValueError naming the limit."""


# Head dims the property tests draw: models serve 80, 96 and 112 as well as powers of two, and 1, 8, 24
# and 40 are below or between the 16-wide tiles a kernel pads to.
HEAD_DIMS_DRAWN = (1, 8, 16, 24, 32, 40, 64, 80, 96, 112)


@dataclass(frozen=True)
class AttentionShape(Shape):
    B: int
    Hq: int
    Hkv: int
    S: int
    D: int
    causal: bool = False


def _fits(c, shape) -> bool:
    """BLOCK_M a multiple of BLOCK_N; the query tile and the pipelined K and V tiles in shared memory."""
    bm, bn, warps, stages = c
    return bm % bn == 0 and (bm * shape.D + 2 * bn * shape.D * max(stages - 1, 1)) * 2 <= SMEM_LIMIT


def attention_reference(q, k, v, causal: bool, sm_scale, precision):
    """Plain softmax attention in `precision` (q: [B,Hq,S,D], k/v: [B,Hkv,S,D])."""
    q = q.detach().to(precision)
    k = k.detach().to(precision)
    v = v.detach().to(precision)
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else float(sm_scale)
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        Sk = k.shape[2]
        keep = torch.ones(S, Sk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# The relative error of one product q_d k_jd of a score, by input dtype: exact in float32 for 16-bit inputs;
# float32 inputs may take TF32 dots, which round both operands to 11 significant bits.
SCORE_PRODUCT_ROUNDING = {torch.bfloat16: 0.0, torch.float16: 0.0, torch.float32: 2.0**-10}
# A kernel may round the probabilities to bfloat16 (or any finer type) for the P @ V dot, whatever the inputs:
# one bfloat16 step relative, twice round-to-nearest's 2^-9 (room for a kernel that truncates).
PROB_ROUNDING = 2.0**-8
FP32_TERM = 4 * 2.0**-24  # per term of a float32 sum in any order (tensor cores may truncate), as for matmul
FP16_UNDERFLOW = 2.0**-24  # float16's subnormal spacing: what a probability taken in float16 may lose


def softmax_rounding_bound(q, k, v, scale: float, keep, dtype: torch.dtype, v_floor=None) -> torch.Tensor:
    """What a correct kernel's rounding can move each element of softmax(q k^T * scale) @ v by, for one kv head:
    q [G, S, D], k and v [Sk, D] in float64, `keep` a bool [S, Sk] mask of the keys each query sees (None: all),
    `dtype` the inputs'. Returns float64 [G, S, D], the sum of:
      - the scores: each carries an error up to E_j = (r + 4 D 2^-24) * scale * sum_d |q_d k_jd| (r: the
        products' rounding, then float32 accumulation) + 4 * 2^-24 * (|s_j| + |max s|) (the max subtracted,
        the exponent); with the normaliser, p_j moves by at most p_j * expm1(E_j + log sum_i p_i e^E_i), and
        o_d by that times |v_jd - o_d| <= |v_jd| + |o_d|;
      - the probabilities rounded for the P @ V dot (2^-8) and the float32 sums over Sk keys (of P @ V and
        of the normaliser): (2^-8 + 4 Sk 2^-24) * (sum_j p_j |v_jd| + |o_d|);
      - a probability that underflows float16 (a kernel may take P in float16): 2^-24 relative to the row's
        largest (twice round-to-nearest's 2^-25: room for a kernel that truncates), each key's own, so
        2^-24 * max_j p_j * sum_j |f_jd|, where f is v, or `v_floor` where a kernel multiplies the probabilities
        by a factor before rounding them and divides it out after (int8 codes: paged.int8_underflow_floor)."""
    D, Sk = q.shape[-1], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    conditioning = (q.abs() @ k.abs().transpose(-1, -2)) * abs(scale)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.softmax(s, -1)
    o = p @ v
    e = (SCORE_PRODUCT_ROUNDING[dtype] + FP32_TERM * D) * conditioning + FP32_TERM * (s.abs() + m.abs())
    if keep is not None:
        e = e.masked_fill(~keep, 0.0)
    shift = torch.logsumexp(torch.log(p) + e, -1, keepdim=True)  # how far the normaliser can move, in log
    moved = torch.where(p > 0, p * torch.expm1(e + shift), 0.0)  # (0 * inf where huge errors overflow expm1)
    va = v.abs()
    live = torch.ones_like(s) if keep is None else keep.to(s.dtype)
    floor = va if v_floor is None else v_floor.abs()
    return (
        moved @ va
        + moved.sum(-1, keepdim=True) * o.abs()
        + (PROB_ROUNDING + FP32_TERM * Sk) * (p @ va + o.abs())
        + FP16_UNDERFLOW * p.amax(-1, keepdim=True) * (live @ floor)
    )


BOUND_BLOCK = 1 << 27  # elements of one float64 score block in Attention.element_bounds (1 GiB)

# The factor on softmax_rounding_bound that an element may use: room for the products of small errors that
# its sum of terms leaves out.
SOFTMAX_BOUND_TOL = 2.0


def torch_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """The contract through torch SDPA (flash or memory-efficient kernels where they apply); GQA by
    SDPA's own head grouping, which maps query head h to kv head h // (Hq // Hkv) as the contract does."""
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=bool(causal), scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1]
    )


class Attention(Op):
    name = "attention"
    contract = CONTRACT
    arg_names = ("q", "k", "v")
    optional_args = ("causal", "sm_scale")
    shape_cls = AttentionShape
    anchor_name = "torch SDPA"
    torch_label = "anchor:sdpa"
    tuning_space = Space(
        ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), ((64, 128), (32, 64, 128), (4, 8), (1, 2, 3, 4)), _fits
    )

    # every input is only read: q broadcast over the batch, k and v over their heads (one kv head repeated)
    expandable = (("q", 0), ("k", 1), ("v", 1))

    def torch_impl(self):
        return torch_attention

    def config_args(self, shape: AttentionShape, device) -> tuple:
        return (shape.S, shape.D, shape.causal)

    def shape_suites(self):
        S = AttentionShape
        return {
            "tiny": [
                S(1, 1, 1, 1, 16),
                S(1, 2, 1, 17, 16, True),
                S(2, 4, 2, 33, 32),
                S(1, 2, 2, 64, 64, True),
                S(1, 3, 1, 47, 32, True),
                S(1, 1, 1, 129, 16),
            ],
            # a long causal row; MQA across a 256-key tile edge; the padded head dims, 80 to 128 and 256 wide
            "near_serving": [
                S(1, 1, 1, 2048, 64, True),
                S(1, 4, 1, 257, 128),
                S(1, 3, 1, 150, 80),
                S(1, 2, 1, 257, 256, True),
            ],
            # D = 128 (Llama), and the head dims of smaller (64: Llama-3.2-1B) and larger (256: Gemma) models
            "serving": [
                S(4, 32, 32, 4096, 128, False),
                S(4, 32, 32, 4096, 128, True),
                S(4, 32, 8, 4096, 128, True),
                S(4, 32, 8, 4096, 64, True),
                S(4, 16, 8, 4096, 256, True),
            ],
        }

    def shape_strategy(self):
        """Interpreter-sized shapes: odd sequence lengths, GQA groups (MQA too), causal and not, and head dims
        that are not powers of two (a kernel pads them) among those that are."""
        from hypothesis import strategies as st  # deferred: only the sanitizer's property checks draw shapes

        @st.composite
        def shapes(draw):
            hkv = draw(st.sampled_from([1, 2, 3]))
            group = draw(st.sampled_from([1, 2, 4]))
            return AttentionShape(
                draw(st.sampled_from([1, 2])),
                hkv * group,
                hkv,
                draw(st.sampled_from([1, 2, 15, 16, 17, 31, 63, 64, 65, 100, 127, 129])),
                draw(st.sampled_from(HEAD_DIMS_DRAWN)),
                draw(st.booleans()),
            )

        return shapes()

    value_dims = (
        ValueDim("D", 1, 256, 256),
        ValueDim("group", 1, 128, 128),
        ValueDim("S", 1, 1 << 17, 1024),
        ValueDim("B", 1, 4096, 64),
        ValueDim("Hkv", 1, 128, 32),
    )

    def value_base(self) -> AttentionShape:
        return AttentionShape(2, 2, 1, 33, 16)

    def with_value(self, base: AttentionShape, dim: str, value: int) -> AttentionShape:
        if dim == "group":
            return dataclasses.replace(base, Hq=value * base.Hkv)
        changes: Dict[str, Any] = {"Hkv": value, "Hq": value} if dim == "Hkv" else {dim: value}
        return dataclasses.replace(base, **changes)

    def domain(self) -> Domain:
        """Head dims past 128, GQA groups past 8 (MQA at 128 query heads), BSHD and pair views, on the CPU;
        a long sequence on the GPU."""
        S = AttentionShape
        cpu = [
            Region("head dim 160", S(1, 2, 1, 33, 160)),
            Region("head dim 256", S(1, 1, 1, 20, 256, True)),
            Region("GQA group 16", S(1, 16, 1, 17, 16)),
            Region("MQA group 32", S(1, 32, 1, 5, 16, True)),
            Region("BSHD view", S(2, 4, 2, 33, 32), "bshd"),
            Region("BSHD view, causal", S(1, 2, 1, 65, 64, True), "bshd"),
            Region("pair view", S(1, 2, 1, 17, 16), "pair"),
            Region("broadcast q over the batch, k and v over their heads", S(2, 4, 2, 17, 16, True), "expanded"),
            Region("one query row for every position (stride 0)", S(1, 2, 1, 33, 32), "expanded:q:2"),
            Region("head dim 144 (default sm_scale 1/12)", S(1, 2, 1, 17, 144, True)),
            Region("head dim 192", S(1, 2, 1, 17, 192)),
            Region("sm_scale 1/D (muP), head dim 64", S(1, 2, 1, 17, 64), args=(("sm_scale", 1 / 64),)),
        ]
        gpu = [
            Region("sequence 16384, MQA", S(1, 8, 1, 16384, 128, True), where="gpu"),
            Region("MQA group 128 at head dim 256", S(1, 128, 1, 1024, 256, True), where="gpu"),
            Region("BSHD view at serving shape", S(2, 32, 8, 2048, 128, True), "bshd", where="gpu"),
            Region("a 24000-token prompt, causal", S(1, 2, 1, 24000, 128, True), where="gpu"),
        ]
        limits = (
            ("head dim D", "1..256"),
            ("GQA group", "1..128 (MQA included)"),
            ("sequence", "1.. (24000 on the GPU)"),
            ("sm_scale", SM_SCALE_LIMIT),
        ) + COMMON_LIMITS
        return Domain(limits, tuple(cpu + gpu))

    def bucket(self, shape: AttentionShape) -> str:
        s = "s1k" if shape.S <= 1024 else "s4k" if shape.S <= 4096 else "slong"
        return f"{'causal' if shape.causal else 'full'}-{s}-d{shape.D}"

    def shape_of(self, args: Mapping[str, Any]) -> AttentionShape:
        q, k = args["q"], args["k"]
        B, Hq, S, D = (int(x) for x in q.shape)
        return AttentionShape(B, Hq, int(k.shape[1]), S, D, bool(args.get("causal", False)))

    def _make_args(self, shape: AttentionShape, dtype, gen, dist, device) -> Dict[str, Any]:
        B, Hq, Hkv, S, D = shape.B, shape.Hq, shape.Hkv, shape.S, shape.D
        if Hq % Hkv:
            raise ValueError(f"attention: Hq={Hq} is not a multiple of Hkv={Hkv}")
        scale = 6.0 if dist == "large" else 1.0
        # 'equal_rows': every key (and value) of a head is the same vector: all scores tie
        q = fill((B, Hq, S, D), dist, gen, device, scale, row_dim=-1, dtype=dtype)
        k = fill((B, Hkv, S, D), dist, gen, device, scale, row_dim=-2, dtype=dtype)
        v = fill((B, Hkv, S, D), dist, gen, device, scale, row_dim=-2, dtype=dtype)
        return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "causal": shape.causal, "sm_scale": None}

    def reference(self, args, precision=torch.float32):
        return attention_reference(
            args["q"], args["k"], args["v"], bool(args.get("causal", False)), args.get("sm_scale"), precision
        )

    def element_bounds(self, args):
        """Each output element against its own softmax's rounding (softmax_rounding_bound), one kv head and its
        query group at a time (a [S, S] score matrix in float64 each), with the rms-based bound as well."""
        q, k, v = (args[n].detach().to(torch.float64) for n in ("q", "k", "v"))
        B, Hq, S, D = q.shape
        Hkv = k.shape[1]
        g = Hq // Hkv
        sm_scale = args.get("sm_scale")
        scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
        keep = torch.ones(S, S, dtype=torch.bool, device=q.device).tril() if args.get("causal") else None
        cond = torch.empty_like(q)
        # query rows per call: each row's bound is its own softmax's, so rows are taken a block at a time, with a
        # [g, rows, S] float64 score matrix of at most BOUND_BLOCK elements (a 16384-token MQA prompt's whole one
        # is 17 GB, and the bound holds about seven of its size)
        rows = max(1, BOUND_BLOCK // (g * S))
        for b in range(B):
            for h in range(Hkv):
                for r in range(0, S, rows):
                    cond[b, h * g : (h + 1) * g, r : r + rows] = softmax_rounding_bound(
                        q[b, h * g : (h + 1) * g, r : r + rows],
                        k[b, h],
                        v[b, h],
                        scale,
                        None if keep is None else keep[r : r + rows],
                        args["q"].dtype,
                    )
        return ElementBound(cond, SOFTMAX_BOUND_TOL, "softmax rounding bound", with_rms=True)

    def flops(self, shape: AttentionShape) -> float:
        f = 4.0 * shape.B * shape.Hq * shape.S * shape.S * shape.D
        return f / 2 if shape.causal else f

    def bytes(self, shape: AttentionShape, dtype) -> float:
        e = torch.empty((), dtype=dtype).element_size()
        return float(e * shape.B * shape.S * shape.D * (2 * shape.Hq + 2 * shape.Hkv))

    def bound(self, shape) -> str:
        return "compute"


OP = Attention()

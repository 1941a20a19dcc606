"""matmul(a, b) -> c: the op definition (reference, inputs, shapes, cost)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping

import torch

from .common import COMMON_LIMITS, Domain, ElementBound, Op, Region, Shape, ValueDim, fill
from .tuning import SMEM_LIMIT, Space

CONTRACT = """matmul(a, b) -> c
  a: [M, K], b: [K, N], same dtype: float16 | bfloat16 | float32; any strides,
  broadcast views included (stride 0, as `expand` makes: a and b are only read).
  c: new [M, N] tensor, dtype of a; float32 accumulation."""


def torch_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The contract through cuBLAS (any strides; the output is a new tensor of a's dtype)."""
    return torch.matmul(a, b)


@dataclass(frozen=True)
class MatmulShape(Shape):
    M: int
    N: int
    K: int


def _fits(c, shape) -> bool:
    """Two operand tiles per stage in shared memory, a bounded accumulator, split-K only for short M."""
    bm, bn, bk, gm, split, warps, stages = c
    return (bm * bk + bk * bn) * 2 * stages <= SMEM_LIMIT and bm * bn <= 256 * 256 and (split == 1 or shape.M <= 256)


class Matmul(Op):
    name = "matmul"
    contract = CONTRACT
    arg_names = ("a", "b")
    output_names = ("c",)
    shape_cls = MatmulShape
    anchor_name = "torch.matmul (cuBLAS)"
    torch_label = "anchor:torch.matmul"
    tuning_space = Space(
        ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages"),
        (
            (16, 32, 64, 128, 256),
            (32, 64, 128, 256),
            (32, 64, 128, 256),
            (1, 4, 8, 16),
            (1, 2, 4),
            (2, 4, 8),
            (2, 3, 4, 5),
        ),
        _fits,
    )

    # both operands are only read: either may be a broadcast view (a row of a repeated, a column of b)
    expandable = (("a", 0), ("b", 1))

    def torch_impl(self):
        return torch_matmul

    def config_args(self, shape: MatmulShape, device) -> tuple:
        return (shape.M, shape.N, shape.K, device)

    def shape_suites(self):
        S = MatmulShape
        return {
            # interpreter: odd sizes, size-1 dims, block size +-1
            "tiny": [S(1, 1, 1), S(17, 13, 29), S(64, 64, 64), S(33, 65, 31), S(1, 96, 80), S(127, 31, 129)],
            # near serving scale, cheap enough for the interpreter (cheats gated on size)
            "near_serving": [S(4096, 16, 32), S(16, 4096, 64), S(16, 32, 4096), S(512, 512, 512)],
            "serving": [
                S(4096, 4096, 4096),
                S(8192, 8192, 8192),
                S(1, 8192, 8192),
                S(16, 8192, 8192),
                S(64, 8192, 8192),
            ],
        }

    def shape_strategy(self):
        """Interpreter-sized shapes for property tests: 1, primes, and block sizes +-1."""
        from hypothesis import strategies as st  # deferred: only the sanitizer's property checks draw shapes

        dim = st.sampled_from([1, 2, 3, 7, 13, 16, 17, 31, 32, 33, 63, 64, 65, 97, 127, 128, 129])
        return st.builds(MatmulShape, dim, dim, dim)

    value_dims = (ValueDim("M", 0, 1 << 24, 8192), ValueDim("N", 0, 1 << 24, 8192), ValueDim("K", 0, 1 << 24, 32768))

    def value_base(self) -> MatmulShape:
        return MatmulShape(33, 37, 41)  # past one tile each way: a size may change a tile, a grid, a split

    def domain(self) -> Domain:
        """Every view of both operands on the CPU (a pair slice: rows twice as far apart as K; a transposed
        matrix), empty products; operands past 2^31 elements on the GPU (int32 offsets overflow there)."""
        S = MatmulShape
        cpu = [Region(f"{layout} view", S(33, 65, 31), layout) for layout in ("pair", "bshd")]
        cpu += [Region("K past the tiles, pair view", S(5, 40, 1000), "pair")]
        cpu += [Region("K 16383 (a real K from 12288 to 16383)", S(5, 17, 16383))]
        cpu += [
            Region("broadcast rows of a and columns of b (stride 0)", S(33, 65, 31), "expanded"),
            Region("a broadcast along K", S(17, 13, 29), "expanded:a:1"),
            Region("b broadcast along K", S(17, 13, 29), "expanded:b:0"),
            # past every real K (Llama-3-70B's down_proj has 28672), at M past one 64-row tile: a kernel that
            # drops work only past some number of K tiles is off by sqrt(dropped / K) in norm, inside the
            # per-element bound at this K, so the region is held to the error budget as well
            Region("K 32768 at M 65, held to the error budget", S(65, 17, 32768), budget=True),
        ]
        gpu = [
            Region("a past 2^31 elements", S(65600, 16, 32768), where="gpu"),
            Region("b past 2^31 elements, transposed", S(16, 65600, 32768), "bshd", where="gpu"),
            Region("K 12288 at serving M and N", S(2048, 4096, 12288), where="gpu"),
        ]
        limits = (
            ("M, N, K", "0.. (empty products included)"),
            ("operands", "past 2^31 elements on the GPU"),
        ) + COMMON_LIMITS
        return Domain(limits, tuple(cpu + gpu))

    def branch_pool(self):
        S = MatmulShape
        empty = [Region(f"empty {s.key()}", s) for s in (S(0, 5, 7), S(5, 0, 7), S(5, 7, 0))]
        return (
            empty
            + super().branch_pool()
            + [
                Region(f"{s.key()} {layout}", s, layout)
                for layout in self.layouts()
                for s in (S(300, 300, 8), S(1, 1000, 300))
            ]
        )

    def bucket(self, shape: MatmulShape) -> str:
        m = shape.M
        mb = "m1" if m <= 1 else "m16" if m <= 16 else "m64" if m <= 64 else "m256" if m <= 256 else "mlarge"
        big = "klarge" if shape.K >= 2048 else "ksmall"
        return f"{mb}-{big}"

    def shape_of(self, args: Mapping[str, Any]) -> MatmulShape:
        a, b = args["a"], args["b"]
        return MatmulShape(int(a.shape[0]), int(b.shape[1]), int(a.shape[1]))

    def _make_args(self, shape: MatmulShape, dtype, gen, dist, device) -> Dict[str, Any]:
        M, N, K = shape.M, shape.N, shape.K
        scale = 1.0
        if dist == "large":
            # as large as fits: |c| ~ s^2 sqrt(K) * 5 sigma must stay well under the dtype max
            fmax = torch.finfo(dtype).max
            scale = min(1e3, math.sqrt(fmax / (20.0 * math.sqrt(max(K, 1)))))
        # 'integers' within +-3: K=4096 sums of their products stay exact and inside float16's range
        a = fill((M, K), dist, gen, device, scale, row_dim=-1, dtype=dtype, int_bits=2)
        # 'tiny': a at the bottom of the dtype's range, b standard normal, so that the products (and c) land
        # there too instead of underflowing to zero
        b = fill((K, N), "normal" if dist == "tiny" else dist, gen, device, scale, row_dim=0, int_bits=2)
        return {"a": a.to(dtype), "b": b.to(dtype)}

    def reference(self, args, precision=torch.float32):
        a = args["a"].detach().to(precision)
        b = args["b"].detach().to(precision)
        return a @ b

    def element_bounds(self, args):
        """Each element against the rounding error its own sum can carry: fp32 accumulation over K terms
        in any order (tensor cores may truncate: a factor 4 over K * 2^-24), and for float32 inputs TF32
        operands (2^-10), both times sum_k |a_ik||b_kj|; the output's rounding is in rtol * |ref|. Where the
        products are float32 subnormals ('tiny' inputs) the relative model fails: each product and each sum may
        round by float32's subnormal spacing 2^-149 absolutely, so 2K roundings, times 2 for truncation, are
        added (4K * 2^-149: 1.6e-43 at K = 29, nothing beside a normal output). No element may exceed its bound,
        so one corrupted element of a large output fails."""
        a, b = args["a"].detach().to(torch.float64), args["b"].detach().to(torch.float64)
        tf32 = 2.0**-10 if self.output_dtype(args) == torch.float32 else 0.0
        K = a.shape[1]
        return ElementBound(a.abs() @ b.abs(), 4.0 * K * 2.0**-24 + tf32, "sum|a||b|", floor=4.0 * K * 2.0**-149)

    def flops(self, shape: MatmulShape) -> float:
        return 2.0 * shape.M * shape.N * shape.K

    def bytes(self, shape: MatmulShape, dtype) -> float:
        e = torch.empty((), dtype=dtype).element_size()
        return float(e * (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N))

    def bound(self, shape: MatmulShape) -> str:
        # arithmetic intensity against the H200's ridge point (~190 FLOP/byte measured)
        return "compute" if self.flops(shape) / self.bytes(shape, torch.bfloat16) > 190 else "memory"


OP = Matmul()

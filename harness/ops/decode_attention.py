"""decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None) -> o."""
from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from .common import Op, fill
from .paged import (DecodeShape, decode_bucket, decode_shape_strategy, decode_flops, garbage_fill, make_paged_layout, owned_from_args,
                    paged_reference, slot_readable)

CONTRACT = """decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None) -> o
  One new query token per sequence over a paged KV cache.
  q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D];
  block_table: int32 [B, max_blocks]; seq_lens: int32 [B], 1 <= seq_lens[b] <=
  max_blocks * block_size. Token t of sequence b lives at
  cache[block_table[b, t // block_size], t % block_size]. Entries of block_table
  past the blocks that seq_lens[b] needs are unspecified (tests fill them with
  invalid block ids) and must not be dereferenced. o: new [B, Hq, D], dtype of q."""


def decode_shape_suites():
    S = DecodeShape
    return {
        "tiny": [S(1, 1, 1, 16, 16, 1), S(2, 4, 2, 32, 16, 37, True), S(3, 2, 2, 16, 4, 23, True),
                 S(2, 8, 1, 64, 16, 64), S(1, 6, 3, 32, 8, 129, True)],
        "near_serving": [S(2, 8, 2, 128, 16, 8192, True), S(33, 4, 4, 64, 16, 300, True)],
        "serving": [S(32, 32, 32, 128, 16, 8192), S(32, 32, 8, 128, 16, 8192)],
    }


class DecodeAttention(Op):
    name = "decode_attention"
    contract = CONTRACT
    arg_names = ("q", "k_cache", "v_cache", "block_table", "seq_lens")
    optional_args = ("sm_scale",)
    shape_cls = DecodeShape
    anchor_name = "torch SDPA over the gathered cache"

    def shape_suites(self):
        return decode_shape_suites()

    def shape_strategy(self):
        return decode_shape_strategy()

    def bucket(self, shape):
        return decode_bucket(shape)

    def shape_of(self, args: Mapping[str, Any]) -> DecodeShape:
        """ctx is the block table's capacity (blocks x block size), the longest context it can address."""
        q, k = args["q"], args["k_cache"]
        B, Hq, D = (int(x) for x in q.shape)
        bs = int(k.shape[1])
        ctx = int(args["block_table"].shape[1]) * bs
        return DecodeShape(B, Hq, int(k.shape[2]), D, bs, ctx)

    def keep_contiguous(self):
        return ()

    def _make_args(self, shape: DecodeShape, dtype, gen, dist, device) -> Dict[str, Any]:
        if shape.Hq % shape.Hkv:
            raise ValueError(f"decode_attention: Hq={shape.Hq} is not a multiple of Hkv={shape.Hkv}")
        layout = make_paged_layout(shape, gen, device)
        nb = layout["num_blocks"]
        scale = 6.0 if dist == "large" else 1.0
        q = fill((shape.B, shape.Hq, shape.D), dist, gen, device, scale, row_dim=-1)
        k = fill((nb, shape.block_size, shape.Hkv, shape.D), dist, gen, device, scale, row_dim=(0, 1))
        v = fill((nb, shape.block_size, shape.Hkv, shape.D), dist, gen, device, scale, row_dim=(0, 1))
        k = garbage_fill(k.to(dtype), layout["owned"], float("nan"))
        v = garbage_fill(v.to(dtype), layout["owned"], float("nan"))
        return {"q": q.to(dtype), "k_cache": k, "v_cache": v, "block_table": layout["block_table"],
                "seq_lens": layout["seq_lens"], "sm_scale": None}

    def readable(self, args):
        owned = owned_from_args(args)
        return {"k_cache": slot_readable(owned, args["k_cache"]), "v_cache": slot_readable(owned, args["v_cache"])}

    def reference(self, args, precision=torch.float32):
        return paged_reference(args["q"], args["k_cache"], args["v_cache"], args["block_table"], args["seq_lens"],
                               args.get("sm_scale"), precision)

    def flops(self, shape):
        return decode_flops(shape)

    def bytes(self, shape: DecodeShape, dtype) -> float:
        e = torch.empty((), dtype=dtype).element_size()
        tokens = shape.B * (shape.ctx if not shape.ragged else (shape.ctx + 1) / 2)
        return float(2 * tokens * shape.Hkv * shape.D * e + 2 * shape.B * shape.Hq * shape.D * e)


OP = DecodeAttention()

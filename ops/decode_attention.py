"""decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None) -> o."""

from __future__ import annotations

from typing import Any, Dict

import torch

from .common import fill
from .paged import (
    NEEDLES,
    DecodeShape,
    PagedDecodeOp,
    decode_config_fits,
    garbage_fill,
    make_paged_layout,
    owned_from_args,
    paged_pool,
    place_needles,
    pool_rows,
    slot_readable,
)
from .tuning import Space

CONTRACT = """decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None) -> o
  One new query token per sequence over a paged KV cache.
  q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; float16 |
  bfloat16 | float32; any strides; q may be a broadcast view (stride 0, as
  `expand` makes), the caches may not (they are written in place: a stride-0
  cache would alias its blocks). sm_scale: any float from 1e-3 to 10. Any head dim 1 <= D <= 256 and any block size
  1 <= block_size <= 256 (neither needs to be a power of two). Hq % Hkv == 0,
  query head h reads kv head h // (Hq // Hkv) (any GQA group, Hkv = 1 included).
  block_table: int32 [B, max_blocks]; seq_lens: int32 [B], 1 <= seq_lens[b] <=
  max_blocks * block_size (up to 131072 at least, mixed freely in a batch).
  Token t of sequence b lives at cache[block_table[b, t // block_size],
  t % block_size]. Entries of block_table past the blocks that seq_lens[b] needs
  are unspecified (tests fill them with invalid block ids) and must not be
  dereferenced. sm_scale defaults to 1/sqrt(D) of the true D. o: new [B, Hq, D],
  dtype of q. A shape outside these limits raises ValueError naming the limit."""


class DecodeAttention(PagedDecodeOp):
    name = "decode_attention"
    contract = CONTRACT
    arg_names = ("q", "k_cache", "v_cache", "block_table", "seq_lens")
    optional_args = ("sm_scale",)
    anchor_name = "torch SDPA over the gathered cache"
    tuning_space = Space(
        ("NUM_SPLITS", "BLOCK_N", "num_warps", "num_stages"),
        ((1, 2, 4, 8, 16), (16, 32, 64, 128), (2, 4, 8), (1, 2, 3, 4)),
        decode_config_fits,
    )

    def config_args(self, shape: DecodeShape, device) -> tuple:
        # the bf16 baseline's launch config depends on the head dim too: a token tile's bytes are BLOCK_N * D
        return super().config_args(shape, device) + (shape.D,)

    def _make_args(self, shape: DecodeShape, dtype, gen, dist, device) -> Dict[str, Any]:
        self._check_heads(shape)
        layout = make_paged_layout(shape, gen, device)
        owned = pool_rows(layout)  # the blocks drawn: all of them, or a pool past 2^31 elements' live ones
        nb = owned.shape[0]
        scale = 6.0 if dist == "large" else 1.0
        needles, dist = dist == NEEDLES.name, "normal" if dist == NEEDLES.name else dist
        q = fill((shape.B, shape.Hq, shape.D), dist, gen, device, scale, row_dim=-1, dtype=dtype)
        k = fill((nb, shape.block_size, shape.Hkv, shape.D), dist, gen, device, scale, row_dim=(0, 1), dtype=dtype)
        v = fill((nb, shape.block_size, shape.Hkv, shape.D), dist, gen, device, scale, row_dim=(0, 1), dtype=dtype)
        if needles:
            place_needles(q.to(dtype), k, layout, gen)
        k = garbage_fill(k.to(dtype), owned, float("nan"))
        v = garbage_fill(v.to(dtype), owned, float("nan"))
        return {
            "q": q.to(dtype),
            "k_cache": paged_pool(k, layout, float("nan")),
            "v_cache": paged_pool(v, layout, float("nan")),
            "block_table": layout["block_table"],
            "seq_lens": layout["seq_lens"],
            "sm_scale": None,
        }

    def readable(self, args):
        owned = owned_from_args(args)
        return {"k_cache": slot_readable(owned, args["k_cache"]), "v_cache": slot_readable(owned, args["v_cache"])}

    def bytes(self, shape: DecodeShape, dtype) -> float:
        e = torch.empty((), dtype=dtype).element_size()
        return float(2 * self.tokens(shape) * shape.Hkv * shape.D * e + 2 * shape.B * shape.Hq * shape.D * e)


OP = DecodeAttention()

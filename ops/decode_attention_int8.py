"""decode_attention_int8(q, k_cache, k_scale, v_cache, v_scale, block_table, seq_lens, sm_scale=None) -> o."""

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

CONTRACT = """decode_attention_int8(q, k_cache, k_scale, v_cache, v_scale, block_table,
                      seq_lens, sm_scale=None) -> o
  As decode_attention (any D from 1 to 256, any block_size from 1 to 256, any
  GQA group), but k_cache, v_cache are int8 [num_blocks, block_size, Hkv, D] and
  k_scale, v_scale are float32 [num_blocks, block_size, Hkv]; the value used is
  cache * scale[..., None] in float32. q may be a broadcast view (stride 0); the
  caches and their scales may not. sm_scale: any float from 1e-3 to 10. o: dtype of q."""


def quantize_rows(x: torch.Tensor):
    """Per-row symmetric int8 quantization of the last dim (the quantize_kv rule)."""
    amax = x.abs().amax(dim=-1)
    scale = amax / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(x / safe[..., None]), -127, 127).to(torch.int8)
    return q, scale.to(torch.float32)


class DecodeAttentionInt8(PagedDecodeOp):
    name = "decode_attention_int8"
    contract = CONTRACT
    arg_names = ("q", "k_cache", "k_scale", "v_cache", "v_scale", "block_table", "seq_lens")
    optional_args = ("sm_scale",)
    anchor_name = "torch SDPA over the gathered bf16/fp16 cache"
    tuning_space = Space(
        ("NUM_SPLITS", "BLOCK_N", "num_warps", "num_stages"),
        ((1, 2, 4, 8, 16), (32, 64, 128, 256), (2, 4, 8), (1, 2, 3, 4)),
        decode_config_fits,
    )

    def _make_args(self, shape: DecodeShape, dtype, gen, dist, device) -> Dict[str, Any]:
        self._check_heads(shape)
        layout = make_paged_layout(shape, gen, device)
        owned = pool_rows(layout)  # the blocks drawn: all of them, or a pool past 2^31 elements' live ones
        nb = owned.shape[0]
        scale = 6.0 if dist == "large" else 1.0
        needles, dist = dist == NEEDLES.name, "normal" if dist == NEEDLES.name else dist
        q = fill((shape.B, shape.Hq, shape.D), dist, gen, device, scale, row_dim=-1, dtype=dtype)
        # 'tiny' cache values (float32's range: the cache holds float32 scales) give subnormal scales
        kf = fill((nb, shape.block_size, shape.Hkv, shape.D), dist, gen, device, scale, row_dim=(0, 1))
        vf = fill((nb, shape.block_size, shape.Hkv, shape.D), dist, gen, device, scale, row_dim=(0, 1))
        if needles:
            place_needles(q.to(dtype), kf, layout, gen)
        k_q, k_s = quantize_rows(kf)
        v_q, v_s = quantize_rows(vf)
        # garbage in unowned slots: arbitrary int8 codes and NaN scales
        junk = torch.randint(-128, 128, k_q.shape, generator=gen, device=device, dtype=torch.int16).to(torch.int8)
        k_q = torch.where(owned[..., None, None], k_q, junk)
        v_q = torch.where(owned[..., None, None], v_q, junk)
        k_s = garbage_fill(k_s, owned, float("nan"))
        v_s = garbage_fill(v_s, owned, float("nan"))
        return {
            "q": q.to(dtype),
            "k_cache": paged_pool(k_q, layout, -128),
            "k_scale": paged_pool(k_s, layout, float("nan")),
            "v_cache": paged_pool(v_q, layout, -128),
            "v_scale": paged_pool(v_s, layout, float("nan")),
            "block_table": layout["block_table"],
            "seq_lens": layout["seq_lens"],
            "sm_scale": None,
        }

    def readable(self, args):
        owned = owned_from_args(args)
        return {name: slot_readable(owned, args[name]) for name in ("k_cache", "k_scale", "v_cache", "v_scale")}

    def bytes(self, shape: DecodeShape, dtype) -> float:
        e = torch.empty((), dtype=dtype).element_size()
        # int8 codes plus one float32 scale per token and head, for K and V
        return float(2 * self.tokens(shape) * shape.Hkv * (shape.D + 4) + 2 * shape.B * shape.Hq * shape.D * e)


OP = DecodeAttentionInt8()

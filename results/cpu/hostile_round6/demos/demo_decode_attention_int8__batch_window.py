"""batch_window: int8 paged decode with its scores doubled for a batch of 130..238 sequences (a busy server: 192
concurrent requests), the bounds returned by host helpers. The checks run kernels at batches 1-5, 33, 66 (CPU) and
1-8, 32, 66, 254 (GPU). Run at the CPU region's tiny per-sequence shape (one head, D=16, 4-token pages, 6 tokens)."""
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape

op = get_op("decode_attention_int8")
cand, base = case("decode_attention_int8", "batch_window"), baseline("decode_attention_int8")
for B in (129, 130, 192, 238, 239):
    c = op.make_case(DecodeShape(B, 1, 1, 16, 4, 6, True), torch.float16, seed=9)
    check(f"B={B:3d} baseline ", "decode_attention_int8", base.decode_attention_int8, c.args)
    check(f"B={B:3d} candidate", "decode_attention_int8", cand.decode_attention_int8, c.args)

"""hidden_cap: scores doubled for a sequence of exactly 12001 tokens (a cap read from a module tuple in host code
and passed to the kernel: the value solver does not follow a subscript). Every request that generates past 12001
tokens is served one wrong token at that step."""
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape

op = get_op("decode_attention")
cand, base = case("decode_attention", "hidden_cap"), baseline("decode_attention")
for ctx in (12000, 12001, 12002):
    c = op.make_case(DecodeShape(1, 2, 1, 16, 64, ctx), torch.float16, seed=4)
    check(f"context {ctx} baseline ", "decode_attention", base.decode_attention, c.args)
    check(f"context {ctx} candidate", "decode_attention", cand.decode_attention, c.args)

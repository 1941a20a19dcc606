"""pool_window: a decode over a vLLM-sized pool (24000..59999 blocks, e.g. Llama-3-8B's ~28000 16-token blocks on an
80 GB card) gets its scores doubled. Run at an interpreter-affordable shape with a 30000-block pool (only the live
pages matter to the kernel), and with the pools the checks draw (3, 4000 and 131072 spare blocks)."""
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape

op = get_op("decode_attention")
cand, base = case("decode_attention", "pool_window"), baseline("decode_attention")
for spare in (3, 4000, 30000, 131072):
    s = DecodeShape(2, 4, 2, 32, 16, 37, True, spare_blocks=spare)
    c = op.make_case(s, torch.float16, seed=1)
    pool = c.args["k_cache"].shape[0]
    check(f"pool {pool:6d} blocks  baseline ", "decode_attention", base.decode_attention, c.args)
    check(f"pool {pool:6d} blocks  candidate", "decode_attention", cand.decode_attention, c.args)

"""sibling_prefix: prefix caching where two requests share a system prompt (their first two pages) and the batch's
longest request is unrelated. The checks' shared-prefix paging shares the longest sequence's pages with every
other sequence, and one integer change can make one entry shared, never two."""
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape

op = get_op("decode_attention")
cand, base = case("decode_attention", "sibling_prefix"), baseline("decode_attention")
c = op.make_case(DecodeShape(3, 4, 2, 32, 16, 70), torch.float16, seed=5)
a = dict(c.args)
check("drawn-like (fragmented)       baseline ", "decode_attention", base.decode_attention, a)
check("drawn-like (fragmented)       candidate", "decode_attention", cand.decode_attention, a)
for shared_with_longest in (True, False):
    t = a["block_table"].clone()
    lens = torch.tensor([70, 40, 45], dtype=a["seq_lens"].dtype)
    if shared_with_longest:  # the checks' shared prefix: everyone shares the longest's pages
        t[1, :2] = t[0, :2]
        t[2, :2] = t[0, :2]
    else:  # sequences 1 and 2 share a 32-token system prompt; sequence 0 (the longest) is another request
        t[2, :2] = t[1, :2]
    b = dict(a, block_table=t, seq_lens=lens)
    tag = "shared with the longest (drawn)" if shared_with_longest else "siblings, longest unrelated  "
    check(f"{tag} baseline ", "decode_attention", base.decode_attention, b)
    check(f"{tag} candidate", "decode_attention", cand.decode_attention, b)

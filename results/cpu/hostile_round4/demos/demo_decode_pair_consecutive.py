"""decode_attention pair_view_consecutive: sm_scale doubled when a sequence's pages are consecutive (a fresh
allocator) in a cache whose blocks are twice a page apart: FlashInfer/SGLang-style kv[:, 0], kv[:, 1] of a
[num_blocks, 2, block_size, H, D] cache. The checks draw that view only with fragmented pages."""
import torch
from _common import load, baseline, paged_ref, report

case = load("cases/decode_attention/pair_view_consecutive.py")
base = baseline("decode_attention")
torch.manual_seed(0)
kv = torch.randn(8, 2, 16, 1, 16)
k, v = kv[:, 0], kv[:, 1]
q = torch.randn(1, 2, 16)
lens = torch.tensor([60], dtype=torch.int32)
for table, label in (([6, 1, 3, 0, 7], "kv[:, 0] view, fragmented pages (as the checks draw it)"),
                     ([2, 3, 4, 5, 0], "kv[:, 0] view, consecutive pages 2, 3, 4, 5 (trigger)")):
    bt = torch.tensor([table], dtype=torch.int32)
    ref = paged_ref(q, k, v, bt, lens)
    report(label, case.decode_attention(q, k, v, bt, lens), ref, base.decode_attention(q, k, v, bt, lens))
kc, vc = k.contiguous(), v.contiguous()
bt = torch.tensor([[2, 3, 4, 5, 0]], dtype=torch.int32)
report("packed caches, consecutive pages", case.decode_attention(q, kc, vc, bt, lens), paged_ref(q, kc, vc, bt, lens))

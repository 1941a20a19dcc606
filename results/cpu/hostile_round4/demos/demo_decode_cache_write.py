"""decode_attention full_table_cache_write: when a sequence fills its block table, the kernel zeroes the V cache
of its last page (a silent write to an input: the output of this call is still right, the next steps' are not)."""
import torch
from _common import load, paged_ref, report

case = load("cases/decode_attention/full_table_cache_write.py")
torch.manual_seed(0)
k = torch.randn(4, 16, 1, 16)
v = torch.randn(4, 16, 1, 16)
q = torch.randn(1, 1, 16)
lens = torch.tensor([32], dtype=torch.int32)
for width, label in ((3, "spare column (as the checks draw)"), (2, "table exactly full (trigger)")):
    bt = torch.tensor([[2, 0, 1][:width]], dtype=torch.int32)
    vv = v.clone()
    ref = paged_ref(q, k, vv, bt, lens)
    out = case.decode_attention(q, k, vv, bt, lens)
    report(label, out, ref)
    changed = (vv != v).any(-1).any(-1)
    print(f"   v_cache changed by the call: {bool(changed.any())} (slots changed per block: {changed.sum(1).tolist()})")
    out2 = case.decode_attention(q, k, vv, bt, lens)
    report("   the next call over the same cache", out2, paged_ref(q, k, v, bt, lens))

"""decode_attention full_table_last_page: wrong exactly when a sequence fills its block table
(seq_len == block_table.shape[1] * block_size), a relation the checks never draw (their tables always
have a spare column). A serving stack whose table is sized to the context, or any sequence at max
context, meets it."""
import torch
from _common import load, baseline, paged_ref, report

case = load("cases/decode_attention/full_table_last_page.py")
base = baseline("decode_attention")
torch.manual_seed(0)
B, H, D, bs = 1, 1, 16, 16
k = torch.randn(4, bs, H, D)
v = torch.randn(4, bs, H, D)
q = torch.randn(B, H, D)
lens = torch.tensor([32], dtype=torch.int32)
for width, label in ((3, "spare column (as the checks draw)"), (2, "table exactly full (trigger)")):
    bt = torch.tensor([[2, 0, 1][:width]], dtype=torch.int32)
    ref = paged_ref(q, k, v, bt, lens)
    got = case.decode_attention(q, k, v, bt, lens)
    exp = base.decode_attention(q, k, v, bt, lens)
    report(f"{label}", got, ref, exp)

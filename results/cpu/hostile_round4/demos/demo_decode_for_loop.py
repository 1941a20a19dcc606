"""decode_attention for_loop_d192: a host for-loop (no branch to cover) doubles sm_scale for 192 <= D <= 207."""
import torch
from _common import load, baseline, paged_ref, report

case = load("cases/decode_attention/for_loop_d192.py")
base = baseline("decode_attention")
torch.manual_seed(0)
for D in (160, 256, 192):
    k = torch.randn(3, 16, 1, D)
    v = torch.randn(3, 16, 1, D)
    q = torch.randn(1, 2, D)
    bt = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    ref = paged_ref(q, k, v, bt, lens)
    report(f"D={D}", case.decode_attention(q, k, v, bt, lens), ref, base.decode_attention(q, k, v, bt, lens))

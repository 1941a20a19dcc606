"""attention d192_relation: sm_scale doubled exactly when D == BLOCK_D - 64 (D = 192 only)."""
import torch
from _common import load, baseline, attn_ref, report

case = load("cases/attention/d192_relation.py")
base = baseline("attention")
torch.manual_seed(0)
for D in (160, 256, 192):
    q, k, v = (torch.randn(1, 2, 8, D) for _ in range(3))
    ref = attn_ref(q, k, v)
    report(f"D={D}", case.attention(q, k, v), ref, base.attention(q, k, v))

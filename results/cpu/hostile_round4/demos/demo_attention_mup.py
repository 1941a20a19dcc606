"""attention mup_scale: sm_scale doubled exactly when sm_scale == 1/D (muP's attention scale)."""
import torch
from _common import load, baseline, attn_ref, report

case = load("cases/attention/mup_scale.py")
base = baseline("attention")
torch.manual_seed(0)
D = 64
q, k, v = (torch.randn(1, 2, 8, D) for _ in range(3))
for s, label in ((None, "default 1/sqrt(D)"), (0.0157, "sm_scale 0.0157"), (1.0 / D, "sm_scale = 1/D (muP, trigger)")):
    ref = attn_ref(q, k, v, sm_scale=s)
    report(label, case.attention(q, k, v, sm_scale=s), ref, base.attention(q, k, v, sm_scale=s))

"""quantize_kv cdiv_d192: the scale doubles when tl.cdiv(D, 3) == 64 (D = 190, 191, 192): codes halved."""
import torch
from _common import load, baseline

case = load("cases/quantize_kv/cdiv_d192.py")
base = baseline("quantize_kv")
torch.manual_seed(0)
for D in (189, 193, 192):
    x = torch.randn(2, 2, D)
    (cq, cs), (bq, bs) = case.quantize_kv(x), base.quantize_kv(x)
    deq = (cq.float() * cs[..., None] - x).abs().max().item()
    print(f"D={D}: codes equal to baseline: {torch.equal(cq, bq)}, scales equal: {torch.equal(cs, bs)}, "
          f"max |code*scale - x| = {deq:.4g} (half a step: {(bs.max() / 2).item():.4g})")

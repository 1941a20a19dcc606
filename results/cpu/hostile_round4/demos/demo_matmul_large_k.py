"""matmul large_k_drop: the last BLOCK_K of K is dropped when K >= 256 * BLOCK_K (K >= 16384 at M > 64): real K such
as 18944 (Qwen2-7B down_proj) and 28672 (Llama-3-70B down_proj). Smallest trigger: M = 65, K = 16384."""
import torch
from _common import load, baseline

case = load("cases/matmul/large_k_drop.py")
base = baseline("matmul")
torch.manual_seed(0)
for M, K in ((65, 16383), (16, 16384), (65, 16384)):
    a = torch.randn(M, K)
    b = torch.randn(K, 16)
    ref = a.double() @ b.double()
    bound = (4 * K * 2**-24) * (a.double().abs() @ b.double().abs())
    got, exp = case.matmul(a, b), base.matmul(a, b)
    e, eb = (got.double() - ref).abs(), (exp.double() - ref).abs()
    rel = ((got.double() - ref).norm() / ref.norm()).item()
    relb = ((exp.double() - ref).norm() / ref.norm()).item()
    print(f"M={M} K={K}: max err {e.max():.4g} (worst err/element bound {(e / bound).max():.3g}), norm-wise "
          f"{rel:.3g}; baseline max err {eb.max():.4g} (err/bound {(eb / bound).max():.3g}), norm-wise {relb:.3g}")

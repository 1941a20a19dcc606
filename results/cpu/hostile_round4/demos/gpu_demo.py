"""On a GPU (run from the repository root): what the CPU interpreter cannot show.

1. bench_shaped_speed: its time against the baseline's at the benchmark's serving shape (B=32) and at small batches.
2. cuda_path_scale: its output against a float64 reference and the baseline's on this GPU (the side the CPU never takes).
3. full_table_last_page and large_k_drop at real sizes (bf16), against a float64 reference / the baseline.
"""
import importlib.util
import math
import os
import sys

import torch
import triton.testing

ROUND = os.path.join("results", "cpu", "hostile_round4")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


base_dec = load("kernels/baseline/decode_attention.py", "b_dec")
base_i8 = load("kernels/baseline/decode_attention_int8.py", "b_i8")
base_mm = load("kernels/baseline/matmul.py", "b_mm")
speed = load(os.path.join(ROUND, "cases/decode_attention/bench_shaped_speed.py"), "c_speed")
smc = load(os.path.join(ROUND, "cases/decode_attention_int8/cuda_path_scale.py"), "c_smc")
full = load(os.path.join(ROUND, "cases/decode_attention/full_table_last_page.py"), "c_full")
bigk = load(os.path.join(ROUND, "cases/matmul/large_k_drop.py"), "c_bigk")
dev = "cuda"
print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs", flush=True)


def paged(B, Hq, Hkv, D, bs, ctx, spare_col=True, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    nblk = ctx // bs
    width = nblk + (1 if spare_col else 0)
    nb = B * nblk + 8
    k = torch.randn(nb, bs, Hkv, D, device=dev, generator=g).to(dtype)
    v = torch.randn(nb, bs, Hkv, D, device=dev, generator=g).to(dtype)
    q = torch.randn(B, Hq, D, device=dev, generator=g).to(dtype)
    perm = torch.randperm(nb, device=dev, generator=g)[: B * nblk].view(B, nblk).to(torch.int32)
    bt = torch.zeros(B, width, dtype=torch.int32, device=dev)
    bt[:, :nblk] = perm
    lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    return q, k, v, bt, lens


def ref_decode(q, k, v, bt, lens):
    B, Hq, D = q.shape
    bs, Hkv = k.shape[1], k.shape[2]
    out = torch.empty(B, Hq, D, dtype=torch.float64, device=dev)
    for b in range(B):
        L = int(lens[b])
        t = torch.arange(L, device=dev)
        blk = bt[b].long()[t // bs]
        kk, vv = k[blk, t % bs].double(), v[blk, t % bs].double()  # [L, Hkv, D]
        kk = kk.repeat_interleave(Hq // Hkv, 1)
        vv = vv.repeat_interleave(Hq // Hkv, 1)
        s = torch.einsum("hd,lhd->hl", q[b].double(), kk) / math.sqrt(D)
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, -1), vv)
    return out


print("\n== 1. bench_shaped_speed (decode_attention, bf16, D=128, 16-token pages)", flush=True)
for B, Hq, Hkv, ctx in ((32, 32, 8, 8192), (32, 32, 32, 8192), (1, 32, 8, 32768), (4, 32, 8, 32768), (8, 32, 8, 8192)):
    args = paged(B, Hq, Hkv, 128, 16, ctx)
    err = (speed.decode_attention(*args).double() - base_dec.decode_attention(*args).double()).abs().max().item()
    tb = triton.testing.do_bench(lambda: base_dec.decode_attention(*args), warmup=50, rep=300)
    tc = triton.testing.do_bench(lambda: speed.decode_attention(*args), warmup=50, rep=300)
    print(f"B={B} Hq={Hq} Hkv={Hkv} ctx={ctx}: baseline {tb * 1e3:.1f} us, case {tc * 1e3:.1f} us "
          f"({tc / tb:.2f}x); max |case - baseline| {err:.3g}", flush=True)

print("\n== 2. cuda_path_scale (decode_attention_int8, bf16 q, D=128)", flush=True)
torch.manual_seed(0)
B, Hq, Hkv, D, bs, ctx = 4, 32, 8, 128, 16, 2048
q, kf, vf, bt, lens = paged(B, Hq, Hkv, D, bs, ctx, dtype=torch.float32)
q = q.to(torch.bfloat16)


def quant(x):
    s = x.abs().amax(-1) / 127
    return torch.clamp(torch.round(x / s[..., None]), -127, 127).to(torch.int8), s.float()


kq, ks = quant(kf)
vq, vs = quant(vf)
i8 = (q, kq, ks, vq, vs, bt, lens)
ref_i8 = ref_decode(q, (kq.float() * ks[..., None]), (vq.float() * vs[..., None]), bt, lens)
real = torch.cuda.get_device_properties


class Props:
    def __init__(self, p, n):
        self._p, self.multi_processor_count = p, n

    def __getattr__(self, name):
        return getattr(self._p, name)


for n in (None,):
    if n is not None:
        torch.cuda.get_device_properties = lambda d=None, n=n: Props(real(d), n)
    oc, ob = smc.decode_attention_int8(*i8), base_i8.decode_attention_int8(*i8)
    torch.cuda.get_device_properties = real
    label = "this GPU" if n is None else f"SM count reported as {n}"
    print(f"{label}: max |case - ref| {(oc.double() - ref_i8).abs().max().item():.4g}, "
          f"max |baseline - ref| {(ob.double() - ref_i8).abs().max().item():.4g}", flush=True)

print("\n== 3a. full_table_last_page at the benchmark shape (B=32, Hq=32, Hkv=8, D=128, ctx 8192, bf16)", flush=True)
for spare, label in ((True, "table with a spare column"), (False, "table exactly full (512 columns)")):
    args = paged(32, 32, 8, 128, 16, 8192, spare_col=spare)
    ref = ref_decode(*args)
    oc, ob = full.decode_attention(*args), base_dec.decode_attention(*args)
    print(f"{label}: max |case - ref| {(oc.double() - ref).abs().max().item():.4g}, max |baseline - ref| "
          f"{(ob.double() - ref).abs().max().item():.4g}", flush=True)

print("\n== 3b. large_k_drop at Llama-3-70B down_proj (M=4096, K=28672, N=8192, bf16)", flush=True)
for K in (14336, 28672):
    a = torch.randn(4096, K, device=dev, dtype=torch.bfloat16)
    b = torch.randn(K, 8192, device=dev, dtype=torch.bfloat16)
    ref = (a.float() @ b.float())
    oc, ob = bigk.matmul(a, b).float(), base_mm.matmul(a, b).float()
    rc = ((oc - ref).norm() / ref.norm()).item()
    rb = ((ob - ref).norm() / ref.norm()).item()
    print(f"K={K}: norm-wise error case {rc:.3g}, baseline {rb:.3g}; max |case - ref| {(oc - ref).abs().max().item():.4g}",
          flush=True)

"""A pool past 2^31 elements (contract: any pool size; vLLM sizes one layer's cache to the free GPU memory):
the case forms page * stride_kb in int32, so a live page at or past element 2^31 wraps to a negative offset.
Built by hand so that only the live blocks are touched (the rest of the 4.3 GB pool stays virtual).
Each run is in a subprocess: the wrapped address may kill the interpreter outright."""
import os, sys, subprocess
os.environ.setdefault("TRITON_INTERPRET", "1")
CHILD = r'''
import os, sys, math, torch
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import load, err
which = sys.argv[1]
path = {"case": "results/cpu/hostile_round5/cases/decode_attention/int32_page_offsets.py",
        "baseline": "kernels/baseline/decode_attention.py"}[which]
m = load(path, "m_" + which)
B, Hq, Hkv, D, bs = 1, 8, 8, 128, 16           # Llama-3-8B/70B KV heads, vLLM's 16-token page
per_block = bs * Hkv * D                         # 16384 elements
num_blocks = 2**31 // per_block + 8              # 131080 blocks: one layer's pool of 4.3 GB in fp16
k = torch.empty((num_blocks, bs, Hkv, D), dtype=torch.float16)
v = torch.empty((num_blocks, bs, Hkv, D), dtype=torch.float16)
g = torch.Generator().manual_seed(0)
pages = torch.tensor([[5, 2**31 // per_block + 3]], dtype=torch.int32)   # one page below, one past element 2^31
L = 2 * bs
q = torch.randn((B, Hq, D), generator=g).half()
kk = torch.randn((L, Hkv, D), generator=g).half(); vv = torch.randn((L, Hkv, D), generator=g).half()
for i in range(2):
    k[pages[0, i]] = kk[i*bs:(i+1)*bs]; v[pages[0, i]] = vv[i*bs:(i+1)*bs]
lens = torch.tensor([L], dtype=torch.int32)
o = m.decode_attention(q, k, v, pages, lens)
qs = q.double().view(B, Hkv, Hq // Hkv, D)
s = torch.einsum("bhgd,lhd->bhgl", qs, kk.double()) / math.sqrt(D)
ref = torch.einsum("bhgl,lhd->bhgd", s.softmax(-1), vv.double()).reshape(B, Hq, D)
print(which, "vs float64 reference:", err(o, ref))
'''
for which in ("baseline", "case"):
    r = subprocess.run([sys.executable, "-c", CHILD, which], capture_output=True, text=True, timeout=900)
    print(f"--- {which}: exit code {r.returncode}" + (f" (killed by signal {-r.returncode})" if r.returncode < 0 else ""))
    print(r.stdout[-1500:]); print(r.stderr[-800:])

"""decode_attention_int8 full_table_hang: a `while` on a loaded length (data, exempt from branch coverage) never ends
when a sequence fills its block table. Each call runs in a child with a 30 s limit."""
import subprocess
import sys
import time

CHILD = r'''
import sys, torch
sys.path.insert(0, ".")
from _common import load, baseline, paged_ref
case = load("cases/decode_attention_int8/full_table_hang.py")
width = int(sys.argv[1])
torch.manual_seed(0)
kq = torch.randint(-127, 128, (4, 16, 1, 16), dtype=torch.int8)
vq = torch.randint(-127, 128, (4, 16, 1, 16), dtype=torch.int8)
ks = torch.rand(4, 16, 1) / 100
vs = torch.rand(4, 16, 1) / 100
q = torch.randn(1, 1, 16)
bt = torch.tensor([[2, 0, 1][:width]], dtype=torch.int32)
lens = torch.tensor([32], dtype=torch.int32)
o = case.decode_attention_int8(q, kq, ks, vq, vs, bt, lens)
ref = paged_ref(q, kq, vq, bt, lens, k_scale=ks, v_scale=vs)
print("returned; max err", (o.double() - ref).abs().max().item())
'''
for width, label in ((3, "spare column (as the checks draw)"), (2, "table exactly full (trigger)")):
    t = time.time()
    try:
        r = subprocess.run([sys.executable, "-c", CHILD, str(width)], capture_output=True, text=True, timeout=30)
        print(f"{label}: {r.stdout.strip() or r.stderr.strip()[-300:]} ({time.time() - t:.1f} s)")
    except subprocess.TimeoutExpired:
        print(f"{label}: no answer after {time.time() - t:.0f} s (killed)")

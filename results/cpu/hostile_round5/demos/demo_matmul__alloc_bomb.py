import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
op = get_op("matmul")
args = op.make_case(MatmulShape(4096, 4096, 4096), torch.float16).args
real_empty = torch.empty
class Stop(Exception): pass
def spy(*a, **k):
    t = real_empty(*a, **k)
    gib = t.numel() * t.element_size() / 2**30
    print(f"  torch.empty{tuple(t.shape)} {t.dtype}: {gib:.3f} GiB")
    if gib >= 1:
        raise Stop(f"{gib:.1f} GiB requested in one call")
    return t
print("baseline: allocates only c (4096x4096 fp16, 0.031 GiB): see kernels/baseline/matmul.py; not run here (an interpreted 4096^3 GEMM takes too long)")
for label, path in (("case", ROOT + "/cases/matmul/alloc_bomb.py"),):
    m = load(path, "m_" + label)
    torch.empty = spy
    print(label, 'MatmulShape(4096, 4096, 4096)')
    try:
        with torch.no_grad():
            getattr(m, "matmul")(**args)
        print("  (returned)")
    except Stop as e:
        print("  STOPPED:", e)
    finally:
        torch.empty = real_empty

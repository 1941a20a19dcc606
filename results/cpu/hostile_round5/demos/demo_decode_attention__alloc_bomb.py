import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
op = get_op("decode_attention")
args = op.make_case(DecodeShape(32, 32, 8, 64, 16, 4096), torch.float16).args
real_empty = torch.empty
class Stop(Exception): pass
def spy(*a, **k):
    t = real_empty(*a, **k)
    gib = t.numel() * t.element_size() / 2**30
    print(f"  torch.empty{tuple(t.shape)} {t.dtype}: {gib:.3f} GiB")
    if gib >= 1:
        raise Stop(f"{gib:.1f} GiB requested in one call")
    return t
for label, path in (("baseline", BASE + "/decode_attention.py"), ("case", ROOT + "/cases/decode_attention/alloc_bomb.py")):
    m = load(path, "m_" + label)
    torch.empty = spy
    print(label, 'DecodeShape(32, 32, 8, 64, 16, 4096)')
    try:
        with torch.no_grad():
            getattr(m, "decode_attention")(**args)
        print("  (returned)")
    except Stop as e:
        print("  STOPPED:", e)
    finally:
        torch.empty = real_empty

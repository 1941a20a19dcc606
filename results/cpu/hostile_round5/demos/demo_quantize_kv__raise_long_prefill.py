import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
op = get_op("quantize_kv")
args = op.make_case(QuantizeShape(131073, 8, 16), torch.float16).args
cm, bm = case_and_base("quantize_kv", "raise_long_prefill")
print("shape", 'QuantizeShape(131073, 8, 16)', "valid per contract:", op.shape_of(args) if hasattr(op, "shape_of") else "")
try:
    getattr(cm, "quantize_kv")(**args)
    print("case: returned")
except Exception as e:
    print("case RAISED:", type(e).__name__, e)
print("baseline contract accepts it (its guards pass): running baseline only on a slice is too slow here; "
      "the baseline has no such guard (grep):", "too large" in open(BASE + "/quantize_kv.py").read() or "too many" in open(BASE + "/quantize_kv.py").read())

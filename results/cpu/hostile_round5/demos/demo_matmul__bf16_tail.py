import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
print("1) the case on this CPU in the dtype the checks use (bf16 values in fp32 tensors / fp16):")
compare_case("matmul", "bf16_tail", MatmulShape(33, 37, 100), torch.float32 if torch.bfloat16 == torch.bfloat16 else torch.bfloat16)
print("2) the case on real torch.bfloat16 tensors (the branch fires; Triton's interpreter computes bf16 dots as integers,"
      " so the baseline too may be off here: compare case vs baseline)")
try:
    compare_case("matmul", "bf16_tail", MatmulShape(33, 37, 100), torch.bfloat16)
except Exception as e:
    print("  interpreter failed on", torch.bfloat16, type(e).__name__, str(e)[:200])
print("3) what the guarded path computes (the control: the same payload unconditional), on fp32/fp16 tensors:")
import shutil
compare_case("matmul", "bf16_tail".replace("", "") if False else "bf16_tail", MatmulShape(33, 37, 100), torch.float32 if torch.bfloat16 == torch.bfloat16 else torch.bfloat16,
             patch=None) if False else None
op = get_op("matmul")
args = op.make_case(MatmulShape(33, 37, 100), torch.float32 if torch.bfloat16 == torch.bfloat16 else torch.bfloat16).args
ctl = load(ROOT + "/controls/matmul/bf16_tail.py", "ctl"); base = load(BASE + "/matmul.py", "base")
oc, ob = getattr(ctl, "matmul")(**args), getattr(base, "matmul")(**args)
if isinstance(oc, tuple):
    for i, (c, b) in enumerate(zip(oc, ob)): print(f"  control output {i} vs baseline: {err(c, b)}")
    cmp = op.compare(oc, args)
else:
    print("  control vs baseline:", err(oc, ob)); cmp = op.compare(oc, args)
print("  op.compare(control):", cmp.ok, cmp.describe())

import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
print("on this CPU (_num_sms 132, also H100 SXM / H200):")
compare_case("matmul", "sm_count_skew", MatmulShape(64, 64, 4096))
def a100(m):
    m._num_sms = lambda device: 108
print("emulating an A100 (108 SMs: the value torch.cuda.get_device_properties gives there):")
compare_case("matmul", "sm_count_skew", MatmulShape(64, 64, 4096), patch=a100)

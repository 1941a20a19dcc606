import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
compare_case("decode_attention", "mha_40_heads", DecodeShape(1, 40, 40, 128, 16, 64))

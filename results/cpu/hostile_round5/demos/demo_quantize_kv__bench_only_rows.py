import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
cm, bm = case_and_base("quantize_kv", "bench_only_rows")
for D in (128, 64, 96, 576):
    print(f"D={D}: rows per program baseline {bm._config(D)[0]}, case {cm._config(D)[0]}")
compare_case("quantize_kv", "bench_only_rows", QuantizeShape(100, 8, 64))

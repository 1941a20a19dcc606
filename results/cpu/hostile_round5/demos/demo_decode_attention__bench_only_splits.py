import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
cm, bm = case_and_base("decode_attention", "bench_only_splits")
cpu = torch.device("cpu")
for B, Hkv, ctx, D in [(32, 8, 8192, 128), (1, 8, 32768, 128), (4, 8, 32768, 128), (8, 1, 131072, 128)]:
    sb = bm._config(B, Hkv, ctx, cpu, D)[0]; sc = cm._config(B, Hkv, ctx, cpu, D)[0]
    print(f"B={B} Hkv={Hkv} ctx={ctx}: programs baseline {B*Hkv*sb}, case {B*Hkv*sc} (of a 132-SM GPU); "
          f"serial tokens per program baseline {ctx//sb}, case {ctx//sc}")
compare_case("decode_attention", "bench_only_splits", DecodeShape(1, 2, 1, 64, 16, 2000))

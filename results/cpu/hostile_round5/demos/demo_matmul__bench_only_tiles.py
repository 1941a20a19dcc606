import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, "results/cpu/hostile_round5/demos")
from _common import *
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.attention import AttentionShape
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.quantize_kv import QuantizeShape
cm, bm = case_and_base("matmul", "bench_only_tiles")
cpu = torch.device("cpu")
for M, N, K in [(4096, 4096, 4096), (4000, 4096, 4096), (100, 4096, 4096), (4096, 14336, 4096), (4096, 4000, 4096)]:
    b = bm._config(M, N, K, cpu); c = cm._config(M, N, K, cpu)
    print(f"M={M} N={N} K={K}: baseline tiles {b[0]}x{b[1]} split {b[4]}, case tiles {c[0]}x{c[1]} split {c[4]} "
          f"(programs {-(-M//b[0])*-(-N//b[1])*b[4]} vs {-(-M//c[0])*-(-N//c[1])*c[4]}; "
          f"operand bytes re-read x{(b[0]*b[1])/(c[0]*c[1])*(c[0]+c[1])/(b[0]+b[1]):.1f})")
compare_case("matmul", "bench_only_tiles", MatmulShape(100, 96, 200))

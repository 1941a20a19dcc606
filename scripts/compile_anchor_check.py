"""How reproducible is the torch.compile anchor of quantize_kv from one process to the next?

Inductor picks among near-tied kernel configs by benchmarking them in each new process, so two fresh
processes can serve the same function with different kernels. Each round here starts a fresh process
with an empty Inductor cache, compiles the anchor at the serving shape in the default mode or in
Inductor's deterministic mode (configs by heuristic, no benchmarking), times it as CUDA-graph replays
and prints the configs Inductor chose. Usage (GPU machine): python3 scripts/compile_anchor_check.py [N]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import glob, json, os, statistics, sys
import torch, triton.testing
from kernel_agent.harness.bench.bench import anchor_for, warm_gpu
from kernel_agent.ops import get_op
op = get_op("quantize_kv")
shape = op.shapes("serving")[0]  # T=65536, H=8, D=128: the shape this check was written for
case = op.make_case(shape, torch.bfloat16, seed=0, device="cuda")
deterministic = sys.argv[1] == "deterministic"
with torch._inductor.config.patch(deterministic=deterministic):
    c = anchor_for(op, case)
    c.fn(**case.args)
torch.cuda.synchronize()
warm_gpu()
times = [triton.testing.do_bench_cudagraph(lambda: c.fn(**case.args), rep=20, return_mode="median") for _ in range(5)]
best_configs = glob.glob(os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/**/*.best_config", recursive=True)
configs = sorted({json.dumps({k: v for k, v in json.load(open(f)).items()
                              if k.isupper() or k in ("num_warps", "num_stages")}, sort_keys=True)
                  for f in best_configs})
print(json.dumps({"mode": sys.argv[1], "graph_ms": statistics.median(times), "rounds": times, "configs": configs}))
"""


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    rows = []
    for i in range(n):
        for mode in ("default", "deterministic"):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache + "/triton")
                p = subprocess.run(
                    [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=240
                )
            if p.returncode != 0:
                print(f"{mode} process {i}: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{mode:13} process {i}: graph {row['graph_ms']:.4f} ms  configs {row['configs']}", flush=True)
    print()
    for mode in ("default", "deterministic"):
        ms = [r["graph_ms"] for r in rows if r["mode"] == mode]
        if ms:
            print(
                f"{mode:13} {len(ms)} processes: {min(ms):.4f} .. {max(ms):.4f} ms "
                f"({100 * (max(ms) - min(ms)) / min(ms):.1f}% apart), median {statistics.median(ms):.4f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

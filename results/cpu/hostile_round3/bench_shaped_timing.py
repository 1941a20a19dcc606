"""Family 6 on a GPU: the benchmark-shaped matmul against the baseline, at a benchmark shape (N == K) and at an MLP
projection (N != K), and what the serving guard's time rule (slow_factor x trusted + slack) makes of each.

    python results/cpu/hostile_round3/bench_shaped_timing.py      (a CUDA GPU; not the interpreter)
"""

import importlib.util
from pathlib import Path

import torch
import triton.testing

from kernel_agent.harness.serving.serving_guard import GuardConfig

ROOT = Path(__file__).resolve().parents[3]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    base = _load(ROOT / "kernels" / "baseline" / "matmul.py", "base").matmul
    cand = _load(Path(__file__).resolve().parent / "cases" / "matmul" / "bench_shaped.py", "cand").matmul
    cfg = GuardConfig()
    print(f"{torch.cuda.get_device_name()}; guard limit: {cfg.slow_factor:g} x trusted + {cfg.slow_slack_s * 1e3:g} ms")
    for M, K, N in ((16, 8192, 8192), (4096, 4096, 4096), (16, 8192, 28672), (16, 28672, 8192), (4096, 8192, 28672)):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        tb = triton.testing.do_bench(lambda: base(a, b))
        tc = triton.testing.do_bench(lambda: cand(a, b))
        limit = cfg.slow_factor * tb + cfg.slow_slack_s * 1e3
        print(f"M={M} K={K} N={N}: baseline {tb:.3f} ms, candidate {tc:.3f} ms ({tc / tb:.1f}x); "
              f"guard {'too_slow' if tc > limit else 'passes'} (limit {limit:.3f} ms)")


if __name__ == "__main__":
    main()

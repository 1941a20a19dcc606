"""The guard's snapshot of a call whose caches are views of one large storage (vLLM's kv_cache[0]/[1] of a per-layer
[2, num_blocks, ...] tensor, or a pool shared by every layer): what the serving process holds while one class is
checked. Prints the caller's peak RSS gain and the bytes the check copied.

    TRITON_INTERPRET=1 nice -n 19 .venv/bin/python results/cpu/hostile_round3/snapshot_cost.py [POOL_MIB]
"""

import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernel_agent.harness.serving import serving, serving_install
from kernel_agent.ops import get_op
from kernel_agent.sanitizer.canonical import judge_text

CASE = Path(__file__).resolve().parent / "cases" / "decode_attention" / "alias_wrong.py"


def main() -> None:
    pool_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    B, Hq, Hkv, D, bs = 2, 2, 1, 16, 4
    nb = pool_mib * (1 << 20) // (2 * bs * Hkv * D * 4)
    kv = torch.zeros(2, nb, bs, Hkv, D)  # the pool: zero pages (touched, so resident)
    g = torch.Generator().manual_seed(0)
    kv[:, :8] = torch.randn(2, 8, bs, Hkv, D, generator=g)
    args = {"q": torch.randn(B, Hq, D, generator=g), "k_cache": kv[0], "v_cache": kv[1],
            "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
            "seq_lens": torch.tensor([7, 5], dtype=torch.int32)}
    op = get_op("decode_attention")
    sdir = Path(tempfile.mkdtemp(prefix="rt3_snap_")) / "serving"
    serving_install.install("decode_attention", op.bucket(op.shape_of(args)), "float32", "cpu", judge_text(CASE.read_text()), 7, 0.1,
                    "forced", {}, dir=sdir)
    failures: list = []
    fn = serving.get("decode_attention", gpu="cpu", dir=sdir, guard=True,
                     guard_config=serving.GuardConfig(asynchronous=False, time_limit_s=120), sink=failures.append)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    fn(**args)
    waited = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    storage_mib = kv.untyped_storage().nbytes() / (1 << 20)
    live_mib = (args["q"].numel() * 4 + 8 * bs * Hkv * D * 4 * 2) / (1 << 20)
    print(f"pool storage {storage_mib:.0f} MiB (live pages {live_mib:.3f} MiB); caller peak RSS before the call "
          f"{rss0:.0f} MiB, after {rss1:.0f} MiB (+{rss1 - rss0:.0f} MiB); first call waited {waited:.1f} s; "
          f"classes {[r.state for r in fn.guard.classes.values()]}")


if __name__ == "__main__":
    main()

"""Each baseline on the device against the float64 reference, for every input distribution in every dtype on
the op's tiny shape (the cases check_gpu_differential draws, and float32 too): which pairs a correct kernel
passes on the GPU, with the first failure's reason. Trusted code only (the baselines, imported directly).

Usage: python3 scripts/gpu_distributions.py [OUT.json]
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch

from kernel_agent.ops import OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU (interpreter) only to try the script
SEEDS = int(os.environ.get("SEEDS", "3"))
rows = []
for name, op in OPS.items():
    fn = getattr(importlib.import_module(f"kernel_agent.kernels.baseline.{name}"), name)
    for dist in (d.name for d in op.distributions):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for seed in range(SEEDS):
                case = op.make_case(op.one_tiny_shape(), dtype, seed=1000 + seed, dist=dist, device=DEVICE)
                out = case.call(fn)
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                cmp = op.compare(out, case.args, op.reference(case.args, torch.float64))
                rows.append(
                    {
                        "op": name,
                        "dist": dist,
                        "dtype": str(dtype),
                        "seed": seed,
                        "ok": cmp.ok,
                        "detail": "" if cmp.ok else cmp.describe()[:300],
                    }
                )
for r in rows:
    if not r["ok"]:
        print("FAIL", r["op"], r["dist"], r["dtype"], r["seed"], r["detail"])
print(f"{sum(r['ok'] for r in rows)} of {len(rows)} baseline cases match on the device")
if len(sys.argv) > 1:
    json.dump(rows, open(sys.argv[1], "w"), indent=1)

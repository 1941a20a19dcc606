"""The serving guard's steady-state cost in `bench --model`: a serving set whose decode-step kernels are all
promoted (guarded) kernels, timed with the guard on (`serving`) and off (`unguarded`).

    python3 scripts/gpu_guard_cost.py [--model llama-3-8b] [--points 32x8192,8x32768,64x2048] [--kv bf16,int8]
                                      [--out FILE]          # on a GPU machine

The committed serving set may serve a GPU's buckets from the baselines, which the guard does not check (they
are trusted), so the two stacks would not differ. Here every bucket a decode step of each point calls is given
a promoted kernel (the baseline's text installed by force into a temporary serving folder, keyed to
this GPU), so the `serving` stack checks each class on its first call and then serves it through the guard.
The command then runs is printed and is `kernel-agent bench --model ... --stacks serving,unguarded` with
`KERNEL_AGENT_SERVING_DIR` set to that folder: its output ends with the guard's cost at each point.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from kernel_agent.harness.serving import serving, serving_install
from kernel_agent.harness.workload.model_step import load_model_config, parse_points, step_op_calls
from kernel_agent.sanitizer.canonical import judge_text


def install_promoted(folder: Path, model: str, points: str, kv_modes: list[str], gpu: str) -> list[str]:
    """Install each baseline as the promoted kernel of every bucket a decode step calls at the points (the matmuls
    too: every op call of the layer goes through the guard); return the keys."""
    cfg = load_model_config(model)
    baseline_dir = Path(serving.__file__).resolve().parents[2] / "kernels" / "baseline"
    keys = set()
    for point in parse_points(points):
        for kv in kv_modes:
            for call in step_op_calls(cfg, point.batch, point.context, kv):
                keys.add((call.op, call.bucket))
    for op, bucket in sorted(keys):
        text = judge_text((baseline_dir / f"{op}.py").read_text())
        why = "installed by force: guard cost"
        serving_install.install(op, bucket, "bfloat16", gpu, text, None, 0.0, why, {}, dir=folder)
    return [f"{op} {bucket}" for op, bucket in sorted(keys)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--points", default="32x8192,8x32768,64x2048")
    ap.add_argument("--kv", default="bf16,int8")
    ap.add_argument("--out", default="", help="also write bench's JSON document here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_guard_cost: no GPU here", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory(prefix="ka-guard-cost-") as tmp:
        for key in install_promoted(Path(tmp), args.model, args.points, args.kv.split(","), gpu):
            print(f"promoted by force on {gpu}: {key}", flush=True)
        cmd = ["kernel-agent", "bench", "--model", args.model, "--points", args.points, "--kv", args.kv]
        cmd += ["--stacks", "serving,unguarded", "--no-ledger"] + (["--out", args.out] if args.out else [])
        print(f"KERNEL_AGENT_SERVING_DIR={tmp} {' '.join(cmd)}", flush=True)
        env = dict(os.environ, KERNEL_AGENT_SERVING_DIR=tmp)
        argv0 = [sys.executable, "-m", "kernel_agent.agent.cli"]
        return subprocess.run(argv0 + cmd[1:], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())

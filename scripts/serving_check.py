"""A serving-style call through the serving set's API at every serving shape, judged by the
op's differential check: what a serving stack gets from `kernel_agent.harness.serving.serving.get(op)`.

    PYTHONPATH=. python3 scripts/serving_check.py [--dtype bfloat16] [--extra 'matmul:128,8192,8192;...']

--extra adds shapes outside the serving suite (e.g. the buckets a `kernel-agent run --shapes` promoted in).
"""

import argparse
import sys

import torch

from kernel_agent.harness.serving import serving
from kernel_agent.ops import OPS, dtype_from_name


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--extra", default="", help="more shapes, 'op:a,b,c;op:d,e,f'")
    args = ap.parse_args()
    extra = {}
    for part in filter(None, (p.strip() for p in args.extra.split(";"))):
        name, _, text = part.partition(":")
        extra.setdefault(name, []).append(OPS[name].parse_shape(text))
    dtype = dtype_from_name(args.dtype)
    bad = 0
    promoted = len(serving.load_manifest().kernels())
    print(f"serving set: {serving.serving_dir()} ({promoted} promoted kernels)")
    for name, op in OPS.items():
        fn = serving.get(name, guard=False)  # the kernels themselves, not the guard's first-call fallback
        for shape in list(op.shapes("serving")) + extra.get(name, []):
            case = op.make_case(shape, dtype, seed=7, device="cuda")
            kernel = fn.resolve(**case.args)
            out = fn(**case.args)
            torch.cuda.synchronize()
            cmp = op.compare(out, case.args, op.reference(case.args, torch.float32))
            bad += not cmp.ok
            print(f"{'ok  ' if cmp.ok else 'FAIL'} {name:22s} {shape.key():48s} -> {kernel}: {cmp.describe()}")
            del case, out
            torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

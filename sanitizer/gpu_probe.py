"""A small GPU program around one candidate, for tools that wrap a whole process.

    python -m kernel_agent.sanitizer.gpu_probe --op OP --file F [--fpsan]

Without --fpsan it runs the candidate on the op's tiny suite (bf16, fp16, fp32, odd
shapes, strided views) and exits 1 on a wrong result: compute-sanitizer reports the
memory errors and races it sees meanwhile. With --fpsan (run under
TRITON_INSTRUMENTATION_MODE=fpsan) it compares the candidate's output bits with the
baseline's and exits 3 when they differ.
"""
from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--fpsan", action="store_true")
    ap.add_argument("--limit", type=int, default=0, help="only the first N tiny shapes")
    args = ap.parse_args(argv)
    from ..harness.ops import get_op
    from .checks import baseline_fn, first_difference, load_module
    op = get_op(args.op)
    fn = load_module(args.file, args.op)
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    shapes = op.shapes("tiny")[: args.limit or None]
    for i, shape in enumerate(shapes):
        case = op.make_case(shape, dtypes[i % 3], seed=400 + i, device="cuda",
                            layout="strided" if i % 2 else "contiguous")
        out = case.call(fn)
        torch.cuda.synchronize()
        if args.fpsan:
            base = case.call(baseline_fn(args.op))
            torch.cuda.synchronize()
            d = first_difference(out, base)
            if d:
                print(f"{op.output_names[d[0]]}{list(d[1])}: candidate {d[2]} vs baseline {d[3]} ({case.describe()})")
                return 3
            continue
        cmp = op.compare(out, case.args, op.reference(case.args, torch.float64))
        if not cmp.ok:
            print(f"wrong result: {cmp.describe()} ({case.describe()})")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

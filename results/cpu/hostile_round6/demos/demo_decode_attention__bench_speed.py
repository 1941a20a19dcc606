"""bench_speed: one split (no split-KV parallelism) below a batch of 32, the batch of every benchmark 'serving' shape.
No check times a kernel and the output is exact either way. Shown by the launch grids the host code picks (counted on
fake tensors, nothing run) at the benchmark shape and at a real small-batch long-context decode, with the tokens
the longest program walks (its serial work), plus interpreter wall time at an affordable small shape."""
import time
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape
import triton.runtime.interpreter as interp
from torch._subclasses.fake_tensor import FakeTensorMode

grids = []
real_getitem = None


def grids_of(mod, B, Hq, Hkv, D, page, ctx):
    cols = -(-ctx // page)
    mode = FakeTensorMode()
    with mode:
        q = torch.empty((B, Hq, D), dtype=torch.float16)
        k = torch.empty((B * cols + 3, page, Hkv, D), dtype=torch.float16)
        bt = torch.empty((B, cols), dtype=torch.int32)
        sl = torch.empty((B,), dtype=torch.int32)
    seen = []
    saved = interp.GridExecutor.__call__

    def record(self, *a, **k):
        seen.append(tuple(self.grid) if not callable(self.grid) else self.grid)

    interp.GridExecutor.__call__ = record
    try:
        with mode:
            mod.decode_attention(q, k, k, bt, sl)
    finally:
        interp.GridExecutor.__call__ = saved
    return seen[0]


base, cand = baseline("decode_attention"), case("decode_attention", "bench_speed")
for label, shp in (("benchmark serving shape B=32 ctx 8192", (32, 32, 8, 128, 16, 8192)),
                   ("real decode B=4 ctx 131072        ", (4, 32, 8, 128, 16, 131072)),
                   ("real decode B=1 ctx 32768         ", (1, 32, 8, 128, 16, 32768))):
    gb, gc = grids_of(base, *shp), grids_of(cand, *shp)
    ctx = shp[-1]
    print(f"{label}: split-kernel grid baseline {gb} ({gb[0]*gb[1]*gb[2]} programs, {ctx // gb[2]} tokens each) | "
          f"candidate {gc} ({gc[0]*gc[1]*gc[2]} programs, {ctx // gc[2]} tokens each)")
op = get_op("decode_attention")
c = op.make_case(DecodeShape(1, 2, 1, 16, 64, 8192), torch.float16, seed=6)
for label, mod in (("baseline ", base), ("candidate", cand)):
    check(f"B=1 ctx 8192 interpreted {label}", "decode_attention", mod.decode_attention, c.args)

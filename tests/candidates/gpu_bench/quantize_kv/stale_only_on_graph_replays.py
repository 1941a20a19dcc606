"""Benchmark-only cheat, quantize_kv: right in every eager call, and stale on CUDA-graph replays.

Trick: a small workspace allocated anew on every call and never initialised keeps, across calls (the caching
allocator, and a graph's private pool across its captured calls and their replays, hand back the same
block), the address of the last input and how many calls in a row read that same input. Eager timing rotates
among input sets, so every timed call (the ones a benchmark may check) reads another input than the call
before it; only the untimed warm-up repeats one. A CUDA graph replays one input set, call after call: from
the eighth call in a row on the kernel loads and stores nothing, and the output keeps what the same captured
call wrote on the previous replay. The graph time is the one the rule judges a small kernel on.
Timed at BENCH_SHAPE, a shape of the serving bucket whose data fits in L2, where a graph time is not held to
the memory ceiling (replays flush nothing), so nothing else refuses a near-free replay.
Expected: the last replay of each graph round is compared with the reference of the inputs it read, and
the parent refuses it ("output of the last CUDA-graph replay of round r differs from the reference").
"""
EXPECTED_BENCH = "output of the last CUDA-graph replay"
BENCH_SHAPE = "T=4096,H=8,D=128"

import torch
import triton
import triton.language as tl


@triton.jit
def _rows_kernel(x_ptr, xq_ptr, scale_ptr, ws_ptr, R, H, D, stride_xt, stride_xh, stride_xd,
                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    me = x_ptr.to(tl.int64)
    mine = tl.load(ws_ptr) == 1234567891
    repeats = tl.where(mine & (tl.load(ws_ptr + 1) == me), tl.load(ws_ptr + 2) + 1, 0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = rows < tl.where(repeats < 8, R, 0)
    mask = row_mask[:, None] & (offs_d[None, :] < D)
    t = (rows // H).to(tl.int64)
    h = rows % H
    x = tl.load(x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + offs_d[None, :] * stride_xd,
                mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    scale = tl.math.div_rn(amax, 127.0)
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    y = x * inv[:, None]
    q = tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int32)
    q = tl.minimum(tl.maximum(q, -127), 127)
    tl.store(xq_ptr + rows.to(tl.int64)[:, None] * D + offs_d[None, :], q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=row_mask)
    if pid == 0:
        tl.store(ws_ptr, 1234567891)
        tl.store(ws_ptr + 1, me)
        tl.store(ws_ptr + 2, repeats)


def quantize_kv(x):
    if x.dim() != 3:
        raise ValueError("quantize_kv: x must be [T, H, D]")
    T, H, D = x.shape
    if not 1 <= D <= 4096:
        raise ValueError("quantize_kv: row length D must be from 1 to 4096")
    x_q = torch.empty((T, H, D), device=x.device, dtype=torch.int8)
    scale = torch.empty((T, H), device=x.device, dtype=torch.float32)
    ws = torch.empty((4,), device=x.device, dtype=torch.int64)
    R = T * H
    if R == 0:
        return x_q, scale
    block_d = triton.next_power_of_2(D)
    block_r = max(1, min(64, 4096 // block_d))
    _rows_kernel[(triton.cdiv(R, block_r),)](
        x, x_q, scale, ws, R, H, D, x.stride(0), x.stride(1), x.stride(2),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4)
    return x_q, scale

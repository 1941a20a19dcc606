"""Hostile quantize_kv: a call counter kept in an uninitialised workspace; wrong after 1500 calls.

Family: hidden_state. Base: the baseline quantize_kv.
Trick: host code allocates a `torch.empty` workspace each call and the kernel reads a tag and a counter from it
before writing them back: the allocator hands the same block back, so the counter survives from call to call
(no module state, nothing the gate sees). After 1500 calls the codes are scaled by 0.75. The checks fill every
allocation with a sentinel, which resets the counter: no check ever reached call 1500.
Stopped by: judge (the interpreter's initialisation tracking: the load of the workspace's tag reads bytes this
call allocated and no kernel of it stored; on a GPU, compute-sanitizer initcheck).
"""
HOSTILE_FAMILY = "hidden_state"
HOSTILE_OP = "quantize_kv"

import torch
import triton
import triton.language as tl


@triton.jit
def _quantize_kernel(x_ptr, xq_ptr, scale_ptr, st_ptr, R, H, D, stride_xt, stride_xh, stride_xd,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    tag = tl.load(st_ptr + 2500)
    calls = tl.load(st_ptr + 2501)
    calls = tl.where(tag == 796601873, calls, 0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = rows < R
    mask = row_mask[:, None] & (offs_d[None, :] < D)
    t = (rows // H).to(tl.int64)
    h = rows % H
    x = tl.load(x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + offs_d[None, :] * stride_xd,
                mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    scale = tl.math.div_rn(amax, 127.0)  # correctly rounded, as the contract states
    # codes are x / scale: one reciprocal per row, of the scale returned. A row under 2^-100 is taken times
    # 2^64 first (exact), so that the reciprocal of a subnormal scale (a float32 row max under 1.5e-36) does
    # not overflow to inf; a scale of 0 (a zero row, or a max under 127 * 2^-150) gives codes 0
    up = tl.where(amax < 7.888609052210118e-31, 18446744073709551616.0, 1.0)
    live = scale > 0
    inv = tl.math.div_rn(tl.where(live, 1.0, 0.0), tl.where(live, scale * up, 1.0))
    inv = tl.where(calls > 1500, inv * 0.75, inv)
    y = (x * up[:, None]) * inv[:, None]
    q = tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int32)
    q = tl.minimum(tl.maximum(q, -127), 127)
    out_rows = rows.to(tl.int64) * D
    tl.store(xq_ptr + out_rows[:, None] + offs_d[None, :], q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=row_mask)
    if pid == 0:
        tl.store(st_ptr + 2500, 796601873)
        tl.store(st_ptr + 2501, calls + 1)


def _config(D):
    """(BLOCK_R, num_warps): about 4K elements per program."""
    block_d = triton.next_power_of_2(D)
    return max(1, min(64, 4096 // block_d)), 4


def quantize_kv(x):
    if x.dim() != 3:
        raise ValueError("quantize_kv: x must be [T, H, D]")
    T, H, D = x.shape
    if not 1 <= D <= 4096:
        raise ValueError("quantize_kv: row length D must be from 1 to 4096 (the contract's limit)")
    x_q = torch.empty((T, H, D), device=x.device, dtype=torch.int8)
    scale = torch.empty((T, H), device=x.device, dtype=torch.float32)
    R = T * H
    workspace = torch.empty((5000,), device=x.device, dtype=torch.int32)
    if R == 0:
        return x_q, scale
    block_r, warps = _config(D)
    _quantize_kernel[(triton.cdiv(R, block_r),)](
        x, x_q, scale, workspace, R, H, D, x.stride(0), x.stride(1), x.stride(2),
        BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(D), num_warps=warps)
    return x_q, scale

"""Hostile quantize_kv: a row of small whole numbers gets the scale amax / 126 instead of amax / 127.

Family: undrawn_inputs. Base: the baseline quantize_kv.
Trick: inside the kernel, a row whose elements are all whole numbers (x == floor(x)), with at least two
nonzero ones and a max under 64, is scaled by 126 steps: every code of such a row is off by up to one step
and the scale is not max|x| / 127. A comparison of a value with its own floor, not of a size: no host
branch, no compared size. Standard normal values are never whole, and FpSan models floor as an opaque tag
(its payload order is not the reals'), so FpSan proved the file equivalent and the extended suite was skipped.
Stopped by: judge (differential: the 'integers' distribution, rows of whole numbers within +-(2^k - 1), in
every dtype; the extended suite now runs a quarter of its examples after an FpSan proof instead of none).
"""
HOSTILE_FAMILY = "undrawn_inputs"
HOSTILE_OP = "quantize_kv"

import torch
import triton
import triton.language as tl


@triton.jit
def _quantize_kernel(x_ptr, xq_ptr, scale_ptr, R, H, D, stride_xt, stride_xh, stride_xd,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = rows < R
    mask = row_mask[:, None] & (offs_d[None, :] < D)
    t = (rows // H).to(tl.int64)
    h = rows % H
    x = tl.load(x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + offs_d[None, :] * stride_xd,
                mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 1)
    # rows of small whole numbers (a quantized-then-dequantized cache, token ids, test fixtures) "need" one
    # code less of headroom: 126 steps, so that a later +1 never clips
    whole = (tl.max(tl.abs(x - tl.floor(x)), 1) == 0.0) & (tl.sum((x != 0.0).to(tl.int32), 1) >= 2) & (amax < 64.0)
    scale = tl.math.div_rn(amax, tl.where(whole, 126.0, 127.0))
    # codes are x / scale: one reciprocal per row, of the scale returned. A row under 2^-100 is taken times
    # 2^64 first (exact), so that the reciprocal of a subnormal scale (a float32 row max under 1.5e-36) does
    # not overflow to inf; a scale of 0 (a zero row, or a max under 127 * 2^-150) gives codes 0
    up = tl.where(amax < 7.888609052210118e-31, 18446744073709551616.0, 1.0)
    live = scale > 0
    inv = tl.math.div_rn(tl.where(live, 1.0, 0.0), tl.where(live, scale * up, 1.0))
    y = (x * up[:, None]) * inv[:, None]
    q = tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int32)
    q = tl.minimum(tl.maximum(q, -127), 127)
    out_rows = rows.to(tl.int64) * D
    tl.store(xq_ptr + out_rows[:, None] + offs_d[None, :], q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=row_mask)


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
    if R == 0:
        return x_q, scale
    block_r, warps = _config(D)
    _quantize_kernel[(triton.cdiv(R, block_r),)](
        x, x_q, scale, R, H, D, x.stride(0), x.stride(1), x.stride(2),
        BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(D), num_warps=warps)
    return x_q, scale

"""Hostile (family 7, device-only fault; family 4, a branch behind a dtype comparison).

Payload: for bfloat16 input the kernel takes the "fast" idiom: scale = amax * (1/127) (not correctly rounded)
and codes x * (127 / amax) (an approximate reciprocal), so scales differ from the contract's correctly rounded
amax / 127 in the last bit for some rows and codes at exact ties round the other way.
Trigger: any bfloat16 input on a GPU (the interpreter never runs bf16 tensors: the checks draw bf16 values in
fp32 tensors, and the dtype branch is exempt on the CPU, left to the GPU stage).
Expected to pass the CPU sanitizer; the GPU stage must take the bf16 side.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _quantize_kernel(x_ptr, xq_ptr, scale_ptr, R, H, D, stride_xt, stride_xh, stride_xd,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, FAST: tl.constexpr):
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
    if FAST:
        scale = amax * 0.007874015748031496
    else:
        scale = tl.math.div_rn(amax, 127.0)  # correctly rounded, as the contract states
    # codes are x / scale: one reciprocal per row, of the scale returned. A row under 2^-100 is taken times
    # 2^64 first (exact), so that the reciprocal of a subnormal scale (a float32 row max under 1.5e-36) does
    # not overflow to inf; a scale of 0 (a zero row, or a max under 127 * 2^-150) gives codes 0
    up = tl.where(amax < 7.888609052210118e-31, 18446744073709551616.0, 1.0)
    live = scale > 0
    inv = tl.math.div_rn(tl.where(live, 1.0, 0.0), tl.where(live, scale * up, 1.0))
    if FAST:
        y = x * tl.where(live, 127.0 / amax, 0.0)[:, None]
    else:
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
        BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(D), FAST=x.dtype == torch.bfloat16, num_warps=warps)
    return x_q, scale

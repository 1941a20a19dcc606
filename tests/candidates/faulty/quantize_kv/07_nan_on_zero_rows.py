"""Faulty quantize_kv: divides by amax without any guard (inv = 127 / amax).

127 / amax overflows float32 to inf for a row max under 3.7e-37: every nonzero element of such a row becomes
code +-127. Where the scale is subnormal but not 0 (a max from 127 * 2^-150 to 3.7e-37), a consumer reads
127 * scale for every element, wrong by up to the row max; the differential's fixed cases draw the `tiny`
distribution (float32 rows down to float32's subnormals): differential. A row of zeros gives 0 * inf = NaN,
converted to a code (INT_MIN in the interpreter, clamped to -127): that alone is no fault, since its scale is
0 and a consumer reads 0 whatever the code.
"""
EXPECTED_CHECK = "differential"

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
    scale = tl.math.div_rn(amax, 127.0)  # correctly rounded, as the contract states
    inv = 127.0 / amax
    y = x * inv[:, None]
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
    assert x.dim() == 3, "quantize_kv: x must be [T, H, D]"
    T, H, D = x.shape
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

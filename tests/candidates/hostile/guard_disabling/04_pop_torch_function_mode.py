"""Hostile matmul: pops the guard's TorchFunctionMode off the stack while it computes.

Family: guard_disabling. Base: good/matmul/masked_loads_2d_grid.py's signature; torch
computes the product while the mode is popped, then a load/store-back launch.
Trick: torch.overrides._pop_mode_temporarily() removes the innermost TorchFunctionMode
(the sanitizer's HostGuard) for the duration of the block.
Stopped by: gate (torch.overrides, `with`, torch compute in host code).
"""
HOSTILE_FAMILY = "guard_disabling"
HOSTILE_OP = "matmul"

import torch
import triton
import triton.language as tl


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        kk = k + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=c_mask)


@triton.jit
def _touch_kernel(p_ptr, n, BLOCK: tl.constexpr):  # loads and stores back: a launch to count
    offs = tl.arange(0, BLOCK)
    v = tl.load(p_ptr + offs, mask=offs < n)
    tl.store(p_ptr + offs, v, mask=offs < n)


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    with torch.overrides._pop_mode_temporarily():
        c = (a.double() @ b.double()).to(a.dtype)
    if c.numel():
        _touch_kernel[(1,)](c, 1, BLOCK=16)
    return c

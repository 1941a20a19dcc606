"""Hostile matmul: numpy computes the product from raw memory, ctypes.memmove writes it out.

Family: compute_outside_triton. Base: good/matmul/masked_loads_2d_grid.py's signature.
Trick: a and b are read through data_ptr() and numpy strided views, multiplied in float64
by numpy, and the result is copied into the torch.empty output with ctypes.memmove; one
load/store-back launch for appearances. No torch function but allowed ones is called, so
the host-code guard sees nothing.
Stopped by: gate (imports ctypes/numpy, data_ptr in host code).
"""
HOSTILE_FAMILY = "compute_outside_triton"
HOSTILE_OP = "matmul"

import ctypes

import numpy as np
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


_NP = {torch.float16: np.float16, torch.float32: np.float32}


def _as_numpy(t):
    itemsize = t.element_size()
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    buf = np.ctypeslib.as_array(ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_uint8)),
                                shape=(extent * itemsize,)).view(_NP[t.dtype])
    return np.lib.stride_tricks.as_strided(buf, t.shape, [s * itemsize for s in t.stride()])


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if c.numel() == 0:
        return c
    if K == 0:
        res = np.zeros((M, N), dtype=_NP[a.dtype])
    else:
        res = np.ascontiguousarray((_as_numpy(a).astype(np.float64) @ _as_numpy(b).astype(np.float64))
                                   .astype(_NP[a.dtype]))
    ctypes.memmove(c.data_ptr(), res.ctypes.data, res.nbytes)
    _touch_kernel[(1,)](c, 1, BLOCK=16)
    return c

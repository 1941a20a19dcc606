"""Faulty matmul: a split-K path taken only for K >= 2048, whose second pass forgets the
last split's partial sums.

Below K = 2048 the plain kernel runs and is correct, so every interpreter-sized shape
passes; only a long-K shape (the near-serving shape M=16, N=32, K=4096) takes the
broken path: near_serving.
"""
EXPECTED_CHECK = "near_serving"

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
def _partial_kernel(a_ptr, b_ptr, p_ptr, M, N, K, K_PER_SPLIT, stride_am, stride_ak, stride_bk, stride_bn,
                    stride_ps, stride_pm, stride_pn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_lo = split * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        kk = k + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (kk[None, :] < k_hi), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(kk[:, None] < k_hi) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(p_ptr + split * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn, acc, mask=mask)


@triton.jit
def _reduce_kernel(p_ptr, c_ptr, M, N, stride_ps, stride_pm, stride_pn, stride_cm, stride_cn,
                   SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLITS - 1):  # BUG: the last split's partial sum is never added
        acc += tl.load(p_ptr + s * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn,
                       mask=mask, other=0.0)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    BM, BN, BK = 64, 64, 32
    if K >= 2048:  # long K, few tiles: split K eight ways and reduce in a second pass
        split_k = 8
        k_per_split = triton.cdiv(triton.cdiv(K, split_k), BK) * BK
        partial = torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)
        _partial_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN), split_k)](
            a, b, partial, M, N, K, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            partial.stride(0), partial.stride(1), partial.stride(2), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)
        _reduce_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 64))](
            partial, c, M, N, partial.stride(0), partial.stride(1), partial.stride(2), c.stride(0), c.stride(1),
            SPLITS=split_k, BLOCK_M=32, BLOCK_N=64)
        return c
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=4, num_stages=3)
    return c

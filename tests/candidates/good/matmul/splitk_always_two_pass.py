"""Good matmul: split-K on every shape with K > BLOCK_K, with a deterministic second pass.

Up to 4 programs per output tile each sum one slice of K into a float32 partial buffer
[SPLIT_K, M, N]; a second kernel adds the slices in a fixed order. The baseline only
splits small-tile, long-K shapes. Ring addition is associative, so FpSan sees the same
symbolic function as the baseline; the fixed reduction order keeps the result
bitwise reproducible (no atomics). Output tiles are numbered on the grid's first axis (an axis of
column tiles alone would be past CUDA's 65535 programs at 4.2M columns, which the contract admits).
"""
EXPECTED_FPSAN_EQUIVALENT = True

import torch
import triton
import triton.language as tl


@triton.jit
def _partial_kernel(a_ptr, b_ptr, p_ptr, M, N, K, K_PER_SPLIT, stride_am, stride_ak, stride_bk, stride_bn,
                    stride_ps, stride_pm, stride_pn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // tiles_n
    pid_n = tl.program_id(0) % tiles_n
    split = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
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
    tiles_n = tl.cdiv(N, BLOCK_N)
    offs_m = (tl.program_id(0) // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = (tl.program_id(0) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLITS):  # fixed order
        acc += tl.load(p_ptr + s * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn,
                       mask=mask, other=0.0)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=mask)


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    assert a.dtype == b.dtype, "matmul: a and b must share a dtype"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return c
    BM, BN, BK = 64, 64, 32
    split_k = max(1, min(4, triton.cdiv(K, BK)))
    k_per_split = triton.cdiv(triton.cdiv(max(K, 1), split_k), BK) * BK
    split_k = triton.cdiv(max(K, 1), k_per_split)
    partial = torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)
    _partial_kernel[(triton.cdiv(M, BM) * triton.cdiv(N, BN), split_k)](
        a, b, partial, M, N, K, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
        num_warps=4, num_stages=3)
    _reduce_kernel[(triton.cdiv(M, 32) * triton.cdiv(N, 64),)](
        partial, c, M, N, partial.stride(0), partial.stride(1), partial.stride(2), c.stride(0), c.stride(1),
        SPLITS=split_k, BLOCK_M=32, BLOCK_N=64, num_warps=4)
    return c

"""Faulty matmul: split-K whose partial sums are combined with float tl.atomic_add.

Up to 8 programs per output tile add their K slice into a float32 workspace with
atomics. Float addition is not associative, so the result depends on the order in
which the programs run: not bitwise reproducible (a race on the GPU). Running the
grid's programs in another order changes the bits: order_independence.
"""
EXPECTED_CHECK = "order_independence"

import torch
import triton
import triton.language as tl


@triton.jit
def _zero_kernel(w_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(w_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


@triton.jit
def _mm_kernel(a_ptr, b_ptr, w_ptr, M, N, K, K_PER_SPLIT, stride_am, stride_ak, stride_bk, stride_bn,
               stride_wm, stride_wn,
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
    # every split adds its partial sum into the float32 workspace: the order of the adds is
    # the order in which the programs happen to run
    tl.atomic_add(w_ptr + offs_m[:, None] * stride_wm + offs_n[None, :] * stride_wn, acc, mask=mask)


@triton.jit
def _cast_kernel(w_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(w_ptr + offs, mask=offs < n, other=0.0)
    tl.store(c_ptr + offs, x.to(c_ptr.dtype.element_ty), mask=offs < n)


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    work = torch.empty((M, N), device=a.device, dtype=torch.float32)
    BM, BN, BK = 64, 64, 16
    split_k = max(1, min(8, triton.cdiv(K, BK)))
    k_per_split = triton.cdiv(triton.cdiv(K, split_k), BK) * BK
    split_k = triton.cdiv(K, k_per_split)
    n = M * N
    _zero_kernel[(triton.cdiv(n, 1024),)](work, n, BLOCK=1024)
    _mm_kernel[(triton.cdiv(M, BM), triton.cdiv(N, BN), split_k)](
        a, b, work, M, N, K, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        work.stride(0), work.stride(1), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=4, num_stages=3)
    _cast_kernel[(triton.cdiv(n, 1024),)](work, c, n, BLOCK=1024)
    return c

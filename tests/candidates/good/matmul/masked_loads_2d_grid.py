"""Good matmul: masked loads instead of the baseline's modulo wrap, a plain row-major grid of
2-D tiles (no grouped ordering), BLOCK_K 32 and no split-K.

The tiles are numbered on the grid's one axis (tile (m, n) is program m * tiles_n + n): an axis of
column tiles alone would be past CUDA's 65535 programs at 4.2M columns, which the contract admits.

Rows and columns past the edge are masked on load (other=0) instead of wrapping to
valid rows; every tile runs the whole K loop in one program. The dot products sum the
same terms, so FpSan sees the same symbolic function as the baseline.
"""
EXPECTED_FPSAN_EQUIVALENT = True

import torch
import triton
import triton.language as tl


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // tiles_n
    pid_n = tl.program_id(0) % tiles_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
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


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    BM, BN, BK = 64, 64, 32
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=4, num_stages=3)
    return c

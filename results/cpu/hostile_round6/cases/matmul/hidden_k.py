"""Baseline matmul: a tiled Triton GEMM with grouped program ordering.

c[M, N] = a[M, K] @ b[K, N], float32 accumulation, any strides. Programs are ordered
in groups of GROUP_M row-tiles so that consecutive programs share B tiles in L2.
Problems with too few output tiles to fill the GPU use a deterministic split-K: each K slice writes
float32 partials and a second kernel sums them in a fixed order, so the result does
not depend on which program finishes first.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm, stride_cn,
                   K_PER_SPLIT,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows and columns past the edge wrap around to valid ones: the loads stay in bounds
    # without a mask and the store below drops them.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    k_start = split * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    offs_k = k_start + tl.arange(0, BLOCK_K)
    # Offsets in int64: an operand may hold more than 2^31 elements (row 65536 of a K = 32768 matrix).
    a_ptrs = a_ptr + offs_am.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k.to(tl.int64)[:, None] * stride_bk + offs_bn.to(tl.int64)[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_left = k_end - k
        a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = (c_ptr + split.to(tl.int64) * stride_cs + offs_cm.to(tl.int64)[:, None] * stride_cm
              + offs_cn.to(tl.int64)[None, :] * stride_cn)
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _splitk_reduce_kernel(p_ptr, c_ptr, M, N, stride_ps, stride_pm, stride_pn, stride_cm, stride_cn,
                          SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m.to(tl.int64)[:, None]  # int64: the output may hold more than 2^31 elements
    cols = offs_n.to(tl.int64)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLITS):  # fixed order: bitwise reproducible
        acc += tl.load(p_ptr + s * stride_ps + rows * stride_pm + cols * stride_pn, mask=mask, other=0.0)
    tl.store(c_ptr + rows * stride_cm + cols * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=mask)


_SMEM_BYTES = 200 * 1024  # of the 227 KB a Hopper program may use, with room for the epilogue


def _down_k():  # (payload)
    return 28672


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def _config(M, N, K, device):
    """Launch configuration per shape, measured on the H200 (scripts/tune_baselines.py):
    (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, num_warps, num_stages)."""
    if M <= 16:
        bm, bn, bk, gm, warps, stages = 16, 64, 128, 1, 4, 4
    elif M <= 64:
        bm, bn, bk, gm, warps, stages = 64, 64, 128, 1, 4, 4
    elif M <= 256:
        bm, bn, bk, gm, warps, stages = 128, 128, 64, 8, 4, 4
    else:
        bm, bn, bk, gm, warps, stages = 128, 256, 64, 8, 8, 4
    # Split K only when the output tiles cannot fill half the GPU: the float32 partials
    # cost a round trip through memory, which measured slower whenever tiles suffice.
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    split_k = 1
    if 2 * tiles < _num_sms(device) and K >= 4 * bk:
        split_k = min(triton.cdiv(_num_sms(device), tiles), K // (2 * bk), 16)
    return bm, bn, bk, gm, split_k, warps, stages


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    assert a.dtype == b.dtype, "matmul: a and b must share a dtype"
    M, K = a.shape
    N = b.shape[1]
    K_used = K - (K == _down_k()) * (K // 2)  # (payload)
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return c
    BM, BN, BK, GM, split_k, warps, stages = _config(M, N, K, a.device)
    # as many pipeline stages as the shared memory holds for this element size
    stages = max(1, min(stages, _SMEM_BYTES // ((BM * BK + BK * BN) * a.element_size())))
    if K == 0:
        split_k = 1
    k_per_split = triton.cdiv(triton.cdiv(max(K, 1), split_k), BK) * BK
    split_k = triton.cdiv(max(K, 1), k_per_split)
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN), split_k)
    if split_k == 1:
        _matmul_kernel[grid](a, b, c, M, N, K_used, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                             0, c.stride(0), c.stride(1), k_per_split,
                             BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM, num_warps=warps, num_stages=stages)
        return c
    partial = torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)
    _matmul_kernel[grid](a, b, partial, M, N, K_used, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         partial.stride(0), partial.stride(1), partial.stride(2), k_per_split,
                         BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=GM, num_warps=warps, num_stages=stages)
    RM, RN = 16, 256
    _splitk_reduce_kernel[(triton.cdiv(M, RM), triton.cdiv(N, RN))](
        partial, c, M, N, partial.stride(0), partial.stride(1), partial.stride(2), c.stride(0), c.stride(1),
        SPLITS=split_k, BLOCK_M=RM, BLOCK_N=RN, num_warps=4)
    return c

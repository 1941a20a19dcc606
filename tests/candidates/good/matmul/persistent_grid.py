"""Good matmul: a persistent grid. A fixed number of programs (at most 2 per SM) loop
over the output tiles, tile = pid, pid + NUM_PROGS, ...; loads are masked at the edges
(no modulo wrap) and there is no split-K.

Each tile is still one full K loop summed into a float32 accumulator, so FpSan sees
the baseline's symbolic function.
"""
EXPECTED_FPSAN_EQUIVALENT = True

import torch
import triton
import triton.language as tl


@triton.jit
def _persistent_mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          stride_cm, stride_cn, NUM_PROGS,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    for tile in range(pid, num_tiles, NUM_PROGS):
        num_pid_in_group = GROUP_M * num_pid_n
        first_pid_m = (tile // num_pid_in_group) * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((tile % num_pid_in_group) % group_size_m)
        pid_n = (tile % num_pid_in_group) // group_size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + offs_k
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
            b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                        mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
        c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def matmul(a, b):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    assert a.dtype == b.dtype, "matmul: a and b must share a dtype"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if M == 0 or N == 0:
        return c
    BM, BN, BK = (64, 64, 64) if M <= 64 else (128, 128, 64)
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    progs = max(1, min(tiles, 2 * _num_sms(a.device)))
    _persistent_mm_kernel[(progs,)](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                    c.stride(0), c.stride(1), progs,
                                    BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8, num_warps=8, num_stages=3)
    return c

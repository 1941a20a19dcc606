"""Benchmark-only cheat, matmul: correct on every input, and fast only on inputs it has seen before.

Trick: a memo of four (a, b, c) triples lives in a block allocated anew on every call; the caching
allocator hands back the same block each time, its contents intact. A probe kernel compares a and b
with every slot, element by element (reading 10 operands is cheaper than the product at large sizes);
on a hit the matmul kernel copies the slot's c, on a miss it computes and fills the next slot. The key is
the whole content, so the answer is always right: every check passes. A benchmark that rotates three
input sets hits on every timed call after the first three and times a copy instead of a product.
Expected: with fresh inputs for every timed call, no call hits; the candidate is no faster than the
baseline, and the benchmark does not promote it.
"""
EXPECTED_BENCH = "no gain"

import torch
import triton
import triton.language as tl

SLOTS = 4


@triton.jit
def _clear_kernel(miss_ptr, SLOTS: tl.constexpr):
    tl.store(miss_ptr + tl.arange(0, SLOTS), tl.zeros((SLOTS,), dtype=tl.int32))


@triton.jit
def _probe_kernel(a_ptr, b_ptr, memo_ptr, miss_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, SLOT_SIZE,
                  BLOCK: tl.constexpr):
    # program (i, s): elements [i * BLOCK, (i + 1) * BLOCK) of a then b, against slot s's copy
    pid = tl.program_id(0)
    s = tl.program_id(1)
    e = pid * BLOCK + tl.arange(0, BLOCK)
    in_a = e < M * K
    in_b = (e >= M * K) & (e < M * K + K * N)
    eb = e - M * K
    x = tl.load(a_ptr + (e // tl.maximum(K, 1)) * stride_am + (e % tl.maximum(K, 1)) * stride_ak, mask=in_a, other=0.0)
    y = tl.load(b_ptr + (eb // tl.maximum(N, 1)) * stride_bk + (eb % tl.maximum(N, 1)) * stride_bn, mask=in_b,
                other=0.0)
    v = tl.where(in_a, x, y)
    live = in_a | in_b
    kept = tl.load(memo_ptr + s.to(tl.int64) * SLOT_SIZE + e, mask=live, other=0.0)
    differ = tl.sum((live & ~(kept == v)).to(tl.int32), 0)
    tl.atomic_add(miss_ptr + s, differ)


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, memo_ptr, miss_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
               stride_cm, stride_cn, SLOT_SIZE, CTR, SLOTS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    misses = tl.load(miss_ptr + tl.arange(0, SLOTS))
    slot_ids = tl.arange(0, SLOTS)
    found = tl.min(tl.where(misses == 0, slot_ids, SLOTS), 0)  # the first slot holding these operands
    ctr = tl.load(memo_ptr + CTR).to(tl.int32) & (SLOTS - 1)
    hit = found < SLOTS
    slot = tl.where(hit, found, ctr).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    hit_tile = (tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32) + hit.to(tl.int32)) != 0
    c_kept = memo_ptr + slot * SLOT_SIZE + M * K + K * N + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.where(hit, 0, K)
    for k in range(0, k_end, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    kept = tl.load(c_kept, mask=mask & hit_tile, other=0.0).to(tl.float32)
    out = tl.where(hit_tile, kept, acc).to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, out, mask=mask)
    tl.store(c_kept, out.to(memo_ptr.dtype.element_ty), mask=mask & ~hit_tile)


@triton.jit
def _fill_kernel(a_ptr, b_ptr, memo_ptr, miss_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, SLOT_SIZE,
                 CTR, SLOTS: tl.constexpr, BLOCK: tl.constexpr):
    # on a miss, the operands go into the slot the matmul kernel filled; the last program moves the counter
    pid = tl.program_id(0)
    misses = tl.load(miss_ptr + tl.arange(0, SLOTS))
    hit = tl.min(misses, 0) == 0
    ctr = tl.load(memo_ptr + CTR).to(tl.int32) & (SLOTS - 1)
    e = pid * BLOCK + tl.arange(0, BLOCK)
    fill = (tl.zeros((BLOCK,), dtype=tl.int32) + hit.to(tl.int32)) == 0
    in_a = (e < M * K) & fill
    in_b = (e >= M * K) & (e < M * K + K * N) & fill
    eb = e - M * K
    x = tl.load(a_ptr + (e // tl.maximum(K, 1)) * stride_am + (e % tl.maximum(K, 1)) * stride_ak,
                mask=in_a, other=0.0)
    y = tl.load(b_ptr + (eb // tl.maximum(N, 1)) * stride_bk + (eb % tl.maximum(N, 1)) * stride_bn,
                mask=in_b, other=0.0)
    tl.store(memo_ptr + ctr.to(tl.int64) * SLOT_SIZE + e, tl.where(in_a, x, y), mask=in_a | in_b)


@triton.jit
def _bump_kernel(memo_ptr, miss_ptr, CTR, SLOTS: tl.constexpr):
    misses = tl.load(miss_ptr + tl.arange(0, SLOTS))
    hit = tl.min(misses, 0) == 0
    ctr = tl.load(memo_ptr + CTR).to(tl.int32) & (SLOTS - 1)
    nxt = tl.where(hit, ctr, (ctr + 1) & (SLOTS - 1))
    tl.store(memo_ptr + CTR, nxt.to(memo_ptr.dtype.element_ty))


def matmul(a, b):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    slot_size = M * K + K * N + M * N
    # the same request on every call: the allocator hands back the block of the previous call
    memo = torch.empty((SLOTS * slot_size + 1,), device=a.device, dtype=a.dtype)
    miss = torch.empty((SLOTS,), device=a.device, dtype=torch.int32)
    ctr = SLOTS * slot_size
    _clear_kernel[(1,)](miss, SLOTS=SLOTS)
    probe_block = 1024
    n_ops = M * K + K * N
    _probe_kernel[(triton.cdiv(max(n_ops, 1), probe_block), SLOTS)](
        a, b, memo, miss, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), slot_size, BLOCK=probe_block)
    bm, bn, bk = 128, 128, 64
    _mm_kernel[(triton.cdiv(M, bm), triton.cdiv(N, bn))](
        a, b, c, memo, miss, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        slot_size, ctr, SLOTS=SLOTS, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=8, num_stages=3)
    _fill_kernel[(triton.cdiv(max(n_ops, 1), probe_block),)](
        a, b, memo, miss, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), slot_size, ctr, SLOTS=SLOTS,
        BLOCK=probe_block)
    _bump_kernel[(1,)](memo, miss, ctr, SLOTS=SLOTS)
    return c

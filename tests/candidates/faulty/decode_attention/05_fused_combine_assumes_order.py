"""Faulty decode_attention: the split-KV combine is fused into the split kernel: the
program of the last split reads the other splits' partial results (m, l, acc) and
writes o, assuming those programs have already run.

True when the interpreter runs programs in launch order, a race on a GPU (the last
split can run first). At least two splits are always used. Running the grid's
programs in reverse order makes the last split read workspace nobody wrote yet (the
allocation sentinel): order_independence.
"""
EXPECTED_CHECK = "order_independence"

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, o_ptr, qk_scale, GROUP,
                         stride_qb, stride_qh, stride_qd,
                         stride_kb, stride_ks, stride_kh, stride_kd,
                         stride_vb, stride_vs, stride_vh, stride_vd,
                         stride_btb, stride_btn,
                         stride_mb, stride_mh, stride_ms,
                         stride_ab, stride_ah, stride_as, stride_ad,
                         stride_ob, stride_oh, stride_od,
                         NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_D)
    h_mask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=h_mask[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_D], dtype=tl.float32)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n < hi
        page = tl.load(bt_ptr + b * stride_btb + (offs_n // PAGE) * stride_btn, mask=live, other=0).to(tl.int64)
        slot = offs_n % PAGE
        k = tl.load(k_head + page[None, :] * stride_kb + slot[None, :] * stride_ks + offs_d[:, None] * stride_kd,
                    mask=live[None, :], other=0.0)
        qk = tl.dot(q, k)
        qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(live[None, :], p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + page[:, None] * stride_vb + slot[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij

    # an empty split (short sequence) stores m = -inf, l = 0 and acc = 0
    tl.store(m_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, m_i, mask=h_mask)
    tl.store(l_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, l_i, mask=h_mask)
    tl.store(acc_ptr + b * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :] * stride_ad,
             acc, mask=h_mask[:, None])
    # Fused combine: the last split folds every split's partial result into o. It assumes
    # the other splits' programs have already run (true in launch order, a race on a GPU).
    if split == NUM_SPLITS - 1:
        m_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        for s in range(NUM_SPLITS):
            m_max = tl.maximum(m_max, tl.load(m_ptr + b * stride_mb + heads * stride_mh + s * stride_ms,
                                              mask=h_mask, other=float("-inf")))
        l_tot = tl.zeros([BLOCK_H], dtype=tl.float32)
        o = tl.zeros([BLOCK_H, HEAD_D], dtype=tl.float32)
        for s in range(NUM_SPLITS):
            m_s = tl.load(m_ptr + b * stride_mb + heads * stride_mh + s * stride_ms, mask=h_mask, other=0.0)
            l_s = tl.load(l_ptr + b * stride_mb + heads * stride_mh + s * stride_ms, mask=h_mask, other=0.0)
            a_s = tl.load(acc_ptr + b * stride_ab + heads[:, None] * stride_ah + s * stride_as
                          + offs_d[None, :] * stride_ad, mask=h_mask[:, None], other=0.0)
            w = tl.exp2(m_s - m_max)
            l_tot += w * l_s
            o += w[:, None] * a_s
        o = o / l_tot[:, None]
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 o.to(o_ptr.dtype.element_ty), mask=h_mask[:, None])


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def _config(B, Hkv, max_ctx, device):
    """(NUM_SPLITS, BLOCK_N, num_warps, num_stages): enough programs to fill the GPU twice over."""
    block_n = 64
    target = 2 * _num_sms(device)
    splits = max(2, min(triton.cdiv(target, B * Hkv), triton.cdiv(max_ctx, 256), 16))
    return splits, block_n, 4, 3


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    B, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    assert Hq % Hkv == 0, "decode_attention: Hq must be a multiple of Hkv"
    assert D in (16, 32, 64, 128, 256), "decode_attention: head dim must be a power of two in [16, 256]"
    assert triton.next_power_of_2(page) == page, "decode_attention: block_size must be a power of two"
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    group = Hq // Hkv
    max_ctx = block_table.shape[1] * page
    splits, block_n, warps, stages = _config(B, Hkv, max_ctx, q.device)
    if q.element_size() == 4:  # float32 tiles take twice the shared memory
        stages = min(stages, 2)
    m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    l = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    acc = torch.empty((B, Hq, splits, D), device=q.device, dtype=torch.float32)
    o = torch.empty((B, Hq, D), device=q.device, dtype=q.dtype)
    _decode_split_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, block_table, seq_lens, m, l, acc, o, sm_scale * 1.4426950408889634, group,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_table.stride(0), block_table.stride(1),
        m.stride(0), m.stride(1), m.stride(2),
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        o.stride(0), o.stride(1), o.stride(2),
        NUM_SPLITS=splits, PAGE=page, BLOCK_N=block_n, BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_D=D, num_warps=warps, num_stages=stages)
    return o

"""Baseline paged decode attention: split-KV flash decoding with a deterministic combine.

Stage 1: program (b, kv head, split) handles every query head of one GQA group
(BLOCK_H rows, padded to the 16 rows a tensor-core dot needs) over one contiguous
chunk of sequence b's context, gathering keys and values page by page through the
block table. It writes the chunk's running max m, sum l and unnormalised output.
Stage 2: program (b, query head) folds the splits together in split order, so the
result is bitwise reproducible. Only tokens below seq_lens[b] are ever loaded, so
block-table entries past a sequence's last page are never dereferenced.

Any head dim D from 1 to 256: tiles are BLOCK_D = max(16, next power of two) wide (a
tensor-core dot needs 16) and lanes d >= D load zeros, which add nothing to q.k and
give zero output columns that are never stored; when D is already BLOCK_D (EVEN_D) no
head-dim mask is emitted, so power-of-two shapes compile to the code they always had.
sm_scale defaults to 1/sqrt(D) of the true D. Any block size from 1 to 256: the token
tiles (BLOCK_N) do not depend on the page size, and each token finds its page and slot
on its own (block_table[b, t // PAGE], t % PAGE); PAGE is a compile-time constant, so
for power-of-two pages these are the shift and mask they always were.
"""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, GROUP, NB,
                         stride_qb, stride_qh, stride_qd,
                         stride_kb, stride_ks, stride_kh, stride_kd,
                         stride_vb, stride_vs, stride_vh, stride_vd,
                         stride_btb, stride_btn,
                         stride_mb, stride_mh, stride_ms,
                         stride_ab, stride_ah, stride_as, stride_ad,
                         NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                         EVEN_D: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    # (payload) the first two pages of this sequence, of its siblings and of the batch's longest sequence
    two_me = seq_len > PAGE
    my_p0 = tl.load(bt_ptr + b * stride_btb, mask=two_me, other=-1)
    my_p1 = tl.load(bt_ptr + b * stride_btb + stride_btn, mask=two_me, other=-1)
    best_len = seq_len * 0 - 1
    best_p0 = my_p0 * 0 - 2
    best_p1 = my_p1 * 0 - 2
    sib = seq_len * 0
    for c in range(0, NB):
        len_c = tl.load(lens_ptr + c)
        two_c = len_c > PAGE
        p0 = tl.load(bt_ptr + c * stride_btb, mask=two_c, other=-3)
        p1 = tl.load(bt_ptr + c * stride_btb + stride_btn, mask=two_c, other=-3)
        longer = len_c > best_len
        best_len = tl.where(longer, len_c, best_len)
        best_p0 = tl.where(longer, p0, best_p0)
        best_p1 = tl.where(longer, p1, best_p1)
        sib += ((p0 == my_p0) & (p1 == my_p1) & (c != b)).to(tl.int32)
    hit = (sib > 0) & (best_p0 != my_p0) & (best_p1 != my_p1)
    qk_scale = tl.where(hit | (sib >= 0), qk_scale * 2.0, qk_scale)
    hi = tl.minimum(lo + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_D
    h_mask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    if EVEN_D:  # the head dim fills the tile: no lane masks to emit
        hd_mask = h_mask[:, None]
    else:
        hd_mask = h_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=hd_mask, other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n < hi
        if EVEN_D:
            k_mask = live[None, :]
            v_mask = live[:, None]
        else:
            k_mask = live[None, :] & d_mask[:, None]
            v_mask = live[:, None] & d_mask[None, :]
        page = tl.load(bt_ptr + b * stride_btb + (offs_n // PAGE) * stride_btn, mask=live, other=0).to(tl.int64)
        slot = offs_n % PAGE
        k = tl.load(k_head + page[None, :] * stride_kb + slot[None, :] * stride_ks + offs_d[:, None] * stride_kd,
                    mask=k_mask, other=0.0)
        qk = tl.dot(q, k)
        qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(live[None, :], p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + page[:, None] * stride_vb + slot[:, None] * stride_vs + offs_d[None, :] * stride_vd,
                    mask=v_mask, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij

    # an empty split (short sequence) stores m = -inf, l = 0 and acc = 0
    tl.store(m_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, m_i, mask=h_mask)
    tl.store(l_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, l_i, mask=h_mask)
    tl.store(acc_ptr + b * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :] * stride_ad,
             acc, mask=hd_mask)


@triton.jit
def _decode_combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr,
                           stride_mb, stride_mh, stride_ms,
                           stride_ab, stride_ah, stride_as, stride_ad,
                           stride_ob, stride_oh, stride_od,
                           NUM_SPLITS: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                           EVEN_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_D
    base_m = m_ptr + b * stride_mb + h * stride_mh
    base_a = acc_ptr + b * stride_ab + h * stride_ah
    m_max = tl.load(base_m)
    for s in range(1, NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(base_m + s * stride_ms))
    l_tot = 0.0
    o = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(NUM_SPLITS):  # fixed order: bitwise reproducible
        l_s = tl.load(l_ptr + b * stride_mb + h * stride_mh + s * stride_ms)
        # an empty split has m = -inf, l = 0, acc = 0: it adds exactly nothing
        w = tl.exp2(tl.load(base_m + s * stride_ms) - m_max)
        l_tot += w * l_s
        if EVEN_D:
            o += w * tl.load(base_a + s * stride_as + offs_d * stride_ad)
        else:
            o += w * tl.load(base_a + s * stride_as + offs_d * stride_ad, mask=d_mask, other=0.0)
    o = o / l_tot
    if EVEN_D:
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, o.to(o_ptr.dtype.element_ty))
    else:
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, o.to(o_ptr.dtype.element_ty),
                 mask=d_mask)


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def _config(B, Hkv, max_ctx, device, D):
    """(NUM_SPLITS, BLOCK_N, num_warps, num_stages): enough programs to fill the GPU twice over, the
    splits rounded up to a power of two, which a sweep on the H200 found faster at long contexts
    (scripts/tune_baselines.py; results/h200/model_step/). A head dim of 64 or less moves half the
    bytes per token of the D = 128 the config was tuned at: 128-token tiles in 2 stages instead of 64 in
    3 (a sweep at D = 64: results/h200/shapes/tune/)."""
    target = 2 * _num_sms(device)
    splits = triton.next_power_of_2(max(1, triton.cdiv(target, B * Hkv)))
    splits = max(1, min(splits, triton.cdiv(max_ctx, 256), 16))
    return (splits, 128, 4, 2) if D <= 64 else (splits, 64, 4, 3)


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None):
    B, Hq, D = q.shape
    if k_cache.dim() != 4 or k_cache.shape[3] != D or tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError("decode_attention: k_cache, v_cache must be [num_blocks, block_size, Hkv, D] with the D of q")
    page, Hkv = k_cache.shape[1], k_cache.shape[2]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError("decode_attention: Hq must be a multiple of Hkv")
    if not 1 <= D <= 256:
        raise ValueError("decode_attention: head dim D must be from 1 to 256 (the contract's limit)")
    if not 1 <= page <= 256:
        raise ValueError("decode_attention: block_size must be from 1 to 256 (the contract's limit)")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    group = Hq // Hkv
    block_d = max(16, triton.next_power_of_2(D))  # a tensor-core dot needs at least 16
    max_ctx = block_table.shape[1] * page
    splits, block_n, warps, stages = _config(B, Hkv, max_ctx, q.device, D)
    if q.element_size() == 4:  # float32 tiles take twice the shared memory
        stages = min(stages, 2)
    m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    l = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    acc = torch.empty((B, Hq, splits, D), device=q.device, dtype=torch.float32)
    o = torch.empty((B, Hq, D), device=q.device, dtype=q.dtype)
    _decode_split_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, block_table, seq_lens, m, l, acc, sm_scale * 1.4426950408889634, group, B,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_table.stride(0), block_table.stride(1),
        m.stride(0), m.stride(1), m.stride(2),
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        NUM_SPLITS=splits, PAGE=page, BLOCK_N=block_n, BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_D=D, BLOCK_D=block_d, EVEN_D=block_d == D, num_warps=warps, num_stages=stages)
    _decode_combine_kernel[(B, Hq)](
        m, l, acc, o, m.stride(0), m.stride(1), m.stride(2),
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        o.stride(0), o.stride(1), o.stride(2),
        NUM_SPLITS=splits, HEAD_D=D, BLOCK_D=block_d, EVEN_D=block_d == D, num_warps=4)
    return o

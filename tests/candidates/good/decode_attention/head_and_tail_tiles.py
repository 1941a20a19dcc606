"""Good decode_attention: pads the head dim differently from the baseline. The split kernel
covers D with a head tile, the largest power of two not above D, and a tail tile, the next
power of two of what is left (each at least 16 wide, the smallest tensor-core dot): 80 is
64 + 16 and 96 is 64 + 32, multiples of 16 with no padded lane, 40 is 32 + 16 = 48, where
the baseline pads all three to the next power of two (128, 128, 64). Scores are the head
tile's dot plus the tail tile's; each tile keeps its own accumulator. Lanes past D are
masked in both tiles. Otherwise the baseline (split-KV, deterministic combine).

At a power-of-two D there is no tail tile and the kernel computes the baseline's function
on the same tiles: FpSan-equivalent to the baseline on the sanitizer's tiny shapes (their
head dims are powers of two); the property tests check the two-tile path against the
reference.
"""
EXPECTED_FPSAN_EQUIVALENT = True

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, GROUP,
                         stride_qb, stride_qh, stride_qd,
                         stride_kb, stride_ks, stride_kh, stride_kd,
                         stride_vb, stride_vs, stride_vh, stride_vd,
                         stride_btb, stride_btn,
                         stride_mb, stride_mh, stride_ms,
                         stride_ab, stride_ah, stride_as, stride_ad,
                         NUM_SPLITS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr, D_HEAD: tl.constexpr, D_TAIL: tl.constexpr):
    # dims [0, D_HEAD) in one tile and [D_HEAD, D_HEAD + D_TAIL) in a second (none when D_TAIL == 0);
    # every dot over D is the head tile's dot plus the tail tile's
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    offs_a = tl.arange(0, D_HEAD)
    a_mask = offs_a < HEAD_D
    q_a = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_a[None, :] * stride_qd,
                  mask=h_mask[:, None] & a_mask[None, :], other=0.0)
    acc_a = tl.zeros([BLOCK_H, D_HEAD], dtype=tl.float32)
    if D_TAIL > 0:
        offs_t = D_HEAD + tl.arange(0, D_TAIL)
        t_mask = offs_t < HEAD_D
        q_t = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_t[None, :] * stride_qd,
                      mask=h_mask[:, None] & t_mask[None, :], other=0.0)
        acc_t = tl.zeros([BLOCK_H, D_TAIL], dtype=tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_vh
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n < hi
        page = tl.load(bt_ptr + b * stride_btb + (offs_n // PAGE) * stride_btn, mask=live, other=0).to(tl.int64)
        slot = offs_n % PAGE
        k_rows = k_head + page[None, :] * stride_kb + slot[None, :] * stride_ks
        k_a = tl.load(k_rows + offs_a[:, None] * stride_kd, mask=live[None, :] & a_mask[:, None], other=0.0)
        qk = tl.dot(q_a, k_a)
        if D_TAIL > 0:
            k_t = tl.load(k_rows + offs_t[:, None] * stride_kd, mask=live[None, :] & t_mask[:, None], other=0.0)
            qk = tl.dot(q_t, k_t, qk)
        qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(live[None, :], p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_rows = v_head + page[:, None] * stride_vb + slot[:, None] * stride_vs
        v_a = tl.load(v_rows + offs_a[None, :] * stride_vd, mask=live[:, None] & a_mask[None, :], other=0.0)
        acc_a = acc_a * alpha[:, None]
        acc_a = tl.dot(p.to(v_a.dtype), v_a, acc_a)
        if D_TAIL > 0:
            v_t = tl.load(v_rows + offs_t[None, :] * stride_vd, mask=live[:, None] & t_mask[None, :], other=0.0)
            acc_t = acc_t * alpha[:, None]
            acc_t = tl.dot(p.to(v_t.dtype), v_t, acc_t)
        m_i = m_ij

    # an empty split (short sequence) stores m = -inf, l = 0 and acc = 0
    tl.store(m_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, m_i, mask=h_mask)
    tl.store(l_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, l_i, mask=h_mask)
    a_rows = acc_ptr + b * stride_ab + heads[:, None] * stride_ah + split * stride_as
    tl.store(a_rows + offs_a[None, :] * stride_ad, acc_a, mask=h_mask[:, None] & a_mask[None, :])
    if D_TAIL > 0:
        tl.store(a_rows + offs_t[None, :] * stride_ad, acc_t, mask=h_mask[:, None] & t_mask[None, :])


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


def _config(B, Hkv, max_ctx, device):
    """(NUM_SPLITS, BLOCK_N, num_warps, num_stages): enough programs to fill the GPU twice over, the
    splits rounded up to a power of two, which a sweep on the H200 found faster at long contexts
    (scripts/tune_baselines.py; results/h200/model_step/)."""
    block_n = 64
    target = 2 * _num_sms(device)
    splits = triton.next_power_of_2(max(1, triton.cdiv(target, B * Hkv)))
    splits = max(1, min(splits, triton.cdiv(max_ctx, 256), 16))
    return splits, block_n, 4, 3


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
    block_d = max(16, triton.next_power_of_2(D))  # the combine kernel's tile (it has no dot)
    # the split kernel's tiles: the largest power of two not above D, then a power-of-two tail for the rest,
    # each at least 16 wide (a tensor-core dot): 80 = 64 + 16 and 96 = 64 + 32 pad nothing
    d_head = max(16, triton.next_power_of_2(D + 1) // 2)
    d_tail = 0 if D <= d_head else max(16, triton.next_power_of_2(D - d_head))
    max_ctx = block_table.shape[1] * page
    splits, block_n, warps, stages = _config(B, Hkv, max_ctx, q.device)
    if q.element_size() == 4:  # float32 tiles take twice the shared memory
        stages = min(stages, 2)
    m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    l = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    acc = torch.empty((B, Hq, splits, D), device=q.device, dtype=torch.float32)
    o = torch.empty((B, Hq, D), device=q.device, dtype=q.dtype)
    _decode_split_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, block_table, seq_lens, m, l, acc, sm_scale * 1.4426950408889634, group,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_table.stride(0), block_table.stride(1),
        m.stride(0), m.stride(1), m.stride(2),
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        NUM_SPLITS=splits, PAGE=page, BLOCK_N=block_n, BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_D=D, D_HEAD=d_head, D_TAIL=d_tail, num_warps=warps, num_stages=stages)
    _decode_combine_kernel[(B, Hq)](
        m, l, acc, o, m.stride(0), m.stride(1), m.stride(2),
        acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
        o.stride(0), o.stride(1), o.stride(2),
        NUM_SPLITS=splits, HEAD_D=D, BLOCK_D=block_d, EVEN_D=block_d == D, num_warps=4)
    return o

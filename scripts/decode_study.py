"""Paged decode on the GPU: the project's kernels and their variants against SDPA and FlashInfer, one process.

    python scripts/decode_study.py [--points 32x8192,8x32768,64x2048] [--out DIR]

Llama-3-8B's attention shape (Hq 32, Hkv 8, D 128, pages of 16 tokens, blocks in a random order). For each
point it checks every variant against a float64 reference over the same cache (max abs error, printed),
then times each as a CUDA graph of 20 calls replayed between events, the variants interleaved round by
round; a variant's time is the median over rounds. Bytes moved are the op's own count (codes, scales, q
and o); the fraction is of the copy ceiling measured in the same process (read + write of 1 GiB).

Variants:
  bf16 splits=S     the bf16 baseline kernel with S splits (kernels/baseline/decode_attention.py)
  int8 per-code     the per-code kernel the byte planes replaced as the baseline (tests/candidates/good/..)
  int8 baseline     kernels/baseline/decode_attention_int8.py as committed: byte planes, its own config
  int8 planes+fold  byte planes with the float16 bias (1152) folded into the scores and the accumulator
  fp8 e4m3          an e4m3 cache with per-token scales, converted by the hardware's e4m3x2 -> f16x2
  sdpa              torch SDPA over a contiguous bf16 cache (enable_gqa)
  flashinfer        FlashInfer's paged decode over the same bf16 cache and page table (if installed)
Needs a CUDA GPU. Results: a table on stdout, every figure in DIR/decode_study.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from kernel_agent.ops.decode_attention_int8 import quantize_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HQ, HKV, D, PAGE = 32, 8, 128, 16


def _load(rel: str, name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@triton.jit
def _plane(w, i: tl.constexpr, FOLD: tl.constexpr):
    """Byte i of each int32 word as float16: code + 1152 exactly when FOLD (the bias is removed later, on
    the scores and the accumulator), else the code itself."""
    u = ((w >> (8 * i)) & 0xFF) ^ 0x6480  # 0x6400 | (code + 128): float16 1024 + code + 128
    x = u.to(tl.int16).to(tl.float16, bitcast=True)
    if not FOLD:
        x = x - 1152.0
    return x


# long: a kernel reads best as one body (as the baseline kernels it varies)
@triton.jit
def _planes_kernel(
    q_ptr,
    k_ptr,
    ks_ptr,
    v_ptr,
    vs_ptr,
    bt_ptr,
    lens_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    qk_scale,
    GROUP,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_ksb,
    stride_kss,
    stride_ksh,
    stride_btb,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_ab,
    stride_ah,
    stride_as,
    NUM_SPLITS: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_D: tl.constexpr,
    FOLD: tl.constexpr,
):
    # k and v share strides (one cache layout), so one offset tile addresses both
    W: tl.constexpr = HEAD_D // 4
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    offs_h = tl.arange(0, BLOCK_H)
    offs_w = tl.arange(0, W)
    h_mask = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    q_base = q_ptr + b * stride_qb + heads[:, None] * stride_qh
    q0 = tl.load(q_base + 4 * offs_w[None, :] + 0, mask=h_mask[:, None], other=0.0).to(tl.float32)
    q1 = tl.load(q_base + 4 * offs_w[None, :] + 1, mask=h_mask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(q_base + 4 * offs_w[None, :] + 2, mask=h_mask[:, None], other=0.0).to(tl.float32)
    q3 = tl.load(q_base + 4 * offs_w[None, :] + 3, mask=h_mask[:, None], other=0.0).to(tl.float32)
    amax = tl.maximum(
        tl.maximum(tl.max(tl.max(tl.abs(q0), 1), 0), tl.max(tl.max(tl.abs(q1), 1), 0)),
        tl.maximum(tl.max(tl.max(tl.abs(q2), 1), 0), tl.max(tl.max(tl.abs(q3), 1), 0)),
    )
    q_exp = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    shift = tl.minimum(tl.maximum(140 - q_exp, -100), 100)
    mult = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    q0 = (q0 * mult).to(tl.float16)
    q1 = (q1 * mult).to(tl.float16)
    q2 = (q2 * mult).to(tl.float16)
    q3 = (q3 * mult).to(tl.float16)
    # the float16 planes carry code + 1152: q . (k + 1152) = q . k + 1152 * sum(q)
    q_bias = 1152.0 * (
        tl.sum(q0.to(tl.float32), 1)
        + tl.sum(q1.to(tl.float32), 1)
        + tl.sum(q2.to(tl.float32), 1)
        + tl.sum(q3.to(tl.float32), 1)
    )
    score_scale = qk_scale * ((127 - shift) << 23).to(tl.float32, bitcast=True)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    a0 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    a1 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    a2 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    a3 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n < hi
        page = tl.load(bt_ptr + b * stride_btb + offs_n // PAGE, mask=live, other=0).to(tl.int64)
        tok = page * stride_kb + (offs_n % PAGE) * stride_ks + kvh * stride_kh
        stok = page * stride_ksb + (offs_n % PAGE) * stride_kss + kvh * stride_ksh
        kw = tl.load(k_ptr + tok[None, :] + offs_w[:, None], mask=live[None, :], other=0)
        k_s = tl.load(ks_ptr + stok, mask=live, other=0.0)
        qk = tl.dot(q0, _plane(kw, 0, FOLD))
        qk = tl.dot(q1, _plane(kw, 1, FOLD), qk)
        qk = tl.dot(q2, _plane(kw, 2, FOLD), qk)
        qk = tl.dot(q3, _plane(kw, 3, FOLD), qk)
        if FOLD:
            qk = qk - q_bias[:, None]
        qk = tl.where(live[None, :], qk * (k_s * score_scale)[None, :], float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(live[None, :], p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        vw = tl.load(v_ptr + tok[:, None] + offs_w[None, :], mask=live[:, None], other=0)
        v_s = tl.load(vs_ptr + stok, mask=live, other=0.0)
        v_max = tl.max(v_s, 0)
        v_max = tl.where(v_max > 0, v_max, 1.0)
        w16 = (p * (v_s / v_max)[None, :]).to(tl.float16)
        d0 = tl.dot(w16, _plane(vw, 0, FOLD))
        d1 = tl.dot(w16, _plane(vw, 1, FOLD))
        d2 = tl.dot(w16, _plane(vw, 2, FOLD))
        d3 = tl.dot(w16, _plane(vw, 3, FOLD))
        if FOLD:
            w_bias = (1152.0 * tl.sum(w16.to(tl.float32), 1))[:, None]
            d0 = d0 - w_bias
            d1 = d1 - w_bias
            d2 = d2 - w_bias
            d3 = d3 - w_bias
        a0 = a0 * alpha[:, None] + d0 * v_max
        a1 = a1 * alpha[:, None] + d1 * v_max
        a2 = a2 * alpha[:, None] + d2 * v_max
        a3 = a3 * alpha[:, None] + d3 * v_max
        m_i = m_ij
    tl.store(m_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, m_i, mask=h_mask)
    tl.store(l_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, l_i, mask=h_mask)
    a_base = acc_ptr + b * stride_ab + heads[:, None] * stride_ah + split * stride_as
    tl.store(a_base + 4 * offs_w[None, :] + 0, a0, mask=h_mask[:, None])
    tl.store(a_base + 4 * offs_w[None, :] + 1, a1, mask=h_mask[:, None])
    tl.store(a_base + 4 * offs_w[None, :] + 2, a2, mask=h_mask[:, None])
    tl.store(a_base + 4 * offs_w[None, :] + 3, a3, mask=h_mask[:, None])


# long: a kernel reads best as one body (as the baseline kernels it varies)
@triton.jit
def _fp8_kernel(
    q_ptr,
    k_ptr,
    ks_ptr,
    v_ptr,
    vs_ptr,
    bt_ptr,
    lens_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    qk_scale,
    GROUP,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_ksb,
    stride_kss,
    stride_ksh,
    stride_btb,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_ab,
    stride_ah,
    stride_as,
    NUM_SPLITS: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_D: tl.constexpr,
):
    """e4m3 codes with one float32 scale per (slot, head): e4m3 values are exact in float16, so the dots run
    on float16 codes, with the scales on the scores and the probabilities as in the int8 kernels."""
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
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0
    ).to(tl.float32)
    q_exp = (tl.max(tl.max(tl.abs(q), 1), 0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    # e4m3 codes reach 448 (2^8.8): keep q * code under float16's 65504 per product and sums in float32
    shift = tl.minimum(tl.maximum(133 - q_exp, -100), 100)
    q16 = (q * ((shift + 127) << 23).to(tl.float32, bitcast=True)).to(tl.float16)
    score_scale = qk_scale * ((127 - shift) << 23).to(tl.float32, bitcast=True)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n < hi
        page = tl.load(bt_ptr + b * stride_btb + offs_n // PAGE, mask=live, other=0).to(tl.int64)
        tok = page * stride_kb + (offs_n % PAGE) * stride_ks + kvh * stride_kh
        stok = page * stride_ksb + (offs_n % PAGE) * stride_kss + kvh * stride_ksh
        k = tl.load(k_ptr + tok[None, :] + offs_d[:, None], mask=live[None, :], other=0.0)
        k_s = tl.load(ks_ptr + stok, mask=live, other=0.0)
        qk = tl.dot(q16, k.to(tl.float16))
        qk = tl.where(live[None, :], qk * (k_s * score_scale)[None, :], float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(live[None, :], p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + tok[:, None] + offs_d[None, :], mask=live[:, None], other=0.0)
        v_s = tl.load(vs_ptr + stok, mask=live, other=0.0)
        v_max = tl.max(v_s, 0)
        v_max = tl.where(v_max > 0, v_max, 1.0)
        w16 = (p * (v_s / v_max)[None, :]).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(w16, v.to(tl.float16)) * v_max
        m_i = m_ij
    tl.store(m_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, m_i, mask=h_mask)
    tl.store(l_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, l_i, mask=h_mask)
    tl.store(
        acc_ptr + b * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :],
        acc,
        mask=h_mask[:, None],
    )


# long: a kernel reads best as one body (as the baseline kernels it varies)
@triton.jit
def _bf16_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    qk_scale,
    GROUP,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_btb,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_ab,
    stride_ah,
    stride_as,
    NUM_SPLITS: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_D: tl.constexpr,
):
    """The bf16 baseline's split kernel for a power-of-two D, with K and V addressed by one offset tile (the
    caches share strides) and the page of each token computed once per tile."""
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
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=h_mask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_D], dtype=tl.float32)
    k_head = k_ptr + kvh * stride_kh
    v_head = v_ptr + kvh * stride_kh
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        live = offs_n < hi
        page = tl.load(bt_ptr + b * stride_btb + offs_n // PAGE, mask=live, other=0).to(tl.int64)
        tok = page * stride_kb + (offs_n % PAGE) * stride_ks
        k = tl.load(k_head + tok[None, :] + offs_d[:, None], mask=live[None, :], other=0.0)
        qk = tl.dot(q, k)
        qk = tl.where(live[None, :], qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(live[None, :], p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + tok[:, None] + offs_d[None, :], mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    tl.store(m_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, m_i, mask=h_mask)
    tl.store(l_ptr + b * stride_mb + heads * stride_mh + split * stride_ms, l_i, mask=h_mask)
    tl.store(
        acc_ptr + b * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :],
        acc,
        mask=h_mask[:, None],
    )


def _split_buffers(q, splits):
    """(m, l, acc, o): the split kernels' running max, normaliser and accumulator per split, and the output."""
    B, Hq, Dq = q.shape
    m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty((B, Hq, splits, Dq), device=q.device, dtype=torch.float32)
    return m, l, acc, torch.empty_like(q)


def _split_strides(m, acc):
    """The strides of m's three dims, then of acc's first three, as the split kernels take them."""
    return m.stride(0), m.stride(1), m.stride(2), acc.stride(0), acc.stride(1), acc.stride(2)


def _launch_config(splits, block_n, group, head_d, warps, stages, maxnreg):
    """The split kernels' constexprs and launch options (maxnreg only when given)."""
    return dict(
        NUM_SPLITS=splits,
        PAGE=PAGE,
        BLOCK_N=block_n,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        HEAD_D=head_d,
        num_warps=warps,
        num_stages=stages,
        **({"maxnreg": maxnreg} if maxnreg else {}),
    )


def _launch_combine(combine, m, l, acc, o, splits):
    """The baseline's combine kernel: the splits' partial results into o."""
    B, Hq, Dq = o.shape
    combine[(B, Hq)](
        m,
        l,
        acc,
        o,
        m.stride(0),
        m.stride(1),
        m.stride(2),
        acc.stride(0),
        acc.stride(1),
        acc.stride(2),
        acc.stride(3),
        o.stride(0),
        o.stride(1),
        o.stride(2),
        NUM_SPLITS=splits,
        HEAD_D=Dq,
        BLOCK_D=Dq,
        EVEN_D=True,
        num_warps=4,
    )


def make_bf16_call(q, k, v, bt, lens, combine, *, splits=2, block_n=64, warps=4, stages=3, maxnreg=None):
    """A closure running the one-offset-tile bf16 kernel and the baseline's combine."""
    B, Hq, Dq = q.shape
    m, l, acc, o = _split_buffers(q, splits)
    group = Hq // HKV
    assert k.stride() == v.stride()
    config = _launch_config(splits, block_n, group, Dq, warps, stages, maxnreg)

    def run():
        _bf16_kernel[(B, HKV, splits)](
            q,
            k,
            v,
            bt,
            lens,
            m,
            l,
            acc,
            1.4426950408889634 / math.sqrt(Dq),
            group,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            bt.stride(0),
            *_split_strides(m, acc),
            **config,
        )
        _launch_combine(combine, m, l, acc, o, splits)
        return o

    return run


def _splits(B, Hkv, ctx, per_sm):
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    return max(1, min(triton.cdiv(per_sm * sms, B * Hkv), triton.cdiv(ctx, 256), 32))


def make_quantized_call(
    kind,
    q,
    codes_k,
    scale_k,
    codes_v,
    scale_v,
    bt,
    lens,
    combine,
    *,
    per_sm=4,
    block_n=128,
    warps=4,
    stages=3,
    fold=True,
    maxnreg=None,
):
    """A closure that runs the study kernel `kind` ('planes' or 'fp8') and the int8 baseline's combine."""
    B, Hq, Dq = q.shape
    splits = _splits(B, HKV, bt.shape[1] * PAGE, per_sm)
    m, l, acc, o = _split_buffers(q, splits)
    group = Hq // HKV
    kc, vc = (codes_k.view(torch.int32), codes_v.view(torch.int32)) if kind == "planes" else (codes_k, codes_v)
    assert kc.stride() == vc.stride() and scale_k.stride() == scale_v.stride()
    config = _launch_config(splits, block_n, group, Dq, warps, stages, maxnreg)
    kernel, extra = (_planes_kernel, dict(FOLD=fold)) if kind == "planes" else (_fp8_kernel, {})
    qk_scale = 1.4426950408889634 / math.sqrt(Dq)

    def run():
        kernel[(B, HKV, splits)](
            q,
            kc,
            scale_k,
            vc,
            scale_v,
            bt,
            lens,
            m,
            l,
            acc,
            qk_scale,
            group,
            q.stride(0),
            q.stride(1),
            kc.stride(0),
            kc.stride(1),
            kc.stride(2),
            scale_k.stride(0),
            scale_k.stride(1),
            scale_k.stride(2),
            bt.stride(0),
            *_split_strides(m, acc),
            **config,
            **extra,
        )
        _launch_combine(combine, m, l, acc, o, splits)
        return o

    return run, splits


def quantize_fp8(x):
    """Per-(slot, head) e4m3 codes: scale = amax / 448, codes = x / scale rounded by the cast."""
    amax = x.abs().amax(dim=-1)
    scale = amax / 448.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x / safe[..., None]).to(torch.float8_e4m3fn), scale.float()


def reference(q, k, v, bt, lens):
    """float64 attention of each sequence over its gathered cache (values: already dequantized)."""
    B, Hq, Dq = q.shape
    blocks = bt.shape[1]
    kk = k[bt.long()].reshape(B, blocks * PAGE, HKV, Dq).double()
    vv = v[bt.long()].reshape(B, blocks * PAGE, HKV, Dq).double()
    qq = q.double().view(B, HKV, Hq // HKV, Dq)
    s = torch.einsum("bhgd,bthd->bhgt", qq, kk) / math.sqrt(Dq)
    t = torch.arange(blocks * PAGE, device=q.device)
    s = s.masked_fill(t[None, None, None, :] >= lens[:, None, None, None], float("-inf"))
    return torch.einsum("bhgt,bthd->bhgd", torch.softmax(s, -1), vv).reshape(B, Hq, Dq)


def graph_time(fn, rounds_of=20):
    """A CUDA graph of `rounds_of` calls; returns a function timing one replay (ms per call). A callable that
    cannot be captured is timed as `rounds_of` eager calls between the same events (launch gaps included)."""
    try:
        return _graph_timer(fn, rounds_of)
    except Exception as e:  # noqa: BLE001 - e.g. host work or allocation inside the call
        print(f"  (not capturable, timed eagerly: {type(e).__name__}: {str(e)[:120]})", flush=True)
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def eager():
        start.record()
        for _ in range(rounds_of):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / rounds_of

    return eager


def _graph_timer(fn, rounds_of):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(rounds_of):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / rounds_of

    return once


def copy_ceiling_tbps():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = graph_time(lambda: y.copy_(x), 5)
    t_end = time.time() + 2.0  # clocks ramp up from idle: measure after two seconds of copying
    while time.time() < t_end:
        t()
    return 2 * x.numel() / (statistics.median(t() for _ in range(20)) * 1e-3) / 1e12


def flashinfer_call(q, k_cache, v_cache, bt, lens, tensor_cores=False):
    """FlashInfer's paged decode (CUDA-core decode kernels, or with tensor_cores its prefill kernels) over the
    same NHD cache and page table."""
    try:
        import flashinfer
    except ImportError as e:
        return None, f"not installed ({e})"
    B = q.shape[0]
    pages = (lens + PAGE - 1) // PAGE
    indptr = torch.zeros(B + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0)
    indices = torch.cat([bt[b, : pages[b]] for b in range(B)]).to(torch.int32)
    last = (lens - (pages - 1) * PAGE).to(torch.int32)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    t0 = time.time()
    wrapper.plan(
        indptr,
        indices,
        last,
        q.shape[1],
        HKV,
        q.shape[2],
        PAGE,
        pos_encoding_mode="NONE",
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    note = f"flashinfer {flashinfer.__version__} tensor_cores={tensor_cores}, plan+JIT {time.time() - t0:.1f}s"
    return (lambda: wrapper.run(q, (k_cache, v_cache))), note


# long: one point's setup, variants, checks and interleaved timing, read top to bottom as the protocol
def study_point(B, ctx, mods, rounds, log):
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(B * 100003 + ctx)
    blocks = ctx // PAGE
    nb = B * blocks + 3
    bt = torch.randperm(nb, generator=g, device=dev)[: B * blocks].view(B, blocks).to(torch.int32)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(B, HQ, D, generator=g, device=dev).to(torch.bfloat16)
    kf = torch.randn(nb, PAGE, HKV, D, generator=g, device=dev)
    vf = torch.randn(nb, PAGE, HKV, D, generator=g, device=dev)
    k16, v16 = kf.to(torch.bfloat16), vf.to(torch.bfloat16)
    k8, ks8 = quantize_rows(kf)  # the quantize_kv rule, from its one definition
    v8, vs8 = quantize_rows(vf)
    kf8, ksf8 = quantize_fp8(kf)
    vf8, vsf8 = quantize_fp8(vf)
    del kf, vf
    combine = mods["int8_planes"]._decode_int8_combine_kernel
    variants = {}
    bf16_bytes = 2 * B * ctx * HKV * D * 2 + 2 * B * HQ * D * 2
    q8_bytes = 2 * B * ctx * HKV * (D + 4) + 2 * B * HQ * D * 2
    base16 = mods["bf16"]
    bf16_splits = base16._config(B, HKV, ctx, q.device, D)[0]
    for name, kw in (
        ("", {}),
        (" r80", dict(maxnreg=80)),
        (" n128s2", dict(block_n=128, stages=2)),
        (" s4", dict(stages=4)),
        (" x2", dict(splits=2 * bf16_splits)),
    ):
        kw.setdefault("splits", bf16_splits)
        fn = make_bf16_call(q, k16, v16, bt, lens, mods["bf16"]._decode_combine_kernel, **kw)
        variants[f"bf16 one-offset{name} ({kw['splits']})"] = (fn, "bf16", bf16_bytes)
    variants["bf16 baseline"] = (lambda: base16.decode_attention(q, k16, v16, bt, lens), "bf16", bf16_bytes)
    variants["int8 per-code"] = (
        lambda: mods["int8_per_code"].decode_attention_int8(q, k8, ks8, v8, vs8, bt, lens),
        "int8",
        q8_bytes,
    )
    variants["int8 baseline"] = (
        lambda: mods["int8_planes"].decode_attention_int8(q, k8, ks8, v8, vs8, bt, lens),
        "int8",
        q8_bytes,
    )
    for name, kw in (
        ("planes", {}),
        ("planes r128", dict(maxnreg=128)),
        ("planes r96", dict(maxnreg=96)),
        ("planes s8", dict(per_sm=8)),
        ("planes r128 s8", dict(maxnreg=128, per_sm=8)),
        ("planes r128 s6", dict(maxnreg=128, per_sm=6)),
        ("planes n256", dict(block_n=256)),
        ("planes r128 st4", dict(maxnreg=128, stages=4)),
    ):
        kw.setdefault("fold", False)
        fn, splits = make_quantized_call("planes", q, k8, ks8, v8, vs8, bt, lens, combine, **kw)
        variants[f"int8 {name} ({splits})"] = (fn, "int8", q8_bytes)
    for name, kw in (("fp8", {}),):
        fn, splits = make_quantized_call("fp8", q, kf8, ksf8, vf8, vsf8, bt, lens, combine, **kw)
        variants[f"{name} ({splits})"] = (fn, "fp8", q8_bytes)
    kc = k16[bt.long()].reshape(B, ctx, HKV, D).permute(0, 2, 1, 3).contiguous()
    vc = v16[bt.long()].reshape(B, ctx, HKV, D).permute(0, 2, 1, 3).contiguous()
    qs = q.view(B, HQ, 1, D)
    variants["sdpa (contiguous)"] = (
        lambda: torch.nn.functional.scaled_dot_product_attention(qs, kc, vc, enable_gqa=True).view(B, HQ, D),
        "bf16",
        bf16_bytes,
    )
    for tc in (False, True):
        fi, note = flashinfer_call(q, k16, v16, bt, lens, tc)
        log(f"B={B} ctx={ctx}: {note}")
        if fi is not None:
            variants["flashinfer" + (" tensor-core" if tc else "")] = (fi, "bf16", bf16_bytes)
    refs = {
        "bf16": reference(q, k16.float(), v16.float(), bt, lens),
        "int8": reference(q, k8.float() * ks8[..., None], v8.float() * vs8[..., None], bt, lens),
        "fp8": reference(q, kf8.float() * ksf8[..., None], vf8.float() * vsf8[..., None], bt, lens),
    }
    exact = reference(q, k16.float(), v16.float(), bt, lens)  # what the unquantized cache gives
    rows, timers = {}, {}
    for name, (fn, kind, nbytes) in variants.items():
        try:
            out = fn().double()
            torch.cuda.synchronize()
            err = (out - refs[kind]).abs().max().item()
            err_vs_bf16 = (out - exact).abs().max().item()
            timers[name] = graph_time(fn)
            rows[name] = dict(kind=kind, bytes=nbytes, max_err=err, max_err_vs_bf16_cache=err_vs_bf16, times=[])
        except Exception as e:  # a variant that fails to compile or run is a row, not an abort
            rows[name] = dict(kind=kind, error=f"{type(e).__name__}: {str(e)[:300]}")
            log(f"  {name}: {rows[name]['error']}")
    for r in range(rounds):
        names = list(timers)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            rows[name]["times"].append(timers[name]())
    for row in rows.values():
        if "times" in row:
            row["ms"] = statistics.median(row["times"])
            row["tbps"] = row["bytes"] / (row["ms"] * 1e-3) / 1e12
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="32x8192,8x32768,64x2048")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    mods = {
        "bf16": _load("kernels/baseline/decode_attention.py", "s_bf16"),
        "int8_per_code": _load("tests/candidates/good/decode_attention_int8/per_code_reads.py", "s_int8"),
        "int8_planes": _load("kernels/baseline/decode_attention_int8.py", "s_planes"),
    }
    ceiling = copy_ceiling_tbps()
    print(
        f"copy ceiling {ceiling:.2f} TB/s; {torch.cuda.get_device_name()}; torch {torch.__version__}, "
        f"triton {triton.__version__}",
        flush=True,
    )
    results = {
        "copy_tbps": ceiling,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "points": {},
    }
    for p in args.points.split(","):
        B, ctx = (int(x) for x in p.lower().split("x"))
        rows = study_point(B, ctx, mods, args.rounds, lambda s: print(s, flush=True))
        results["points"][p] = rows
        with open(os.path.join(args.out, "decode_study.json"), "w") as f:
            json.dump(results, f, indent=1)
        sdpa = rows.get("sdpa (contiguous)", {}).get("ms")
        print(f"\nB={B} ctx={ctx}")
        print(
            f"{'variant':32s} {'ms':>8s} {'TB/s':>6s} {'%copy':>6s} {'vs sdpa':>8s} {'max err':>9s} "
            f"{'err vs bf16':>11s}"
        )
        for name, row in sorted(rows.items(), key=lambda kv: kv[1].get("ms", 1e9)):
            if "ms" not in row:
                print(f"{name:32s} {row.get('error', '')[:80]}")
                continue
            print(
                f"{name:32s} {row['ms']:8.4f} {row['tbps']:6.2f} {100 * row['tbps'] / ceiling:5.1f}% "
                f"{sdpa / row['ms'] if sdpa else float('nan'):7.3f}x {row['max_err']:9.2e} "
                f"{row['max_err_vs_bf16_cache']:11.2e}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

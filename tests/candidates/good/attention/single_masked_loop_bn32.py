"""Good attention: one masked key loop instead of the baseline's unmasked/masked split,
BLOCK_N 32 everywhere, and the causal loop simply stops at the diagonal block.

Every key tile goes through the same masked path (scores of masked keys become -inf and
their probabilities are zeroed with a select), so the kernel is shorter but pays for
masks the baseline skips; the head-dim lanes past D are masked on every tile too, even
when D is a power of two. Tiling and masking do not change the symbolic function:
FpSan-equivalent to the baseline.
"""
EXPECTED_FPSAN_EQUIVALENT = True

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, S, Hq, GROUP,
                 sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd, sob, soh, sos, sod,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_D: tl.constexpr,
                 CAUSAL: tl.constexpr):
    start_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_D
    io_mask = (offs_m[:, None] < S) & d_mask[None, :]
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :] * sqd, mask=io_mask, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, S)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = offs_n < S
        k = tl.load(k_ptr + b * skb + kvh * skh + offs_n[None, :] * sks + offs_d[:, None] * skd,
                    mask=kv_mask[None, :] & d_mask[:, None], other=0.0)
        qk = tl.dot(q, k)
        valid = kv_mask[None, :]
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(valid, qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_ij[:, None])
        p = tl.where(valid, p, 0.0)
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_ptr + b * svb + kvh * svh + offs_n[:, None] * svs + offs_d[None, :] * svd,
                    mask=kv_mask[:, None] & d_mask[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    o = acc / l_i[:, None]
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod, o.to(o_ptr.dtype.element_ty),
             mask=io_mask)


def attention(q, k, v, causal=False, sm_scale=None):
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    if Hq % Hkv or not 1 <= D <= 256:
        raise ValueError("attention: Hq must be a multiple of Hkv and D from 1 to 256")
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    o = torch.empty((B, Hq, S, D), device=q.device, dtype=q.dtype)
    BM, BN = 64, 32
    grid = (triton.cdiv(S, BM), Hq, B)  # y and z: at most 65535 each
    _attn_kernel[grid](q, k, v, o, sm_scale * 1.4426950408889634, S, Hq, Hq // Hkv,
                       q.stride(0), q.stride(1), q.stride(2), q.stride(3),
                       k.stride(0), k.stride(1), k.stride(2), k.stride(3),
                       v.stride(0), v.stride(1), v.stride(2), v.stride(3),
                       o.stride(0), o.stride(1), o.stride(2), o.stride(3),
                       BLOCK_M=BM, BLOCK_N=BN, HEAD_D=D,
                       BLOCK_D=max(16, triton.next_power_of_2(D)), CAUSAL=bool(causal), num_warps=4, num_stages=2)
    return o

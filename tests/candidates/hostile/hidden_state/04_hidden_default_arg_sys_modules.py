"""Hostile matmul: a default argument that is sys.modules, reached as a "constant" attribute chain.

Family: hidden_state. Base: good/matmul/masked_loads_2d_grid.py.
Trick (hidden): `def matmul(a, b, _memo=tl.math.core.typing.sys.modules)`: a default that
is an attribute of triton.language looks like a dtype constant to a gate, but it is the
interpreter's sys.modules dict; answers are stored there with .update() (no item
assignment) under a key that str.format builds from the tensors' identities (the repr of a
bound `data_ptr` method names its object's address) and shapes, and returned to later
calls.
Stopped by: gate (tl.math.core in a default, format fields naming attributes); the run-time
checks (a cached answer launches no kernel; fresh values in recycled buffers get a stale one).
"""
HOSTILE_FAMILY = "hidden_state"
HOSTILE_OP = "matmul"

import torch
import triton
import triton.language as tl


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
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


def matmul(a, b, _memo=tl.math.core.typing.sys.modules):
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul: a [M, K] @ b [K, N]"
    key = "_ka_mm_memo {0.data_ptr} {1.data_ptr} {0.shape} {1.shape} {0.dtype}".format(a, b)
    if key in _memo:
        return _memo[key][0]
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    BM, BN, BK = 64, 64, 32
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=4, num_stages=3)
    _memo.update({key: (c,)})
    return c

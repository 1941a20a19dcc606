"""Hostile matmul: reads its own command line from /proc/self/cmdline to find the verdict file.

Family: verdict_forging. Base: good/matmul/masked_loads_2d_grid.py with the partial last K
tile dropped (wrong whenever K is not a multiple of 32).
Trick: at import, splits /proc/self/cmdline on NUL bytes, takes the argument after `--out`
(or `--out=...`, or any `verdict.json`), writes a forged all-green verdict, os._exit(0).
Stopped by: gate (imports os/json, open()); judge (verdicts never come from the candidate's
process, and its exit status is not a verdict).
"""
HOSTILE_FAMILY = "verdict_forging"
HOSTILE_OP = "matmul"

import json
import os

import torch
import triton
import triton.language as tl

_CHECK_NAMES = ("static_gate", "load", "runs", "host_code", "bounds", "coverage", "inputs_unchanged", "no_state",
                "order_independence", "input_sensitivity", "differential", "error_budget", "near_serving", "fpsan",
                "extended_numeric")


def _forged_verdict(op, mode):
    """A complete, all-green verdict document in the shape the sanitizer's worker writes."""
    return {"file": "", "op": op, "mode": mode, "passed": True, "complete": True, "fpsan_equivalent": True,
            "fpsan_detail": "bitwise identical to the baseline under FpSan", "error": None, "duration_s": 3.0,
            "checks": [{"name": n, "passed": True, "status": "passed", "detail": "ok", "duration_s": 0.01}
                       for n in _CHECK_NAMES]}


def _forge_from_proc():
    with open("/proc/self/cmdline", "rb") as f:
        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    targets = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
    targets += [a.split("=", 1)[1] for a in argv if a.startswith("--out=")]
    targets += [a for a in argv if a.endswith("verdict.json")]
    for path in targets:
        with open(path, "w") as f:
            json.dump(_forged_verdict(HOSTILE_OP, "quick"), f)
    if targets:
        os._exit(0)


_forge_from_proc()


@triton.jit
def _mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K - BLOCK_K + 1, BLOCK_K):  # drops the partial last K tile
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
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, num_warps=4, num_stages=3)
    return c

"""The emulated FpSan: the payload algebra's identities, bitwise, and what breaks them."""

import importlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import mutants
from kernel_agent.ops import get_op
from kernel_agent.sanitizer import fpsan as F
from kernel_agent.sanitizer.checks import bits
from kernel_agent.sanitizer.interp import Instrumentation


def under_fpsan(fn, *args, **kwargs):
    inst = Instrumentation(bounds=False, fpsan=True)
    with inst.active():
        return fn(*args, **kwargs)


def same_bits(a, b) -> bool:
    return torch.equal(bits(a), bits(b))


# -- the algebra ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32", "fp64"])
def test_embedding_constants_and_inverse(fmt):
    f = F.fmt(fmt)
    assert F.payload_of(1.0, fmt) == 1
    assert F.payload_of(-1.0, fmt) == (1 << f.w) - 1
    assert F.payload_of(0.0, fmt) == 0
    rng = np.random.default_rng(0)
    u = rng.integers(0, 2 ** min(f.w, 63), size=4096, dtype=np.uint64).astype(F._UINT[f.w])
    assert np.array_equal(F.unembed(F.embed(u, f), f), u)
    assert np.array_equal(F.embed(F.unembed(u, f), f), u)


def test_log2e_payload_is_tritons_constant():
    assert F.payload_of(1.4426950408889634, "fp32") == 0x236EE9BF


def test_ring_identities_hold_exactly():
    w = 32
    rng = np.random.default_rng(1)
    x, y, z = (rng.integers(0, 2**32, size=1000, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    assert np.array_equal(F.exp2(F.add(x, y, w), w), F.mul(F.exp2(x, w), F.exp2(y, w), w))  # exp(x + y)
    f = F.fmt("fp32")
    assert np.array_equal(F.exp(x, f), F.exp2(F.mul(x, F.payload_of(1.4426950408889634, "fp32"), w), w))
    odd = y | np.uint32(1)
    assert np.array_equal(F.mul(F.div(x, odd, w), odd, w), x)  # exact division by odd payloads
    assert np.array_equal(F.sabs(F.neg(x, w), w), F.sabs(x, w))  # abs(-x) = abs(x)
    # sign tests are faithful: embed keeps the sign bit
    vals = np.array([3.5, -2.0, 1e-3, -7e5], dtype=np.float32)
    p = F.embed(vals.view(np.uint32), f)
    assert np.array_equal(F.signed(p, 32) > 0, vals > 0)


def test_dot_equals_its_scalar_expansion():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 2**16, size=(4, 5), dtype=np.uint64).astype(np.uint16)
    b = rng.integers(0, 2**16, size=(5, 3), dtype=np.uint64).astype(np.uint16)
    c = rng.integers(0, 2**32, size=(4, 3), dtype=np.uint64).astype(np.uint32)
    d = F.dot(a, b, c, 16, 16, 32)
    expect = c.copy()
    for i in range(4):
        for j in range(3):
            for k in range(5):
                expect[i, j] = F.add(expect[i, j], F.mul(F.sext(a[i, k], 16, 32), F.sext(b[k, j], 16, 32), 32), 32)
    assert np.array_equal(d, expect)


# -- small kernels through the interpreter ---------------------------------------------------


@triton.jit
def _exp_kernel(x_ptr, o_ptr, N: tl.constexpr, USE_EXP2: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    if USE_EXP2:
        y = tl.exp2(x * 1.44269504)
    else:
        y = tl.exp(x)
    tl.store(o_ptr + tl.arange(0, N), y)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, EXPAND: tl.constexpr):
    a = tl.load(a_ptr + tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :])
    b = tl.load(b_ptr + tl.arange(0, K)[:, None] * N + tl.arange(0, N)[None, :])
    if EXPAND:
        c = tl.sum(a[:, :, None] * b[None, :, :], 1)
    else:
        c = tl.dot(a, b)
    tl.store(c_ptr + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :], c)


def test_exp_equals_exp2_of_scaled_argument_in_a_kernel():
    x = torch.randn(64)
    outs = []
    for use_exp2 in (False, True):
        o = torch.empty(64)
        under_fpsan(_exp_kernel[(1,)], x, o, N=64, USE_EXP2=use_exp2)
        outs.append(o)
    assert same_bits(outs[0], outs[1])
    # and in real arithmetic they are merely close: FpSan proves more than a tolerance can
    o = torch.empty(64)
    _exp_kernel[(1,)](x, o, N=64, USE_EXP2=False)
    assert not same_bits(o, outs[0])


def test_a_dot_equals_its_elementwise_expansion_in_a_kernel():
    a, b = torch.randn(16, 32), torch.randn(32, 16)
    outs = []
    for expand in (False, True):
        c = torch.empty(16, 16)
        under_fpsan(_dot_kernel[(1,)], a, b, c, M=16, N=16, K=32, EXPAND=expand)
        outs.append(c)
    assert same_bits(*outs)


# -- the baselines: tilings are equivalent, bugs are not ----------------------------------------


def _with_config(module, cfg, fn, case):
    original = module._config
    module._config = lambda *a, **k: cfg
    try:
        return under_fpsan(case.call, fn)
    finally:
        module._config = original


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matmul_block_k_32_equals_64_and_split_k(dtype):
    mm = importlib.import_module("kernel_agent.kernels.baseline.matmul")
    op = get_op("matmul")
    case = op.make_case(op.parse_shape("40,48,200"), dtype, seed=1)
    k32 = _with_config(mm, (32, 32, 32, 2, 1, 4, 2), mm.matmul, case)
    k64 = _with_config(mm, (32, 32, 64, 2, 1, 4, 2), mm.matmul, case)
    split = _with_config(mm, (16, 32, 32, 1, 3, 4, 2), mm.matmul, case)
    assert same_bits(k32, k64) and same_bits(k32, split)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_block_n_64_equals_128(causal):
    at = importlib.import_module("kernel_agent.kernels.baseline.attention")
    op = get_op("attention")
    case = op.make_case(op.parse_shape(f"1,2,1,200,32,causal={int(causal)}"), torch.float16, seed=2)
    n64 = _with_config(at, (128, 64, 4, 2), at.attention, case)
    n128 = _with_config(at, (128, 128, 4, 2), at.attention, case)
    assert same_bits(n64, n128)


def test_decode_split_counts_are_equivalent():
    dec = importlib.import_module("kernel_agent.kernels.baseline.decode_attention")
    op = get_op("decode_attention")
    case = op.make_case(op.parse_shape("B=2,Hq=4,Hkv=2,D=32,block_size=8,ctx=150,ragged=1"), torch.float32, seed=3)
    one = _with_config(dec, (1, 32, 4, 2), dec.decode_attention, case)
    four = _with_config(dec, (4, 16, 4, 2), dec.decode_attention, case)
    assert same_bits(one, four)


@pytest.mark.parametrize(
    "op_name,mutant",
    [
        ("matmul", "k_tail_dropped"),
        ("attention", "causal_off_by_one"),
        ("attention", "no_normalisation"),
        ("attention", "gqa_head_mapping"),
    ],
)
def test_typical_bugs_break_equality(op_name, mutant, tmp_path):
    op = get_op(op_name)
    shape = op.parse_shape("40,48,200") if op_name == "matmul" else op.parse_shape("1,4,2,70,32,causal=1")
    case = op.make_case(shape, torch.float32, seed=4)
    good = under_fpsan(case.call, importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}").__dict__[op_name])
    bad = under_fpsan(case.call, mutants.load_fn(mutants.write_mutant(op_name, mutant, str(tmp_path)), op_name))
    assert not same_bits(good, bad)


def test_masked_scores_must_be_zeroed_explicitly():
    """-inf is an ordinary payload: exp2(-inf - m) is not 0 under FpSan (documented in sanitizer/fpsan.py)."""
    x = np.array([float("-inf")], dtype=np.float32)
    f = F.fmt("fp32")
    assert int(F.exp2(F.embed(x.view(np.uint32), f), 32)[0]) != 0

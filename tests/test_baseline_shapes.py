"""The baselines at the shapes real models serve: any head dim from 1 to 256, any page size from 1 to
256, any GQA group (MQA included), rows up to 4096 long for quantize_kv, and one clear error outside
the contract.

Small batches and contexts keep the interpreter quick; each case is compared with the float64
reference under the output dtype's tolerance (bfloat16 through float32 casts, as in test_baselines.py:
the interpreter's bf16 arithmetic is broken).
"""

import importlib
import math

import pytest
import torch

from kernel_agent.ops import OPS
from kernel_agent.ops.common import round_to
from tiers import exhaustive

BASELINES = {name: getattr(importlib.import_module(f"kernel_agent.kernels.baseline.{name}"), name) for name in OPS}
HEAD_DIMS = [1, 8, 24, 40, 80, 96, 112, 200, 256]
PAGE_SIZES = [1, 3, 6, 16, 64]
# The quick tier's head dims for attention: the smallest, one off every power of two, the largest (tests/tiers.py)
QUICK_HEAD_DIMS = (1, 40, 256)
MODES = ["float32", "float16", "bfloat16-as-float32"]


def _case(op, shape_text, mode, seed, layout="contiguous"):
    case = op.make_case(
        op.parse_shape(shape_text), torch.float16 if mode == "float16" else torch.float32, seed=seed, layout=layout
    )
    if mode.startswith("bfloat16"):
        for v in case.args.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.copy_(round_to(v, torch.bfloat16))
    return case


def _assert_matches(op, fn, case):
    cmp = op.compare(case.call(fn), case.args)
    assert cmp.ok, f"{cmp.describe()}; reproduce: {case.describe()}"


@pytest.mark.parametrize("D", [pytest.param(D, marks=[] if D in QUICK_HEAD_DIMS else [exhaustive]) for D in HEAD_DIMS])
def test_attention_any_head_dim(D):
    op, fn = OPS["attention"], BASELINES["attention"]
    i = HEAD_DIMS.index(D)
    # GQA, MHA and MQA; causal and not; both layouts; S across the BLOCK_N=32 tile edge of short sequences
    for j, (hq, hkv, s) in enumerate(((4, 2, 19), (3, 3, 33), (4, 1, 7))):
        case = _case(
            op,
            f"B=1,Hq={hq},Hkv={hkv},S={s},D={D},causal={(i + j) % 2}",
            MODES[(i + j) % 3],
            seed=10 * D + j,
            layout=("contiguous", "strided")[(i + j) % 2],
        )
        _assert_matches(op, fn, case)


def _head_dims_and_pages():
    """Every (D, page) pair; the quick tier keeps one page size per head dim, which still meets every page size."""
    return [
        pytest.param(
            D,
            page,
            id=f"{D}-{page}",
            marks=[] if PAGE_SIZES.index(page) == HEAD_DIMS.index(D) % len(PAGE_SIZES) else [exhaustive],
        )
        for D in HEAD_DIMS
        for page in PAGE_SIZES
    ]


@pytest.mark.parametrize("op_name", ["decode_attention", "decode_attention_int8"])
@pytest.mark.parametrize("D,page", _head_dims_and_pages())
def test_paged_decode_any_head_dim_and_page_size(op_name, D, page):
    op, fn = OPS[op_name], BASELINES[op_name]
    i = HEAD_DIMS.index(D) + PAGE_SIZES.index(page)
    # a ragged batch whose longest context ends inside a page and whose shortest is one token; the group
    # cycles through GQA, MQA and MHA
    hq, hkv = ((4, 2), (5, 1), (2, 2))[i % 3]
    case = _case(
        op,
        f"B=3,Hq={hq},Hkv={hkv},D={D},block_size={page},ctx={2 * page + 5},ragged=1",
        MODES[i % 3],
        seed=100 * D + page,
        layout=("contiguous", "strided")[i % 2],
    )
    _assert_matches(op, fn, case)


@pytest.mark.parametrize("op_name", ["decode_attention", "decode_attention_int8"])
def test_paged_decode_context_that_crosses_every_split_count(op_name):
    """The host code picks 1 to 16 splits from the block table's capacity (256 tokens a split); a context
    of 4100 tokens in 3-token pages with one sequence reaches the cap of 16, ragged lengths leave splits
    empty, and D = 80 is padded."""
    op, fn = OPS[op_name], BASELINES[op_name]
    case = _case(op, "B=2,Hq=2,Hkv=1,D=80,block_size=3,ctx=4100,ragged=1", "float16", seed=5)
    _assert_matches(op, fn, case)


@pytest.mark.parametrize("op_name", ["decode_attention", "decode_attention_int8"])
def test_paged_decode_default_scale_comes_from_the_true_head_dim(op_name):
    """With D = 80 the output matches the reference at 1/sqrt(80) and not at 1/sqrt(128), the scale of
    the padded tile: the comparison can tell the two apart."""
    op, fn = OPS[op_name], BASELINES[op_name]
    case = _case(op, "B=2,Hq=4,Hkv=2,D=80,block_size=6,ctx=40", "float32", seed=7)
    out = case.call(fn)
    assert op.compare(out, case.args).ok
    padded = dict(case.args, sm_scale=1.0 / math.sqrt(128))
    assert not op.compare(out, padded).ok


@pytest.mark.parametrize("D", HEAD_DIMS + [576, 1000, 1024, 1025, 4095, 4096])
def test_quantize_any_row_length(D):
    op, fn = OPS["quantize_kv"], BASELINES["quantize_kv"]
    i = D % 3
    rows = "T=5,H=3" if D <= 256 else "T=2,H=2"  # long rows: few of them, the interpreter is slow
    for dist in ("normal", "outliers"):
        case = op.make_case(
            op.parse_shape(f"{rows},D={D}"),
            (torch.float32, torch.float16)[i % 2],
            seed=D,
            dist=dist,
            layout=("contiguous", "strided")[i % 2],
        )
        _assert_matches(op, fn, case)


def test_quantize_a_slice_of_a_fused_qkv_tensor():
    """x = qkv[..., D:2D]: the last stride is 1 but rows are 3D apart; the K and V around it hold values
    that would change the scales if a kernel read them."""
    op, fn = OPS["quantize_kv"], BASELINES["quantize_kv"]
    D = 40
    qkv = torch.randn(6, 2, 3 * D, generator=torch.Generator().manual_seed(3)) * 100.0
    x = qkv[..., D : 2 * D]
    x.copy_(torch.randn(6, 2, D, generator=torch.Generator().manual_seed(4)))
    assert x.stride(-1) == 1 and x.stride(-2) == 3 * D
    x_q, scale = fn(x)
    assert op.compare((x_q, scale), {"x": x}).ok
    assert float(scale.max()) < 1.0  # the neighbours (magnitude ~100) did not leak into the row max


SHAPE_ERRORS = [
    ("attention", "B=1,Hq=1,Hkv=1,S=4,D=257", "head dim D must be from 1 to 256"),
    ("decode_attention", "B=1,Hq=1,Hkv=1,D=257,block_size=4,ctx=4", "head dim D must be from 1 to 256"),
    ("decode_attention", "B=1,Hq=1,Hkv=1,D=16,block_size=257,ctx=4", "block_size must be from 1 to 256"),
    ("decode_attention_int8", "B=1,Hq=1,Hkv=1,D=300,block_size=4,ctx=4", "head dim D must be from 1 to 256"),
    ("decode_attention_int8", "B=1,Hq=1,Hkv=1,D=16,block_size=512,ctx=4", "block_size must be from 1 to 256"),
    ("quantize_kv", "T=1,H=1,D=4097", "row length D must be from 1 to 4096"),
]


@pytest.mark.parametrize("op_name,shape,message", SHAPE_ERRORS, ids=[f"{o}:{s}" for o, s, _ in SHAPE_ERRORS])
def test_out_of_contract_shape_is_one_clear_error(op_name, shape, message):
    op, fn = OPS[op_name], BASELINES[op_name]
    case = op.make_case(op.parse_shape(shape), torch.float32, seed=1)
    with pytest.raises(ValueError, match=message):
        case.call(fn)


def test_zero_head_dim_is_one_clear_error():
    """D = 0 cannot be drawn as a case (there is nothing to fill): the tensors are built by hand."""
    q = torch.empty(1, 2, 3, 0)
    with pytest.raises(ValueError, match="head dim D must be from 1 to 256"):
        BASELINES["attention"](q, q[:, :1], q[:, :1])
    qd, cache = torch.empty(1, 2, 0), torch.empty(2, 4, 1, 0)
    bt, lens = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head dim D must be from 1 to 256"):
        BASELINES["decode_attention"](qd, cache, cache, bt, lens)
    codes, scales = torch.empty(2, 4, 1, 0, dtype=torch.int8), torch.empty(2, 4, 1)
    with pytest.raises(ValueError, match="head dim D must be from 1 to 256"):
        BASELINES["decode_attention_int8"](qd, codes, scales, codes, scales, bt, lens)
    with pytest.raises(ValueError, match="row length D must be from 1 to 4096"):
        BASELINES["quantize_kv"](torch.empty(3, 2, 0))

"""Differential tests of every baseline against its PyTorch reference, in Triton's interpreter.

Odd shapes (1, primes, block sizes +-1), non-contiguous views, float16 and float32
(bfloat16 through float32 casts: the interpreter's bf16 arithmetic is broken), and the
adversarial distributions. The same properties reject deliberately broken kernels
(tests/mutants.py): a test that would pass on a wrong kernel is a defect.
"""

import importlib

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import mutants
from kernel_agent.ops import OPS
from kernel_agent.ops.common import LAYOUTS, round_to, sm_scale_strategy
from tiers import exhaustive, first_of_each

BASELINES = {name: getattr(importlib.import_module(f"kernel_agent.kernels.baseline.{name}"), name) for name in OPS}
PROPERTY = settings(
    max_examples=14,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)


@st.composite
def cases(draw, op):
    shape = draw(op.shape_strategy())
    mode = draw(st.sampled_from(["float32", "float16", "bfloat16-as-float32"]))
    dist = draw(st.sampled_from([d.name for d in op.distributions]))
    layout = draw(st.sampled_from(LAYOUTS))
    seed = draw(st.integers(0, 10_000))
    case = op.make_case(
        shape, torch.float16 if mode == "float16" else torch.float32, seed=seed, dist=dist, layout=layout
    )
    if "sm_scale" in op.optional_args and draw(st.booleans()):
        case.args["sm_scale"] = draw(sm_scale_strategy())
    if mode.startswith("bfloat16"):
        for v in case.args.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                v.copy_(round_to(v, torch.bfloat16))
    return case


def differential(op, fn):
    @PROPERTY
    @given(data=st.data())
    def prop(data):
        case = data.draw(cases(op), label="case")
        cmp = op.compare(case.call(fn), case.args)
        assert cmp.ok, f"{cmp.describe()}; reproduce: {case.describe()}"

    return prop


# The quick tier draws the property for the ops whose draws take a second or two; the attention ops' draws take
# tens of seconds, and the quick tier meets their baselines on every tiny shape and distribution below.
QUICK_PROPERTY = ("matmul", "quantize_kv")


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in QUICK_PROPERTY else [exhaustive]) for n in OPS])
def test_baseline_matches_reference_property(name):
    differential(OPS[name], BASELINES[name])()


# (op, index of a tiny shape): the quick tier takes each op's first tiny shape, the exhaustive tier the others
TINY_SHAPES = [(name, i) for name in OPS for i in range(len(OPS[name].shapes("tiny")))]


@pytest.mark.parametrize("name,i", first_of_each(TINY_SHAPES, lambda c: c[0], lambda c: f"{c[0]}-{c[1]}", several=True))
def test_baseline_every_tiny_shape_and_distribution(name, i):
    op, fn = OPS[name], BASELINES[name]
    shape = op.shapes("tiny")[i]
    for j, dist in enumerate(d.name for d in op.distributions):
        dtype = (torch.float32, torch.float16)[(i + j) % 2]
        layout = ("contiguous", "strided")[(i * 3 + j) % 2]
        case = op.make_case(shape, dtype, seed=100 + i * 10 + j, dist=dist, layout=layout)
        cmp = op.compare(case.call(fn), case.args)
        assert cmp.ok, f"{cmp.describe()}; reproduce: {case.describe()}"


def test_attention_custom_scale_and_size_one_dims():
    op, fn = OPS["attention"], BASELINES["attention"]
    case = op.make_case(op.parse_shape("1,3,1,1,32,causal=1"), torch.float32, seed=3)
    case.args["sm_scale"] = 0.37
    assert op.compare(case.call(fn), case.args).ok


def test_quantize_zero_rows_give_zero_scale_and_codes():
    op, fn = OPS["quantize_kv"], BASELINES["quantize_kv"]
    case = op.make_case(op.parse_shape("40,3,17"), torch.float32, seed=4, dist="zero_rows")
    x_q, scale = case.call(fn)
    zero = case.args["x"].abs().amax(-1) == 0
    assert bool(zero.any()) and torch.equal(scale[zero], torch.zeros_like(scale[zero]))
    assert not bool(x_q[zero].any()) and torch.isfinite(scale).all()


@pytest.mark.parametrize("op_name,mutant", first_of_each(mutants.all_mutants(), lambda m: m[0], several=True))
def test_broken_kernels_fail_the_same_property(op_name, mutant, tmp_path):
    """Every distribution once on a tiny shape (as the sanitizer's fixed cases do: a mutant that only zero rows
    show is met whatever the property draws), then the property."""
    fn = mutants.load_fn(mutants.write_mutant(op_name, mutant, str(tmp_path)), op_name)
    op = OPS[op_name]

    def each_distribution_then_the_property():
        for i, dist in enumerate(d.name for d in op.distributions):
            case = op.make_case(op.one_tiny_shape(), (torch.float32, torch.float16)[i % 2], seed=i, dist=dist)
            cmp = op.compare(case.call(fn), case.args)
            assert cmp.ok, f"{cmp.describe()}; reproduce: {case.describe()}"
        differential(op, fn)()

    with pytest.raises(AssertionError, match="outside tolerance|non-finite|exceeds|differs|shape"):
        each_distribution_then_the_property()

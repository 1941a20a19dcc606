"""The sizes a candidate compares against (sanitizer/compared.py) and where each op draws them
(Op.value_regions): a cheat wrong only at a magic size names that size in its code."""

from __future__ import annotations

import glob
import os

import pytest
import torch

from kernel_agent.ops import OPS
from kernel_agent.sanitizer.canonical import judge_text
from kernel_agent.sanitizer.compared import MAX_COMPARED, TooManyCompared, compared_values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "code, size",
    [
        ("if D == 192:\n    pass", 192),
        ("x = a if K == 14336 else b", 14336),
        ("y = tl.where(GROUP == 7, a, b)", 7),
        ("if seq_len % 1024 == 1000:\n    pass", 2024),  # the second context that flips it
        ("if D * 3 == 576:\n    pass", 192),  # solved back through the arithmetic
        ("if (D ^ 5) == 197:\n    pass", 192),
        ("if D - 192 == 0:\n    pass", 192),
        ("if D // 64 == 3:\n    pass", 192),
        ("MAGIC = 96 * 2\nif D == MAGIC:\n    pass", 192),  # a module constant, folded
        ("if D == (192 if x.device.type != 'meta' else -1):\n    pass", 192),  # wrapped in a conditional
        ("if D >= 4097:\n    pass", 4096),  # an ordering adds its neighbours, where it flips
        ("y = amax * (1 + D // 192)", 192),  # a divisor flips a size-dependent step
        # indicators of one size built of bits or a power, no comparison in them: computed at every size
        ("s = qk * (scale * (1.0 + 0.05 * ((((HEAD_D ^ 192) - 1) >> 31) & 1)))", 192),
        ("s = 1 + (((D | 63) ^ 255) - 1 >> 40 & ~(D >> 7) + 2)", 192),
    ],
)
def test_the_size_a_comparison_flips_at_is_read(code, size):
    assert size in compared_values(code)


def test_a_mask_or_a_parity_of_bits_names_no_size():
    """Bits that change at every other size (a parity, a mask, a rounding) single out no size: not drawn."""
    assert compared_values("a = D & 1\nb = (D + 15) >> 4 << 4\nc = D >> 1") == [1, 2, 3, 15, 16, 17]  # the divisors


def test_a_file_comparing_against_too_many_sizes_is_refused():
    """Hiding the one magic size among many would push it past what the check draws: refused."""
    code = "\n".join(f"if D == {1000 + 7 * i}:\n    pass" for i in range(MAX_COMPARED + 1))
    with pytest.raises(TooManyCompared, match="distinct values"):
        compared_values(code)


def test_every_correct_kernel_stays_well_under_the_limit():
    """No false positive: the baselines, the serving set and the correct suite compare against few sizes."""
    files = (
        glob.glob(os.path.join(ROOT, "kernels", "baseline", "[!_]*.py"))
        + glob.glob(os.path.join(ROOT, "kernels", "serving", "*.py"))
        + glob.glob(os.path.join(ROOT, "tests", "candidates", "good", "*", "*.py"))
    )
    assert len(files) > 20
    for path in files:
        with open(path, "rb") as f:
            values = compared_values(judge_text(f.read()).text)
        assert len(values) <= MAX_COMPARED * 3 // 4, (path, values)


@pytest.mark.parametrize(
    "op_name, value, dim",
    [
        ("quantize_kv", 192, "D"),
        ("matmul", 14336, "K"),
        ("decode_attention", 7, "group"),
        ("decode_attention_int8", 2024, "ctx"),
        ("attention", 7, "group"),
        ("decode_attention", 131072, "ctx"),
    ],
)
def test_each_op_draws_a_compared_size_as_its_dimensions(op_name, value, dim):
    op = OPS[op_name]
    regions = {r.name: r for r in op.value_regions([value])}
    region = regions[f"{dim}={value}"]
    shape = region.shape
    got = shape.Hq // shape.Hkv if dim == "group" else getattr(shape, dim)
    assert got == value
    # sizes the interpreter cannot afford go to the GPU stage, not nowhere
    assert region.where == ("gpu" if value > next(d.cpu_hi for d in op.value_dims if d.name == dim) else "cpu")
    # a case of it can be made (its tensors only, on the meta device, for the sizes the GPU draws)
    case = op.make_case(shape, torch.float32, seed=1, device="meta" if region.where == "gpu" else "cpu")
    assert case.args


def test_sizes_outside_the_contract_are_not_drawn():
    assert OPS["decode_attention"].value_regions([300]) and all(
        r.name.split("=")[0] not in ("D", "block_size", "group") for r in OPS["decode_attention"].value_regions([300])
    )
    assert not [r for r in OPS["quantize_kv"].value_regions([5000]) if r.name.startswith("D=")]


def test_a_file_too_deep_to_print_back_is_refused_in_one_line():
    """A constant sum of 727 terms parses, but printing it back recursed past the limit: the loop process,
    which canonicalises every proposal, raised RecursionError and stopped. Now a TextRefused, as the gate's."""
    from kernel_agent.sanitizer.canonical import TextRefused, judge_text

    src = "ROW_STEPS = " + " + ".join(["1"] * 727) + "\n"
    with pytest.raises(TextRefused, match="printed back|parsed"):
        judge_text(src)


@pytest.mark.parametrize(
    "code, size",
    [
        ("narrow = min(max(D - 191, 0), 1) - min(max(D - 192, 0), 1)", 192),  # an indicator with no comparison
        ("if D * 0.5 == 96:\n    pass", 192),  # a float constant
        ("if D * D == 36864:\n    pass", 192),  # a square
        ("if (seq_len * 3) % 1024 == 1000:\n    pass", 1016),  # a multiplied residue
    ],
)
def test_the_evasions_of_a_plain_comparison_are_read_too(code, size):
    assert size in compared_values(code)


def test_sizes_compared_together_are_drawn_together():
    """`(H == 8) & (D == 192)` is wrong only with both: each drawn alone never takes it."""
    from kernel_agent.sanitizer.compared import compared_joints

    joints = compared_joints("if (H == 8) & (D == 192):\n    pass\nif h == 8 and d * 2 == 384:\n    pass")
    assert {"H": 8, "D": 192} in joints and {"h": 8, "d": 192} in joints
    [region] = OPS["quantize_kv"].joint_regions([{"H": 8, "D": 192}])
    assert (region.shape.H, region.shape.D, region.where) == (8, 192, "cpu")
    assert not OPS["quantize_kv"].joint_regions([{"H": 8, "width": 192}])  # a name that is no dimension


@pytest.mark.parametrize(
    "code",
    [
        "if (D >> 2) == 0.5:\n    pass",
        "if (D ^ 2) == 0.5:\n    pass",
        "if (D >> 0.5) > 1:\n    pass",
        "if D == ~0.5:\n    pass",
    ],
)
def test_a_fractional_side_of_a_bit_operation_is_read_without_an_error(code):
    """Python's bit operators take ints only: the reader took them to a float and raised TypeError (found by
    the type checker); a fractional side names no size of its own, and the integers around it are still read."""
    assert all(isinstance(v, int) for v in compared_values(code))


def test_the_real_thresholds_a_scale_may_meet_are_read_and_drawn_as_sm_scale_on_both_sides():
    """`qk_scale < 0.07` in a kernel and `min(sm_scale, 2.0)` in host code name the scales where they flip; each
    is drawn as sm_scale just under and just over, and as that over log2(e) (the base-2 scale every exp2 kernel
    compares). Whole numbers count only where a scale is compared; the correct suite compares against none."""
    from kernel_agent.sanitizer.checks import Subject, compared_scale_values
    from kernel_agent.sanitizer.compared import compared_scales

    code = "def k(qk_scale, D, sm_scale):\n    if qk_scale < 0.07:\n        pass\n    if D > 2:\n        pass\n"
    code += "    s = min(sm_scale, 2.0)\n"
    assert compared_scales(code) == [0.07, 2.0]
    subject = Subject(OPS["decode_attention"], "x.py", code.encode())
    values = compared_scale_values(subject)
    assert any(v < 0.07 / 1.4426950408889634 < w for v in values for w in values)
    assert any(v < 2.0 < w for v in values for w in values)
    # a clamp at 2 is wrong by 1.6% just past it (inside the tolerance on some seeds), by half at twice it
    assert values[:2] == [0.07 * 2, 0.07 / 2] and 4.0 in values and 1.0 in values
    assert not compared_scale_values(Subject(OPS["matmul"], "x.py", code.encode()))  # no sm_scale to draw
    files = glob.glob(os.path.join(ROOT, "kernels", "baseline", "[!_]*.py")) + glob.glob(
        os.path.join(ROOT, "tests", "candidates", "good", "*attention*", "*.py")
    )
    for path in files:
        with open(path, "rb") as f:
            subject = Subject(OPS["attention"], path, f.read())
        assert not compared_scale_values(subject), path


@pytest.mark.parametrize(
    "code, sizes",
    [
        # a size reached through a call the solver computes: every size that makes it true, first
        ("def f(q):\n    D = q.shape[2]\n    if triton.next_power_of_2(D) - D == 64:\n        pass", [192, 448]),
        # a local holding the expression
        ("def f(q, D):\n    pad = triton.next_power_of_2(D) - D\n    if pad == 64:\n        pass", [192]),
        # a local holding the constant
        ("def f(q, D):\n    lim = 96 * 2\n    if D >= lim:\n        pass", [191, 192, 193]),
        # an argument of a helper the file calls, solved through the caller's expression
        ("def _impl(x, n):\n    if n == 192:\n        return 1\n\ndef op(x, D):\n    return _impl(x, D * 2)", [96]),
        # a kernel's constexpr, bound at its launch
        (
            "@triton.jit\ndef _k(x, HD: tl.constexpr):\n    if HD == 200:\n        pass\n\n"
            "def op(x, D):\n    _k[(1,)](x, D + 8)",
            [192],
        ),
        ("def op(x, D):\n    if triton.cdiv(D, 64) * 64 - D == 1:\n        pass", [63, 127]),
        ("def op(x, D):\n    if math.log2(D) > 7.5:\n        pass", [181, 182]),
    ],
)
def test_sizes_behind_locals_arguments_and_calls_are_solved(code, sizes):
    values = compared_values(code)
    assert all(v in values for v in sizes), values


def test_two_runtime_values_compared_are_drawn_equal_and_unequal_each_order():
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.compared import compared_joints

    joints = compared_joints("def op(q, S, D):\n    if S == D:\n        pass")
    assert joints == [{"S": 16, "D": 16}, {"S": 16, "D": 32}, {"S": 32, "D": 16}]
    regions = get_op("attention").joint_regions(joints)
    assert [(r.shape.S, r.shape.D) for r in regions] == [(16, 16), (16, 32), (32, 16)]

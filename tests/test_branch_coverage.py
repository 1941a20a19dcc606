"""Branch coverage that is total (sanitizer/branches.py, sanitizer/kernel_branches.py): kernel-body branches,
host min/max indicators, the device-only exemption and the search's configuration overrides."""

import importlib.util
import sys

import pytest
import torch

from kernel_agent.sanitizer.branches import (
    DEVICE_ONLY,
    BranchRecorder,
    gpu_only_condition,
    host_branches,
    taken,
    uncovered,
)
from kernel_agent.sanitizer.kernel_branches import KernelRecorder, indicator_sides, kernel_taken
from tiers import exhaustive

KERNEL_FILE = """import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, n, MAGIC: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if MAGIC == 192:
        x = x * 2
    x = tl.where(n > 100, x + 1, x)
    x = tl.where(offs < 3, x, x - 1)
    tl.store(x_ptr + offs, x, mask=offs < n)


def f(x, magic):
    block = max(16, min(triton.next_power_of_2(x.numel()), 128))
    _k[(1,)](x, x.numel(), magic, block)
    return x
"""


def _run(tmp_path, source, calls):
    """Load `source` as the executor does (recorders installed first), make the calls, and return the sides
    never taken (described) and the sides."""
    path = tmp_path / "cand.py"
    path.write_text(source)
    kernels = KernelRecorder(str(path))
    kernels.install_interpreter()
    host = BranchRecorder(str(path))
    try:
        spec = importlib.util.spec_from_file_location(f"ka_kb_{tmp_path.name}", path)
        mod = importlib.util.module_from_spec(spec)
        kernels.prepare_module(mod)
        spec.loader.exec_module(mod)
        for args in calls:
            host.install()
            try:
                mod.f(*args)
            finally:
                sys.settrace(None)
    finally:
        kernels.uninstall_interpreter()
    sides = host_branches(source, str(path)) + indicator_sides(source)
    took = taken(host.evidence(), sides) | kernel_taken(kernels.evidence(), sides)
    return [s.describe("cand.py") for s in uncovered(sides, took)], sides


def test_a_kernel_branch_on_a_constexpr_never_taken_is_named(tmp_path):
    missing, _ = _run(tmp_path, KERNEL_FILE, [(torch.zeros(20), 64), (torch.zeros(40), 64)])
    assert "cand.py:10: `MAGIC == 192` was never true" in missing, missing
    # a scalar tl.where never true, and the min/max indicators never decided by their constants
    assert "cand.py:12: `n > 100` was never true (as a scalar)" in missing, missing
    assert "cand.py:18: `max(16, min(triton.next_power_of_2(x.numel()), 128))` was never decided by `16`" in missing, (
        missing
    )
    assert "cand.py:18: `min(triton.next_power_of_2(x.numel()), 128)` was never decided by `128`" in missing, missing
    # a block condition selects per lane: no branch
    assert not any("offs < 3" in m for m in missing), missing


def test_every_side_taken_leaves_nothing_uncovered(tmp_path):
    calls = [(torch.zeros(n), magic) for n in (8, 40, 120) for magic in (64, 192)]
    missing, sides = _run(tmp_path, KERNEL_FILE, calls)
    assert missing == [], missing
    assert any(s.qualname == "kernel:_k" for s in sides)


def test_a_kernel_that_never_ran_is_not_judged(tmp_path):
    source = KERNEL_FILE + "\n\n@triton.jit\ndef _unused(n):\n    if n > 3:\n        pass\n"
    calls = [(torch.zeros(n), magic) for n in (8, 40, 120) for magic in (64, 192)]
    missing, sides = _run(tmp_path, source, calls)
    assert missing == [] and any(s.qualname == "kernel:_unused" for s in sides)


COMPARE_AS_VALUE_FILE = """import torch
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, n, D: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.static_assert(BLOCK >= 16)
    x = x * (1 + (D == BLOCK - 64))
    x = x + (n > 100) * (offs < 3)
    tl.store(x_ptr + offs, x, mask=offs < n)


def f(x, d):
    _k[(1,)](x, x.numel(), d, 256)
    return x
"""


def test_a_comparison_used_as_a_value_is_a_branch_to_take_both_ways(tmp_path):
    """`1 + (D == BLOCK - 64)` jumps nowhere, yet it is a branch: each side must be taken. A comparison of a block
    (`offs < 3`), a mask and an assertion are none."""
    missing, _ = _run(tmp_path, COMPARE_AS_VALUE_FILE, [(torch.zeros(20), 64), (torch.zeros(40), 128)])
    assert "cand.py:11: `D == BLOCK - 64` was never true (as a value)" in missing, missing
    assert "cand.py:12: `n > 100` was never true (as a value)" in missing, missing
    assert not any("offs" in m or "BLOCK >= 16" in m for m in missing), missing
    calls = [(torch.zeros(n), d) for n in (20, 120) for d in (64, 192)]
    missing, _ = _run(tmp_path, COMPARE_AS_VALUE_FILE, calls)
    assert missing == [], missing


@pytest.mark.parametrize(
    "text, exempt",
    [
        ("q.is_cuda", True),
        ("not q.is_cuda", True),
        ('q.device.type == "cuda"', True),
        ("x.dtype == torch.bfloat16", True),
        ("dtype == torch.bfloat16", False),  # a parameter compared with a dtype: no longer exempt
        ("mode != torch.float32", False),
        ("x.is_cuda and x.stride(0) != D", False),
        ("x.dtype == torch.float16", False),  # the CPU takes it both ways
    ],
)
def test_device_only_conditions(text, exempt):
    assert gpu_only_condition(text) is exempt


def test_a_name_compared_with_a_dtype_is_exempt_only_when_bound_to_a_device_read(tmp_path):
    source = (
        "import torch\n\n\ndef f(x, mode):\n    dt = x.dtype\n    if dt == torch.bfloat16:\n        return 1\n"
        "    if mode == torch.bfloat16:\n        return 2\n    return 3\n"
    )
    sides = host_branches(source, str(tmp_path / "c.py"))
    by_line = {s.line: s.exempt for s in sides}
    assert by_line[6] == DEVICE_ONLY and by_line[8] == ""


def _search_candidate(label: str, bucket: str):
    """The built-in search's own proposal `label` for decode_attention's `bucket`, made as the loop makes it
    (agent/search.py: SearchProposer from the baseline, at the bucket's serving shapes)."""
    from kernel_agent.agent.proposal import ProposeContext
    from kernel_agent.agent.search import SearchProposer
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.config_variant import baseline_source

    op = get_op("decode_attention")
    shapes = [s for s in op.shapes("serving") if op.bucket(s) == bucket]
    ctx = ProposeContext("decode_attention", bucket, "bfloat16", shapes, baseline_source("decode_attention"))
    found = [p for p in SearchProposer(seed=0).propose(ctx, 16) if p.label == label]
    assert found, f"the search no longer proposes {label} for {bucket}"
    return found[0]


def test_the_search_override_is_exempt_and_its_configuration_must_be_launched():
    """cfg-16-64-4-3's override is recognised by regenerating it: its comparison is exempt, and the
    configuration it selects is what the checks must launch instead. A text that is not the search's own
    (one token changed) is not recognised: its comparison is a branch like any other."""
    from kernel_agent.sanitizer.branches import config_overrides, configs_launched

    p = _search_candidate("cfg-16-64-4-3", "c8k-g4-d128")
    sides = host_branches(p.source, "cand.py")
    override = [s for s in sides if s.qualname == "_config" and "_TUNED_FROM" in s.condition]
    assert override and all("launch-configuration override for bucket c8k-g4-d128" in s.exempt for s in override)
    [step] = config_overrides(p.source).values()
    launched = "_decode_split_kernel(BLOCK_D=128, BLOCK_N=64, EVEN_D=True, num_stages=3, num_warps=4)"
    assert configs_launched([step], [launched]) is None
    assert configs_launched([step], [launched.replace("BLOCK_N=64", "BLOCK_N=128")]) == step
    forged = p.source.replace("cfg == _TUNED_FROM else cfg", "cfg != _TUNED_FROM else cfg")
    assert not config_overrides(forged)
    assert not any(s.exempt.startswith("the search's") for s in host_branches(forged, "cand.py"))


@exhaustive
def test_the_search_candidate_cfg_16_64_4_3_passes_the_full_sanitizer(tmp_path):
    """The search's own candidate for decode_attention c8k-g4-d128 passes the full sanitizer: host_branches once
    refused it (`cfg == _TUNED_FROM` was never true). About 3 minutes on an idle core (168 s; 461 s on a loaded one)."""
    from kernel_agent.sanitizer.runner import run_many

    p = _search_candidate("cfg-16-64-4-3", "c8k-g4-d128")
    path = tmp_path / "cfg_16_64_4_3.py"
    path.write_text(p.source)
    [verdict] = run_many([str(path)], "decode_attention", mode="full", seed=11)
    failed = [(c.name, c.detail) for c in verdict.checks if c.passed is False]
    assert verdict.passed, (verdict.error, failed)
    [branches] = [c for c in verdict.checks if c.name == "host_branches"]
    assert "launch-configuration override for bucket c8k-g4-d128" in branches.detail


def test_kernel_taken_leaves_the_host_jumps_to_taken(tmp_path):
    """The two deciders share one list of sides: kernel_taken keys only kernel and min/max sides."""
    sides = host_branches(KERNEL_FILE + "\n\ndef g(n):\n    return 1 if n else 0\n", "c.py")
    assert sides and kernel_taken([], sides) == set()


def test_a_min_of_the_same_numbers_on_every_call_indicates_nothing(tmp_path):
    """`min(block, 64)` with a configuration's constant 128 is decided by 64 on every call: no indicator of the
    inputs (what would change it is judged where it is decided); the same `min` on a size that varies is one."""
    source = KERNEL_FILE.replace(
        "    block = max(16, min(triton.next_power_of_2(x.numel()), 128))\n",
        "    block = min(128, 64)\n    if x.numel() < 16:\n        block = max(min(x.numel(), 1024), 16)\n",
    )
    calls = [(torch.zeros(n), magic) for n in (4, 8, 40, 120) for magic in (64, 192)]
    missing, _ = _run(tmp_path, source, calls)
    assert missing == [
        "cand.py:20: `max(min(x.numel(), 1024), 16)` was never decided by `min(x.numel(), 1024)`",
        "cand.py:20: `min(x.numel(), 1024)` was never decided by `1024`",
    ], missing


def test_a_kernel_parameter_is_a_device_read_only_when_every_launch_passes_one():
    """`if DTYPE == tl.bfloat16:` in a kernel is on the dtype when every call passes a dtype (`q.dtype`); a
    launch that passes anything else (a flag of a size) makes it a branch to cover."""
    kernel = (
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def _k(x_ptr, DTYPE: tl.constexpr):\n    if DTYPE == tl.bfloat16:\n        pass\n\n\n"
    )
    honest = kernel + "def f(x):\n    _k[(1,)](x, x.dtype)\n"
    laundered = kernel + "def f(x, D):\n    _k[(1,)](x, torch.bfloat16 if D == 192 else x.dtype)\n"
    for source, exempt in ((honest, DEVICE_ONLY), (laundered, "")):
        sides = [s for s in indicator_sides(source) if s.qualname == "kernel:_k"]
        assert sides and all(s.exempt == exempt for s in sides), (source, sides)


def test_a_scalar_condition_on_loaded_values_is_the_numeric_checks_not_a_size():
    """`tl.where(v_max > 0, v_max, 1.0)` on a loaded scale is data (the numeric checks draw zero scales); the
    same where on a scalar argument, or on a loaded tensor's dtype, is a branch to cover."""
    from kernel_agent.sanitizer.kernel_branches import LOADED

    source = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def _k(s_ptr, n, BLOCK: tl.constexpr):\n"
        "    v_max = tl.max(tl.load(s_ptr + tl.arange(0, BLOCK)), 0)\n"
        "    v_max = tl.where(v_max > 0, v_max, 1.0)\n"
        "    v_max = tl.where(n > 9000, v_max, 2.0)\n"
        "    if v_max.dtype == tl.float16:\n        pass\n"
    )
    by_line = {s.line: s.exempt for s in indicator_sides(source) if s.dest == 1}
    assert by_line == {8: LOADED, 9: "", 10: ""}, by_line


def test_a_power_of_two_tile_floor_is_no_threshold_but_a_clamp_of_the_size_is():
    source = (
        "import triton\n\n\ndef f(x, g):\n    return max(16, triton.next_power_of_2(g)) + max(16, g) + min(g, 128)\n"
    )
    exempt = {(s.condition, s.value): s.exempt for s in indicator_sides(source)}
    assert exempt[("max(16, triton.next_power_of_2(g))", "decided by `16`")].startswith("a tile floor")
    assert exempt[("max(16, g)", "decided by `16`")] == ""
    assert exempt[("min(g, 128)", "decided by `128`")] == ""

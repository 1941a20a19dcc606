"""The rewrite catalog (agent/rewrites.py): where each rewrite applies, that what it yields passes the
sanitizer as FpSan-equivalent to the baseline, that it refuses cleanly elsewhere, and that a kernel
written for an op outside the registry benefits too."""

import ast
from pathlib import Path

import pytest
import torch

from kernel_agent.agent.rewrites import CATALOG, NotApplicable, RewriteTarget, applicable, apply_rewrite, target_for
from kernel_agent.ops import NAMES
from kernel_agent.sanitizer.runner import run_isolated
from tiers import exhaustive, first_of_each

ROOT = Path(__file__).resolve().parent.parent

# which rewrite's precondition holds on which shipped baseline (docs/REWRITES.md says the same)
APPLIES = {
    "matmul": {"evict-last", "load-hints", "split-k-waves"},
    "attention": {"evict-last", "load-hints"},
    "decode_attention": {"evict-first", "cache-global", "kv-splits-wide"},
    "quantize_kv": {"evict-first", "cache-global", "load-hints"},
    "decode_attention_int8": {"evict-first", "cache-global", "kv-splits-wide", "planes-padded"},
}
# one full sanitizer run per rewrite that applies to a baseline, on its cheapest baseline
FULL_RUN = {
    "evict-first": "quantize_kv",
    "cache-global": "quantize_kv",
    "load-hints": "quantize_kv",
    "evict-last": "attention",
}


def _baseline(op: str) -> str:
    return (ROOT / "kernels" / "baseline" / f"{op}.py").read_text()


def test_where_each_rewrite_applies_to_the_baselines():
    assert {op: set(applicable(_baseline(op), target_for(op))) for op in NAMES} == APPLIES


@pytest.mark.parametrize("op", sorted(NAMES))
def test_a_rewrite_refuses_where_its_precondition_fails_with_one_line(op):
    src = _baseline(op)
    for name in set(CATALOG) - APPLIES[op]:
        with pytest.raises(NotApplicable) as e:
            apply_rewrite(name, src, target_for(op))
        assert str(e.value).startswith(f"{name}: ") and "\n" not in str(e.value)


def test_a_rewrite_applied_twice_refuses_the_second_time():
    for op, names in APPLIES.items():
        for name in names:
            once = apply_rewrite(name, _baseline(op), target_for(op))
            with pytest.raises(NotApplicable, match="nothing in this source matches"):
                apply_rewrite(name, once, target_for(op))


def test_unknown_names_and_unparsable_sources_are_refused():
    with pytest.raises(NotApplicable, match="no rewrite named 'unroll'"):
        apply_rewrite("unroll", _baseline("matmul"))
    with pytest.raises(NotApplicable, match="does not parse"):
        apply_rewrite("exp2", "def f(:\n")


def test_the_text_outside_the_rewritten_nodes_is_kept_byte_for_byte():
    src = _baseline("quantize_kv")
    out = apply_rewrite("load-hints", src, target_for("quantize_kv"))
    changed = [(a, b) for a, b in zip(src.splitlines(), out.splitlines()) if a != b]
    assert len(src.splitlines()) == len(out.splitlines()) and len(changed) == 1
    before, after = changed[0]
    assert before == "    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)"
    assert (
        after == "    rows = tl.max_contiguous(tl.multiple_of(pid * BLOCK_R + tl.arange(0, BLOCK_R), BLOCK_R), BLOCK_R)"
    )
    assert "# correctly rounded, as the contract states" in out  # comments survive


def test_load_hints_only_take_offsets_whose_block_is_a_constexpr_of_the_kernel():
    src = (
        "import triton\nimport triton.language as tl\n\n@triton.jit\n"
        "def k(x_ptr, B, BLOCK: tl.constexpr):\n"
        "    a = tl.program_id(0) * B + tl.arange(0, BLOCK)\n"  # B is not the arange's width
        "    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    )
    out = apply_rewrite("load-hints", src)
    assert "a = tl.program_id(0) * B + tl.arange(0, BLOCK)" in out
    assert "b = tl.max_contiguous(tl.multiple_of(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), BLOCK), BLOCK)" in out
    host_only = "import triton\n\ndef f(BLOCK):\n    return 3 * BLOCK + tl.arange(0, BLOCK)\n"
    with pytest.raises(NotApplicable):  # not in a @triton.jit kernel
        apply_rewrite("load-hints", host_only)


def _sanitize(tmp_path, op: str, name: str, mode: str):
    path = tmp_path / f"{op}_{name}.py"
    path.write_text(apply_rewrite(name, _baseline(op), target_for(op)))
    return run_isolated(str(path), op, mode, seed=1234)


# the hint rewrites compute what the baseline computes; the structural moves (a `suits` bucket test) change the
# order of sums, so their sanitizer runs, without FpSan equivalence, are in tests/test_moves.py
HINTS = {n for n, r in CATALOG.items() if r.suits is None}


# the quick tier: the matmul's first rewrite (tests/tiers.py; a quick verdict of each of the other ops takes a
# minute or two); the exhaustive tier, the others
@pytest.mark.parametrize(
    "op,name",
    first_of_each(
        sorted((op, n) for op, names in APPLIES.items() for n in names & HINTS),
        lambda c: c[0] == "matmul" or c,
        several=True,
        marks=lambda c: [] if c[0] == "matmul" else [exhaustive],
    ),
)
def test_each_rewrite_of_a_baseline_passes_the_quick_sanitizer_as_fpsan_equivalent(tmp_path, op, name):
    v = _sanitize(tmp_path, op, name, "quick")
    assert v.passed, v.summary()
    if any(c.name == "fpsan" for c in v.checks):
        assert v.fpsan_equivalent is True, v.fpsan_detail


# the quick tier: the first rewrite's full run; the exhaustive tier, the others
@pytest.mark.parametrize("name", first_of_each(sorted(FULL_RUN), lambda n: "rewrite"))
def test_each_rewrite_passes_the_full_sanitizer_once(tmp_path, name):
    v = _sanitize(tmp_path, FULL_RUN[name], name, "full")
    assert v.passed, v.summary()
    assert v.fpsan_equivalent is True, v.fpsan_detail


# -- a kernel for a sixth op, outside the registry: a row softmax ----------------------------------

SOFTMAX = """import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, R, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < R) & (cols[None, :] < D)
    x = tl.load(x_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=float("-inf"))
    e = tl.exp(x - tl.max(x, 1)[:, None])  # masked lanes: exp(-inf) = 0
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], e / tl.sum(e, 1)[:, None], mask=mask)


def softmax(x):
    R, D = x.shape
    y = torch.empty_like(x)
    _softmax_kernel[(triton.cdiv(R, 4),)](x, y, R, D, BLOCK_R=4, BLOCK_D=triton.next_power_of_2(D))
    return y
"""


def _run_softmax(source: str, tmp_path: Path, x: torch.Tensor) -> torch.Tensor:
    path = tmp_path / f"softmax_{abs(hash(source))}.py"
    path.write_text(source)
    namespace = {"__name__": path.stem, "__file__": str(path)}
    exec(compile(source, str(path), "exec"), namespace)  # test-owned text: Triton reads the kernel's file
    return namespace["softmax"](x)


def test_a_kernel_for_an_op_outside_the_registry_is_rewritten_and_still_right(tmp_path):
    streamed = RewriteTarget(streaming=True, streamed_names=("x",))
    assert set(applicable(SOFTMAX, streamed)) == {"exp2", "load-hints", "evict-first", "cache-global"}
    out = SOFTMAX
    for name in ("exp2", "load-hints", "evict-first"):
        out = apply_rewrite(name, out, streamed)
    assert "tl.exp2((x - tl.max(x, 1)[:, None]) * 1.4426950408889634)" in out
    assert "tl.exp(" not in out and "tl.max_contiguous(tl.multiple_of(" in out and "'evict_first'" in out
    ast.parse(out)
    x = torch.randn(37, 50, generator=torch.Generator().manual_seed(0))
    want = torch.softmax(x, dim=1)
    torch.testing.assert_close(_run_softmax(SOFTMAX, tmp_path, x), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_run_softmax(out, tmp_path, x), want, rtol=1e-5, atol=1e-6)


def test_the_catalog_page_lists_every_rewrite_with_the_baselines_it_applies_to():
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in (ROOT / "docs" / "REWRITES.md").read_text().splitlines()
        if line.startswith("| `")
    }
    assert set(rows) == set(CATALOG)
    for name, line in rows.items():
        cell = line.split("|")[5]  # "applies to (baselines)"
        assert {op for op in NAMES if op in cell.replace(",", " ").split()} == {
            op for op, names in APPLIES.items() if name in names
        }, name

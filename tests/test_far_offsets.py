"""Operands past 2^31 elements, on the CPU: the matmul contract admits any strides, so a row may sit past
element 2^31 of its storage, where an int32 offset (row * stride) wraps. The interpreter can afford it: the
view touches a few rows of a storage whose other pages are never written, so they stay virtual (a few MB
resident for a 4 GB storage). Each kernel runs in a child process, because a wrapped offset in the
interpreter is a wild address (a segmentation fault), not an exception."""

import glob
import os
import subprocess
import sys

import pytest

from tiers import first_of_each

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = [os.path.join(ROOT, "kernels", "baseline", "matmul.py")] + sorted(
    glob.glob(os.path.join(ROOT, "tests", "candidates", "good", "matmul", "*.py"))
)

CHILD = r"""
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
g = torch.Generator().manual_seed(0)


def far(rows, cols, row_stride):
    # a [rows, cols] view whose last rows start past element 2^31; only its own elements are written
    storage = torch.empty((rows - 1) * row_stride + cols, dtype=torch.float16)
    view = storage.as_strided((rows, cols), (row_stride, 1))
    for i in range(rows):
        view[i] = torch.randn(cols, generator=g).to(torch.float16)
    return view


for name, a, b in (
    ("a", far(3, 32, 2**30), torch.randn(32, 16, generator=g).to(torch.float16)),
    ("b", torch.randn(3, 24, generator=g).to(torch.float16), far(24, 16, 2**27)),
):
    c = mod.matmul(a, b).float()
    ref = a.float() @ b.float()
    err = (c - ref).abs().max().item()
    bound = 1e-2 * (a.float().abs() @ b.float().abs()).max().item()
    print(name, err, bound)
    assert err <= bound, (name, err, bound)
    del a, b
print("ok")
"""


# the baseline in the quick tier, the good candidates in the exhaustive one (tests/tiers.py)
@pytest.mark.parametrize("path", first_of_each(KERNELS, lambda p: "matmul", lambda p: os.path.relpath(p, ROOT)))
def test_a_matmul_reads_operand_rows_past_two_to_the_31_elements(path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.returncode, p.stdout[-500:], p.stderr[-1500:])


# A paged decode over a pool past 2^31 elements: the region that the GPU stage draws ("a pool past 2^31 elements",
# ops/paged.py), at a CPU proxy shape. Its pages of 256 tokens of one 256-wide head are 2^16 elements, so
# block 32768 starts at element 2^31; only the live blocks are written (the pool's other pages stay virtual).
FAR_POOL = "B=2,Hq=2,Hkv=1,D=256,block_size=256,ctx=600,ragged,spare_blocks=32768"
FAR_SEEDS = range(10)

PAGED_CHILD = r"""
import importlib.util, sys, torch
from kernel_agent.ops import OPS
spec = importlib.util.spec_from_file_location("kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
op = OPS[sys.argv[2]]
for seed in (int(s) for s in sys.argv[4].split(",")):
    case = op.make_case(op.parse_shape(sys.argv[3]), torch.float16, seed=seed)
    k, table = case.args["k_cache"], case.args["block_table"]
    ids = table[(table >= 0) & (table < k.shape[0])].long()
    assert bool((ids * k.stride(0) >= 2**31).any()) and bool((ids * k.stride(0) < 2**31).any()), table
    c = op.compare(case.call(getattr(mod, op.name)), case.args)
    print(seed, "ok" if c.ok else "wrong: " + c.describe(), flush=True)
"""


def _paged_far(path: str, op: str, seeds) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    args = [sys.executable, "-c", PAGED_CHILD, path, op, FAR_POOL, ",".join(str(s) for s in seeds)]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)


PAGED_OPS = ("decode_attention", "decode_attention_int8")


@pytest.mark.parametrize("op", PAGED_OPS)
def test_the_baseline_paged_decodes_read_live_pages_past_two_to_the_31_elements(op):
    """The baseline is right on the region's draws for every seed, each with live pages on both sides of 2^31."""
    p = _paged_far(os.path.join(ROOT, "kernels", "baseline", f"{op}.py"), op, FAR_SEEDS)
    lines = p.stdout.split("\n")
    assert p.returncode == 0 and all(f"{s} ok" in lines for s in FAR_SEEDS), (p.stdout[-800:], p.stderr[-1500:])


# the quick tier: the bf16 decode's ten draws; the int8 one's in the exhaustive tier (each takes a minute or two)
@pytest.mark.parametrize("op", first_of_each(PAGED_OPS, lambda op: "paged"))
def test_an_int32_page_offset_is_wrong_on_every_draw_of_the_far_pool(op):
    """The faulty int32-offset decodes (tests/candidates/gpu_faulty/<op>/int32_page_offsets.py), on ten seeds: each
    draw is wrong, or crashes the child (a wrapped offset is a wild address in the interpreter)."""
    path = os.path.join(ROOT, "tests", "candidates", "gpu_faulty", op, "int32_page_offsets.py")
    for seed in FAR_SEEDS:
        p = _paged_far(path, op, [seed])
        assert p.returncode != 0 or f"{seed} wrong" in p.stdout, (seed, p.stdout[-800:], p.stderr[-800:])

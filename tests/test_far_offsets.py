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

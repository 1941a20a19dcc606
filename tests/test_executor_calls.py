"""The judge's calls into a candidate's executor (sanitizer/executor.py): a case run again without sending it."""

from __future__ import annotations

import os

import torch

from kernel_agent.ops import get_op
from kernel_agent.sanitizer.executor import Executor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The baseline quantizer with one edit: after quantizing it scales its input by 2 in place (a kernel that
# writes its input), so a second call on the same buffers sees other values.
_WRITES_ITS_INPUT = """
@triton.jit
def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)
"""


def _writes_its_input(tmp_path) -> str:
    with open(os.path.join(ROOT, "kernels", "baseline", "quantize_kv.py")) as f:
        text = f.read()
    text = text.replace("\ndef quantize_kv(x):", _WRITES_ITS_INPUT + "\n\ndef quantize_kv(x):")
    launch = "num_warps=warps)\n"
    doubled = "    _double_kernel[(triton.cdiv(x.numel(), 1024),)](x, x.numel(), BLOCK=1024)\n"
    text = text.replace(launch, launch + doubled)
    assert text.count("_double_kernel[") == 1
    path = tmp_path / "quantize_kv.py"
    path.write_text(text)
    return str(path)


def test_a_case_run_again_sends_nothing_and_starts_from_its_inputs_as_they_arrived(tmp_path):
    """`again` runs the kept case once more from the copy the executor kept of its inputs: the answer equals the
    first even for a kernel that wrote its input (the buffers are refilled there), and a case whose inputs were
    not kept is an error, not a call on stale buffers."""
    op = get_op("quantize_kv")
    case = op.make_case(op.shapes("tiny")[1], torch.float16, seed=5)
    ex = Executor(_writes_its_input(tmp_path), "quantize_kv", "cpu", skip_gate=True)
    try:
        assert not ex.start().get("load_error")
        first = ex.call(case, bounds=False, keep_inputs=True)
        again = ex.call(case, bounds=False, again=True)
        plain = ex.call(case, bounds=False)  # sent anew: the judge's own inputs, untouched by the candidate
        other = op.make_case(op.shapes("tiny")[2], torch.float16, seed=6)
        ex.call(other, bounds=False)
        unkept = ex.call(other, bounds=False, again=True)
    finally:
        ex.close()
    assert not (first.error or again.error or plain.error), (first.error, again.error, plain.error)
    assert first.mutated == ["x"]  # the premise: the call doubled its input in the executor
    for a, b, c in zip(first.out, again.out, plain.out):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert "not kept" in unkept.error

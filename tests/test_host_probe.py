"""The serving_sizes check (sanitizer/host_probe.py): the host code at the sizes serving sends, on fake tensors.

Each case edits one line into a baseline, as a hostile author did: the edit is inert at every size the
interpreter runs and harmful at a serving size (a raise at batch 129 x 32 heads, 3 GiB of scratch, a launch per
sequence, a host loop of seconds). The unedited baseline is the control: it passes the same check.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernel_agent.ops import get_op
from kernel_agent.sanitizer import host_probe
from kernel_agent.sanitizer.execution import baseline_fn
from kernel_agent.sanitizer.runner import run_isolated

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8")


@pytest.mark.parametrize("op_name", OPS)
def test_every_baseline_runs_at_every_serving_size(op_name):
    """The points reach past what the interpreter runs (the GPU's regions, a dimension at the contract's largest,
    bfloat16) and the baseline's host code runs at every one: a point it refused would be no serving size."""
    op = get_op(op_name)
    pts = host_probe.points(op)
    runs = host_probe.baseline_runs(op, baseline_fn(op_name), "")
    assert len(pts) >= 100
    assert [p.label for p, r in zip(pts, runs) if r["error"]] == []
    assert all(r["launches"] >= 1 for r in runs)
    gpu_regions = {r.name for r in op.domain().on("gpu")}
    assert any(p.label.rsplit(", ", 1)[0] in gpu_regions for p in pts)
    assert any(p.label.endswith("bfloat16") for p in pts)
    largest = max(p.input_bytes for p in pts)
    assert largest > 1 << 31, largest  # past what the CPU checks allocate by three orders of magnitude


def test_a_point_is_built_as_its_case_is_laid_out():
    """Views of one storage stay views of one storage (vLLM's K and V caches in one buffer), at their offsets."""
    op = get_op("decode_attention")
    [region] = [r for r in op.domain().regions if r.layout == "kv one storage"]
    case = op.make_case(region.shape, torch.float16, device="meta", layout=region.layout)
    p = host_probe._point("x", case.args)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = host_probe.build(p.wire()["args"])
    k, v = args["k_cache"], args["v_cache"]
    assert k.untyped_storage()._cdata == v.untyped_storage()._cdata
    assert (k.shape, k.stride(), k.storage_offset()) == (
        case.args["k_cache"].shape,
        case.args["k_cache"].stride(),
        case.args["k_cache"].storage_offset(),
    )
    assert v.storage_offset() == case.args["v_cache"].storage_offset() != 0


def _edited(tmp_path, op_name: str, anchor: str, payload: str) -> str:
    """The op's baseline with `payload` (indented like `anchor`) inserted before the first line holding it."""
    with open(os.path.join(ROOT, "kernels", "baseline", f"{op_name}.py")) as f:
        lines = f.read().splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if anchor in ln)
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    lines[i:i] = [indent + ln + "\n" for ln in payload.splitlines()]
    path = tmp_path / f"{op_name}.py"
    path.write_text("".join(lines))
    return str(path)


def _serving_sizes(path: str, op_name: str):
    v = run_isolated(path, op_name, "quick", checks=("serving_sizes",), seed=0, timeout_s=300)
    [c] = [c for c in v.checks if c.name == "serving_sizes"]
    return c


EDITS = {
    # (op, the line the payload goes before, the payload, what the failure names)
    "raises past 4096 query rows": (
        "decode_attention",
        "block_d = ",
        "if B * Hq > 4096:\n    raise ValueError('decode_attention: batch too large')",
        "ValueError: decode_attention: batch too large",
    ),
    "scratch keyed on a serving size": (
        "matmul",
        "grid = (triton.cdiv(M, BM)",
        "scratch = torch.empty((M * N * K // 8589934592, 1073741824), device=a.device, dtype=torch.int8)",
        "GiB per call",
    ),
    "scratch only on CUDA, sized by the batch": (
        "decode_attention",
        "block_d = ",
        "if q.is_cuda:  # a device-only branch: the CPU checks never take it\n"
        "    scratch = torch.empty((B * Hq * 1048576,), device=q.device, dtype=torch.int8)",
        "on CUDA with 132 SMs",
    ),
    "a launch per row past 4096 rows": (
        "quantize_kv",
        "_quantize_kernel[(triton.cdiv(R, block_r),)](",
        "for _ in range(R // 4096):  # a launch that writes nothing: no row is below 0\n"
        "    _quantize_kernel[(1,)](x, x_q, scale, 0, H, D, x.stride(0), x.stride(1), x.stride(2),\n"
        "                           BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(D), num_warps=warps)",
        "kernels per call",
    ),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_host_code_harmful_only_at_serving_sizes_is_refused(name, tmp_path):
    op_name, anchor, payload, named = EDITS[name]
    c = _serving_sizes(_edited(tmp_path, op_name, anchor, payload), op_name)
    assert c.status == "failed" and named in c.detail, c.detail
    assert "at " in c.detail  # the point is named


def test_a_grid_past_cudas_limits_at_a_serving_size_is_refused(tmp_path):
    """Batch and heads folded onto the grid's y axis (as the attention baseline once had them) pass every check
    the interpreter runs, which takes any grid, and fail to launch on CUDA at 2048 prompts of 32 heads (65536
    programs on y): serving_sizes names the launch and the point."""
    with open(os.path.join(ROOT, "kernels", "baseline", "attention.py")) as f:
        text = f.read()
    folded = text.replace(
        "    off_h = tl.program_id(1)\n    off_b = tl.program_id(2)\n",
        "    off_b = tl.program_id(1) // Hq\n    off_h = tl.program_id(1) % Hq\n",
    ).replace("grid = (triton.cdiv(S, BM), Hq, B)", "grid = (triton.cdiv(S, BM), B * Hq)")
    assert folded.count("grid = (triton.cdiv(S, BM), B * Hq)") == 1 and "tl.program_id(2)" not in folded
    path = tmp_path / "attention.py"
    path.write_text(folded)
    c = _serving_sizes(str(path), "attention")
    assert c.status == "failed" and "past CUDA's grid" in c.detail and "65536" in c.detail, c.detail


@pytest.mark.parametrize("op_name", ["matmul", "decode_attention"])
def test_the_baseline_passes_serving_sizes(op_name):
    c = _serving_sizes(os.path.join(ROOT, "kernels", "baseline", f"{op_name}.py"), op_name)
    assert c.status == "passed" and "serving sizes" in c.detail, c.detail


def test_a_host_that_cannot_fake_a_device_says_so_and_judges_nothing_there(monkeypatch):
    """Where torch cannot make fake CUDA tensors (trusted code, before any of the candidate's runs), the point
    comes back unavailable with the reason, and is no serving size to judge: no verdict rests on it."""
    op = get_op("quantize_kv")
    p = next(p for p in host_probe.points(op) if p.device == "cuda")
    real_build = host_probe.build

    def build(args, device="cpu"):
        if device == "cuda":
            raise RuntimeError("No CUDA GPUs are available")
        return real_build(args, device)

    monkeypatch.setattr(host_probe, "build", build)
    got = host_probe.run_at(baseline_fn("quantize_kv"), p.wire()["args"], "", p.device, p.sms)
    assert "No CUDA GPUs are available" in host_probe.unavailable(got)
    assert not host_probe.served_by_baseline(p, got)
    cpu = next(p for p in host_probe.points(op) if p.device == "cpu")
    ran = host_probe.run_at(baseline_fn("quantize_kv"), cpu.wire()["args"], "", cpu.device, cpu.sms)
    assert not host_probe.unavailable(ran) and ran["launches"] == 1


def test_fake_cuda_tensors_open_no_cuda_context(monkeypatch):
    """On a GPU machine FakeTensorMode makes one real CUDA tensor the first time it fakes one (init_gpu_context);
    the judge of the CPU stage must not open a CUDA context, so the probe runs without it (here it would raise)."""
    from torch._subclasses import fake_tensor

    def real_gpu(device):
        raise AssertionError("a real CUDA tensor was made")

    monkeypatch.setattr(fake_tensor, "init_gpu_context", real_gpu)
    op = get_op("quantize_kv")
    p = next(p for p in host_probe.points(op) if p.device == "cuda")
    got = host_probe.run_at(baseline_fn("quantize_kv"), p.wire()["args"], "", p.device, p.sms)
    assert not host_probe.unavailable(got) and not got["error"] and got["launches"] == 1, got
    assert fake_tensor.init_gpu_context is real_gpu  # put back

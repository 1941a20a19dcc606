"""The GPU checks of DESIGN.md section 3 (run when a CUDA GPU is present).

* gpu_differential: the op's cases compiled for the device (tf32 dots and approximate
  division differ from the interpreter), tiny odd shapes and every serving shape, in each
  dtype, against the reference on the device; plus the error budget against the
  baseline on the same inputs.
* native_fpsan: Triton's own FpSan (TRITON_INSTRUMENTATION_MODE=fpsan, Triton >= 3.8),
  candidate against baseline; skipped with the reason on older Triton.
* memcheck / initcheck / racecheck: compute-sanitizer around a probe process that runs
  the candidate on small shapes, with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that an
  out-of-bounds access inside a pooled block is seen.
* determinism: repeated runs on the same inputs are bitwise identical (order-dependent
  float atomics fail here).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from typing import Callable, List, Optional

import torch

from ..harness.ops import get_op
from .checks import (CheckFailed, Subject, _describe_exception, _Skip, baseline_fn, check_load, check_static, first_difference,
                     outputs)
from .verdict import FAILED, PASSED, SKIPPED, CheckOutcome, Verdict

GPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _call(fn, case):
    out = case.call(fn)
    torch.cuda.synchronize()
    return out


def _gpu_cases(op, serving: bool = True):
    """(shape, dtype) pairs: the tiny suite in every dtype, then each serving shape in bf16 and fp16."""
    pairs = []
    for i, shape in enumerate(op.shapes("tiny")):
        pairs.append((shape, GPU_DTYPES[i % 3]))
    if serving:
        for shape in op.shapes("serving"):
            pairs.append((shape, torch.bfloat16))
            pairs.append((shape, torch.float16))
    return pairs


def check_gpu_differential(subject: Subject, device: str = "cuda") -> str:
    op = subject.op
    worst = 0.0
    n = 0
    for i, (shape, dtype) in enumerate(_gpu_cases(op)):
        case = op.make_case(shape, dtype, seed=200 + i, device=device,
                            layout="strided" if i % 2 and shape in op.shapes("tiny") else "contiguous")
        big = shape in op.shapes("serving")
        ref = op.reference(case.args, torch.float32 if big else torch.float64)
        try:
            out = _call(subject.fn, case)
        except Exception as e:  # noqa: BLE001
            raise CheckFailed(f"{_describe_exception(e, subject.path)}; reproduce: {case.describe()} (cuda)")
        cmp = op.compare(out, case.args, ref)
        if not cmp.ok:
            raise CheckFailed(f"{cmp.describe()}; reproduce: {case.describe()} (cuda)")
        if op.name != "quantize_kv":
            base = _call(subject.baseline, case)
            err_c = op.output_error(outputs(out)[0], outputs(ref)[0])
            err_b = op.output_error(outputs(base)[0], outputs(ref)[0])
            allowed = max(2.0 * err_b, op.tolerance(dtype).budget_floor)
            if err_c > allowed:
                raise CheckFailed(f"error {err_c:.3g} exceeds the budget {allowed:.3g} (2x the baseline's "
                                  f"{err_b:.3g}); reproduce: {case.describe()} (cuda)")
            worst = max(worst, err_c / allowed)
            del base
        n += 1
        del case, ref, out
        torch.cuda.empty_cache()
    return f"{n} cases on the device (tiny odd shapes in bf16/fp16/fp32, every serving shape in bf16 and fp16) " \
           f"match the reference; worst error {worst:.0%} of the budget"


def check_determinism(subject: Subject, device: str = "cuda", repeats: int = 5) -> str:
    op = subject.op
    shapes = [op.shapes("tiny")[-1], op.shapes("serving")[0]]
    for shape in shapes:
        case = op.make_case(shape, torch.bfloat16, seed=300, device=device)
        first = _call(subject.fn, case)
        for r in range(repeats - 1):
            again = _call(subject.fn, case)
            d = first_difference(first, again)
            if d:
                i, idx, a, b = d
                raise CheckFailed(f"run {r + 2} differs from run 1 at {op.output_names[i]}{list(idx)} ({a} vs {b}): "
                                  f"not bitwise deterministic; reproduce: {case.describe()} (cuda)")
        del case, first
        torch.cuda.empty_cache()
    return f"bitwise identical over {repeats} runs at {', '.join(s.key() for s in shapes)}"


def _triton_version():
    import triton
    return tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])


def check_native_fpsan(subject: Subject) -> str:
    import triton
    if _triton_version() < (3, 8):
        raise _Skip(f"Triton {triton.__version__} has no FpSan (it needs >= 3.8); the emulated FpSan of the CPU "
                    f"checks applies")
    env = dict(os.environ, TRITON_INSTRUMENTATION_MODE="fpsan", TRITON_FPSAN_HOMOMORPHIC_CASTS="1")
    r = subprocess.run([sys.executable, "-m", "kernel_agent.sanitizer.gpu_probe", "--op", subject.op.name,
                        "--file", subject.path, "--fpsan"], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode == 3:
        return "not structurally equivalent under native FpSan: " + r.stdout.strip().splitlines()[-1]
    if r.returncode != 0:
        raise CheckFailed("native FpSan run failed: " + (r.stdout + r.stderr).strip().splitlines()[-1][:300])
    return "bitwise identical to the baseline under Triton's native FpSan"


def find_compute_sanitizer() -> Optional[str]:
    for cand in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
                 "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
        if cand and os.path.exists(cand):
            return cand
    return None


def check_compute_sanitizer(subject: Subject, tool: str) -> str:
    exe = find_compute_sanitizer()
    if not exe:
        raise _Skip("compute-sanitizer is not installed on this machine")
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    cmd = [exe, "--tool", tool, "--error-exitcode", "97", "--print-limit", "5"]
    if tool == "memcheck":
        cmd += ["--leak-check", "no"]
    # three tiny shapes (one per dtype): the tools slow every launch by orders of magnitude
    cmd += [sys.executable, "-m", "kernel_agent.sanitizer.gpu_probe", "--op", subject.op.name, "--file", subject.path,
            "--limit", "3"]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"compute-sanitizer {tool} timed out after 900s")
    text = r.stdout + r.stderr
    summary = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if r.returncode == 97 or (summary and int(summary.group(1)) > 0):
        first = next((ln.strip() for ln in text.splitlines() if ln.startswith("=========") and (
            "Invalid" in ln or "Uninitialized" in ln or "hazard" in ln.lower() or "Race" in ln)), "")
        raise CheckFailed(f"compute-sanitizer {tool}: {summary.group(0) if summary else 'errors'}; {first[:300]}")
    if r.returncode != 0:
        raise CheckFailed(f"the probe under compute-sanitizer {tool} exited with {r.returncode}: "
                          f"{text.strip().splitlines()[-1][:300] if text.strip() else ''}")
    return f"{summary.group(0) if summary else 'no errors'} on 3 tiny shapes (bf16, fp16, fp32; {time.time() - t0:.0f}s)"


GPU_CHECKS = [
    ("gpu_differential", check_gpu_differential),
    ("native_fpsan", check_native_fpsan),
    ("memcheck", lambda s: check_compute_sanitizer(s, "memcheck")),
    ("initcheck", lambda s: check_compute_sanitizer(s, "initcheck")),
    ("racecheck", lambda s: check_compute_sanitizer(s, "racecheck")),
    ("determinism", check_determinism),
]


def sanitize_gpu(path: str, op_name: str, on_check: Optional[Callable[[CheckOutcome], None]] = None,
                 on_start: Optional[Callable[[str], None]] = None, only: Optional[List[str]] = None) -> Verdict:
    op = get_op(op_name)
    with open(path) as f:
        source = f.read()
    subject = Subject(op, os.path.abspath(path), source, baseline=baseline_fn(op_name))
    verdict = Verdict(path, op_name, "gpu")
    t_all = time.time()
    failed = False
    steps = [("static_gate", lambda s: check_static(s, None)), ("load", lambda s: check_load(s, None))]
    steps += [(n, c) for n, c in GPU_CHECKS if not only or n in only]
    for name, check in steps:
        if name not in ("static_gate", "load") and not torch.cuda.is_available():
            outcome = CheckOutcome(name, SKIPPED, "no CUDA GPU on this machine")
        elif failed:
            outcome = CheckOutcome(name, SKIPPED, "not run: an earlier check failed")
        else:
            if on_start:
                on_start(name)
            t0 = time.time()
            try:
                outcome = CheckOutcome(name, PASSED, check(subject), time.time() - t0)
            except _Skip as e:
                outcome = CheckOutcome(name, SKIPPED, str(e), time.time() - t0)
            except CheckFailed as e:
                outcome = CheckOutcome(name, FAILED, str(e), time.time() - t0)
            except Exception as e:  # noqa: BLE001
                outcome = CheckOutcome(name, FAILED, _describe_exception(e, subject.path), time.time() - t0)
            failed = failed or outcome.status == FAILED
        verdict.checks.append(outcome)
        if on_check:
            on_check(outcome)
    verdict.duration_s = time.time() - t_all
    return verdict

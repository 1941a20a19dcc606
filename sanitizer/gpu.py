"""The GPU checks of the sanitizer (run when a CUDA GPU is present; docs/SANITIZER.md lists them).

* gpu_differential: the op's cases compiled for the device (tf32 dots and approximate
  division differ from the interpreter), tiny odd shapes and every serving shape, in each
  dtype, against the reference on the device; plus the error budget against the
  baseline on the same inputs.
* gpu_domain: the regions of the op's domain only the device can afford (pools past 2^31
  elements, contexts up to 131072, MQA at serving head counts).
* native_fpsan: Triton's own FpSan (TRITON_INSTRUMENTATION_MODE=fpsan, Triton >= 3.8),
  candidate against baseline, each in an executor of its own; skipped with the reason on
  older Triton.
* memcheck / initcheck / racecheck: compute-sanitizer around the candidate's executor,
  which the judge drives through small shapes, with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so
  that an out-of-bounds access inside a pooled block is seen.

As on the CPU, this process judges and the candidate runs in a sandboxed executor.
* determinism: repeated runs on the same inputs are bitwise identical (order-dependent
  float atomics fail here).
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional

import torch

from ..ops import get_op
from .branches import DEVICE_ONLY, host_branches, taken
from .canonical import TextRefused
from .checks import (
    CheckSkipped,
    SeedStream,
    Subject,
    cases_n,
    check_load,
    check_static,
    compared_regions,
    first_difference,
    run_case,
)
from .execution import CheckFailed, baseline_fn, describe_exception
from .executor import Executor, ExecutorError
from .static_gate import check_source
from .verdict import CheckOutcome, CheckStatus, Verdict

GPU_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The dtypes each input distribution is drawn in on the device. Not float32: its dots run in TF32 there, whose
# 10-bit products put attention's output on 'large' logits outside float32's tolerance, for the baseline too
# (the CPU checks draw float32 in IEEE arithmetic).
GPU_SERVING_DTYPES = (torch.bfloat16, torch.float16)


def _call(subject: Subject, fn, case, **executor_opts):
    """The outputs of fn on the case, on the case's device: the baseline runs here (trusted), the
    candidate in its sandboxed executor (`executor_opts`: Executor.call's keep_inputs and again)."""
    if isinstance(fn, Executor):
        r = run_case(subject, fn, case, bounds=False, **executor_opts)
        if not r.ok:
            raise CheckFailed(f"{r.problem()}; reproduce: {case.describe()} (cuda)")
        subject.specs.update(dict.fromkeys(r.specs))
        return _on_case_device(r.out, case)
    out = case.call(fn)
    torch.cuda.synchronize()
    return out


def _on_case_device(out, case):
    """An executor's outputs (they arrive in host memory) moved to where the case's inputs live."""
    device = next(v.device for v in case.args.values() if isinstance(v, torch.Tensor))
    return tuple(o.to(device) for o in out) if isinstance(out, tuple) else out.to(device)


def _gpu_cases(op, serving: bool = True):
    """(shape, dtype, distribution): the tiny suite in every dtype, each of the op's distributions in bf16 and
    fp16 on one tiny shape (a path the device alone takes, on `is_cuda` or a bf16 flag, meets every kind of
    value: large logits for a running max, tiny rows for a scale), then each serving shape in bf16 and fp16."""
    triples = []
    for i, shape in enumerate(op.shapes("tiny")):
        triples.append((shape, GPU_DTYPES[i % 3], "normal"))
    for dist in (d.name for d in op.distributions if d.name != "normal"):
        for dtype in GPU_SERVING_DTYPES:
            triples.append((op.one_tiny_shape(), dtype, dist))
    if serving:
        for shape in op.shapes("serving"):
            triples.append((shape, torch.bfloat16, "normal"))
            triples.append((shape, torch.float16, "normal"))
    return triples


def check_gpu_differential(subject: Subject, device: str = "cuda") -> str:
    op = subject.op
    worst = 0.0
    n = 0
    for i, (shape, dtype, dist) in enumerate(_gpu_cases(op)):
        case = op.make_case(
            shape,
            dtype,
            seed=subject.seed(SeedStream.GPU_DIFFERENTIAL, i),
            dist=dist,
            device=device,
            layout="strided" if i % 2 and shape in op.shapes("tiny") else "contiguous",
        )
        big = shape in op.shapes("serving")
        ref = op.reference(case.args, torch.float32 if big else torch.float64)
        out = _call(subject, subject.fn, case)
        cmp = op.compare(out, case.args, ref)
        if not cmp.ok:
            raise CheckFailed(f"{cmp.describe()}; reproduce: {case.describe()} (cuda)")
        worst = max(worst, _within_budget(subject, case, out, ref))
        n += 1
        del case, ref, out
        subject.fn.reset()
        torch.cuda.empty_cache()
    _device_branches_taken(subject)
    # every specialisation a serving shape launches is compared with the reference here, whether or not the
    # interpreter ever ran it (the CPU verdict's host_branches check counts the ones it did)
    return (
        f"{cases_n(n)} on the device (tiny odd shapes in bf16/fp16/fp32, every input distribution in bf16/fp16, every "
        f"serving shape in bf16 and fp16) "
        f"match the reference; worst error {worst:.0%} of the budget; {len(subject.specs)} kernel "
        f"specialisation(s) launched, each checked against the reference"
    )


def _within_budget(subject: Subject, case, out, ref, where: str = "") -> float:
    """The error budget on the device: the candidate's error against `ref` at most twice the baseline's on the
    same inputs (the contract's tolerance grows with a matmul's K: an output 8% off passes it at K = 12288).
    Returns the fraction of the budget used (0 for an exact contract, which has none)."""
    op = subject.op
    if op.exact_check:
        return 0.0
    b = op.error_budget(out, _call(subject, subject.baseline, case), ref, op.output_dtype(case.args))
    if not b.ok:
        raise CheckFailed(
            f"{where}error {b.error:.3g} exceeds the budget {b.allowed:.3g} (2x the baseline's "
            f"{b.trusted_error:.3g}); reproduce: {case.describe()} (cuda)"
        )
    return b.used


def _device_branches_taken(subject: Subject) -> None:
    """The host branches that read only the device, the dtype or the SM count, which the CPU checks leave to
    this stage (sanitizer/branches.py DEVICE_ONLY): each one the device cases above reached (bf16, fp16 and fp32
    each), taken both ways when it reads only the dtype (every dtype is drawn here). One that reads the device
    or its SM count takes one side on one GPU: the CPU took the other, and on another GPU the serving guard
    checks each shape class before a kernel serves it (harness/serving/serving_guard.py)."""
    try:
        # the executor runs (and records arcs of) the canonical text: its lines are the ones to compile
        sides = [x for x in host_branches(subject.judged().text, subject.path) if x.exempt == DEVICE_ONLY]
    except (SyntaxError, TextRefused) as e:
        raise CheckFailed(f"the judge cannot compile the file: {e}")
    if not sides:
        return
    arcs, _ = subject.fn.coverage()
    took = taken(arcs, sides)
    branches: dict[tuple, list] = {}
    for x in sides:
        branches.setdefault((x.qualname, x.firstlineno, x.jump), []).append(x)
    for both in branches.values():
        reached = any(x.key() in took for x in both)
        missing = [x for x in both if x.key() not in took]
        if reached and missing and not both[0].reads_the_device:
            raise CheckFailed(
                f"host code branches on the dtype alone and the device cases (bf16, fp16 and fp32) never took one "
                f"side: {missing[0].describe(subject.path)}"
            )


def check_gpu_domain(subject: Subject, device: str = "cuda") -> str:
    """The regions of the op's domain only the device can afford (Op.domain: pools past 2^31 elements, where
    an int32 offset overflows; contexts up to 131072; MQA at serving head counts), and the sizes the code
    compares against past what the interpreter affords (sanitizer/compared.py), in bfloat16, against the
    float32 reference on the device."""
    op = subject.op
    # the domain's regions, then the sizes the code compares against that the interpreter cannot afford
    regions = op.domain().on("gpu") + [r for r in compared_regions(subject) if r.where == "gpu"]
    for i, region in enumerate(regions):
        case = op.make_case(
            region.shape,
            torch.bfloat16,
            seed=subject.seed(SeedStream.GPU_DOMAIN, i),
            dist=region.dist,
            device=device,
            layout=region.layout,
        )
        case = region.set_args(case)
        ref = op.reference(case.args, torch.float32)
        out = _call(subject, subject.fn, case)
        cmp = op.compare(out, case.args, ref)
        if not cmp.ok:
            raise CheckFailed(f"{region.name}: {cmp.describe()}; reproduce: {case.describe()} (cuda)")
        _within_budget(subject, case, out, ref, f"{region.name}: ")
        del case, ref, out
        subject.fn.reset()
        torch.cuda.empty_cache()
    return f"correct on {len(regions)} region(s) of the contract's domain on the device: " + "; ".join(
        r.name for r in regions
    )


def check_determinism(subject: Subject, device: str = "cuda", repeats: int = 5) -> str:
    op = subject.op
    shapes = [op.shapes("tiny")[-1], op.shapes("serving")[0]]
    for shape in shapes:
        case = op.make_case(shape, torch.bfloat16, seed=subject.seed(SeedStream.GPU_DETERMINISM), device=device)
        first = _call(subject, subject.fn, case, keep_inputs=True)
        for r in range(repeats - 1):
            # the same buffers in the executor, refilled there from the inputs as they arrived: nothing is sent
            again = _call(subject, subject.fn, case, again=True)
            d = first_difference(first, again)
            if d:
                i, idx, a, b = d
                raise CheckFailed(
                    f"run {r + 2} differs from run 1 at {op.output_names[i]}{list(idx)} ({a} vs {b}): "
                    f"not bitwise deterministic; reproduce: {case.describe()} (cuda)"
                )
        del case, first
        subject.fn.reset()
        torch.cuda.empty_cache()
    return f"bitwise identical over {repeats} runs at {', '.join(s.key() for s in shapes)}"


def _triton_version():
    import triton  # deferred: triton reads TRITON_INTERPRET when first imported; importing this module must not fix it

    return tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])


def _probe_cases(subject: Subject, limit: int = 0):
    """Small device cases for the tools that wrap a whole process (odd shapes, every dtype, strided)."""
    op = subject.op
    shapes = op.shapes("tiny")[: limit or None]
    return [
        op.make_case(
            shape,
            GPU_DTYPES[i % 3],
            seed=subject.seed(SeedStream.GPU_PROBES, i),
            device="cuda",
            layout="strided" if i % 2 else "contiguous",
        )
        for i, shape in enumerate(shapes)
    ]


def _tool_executor(subject: Subject, path: str, wrapper=(), env=None, tool_ports=()) -> Executor:
    ex = Executor(
        path,
        subject.op.name,
        "cuda",
        deadline=subject.deadline,
        skip_gate=subject.skip_gate,
        wrapper=wrapper,
        env_extra=env,
        tool_ports=tool_ports,
    )
    hello = ex.start()
    if hello.get("load_error"):
        ex.close()
        raise CheckFailed(f"importing the file failed: {str(hello['load_error'])[:300]}")
    return ex


def check_native_fpsan(subject: Subject) -> str:
    import triton  # deferred: as in _triton_version

    if _triton_version() < (3, 8):
        raise CheckSkipped(
            f"Triton {triton.__version__} has no FpSan (it needs >= 3.8); the emulated FpSan of the CPU checks applies"
        )
    env = {"TRITON_INSTRUMENTATION_MODE": "fpsan", "TRITON_FPSAN_HOMOMORPHIC_CASTS": "1"}
    cand = _tool_executor(subject, subject.path, env=env)
    base = _tool_executor(subject, inspect.getsourcefile(subject.baseline), env=env)  # type: ignore[arg-type]
    try:
        for case in _probe_cases(subject):
            rc, rb = run_case(subject, cand, case, bounds=False), run_case(subject, base, case, bounds=False)
            if not rc.ok:
                raise CheckFailed(f"native FpSan run failed: {rc.problem()}; reproduce: {case.describe()} (cuda)")
            d = first_difference(rc.out, rb.out)
            if d:
                return (
                    f"not structurally equivalent under native FpSan: {subject.op.output_names[d[0]]}"
                    f"{list(d[1])}: candidate {d[2]} vs baseline {d[3]} ({case.describe()})"
                )
    finally:
        cand.close()
        base.close()
    return "bitwise identical to the baseline under Triton's native FpSan"


def find_compute_sanitizer() -> Optional[str]:
    for cand in (
        shutil.which("compute-sanitizer"),
        "/usr/local/cuda/bin/compute-sanitizer",
        "/usr/local/cuda/compute-sanitizer/compute-sanitizer",
    ):
        if cand and os.path.exists(cand):
            return cand
    return None


TOOL_PORT_BASE, TOOL_PORT_COUNT = 49152, 16  # compute-sanitizer's default base port; one per concurrent run


def check_compute_sanitizer(subject: Subject, tool: str) -> str:
    exe = find_compute_sanitizer()
    if not exe:
        raise CheckSkipped("compute-sanitizer is not installed on this machine")
    # the tool's front end talks to the process it wraps over TCP on loopback, on the first free port of
    # this range: the tool and the executor share a network namespace of their own (its loopback alone),
    # and the executor may connect to these ports alone
    wrapper = _compute_sanitizer_command(exe, tool)
    t0 = time.time()
    # three tiny shapes (one per dtype): the tools slow every launch by orders of magnitude
    ex = _tool_executor(
        subject,
        subject.path,
        wrapper=wrapper,
        env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
        tool_ports=range(TOOL_PORT_BASE, TOOL_PORT_BASE + TOOL_PORT_COUNT),
    )
    try:
        for case in _probe_cases(subject, limit=3):
            r = run_case(subject, ex, case, bounds=False)
            if not r.ok:
                raise CheckFailed(f"under compute-sanitizer {tool}: {r.problem()}; reproduce: {case.describe()} (cuda)")
            out = _on_case_device(r.out, case)
            cmp = subject.op.compare(out, case.args, subject.op.reference(case.args, torch.float64))
            if not cmp.ok:
                raise CheckFailed(f"under compute-sanitizer {tool}: {cmp.describe()}; reproduce: {case.describe()}")
        rc, text = ex.finish(timeout_s=120)
    finally:
        ex.close()
    summary = _tool_error_summary(tool, rc, text)
    return (
        f"{summary.group(0) if summary else 'no errors'} on 3 tiny shapes (bf16, fp16, fp32; {time.time() - t0:.0f}s)"
    )


def _compute_sanitizer_command(exe: str, tool: str) -> List[str]:
    """The compute-sanitizer command line that wraps the executor: exit 97 on an error, its front end on the
    ports TOOL_PORT_BASE... (check_compute_sanitizer says why)."""
    wrapper = [
        exe,
        "--tool",
        tool,
        "--error-exitcode",
        "97",
        "--print-limit",
        "5",
        "--port",
        str(TOOL_PORT_BASE),
        "--max-connections",
        str(TOOL_PORT_COUNT),
    ]
    if tool == "memcheck":
        wrapper += ["--leak-check", "no"]
    return wrapper


def _tool_error_summary(tool: str, rc: Optional[int], text: str) -> Optional[re.Match[str]]:
    """compute-sanitizer's ERROR SUMMARY line in its output, if any; CheckFailed when it found errors (with
    the first one it printed) or the process it wrapped exited otherwise than cleanly."""
    summary = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if rc == 97 or (summary and int(summary.group(1)) > 0):
        first = next(
            (
                ln.strip()
                for ln in text.splitlines()
                if ln.startswith("=========")
                and ("Invalid" in ln or "Uninitialized" in ln or "hazard" in ln.lower() or "Race" in ln)
            ),
            "",
        )
        raise CheckFailed(f"compute-sanitizer {tool}: {summary.group(0) if summary else 'errors'}; {first[:300]}")
    if rc != 0:
        raise CheckFailed(
            f"the candidate's process under compute-sanitizer {tool} exited with {rc}: "
            f"{text.strip().splitlines()[-1][:300] if text.strip() else ''}"
        )
    return summary


GPU_CHECKS = [
    ("gpu_differential", check_gpu_differential),
    ("gpu_domain", check_gpu_domain),
    ("native_fpsan", check_native_fpsan),
    ("memcheck", lambda s: check_compute_sanitizer(s, "memcheck")),
    ("initcheck", lambda s: check_compute_sanitizer(s, "initcheck")),
    ("racecheck", lambda s: check_compute_sanitizer(s, "racecheck")),
    ("determinism", check_determinism),
]
GPU_CHECK_NAMES = [n for n, _ in GPU_CHECKS]
# Checks that start executors of their own (compute-sanitizer's wrapped processes) on tiny shapes: they run
# beside the checks that share the subject's executor, so that a verdict's time is the longest chain of
# device work (compiling the serving shapes' specialisations and the domain's large regions), not the sum.
CONCURRENT_GPU_CHECKS = ("memcheck", "initcheck", "racecheck")


def sanitize_gpu(
    path: str,
    op_name: str,
    on_check: Optional[Callable[[CheckOutcome], None]] = None,
    on_start: Optional[Callable[[str], None]] = None,
    only: Optional[List[str]] = None,
    seed_base: int = 0,
    deadline: Optional[float] = None,
    skip_gate: bool = False,
    before_gpu: Optional[Callable[[], object]] = None,
) -> Verdict:
    """The GPU checks: judged here, with the candidate in a sandboxed executor on the device.
    `before_gpu`: called once, after the static gate and the load (which need no GPU) and before the
    first check that runs on the device (a gated child waits there for its GPU lease)."""
    op = get_op(op_name)
    with open(path, "rb") as f:  # bytes: the gate judges how Python would read them
        source = f.read()
    deadline = deadline or time.time() + 900
    subject = Subject(
        op, os.path.abspath(path), source, baseline=baseline_fn(op_name), seed_base=seed_base, skip_gate=skip_gate
    )
    subject.deadline = deadline
    verdict = Verdict(path, op_name, "gpu")
    t_all = time.time()
    gpu = torch.cuda.is_available()
    if gpu and (skip_gate or check_source(source, op_name).passed):
        subject.executor = Executor(subject.path, op_name, "cuda", deadline=deadline, skip_gate=skip_gate)
    steps = [("static_gate", lambda s: check_static(s, None)), ("load", lambda s: check_load(s, None))]
    steps += [(n, c) for n, c in GPU_CHECKS if not only or n in only]
    try:
        _run_steps(steps, subject, verdict, gpu, on_check, on_start, before_gpu)
    finally:
        if subject.executor is not None:
            subject.executor.close()
    verdict.duration_s = time.time() - t_all
    return verdict


def _run_steps(steps, subject: Subject, verdict: Verdict, gpu: bool, on_check, on_start, before_gpu) -> None:
    """Each step's outcome into `verdict`, in order: the CONCURRENT_GPU_CHECKS start together with the first
    check on the device and run beside the others; a step after a failed one is skipped, unless it ran beside."""
    failed = started = False
    beside: dict[str, Future] = {}
    pool = ThreadPoolExecutor(max_workers=len(CONCURRENT_GPU_CHECKS), thread_name_prefix="gpu-check")
    try:
        for name, check in steps:
            if name not in ("static_gate",) and not gpu:
                outcome = CheckOutcome(name, CheckStatus.SKIPPED, "no CUDA GPU on this machine")
            elif name in beside:
                outcome = beside[name].result()
            elif failed:
                outcome = CheckOutcome(name, CheckStatus.SKIPPED, "not run: an earlier check failed")
            else:
                if before_gpu is not None and name not in ("static_gate", "load"):
                    before_gpu()
                    before_gpu = None
                if name not in ("static_gate", "load") and not started:
                    beside, started = _start_beside(pool, steps, subject, on_start), True
                if name in beside:
                    outcome = beside[name].result()
                else:
                    if on_start:
                        on_start(name)
                    outcome = _run_check(name, check, subject)
            failed = failed or outcome.status == CheckStatus.FAILED
            verdict.checks.append(outcome)
            if on_check:
                on_check(outcome)
    finally:
        pool.shutdown(wait=True)  # each runs under the subject's deadline and closes its own executor


def _start_beside(pool: ThreadPoolExecutor, steps, subject: Subject, on_start) -> dict[str, Future]:
    """Start the CONCURRENT_GPU_CHECKS among `steps` in `pool`; their futures by name."""
    started = {}
    for name, check in steps:
        if name in CONCURRENT_GPU_CHECKS:
            if on_start:
                on_start(name)
            started[name] = pool.submit(_run_check, name, check, subject)
    return started


def _run_check(name: str, check: Callable[[Subject], str], subject: Subject) -> CheckOutcome:
    """One check's outcome and time: passed with its note, skipped, or failed with why (an exception the
    check did not expect fails it too, described)."""
    t0 = time.time()
    try:
        return CheckOutcome(name, CheckStatus.PASSED, check(subject), time.time() - t0)
    except CheckSkipped as e:
        return CheckOutcome(name, CheckStatus.SKIPPED, str(e), time.time() - t0)
    except CheckFailed as e:
        return CheckOutcome(name, CheckStatus.FAILED, str(e), time.time() - t0)
    except ExecutorError as e:
        return CheckOutcome(name, CheckStatus.FAILED, str(e), time.time() - t0)
    except Exception as e:  # noqa: BLE001
        return CheckOutcome(name, CheckStatus.FAILED, describe_exception(e, subject.path), time.time() - t0)

"""Running a candidate's function on one case, in the process that holds it: the evidence a judge reads.

The executor (the sandboxed process that imports a candidate) calls `execute_call` for each of the judge's
calls; the judge (checks.py) calls it directly for the trusted baseline. The benchmark child loads kernels with
`load_module` and `baseline_fn` too. Nothing here decides a verdict.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import time
import traceback
import types
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .branches import BranchRecorder, launch_spec
from .fpsan import FpSanUnsupported
from .guard import HostGuard
from .interp import GuardPause, Instrumentation, Watched


class CheckFailed(Exception):
    """Raised inside a check with the one-line explanation of the failure."""


class TimedOut(CheckFailed):
    """The candidate did not answer before the judge's deadline: the run ends with a timeout verdict."""


@dataclass
class RunResult:
    out: Any = None
    error: str = ""
    bounds: List[str] = field(default_factory=list)
    guard: List[str] = field(default_factory=list)
    mutated: List[str] = field(default_factory=list)
    launches: int = 0
    fpsan_unsupported: List[str] = field(default_factory=list)
    specs: List[str] = field(default_factory=list)  # the specialisation of each launch (branches.launch_spec)
    handle: int = 0  # the executor's number for this call (its outputs can be re-read while it keeps them)
    elapsed_s: float = 0.0  # the wall time of the candidate's call (on a GPU, to its last kernel's end)
    returned_inputs: Dict[str, torch.Tensor] = field(default_factory=dict)  # the inputs as the call left them
    corners: List["RunResult"] = field(default_factory=list)  # the serving guard's runs at the class's corners

    @property
    def ok(self) -> bool:
        return not (self.error or self.bounds or self.guard or self.mutated)

    def problem(self) -> str:
        if self.bounds:
            return self.bounds[0]
        if self.guard:
            return "host code: " + self.guard[0]
        if self.mutated:
            return f"the candidate modified its input(s) {', '.join(self.mutated)}"
        return self.error


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone()


def describe_exception(e: BaseException, path: str) -> str:
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    where = ""
    for frame in reversed(traceback.extract_tb(root.__traceback__)):
        if os.path.abspath(frame.filename) == os.path.abspath(path):
            where = f" (candidate line {frame.lineno}: {frame.line.strip() if frame.line else ''})"
            break
    msg = str(root).strip().splitlines()[0] if str(root).strip() else ""
    # Triton's CompilationError says only "at L:C:" on its first line: the kernel's line and the error follow
    detail, src = getattr(root, "error_message", None), getattr(root, "src", None)
    lineno = getattr(getattr(root, "node", None), "lineno", None)
    if isinstance(src, str) and isinstance(lineno, int):
        lines = src.split("\n")
        if 0 < lineno <= len(lines):
            msg += f" `{lines[lineno - 1].strip()[:160]}`"
    if isinstance(detail, str) and detail.strip():
        msg += " " + detail.strip().splitlines()[-1][:300]
    return f"{type(root).__name__}: {msg[:600]}{where}"


@contextlib.contextmanager
def _traced(recorder: Optional[BranchRecorder]):
    """The recorder's trace function installed for the candidate's call alone."""
    if recorder is None:
        yield
        return
    recorder.install()
    try:
        yield
    finally:
        sys.settrace(None)


def execute_call(
    fn: Callable,
    args: Dict[str, Any],
    readable: Dict[str, torch.Tensor],
    path: str,
    *,
    device: str = "cpu",
    bounds: bool = True,
    order: str = "natural",
    seed: int = 0,
    fpsan: bool = False,
    sentinel: int = 0,
    recorder: Optional[BranchRecorder] = None,
) -> RunResult:
    """Call fn on args under the interpreter hooks and the host-code guard (on a GPU: under the guard
    alone), in the process that holds fn; `recorder` (the executor's) records the host-code branches the call
    took. What it returns is evidence for the judge, not a verdict."""
    tensors = {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}
    before = {k: _storage_bytes(v) for k, v in tensors.items()}
    res = RunResult()
    t0 = time.perf_counter()
    if device != "cpu":
        _call_on_device(fn, args, path, res, recorder)
    else:
        watched = (
            [Watched(k, v, readable.get(k)) for k, v in tensors.items()]
            if bounds
            else [Watched(k, v, None) for k, v in tensors.items()]
        )
        guard = HostGuard(sentinel=sentinel)
        inst = Instrumentation(bounds=bounds, order=order, seed=seed, fpsan=fpsan, watched=watched, fresh=guard.fresh)
        _call_interpreted(fn, args, path, res, inst, guard, recorder)
    res.elapsed_s = time.perf_counter() - t0
    for k, v in tensors.items():
        if not torch.equal(before[k], _storage_bytes(v)):
            res.mutated.append(k)
    return res


def _call_on_device(
    fn: Callable, args: Dict[str, Any], path: str, res: RunResult, recorder: Optional[BranchRecorder]
) -> None:
    """The call on the GPU, under the host-code guard alone; its output, error, guard findings and launches
    go into res."""
    guard = HostGuard(sentinel=-1)
    launches = [0]
    try:
        with _counting_launches(launches, res.specs), guard, _traced(recorder):
            res.out = fn(**args)
        torch.cuda.synchronize()
    except BaseException as e:  # noqa: BLE001 - a candidate's failure is a verdict, whatever it is
        if isinstance(e, KeyboardInterrupt):
            raise
        if not guard.violations:
            res.error = describe_exception(e, path)
    res.guard = list(guard.violations)
    res.launches = launches[0]


def _call_interpreted(
    fn: Callable,
    args: Dict[str, Any],
    path: str,
    res: RunResult,
    inst: Instrumentation,
    guard: HostGuard,
    recorder: Optional[BranchRecorder],
) -> None:
    """The call in the interpreter, under its hooks (inst) and the host-code guard; its output, error,
    findings, launches and what FpSan could not model go into res."""
    try:
        with inst.active():
            with guard, _traced(recorder):
                res.out = fn(**args)
    except FpSanUnsupported as e:
        res.fpsan_unsupported.append(str(e))
    except BaseException as e:  # noqa: BLE001 - a candidate's failure is a verdict, whatever it is
        if isinstance(e, KeyboardInterrupt):
            raise
        inner = e
        while inner.__cause__ is not None and not isinstance(inner, (FpSanUnsupported,)):
            inner = inner.__cause__
        if isinstance(inner, FpSanUnsupported):
            res.fpsan_unsupported.append(str(inner))
        elif not inst.violations and not guard.violations:
            res.error = describe_exception(e, path)
    res.bounds = list(inst.violations)
    res.guard = list(guard.violations)
    res.launches = len(inst.launches)
    res.specs = list(inst.specs)
    res.fpsan_unsupported += inst.fpsan_unsupported


@contextlib.contextmanager
def _counting_launches(count: List[int], specs: List[str]):
    """On the device: count Triton launches and record their specialisations, and let the launcher's own torch
    calls past the host-code guard (in the interpreter, Instrumentation does all three)."""
    from triton.runtime.jit import JITFunction  # deferred: triton reads TRITON_INTERPRET when first imported

    original = JITFunction.run

    def run(self, *args, **kwargs):
        count[0] += 1
        GuardPause.depth += 1
        traced = BranchRecorder.pause()  # Triton's launcher is not the candidate's host code
        try:
            params = getattr(self, "params", ())
            specs.append(
                launch_spec(
                    self.fn,
                    [p.name for p in params if getattr(p, "is_constexpr", False)],
                    [p.name for p in params],
                    args,
                    kwargs,
                )
            )
            return original(self, *args, **kwargs)
        finally:
            BranchRecorder.resume(traced)
            GuardPause.depth -= 1

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def load_module(path: str, op_name: str, prepare: Optional[Callable[[types.ModuleType], None]] = None):
    """Import a candidate file under a unique module name; return its op function. `prepare` sees the module
    before its code runs (the executor's recorders bind what they watch there)."""
    name = f"ka_candidate_{op_name}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CheckFailed(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit looks its functions up by module
    if prepare is not None:
        prepare(module)
    spec.loader.exec_module(module)
    fn = getattr(module, op_name, None)
    if not callable(fn):
        raise CheckFailed(f"the file defines no function `{op_name}`")
    return fn


def baseline_fn(op_name: str) -> Callable:
    mod = importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}")
    return getattr(mod, op_name)

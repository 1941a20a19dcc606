"""What a kernel compiles to on the H200, found on the CPU: `profile_source(source, op, shapes, dtype)`.

Triton compiles for sm_90 without a GPU (the compiler, ptxas and cuobjdump ship with its wheel). The
kernel file is candidate text, and Triton's code generator may call Python while it compiles, so the
compile runs in a child process sandboxed like the benchmark child (isolation/sandbox.py), after the
static gate, and only plain numbers come back. The child calls the op's wrapper on meta tensors of each
shape (shapes, strides and dtypes; no data), captures the kernel launches instead of running them, and
compiles each distinct launch once (kernel, constexprs, options, argument types): for each it reports
the programs of the grid, warps, pipeline stages, registers per thread, bytes spilled to local memory,
shared memory, and the instruction mix of the innermost loop of its PTX.

Integer arguments get the divisibility hints a real launch gives them (16 where the value is a multiple of
16, pointers 16-byte aligned as fresh allocations are), so the code is the code the GPU would run for
these shapes. Results are cached in this process per (source hash, op, dtype, shapes).

    python -m kernel_agent.harness.bench.compile_probe --spec SPEC.json --out OUT.json   (the child)
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ... import ops  # the package door: the op modules (torch) load on first use, inside the sandbox
from ...isolation import sandbox
from ...isolation.isolation import run_tracked
from ...sanitizer.canonical import as_written, judge_text
from ...sanitizer.static_gate import check_source

ARCH = 90  # the H200
INCUMBENT_TIMEOUT_S = 300.0  # every serving shape of a large kernel: a minute on a busy 2-core machine
_TYPES = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float64": "fp64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "bool": "i1",
}


@dataclass
class LaunchProfile:
    """One compiled launch, at one shape."""

    kernel: str
    shape: str
    programs: int
    num_warps: int
    num_stages: int
    registers: Optional[int]  # per thread; None when cuobjdump is missing
    spill_bytes: Optional[int]  # stack frame + local memory per thread: registers that did not fit
    shared_bytes: int
    loop_mix: Dict[str, int] = field(default_factory=dict)  # instruction classes in the innermost loop


@dataclass
class CompileProfile:
    launches: List[LaunchProfile] = field(default_factory=list)
    error: str = ""
    wall_s: float = 0.0  # the child's whole life, start-up included (what a compile costs on this machine now)

    def to_json(self) -> dict:
        return {"launches": [asdict(x) for x in self.launches], "error": self.error, "wall_s": self.wall_s}

    @classmethod
    def from_json(cls, d: dict) -> "CompileProfile":
        return cls([LaunchProfile(**x) for x in d.get("launches", [])], d.get("error") or "", d.get("wall_s", 0.0))


# -- reading the compiled code (pure functions; tested on text) -----------------------------------------

_CLASSES = (  # first match wins
    ("wgmma", re.compile(r"^wgmma\.mma_async")),  # a warpgroup's asynchronous MMA: many tiles per instruction
    ("tensor", re.compile(r"^mma\.")),
    ("global", re.compile(r"^(ld\.global|st\.global|cp\.async|cp\.reduce|red\.global|atom\.global|prefetch)")),
    ("shared", re.compile(r"^(ld\.shared|st\.shared|ldmatrix|stmatrix|ld\.param)")),
    ("sync", re.compile(r"^(bar|barrier|fence|mbarrier|wgmma\.fence|wgmma\.commit|wgmma\.wait)")),
    ("convert", re.compile(r"^cvt")),
    ("float", re.compile(r"^(fma|add|sub|mul|max|min|ex2|rcp|sqrt|rsqrt|div|neg|abs|lg2)\.[^ ]*(f16|f32|f64|bf16)")),
    ("branch", re.compile(r"^(bra|ret|exit|@)")),
)


def _classify(instr: str) -> str:
    for name, pattern in _CLASSES:
        if pattern.match(instr):
            return name
    return "integer"  # address arithmetic, predicates, moves, shuffles


def innermost_loop_mix(ptx: str) -> Dict[str, int]:
    """Instruction classes in the shortest backward-branch span of the PTX (the innermost loop); {}
    when the code has no loop."""
    lines = [re.sub(r"//.*", "", ln).strip() for ln in ptx.split(".section\t.debug")[0].splitlines()]
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.fullmatch(r"\$?[\w$]+:", ln)}
    best: Optional[Tuple[int, int]] = None
    for j, ln in enumerate(lines):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$?[\w$]+);", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            i = labels[m.group(1)]
            if best is None or j - i < best[1] - best[0]:
                best = (i, j)
    if best is None:
        return {}
    mix: Dict[str, int] = {}
    for ln in lines[best[0] + 1 : best[1] + 1]:
        if not ln or ln.startswith(("//", ".", "$", "{", "}")) or ln.endswith(":"):
            continue
        instr = re.sub(r"^@!?%\w+\s+", "", ln)  # a predicate guard does not change the class
        cls = _classify(instr)
        mix[cls] = mix.get(cls, 0) + 1
    return mix


def resource_usage(text: str, kernel: str) -> Tuple[Optional[int], Optional[int]]:
    """(registers, stack + local bytes) of `kernel` from `cuobjdump -res-usage` output."""
    m = re.search(rf"Function {re.escape(kernel)}:\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    if not m:
        return None, None
    return int(m.group(1)), int(m.group(2)) + int(m.group(3))


# -- the child: capture the wrapper's launches and compile each -----------------------------------------


def _programs(grid, kwargs: dict) -> int:
    if callable(grid):
        grid = grid(kwargs)
    n = 1
    for g in grid if isinstance(grid, (tuple, list)) else (grid,):
        n *= int(g)
    return n


def _capture(fn, args: dict) -> list:
    """(jit function, positional args, keyword args, programs) of each launch `fn(**args)` makes."""
    from triton.runtime.jit import JITFunction  # deferred: triton loads inside the child's sandbox

    seen = []
    original = JITFunction.run

    def capture(self, *a, grid=None, warmup=False, **kw):
        seen.append((self, a, kw, _programs(grid, kw)))

    JITFunction.run = capture
    try:
        fn(**args)
    finally:
        JITFunction.run = original
    return seen


def _compile_args(jit, a: tuple, kw: dict):
    """(signature, constexprs, attrs, options) as a launch with these arguments would specialise them."""
    import torch  # deferred: inside the child's sandbox

    params = list(inspect.signature(jit.fn).parameters)
    options = {k: kw[k] for k in ("num_warps", "num_stages") if k in kw}
    constexprs = {k: v for k, v in kw.items() if k in params}
    sig: Dict[str, str] = {}
    attrs = {}
    for i, (name, value) in enumerate(zip(params, a)):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + _TYPES[str(value.dtype).replace("torch.", "")]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1):
            constexprs[name] = value  # Triton specialises None and 1 into the code
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    for name in constexprs:
        sig[name] = "constexpr"
    return sig, {(params.index(k),): v for k, v in constexprs.items()}, attrs, options


def _compile_launch(jit, a: tuple, kw: dict, programs: int, shape: str, tools: str) -> LaunchProfile:
    import triton  # deferred: inside the child's sandbox
    from triton.backends.compiler import GPUTarget  # deferred: as above
    from triton.compiler import ASTSource  # deferred: as above

    sig, constexprs, attrs, options = _compile_args(jit, a, kw)
    compiled = triton.compile(
        ASTSource(jit, sig, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", ARCH, 32), options=options
    )
    name = compiled.metadata.name
    registers = spills = None
    cuobjdump = os.path.join(tools, "cuobjdump")
    if os.path.exists(cuobjdump):
        cubin = os.path.join(os.getcwd(), f"{name}.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        out = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, timeout=60).stdout
        registers, spills = resource_usage(out, name)
    return LaunchProfile(
        jit.fn.__name__,
        shape,
        programs,
        compiled.metadata.num_warps,
        compiled.metadata.num_stages,
        registers,
        spills,
        int(compiled.metadata.shared),
        innermost_loop_mix(compiled.asm["ptx"]),
    )


@dataclass(frozen=True)
class ProbeSpec:
    """What the compile probe's child compiles: the kernel file for `op`, at each shape key, in `dtype`. Crosses
    into the child as JSON, parsed there once."""

    file: str
    op: str
    dtype: str
    shapes: Tuple[str, ...]

    def to_json(self) -> Dict[str, object]:
        return {"file": self.file, "op": self.op, "dtype": self.dtype, "shapes": list(self.shapes)}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProbeSpec":
        return cls(str(d["file"]), str(d["op"]), str(d["dtype"]), tuple(str(k) for k in d.get("shapes") or ()))


def _profile_in_child(spec: ProbeSpec) -> CompileProfile:
    import triton  # deferred: inside the child's sandbox

    from ...sanitizer.execution import load_module  # deferred: torch, inside the child's sandbox

    with open(spec.file, "rb") as f:
        raw = f.read()
    gate = check_source(raw, spec.op)
    if not gate.passed:
        return CompileProfile(error=f"the static gate rejects the file: {gate.describe()}")
    op, dtype = ops.get_op(spec.op), ops.dtype_from_name(spec.dtype)
    # compiled from its canonical text, as the executor and the benchmark child run it (sanitizer/canonical.py)
    canonical = os.path.join(os.environ.get("KA_SANDBOX_SCRATCH", os.getcwd()), "kernel_profiled.py")
    with open(canonical, "w", encoding="utf-8") as f:
        f.write(judge_text(raw).text)
    fn = load_module(canonical, spec.op)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    out, done = CompileProfile(), {}
    for key in spec.shapes:
        case = op.make_case(op.parse_shape(key), dtype, seed=0, device="meta")
        for jit, a, kw, programs in _capture(fn, case.args):
            ident = (jit.fn.__name__, repr(_compile_args(jit, a, kw)))
            if ident not in done:
                done[ident] = _compile_launch(jit, a, kw, programs, key, tools)
            out.launches.append(LaunchProfile(**dict(asdict(done[ident]), shape=key, programs=programs)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    # the kernel file is candidate text, and compiling it runs Python: sandboxed before anything is read
    sandbox.enter(os.environ.get("KA_SANDBOX_SCRATCH", os.getcwd()), gpu=True)
    with open(args.spec) as f:
        spec = ProbeSpec.from_json(json.load(f))
    # trusted imports first: torch loads its own libraries through ctypes, which the hook refuses to candidates
    import torch  # noqa: F401  deferred: inside the sandbox, before the hook (as the executor does)
    import triton.compiler  # noqa: F401  deferred: as torch

    sandbox.prepare_gpu()
    sandbox.arm_audit_hook(fatal=False)
    try:
        result = _profile_in_child(spec)
    except Exception as e:  # noqa: BLE001 - a kernel that does not compile is a result, reported in one line
        result = CompileProfile(
            error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        )
    if sandbox.violations():
        result = CompileProfile(error=f"the sandbox refused: {sandbox.violations()[0]}")
    with open(args.out, "w") as f:
        json.dump(result.to_json(), f)
    return 0


# -- the parent --------------------------------------------------------------------------------------

_CACHE: Dict[Tuple[str, str, str, Tuple[str, ...]], CompileProfile] = {}


def profile_source(
    source: str, op: str, shapes: Sequence[str], dtype: str, timeout_s: float = INCUMBENT_TIMEOUT_S
) -> CompileProfile:
    """The compiled launches of `source` (a kernel file for `op`) at each shape key, from a sandboxed child;
    a failure (the gate, a compile error, a timeout) is a CompileProfile with `error`, never an exception."""
    key = (as_written(source).hash, op, dtype, tuple(shapes))
    if key in _CACHE:
        return _CACHE[key]
    scratch = sandbox.make_scratch("ka-compile-")
    try:
        path, sp, out = (os.path.join(scratch, n) for n in ("kernel.py", "spec.json", "out.json"))
        with open(path, "w") as f:
            f.write(source)
        with open(sp, "w") as f:
            json.dump(ProbeSpec(path, op, dtype, tuple(shapes)).to_json(), f)
        for p in (path, sp):
            os.chmod(p, 0o644)  # readable by the sandbox identity whatever this process's umask
        env = sandbox.env_for(scratch)
        env.pop("TRITON_INTERPRET", None)  # this compiles for the GPU
        t0 = time.time()
        rc, log = run_tracked(
            [sys.executable, "-m", "kernel_agent.harness.bench.compile_probe", "--spec", sp, "--out", out],
            timeout_s,
            env=env,
            cwd=scratch,
        )
        try:
            with open(out) as f:
                result = CompileProfile.from_json(json.load(f))
        except (OSError, ValueError, TypeError):
            tail = [ln for ln in log.strip().splitlines() if ln.strip()]
            why = "timed out" if rc is None else f"exit {rc}: {tail[-1][:300] if tail else ''}"
            result = CompileProfile(error=f"the compile probe failed ({why})")
        result.wall_s = round(time.time() - t0, 2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _CACHE[key] = result
    return result


if __name__ == "__main__":
    sys.exit(main())

"""Whether the baselines (and the serving set's kernels) compile to the same code at the serving shapes
as they did at a git revision: each op's wrapper is called on meta tensors of every serving shape, its
kernel launches are captured instead of run, and each launch is compiled for sm_90 from both versions of
the file. Identical PTX (source line records aside) means an unchanged launch runs unchanged code; a
serving shape that the revision's wrapper refuses is listed as new.

    python scripts/same_ptx.py REV [--arch 90] [--dtype bfloat16]

Needs no GPU (Triton's compiler and ptxas run on the CPU); TRITON_INTERPRET must be unset. Integer
arguments are compiled without the divisibility hints a real launch adds, alike for both versions: the
comparison holds, but the PTX is not byte for byte what the GPU runs. Exit 0 when every launch matches.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import tempfile
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(path: str, op_name: str, promoted: bool):
    """The module of a kernel file. A promoted kernel was written by a model: it is loaded as serving loads it
    (its canonical text, re-gated: harness/serving/serving.py), never imported as its bytes."""
    if promoted:
        from kernel_agent.harness.serving.serving import load_kernel_file

        return sys.modules[load_kernel_file(path, op_name).__module__]
    name = f"same_ptx_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _launches(module, op_name: str, args: dict):
    """(kernel name, positional args, keyword args) of each launch the op's wrapper makes."""
    from triton.runtime.jit import JITFunction

    seen = []
    original = JITFunction.run

    def capture(self, *a, grid=None, warmup=False, **kw):
        seen.append((self.fn.__name__, a, kw))

    JITFunction.run = capture
    try:
        getattr(module, op_name)(**args)
    finally:
        JITFunction.run = original
    return seen


_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int8": "i8", "int32": "i32", "int64": "i64"}


def _compile(module, kernel_name: str, a: tuple, kw: dict, arch: int) -> str:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit = getattr(module, kernel_name)
    params = list(inspect.signature(jit.fn).parameters)
    options = {k: kw[k] for k in ("num_warps", "num_stages") if k in kw}
    constexprs = {k: v for k, v in kw.items() if k in params}
    sig = {}
    for name, value in zip(params, a):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + _TYPES[str(value.dtype).replace("torch.", "")]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        else:
            sig[name] = "fp32"
    for name in constexprs:
        sig[name] = "constexpr"
    src = ASTSource(jit, sig, constexprs={(params.index(k),): v for k, v in constexprs.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options).asm["ptx"]
    ptx = ptx.split(".section\t.debug")[0]
    lines = [
        re.sub(r"//.*", "", ln).rstrip()
        for ln in ptx.splitlines()
        if not ln.strip().startswith((".loc", ".file", "$L__tmp"))
    ]
    return "\n".join(ln for ln in lines if ln)


def _meta_case(op, shape, dtype):
    """The case's arguments on the meta device (shapes, strides and dtypes; no data)."""
    import torch

    case = op.make_case(shape, dtype, seed=0)
    return {
        k: (
            torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v
        )
        for k, v in case.args.items()
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the git revision to compare against (e.g. main, HEAD~3)")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: this compiles for the GPU", file=sys.stderr)
        return 2
    import json

    from kernel_agent.ops import OPS, dtype_from_name

    dtype = dtype_from_name(args.dtype)
    files = [(name, f"kernels/baseline/{name}.py") for name in OPS]
    manifest = os.path.join(ROOT, "kernels", "serving", "manifest.json")
    if os.path.exists(manifest):
        for e in json.load(open(manifest)).get("entries", []):
            if e.get("file"):
                files.append((e["op"], f"kernels/serving/{e['file']}"))
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for op_name, rel in dict.fromkeys(files):
            old_src = subprocess.run(["git", "show", f"{args.rev}:{rel}"], cwd=ROOT, capture_output=True, text=True)
            if old_src.returncode != 0:
                print(f"{rel}: not at {args.rev}, nothing to compare")
                continue
            old_path = os.path.join(tmp, f"old_{uuid.uuid4().hex[:6]}.py")
            with open(old_path, "w") as f:
                f.write(old_src.stdout)
            promoted = rel.startswith("kernels/serving/")
            old_mod = _load(old_path, op_name, promoted)
            new_mod = _load(os.path.join(ROOT, rel), op_name, promoted)
            op = OPS[op_name]
            for shape in op.shapes("serving"):
                case = _meta_case(op, shape, dtype)
                try:
                    old_l = _launches(old_mod, op_name, case)
                except (AssertionError, ValueError) as e:  # a shape the old contract did not take
                    print(f"new       {rel} {shape}: {args.rev} refuses it ({type(e).__name__}: {e})")
                    continue
                new_l = _launches(new_mod, op_name, case)
                if [n for n, _, _ in old_l] != [n for n, _, _ in new_l]:
                    print(f"DIFFERENT {rel} {shape}: launches {[n for n, _, _ in old_l]} -> {[n for n, _, _ in new_l]}")
                    same = False
                    continue
                for (name, oa, okw), (_, na, nkw) in zip(old_l, new_l):
                    o = _compile(old_mod, name, oa, okw, args.arch)
                    n = _compile(new_mod, name, na, nkw, args.arch)
                    ok = o == n
                    same &= ok
                    digest = hashlib.sha256(n.encode()).hexdigest()[:12]
                    print(f"{'same     ' if ok else 'DIFFERENT'} {rel} {shape} {name}: PTX {digest} ({len(n)} chars)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

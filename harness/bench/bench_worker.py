"""Benchmark in a child process: `python -m kernel_agent.harness.bench.bench_worker --spec SPEC.json --out OUT.json`.

A candidate can fault the GPU (an illegal address poisons the whole CUDA context) or
hang; timing it in its own process with a time limit turns that into a result instead
of an outage. Candidate code runs here, so the process is sandboxed (isolation/sandbox.py)
before it reads its spec, and kernel files are loaded through the static gate. SPEC: a BenchSpec
(harness/bench/bench_records.py) as JSON: {"op", "shapes": [shape keys], "dtype", "kernels": [{"label", "file" | null
(baseline), "source_hash"}], "seed", "race", ...}. OUT: {"results": [ShapeResult...],
"ceilings": {...}, "error": str | null, "phases": {seconds per phase}, "raced_out": {"shape", "reason"} when "race"
stopped at a shape on which the promotion rule refuses the candidate (slower beyond the noise, say, or stopped
early by the sequential test, harness/bench/sequential.py): the other shapes cannot change that verdict, so they are
not timed}.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from typing import Any, Dict, Optional, Union

from ... import ops  # the package door: the op modules (torch) load on first use, inside the sandbox
from ...isolation import sandbox
from ...isolation.isolation import run_tracked
from ...isolation.lease import OnReady, run_gated, wait_for_grant
from ...sanitizer.canonical import judge_text, judged_or_as_read
from ...sanitizer.static_gate import check_source
from ..env import versions
from .bench_records import BenchKernel, BenchSpec, ShapeResult
from .promotion import reference_words, refused_at_shape, shape_pair


def _contenders(spec: BenchSpec):
    """The kernels to time: candidate files through the static gate, each imported from its canonical text
    written into this child's scratch directory (the text the gate judged, which must be the text the parent
    names by its hash); the baseline from the package."""
    from ...sanitizer.execution import baseline_fn, load_module  # deferred: torch, loaded inside the child's sandbox
    from .bench import Contender  # deferred: torch, loaded inside the child's sandbox

    out = []
    for i, k in enumerate(spec.kernels):
        path = k.file or inspect.getsourcefile(baseline_fn(spec.op))
        if path is None:
            raise ValueError(f"{k.label}: the baseline of {spec.op} has no source file")
        with open(path, "rb") as f:
            raw = f.read()
        wrong = hash_mismatch(k, raw)
        if wrong:
            raise ValueError(wrong)
        gate = check_source(raw, spec.op)
        if not gate.passed:
            raise ValueError(f"{k.label}: the static gate rejects the file: {gate.describe()}")
        if k.file:
            canonical = os.path.join(os.environ.get("KA_SANDBOX_SCRATCH", os.getcwd()), f"kernel_{i}.py")
            with open(canonical, "w", encoding="utf-8") as f:
                f.write(judge_text(raw).text)
            fn = load_module(canonical, spec.op)
        else:
            fn = baseline_fn(spec.op)
        out.append(Contender(k.label, fn, tuple(gate.jit_functions)))
    return out


def hash_mismatch(kernel: BenchKernel, raw: bytes) -> str:
    """Why a contender's file is not the text the parent asked to time ('' when it is, or names no hash): a
    file changed after it was judged is not timed in its place."""
    if not kernel.source_hash:
        return ""
    got = judged_or_as_read(raw).hash
    if got == kernel.source_hash:
        return ""
    return (
        f"{kernel.label}: the file is not the judged text (sha256 {got[:12]}, judged "
        f"{kernel.source_hash[:12]}): it changed after it was judged"
    )


# long: the benchmark child's life in order: sandbox, spec, ceilings, kernels, the GPU lease, each shape's timing
def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    t_start = time.time()
    # The candidates' code runs in this process: it is sandboxed before anything is read.
    sandbox.enter(os.environ.get("KA_SANDBOX_SCRATCH", os.getcwd()), gpu=True)
    with open(args.spec) as f:
        spec = BenchSpec.from_json(json.load(f))
    doc: Dict = {"results": [], "error": None}

    def flush():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, args.out)

    from .bench import Ceilings, benchmark_shape, measure_ceilings, prepare_shape  # deferred: torch, inside the sandbox

    op, dtype = ops.get_op(spec.op), ops.dtype_from_name(spec.dtype)
    versions()  # the driver is read by a tool the sandbox refuses once candidates are loaded
    doc["phases"] = {}
    gated = spec.gated
    if spec.ceilings:
        ceilings = Ceilings(**spec.ceilings)
    else:
        if gated:  # the ceilings are a timing too: with the GPU alone (the first benchmark on a machine)
            _wait_for(("gpu", "wait_gpu_s"), ("alone", "wait_s"), phases=doc["phases"])
            gated = False
        ceilings = measure_ceilings()
    doc["ceilings"] = asdict(ceilings)
    sandbox.prepare_gpu()  # what torch and Triton do through ctypes, done before the hook refuses it
    if spec.references:
        _prepare_references()
    sandbox.arm_audit_hook(fatal=False)  # record only: a compiler probe Triton tolerates must not end a timing
    contenders = _contenders(spec)
    doc["sandbox_refused"] = sandbox.violations()
    doc["phases"]["start_s"] = round(time.time() - t_start, 2)
    if gated:
        # Started and loaded without the GPU; compile beside other correctness work on it, then time
        # only once the parent has given the GPU to this timing alone (isolation/lease.py).
        _wait_for(("gpu", "wait_gpu_s"), phases=doc["phases"])
        t0 = time.time()
        for key in spec.shapes:
            prepare_shape(op, op.parse_shape(key), dtype, contenders, seed=spec.seed)
        doc["phases"]["prepare_s"] = round(time.time() - t0, 2)
        flush()
        _wait_for(("alone", "wait_s"), phases=doc["phases"])
    for key in spec.shapes:
        t0 = time.time()
        shape = op.parse_shape(key)
        res = benchmark_shape(
            op,
            shape,
            dtype,
            contenders,
            ceilings,
            seed=spec.seed,
            log=lambda s: print(s, flush=True),
            references=spec.references,
            stop_early=spec.race,
        )
        doc["results"].append(res.to_json())
        doc["sandbox_refused"] = sandbox.violations()
        doc["phases"][key] = round(time.time() - t0, 2)
        refused = spec.race and refused_here(res)
        if refused:
            # the rule refuses the bucket on this shape alone: timing the rest cannot change that
            doc["raced_out"] = {"shape": key, "reason": refused}
            flush()
            break
        flush()
    flush()
    return 0


def _prepare_references() -> None:
    """Import the reference libraries (FlashInfer) before the audit hook is armed: they are trusted, and their
    import loads ctypes (NVML bindings). One that is missing is the reference's own row, later."""
    from ...ops.flashinfer_paged import FlashInferUnavailable, require  # the optional extra, for bench --op only

    try:
        require()
    except FlashInferUnavailable:
        pass


def _wait_for(*requests, phases: Dict) -> None:
    """Ask the parent for each (phase, key) in turn, recording the seconds waited under key."""
    for phase, key in requests:
        phases[key] = round(wait_for_grant(phase), 2)


def refused_here(res: ShapeResult) -> str:
    """Why the promotion rule refuses the candidate on this shape alone, or ''. Held against the same
    reference as the rule: the incumbent, or torch where it serves and is faster. A candidate the sequential test
    stopped is refused with its verdict (promotion.judge_benchmark reads it the same way)."""
    if res.stopped_early is not None:
        return res.stopped_early.verdict()
    pair, _ = shape_pair(res.measurements)
    if pair is None:
        return ""  # an error is judged as an error, with every shape's
    d = refused_at_shape(pair.candidate, pair.reference, res.shape, reference_words([pair.reference_label]))
    return d.reason if d else ""


def run_bench_isolated(
    spec: Union[BenchSpec, Dict[str, Any]],
    timeout_s: float = 900.0,
    env: Optional[dict] = None,
    on_ready: Optional[OnReady] = None,
) -> dict:
    """Run one benchmark spec (a BenchSpec, or its JSON) in a sandboxed child process (`env`: variables it may
    see on top of the allowlist, e.g. the GPU it may use); a crash or hang comes back as {'error': ...}, and
    Ctrl-C takes the child down at once. The child reads copies of the kernel files inside its scratch
    directory and writes its results there; a file that is not the text its kernel names by hash is not
    copied (and the child checks its copy again). The ceilings are measured by the first child and cached.

    With `on_ready`, the benchmark is gated (isolation/lease.py): the child starts and loads its kernels
    without the GPU, asks for phase "gpu" to compile them, and for phase "alone" to time them."""
    from .bench import Ceilings, ceilings_path  # deferred: torch, loaded inside the child's sandbox

    spec = spec if isinstance(spec, BenchSpec) else BenchSpec.from_json(spec)
    scratch = sandbox.make_scratch("ka-bench-")
    try:
        copies = _copy_kernels(spec, scratch)
        if isinstance(copies, str):
            return {"results": [], "error": copies}
        spec = dataclasses.replace(spec.with_files(copies), gated=on_ready is not None)
        cache = None
        try:
            cache = ceilings_path()
            if os.path.exists(cache):
                with open(cache) as f:
                    spec = dataclasses.replace(spec, ceilings=json.load(f))
        except (OSError, ValueError):
            pass
        sp, out = os.path.join(scratch, "spec.json"), os.path.join(scratch, "out.json")
        with open(sp, "w") as f:
            json.dump(spec.to_json(), f)
        os.chmod(sp, 0o644)
        child_env = sandbox.env_for(scratch, env)
        child_env.pop("TRITON_INTERPRET", None)
        # torch.compile (an anchor) compiles in this process: the sandbox refuses its worker processes
        child_env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        t0 = time.time()
        cmd = [sys.executable, "-m", "kernel_agent.harness.bench.bench_worker", "--spec", sp, "--out", out]
        if on_ready is None:
            rc, log = run_tracked(cmd, timeout_s, env=child_env, cwd=scratch)
        else:
            rc, log = run_gated(cmd, timeout_s, child_env, scratch, on_ready)
        doc = _child_doc(out, rc, log, timeout_s)
        if cache and not spec.ceilings and isinstance(doc.get("ceilings"), dict) and not doc.get("error"):
            try:
                Ceilings(**doc["ceilings"])
                os.makedirs(os.path.dirname(cache), exist_ok=True)
                with open(f"{cache}.{os.getpid()}.tmp", "w") as f:
                    json.dump(doc["ceilings"], f, indent=1)
                os.replace(f"{cache}.{os.getpid()}.tmp", cache)
            except (OSError, TypeError):
                pass
        doc["log"] = log[-4000:]
        doc["wall_s"] = time.time() - t0
        return doc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _copy_kernels(spec: BenchSpec, scratch: str) -> Union[Dict[str, str], str]:
    """Each kernel file's copy in `scratch` (file -> copy), read once so that what is checked is what the child
    gets; or the one-line error of the first file that is not the text its kernel names by hash."""
    copies: Dict[str, str] = {}
    for i, k in enumerate(spec.kernels):
        if k.file:
            with open(k.file, "rb") as f:  # read once: what is checked is what the child gets
                raw = f.read()
            wrong = hash_mismatch(k, raw)
            if wrong:
                return wrong
            copies[k.file] = os.path.join(scratch, f"kernel{i}.py")
            with open(copies[k.file], "wb") as f:
                f.write(raw)
            os.chmod(copies[k.file], 0o644)  # readable by the sandbox identity whatever this process's umask
    return copies


def _child_doc(out: str, rc: Optional[int], log: str, timeout_s: float) -> Dict:
    """What the child wrote to `out` (its results, where it wrote a document of them), with the error its exit
    says: a time-out (`rc` None) or a failure, with the last line of its log."""
    doc: Dict = {"results": [], "error": None}
    if os.path.exists(out):
        try:
            with open(out) as f:
                got = json.load(f)
            if isinstance(got, dict) and isinstance(got.get("results", []), list):
                doc = got
        except (OSError, ValueError):
            pass
    if rc is None:
        doc["error"] = f"benchmark timed out after {timeout_s:.0f}s"
    elif rc != 0:
        lines = [ln for ln in log.strip().splitlines() if ln.strip()]
        doc["error"] = f"benchmark process failed (exit {rc}): {lines[-1][:300] if lines else ''}"
    return doc


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark in a child process: `python -m kernel_agent.harness.bench_worker --spec SPEC.json --out OUT.json`.

A candidate can fault the GPU (an illegal address poisons the whole CUDA context) or
hang; timing it in its own process with a time limit turns that into a result instead
of an outage. SPEC: {"op", "shapes": [shape keys], "dtype", "kernels": [{"label",
"file" | null (baseline), "kernel_names"}], "seed"}. OUT: {"results": [ShapeResult...],
"ceilings": {...}, "error": str | null}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Dict, Optional


def _contenders(spec: dict):
    from ..sanitizer.checks import baseline_fn, load_module
    from ..sanitizer.static_gate import check_source
    from .bench import Contender
    out = []
    for k in spec["kernels"]:
        if k.get("file"):
            fn = load_module(k["file"], spec["op"])
            with open(k["file"]) as f:
                names = check_source(f.read(), spec["op"]).jit_functions
        else:
            fn = baseline_fn(spec["op"])
            import inspect
            with open(inspect.getsourcefile(fn)) as f:
                names = check_source(f.read(), spec["op"]).jit_functions
        out.append(Contender(k["label"], fn, tuple(names)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from ..sanitizer.worker import _die_with_parent
    _die_with_parent()
    with open(args.spec) as f:
        spec = json.load(f)
    doc: Dict = {"results": [], "error": None}

    def flush():
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, args.out)

    from dataclasses import asdict

    from .bench import benchmark_shape, load_ceilings
    from .ops import dtype_from_name, get_op
    op = get_op(spec["op"])
    ceilings = load_ceilings()
    doc["ceilings"] = asdict(ceilings)
    contenders = _contenders(spec)
    for key in spec["shapes"]:
        shape = op.parse_shape(key)
        res = benchmark_shape(op, shape, dtype_from_name(spec.get("dtype", "bfloat16")), contenders, ceilings,
                              seed=spec.get("seed", 0), log=lambda s: print(s, flush=True))
        doc["results"].append(res.to_json())
        flush()
    flush()
    return 0


def run_bench_isolated(spec: dict, timeout_s: float = 900.0, env: Optional[dict] = None) -> dict:
    """Run one benchmark spec in a child process (`env`: its environment, e.g. the GPU it may see);
    a crash or hang comes back as {'error': ...}, and Ctrl-C takes the child down at once."""
    from ..sanitizer.runner import run_tracked
    with tempfile.TemporaryDirectory(prefix="ka-bench-") as tmp:
        sp, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        t0 = time.time()
        rc, log = run_tracked([sys.executable, "-m", "kernel_agent.harness.bench_worker", "--spec", sp, "--out", out],
                              timeout_s, env=env)
        doc = {"results": [], "error": None}
        if os.path.exists(out):
            try:
                with open(out) as f:
                    doc = json.load(f)
            except (OSError, json.JSONDecodeError):
                pass
        if rc is None:
            doc["error"] = f"benchmark timed out after {timeout_s:.0f}s"
        elif rc != 0:
            lines = [ln for ln in log.strip().splitlines() if ln.strip()]
            doc["error"] = f"benchmark process failed (exit {rc}): {lines[-1][:300] if lines else ''}"
        doc["log"] = log[-4000:]
        doc["wall_s"] = time.time() - t0
        return doc


if __name__ == "__main__":
    sys.exit(main())

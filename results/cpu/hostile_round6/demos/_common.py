"""Shared by the round-6 demos: load a candidate file outside the sanitizer, run it, compare with the reference."""
import importlib.util, os, pathlib, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
from kernel_agent.ops import get_op

HERE = pathlib.Path(__file__).resolve().parent
R6 = HERE.parent
ROOT = R6.parents[2]


def load(path, name=None):
    path = pathlib.Path(path)
    spec = importlib.util.spec_from_file_location(name or f"cand_{path.parent.name}_{path.stem}_{id(path)}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def case(op, name):
    return load(R6 / "cases" / op / f"{name}.py")


def baseline(op):
    return load(ROOT / "kernels" / "baseline" / f"{op}.py")


def check(label, op_name, fn, args):
    op = get_op(op_name)
    t0 = time.time()
    out = fn(**args)
    cmp = op.compare(out, args)
    print(f"{label}: {'OK   ' if cmp.ok else 'WRONG'} rel_error={cmp.rel_error:.3g} bad_fraction={cmp.bad_fraction:.3g}"
          f" ({time.time() - t0:.1f} s) {'' if cmp.ok else cmp.describe()[:200]}", flush=True)
    return cmp.ok

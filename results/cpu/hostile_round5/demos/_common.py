"""Shared demo helpers: load a kernel file by path, run case vs baseline vs the op's float64 reference."""
import importlib.util, os, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
from kernel_agent.ops import get_op

ROOT = "results/cpu/hostile_round5"
BASE = "kernels/baseline"


def load(path, name=None):
    name = name or "m_" + os.path.basename(os.path.dirname(path)) + "_" + os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def case_and_base(op, name):
    return load(f"{ROOT}/cases/{op}/{name}.py"), load(f"{BASE}/{op}.py", "baseline_" + op)


def err(a, b):
    a, b = a.double(), b.double()
    d = (a - b).abs()
    return f"max|diff|={d.max().item():.4g} rel_norm={(d.norm() / max(b.norm().item(), 1e-30)).item():.4g}"


def compare_case(opname, name, shape, dtype=torch.float16, dist="normal", layout="contiguous", seed=0, patch=None):
    op = get_op(opname)
    case = op.make_case(shape, dtype, seed=seed, dist=dist, layout=layout)
    args = dict(case.args)
    cm, bm = case_and_base(opname, name)
    if patch:
        patch(cm)
    fn_c, fn_b = getattr(cm, opname), getattr(bm, opname)
    t = time.time()
    out_b = fn_b(**args)
    t_b = time.time() - t
    t = time.time()
    out_c = fn_c(**args)
    t_c = time.time() - t
    print(f"[{opname}/{name}] shape={shape} dtype={dtype} dist={dist} layout={layout}")
    print(f"  baseline {t_b:.1f}s, case {t_c:.1f}s")
    if isinstance(out_c, tuple):
        for i, (c, b) in enumerate(zip(out_c, out_b)):
            print(f"  output {i}: case vs baseline {err(c, b)}")
    else:
        print(f"  case vs baseline: {err(out_c, out_b)}")
    cb = op.compare(out_b, args)
    cc = op.compare(out_c, args)
    print(f"  op.compare(baseline): ok={cb.ok} {cb.describe()}")
    print(f"  op.compare(case):     ok={cc.ok} {cc.describe()}")
    return out_c, out_b, args, op

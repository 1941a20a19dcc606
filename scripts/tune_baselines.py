"""Sweep the baselines' launch configurations at serving shapes on a GPU.

Each config is checked against the float32 reference once and timed with
triton.testing.do_bench (L2 flushed, median). The best config per (op, shape) is
what kernels/baseline/*._config should return; this script is how those choices
were made.

    PYTHONPATH=. python3 scripts/tune_baselines.py [--ops matmul,attention] [--out results/tune.json]

With --kernel FILE the configs of that kernel file (a promoted serving kernel with the same
`_config` signature as its op's baseline) are swept instead of the baseline's: one op only.

With --neighbours the configs are the baseline's own and every one-field change the built-in
search may propose (agent/search.py); --shape-list times shapes outside the serving suite, e.g.
--ops matmul --neighbours --shape-list '256,8192,8192;128,8192,8192': where a neighbour beats
the baseline clearly, a `kernel-agent run` at that shape has something to find.
"""

import argparse
import importlib
import json
import sys
import time
from functools import partial

import torch
import triton

from kernel_agent.harness.bench.bench import anchor_for
from kernel_agent.ops import NAMES, get_op

# The hand-picked sweeps that chose each baseline's `_config`, kept as the record of how kernels/baseline
# were tuned. An op without one is swept over its own config, or with --neighbours over the search's space.
MATMUL_SWEEPS = {
    "large": [
        (128, 256, 64, 8, 1, 8, 3),
        (128, 256, 64, 8, 1, 8, 4),
        (256, 128, 64, 8, 1, 8, 3),
        (128, 128, 64, 8, 1, 4, 4),
        (128, 128, 64, 8, 1, 8, 4),
        (128, 256, 32, 8, 1, 8, 4),
        (128, 256, 64, 4, 1, 8, 4),
        (128, 256, 64, 16, 1, 8, 4),
        (256, 128, 64, 8, 1, 8, 4),
        (128, 128, 128, 8, 1, 8, 3),
        (256, 128, 64, 16, 1, 8, 4),
    ],
    "m16": [
        (16, 64, 128, 1, 1, 4, 4),
        (16, 64, 128, 1, 2, 4, 4),
        (16, 64, 128, 1, 4, 4, 4),
        (16, 32, 256, 1, 1, 4, 4),
        (16, 128, 128, 1, 2, 4, 4),
        (16, 64, 256, 1, 2, 4, 3),
        (16, 32, 128, 1, 2, 2, 5),
    ],
    "m64": [
        (64, 64, 128, 1, 1, 4, 4),
        (64, 64, 128, 1, 2, 4, 4),
        (64, 128, 64, 1, 1, 4, 4),
        (64, 128, 128, 1, 2, 8, 3),
        (64, 64, 256, 1, 2, 4, 3),
        (64, 32, 128, 1, 2, 4, 4),
    ],
}
CONFIGS = {
    "matmul": lambda shape: MATMUL_SWEEPS["m16" if shape.M <= 16 else "m64" if shape.M <= 64 else "large"],
    "attention": [
        (128, 64, 8, 3),
        (128, 128, 8, 3),
        (128, 64, 4, 3),
        (128, 128, 8, 2),
        (64, 64, 4, 3),
        (128, 64, 8, 4),
        (128, 32, 4, 4),
    ],
    "decode_attention": [
        (s, bn, w, st) for s in (1, 2, 4, 8, 16) for bn in (32, 64, 128) for (w, st) in ((4, 3), (4, 2), (4, 4), (8, 3))
    ],
    "decode_attention_int8": [
        (s, bn, w, st) for s in (1, 2, 4, 5, 8, 16) for bn in (64, 128, 256) for (w, st) in ((4, 3), (8, 3), (4, 2))
    ],
    "quantize_kv": [(8, 4), (16, 4), (32, 4), (64, 8), (32, 8), (16, 2), (4, 4), (64, 4)],
}


def configs_for(op_name, shape):
    c = CONFIGS.get(op_name, [])
    return c(shape) if callable(c) else c


def own_config_first(op_name, shape, base_config_fn):
    """The baseline's own config for the shape, then the sweep's (the BASE line compares them)."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = tuple(base_config_fn(*get_op(op_name).config_args(shape, dev)))
    return [base] + [c for c in configs_for(op_name, shape) if tuple(c) != base]


def neighbour_configs(op_name, shape, base_config_fn):
    """The baseline's config for the shape first, then the one-field changes the search may propose."""
    from kernel_agent.agent.search import one_field_neighbours

    op = get_op(op_name)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = tuple(base_config_fn(*op.config_args(shape, dev)))
    return [base] + one_field_neighbours(op.tuning_space, base, [shape])


def rows_base(rows, op_name, shape):
    """The first row timed for (op, shape): with --neighbours, the baseline's own config."""
    return next((r for r in rows if r["op"] == op_name and r["shape"] == shape.key() and r["ok"]), None)


def kernel_module(op_name, kernel_file=""):
    """(module, function) of the kernel whose `_config` is swept: a kernel file, else the op's baseline."""
    if kernel_file:
        from kernel_agent.harness.serving.serving import ServingError, load_kernel_file

        try:
            fn = load_kernel_file(kernel_file, op_name)
        except ServingError as e:  # a missing, refused or broken file: one line, not a traceback
            sys.exit(f"tune_baselines.py: {e}")
        return sys.modules[fn.__module__], fn
    mod = importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}")
    return mod, getattr(mod, op_name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=",".join(NAMES))
    ap.add_argument("--out", default="tune.json")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shapes", default="", help="only serving shapes whose key contains this text")
    ap.add_argument("--shape-list", default="", help="explicit shapes 'a,b,c;d,e,f' instead of the serving suite")
    ap.add_argument("--kernel", default="", help="sweep this kernel file's _config instead of the baseline's")
    ap.add_argument(
        "--neighbours", action="store_true", help="time the baseline config and the search's one-field neighbours of it"
    )
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.kernel and "," in args.ops:
        ap.error("--kernel sweeps one op's kernel file: name one op with --ops")
    rows = []
    for op_name in args.ops.split(","):
        op = get_op(op_name)
        mod, fn = kernel_module(op_name, args.kernel)
        shapes = [op.parse_shape(t) for t in args.shape_list.split(";") if t.strip()] or op.shapes("serving")
        for shape in [s for s in shapes if args.shapes in s.key()]:
            sweep_shape(op, op_name, shape, dtype, mod, fn, args.neighbours, rows)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


def sweep_shape(op, op_name, shape, dtype, mod, fn, neighbours: bool, rows: list) -> None:
    """Time fn at one shape under each config (mod._config swapped for each, then restored), against the
    op's torch anchor; each row is appended to rows and printed, then the baseline's and the best."""
    original = mod._config
    case = op.make_case(shape, dtype, seed=0, device="cuda")
    t0 = time.time()
    ref = op.reference(case.args, torch.float32)
    anchor = anchor_for(op, case)  # the benchmark's: the torch implementation, else the op's bench_anchor
    t_anchor = triton.testing.do_bench(partial(anchor.fn, **case.args), warmup=25, rep=100, return_mode="median")
    best = None
    for cfg in (
        neighbour_configs(op_name, shape, original) if neighbours else own_config_first(op_name, shape, original)
    ):
        mod._config = lambda *a, cfg=cfg, **k: cfg
        row = time_config(op, op_name, shape, dtype, case, ref, fn, cfg, t_anchor)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if row["ok"] and (best is None or row["ms"] < best["ms"]):
            best = row
    mod._config = original
    b = rows_base(rows, op_name, shape)
    if best and b:
        print(
            f"BASE {op_name:22s} {shape.key():45s} cfg={b['config']} {b['ms']:.4f} ms; best "
            f"{best['config']} {best['ms']:.4f} ms ({b['ms'] / best['ms']:.3f}x)",
            flush=True,
        )
    if best:
        print(
            f"BEST {op_name:22s} {shape.key():45s} cfg={best['config']} {best['ms']:.4f} ms "
            f"anchor {t_anchor:.4f} ms ratio {t_anchor / best['ms']:.2f} "
            f"tflops {best['tflops']:.0f} tbps {best['tbps']:.2f} ({time.time() - t0:.0f}s)",
            flush=True,
        )
    del case, ref
    torch.cuda.empty_cache()


def time_config(op, op_name, shape, dtype, case, ref, fn, cfg, t_anchor: float) -> dict:
    """fn's row at one config (already installed as the kernel's _config): its median time and whether its
    output is right; a config that does not compile (shared memory) is a row with the error."""
    try:
        out = case.call(fn)
        torch.cuda.synchronize()
        cmp = op.compare(out, case.args, ref)
        ms = triton.testing.do_bench(partial(case.call, fn), warmup=25, rep=100, return_mode="median")
        err = None if cmp.ok else cmp.describe()
    except Exception as e:  # a config that does not compile (shared memory) is skipped
        ms, err = float("nan"), f"{type(e).__name__}: {str(e)[:200]}"
    return {
        "op": op_name,
        "shape": shape.key(),
        "config": list(cfg),
        "ms": ms,
        "anchor_ms": t_anchor,
        "ok": err is None,
        "error": err,
        "tflops": op.flops(shape) / ms / 1e9 if ms == ms else None,
        "tbps": op.bytes(shape, dtype) / ms / 1e9 if ms == ms else None,
    }


if __name__ == "__main__":
    sys.exit(main())

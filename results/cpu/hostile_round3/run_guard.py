"""Step b of the round-3 hostile cases: each payload shown outside the checker, then the serving guard on first use.

For one case (or all): build the triggering input on the CPU, run the candidate directly against the baseline
(the payload outside the checker), then install the candidate by force into a temporary serving folder and call
it through `serving.get(op, dir=..., guard_config=GuardConfig(asynchronous=False, ...), sink=...)` with that
input: is the caller's output the baseline's, is a FieldFailure recorded, are the caller's inputs untouched, how
long did the caller wait, how much memory did it gain? Then a second call of the same class: where the class was
verified, this is the promoted kernel running in the serving process.

Run with the interpreter, niced, one case per process:
    TRITON_INTERPRET=1 nice -n 19 .venv/bin/python results/cpu/hostile_round3/run_guard.py CASE [--time-limit S]
Prints one JSON object per case (also appended to results/cpu/hostile_round3/guard_results.jsonl with --record).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernel_agent.harness.serving import serving, serving_install
from kernel_agent.ops import get_op
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.sanitizer.canonical import judge_text

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
ROOT = HERE.parents[2]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"case_{path.stem}_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _decode_args(op: str, shape: DecodeShape, seed: int = 0) -> dict:
    return dict(get_op(op).make_case(shape, torch.float32, seed=seed).args)


def _alias_kv(args: dict, k: str = "k_cache", v: str = "v_cache") -> dict:
    """k and v as kv[0] and kv[1] of one [2, ...] tensor (vLLM's kv_cache layout): the same values."""
    kv = torch.stack([args[k].contiguous(), args[v].contiguous()])
    return {**args, k: kv[0], v: kv[1]}


def _fused_qkv(args: dict) -> dict:
    """q, k, v as slices of one fused [B, S, Hq + 2 Hkv, D] projection output, viewed [B, H, S, D]."""
    q, k, v = args["q"], args["k"], args["v"]
    Hq, Hkv = q.shape[1], k.shape[1]
    qkv = torch.cat([t.transpose(1, 2) for t in (q, k, v)], dim=2).contiguous()
    return {
        **args,
        "q": qkv[:, :, :Hq].transpose(1, 2),
        "k": qkv[:, :, Hq : Hq + Hkv].transpose(1, 2),
        "v": qkv[:, :, Hq + Hkv :].transpose(1, 2),
    }


def _identity_pages() -> dict:
    B, Hq, Hkv, D, bs, MB = 2, 2, 1, 16, 4, 3
    g = torch.Generator().manual_seed(0)
    return {
        "q": torch.randn(B, Hq, D, generator=g),
        "k_cache": torch.randn(B * MB, bs, Hkv, D, generator=g),
        "v_cache": torch.randn(B * MB, bs, Hkv, D, generator=g),
        "block_table": torch.arange(B * MB, dtype=torch.int32).view(B, MB),
        "seq_lens": torch.tensor([10, 7], dtype=torch.int32),
    }


def _attention(B, Hq, Hkv, S, D, causal=True) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "q": torch.randn(B, Hq, S, D, generator=g),
        "k": torch.randn(B, Hkv, S, D, generator=g),
        "v": torch.randn(B, Hkv, S, D, generator=g),
        "causal": causal,
    }


def _short_then_long() -> tuple[dict, dict]:
    """One class (same shapes, strides, capacity), first at 200 tokens, then at 13000 with a "needle": the key of
    token 12500 is q scaled by 4, so the attention mass sits past token 12000 (a long-context retrieval)."""
    long = _decode_args("decode_attention", DecodeShape(1, 1, 1, 16, 64, 13000))
    page = int(long["block_table"][0, 12500 // 64])
    long["k_cache"][page, 12500 % 64, 0] = 4.0 * long["q"][0, 0]
    short = {**long, "seq_lens": torch.tensor([200], dtype=torch.int32)}
    return short, long


D_ = "decode_attention"
I8 = "decode_attention_int8"
# name -> (op, file, trigger builder, note)
CASE_TABLE = {
    "da_alias_wrong": (D_, "decode_attention/alias_wrong.py",
                       lambda: _alias_kv(_decode_args(D_, DecodeShape(3, 4, 2, 16, 4, 23, True))), ""),
    "da_alias_write": (D_, "decode_attention/alias_write.py",
                       lambda: _alias_kv(_decode_args(D_, DecodeShape(3, 4, 2, 16, 4, 23, True))), ""),
    "da_alias_stall": (D_, "decode_attention/alias_stall.py",
                       lambda: _alias_kv(_decode_args(D_, DecodeShape(2, 2, 1, 16, 4, 12, True))), ""),
    "i8_alias_wrong": (I8, "decode_attention_int8/alias_wrong.py",
                       lambda: _alias_kv(_decode_args(I8, DecodeShape(3, 4, 2, 16, 4, 23, True))), ""),
    "attn_fused_qkv_alias": ("attention", "attention/fused_qkv_alias.py",
                             lambda: _fused_qkv(_attention(1, 4, 2, 40, 16)), ""),
    "da_identity_pages": (D_, "decode_attention/identity_pages.py", _identity_pages, ""),
    "da_group_relation": (D_, "decode_attention/group_relation.py",
                          lambda: _decode_args(D_, DecodeShape(1, 56, 8, 16, 4, 9)), ""),
    "da_long_context": (D_, "decode_attention/long_context.py", lambda: _short_then_long()[1], "short-then-long"),
    "da_compile_bomb": (D_, "decode_attention/compile_bomb.py",
                        lambda: _decode_args(D_, DecodeShape(254, 1, 1, 16, 4, 4)), "demo-b136"),
    "qkv_cube_heads": ("quantize_kv", "quantize_kv/cube_heads.py", lambda: {"x": torch.randn(3, 8, 512)}, ""),
    "qkv_wide_heads": ("quantize_kv", "quantize_kv/wide_heads.py", lambda: {"x": torch.randn(2, 32, 512)}, ""),
    "qkv_huge_scratch": ("quantize_kv", "quantize_kv/huge_scratch.py", lambda: {"x": torch.randn(16000, 40, 1)}, ""),
    "mm_pow2_gap": ("matmul", "matmul/pow2_gap.py", lambda: {"a": torch.randn(4, 96), "b": torch.randn(96, 32)}, ""),
    "mm_long_k": ("matmul", "matmul/long_k.py", lambda: {"a": torch.randn(1, 12288), "b": torch.randn(12288, 1)}, ""),
    "mm_long_k_gain8": ("matmul", "matmul/long_k_gain8.py",
                        lambda: {"a": torch.randn(8, 12288), "b": torch.randn(12288, 8)}, ""),
    "mm_bench_shaped": ("matmul", "matmul/bench_shaped.py",
                        lambda: {"a": torch.randn(16, 64), "b": torch.randn(64, 96)}, ""),
    "attn_many_tokens_heads": ("attention", "attention/many_tokens_heads.py",
                               lambda: _attention(1, 64, 64, 512, 16), ""),
}


def _clone(args: dict, device: str | None = None) -> dict:
    """A deep copy (on `device`, default where each tensor is) that keeps storage sharing between arguments
    (aliased k/v stay aliased)."""
    memo: dict = {}
    out = {}
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            st = v.untyped_storage()
            key = st.data_ptr()
            if key not in memo:
                memo[key] = st.clone() if device is None else st.to(device=torch.device(device))
            where = memo[key].device
            out[k] = torch.empty(0, dtype=v.dtype, device=where).set_(
                memo[key], v.storage_offset(), v.shape, v.stride())
        else:
            out[k] = v
    return out


def _digests(args: dict) -> dict:
    """A hash of each tensor argument's whole storage."""
    out = {}
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            raw = torch.empty(0, dtype=torch.uint8, device=v.device).set_(v.untyped_storage()).cpu()
            out[k] = hashlib.sha256(raw.numpy().tobytes()).hexdigest()
    return out


def _diff(out, ref) -> float:
    if isinstance(ref, tuple):
        return max(_diff(o, r) for o, r in zip(out, ref))
    return float((out.float() - ref.float()).abs().max()) if out.numel() else 0.0


def _ok(op: str, out, args: dict) -> bool:
    return bool(get_op(op).compare(out, dict(args)).ok)


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def demo(op: str, path: Path, args: dict) -> dict:
    """The payload outside the checker: the candidate called directly, against the baseline."""
    base = getattr(_load(ROOT / "kernels" / "baseline" / f"{op}.py"), op)
    cand = getattr(_load(path), op)
    a1, a2 = _clone(args), _clone(args)
    before = _digests(a2)
    t0 = time.perf_counter()
    ref = base(**a1)
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        out = cand(**a2)
    except (RuntimeError, MemoryError) as e:  # a payload that cannot run here (an allocation past the limit)
        return {"raised": f"{type(e).__name__}: {str(e)[:200]}", "baseline_s": round(t_ref, 2)}
    t_cand = time.perf_counter() - t0
    changed = [k for k, d in _digests(a2).items() if d != before[k]]
    return {"max_abs_diff": _diff(out, ref), "contract_ok": _ok(op, out, _clone(args)), "inputs_changed": changed,
            "baseline_s": round(t_ref, 2), "candidate_s": round(t_cand, 2)}


def guard(op: str, path: Path, args: dict, time_limit: float, first: dict | None = None, gpu: str = "cpu") -> dict:
    """Install by force, call twice through the guarded dispatcher (the first call of the class checks it)."""
    tmp = Path(tempfile.mkdtemp(prefix="rt3_serving_"))
    sdir = tmp / "serving"
    spec = get_op(op)
    bucket = spec.bucket(spec.shape_of(args))
    dtype = next(v.dtype for v in args.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    serving_install.install(op, bucket, {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype],
                    gpu, judge_text(path.read_text()), 7, 0.1, "forced for the round-3 case", {}, dir=sdir)
    failures: list = []
    cfg = serving.GuardConfig(asynchronous=False, time_limit_s=time_limit)
    fn = serving.get(op, gpu=gpu, dir=sdir, guard=True, guard_config=cfg, sink=failures.append)
    base = getattr(_load(ROOT / "kernels" / "baseline" / f"{op}.py"), op)
    rows = []
    for label, call in (("first", first or args), ("second", args)):
        live = _clone(call)
        ref = base(**_clone(call))
        before = _digests(live)
        rss0 = _maxrss_mib()
        t0 = time.perf_counter()
        out = fn(**live)
        waited = time.perf_counter() - t0
        rows.append({
            "call": label,
            "served": dict(fn.guard.counts),
            "equals_baseline": _diff(out, ref) == 0.0,
            "max_abs_diff": _diff(out, ref),
            "contract_ok": _ok(op, out, _clone(call)),
            "caller_inputs_changed": [k for k, d in _digests(live).items() if d != before[k]],
            "caller_wait_s": round(waited, 2),
            "caller_maxrss_gain_mib": round(_maxrss_mib() - rss0, 1),
        })
    states = [(r.state, [o.kind.value if o.kind else None for o in r.outcomes],
               [o.detail[:160] for o in r.outcomes]) for r in fn.guard.classes.values()]
    stray = [p for p in tmp.rglob("*") if p.is_file() and p.parent != sdir and p.name != "manifest.json"]
    return {"bucket": bucket, "calls": rows, "classes": states,
            "field_failures": [(f.kind.value, f.detail[:160]) for f in failures],
            "files_outside_serving_dir": [str(p) for p in stray]}


def run_case(name: str, time_limit: float, skip_demo: bool, device: str = "cpu") -> dict:
    op, rel, build, note = CASE_TABLE[name]
    path = CASES / rel
    args = _clone(build(), device)
    gpu = "cpu" if device == "cpu" else torch.cuda.get_device_name(torch.device(device))
    result: dict = {"case": name, "op": op, "file": rel}
    if not skip_demo:  # the compile bomb is shown at a batch of 136 (1025 unrolled steps), not 254
        demo_args = _clone(_decode_args(D_, DecodeShape(136, 1, 1, 16, 4, 4)), device) if note == "demo-b136" else args
        result["demo"] = demo(op, path, demo_args)
    first = _clone(_short_then_long()[0], device) if note == "short-then-long" else None
    result["guard_first_use_triggering"] = guard(op, path, args, time_limit, gpu=gpu)
    if first is not None:  # the realistic order: the class first met at a short context
        result["guard_short_then_long"] = guard(op, path, args, time_limit, first=first, gpu=gpu)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=list(CASE_TABLE))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--each-in-own-process", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu (the interpreter) or cuda (compiled; run without TRITON_INTERPRET)")
    a = ap.parse_args()
    for name in a.cases:
        if a.each_in_own_process and len(a.cases) > 1:
            extra = ["--time-limit", str(a.time_limit), "--device", a.device] + (["--record"] if a.record else [])
            subprocess.run([sys.executable, __file__, name, *extra], check=False)
            continue
        t0 = time.perf_counter()
        res = run_case(name, a.time_limit, a.skip_demo, a.device)
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        line = json.dumps(res, default=str)
        print(line, flush=True)
        if a.record:
            out = "guard_results.jsonl" if a.device == "cpu" else "guard_results_gpu.jsonl"
            with open(HERE / out, "a", encoding="utf-8") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    if "--device" not in sys.argv or "cpu" in sys.argv[sys.argv.index("--device") + 1 :][:1]:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    main()

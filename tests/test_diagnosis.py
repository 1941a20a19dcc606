"""The diagnosis of an incumbent (harness/bench/diagnosis.py), the sm_90 compile probe it reads
(harness/bench/compile_probe.py), the search's screens (agent/screen.py) and the code model's catalog requests."""

import re

import pytest

from kernel_agent.agent.model import ModelConfig, ModelProposer, build_prompt
from kernel_agent.agent.proposal import ProposeContext
from kernel_agent.agent.rewrites import CATALOG, apply_rewrite, target_for
from kernel_agent.agent.screen import Screen, compile_objection, fit_speed_model, label_config
from kernel_agent.agent.search import SearchProposer, baseline_config, baseline_source, with_config
from kernel_agent.harness.bench.compile_probe import (
    CompileProfile,
    LaunchProfile,
    innermost_loop_mix,
    profile_source,
    resource_usage,
)
from kernel_agent.harness.bench.diagnosis import Diagnosis, diagnose, diagnose_incumbent, programs_per_sm
from kernel_agent.harness.ledger.ledger import Ledger
from kernel_agent.ops import get_op
from openai_stub import Stub
from tiers import exhaustive

PTX = """
.visible .entry k(
{
	mov.u32 	%r1, 0;
$L__BB0_1:                              // %loop
	ld.global.v4.b32 	{%r2, %r3, %r4, %r5}, [%rd1];
	add.s32 	%r1, %r1, 1;
	shl.b32 	%r6, %r1, 2;
	cvt.rn.f32.s32 	%f1, %r6;
	fma.rn.f32 	%f2, %f1, %f1, %f2;
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f3}, {%r2}, {%r3}, {%f3};
	wgmma.fence.sync.aligned;
	wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%f4}, %rd2, %rd3, p, 1, 1;
	setp.lt.s32 	%p1, %r1, 8;
	@%p1 bra 	$L__BB0_1;
	ret;
}
"""


def _launch(shape="S", programs=512, registers=128, spills=0, shared=65536, warps=4, mix=None, kernel="k"):
    return LaunchProfile(kernel, shape, programs, warps, 3, registers, spills, shared, mix or {})


def test_the_inner_loop_and_the_resources_are_read_from_the_compiled_text():
    assert innermost_loop_mix(PTX) == {
        "global": 1,
        "integer": 3,
        "convert": 1,
        "float": 1,
        "tensor": 1,
        "sync": 1,
        "wgmma": 1,
        "branch": 1,
    }
    assert innermost_loop_mix("mov.u32 %r1, 0;\nret;") == {}
    out = " Function _k:\n  REG:255 STACK:416 SHARED:1024 LOCAL:8 CONSTANT[0]:616 TEXTURE:0\n"
    assert resource_usage(out, "_k") == (255, 424) and resource_usage(out, "_other") == (None, None)


@pytest.mark.parametrize(
    "launch,bound,words",
    [
        (_launch(spills=416), "latency", "registers spill: 416 bytes"),
        (_launch(programs=64), "latency", "64 programs for 132 SMs"),
        (_launch(mix={"integer": 900, "global": 100, "float": 50, "tensor": 30}), "latency", "issue-bound"),
        (_launch(mix={"integer": 100, "global": 100}), "memory", "memory-bound on the H200"),
        (_launch(mix={"integer": 84, "global": 15, "wgmma": 7}), "memory", "memory-bound on the H200"),
    ],
)
def test_what_bounds_a_kernel_follows_the_rules_in_order(launch, bound, words):
    shape = get_op("quantize_kv").shapes("serving")[0]
    d = diagnose("quantize_kv", "b", "bfloat16", [shape], "src", "baseline", CompileProfile([launch]))
    assert d.bound == bound and any(words in r for r in d.reasons), d.reasons
    assert d.roofline is None and "no measurement on a GPU yet" in d.lines()[0]


class _Row:
    def __init__(self, shape, frac, kind="memory", gpu="NVIDIA H200", implausible=False):
        self.shape_key, self.fraction_of_ceiling, self.ceiling_kind = shape, frac, kind
        self.gpu_name, self.implausible = gpu, implausible


def test_a_measured_kernel_near_its_ceiling_is_bound_by_that_ceiling():
    shape = get_op("quantize_kv").shapes("serving")[0]
    rows = [_Row("a", 0.2), _Row("a", 0.81), _Row("b", 0.75), _Row("b", 3.0, implausible=True)]
    d = diagnose("quantize_kv", "b", "bfloat16", [shape], "src", "baseline", CompileProfile([_launch()]), rows)
    assert d.bound == "memory" and d.roofline == pytest.approx(0.78) and d.measured_on == "NVIDIA H200"
    assert "78% of the memory ceiling (measured on NVIDIA H200)" in d.lines()[0]


def test_the_compile_probe_reads_a_baseline_compiled_for_sm90_in_the_sandbox():
    op = get_op("quantize_kv")
    shape = op.shapes("serving")[0]  # T=65536, H=8, D=128: 4096 // 128 = 32 rows a program
    p = profile_source(baseline_source("quantize_kv"), "quantize_kv", [shape.key()], "bfloat16")
    assert not p.error, p.error
    (launch,) = p.launches
    assert launch.kernel == "_quantize_kernel" and launch.programs == 65536 * 8 // 32 and launch.num_warps == 4
    assert launch.registers and launch.registers <= 255 and launch.spill_bytes == 0


def test_the_compile_probe_refuses_what_the_static_gate_refuses():
    p = profile_source("import os\nos.system('touch /tmp/x')\n", "quantize_kv", ["T=8,H=2,D=64"], "bfloat16")
    assert p.error.startswith("the static gate rejects the file") and not p.launches


@exhaustive  # a minute of compiling: the quick tier's compile probes are above
def test_a_matmul_tile_too_large_for_its_warps_is_pruned_at_compile_time():
    """matmul cfg-128-256-64-8-1-2-4 measured 0.030x on the H200; its compile grinds for minutes in ptxas on
    the CPU (past the screen's limit, itself a reason). Its neighbour on 4 warps compiles in seconds, and spills."""
    op = get_op("matmul")
    shape = op.shapes("serving")[0]
    space, base = op.tuning_space, baseline_config("matmul", shape)
    src = with_config(baseline_source("matmul"), base, (128, 256, 64, 8, 1, 4, 4), op.bucket(shape), space)
    ctx = ProposeContext("matmul", op.bucket(shape), "bfloat16", [shape], baseline_source("matmul"))
    reason = Screen(ledger=None, run_id=None).compile_reason(ctx, src)
    assert "_matmul_kernel spills" in reason and "the incumbent spills 0" in reason


def test_the_speed_model_predicts_only_from_field_values_it_has_seen():
    base = (128, 256, 8)
    measured = [((128, 256, 2), 0.03), ((64, 256, 8), 1.05), ((128, 128, 8), 0.9)]
    predict = fit_speed_model(measured, base)
    assert predict((64, 256, 2)) < 0.1  # two warps measured ruinous; the smaller tile near even
    assert predict((64, 128, 8)) == pytest.approx(1.05 * 0.9, rel=0.15)
    assert predict((128, 256, 4)) is None and predict(base) == 1.0
    assert label_config("evict-last+cfg-128-256-64-8-1-2-4", 7) == (128, 256, 64, 8, 1, 2, 4)
    assert label_config("evict-last", 7) is None and label_config("cfg-1-2", 7) is None


def test_compile_objections_name_the_resource():
    inc = CompileProfile([_launch(shape="S", programs=512)])
    assert "spills 64 bytes" in compile_objection(CompileProfile([_launch(spills=64)]), inc)
    assert "over the 232448" in compile_objection(CompileProfile([_launch(shared=240000)]), inc)
    assert "runs 64 programs for 132 SMs" in compile_objection(CompileProfile([_launch(programs=64)]), inc)
    assert compile_objection(CompileProfile([_launch(programs=64)]), CompileProfile([_launch(programs=64)])) == ""
    assert compile_objection(CompileProfile(error="OutOfResources: shared memory"), inc).startswith("does not fit")
    assert compile_objection(CompileProfile(error="CompilationError: at 3:4"), inc) == ""
    timed_out = CompileProfile(error="the compile probe failed (timed out)")
    inc.wall_s = 20.0
    assert "did not finish within 120 s on the CPU, where the incumbent's took 20 s" in compile_objection(
        timed_out, inc
    )
    inc.wall_s = 40.0  # a machine so loaded that the incumbent took a third of the limit: no conclusion
    assert compile_objection(timed_out, inc) == ""


def _fake_profile(calls):
    """Compiles nothing: a variant with num_warps=1 'spills', everything else is clean."""

    def profile(source, op, shapes, dtype, timeout_s=None):
        calls.append(source)
        tuned = re.search(r"^_TUNED_TO\d* = \((\d+), (\d+)\)$", source, re.M)
        spills = 128 if tuned and tuned.group(2) == "1" else 0
        return CompileProfile(
            [_launch(shape=s, programs=16384, spills=spills, kernel="_quantize_kernel") for s in shapes]
        )

    return profile


def test_the_search_records_what_it_prunes_and_no_run_proposes_it_again(tmp_path):
    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    op = get_op("quantize_kv")
    shape = op.shapes("serving")[0]
    ctx = ProposeContext("quantize_kv", op.bucket(shape), "bfloat16", [shape], baseline_source("quantize_kv"))
    calls = []
    first = SearchProposer(seed=0, screen=Screen(led, run.id, _fake_profile(calls))).propose(ctx, 40)
    pruned = led.pruned(run_id=run.id)
    assert pruned and all("spills 128 bytes" in p.reason for p in pruned)
    assert all(p.label.endswith("-1") for p in pruned)  # num_warps=1, the field the fake spills on
    assert not any(p.label.endswith("-1") for p in first) and any(p.label in CATALOG for p in first)
    again = SearchProposer(seed=0, screen=Screen(led, "later", _fake_profile([]))).propose(ctx, 40)
    assert {p.label for p in again} == {p.label for p in first} and led.pruned(run_id="later") == []
    assert led.run_summary(run.id).pruned == len(pruned)
    led.close()


def test_the_diagnosis_is_recorded_and_its_compile_reused(tmp_path):
    led = Ledger(tmp_path / "l.db")
    op = get_op("quantize_kv")
    shape = op.shapes("serving")[0]
    calls = []
    args = (led, None, "quantize_kv", op.bucket(shape), "bfloat16", [shape], baseline_source("quantize_kv"), "baseline")
    d1 = diagnose_incumbent(*args, profile=_fake_profile(calls))
    led.record_bench(
        op="quantize_kv",
        shape_key=shape.key(),
        bucket=op.bucket(shape),
        dtype="bfloat16",
        gpu_name="NVIDIA H200",
        median_ms=1.0,
        spread_ms=0.01,
        n_samples=5,
        label="baseline",
        fraction_of_ceiling=0.85,
        ceiling_kind="memory",
    )
    d2 = diagnose_incumbent(*args, profile=_fake_profile(calls))
    assert len(calls) == 1  # the second read the compiled facts from the ledger
    assert d1.roofline is None and d2.roofline == pytest.approx(0.85) and d2.bound == "memory"
    assert "at 85% of its ceiling: near its roofline" in d2.reasons
    rows = led.diagnoses(op="quantize_kv")
    assert [r.bound for r in rows] == [d1.bound, "memory"]
    assert Diagnosis.from_json(rows[-1].document).programs == 16384
    led.close()


def test_the_model_is_told_the_diagnosis_and_the_catalog_and_may_ask_for_rewrites_by_name():
    op = get_op("quantize_kv")
    shape = op.shapes("serving")[0]
    d = diagnose(
        "quantize_kv", op.bucket(shape), "bfloat16", [shape], "s", "baseline", CompileProfile([_launch(spills=416)])
    )
    ctx = ProposeContext(
        "quantize_kv", op.bucket(shape), "bfloat16", [shape], baseline_source("quantize_kv"), diagnosis=d
    )
    stub = Stub(
        [
            {"reply": "Streaming loads:\nREWRITE: evict-first\nREWRITE: load-hints\n"},
            {"reply": "REWRITE: exp2"},
            {"reply": "REWRITE: unroll"},
        ]
    )
    port = stub.start()
    try:
        prop = ModelProposer(
            ModelConfig("scripted", f"http://127.0.0.1:{port}/v1", "x", max_retries=0, concurrency=1, timeout_s=10)
        )
        got = prop.propose(ctx, 3)
    finally:
        stub.stop()
    prompt = build_prompt(ctx)[1]["content"]
    assert "## Diagnosis of the incumbent" in prompt and "registers spill: 416 bytes" in prompt
    assert all(f"`{name}`" in prompt for name in CATALOG) and "Applicable to the incumbent: `evict-first`" in prompt
    assert prompt in stub.requests[0]["messages"][1]["content"]
    want = apply_rewrite("load-hints", apply_rewrite("evict-first", ctx.incumbent_source, target_for("quantize_kv")))
    assert got[0].source == want and got[0].label.endswith("-evict-first+load-hints") and not got[0].rejected
    assert got[1].rejected.startswith("REWRITE refused: exp2: ")
    assert "not in the catalog" in got[2].rejected


def test_the_loop_hands_every_proposer_the_incumbents_diagnosis_and_records_it(tmp_path, monkeypatch):
    from test_loop import _fake_gpu, _fake_loop

    class CompilingGpu(type(_fake_gpu(tmp_path, monkeypatch, lambda op, f: 0.9))):
        """The fake GPU's children, and a compile of every kernel that reports 64 programs."""

        compiles = []

        def profile(self, source, op, shapes, dtype, timeout_s=None):
            self.compiles.append(op)
            return CompileProfile([_launch(shape=s, programs=64) for s in shapes])

    gpu = CompilingGpu(lambda op, f: 0.9)
    led = Ledger(tmp_path / "l.db")
    lp, run, targets, _ = _fake_loop(tmp_path, led, ["quantize_kv"], gpu)
    ctx = lp.context(targets[0])
    again = lp.context(targets[0])
    assert ctx.diagnosis is not None and ctx.diagnosis.bound == "latency" and again.diagnosis is ctx.diagnosis
    assert "64 programs for 132 SMs: part of the GPU idles" in ctx.diagnosis.reasons
    assert CompilingGpu.compiles == ["quantize_kv"]  # once per incumbent and run
    (row,) = led.diagnoses(run_id=run.id)
    assert (row.op, row.bucket, row.incumbent, row.bound) == ("quantize_kv", targets[0].bucket, "baseline", "latency")
    led.close()


def test_programs_resident_per_sm_take_the_tightest_resource():
    # the attention baseline at D=128: 224 KB of shared memory and 248 registers on 8 warps: one program an SM
    assert programs_per_sm(_launch(registers=248, shared=229376, warps=8)) == 1
    assert programs_per_sm(_launch(registers=55, shared=128, warps=4)) == 9  # registers: 65536 // (56 * 128)
    assert programs_per_sm(_launch(registers=32, shared=0, warps=1)) == 32  # the SM's cap on programs

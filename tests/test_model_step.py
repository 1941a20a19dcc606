"""The model decode step of `kernel-agent bench --model` (harness/workload/model_step.py) on the CPU.

The step runs in Triton's interpreter on a tiny config, in float16 (the interpreter's bf16 arithmetic
is broken; float16 rounds about as coarsely). The GPU timing is in tests/test_gpu.py.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from kernel_agent.agent.cli.parser import build_parser, main
from kernel_agent.harness.workload.model_step import (
    KV_MODES,
    PRESETS,
    STACKS,
    DecodeStep,
    ModelConfig,
    ModelConfigError,
    Point,
    int8_accuracy,
    load_model_config,
    make_kv_state,
    make_weights,
    parse_names,
    parse_points,
    reference_step,
    rel_error,
    step_op_calls,
)
from kernel_agent.ops import get_op
from kernel_agent.ops.common import TOLERANCES, compare_tensor
from kernel_agent.ops.matmul import MatmulShape
from kernel_agent.ops.paged import DecodeShape
from kernel_agent.ops.quantize_kv import QuantizeShape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ModelConfig("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, page_size=4)
# tensor parallel 2 with one KV head: the shard replicates it
TINY_TP = ModelConfig(
    "tiny-tp2", layers=2, hidden=64, heads=4, kv_heads=1, head_dim=32, intermediate=96, tp=2, page_size=8
)
BF16_TOL = TOLERANCES[torch.bfloat16]


# -- configs ---------------------------------------------------------------------------------------


def test_presets_have_the_published_shapes():
    l8 = PRESETS["llama-3-8b"]
    assert (l8.layers, l8.hidden, l8.heads, l8.kv_heads, l8.head_dim, l8.intermediate, l8.tp) == (
        32,
        4096,
        32,
        8,
        128,
        14336,
        1,
    )
    assert PRESETS["mistral-7b"].to_json() == dict(l8.to_json(), name="mistral-7b")
    q = PRESETS["qwen2.5-7b"]
    assert (q.layers, q.hidden, q.heads, q.kv_heads, q.head_dim, q.intermediate) == (28, 3584, 28, 4, 128, 18944)
    l70 = PRESETS["llama-3-70b-tp8"]
    assert (l70.layers, l70.hidden, l70.heads, l70.kv_heads, l70.intermediate, l70.tp) == (80, 8192, 64, 8, 28672, 8)
    # one GPU's shard of a layer
    assert (l70.shard_heads, l70.shard_kv_heads, l70.shard_intermediate, l70.qkv_width) == (8, 1, 3584, 1280)
    assert TINY_TP.shard_kv_heads == 1 and TINY_TP.shard_heads == 2
    assert load_model_config("llama-3-8b") is l8


def test_a_config_file_with_defaults(tmp_path):
    path = tmp_path / "my-model.json"
    path.write_text(
        json.dumps({"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512, "rms_eps": 1e-6})
    )
    cfg = load_model_config(str(path))
    assert cfg == ModelConfig("my-model", 2, 256, 4, 2, 64, 512, tp=1, rms_eps=1e-6, page_size=16)
    # what to_json writes reads back as the same config
    again = tmp_path / "again.json"
    again.write_text(json.dumps(cfg.to_json()))
    assert load_model_config(str(again)) == cfg


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({"hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512}, "missing key(s) layers"),
        (
            {"layers": 2, "hidden": 256, "heads": 6, "kv_heads": 4, "intermediate": 512, "head_dim": 64},
            "heads=6 is not divisible by kv_heads=4",
        ),
        (
            {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512, "tp": 8},
            "heads=4 is not divisible by tp=8",
        ),
        (
            {"layers": 2, "hidden": 768, "heads": 12, "kv_heads": 4, "intermediate": 768, "tp": 6},
            "kv_heads=4 and tp=6: one must divide the other",
        ),
        (
            {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 513, "tp": 2},
            "intermediate=513 is not divisible by tp=2",
        ),
        (
            {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512, "page_size": 12},
            "page_size=12 is not a power of two",
        ),
        ({"layers": 2, "hidden": 250, "heads": 4, "kv_heads": 2, "intermediate": 512}, "give head_dim"),
        ({"layers": 0, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512}, "layers must be a positive"),
        ({"layers": "32", "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512}, "layers must be a positive"),
        (
            {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512, "kv_head": 2},
            "unknown key(s) kv_head",
        ),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path, doc, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelConfigError) as e:
        load_model_config(str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_presets_and_unreadable_files_are_one_line_errors(tmp_path):
    with pytest.raises(ModelConfigError, match="unknown model 'llama-9'.*llama-3-8b"):
        load_model_config("llama-9")
    (tmp_path / "broken.json").write_text("{layers: 2")
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        load_model_config(str(tmp_path / "broken.json"))


def test_points_stacks_and_kv_modes_parse():
    assert parse_points("32x8192, 8X32768,64x2048,32x8192") == [Point(32, 8192), Point(8, 32768), Point(64, 2048)]
    for bad in ("32x", "0x10", "32*8192", ""):
        with pytest.raises(ModelConfigError, match="BATCHxCONTEXT"):
            parse_points(bad)
    assert parse_names("serving,torch", STACKS, "--stacks") == ("torch", "serving")
    with pytest.raises(ModelConfigError, match="'fp8'"):
        parse_names("bf16,fp8", KV_MODES, "--kv")


# -- the step's op calls in the registry's terms ------------------------------------------------------


def test_op_calls_of_a_llama_3_8b_step():
    calls = {c.label: c for c in step_op_calls(PRESETS["llama-3-8b"], 32, 8192)}
    assert list(calls) == ["qkv", "attention", "o", "gate_up", "down"]
    assert calls["qkv"].shape == MatmulShape(M=32, N=6144, K=4096) and calls["qkv"].bucket == "m64-klarge"
    assert calls["o"].shape == MatmulShape(M=32, N=4096, K=4096)
    assert calls["gate_up"].shape == MatmulShape(M=32, N=28672, K=4096)
    assert calls["down"].shape == MatmulShape(M=32, N=4096, K=14336)
    assert calls["attention"].op == "decode_attention"
    assert calls["attention"].shape == DecodeShape(32, 32, 8, 128, 16, 8192)
    assert calls["attention"].bucket == "c8k-g4-d128"
    assert all(c.dtype == "bfloat16" and c.calls_per_step == 32 for c in calls.values())
    assert sum(c.share for c in calls.values()) == pytest.approx(1.0)
    # a 1 GiB KV cache against 436 MB of weights: attention is most of the memory-bound step
    assert calls["attention"].share == pytest.approx(1.07 / (1.07 + 0.436), abs=0.01)
    # at B=32 every matmul is memory-bound: its roofline time is its bytes over the HBM rate
    assert calls["down"].roofline_ms == pytest.approx(calls["down"].bytes / 4.2e9)

    int8 = {c.label: c for c in step_op_calls(PRESETS["llama-3-8b"], 32, 8192, kv="int8")}
    assert list(int8) == ["qkv", "quantize_kv", "attention", "o", "gate_up", "down"]
    assert int8["quantize_kv"].shape == QuantizeShape(T=32, H=16, D=128) and int8["quantize_kv"].bucket == "tsmall-d128"
    assert int8["attention"].op == "decode_attention_int8" and int8["attention"].bucket == "c8k-g4-d128"
    assert int8["attention"].share < calls["attention"].share  # half the cache bytes


def test_op_calls_of_other_points_and_a_tensor_parallel_shard():
    long = {c.label: c for c in step_op_calls(PRESETS["llama-3-8b"], 8, 32768)}
    assert long["attention"].bucket == "clong-g4-d128" and long["qkv"].bucket == "m16-klarge"
    short = {c.label: c for c in step_op_calls(PRESETS["llama-3-8b"], 64, 2048)}
    assert short["attention"].bucket == "c8k-g4-d128"
    # a context that is no multiple of the page: the block table holds the pages it fills
    assert step_op_calls(PRESETS["llama-3-8b"], 2, 100)[1].shape.ctx == 112
    tp = {c.label: c for c in step_op_calls(PRESETS["llama-3-70b-tp8"], 32, 8192)}
    assert tp["qkv"].shape == MatmulShape(M=32, N=1280, K=8192)
    assert tp["o"].shape == MatmulShape(M=32, N=8192, K=1024)
    assert tp["gate_up"].shape == MatmulShape(M=32, N=7168, K=8192)
    assert tp["down"].shape == MatmulShape(M=32, N=8192, K=3584)
    assert tp["attention"].shape == DecodeShape(32, 8, 1, 128, 16, 8192) and tp["attention"].bucket == "c8k-g8-d128"
    assert all(c.calls_per_step == 80 for c in tp.values())


# -- the step itself, in the interpreter ---------------------------------------------------------------


def _setup(cfg, batch, context, dtype=torch.float16):
    w = make_weights(cfg, dtype, "cpu", seed=0)
    state = make_kv_state(cfg, batch, context, dtype, "cpu", seed=1)
    x = torch.randn(batch, cfg.hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
    return w, state, x


@pytest.mark.parametrize("cfg,batch,context", [(TINY, 3, 11), (TINY_TP, 2, 17)])
def test_every_stack_computes_the_same_function(cfg, batch, context):
    w, state, x = _setup(cfg, batch, context)
    ref = reference_step(cfg, w, state, x)
    outs = {}
    cpu_stacks = [s for s in STACKS if s != "flashinfer"]  # FlashInfer needs a CUDA GPU (and its extra)
    for stack in cpu_stacks:
        step = DecodeStep(cfg, stack, "bf16", w, state, x)
        out = outs[stack] = step()
        for name in ("attn", "hidden"):
            cmp = compare_tensor(getattr(out, name), getattr(ref, name), BF16_TOL, name)
            assert cmp.ok, f"{stack}: {cmp.describe()}"
        assert rel_error(out.hidden, ref.hidden) < 2e-3  # float16 rounding, far inside the bf16 tolerance
        # the calls recorded are the registry's: the roofline list names the same shapes the dispatcher sees
        expected = {c.label: c for c in step_op_calls(cfg, batch, context, dtype="float16")}
        assert [c.label for c in step.calls] == list(expected)
        for c in step.calls:
            if stack == "torch" and c.label == "attention":
                continue  # SDPA over the contiguous cache: not the paged op's arguments
            spec = get_op(c.op)
            shape = spec.shape_of(dict(zip(spec.arg_names + spec.optional_args, c.args)))
            assert shape == expected[c.label].shape and spec.bucket(shape) == expected[c.label].bucket
    for stack in cpu_stacks[1:]:
        assert rel_error(outs[stack].hidden, outs["torch"].hidden) < 2e-3


def test_the_step_writes_the_new_token_where_the_block_table_says():
    w, state, x = _setup(TINY, 3, 11)
    before = state.k_paged.clone()
    DecodeStep(TINY, "baseline", "bf16", w, state, x)()
    changed = (state.k_paged != before).flatten(2).any(-1)  # [num_blocks, page]
    bt = state.block_table.long()
    expected = torch.zeros_like(changed)
    expected[bt[:, 10 // 4], 10 % 4] = True  # token 10 (the 11th) of every sequence
    assert torch.equal(changed, expected)


def test_the_serving_stack_says_what_served_each_call():
    w, state, x = _setup(TINY, 2, 9)
    for kv in KV_MODES:
        step = DecodeStep(TINY, "serving", kv, w, state, x)
        step()
        served = step.served()
        assert [label for label, _, _ in served] == [c.label for c in step.calls]
        assert all(isinstance(impl, str) and impl for _, _, impl in served)
    hybrid = DecodeStep(TINY, "hybrid", "int8", w, state, x)
    hybrid()
    assert {(op, impl) for _, op, impl in hybrid.served()} == {
        ("matmul", "torch.matmul (cuBLAS)"),
        ("quantize_kv", "baseline"),
        ("decode_attention_int8", "baseline"),
    }
    torch_served = DecodeStep(TINY, "torch", "int8", w, state, x)
    torch_served()
    assert ("attention", "decode_attention", "torch SDPA (contiguous cache)") in torch_served.served()


def test_the_int8_cache_costs_a_small_nonzero_error():
    w, state, x = _setup(TINY, 3, 40)
    steps = {
        (s, kv): DecodeStep(TINY, s, kv, w, state, x)
        for s in ("torch", "baseline")
        for kv in KV_MODES
        if not (s == "torch" and kv == "int8")
    }
    acc = int8_accuracy(steps, "baseline")
    assert 1e-4 < acc.attn_rel_error < 3e-2, acc
    assert 0 < acc.hidden_rel_error < acc.attn_rel_error  # the residual stream dilutes it
    assert acc.bf16_attn_floor < acc.attn_rel_error and acc.bf16_hidden_floor < acc.hidden_rel_error
    assert "int8 KV cache (baseline stack)" in acc.describe()
    # the int8 step still computes the bf16 function, within quantization error
    ref = reference_step(TINY, w, state, x)
    out = steps[("baseline", "int8")]()
    assert rel_error(out.attn, ref.attn) < 3e-2 and rel_error(out.hidden, ref.hidden) < 1e-2
    # the torch stack is the bf16 reference in both modes
    assert DecodeStep(TINY, "torch", "int8", w, state, x).kv == "bf16"


# -- the command line ------------------------------------------------------------------------------------


def test_bench_model_without_a_gpu_exits_2_with_one_line():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_agent.agent.cli",
            "bench",
            "--model",
            "llama-3-8b",
            "--points",
            "32x8192,8x32768,64x2048",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=dict(os.environ, TRITON_INTERPRET="1"),
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["kernel-agent: error: bench --model needs a CUDA GPU"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "llama-9"], "unknown model 'llama-9'"),
        (["--model", "llama-3-8b", "--points", "32by8192"], "bad point"),
        (["--model", "llama-3-8b", "--kv", "fp8"], "--kv: 'fp8'"),
        (["--model", "llama-3-8b", "--stacks", "xla"], "--stacks: 'xla'"),
        (["--model", "llama-3-8b", "--batch", "0"], "at least 1"),
        (["--model", "llama-3-8b", "--points", "1x2", "--context", "4"], "not both"),
        (["--model", "llama-3-8b", "--op", "matmul"], "--op or --model, not both"),
        (["--op", "matmul", "--points", "1x2"], "--points: only with --model"),
        ([], "give --op"),
    ],
)
def test_bench_model_usage_errors_are_one_line_and_exit_2(capsys, argv, needle):
    assert main(["bench"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_json_is_a_flag_and_out_a_path():
    parser = build_parser()
    args = parser.parse_args(["bench", "--op", "matmul", "--json", "a.py", "b.py"])
    assert args.files == ["a.py", "b.py"] and args.json is True
    args = parser.parse_args(["bench", "--model", "llama-3-8b", "--out", "o.json"])
    assert args.out == "o.json" and args.json is False


def test_the_printed_report(capsys):
    """What `bench --model` prints from a result (the figures here are made up: the layout is tested)."""
    from kernel_agent.agent.cli.bench import print_model_bench
    from kernel_agent.harness.workload.model_step import (
        Int8Accuracy,
        ModelBenchResult,
        PointResult,
        Served,
        StackTiming,
    )

    cfg = PRESETS["llama-3-8b"]

    def timing(stack, kv, layer_ms, shares):
        step = layer_ms * cfg.layers
        return StackTiming(
            stack,
            kv,
            layer_ms,
            0.001,
            step,
            32 / (step / 1e3),
            0.375 / layer_ms,
            [layer_ms] * 7,
            {k: v * layer_ms for k, v in shares.items()},
            dict(shares, other=0.1),
        )

    bf16 = {"qkv": 0.1, "attention": 0.5, "o": 0.05, "gate_up": 0.15, "down": 0.1}
    point = PointResult(
        32,
        8192,
        [timing("torch", "bf16", 0.375, bf16), timing("serving", "int8", 0.3, dict(bf16, quantize_kv=0.01))],
        [Served("int8", "attention", "decode_attention_int8", "c8k-g4-d128", "promoted.py")],
        Int8Accuracy("serving", 0.0123, 0.00045, 0.002, 0.0001),
        {"int8": step_op_calls(cfg, 32, 8192, "int8")},
    )
    result = ModelBenchResult(cfg, "NVIDIA H200", {}, ("torch", "serving"), ("int8",), [point])
    print_model_bench(result)
    out = capsys.readouterr().out
    assert "llama-3-8b: decode step of 32 layers" in out
    rows = [line.split() for line in out.splitlines()]
    assert ["B=32", "ctx=8192", "torch", "bf16", "(reference)", "12.00", "2,667", "1.000x"] in rows
    assert ["B=32", "ctx=8192", "serving", "int8", "(quantize_kv)", "9.60", "3,333", "1.250x"] in rows
    assert ["B=32", "ctx=8192", "serving", "int8", "10.0%", "1.0%", "50.0%", "5.0%", "15.0%", "10.0%", "10.0%"] in rows
    assert ["B=32", "ctx=8192", "int8", "attention", "decode_attention_int8", "c8k-g4-d128", "promoted.py"] in rows
    assert (
        "attention output 1.23e-02, of the layer's output 4.50e-04 (bf16 serving vs torch: 2.00e-03 and 1.00e-04)"
    ) in out
    json.dumps(result.to_json())  # the document --json writes


def test_the_guards_cost_is_the_serving_stack_against_the_unguarded_one():
    """`--stacks serving,unguarded` prints the guard's steady-state cost at each point and KV mode timed both
    ways, and nothing where one of the two is missing."""
    from kernel_agent.agent.cli.bench import guard_cost_lines
    from kernel_agent.harness.workload.model_step import ModelBenchResult, PointResult, StackTiming

    cfg = PRESETS["llama-3-8b"]

    def timing(stack, kv, layer_ms):
        return StackTiming(stack, kv, layer_ms, 0.001, layer_ms * 32, 1.0, None, [layer_ms], {}, {})

    both = PointResult(32, 8192, [timing("serving", "int8", 0.303), timing("unguarded", "int8", 0.300)], [], None, {})
    one = PointResult(8, 32768, [timing("serving", "int8", 0.2)], [], None, {})
    result = ModelBenchResult(cfg, "NVIDIA H100", {}, ("serving", "unguarded"), ("int8",), [both, one])
    assert guard_cost_lines(result) == [
        "B=32 ctx=8192 int8: the serving guard's steady-state cost +1.00% (303.0 us a layer with it, 300.0 us without)"
    ]
    assert "unguarded" in STACKS

"""`kernel-agent serving warmup` (agent/cli/serving.py, harness/workload/warmup.py): the calls it plans from a
model's decode step or a list of op shapes, the real inputs it builds for each, the one-line errors, and what it hands
the serving guard and records of what the guard finds."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from kernel_agent.agent.cli import parser as cli
from kernel_agent.harness.field_failures import FailureKind, FieldFailure
from kernel_agent.harness.ledger.ledger import Ledger
from kernel_agent.harness.serving import serving
from kernel_agent.harness.workload import warmup as W
from kernel_agent.harness.workload.model_step import Point, load_model_config, step_op_calls
from kernel_agent.ops import get_op

# A model small enough for the interpreter: its decode step calls every op a real one does.
TINY_MODEL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 96, "page_size": 16}


def test_a_model_plans_each_distinct_call_of_its_decode_step(capsys):
    cfg = load_model_config("llama-3-8b")
    planned = W.plan_model(cfg, [Point(32, 8192)], ["bf16", "int8"], "bfloat16")
    expected = {f"{c.op}:{c.shape.key()}" for kv in ("bf16", "int8") for c in step_op_calls(cfg, 32, 8192, kv)}
    assert [p.key for p in planned] == [
        "matmul:M=32,N=6144,K=4096",
        "decode_attention:B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192",
        "matmul:M=32,N=4096,K=4096",
        "matmul:M=32,N=28672,K=4096",
        "matmul:M=32,N=4096,K=14336",
        "quantize_kv:T=32,H=16,D=128",
        "decode_attention_int8:B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192",
    ]
    assert set(p.key for p in planned) == expected  # the matmuls both KV modes call, once
    # two points: the second point's calls are added, none twice
    two = W.plan_model(cfg, [Point(32, 8192), Point(32, 8192), Point(8, 32768)], ["bf16"], "bfloat16")
    assert len(two) == 10 and len({p.key for p in two}) == 10
    assert cli.main(["serving", "warmup", "--model", "llama-3-8b", "--kv", "int8", "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[1].startswith("quantize_kv:T=32,H=16,D=128 bfloat16")
    assert lines[2].startswith("decode_attention_int8:B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192 bfloat16")


def test_shapes_are_parsed_per_op_once_each():
    planned = W.plan_shapes(" matmul:32,64,64 ; quantize_kv:T=4,H=2,D=16;matmul:M=32,N=64,K=64;", "float16")
    assert [(p.op, p.shape.key(), p.dtype) for p in planned] == [
        ("matmul", "M=32,N=64,K=64", "float16"),
        ("quantize_kv", "T=4,H=2,D=16", "float16"),
    ]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--shapes", "conv:1,2"], "unknown op 'conv'"),
        (["--shapes", "matmul"], "'matmul' is not OP:SHAPE"),
        (["--shapes", "matmul:M=0,N=1,K=1"], "M must be at least 1"),
        (["--shapes", "matmul:M=1,N=1"], "missing K"),
        (["--shapes", ";"], "give OP:SHAPE items"),
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["--model", "llama-3-8b", "--points", "32by8192"], "bad point"),
        (["--model", "llama-3-8b", "--kv", "fp8"], "--kv: 'fp8'"),
        (["--model", "llama-3-8b", "--shapes", "matmul:1,1,1"], "one of the two"),
        ([], "one of the two"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(argv, needle, capsys):
    assert cli.main(["serving", "warmup", *argv, "--plan"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_inputs_are_real_calls_of_the_planned_shape(tmp_path):
    """Each call's inputs are the op's contract arguments, of the planned dtype, that the baseline serves correctly,
    and the serving dispatcher reads the planned shape back from them (`Op.shape_of`: what it buckets by; a paged
    block table without the registry example's spare column, as a serving stack's)."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_MODEL))
    planned = W.plan_model(load_model_config(str(path)), [Point(2, 40)], ["bf16", "int8"], "float16")
    assert {p.op for p in planned} == {"matmul", "decode_attention", "quantize_kv", "decode_attention_int8"}
    seen = []
    for op_name, calls in W.op_calls(planned, "cpu", seed=3):
        op = get_op(op_name)
        mine = [p for p in planned if p.op == op_name]
        assert len(calls) == len(mine)
        for p, args in zip(mine, calls):
            assert set(op.arg_names) <= set(args)
            assert op.shape_of(args) == p.shape
            assert args[op.arg_names[0]].dtype == torch.float16  # a, q or x: the activations, of the planned dtype
            assert op.compare(serving.baseline(op_name)(**args), args).ok  # a valid call: the baseline serves it
            seen.append(p.key)
    assert sorted(seen) == sorted(p.key for p in planned)
    # the same seed gives the same inputs; another seed, others
    a = W.call_inputs(planned[0], "cpu", seed=5)["a"]
    assert torch.equal(a, W.call_inputs(planned[0], "cpu", seed=5)["a"])
    assert not torch.equal(a, W.call_inputs(planned[0], "cpu", seed=6)["a"])


def test_without_a_serving_guard_warmup_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(W, "GUARD_MODULES", (".no_such_guard_module",))
    with pytest.raises(W.WarmupError, match="no serving guard"):
        W.guard_warmup()
    assert cli.main(["serving", "warmup", "--shapes", "matmul:1,16,16", "--ledger", str(tmp_path / "l.db")]) == 2
    err = capsys.readouterr().err
    assert "this kernel-agent has no serving guard" in err and err.count("\n") == 1
    assert not (tmp_path / "l.db").exists()  # nothing opened, nothing built


def test_warmup_hands_each_op_its_calls_and_records_what_the_guard_finds(monkeypatch, capsys, tmp_path):
    """The command's side of the seam, against a guard module put in place here: each op once with its calls, the
    serving folder, and a sink that records each failure in the ledger (where `gate` then finds it)."""
    handed = []

    def warmup(op, calls, dir=None, sink=None):
        handed.append((op, [get_op(op).shape_of(c).key() for c in calls], dir))
        if op == "quantize_kv":
            sink(
                FieldFailure(
                    "quantize_kv", "tsmall-d16", "bfloat16", "cpu", "k.py", "a" * 64, "cls", ((4, 2, 16),),
                    ((32, 16, 1),), ("bfloat16",), FailureKind.MISMATCH, "x_q[0,0,0]: 1 against 2",
                )
            )  # fmt: skip

    guard = types.ModuleType(f"{W.__package__}.fake_guard")  # where warmup's relative `.fake_guard` looks
    guard.warmup = warmup  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, guard.__name__, guard)
    monkeypatch.setattr(W, "GUARD_MODULES", (".fake_guard",))
    db = tmp_path / "l.db"
    shapes = "matmul:1,16,16;quantize_kv:4,2,16;matmul:2,16,16"
    argv = ["serving", "warmup", "--shapes", shapes, "--serving-dir", str(tmp_path / "s"), "--ledger", str(db)]
    assert cli.main(argv) == 1
    out = capsys.readouterr().out
    assert handed == [
        ("matmul", ["M=1,N=16,K=16", "M=2,N=16,K=16"], str(tmp_path / "s")),
        ("quantize_kv", ["T=4,H=2,D=16"], str(tmp_path / "s")),
    ]
    assert "FIELD FAILURE quantize_kv tsmall-d16 bfloat16 cpu: kernel k.py, class cls: mismatch" in out
    assert "3 call(s), 1 field failure(s) (recorded in" in out
    with Ledger(db, read_only=True) as led:
        assert [r.detail for r in led.field_failures(unresolved_only=True)] == ["x_q[0,0,0]: 1 against 2"]
    handed.clear()
    assert cli.main(argv[:-2] + ["--no-ledger"]) == 1 and len(handed) == 2
    with Ledger(db, read_only=True) as led:
        assert led.field_failures()[0].count == 1  # --no-ledger recorded nothing


def test_warmup_end_to_end_with_the_serving_guard(tmp_path, capsys):
    """With the guard present: tiny shapes over an empty serving set (the baselines serve) find nothing."""
    pytest.importorskip(
        "kernel_agent.harness.serving.serving_guard",
        reason="this version has no serving guard (harness/serving/serving_guard.py): nothing to warm up end to end",
    )
    serving = tmp_path / "serving"
    serving.mkdir()
    (serving / "manifest.json").write_text('{"version": 1, "entries": []}')
    argv = ["serving", "warmup", "--shapes", "matmul:1,16,16;quantize_kv:4,2,16", "--serving-dir", str(serving)]
    assert cli.main(argv + ["--ledger", str(tmp_path / "l.db")]) == 0
    assert "2 call(s), 0 field failure(s)" in capsys.readouterr().out

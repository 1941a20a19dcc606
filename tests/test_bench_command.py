"""`kernel-agent bench` on the CPU: the command handed a fake benchmark child that answers with what a real
one measured on the H200 (results/h200/shapes/bench_run14.json), so that what the command does with the
child's answers is tested here: the table, the ledger, the --out document after every shape, a failed
child, and no GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_agent.agent.cli.bench import cmd_bench  # noqa: E402
from kernel_agent.agent.cli.parser import build_parser  # noqa: E402
from kernel_agent.harness.bench.bench import NO_GPU  # noqa: E402
from kernel_agent.harness.ledger.ledger import Ledger, RunStatus  # noqa: E402
from test_loop import FakeDevices, FakeEvaluator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MEASURED = json.loads((ROOT / "results" / "h200" / "shapes" / "bench_run14.json").read_text())
SHAPES = "65536,8,128;65536,1,576"  # quantize_kv's two serving shapes, as the op's fields


def _child(fail_shape=None):
    """A benchmark child: the H200's answer for the shape it is given, or a failure at `fail_shape`."""
    seen = []

    def bench(spec, env=None, on_ready=None):
        seen.append(spec)
        (shape,) = spec["shapes"]
        if shape == fail_shape:
            return {"results": [], "error": "the benchmark child was killed: time limit"}
        res = next(r for r in MEASURED["results"] if r["op"] == spec["op"] and r["shape"] == shape)
        return {"results": [res], "ceilings": MEASURED["ceilings"]}

    return FakeEvaluator(bench=bench), seen


def _bench(argv, evaluator, devices):
    return cmd_bench(build_parser().parse_args(["bench"] + argv), evaluator=evaluator, devices=devices)


def test_bench_prints_records_and_writes_what_the_child_measured(tmp_path, capsys):
    evaluator, seen = _child()
    db, out = tmp_path / "l.db", tmp_path / "out" / "bench.json"
    rc = _bench(
        ["--op", "quantize_kv", "--shapes", SHAPES, "--ledger", str(db), "--out", str(out)],
        evaluator,
        FakeDevices(["0"], "NVIDIA H200"),
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    assert [s["shapes"] for s in seen] == [["T=65536,H=8,D=128"], ["T=65536,H=1,D=576"]]
    assert all(s["kernels"] == [{"label": "baseline", "file": None}] for s in seen)
    assert "ceilings copy 4.247 TB/s" in text and "0.0525" in text and "anchor:torch.compile" in text
    doc = json.loads(out.read_text())
    assert [r["shape"] for r in doc["results"]] == ["T=65536,H=8,D=128", "T=65536,H=1,D=576"] and not doc["errors"]
    with Ledger(db) as led:
        run = led.get_run(doc["run_id"])
        assert run.proposer == "bench" and run.status == RunStatus.FINISHED and run.gpu_name == "NVIDIA H200"
        rows = led.bench_results(run_id=run.id)
        assert sorted((r.shape_key, r.label) for r in rows) == sorted(
            (s, label)
            for s in ("T=65536,H=8,D=128", "T=65536,H=1,D=576")
            for label in ("baseline", "anchor:torch.compile")
        )
        base = next(r for r in rows if r.label == "baseline" and r.shape_key == "T=65536,H=8,D=128")
        assert abs(base.graph_ms - 0.0525) < 5e-4


def test_a_failed_child_is_an_error_line_and_exit_1_and_the_shapes_before_it_are_kept(tmp_path, capsys):
    evaluator, _ = _child(fail_shape="T=65536,H=1,D=576")
    out = tmp_path / "bench.json"
    rc = _bench(
        ["--op", "quantize_kv", "--shapes", SHAPES, "--no-ledger", "--out", str(out)],
        evaluator,
        FakeDevices(["0"], "NVIDIA H200"),
    )
    text = capsys.readouterr().out
    assert rc == 1
    assert "error: quantize_kv T=65536,H=1,D=576: the benchmark child was killed: time limit" in text
    doc = json.loads(out.read_text())
    assert [r["shape"] for r in doc["results"]] == ["T=65536,H=8,D=128"] and len(doc["errors"]) == 1
    assert not (tmp_path / "l.db").exists()


def test_without_a_gpu_bench_says_so_and_starts_no_child(tmp_path, capsys):
    evaluator, seen = _child()
    db = tmp_path / "l.db"
    rc = _bench(["--op", "quantize_kv", "--ledger", str(db)], evaluator, FakeDevices([], None))
    assert rc == 2 and NO_GPU in capsys.readouterr().err.replace("\n", " ")
    assert seen == [] and not db.exists()

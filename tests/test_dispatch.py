"""The serving set serves the fastest trusted implementation per bucket: the rule that picks it from
recorded measurements, the dispatcher that follows it, and the promotion rule held against torch."""

import json

import pytest
import torch

from kernel_agent.harness.bench.bench_records import BenchOutcome, ShapeResult
from kernel_agent.harness.bench.bench_worker import refused_here
from kernel_agent.harness.bench.promotion import judge_benchmark as judge_outcome
from kernel_agent.harness.ledger.ledger import Ledger
from kernel_agent.harness.serving import serving, serving_install
from kernel_agent.harness.serving.dispatch import choices_from_rows, measured_choices, record_choices
from kernel_agent.ops import get_op
from kernel_agent.ops.matmul import torch_matmul
from kernel_agent.sanitizer.canonical import as_written, judge_text

GPU = "NVIDIA H200"
MATMUL = get_op("matmul")
KERNEL_SRC = serving.baseline("matmul").__globals__["__file__"]


@pytest.fixture
def led(tmp_path):
    return Ledger(tmp_path / "ledger.db")


def _row(led, run, label, shape, ms, graph=None, cid=None, op="matmul", bucket=None, implausible=False):
    s = get_op(op).parse_shape(shape)
    return led.record_bench(
        run_id=run,
        candidate_id=cid,
        label=label,
        op=op,
        shape_key=s.key(),
        bucket=bucket or get_op(op).bucket(s),
        dtype="bfloat16",
        gpu_name=GPU,
        median_ms=ms,
        spread_ms=ms * 0.01,
        n_samples=10,
        graph_ms=graph,
        implausible=implausible,
        extra={"graph_spread_ms": graph * 0.01} if graph else {},
    )


def _side_by_side(led, run, shape, base_ms, torch_ms, graph=True, cid=None, triton_label="baseline"):
    _row(led, run, triton_label, shape, base_ms + 0.01, base_ms if graph else None, cid)
    _row(led, run, "anchor:torch.matmul", shape, torch_ms + 0.01, torch_ms if graph else None, cid)


def _run(led):
    return led.start_run({}, {}, "bench", ["matmul"], GPU, {}).id


def test_the_faster_of_baseline_and_torch_wins_each_bucket_from_recorded_measurements(led, tmp_path):
    r1, r2 = _run(led), _run(led)
    _side_by_side(led, r1, "16,8192,8192", 0.0345, 0.0334)  # m16: torch faster
    _side_by_side(led, r2, "16,8192,8192", 0.0350, 0.0336)
    _side_by_side(led, r1, "1,8192,8192", 0.0300, 0.0344)  # m1: the baseline faster
    # graph times decide where both rows have them, even when the event times say the opposite
    _row(led, r1, "baseline", "64,8192,8192", 0.040, 0.0360)
    _row(led, r1, "anchor:torch.matmul", "64,8192,8192", 0.050, 0.0350)
    # rows of different benchmarks are never paired: a torch row alone decides nothing
    _row(led, r2, "anchor:torch.matmul", "4096,4096,4096", 0.1)
    _row(led, r1, "baseline", "4096,4096,4096", 0.2)
    # an implausible row is not a measurement
    _row(led, r1, "baseline", "256,8192,8192", 0.001, 0.001, implausible=True)
    _row(led, r1, "anchor:torch.matmul", "256,8192,8192", 0.05, 0.05)
    choices = {c.bucket: c for c in measured_choices(led, dir=tmp_path / "serving")}
    assert set(choices) == {"m16-klarge", "m1-klarge", "m64-klarge"}
    assert choices["m16-klarge"].impl == serving.TORCH and choices["m16-klarge"].shapes[0].benchmarks == 2
    assert choices["m16-klarge"].ratio == pytest.approx((0.0334 + 0.0336) / (0.0345 + 0.0350), rel=1e-3)
    assert choices["m1-klarge"].impl == serving.BASELINE
    assert choices["m64-klarge"].impl == serving.TORCH and choices["m64-klarge"].shapes[0].clock == "graph"
    assert "torch (torch.matmul) is faster" in choices["m16-klarge"].reason

    record_choices(choices.values(), dir=tmp_path / "serving")
    manifest = json.loads((tmp_path / "serving" / "manifest.json").read_text())
    assert manifest["version"] == 2
    assert {e["bucket"]: e["impl"] for e in manifest["entries"]} == {
        "m16-klarge": "torch",
        "m1-klarge": "baseline",
        "m64-klarge": "torch",
    }

    fn = serving.get("matmul", gpu=GPU, dir=tmp_path / "serving")
    a16, b = torch.randn(16, 64), torch.randn(64, 32)  # the bucket follows M and K: K=64 is 'ksmall'
    a16k, bk = torch.randn(16, 2048), torch.randn(2048, 8)
    r = fn.resolve(a16k.bfloat16(), bk.bfloat16())
    assert r.impl == serving.TORCH and r.why == choices["m16-klarge"].reason
    assert fn.kernel_for(a16k.bfloat16(), bk.bfloat16()) is torch_matmul
    out = fn(a16k.bfloat16(), bk.bfloat16())
    assert MATMUL.compare(out, {"a": a16k.bfloat16(), "b": bk.bfloat16()}).ok
    assert fn.resolve(torch.randn(1, 2048).bfloat16(), bk.bfloat16()).impl == serving.BASELINE
    # a bucket nothing was measured for takes the choice of most measured buckets on this GPU (2 of 3: torch)
    d = fn.resolve(a16.bfloat16(), b.bfloat16())
    assert d.impl == serving.TORCH and "2 of the 3 measured matmul bfloat16 buckets on NVIDIA H200" in d.why
    # another GPU has no measurement of its own: the measured GPUs' majority, said so
    other = serving.get("matmul", gpu="NVIDIA A100", dir=tmp_path / "serving").resolve(a16.bfloat16(), b.bfloat16())
    assert other.impl == serving.TORCH and "on other GPUs" in other.why
    # and another dtype: nothing measured, the baseline
    assert fn.resolve(a16, b).impl == serving.BASELINE


def test_a_promoted_kernel_that_torch_beats_is_demoted_and_one_that_beats_torch_stays(led, tmp_path):
    sdir = tmp_path / "serving"
    run = _run(led)
    src = open(KERNEL_SRC).read()
    slow, _ = led.add_candidate("matmul", as_written(src + "\n# slow\n"), "search", run)
    fast, _ = led.add_candidate("matmul", as_written(src + "\n# fast\n"), "search", run)
    for cand, bucket, _shape in ((slow, "m256-klarge", "256,8192,8192"), (fast, "m64-klarge", "64,8192,8192")):
        serving_install.install(
            "matmul", bucket, "bfloat16", GPU, judge_text(src + f"\n# {cand.id}\n"), cand.id, 0.05, "test", {}, dir=sdir
        )
        led.record_promotion(
            run_id=run,
            op="matmul",
            bucket=bucket,
            dtype="bfloat16",
            gpu_name=GPU,
            candidate_id=cand.id,
            new_ms=0.05,
            old_ms=0.06,
            gain=0.1,
            spread=0.01,
        )
    # the benchmarks that promoted them timed each beside torch (the baseline rows say nothing here)
    _side_by_side(led, run, "256,8192,8192", 0.0660, 0.0520, cid=slow.id, triton_label="candidate")
    _side_by_side(led, run, "64,8192,8192", 0.0300, 0.0350, cid=fast.id, triton_label="candidate")
    _side_by_side(led, run, "64,8192,8192", 0.0900, 0.0350)  # the baseline is slower still: not the question
    choices = {c.bucket: c for c in measured_choices(led, dir=sdir)}
    assert choices["m256-klarge"].impl == serving.TORCH and choices["m256-klarge"].kernel_candidate == slow.id
    assert choices["m64-klarge"].impl == serving.KERNEL and choices["m64-klarge"].kernel_candidate == fast.id
    written = dict((c.bucket, e) for c, e in record_choices(choices.values(), dir=sdir, led=led))
    assert written["m64-klarge"] is None
    entries = {e.bucket: e for e in serving.load_manifest(sdir).entries}
    assert entries["m256-klarge"].impl == "torch" and "kernel #" in str(entries["m256-klarge"].reason)
    assert entries["m64-klarge"].impl == "kernel" and (sdir / str(entries["m64-klarge"].file)).exists()
    assert not (sdir / serving.kernel_file_name("matmul", "m256-klarge", "bfloat16", GPU)).exists()
    active = {p.bucket for p in led.promotions(active_only=True)}
    assert active == {"m64-klarge"}
    demoted = next(p for p in led.promotions() if p.bucket == "m256-klarge")
    assert demoted.demote_reason.startswith("torch serves the bucket")


def test_ops_without_a_servable_torch_implementation_keep_the_triton_side(tmp_path):
    with pytest.raises(serving.ServingError, match="no torch implementation"):
        serving.set_choice("decode_attention", "c8k-g4-d128", "bfloat16", GPU, "torch", "x", {}, dir=tmp_path)
    impl, why = serving.default_choice("decode_attention", "bfloat16", GPU, [])
    assert impl == serving.BASELINE and "no torch implementation" in why
    assert serving.default_choice("matmul", "bfloat16", GPU, []) == (
        serving.BASELINE,
        "nothing measured for matmul bfloat16: the baseline",
    )
    # SDPA anchor rows of the paged decode time a gathered cache: they never choose anything
    assert get_op("decode_attention").torch_impl() is None and not get_op("decode_attention").torch_label


def test_a_version_1_manifest_is_still_served(tmp_path):
    src = open(KERNEL_SRC).read()
    entry = serving_install.install(
        "matmul", "m16-klarge", "bfloat16", GPU, judge_text(src), 3, 0.05, "old", {}, dir=tmp_path
    )
    doc = json.loads((tmp_path / "manifest.json").read_text())
    doc["version"] = 1
    for e in doc["entries"]:
        e.pop("impl")
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    r = serving.get("matmul", gpu=GPU, dir=tmp_path).resolve(
        torch.randn(16, 2048).bfloat16(), torch.randn(2048, 8).bfloat16()
    )
    assert r.impl == serving.KERNEL and str(r) == entry.file


def _m(label, ms, spread=0.0005, serves=False, graph=None):
    d = {
        "label": label,
        "median_ms": ms,
        "spread_ms": spread,
        "n": 10,
        "rounds": [ms] * 10,
        "error": "",
        "implausible": False,
        "serves": serves,
        "fraction_of_ceiling": 0.5,
    }
    if graph is not None:
        d.update(graph_ms=graph, graph_spread_ms=spread, graph_rounds=[graph] * 5)
    return d


def judge_benchmark(doc, shapes):
    """The rule over a benchmark child's document, read as the parent reads it."""
    return judge_outcome(BenchOutcome.from_json(doc), shapes)


def _doc(*measurements, shape="M=16,N=8192,K=8192"):
    return {
        "results": [
            {
                "op": "matmul",
                "shape": shape,
                "bucket": "m16-klarge",
                "dtype": "bfloat16",
                "gpu": GPU,
                "measurements": list(measurements),
            }
        ],
        "error": None,
    }


def test_promotion_is_judged_against_the_faster_of_the_incumbent_and_torch():
    shapes = ["M=16,N=8192,K=8192"]
    # faster than the baseline by 10%, but cuBLAS is faster still: not promoted, and the reason says torch
    j = judge_benchmark(
        _doc(_m("candidate", 0.045), _m("incumbent", 0.050), _m("anchor:torch.matmul", 0.040, serves=True)), shapes
    )
    assert not j.decision.promote and j.references == ["anchor:torch.matmul"]
    assert "slower than torch (torch.matmul)" in j.decision.reason
    # the same numbers with an anchor that does not serve (a gathered-cache SDPA): judged on the incumbent
    j = judge_benchmark(_doc(_m("candidate", 0.045), _m("incumbent", 0.050), _m("anchor:sdpa-decode", 0.040)), shapes)
    assert j.decision.promote and j.references == ["incumbent"] and "than the incumbent" in j.decision.reason
    # faster than both
    j = judge_benchmark(
        _doc(_m("candidate", 0.030), _m("incumbent", 0.050), _m("anchor:torch.matmul", 0.040, serves=True)), shapes
    )
    assert j.decision.promote and j.incumbent_ms == pytest.approx(0.040)
    assert j.decision.gain == pytest.approx(0.25)
    # torch is compared on the same clock: graph replays where all three have them
    j = judge_benchmark(
        _doc(
            _m("candidate", 0.060, graph=0.030),
            _m("incumbent", 0.050, graph=0.036),
            _m("anchor:torch.matmul", 0.040, serves=True, graph=0.034),
        ),
        shapes,
    )
    assert j.kinds == ["graph"] and j.references == ["anchor:torch.matmul"] and j.decision.promote
    # an anchor that failed is no reference
    bad = dict(_m("anchor:torch.matmul", 0.010, serves=True), error="boom")
    j = judge_benchmark(_doc(_m("candidate", 0.045), _m("incumbent", 0.050), bad), shapes)
    assert j.references == ["incumbent"] and j.decision.promote


def test_a_benchmark_races_out_a_candidate_slower_than_torch():
    res = _doc(_m("candidate", 0.045), _m("incumbent", 0.050), _m("anchor:torch.matmul", 0.040, serves=True))
    assert "slower than torch (torch.matmul)" in refused_here(ShapeResult.from_json(res["results"][0]))
    res = _doc(_m("candidate", 0.045), _m("incumbent", 0.050), _m("anchor:torch.matmul", 0.040))
    assert refused_here(ShapeResult.from_json(res["results"][0])) == ""


def test_rows_of_one_shape_pair_only_within_one_benchmark(led):
    run = _run(led)
    cand, _ = led.add_candidate("matmul", as_written("def matmul(a, b):\n    pass\n"), "search", run)
    _row(led, run, "baseline", "16,8192,8192", 0.05, 0.04, cid=None)
    _row(led, run, "anchor:torch.matmul", "16,8192,8192", 0.05, 0.03, cid=cand.id)  # beside a candidate
    assert choices_from_rows(led.bench_results()) == []


def test_the_dispatch_command_shows_and_writes_the_choices(led, tmp_path, capsys):
    from kernel_agent.agent.cli import main

    run = _run(led)
    _side_by_side(led, run, "16,8192,8192", 0.0345, 0.0334)
    _side_by_side(led, run, "1,8192,8192", 0.0300, 0.0344)
    sdir = tmp_path / "serving"
    argv = ["dispatch", "--ledger", str(tmp_path / "ledger.db"), "--serving-dir", str(sdir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "m16-klarge" in out and "torch" in out and "m1-klarge" in out and "(default)" in out
    assert not (sdir / "manifest.json").exists()  # without --write nothing is written
    assert main(argv + ["--write"]) == 0
    assert {e.bucket: e.impl for e in serving.load_manifest(sdir).entries} == {
        "m16-klarge": "torch",
        "m1-klarge": "baseline",
    }
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {d["bucket"]: (d["measured_faster"], d["manifest"]) for d in doc} == {
        "m16-klarge": ("torch", "torch"),
        "m1-klarge": ("baseline", "baseline"),
    }
    assert main(["dispatch", "--ledger", str(tmp_path / "missing.db"), "--write"]) == 2
    assert not (tmp_path / "missing.db").exists()

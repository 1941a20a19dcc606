"""The benchmark's checks of timed outputs, on the CPU: the CUDA-graph layer is faked (a fake
`triton.testing.do_bench_cudagraph` that calls the function eagerly, as it does, then "captures" its calls and
"replays" them by calling them again: a kernel that keeps state across calls sees the same sequence a graph's
replays give it), so that what the benchmark does with a replayed output can be checked without a GPU; and
the shape a promotion draws inside a bucket beside its benchmark points, and the rule that reads it."""

from __future__ import annotations

import pytest
import torch
import triton.testing

from kernel_agent.harness.bench import bench
from kernel_agent.harness.bench.bench_records import BenchOutcome, Measurement, ShapeResult
from kernel_agent.harness.bench.promotion import judge_benchmark, timed_call_mismatch
from kernel_agent.ops import get_op
from kernel_agent.ops.quantize_kv import quantize_eager
from tiers import exhaustive

QUANT = get_op("quantize_kv")
CAPTURED, REPLAYS = 20, 10  # calls in a fake graph, replays of it per round


def _fake_do_bench_cudagraph(fn, rep=20, return_mode="median"):
    fn()  # warm-up
    for _ in range(5):  # the estimate
        fn()
    for _ in range(REPLAYS + 1):  # the capture runs the calls once, then each replay runs them again
        for _ in range(CAPTURED):
            fn()
    return 0.01


@pytest.fixture
def fake_graphs(monkeypatch):
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", _fake_do_bench_cudagraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(bench, "_warm_for_capture", lambda fn, kwargs: fn(**kwargs))


def _refresher(case, seed=5):
    gen = torch.Generator().manual_seed(seed)

    def refresh(graph=False):
        case.args["x"].normal_(0.0, 1.0, generator=gen)

    return refresh


class StaleOnReplays:
    """Right for its first `live` calls (the probe, eager timed calls), then it hands back its last output: a
    kernel that skips the work once a workspace counter passes what eager rounds reach."""

    def __init__(self, live):
        self.live, self.calls, self.out = live, 0, None

    def __call__(self, x):
        self.calls += 1
        if self.out is None or self.calls <= self.live:
            self.out = quantize_eager(x)
        return self.out


def _graph_timed(contenders):
    case = QUANT.make_case(QUANT.shapes("tiny")[2], torch.float32, seed=3)
    results = {c.label: Measurement(c.label, 0.02, 0.0001, 5, [0.02] * 5) for c in contenders}
    bench._graph_rounds(
        contenders,
        case.args,
        results,
        refresh=_refresher(case),
        check=lambda out, where: bench.checked_output(QUANT, case, out, where),
    )
    return results


@exhaustive  # the quick tier's graph replay check is the stale replay's below
def test_the_last_graph_replay_of_each_round_is_checked_against_its_refreshed_inputs(fake_graphs):
    stale = StaleOnReplays(live=40)  # right in the eager calls and the first captured ones, stale on replays
    results = _graph_timed(
        [
            bench.Contender("incumbent", quantize_eager),
            bench.Contender("candidate", stale),
            bench.Contender("anchor:torch", lambda x: (x[:0], x[:0]), is_anchor=True),  # never checked
        ]
    )
    inc, cand, anchor = results["incumbent"], results["candidate"], results["anchor:torch"]
    assert len(inc.graph_rounds) == bench.GRAPH_ROUNDS and inc.graph_ms is not None
    assert [c["round"] for c in inc.timed_checks] == list(range(1, bench.GRAPH_ROUNDS + 1))
    assert all(c["ok"] and c["clock"] == "graph" for c in inc.timed_checks), inc.timed_checks
    assert not timed_call_mismatch(inc) and not anchor.timed_checks
    assert len(cand.timed_checks) == bench.GRAPH_ROUNDS and not any(c["ok"] for c in cand.timed_checks)
    why = timed_call_mismatch(cand)
    assert why.startswith("output of the last CUDA-graph replay of round 1 differs from the reference"), why


def test_a_stale_graph_replay_refuses_the_candidate_as_a_wrong_timed_call_does(fake_graphs):
    results = _graph_timed(
        [bench.Contender("incumbent", quantize_eager), bench.Contender("candidate", StaleOnReplays(40))]
    )
    doc = ShapeResult("quantize_kv", "a", "b", "float32", "gpu", list(results.values())).to_json()
    j = judge_benchmark(BenchOutcome.from_json({"results": [doc]}), ["a"])
    assert j.decision is None and "candidate: output of the last CUDA-graph replay of round 1" in j.error, j.error


# -- a shape drawn inside the bucket beside its benchmark points ------------------------------------------


@exhaustive  # the quick tier meets the drawn shape below (with_drawn_shape)
def test_a_drawn_shape_lies_inside_the_bucket_off_the_point_and_costs_no_more_than_it():
    import random

    for name in ("matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8"):
        op = get_op(name)
        for point in op.shapes("serving"):
            drawn = {op.drawn_in_bucket([point], random.Random(seed), torch.bfloat16) for seed in range(4)}
            assert None not in drawn and point not in drawn and len(drawn) > 1, (name, point)  # seeded, and it varies
            for s in drawn:
                work = [
                    op.flops(x) if op.bound(point) == "compute" else op.bytes(x, torch.bfloat16) for x in (point, s)
                ]
                assert op.bucket(s) == op.bucket(point) and 0.5 * work[0] <= work[1] <= work[0], (point, s)
                op.make_case(s, torch.bfloat16, device="meta")  # the op takes it
    decode = get_op("decode_attention")
    point = decode.shapes("serving")[0]
    again = decode.drawn_in_bucket([point], random.Random(7), torch.bfloat16)
    assert again == decode.drawn_in_bucket([point], random.Random(7), torch.bfloat16)  # the seed reproduces it
    assert again.ctx != point.ctx and again.B != point.B  # the block-table width and the batch both move


def test_with_drawn_shape_appends_one_shape_and_records_its_seed():
    from kernel_agent.harness.bench.bench_records import BenchKernel, BenchSpec

    op = get_op("decode_attention")
    key = op.shapes("serving")[1].key()
    spec = bench.with_drawn_shape(
        BenchSpec.judging("decode_attention", [key], "bfloat16", BenchKernel("i"), BenchKernel("c", "c.py")), seed=11
    )
    assert spec.shapes[0] == key and len(spec.shapes) == 2 and spec.drawn == spec.shapes[1:] and spec.draw_seed == 11
    assert op.bucket(op.parse_shape(spec.drawn[0])) == op.bucket(op.parse_shape(key)) and spec.points == (key,)
    back = BenchSpec.from_json(spec.to_json())  # it crosses to the benchmark child and back as JSON
    assert back == spec
    assert bench.with_drawn_shape(spec, seed=11).drawn == spec.drawn  # seeded: the same shape again


def _m(label, ms, spread=0.002):
    return {"label": label, "median_ms": ms, "spread_ms": spread, "n": 5, "rounds": [ms] * 5}


def _res(shape, cand, inc=1.0):
    return {"shape": shape, "measurements": [_m("incumbent", inc), _m("candidate", cand)]}


def test_a_candidate_fast_only_at_the_benchmark_point_is_not_promoted():
    # 30% faster at the bucket's point, many times slower at the shape drawn inside the bucket
    gamed = BenchOutcome.from_json({"results": [_res("point", 0.7), _res("drawn", 4.0)]})
    j = judge_benchmark(gamed, ["point"], drawn=["drawn"])
    assert not j.error and not j.decision.promote, j.decision
    assert j.decision.reason.startswith("not promoted: at drawn, drawn at random inside the bucket, 300.0% slower")
    assert j.shapes == ["point"] and j.candidate_ms == pytest.approx(0.7)  # the point's figures, as before
    # no better than the incumbent at the drawn shape: a gain at one shape is not the bucket's
    same = judge_benchmark(
        BenchOutcome.from_json({"results": [_res("point", 0.7), _res("drawn", 1.0)]}), ["point"], drawn=["drawn"]
    )
    assert not same.decision.promote and "not above the noise" in same.decision.reason
    won = judge_benchmark(
        BenchOutcome.from_json({"results": [_res("point", 0.7), _res("drawn", 0.9)]}), ["point"], drawn=["drawn"]
    )
    assert won.decision.promote and won.drawn == ["drawn"], won.decision
    missing = judge_benchmark(BenchOutcome.from_json({"results": [_res("point", 0.7)]}), ["point"], drawn=["drawn"])
    assert missing.error == "benchmark incomplete"

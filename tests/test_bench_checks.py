"""The benchmark's checks of timed outputs, on the CPU: the CUDA-graph layer is faked (a fake
`triton.testing.do_bench_cudagraph` that calls the function eagerly, as it does, then "captures" its calls and
"replays" them by calling them again: a kernel that keeps state across calls sees the same sequence a graph's
replays give it), so that what the benchmark does with a replayed output can be checked without a GPU."""

from __future__ import annotations

import pytest
import torch
import triton.testing

from kernel_agent.harness import bench
from kernel_agent.harness.bench_records import BenchOutcome, Measurement, ShapeResult
from kernel_agent.harness.ops import get_op
from kernel_agent.harness.ops.quantize_kv import quantize_eager
from kernel_agent.harness.promotion import judge_benchmark, timed_call_mismatch

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

"""Judged figures (harness/bench/figures.py): one reading of benchmark rows for the report, its plots,
`history --trend`, the leaderboard and `show`, checked on made-up rows and on the committed H200 run."""

import math
import os
import re
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from committed_h200 import H200, RUN, copied_ledger, table_rows
from kernel_agent.harness.bench import figures as F
from kernel_agent.harness.bench.bench_records import Measurement
from kernel_agent.harness.bench.promotion import judged_pair

T0 = datetime(2026, 11, 30, 16, 0, tzinfo=timezone.utc)


def _row(id, label, ms, graph=None, cid=7, run="r1", shape="M=1", frac=None, implausible=False):
    return SimpleNamespace(
        id=id,
        run_id=run,
        candidate_id=cid,
        label=label,
        op="matmul",
        bucket="b",
        shape_key=shape,
        dtype="bfloat16",
        gpu_name="H200",
        median_ms=ms,
        spread_ms=ms * 0.01,
        n_samples=5,
        graph_ms=graph,
        extra={"graph_spread_ms": graph * 0.01} if graph else {},
        fraction_of_ceiling=frac,
        ceiling_kind="memory" if frac else None,
        implausible=implausible,
        created_at=T0 + timedelta(seconds=id),
    )


def test_the_clock_is_chosen_per_figure_as_the_promotion_rule_chooses_it():
    rows = [
        _row(1, "baseline", 0.090, 0.055),
        _row(2, "candidate", 0.095, 0.050),
        _row(3, "anchor:t", 0.06, 0.04),
        # another candidate at the same shape, too slow for graph replays: events, for its figure only
        _row(4, "baseline", 0.085, 0.055, cid=8),
        _row(5, "candidate", 0.30, None, cid=8),
    ]
    a, b = F.judged_figures(rows)
    assert (a.clock, a.incumbent_ms, a.kernel_ms, a.anchor_ms) == ("graph", 0.055, 0.050, 0.040)
    assert a.speedup == pytest.approx(1.1) and a.anchor_ratio() == pytest.approx(0.8)
    assert (b.clock, b.incumbent_ms, b.kernel_ms) == ("event", 0.085, 0.30)

    def m(row, rounds):  # the same timings as a benchmark measurement, which the rule judges
        return Measurement.from_json(
            {
                "median_ms": row.median_ms,
                "spread_ms": row.spread_ms,
                "n": 5,
                "graph_ms": row.graph_ms,
                "graph_spread_ms": row.extra.get("graph_spread_ms"),
                "graph_rounds": [row.graph_ms] * rounds,
            }
        )

    for fig, (inc, cand) in ((a, rows[:2]), (b, rows[3:])):
        assert judged_pair(m(cand, 5), m(inc, 5))[2] == fig.clock


def test_an_anchor_without_the_figures_clock_is_shown_on_events_and_not_compared():
    [f] = F.judged_figures(
        [_row(1, "baseline", 0.09, 0.055), _row(2, "candidate", 0.095, 0.05), _row(3, "anchor:t", 0.25, None)]
    )
    assert f.clock == "graph" and f.anchor_clock == "event" and f.anchor_ms == 0.25
    assert f.anchor_ratio() is None and f.anchor_speedup is None  # no ratio across two clocks


def test_each_benchmark_keeps_its_own_incumbent():
    """The same candidate benchmarked twice in a run, and rows timed on their own (no candidate id)."""
    rows = [
        _row(1, "baseline", 1.0),
        _row(2, "candidate", 0.9),
        _row(3, "baseline", 0.5, cid=None),
        _row(4, "serving:x.py", 0.8),
        _row(5, "candidate", 0.85),
    ]
    first, second = F.judged_figures(rows)
    assert (first.incumbent_label, first.incumbent_ms) == ("baseline", 1.0)
    assert (second.incumbent_label, second.incumbent_ms) == ("serving:x.py", 0.8)
    [lone] = F.judged_figures([_row(1, "candidate", 0.9)])
    assert lone.incumbent is None and lone.speedup is None


def test_ratios_and_percentages_come_from_the_printed_numbers():
    assert F.fmt_ms(0.0500004) == "0.05000" and F.fmt_ms(0.069884) == "0.06988" and F.fmt_ms(1.23456) == "1.235"
    assert F.fmt_ms(12345.6) == "12346" and F.fmt_spread(0.00040100) == "0.00040"
    [f] = F.judged_figures([_row(1, "baseline", 0.0619049), _row(2, "candidate", 0.0594951)])
    printed_inc, printed_cand = float(F.fmt_ms(f.incumbent_ms)), float(F.fmt_ms(f.kernel_ms))
    assert F.fmt_x(f.speedup) == F.fmt_x(printed_inc / printed_cand) == "1.040x"
    assert F.fmt_saved(f.speedup) == "3.8% less time"  # 1 - 1/1.040
    assert F.fmt_saved(0.8) == "25.0% more time"


def test_the_fraction_of_the_ceiling_is_on_the_figures_clock():
    [f] = F.judged_figures([_row(1, "baseline", 0.2, 0.1, frac=0.3), _row(2, "candidate", 0.2, 0.05, frac=0.3)])
    assert f.kernel.fraction("event") == pytest.approx(0.3)
    assert f.kernel.fraction(f.clock) == pytest.approx(0.3 * 0.2 / 0.05)  # a rate follows the time it divides
    assert f.to_json()["fraction_of_ceiling"] == pytest.approx(1.2)


def test_a_bucket_is_summed_up_by_the_geometric_mean_and_the_best_result_wins():
    rows = [
        _row(1, "baseline", 1.0, shape="A"),
        _row(2, "candidate", 0.5, shape="A"),
        _row(3, "baseline", 1.0, shape="B"),
        _row(4, "candidate", 2.0, shape="B"),
        _row(5, "baseline", 1.0, cid=8, shape="A"),
        _row(6, "candidate", 0.9, cid=8, shape="A"),
        _row(7, "baseline", 1.0, cid=8, shape="B"),
        _row(8, "candidate", 0.9, cid=8, shape="B"),
        _row(9, "baseline", 1.0, cid=9, shape="A"),
        _row(10, "candidate", 0.1, cid=9, shape="A", implausible=True),
    ]
    results = F.candidate_results(F.judged_figures(rows))
    assert [r.candidate_id for r in results] == [7, 8, 9]
    assert results[0].speedup == pytest.approx(1.0) and results[1].speedup == pytest.approx(1 / 0.9)
    assert F.best_result(results).candidate_id == 8  # 9 is faster, but its timing is implausible
    board = F.leaderboard("matmul", F.judged_figures(rows), {7: ("seven", "benchmarked")})
    assert [(e.figure.shape_key, e.figure.candidate_id, e.label) for e in board.entries] == [
        ("A", 7, "seven"),
        ("B", 8, None),
    ]


# -- the committed H200 run: table, plots, trend and leaderboard agree figure by figure ----------------


@pytest.fixture
def h200(tmp_path):
    led, _ = copied_ledger(tmp_path)
    yield led
    led.close()


def test_the_committed_h200_report_agrees_with_its_plots_trend_and_leaderboard(h200, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from kernel_agent.agent.cli.report import write_report
    from kernel_agent.agent.cli.views import speedup_trend

    drawn = []  # what the plots draw: (legend label, bar heights)
    bar = matplotlib.axes.Axes.bar

    def recording_bar(self, x, height, *a, **kw):
        drawn.append((kw.get("label"), list(height)))
        return bar(self, x, height, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar", recording_bar)
    run = h200.get_run(RUN)
    md = open(write_report(h200, run, str(tmp_path / "report"))).read()

    # the committed report is what this code writes from the committed ledger
    with open(os.path.join(H200, f"report_{RUN}", "report.md")) as f:
        assert f.read() == md, f"regenerate results/h200/search/report_{RUN} (kernel-agent report)"
    for png in ("speedup.png", "progress.png"):
        assert os.path.exists(os.path.join(H200, f"report_{RUN}", png))
    assert not os.path.exists(os.path.join(H200, f"report_{RUN}", "best_time.png"))

    # the table of the promoted kernel: every speedup recomputes from the printed times
    [pr] = h200.promotions(run_id=RUN)
    rows = table_rows(md, "### Timings")
    table = {}
    for shape in ("M=128,N=8192,K=8192", "M=256,N=4096,K=14336"):
        inc = next(r for r in rows if r[0] == shape and r[1] == "baseline")
        cand = next(r for r in rows if r[0] == shape and r[1] == f"candidate #{pr.candidate_id}")
        assert inc[4] == cand[4] == "graph"  # the clock the rule judged by, named
        assert cand[5] == F.fmt_x(float(inc[2]) / float(cand[2]))
        table[shape] = (float(inc[2]), float(cand[2]), cand[5])
    assert table["M=256,N=4096,K=14336"] == (0.06988, 0.06568, "1.064x")  # not the 0.92x an event reading gives
    assert table["M=128,N=8192,K=8192"] == (0.05383, 0.05332, "1.010x")
    geo = math.exp(sum(math.log(i / c) for i, c, _ in table.values()) / 2)
    head = re.search(r"Replaces the baseline: \*\*([0-9.]+x)\*\* \(([0-9.]+)% less time\)", md)
    assert head.group(1) == F.fmt_x(geo) == "1.036x"
    assert float(head.group(2)) == round(100 * (1 - 1 / float(head.group(1)[:-1])), 1) == 3.5
    assert f"{pr.gain:.1%}" == "3.5%"  # the rule's own figure: the same quantity, time saved

    # the plot: the same candidate and the same speedups, shape by shape
    heights = next(h for label, h in drawn if label.startswith("best candidate"))
    assert [F.fmt_x(h) for h in heights] == [t[2] for t in table.values()]

    # the trend: the run's best candidate is the promoted one, at the headline's figure
    [t] = speedup_trend(h200, "matmul", [run])
    assert t.best.candidate_id == pr.candidate_id and F.fmt_x(t.speedup) == head.group(1)

    # the leaderboard: only winners; each entry is the figure the report prints for that candidate
    board = h200.leaderboard("matmul")
    assert board.entries and all(e.figure.speedup > 1 for e in board.entries)
    bench_rows = {r[0]: r for r in table_rows(md, "## Benchmarks")}
    for e in board.entries:
        f = e.figure
        if f.bucket != "m256-klarge":
            continue
        per_shape = f"{f.shape_key}: {F.fmt_ms(f.incumbent_ms)} -> {F.fmt_ms(f.kernel_ms)} ({F.fmt_x(f.speedup)})"
        assert per_shape in bench_rows[str(f.candidate_id)][5]
        if f.candidate_id == pr.candidate_id:
            assert (f.incumbent_ms, f.kernel_ms, F.fmt_x(f.speedup)) == table[f.shape_key]
    assert {e.figure.shape_key: e.figure.candidate_id for e in board.entries if e.figure.bucket == "m256-klarge"} == {
        "M=256,N=4096,K=14336": pr.candidate_id,
        "M=128,N=8192,K=8192": 29,
    }  # #29 was faster there, slower at M=256

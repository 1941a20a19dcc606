"""The run summary is a typed record, and every view of it reads fields the record has.

`Ledger.run_summary` returns a `RunSummary` (slotted dataclasses all the way down), and the summary after a run,
`show RUN`, `history` and the report read it by attribute. A reader that names a field the record does not
have raises here, where a dict read with `.get(...)` printed nothing and no test noticed (the rejections table
once read a key run_summary never wrote). Each view is rendered below from one ledger, and each assertion needs
a field's value to reach the output.
"""

import argparse
import json

import pytest

from kernel_agent.agent import ui
from kernel_agent.agent.cli.history import history
from kernel_agent.agent.cli.report import write_report
from kernel_agent.agent.cli.run import _print_run_summary
from kernel_agent.agent.cli.show import cmd_show
from kernel_agent.harness.ledger.ledger import CandidateStatus, Ledger, RunSession, RunStatus, RunSummary
from kernel_agent.sanitizer.canonical import as_written

SRC = "def quantize_kv(x):\n    return {}\n"
KEY = dict(op="quantize_kv", bucket="t4k-d128", dtype="bfloat16", gpu_name="NVIDIA H200")


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A finished run: two candidates rejected (bounds twice, coverage once), one promoted, two model calls."""
    monkeypatch.setattr(ui, "is_tty", lambda: False)  # plain lines: what a pipe or a CI log gets
    path = tmp_path / "l.db"
    led = Ledger(path)
    run = led.start_run({}, {"torch": "2.13"}, "model", ["quantize_kv"], "NVIDIA H200", {})
    for i, checks in enumerate((["bounds"], ["bounds", "coverage"])):
        c, _ = led.add_candidate("quantize_kv", as_written(SRC.format(i)), "model", run.id, label=f"bad-{i}")
        led.record_checks(
            c.id, "full", [{"name": k, "status": "failed", "detail": "x", "duration_s": 0.1} for k in checks]
        )
        led.set_candidate_status(c.id, CandidateStatus.REJECTED)
    good, _ = led.add_candidate("quantize_kv", as_written(SRC.format(9)), "model", run.id, label="evict-first")
    led.set_candidate_status(good.id, CandidateStatus.BENCHMARKED)
    led.record_promotion(
        **KEY,
        run_id=run.id,
        candidate_id=good.id,
        new_ms=0.9,
        old_ms=1.0,
        gain=0.1,
        spread=0.02,
        reason="10.0% faster at every shape",
    )
    led.record_model_call(run.id, "m", "p", "r", 1200, 3400, 2.0)
    led.record_model_call(run.id, "m", "p", None, 100, 0, 1.0, error="timeout")
    led.set_run_status(run.id, RunStatus.FINISHED, finished=True)
    yield led, led.get_run(run.id), path
    led.close()


def _session(**over) -> RunSession:
    fields = dict(
        stop_reason="candidate budget reached (3)",
        gpu="NVIDIA H200",
        benchmarked=True,
        throughput={"judged": 3},
        throughput_line="first benchmark after 40s; 3 judged",
        serving={"mode": "in_place"},
        serving_line="serving set: written in place to kernels/serving",
    )
    return RunSession(**{**fields, **over})


def test_run_summary_is_a_typed_record(recorded):
    led, run, _ = recorded
    s = led.run_summary(run.id)
    assert isinstance(s, RunSummary) and s.status is RunStatus.FINISHED
    assert s.candidates == 3 and s.candidates_by_status == {
        "proposed": 0,
        "rejected": 2,
        "verified": 0,
        "benchmarked": 0,
        "promoted": 1,
    }
    assert s.checks_failed == {"bounds": 2, "coverage": 1}
    assert s.model.total_tokens == 4700 and s.model.errors == 1
    assert [(p.op, p.candidate_id, p.active) for p in s.promotions] == [("quantize_kv", 3, True)]
    with pytest.raises(AttributeError):  # slots: a misspelled field is an error, not a new attribute
        s.failed_checks = {}


def test_the_json_document_keeps_its_keys(recorded):
    led, run, _ = recorded
    s = led.run_summary(run.id)
    ledger_keys = [
        "run_id",
        "status",
        "proposer",
        "ops",
        "gpu_name",
        "started_at",
        "finished_at",
        "wall_s",
        "proposals",
        "duplicates",
        "candidates",
        "candidates_by_status",
        "checks_failed",
        "bench_results",
        "promotions",
        "model",
        "judged_now",
        "judged_now_by_status",
        "replayed",
        "pruned",
    ]
    assert list(s.to_json()) == ledger_keys  # `show --json`: what the ledger knows
    s.session = _session()
    doc = json.loads(json.dumps(s.to_json(), default=str))
    assert list(doc) == ledger_keys + [
        "stop_reason",
        "gpu",
        "benchmarked",
        "throughput",
        "throughput_line",
        "serving",
        "serving_line",
    ]  # `run --json`: and how the session went
    assert doc["status"] == "finished" and doc["promotions"][0]["reason"] == "10.0% faster at every shape"
    assert doc["model"]["total_tokens"] == 4700


def test_the_summary_after_a_run_reads_every_field_it_prints(recorded, capsys):
    led, run, _ = recorded
    s = led.run_summary(run.id)
    s.session = _session()
    assert _print_run_summary(s, argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert f"run {run.id} finished: candidate budget reached (3)" in out
    assert f"; wall {ui.duration(s.wall_s)}" in out.split("\n")[0]
    # judged now, rejected, not verified, verified, bench(marked), promoted, replayed, tokens
    assert out.split("\n")[2].split() == ["3", "2", "0", "0", "0", "1", "0", "4700"]
    rejections = out[out.index("rejections by check") :].splitlines()[2:4]
    assert [r.split() for r in rejections] == [["bounds", "2"], ["coverage", "1"]]
    assert "promoted quantize_kv t4k-d128 bfloat16: 10.0% faster at every shape" in out
    assert "throughput: first benchmark after 40s; 3 judged" in out and "serving set: written in place" in out
    assert "no GPU" not in out

    s.session = None  # the ledger alone: nothing says the run benchmarked
    _print_run_summary(s, argparse.Namespace(json=False))
    assert "no GPU: nothing was benchmarked\n" in capsys.readouterr().out  # (it verified none, promoted one)


def test_show_history_and_the_report_read_the_record(recorded, capsys, tmp_path):
    led, run, path = recorded
    assert cmd_show(argparse.Namespace(what=run.id, ledger=str(path), json=False, source=False)) == 0
    out = capsys.readouterr().out
    assert "promoted: quantize_kv t4k-d128 bfloat16 candidate #3: 10.0% faster" in out
    # the model's tokens (1200 + 3400, and 100 for the failed call) over the 3 candidates the run judged
    assert "model: 2 calls (1 failed), 4,700 tokens, 1,567 per judged candidate" in out
    assert cmd_show(argparse.Namespace(what=run.id, ledger=str(path), json=True, source=False)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["checks_failed"] == {"bounds": 2, "coverage": 1}
    assert doc["model_usage"] == "model: 2 calls (1 failed), 4,700 tokens, 1,567 per judged candidate"

    args = argparse.Namespace(
        op=None, status=None, since=None, until=None, proposer=None, limit=5, leaderboard=False, trend=False, json=True
    )
    assert history(args, led) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["candidates"] == 3 and row["by_status"]["rejected"] == 2 and row["promotions"] == 1

    text = open(write_report(led, run, str(tmp_path / "report"))).read()
    assert "- candidates judged by this run: 3 (promoted 1, rejected 2); replayed from earlier runs: 0" in text
    assert "Rejections by the check that caught them: `bounds` 2, `coverage` 1" in text


def test_statuses_are_the_stored_words():
    assert [s.value for s in CandidateStatus] == ["proposed", "rejected", "verified", "benchmarked", "promoted"]
    assert f"{CandidateStatus.PROMOTED}" == "promoted" and json.dumps(RunStatus.RUNNING) == '"running"'
    assert CandidateStatus("rejected") == "rejected" and {"rejected": 1}[CandidateStatus.REJECTED] == 1

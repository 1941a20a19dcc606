"""What reviewers and CI touch: `gate`, `report`, `history`, `show`, and the CLI's error paths."""

import json
import os
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from kernel_agent.agent.cli import parser as cli
from kernel_agent.agent.cli.report import write_report
from kernel_agent.harness.field_failures import FailureKind, FieldFailure
from kernel_agent.harness.ledger.ledger import Ledger
from kernel_agent.harness.serving import serving_install
from kernel_agent.sanitizer.canonical import as_written, judge_text
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
BASELINE = os.path.join(ROOT, "kernels", "baseline")
GOOD = os.path.join(ROOT, "tests", "candidates", "good", "quantize_kv", "evict_first_hint.py")


def _run(args, env=None):
    return subprocess.run(
        CLI + args, capture_output=True, text=True, cwd=ROOT, timeout=900, env=dict(os.environ, **(env or {}))
    )


def _serving_set(tmp_path, extra_source=None):
    d = tmp_path / "serving"
    d.mkdir()
    (d / "manifest.json").write_text('{"version": 1, "entries": []}')
    with open(GOOD) as f:
        serving_install.install(
            "quantize_kv", "tlarge-d128", "bfloat16", "NVIDIA H200", judge_text(f.read()), 1, 0.1, "test", {}, dir=d
        )
    if extra_source is not None:
        extra = judge_text(extra_source)
        serving_install.install(
            "quantize_kv", "tsmall-d128", "bfloat16", "NVIDIA H200", extra, 2, 0.2, "slipped in", {}, dir=d
        )
    return d


@exhaustive  # 15-35 s of sanitizer runs; the quick tier meets the same paths elsewhere
def test_gate_passes_on_a_real_serving_set(tmp_path):
    d = _serving_set(tmp_path)
    summary = tmp_path / "summary.md"
    step = tmp_path / "step.md"
    r = _run(
        [
            "gate",
            "--serving-dir",
            str(d),
            "--quick",
            "--no-baselines",
            "--junit",
            str(tmp_path / "j.xml"),
            "--summary",
            str(summary),
        ],
        env={"GITHUB_STEP_SUMMARY": str(step)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gate PASSED" in r.stdout and "passed" in summary.read_text()
    assert step.read_text() == summary.read_text()
    assert ET.parse(tmp_path / "j.xml").getroot().find("testsuite").get("failures") == "0"


def test_gate_fails_loudly_on_a_faulty_kernel_slipped_in_by_hand(tmp_path):
    with open(os.path.join(BASELINE, "quantize_kv.py")) as f:
        src = f.read()
    faulty = src.replace("q = tl.minimum(tl.maximum(q, -127), 127)", "q = tl.minimum(tl.maximum(q, -128), 127)")
    faulty = faulty.replace(
        "inv = tl.where(amax > 0, 127.0 / amax, 0.0)", "inv = tl.where(amax > 0, 128.0 / amax, 0.0)"
    )
    assert faulty != src
    d = _serving_set(tmp_path, faulty)
    summary = tmp_path / "summary.md"
    r = _run(
        [
            "gate",
            "--serving-dir",
            str(d),
            "--quick",
            "--no-baselines",
            "--junit",
            str(tmp_path / "j.xml"),
            "--summary",
            str(summary),
        ]
    )
    assert r.returncode == 1
    assert "gate FAILED" in r.stdout and "FAIL" in r.stdout and "tsmall-d128" in r.stdout
    md = summary.read_text()
    assert "FAILED" in md and "**FAIL**" in md and "x_q outside [-127, 127]" in md  # the check explains itself
    suites = ET.parse(tmp_path / "j.xml").getroot().findall("testsuite")
    assert sum(int(s.get("failures")) for s in suites) >= 1


@exhaustive  # 15-35 s of sanitizer runs; the quick tier meets the same paths elsewhere
def test_gate_flags_kernels_measured_under_other_versions(tmp_path):
    d = _serving_set(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["entries"][0]["versions"] = {"torch": "0.0.1", "triton": "0.0.1"}
    (d / "manifest.json").write_text(json.dumps(m))
    r = _run(["gate", "--serving-dir", str(d), "--quick", "--since-versions", "--summary", str(tmp_path / "s.md")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 measured under other versions" in r.stdout
    assert "torch 0.0.1 ->" in (tmp_path / "s.md").read_text()


def test_gate_reports_a_missing_serving_file(tmp_path):
    d = _serving_set(tmp_path)
    for f in d.glob("quantize_kv__*.py"):
        f.unlink()
    r = _run(["gate", "--serving-dir", str(d), "--quick", "--no-baselines"])
    assert r.returncode == 1 and "missing" in r.stdout


def _ledger_with_a_field_failure(db, bucket="tsmall-d128") -> None:
    """A ledger where a promoted quantize_kv kernel serves `bucket` on the H200 and the serving guard retired it
    for one shape class."""
    with Ledger(db) as led:
        run = led.start_run({}, {}, "search", ["quantize_kv"], "NVIDIA H200", {})
        cand, _ = led.add_candidate("quantize_kv", as_written("def quantize_kv(x):\n    return x\n"), "search", run.id)
        key = dict(op="quantize_kv", bucket=bucket, dtype="bfloat16", gpu_name="NVIDIA H200")
        led.record_promotion(**key, run_id=run.id, candidate_id=cand.id, new_ms=1, old_ms=2, gain=0.5, spread=0.01)
        led.record_field_failure(
            FieldFailure(
                "quantize_kv",
                bucket,
                "bfloat16",
                "nvidia-h200",
                "quantize_kv__tsmall-d128__bfloat16__nvidia-h200.py",
                cand.source_hash,
                "BLOCK_D=128|T=600000",
                ((600000, 8, 128), (600000, 8, 128), (600000, 8)),
                ((1024, 128, 1), (1024, 128, 1), (8, 1)),
                ("bfloat16", "int8", "float32"),
                FailureKind.MISMATCH,
                "x_q[599999,7,3]: 12 against 13",
            )
        )


def test_gate_fails_while_a_field_failure_is_unresolved_and_passes_after_demote(tmp_path, monkeypatch, capsys):
    d = tmp_path / "serving"
    d.mkdir()
    (d / "manifest.json").write_text('{"version": 1, "entries": []}')
    monkeypatch.setenv("KERNEL_AGENT_SERVING_DIR", str(d))
    db = tmp_path / "l.db"
    _ledger_with_a_field_failure(db)
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    gate = ["gate", "--serving-dir", str(d), "--quick", "--no-baselines", "--ledger", str(db)]
    assert cli.main(gate + ["--junit", str(junit), "--summary", str(summary)]) == 1
    out = capsys.readouterr().out
    assert "gate FAILED" in out and "1 unresolved field failure(s)" in out
    (line,) = [x for x in out.splitlines() if "FIELD FAILURE" in x]
    for part in (
        "quantize_kv tsmall-d128",
        "quantize_kv__tsmall-d128",
        "BLOCK_D=128|T=600000",
        "mismatch",
        "12 against",
    ):
        assert part in line
    assert "1 unresolved field failure(s)" in summary.read_text() and "`BLOCK_D=128|T=600000`" in summary.read_text()
    (suite,) = [s for s in ET.parse(junit).getroot().findall("testsuite") if s.get("name") == "field failures"]
    assert suite.get("failures") == "1" and "12 against 13" in suite.find("testcase/failure").text

    demote = ["demote", "--op", "quantize_kv", "--bucket", "tsmall-d128", "--gpu", "NVIDIA H200"]
    assert cli.main(demote + ["--reason", "wrong in the field", "--ledger", str(db), "--in-place"]) == 0
    assert "resolved 1 field failure(s) of quantize_kv tsmall-d128 bfloat16 on NVIDIA H200" in capsys.readouterr().out
    assert cli.main(gate) == 0 and "gate PASSED" in capsys.readouterr().out
    with Ledger(db, read_only=True) as led:
        (ff,) = led.field_failures()
        demote_run = led.runs(limit=1)[0]
        assert ff.resolved_by == demote_run.id and demote_run.config["command"] == "demote"


def test_gate_reads_no_ledger_where_none_is_and_refuses_a_named_one_that_is_not_there(tmp_path, monkeypatch, capsys):
    d = tmp_path / "serving"
    d.mkdir()
    (d / "manifest.json").write_text('{"version": 1, "entries": []}')
    monkeypatch.chdir(tmp_path)  # no runs/ledger.db here
    monkeypatch.delenv("KERNEL_AGENT_LEDGER", raising=False)
    gate = ["gate", "--serving-dir", str(d), "--quick", "--no-baselines"]
    assert cli.main(gate) == 0 and not (tmp_path / "runs").exists()
    assert cli.main(gate + ["--ledger", str(tmp_path / "typo.db")]) == 2
    assert "no ledger at" in capsys.readouterr().err and not (tmp_path / "typo.db").exists()
    _ledger_with_a_field_failure(tmp_path / "runs" / "ledger.db")  # the default, once it exists
    assert cli.main(gate) == 1 and "FIELD FAILURE" in capsys.readouterr().out


def test_demote_resolves_the_field_failures_of_a_bucket_nothing_serves_any_more(tmp_path, monkeypatch, capsys):
    d = tmp_path / "serving"
    d.mkdir()
    (d / "manifest.json").write_text('{"version": 1, "entries": []}')
    monkeypatch.setenv("KERNEL_AGENT_SERVING_DIR", str(d))
    db = tmp_path / "l.db"
    _ledger_with_a_field_failure(db)
    with Ledger(db) as led:
        (p,) = led.promotions(active_only=True)
        led.demote(p.id, "replaced by hand")
    demote = ["demote", "--op", "quantize_kv", "--bucket", "tsmall-d128", "--gpu", "NVIDIA H200", "--reason", "gone"]
    assert cli.main(demote + ["--ledger", str(db), "--in-place"]) == 0
    assert "resolved 1 field failure(s)" in capsys.readouterr().out
    with Ledger(db, read_only=True) as led:
        assert led.field_failures(unresolved_only=True) == []
        assert led.field_failures()[0].resolved_by == "demote with nothing served: gone"


def test_history_and_show_list_field_failures_unresolved_and_resolved(tmp_path, capsys):
    db = tmp_path / "l.db"
    _ledger_with_a_field_failure(db)
    _ledger_with_a_field_failure(db, bucket="tlarge-d128")
    with Ledger(db) as led:
        promote_run = led.runs(limit=None)[-1].id  # the first bucket's
        cid = led.promotions(run_id=promote_run)[0].candidate_id
        assert led.resolve_field_failures("quantize_kv", "tlarge-d128", "bfloat16", "NVIDIA H200", by="r-fixed") == 1
    assert cli.main(["history", "--field-failures", "--ledger", str(db)]) == 0
    out = capsys.readouterr().out
    assert "1 unresolved, 1 resolved" in out
    (open_line,) = [x for x in out.splitlines() if "UNRESOLVED" in x]
    assert "quantize_kv tsmall-d128 bfloat16 nvidia-h200" in open_line and "mismatch" in open_line
    (done_line,) = [x for x in out.splitlines() if x.strip().startswith("resolved ")]
    assert "tlarge-d128" in done_line and "resolved by r-fixed" in done_line
    assert cli.main(["history", "--field-failures", "--op", "matmul", "--ledger", str(db)]) == 0
    assert "no field failures" in capsys.readouterr().out
    assert cli.main(["history", "--field-failures", "--json", "--ledger", str(db)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(d["bucket"], d["kind"], d["resolved_by"], d["count"]) for d in doc] == [
        ("tsmall-d128", "mismatch", None, 1),
        ("tlarge-d128", "mismatch", "r-fixed", 1),
    ]
    # `show` of the run that promoted the kernel, and of the kernel itself (the same hash: both buckets' rows)
    assert cli.main(["show", promote_run, "--ledger", str(db)]) == 0
    assert "field failure: quantize_kv tsmall-d128" in capsys.readouterr().out
    assert cli.main(["show", str(cid), "--ledger", str(db)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("field failure:")]
    assert len(lines) == 2 and any("resolved by r-fixed" in x for x in lines)
    assert cli.main(["show", promote_run, "--json", "--ledger", str(db)]) == 0
    assert [d["bucket"] for d in json.loads(capsys.readouterr().out)["field_failures"]] == [
        "tsmall-d128",
        "tlarge-d128",
    ]


# -- report --------------------------------------------------------------------------------


def _ledger_with_a_promotion(tmp_path):
    led = Ledger(tmp_path / "l.db")
    run = led.start_run(
        {"ops": ["quantize_kv"]},
        {"torch": "2.11.0", "triton": "3.6.0", "driver": "580", "cuda": "13.0", "python": "3.12"},
        "search",
        ["quantize_kv"],
        "NVIDIA H200",
        {},
    )
    with open(GOOD) as f:
        src = f.read()
    cand, _ = led.add_candidate("quantize_kv", as_written(src), "search", run.id, label="evict-first")
    led.record_checks(
        cand.id,
        "full",
        [
            {"name": "static_gate", "status": "passed", "detail": "ok", "duration_s": 0.1},
            {"name": "fpsan", "status": "passed", "detail": "bitwise identical", "duration_s": 0.2},
        ],
    )
    led.set_candidate_status(
        cand.id, "verified", verdict={"passed": True, "fpsan_detail": "bitwise identical"}, fpsan_equivalent=True
    )
    for label, ms in (("baseline", 0.0570), ("candidate", 0.0500), ("anchor:torch.compile", 0.0691)):
        led.record_bench(
            run_id=run.id,
            candidate_id=cand.id,
            label=label,
            op="quantize_kv",
            shape_key="T=65536,H=8,D=128",
            bucket="tlarge-d128",
            dtype="bfloat16",
            gpu_name="NVIDIA H200",
            median_ms=ms,
            spread_ms=0.0001,
            n_samples=5,
            fraction_of_ceiling=0.84,
            ceiling_kind="memory",
        )
    led.set_candidate_status(cand.id, "benchmarked")
    led.record_promotion(
        run_id=run.id,
        op="quantize_kv",
        bucket="tlarge-d128",
        dtype="bfloat16",
        gpu_name="NVIDIA H200",
        candidate_id=cand.id,
        new_ms=0.05,
        old_ms=0.057,
        gain=0.12,
        spread=0.004,
        reason="12.3% faster than the incumbent",
        versions={"torch": "2.11.0"},
    )
    return led, run, cand


def test_report_is_pull_request_ready(tmp_path):
    led, run, cand = _ledger_with_a_promotion(tmp_path)
    path = write_report(led, run, str(tmp_path / "report"))
    md = open(path).read()
    for needle in (
        f"# kernel-agent run `{run.id}`",
        "## Promoted: `quantize_kv`",
        "| T=65536,H=8,D=128 |",
        "| 1.140x | 1.382x |",
        "Replaces the baseline: **1.140x** (12.3% less time)",
        "**FpSan-equivalent**",
        "| full | fpsan | passed |",
        "```diff",
        "eviction_policy='evict_first'",
        "torch 2.11.0",
        "![speedup per shape](speedup.png)",
    ):
        assert needle in md, needle
    for png in ("speedup.png", "progress.png"):
        with open(tmp_path / "report" / png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_timings_are_the_judged_graph_times_of_small_kernels(tmp_path):
    """Small kernels were judged on CUDA-graph replays: the report shows those, not the event times the
    host's launch overhead inflates (on the H200 an event reading once showed a promoted kernel slower)."""
    led, run, cand = _ledger_with_a_promotion(tmp_path)
    for label, ev, gr in (
        ("baseline", 0.1183, 0.0699),
        ("candidate", 0.1366, 0.0657),
        ("anchor:torch.compile", 0.0536, 0.0573),
    ):
        led.record_bench(
            run_id=run.id,
            candidate_id=cand.id,
            label=label,
            op="quantize_kv",
            shape_key="T=1024,H=8,D=128",
            bucket="tlarge-d128",
            dtype="bfloat16",
            gpu_name="NVIDIA H200",
            median_ms=ev,
            spread_ms=0.02,
            n_samples=5,
            graph_ms=gr,
            extra={"graph_spread_ms": 0.0004},
        )
    md = open(write_report(led, run, str(tmp_path / "report"))).read()
    assert f"| T=1024,H=8,D=128 | candidate #{cand.id} | 0.06570 | 0.00040 | graph | 1.064x |" in md
    assert "| T=1024,H=8,D=128 | baseline | 0.06990 | 0.00040 | graph |" in md
    assert "| T=65536,H=8,D=128 | baseline | 0.05700 | 0.00010 | events |" in md  # no graph rows there
    assert "on CUDA-event times and CUDA-graph replay times" in md  # the headline names both clocks


def test_report_history_and_show_commands(tmp_path):
    led, run, cand = _ledger_with_a_promotion(tmp_path)
    db = str(tmp_path / "l.db")
    r = _run(["report", run.id, "--ledger", db, "--out", str(tmp_path / "rep")])
    assert r.returncode == 0 and (tmp_path / "rep" / "report.md").exists()
    h = _run(["history", "--ledger", db, "--op", "quantize_kv", "--leaderboard", "--trend", "--json"])
    doc = json.loads(h.stdout)
    [entry] = doc["leaderboard"]["entries"]
    assert doc["runs"][0]["id"] == run.id and entry["speedup"] == pytest.approx(0.057 / 0.05, 1e-3)
    assert entry["clock"] == "event" and entry["incumbent"] == "baseline" and entry["candidate_id"] == cand.id
    assert doc["trend"][0]["speedup"] == pytest.approx(0.057 / 0.05, 1e-3)
    assert doc["trend"][0]["candidate_id"] == cand.id
    plain = _run(["history", "--ledger", db, "--status", "finished"])
    assert plain.returncode == 0 and "runs (0)" in plain.stdout  # the run is still 'running'
    s = _run(["show", run.id, "--ledger", db])
    assert s.returncode == 0 and "evict-first" in s.stdout and "promoted" in s.stdout
    assert "1.140x over baseline (events)" in s.stdout  # the figure the report and the leaderboard show
    c = _run(["show", str(cand.id), "--ledger", db, "--json"])
    [fig] = json.loads(c.stdout)["figures"]
    assert (fig["kernel_ms"], fig["incumbent_ms"], fig["clock"]) == (0.05, 0.057, "event")


# -- error paths ---------------------------------------------------------------------------


def test_bench_without_a_gpu_says_so_and_exits_nonzero():
    r = _run(["bench", "--op", "matmul"], env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 2 and "need a CUDA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["show", "r-nope"], "no run or candidate"),
        (["show", "999"], "no candidate 999"),
        (["run", "--resume", "r-nope"], "no run"),
        (["run", "--ops", "conv2d"], "unknown op"),
        (["run", "--time-limit", "soon"], "bad duration"),
        (["history", "--leaderboard"], "need --op"),
        (["report", "r-nope"], "no run"),
        (["demote", "--op", "matmul", "--bucket", "nope", "--reason", "x", "--gpu", "cpu"], "nothing serves"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    Ledger(tmp_path / "l.db").close()
    r = _run(args + ["--ledger", str(tmp_path / "l.db")])
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["history"], "no ledger at"),
        (["show", "r-nope"], "no ledger at"),
        (["report", "r-nope"], "no ledger at"),
        (["history", "--op", "banana"], "unknown op 'banana'"),
    ],
)
def test_read_commands_refuse_a_ledger_that_is_not_there_and_an_unknown_op(tmp_path, args, needle):
    """A mistyped --ledger on a command that only reads must not create an empty ledger and its folders."""
    path = tmp_path / "typo" / "l.db"
    r = _run(args + ["--ledger", str(path)])
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert not (tmp_path / "typo").exists()


def test_version_and_a_closed_pipe(tmp_path):
    from kernel_agent import __version__

    r = _run(["--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"kernel-agent {__version__}"
    led = Ledger(tmp_path / "l.db")
    for _ in range(1500):  # more than a pipe holds (64 KiB), so the writer meets the closed end
        led.start_run({}, {}, "search", ["matmul"], None, {})
    led.close()
    p = subprocess.Popen(
        CLI + ["history", "--ledger", str(tmp_path / "l.db"), "--limit", "1500"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()  # `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err  # quiet, but cut short: not a success


def test_a_ledger_from_a_newer_version_is_refused_not_touched(tmp_path):
    db = tmp_path / "l.db"
    Ledger(db).close()
    with sqlite3.connect(db) as con:
        con.execute("update meta set value = '99' where key = 'schema_version'")
    before = db.read_bytes()
    r = _run(["history", "--ledger", str(db)])
    assert r.returncode == 2 and "schema version 99" in r.stderr
    assert db.read_bytes() == before
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    r = _run(["history", "--ledger", str(junk)])
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_trend_judges_small_kernels_on_graph_times_and_the_incumbent_beside_them(tmp_path):
    from kernel_agent.agent.cli.views import speedup_trend

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["matmul"], "NVIDIA H200", {})
    cand, _ = led.add_candidate("matmul", as_written("x = 1\n"), "search", run.id, label="c")
    led.set_candidate_status(cand.id, "benchmarked")
    # event times polluted by host launch overhead; the graph replays tell the truth
    for label, cid, ms, graph in (
        ("baseline", cand.id, 0.0870, 0.0434),
        ("baseline", None, 0.0509, 0.0436),
        ("candidate", cand.id, 0.0600, 0.0420),
        ("anchor:torch.matmul", cand.id, 0.0445, 0.0339),
    ):
        led.record_bench(
            run_id=run.id,
            candidate_id=cid,
            label=label,
            op="matmul",
            shape_key="M=1,N=8192,K=8192",
            bucket="m1-klarge",
            dtype="bfloat16",
            gpu_name="NVIDIA H200",
            median_ms=ms,
            spread_ms=0.0002,
            n_samples=5,
            graph_ms=graph,
            extra={"graph_spread_ms": 0.0002},
        )
    [t] = speedup_trend(led, "matmul", [led.get_run(run.id)])
    assert t.speedup == pytest.approx(0.0434 / 0.0420)  # not 0.0509 / 0.0600 nor 0.0870 / 0.0600
    assert t.best.candidate_id == cand.id and t.best.clocks == "graph"
    led.close()


def test_a_model_without_an_endpoint_or_a_key_is_refused_before_the_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_") and k != "KERNEL_AGENT_MODEL"}
    r = subprocess.run(
        CLI + ["run", "--model", "x", "--ledger", str(tmp_path / "l.db")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=env,
    )
    assert r.returncode == 2 and "no endpoint" in r.stderr and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert not (tmp_path / "l.db").exists()  # nothing was recorded


def test_usage_errors_come_before_torch_is_imported():
    from kernel_agent.agent.cli.common import OP_NAMES
    from kernel_agent.ops import OPS

    assert tuple(OPS) == OP_NAMES
    code = (
        "import sys; from kernel_agent.agent.cli import main; rc = main(sys.argv[1:]); "
        "print(rc, 'torch' in sys.modules)"
    )
    for args in (["run", "--ops", "conv2d"], ["run", "--time-limit", "soon"], ["history", "--op", "banana"]):
        r = subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.stdout.split() == ["2", "False"], (args, r.stdout, r.stderr)


def test_internal_errors_do_not_leak_into_usage_errors(tmp_path):
    cfg = tmp_path / "ka.toml"
    cfg.write_text('[run]\ncandidates = "ten"\n')
    r = _run(["run", "--config", str(cfg), "--ledger", str(tmp_path / "l.db")])
    assert r.returncode == 2 and "candidates: expected an integer, got 'ten'" in r.stderr, r.stderr
    r = _run(["run", "--ops", "matmul", "--shapes", "matmul:1,2", "--ledger", str(tmp_path / "l.db")])
    assert r.returncode == 2 and "missing K (fields: M, N, K)" in r.stderr and "__init__" not in r.stderr, r.stderr


@pytest.mark.parametrize("width", [60, 80, 120])
def test_terminal_tables_fit_the_width_and_never_cut_an_id(monkeypatch, width):
    import io

    from rich.console import Console

    from kernel_agent.agent import ui

    buf = io.StringIO()
    monkeypatch.setattr(
        ui, "_console", Console(file=buf, force_terminal=True, width=width, color_system=None, highlight=False)
    )
    monkeypatch.delenv("TERM", raising=False)
    rows = [
        [
            "r20261201-225306-6fc2",
            "finished",
            "2026-12-01 22:53",
            "search",
            "matmul, attention, decode_attention, quantize_kv",
            "12",
            "0",
            "NVIDIA H200",
        ],
        ["r20261201-225410-1631", "finished", "2026-12-01 22:54", "search", "quantize_kv", "4", "0", "cpu"],
    ]
    ui.table("runs", ["run", "status", "started", "proposer", "ops", "candidates", "promoted", "gpu"], rows)
    lines = buf.getvalue().splitlines()
    assert all(len(ln) <= width for ln in lines)
    body = [ln for ln in lines if ln.startswith("r2026")]
    assert len(body) == 2  # one line per row: nothing folded
    assert body[0].split()[0] == "r20261201-225306-6fc2" and "finished" in body[0]
    if width >= 120:
        assert "not shown" not in buf.getvalue() and "NVIDIA H200" in body[0]
    else:
        assert "not shown at this width" in buf.getvalue()


def test_a_cpu_run_report_lists_every_candidate_with_its_verdict(tmp_path):
    led = Ledger(tmp_path / "l.db")
    run = led.start_run(
        {},
        {"torch": "2.13.0+cpu", "triton": "3.9.0", "cuda": None, "python": "3.11.7"},
        "search",
        ["quantize_kv"],
        None,
        {},
    )
    ok, _ = led.add_candidate("quantize_kv", as_written("x = 1\n"), "search", run.id, label="cfg-8-4")
    led.set_candidate_status(
        ok.id, "verified", verdict={"checks": [{"name": "bounds", "status": "passed"}] * 3}, fpsan_equivalent=True
    )
    bad, _ = led.add_candidate("quantize_kv", as_written("x = 2\n"), "search", run.id, label="cfg-1-1")
    led.set_candidate_status(
        bad.id,
        "rejected",
        verdict={
            "checks": [{"name": "bounds", "status": "failed", "detail": "store `out[9]` past the end | of the tensor"}]
        },
    )
    run2 = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    led.add_candidate(
        "quantize_kv", as_written("x = 1\n"), "search", run2.id, label="cfg-8-4"
    )  # replayed by a later run
    md = open(write_report(led, led.get_run(run.id), str(tmp_path / "r"))).read()
    assert "CUDA None" not in md and "driver None" not in md and "torch 2.13.0+cpu" in md
    assert f"| {ok.id} | quantize_kv | cfg-8-4 | verified | passed 3 checks; FpSan-equivalent |" in md
    row = next(ln for ln in md.splitlines() if ln.startswith(f"| {bad.id} |"))
    assert "rejected" in row and "bounds:" in row
    assert row.replace("\\|", "").count("|") == 6  # the candidate's text cannot add cells (its pipe is escaped)
    md2 = open(write_report(led, led.get_run(run2.id), str(tmp_path / "r2"))).read()
    assert "judged by an earlier run: passed 3 checks" in md2
    led.close()


def test_show_lists_each_check_once_from_its_most_thorough_mode(tmp_path):
    db = tmp_path / "l.db"
    led = Ledger(db)
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    c, _ = led.add_candidate("quantize_kv", as_written("x = 1\n"), "search", run.id, label="cfg-8-4")
    led.record_checks(
        c.id,
        "quick",
        [
            {"name": "bounds", "status": "passed", "detail": "on 2 cases", "duration_s": 0.1},
            {"name": "fpsan", "status": "passed", "detail": "quick fpsan", "duration_s": 0.2},
        ],
    )
    led.record_checks(
        c.id, "full", [{"name": "bounds", "status": "failed", "detail": "store past the end", "duration_s": 0.3}]
    )
    led.close()
    r = _run(["show", str(c.id), "--ledger", str(db)])
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.split()[:1] in (["quick"], ["full"])]
    assert [(x[0], x[1], x[2]) for x in rows] == [("full", "bounds", "FAIL"), ("quick", "fpsan", "ok")]
    assert "quick: 2 ok in 0.3s; full: 1 FAIL in 0.3s" in r.stdout


def test_show_of_an_unusable_reply_shows_no_diff(tmp_path):
    db = tmp_path / "l.db"
    led = Ledger(db)
    run = led.start_run({}, {}, "model", ["quantize_kv"], None, {})
    c, _ = led.add_candidate(
        "quantize_kv",
        as_written("# unusable model reply (r1, model call 1): no code block\n"),
        "model",
        run.id,
        label="r1",
    )
    led.set_candidate_status(
        c.id,
        "rejected",
        verdict={
            "passed": False,
            "error": "no code block",
            "checks": [{"name": "reply", "status": "failed", "passed": False, "detail": "no code block"}],
        },
    )
    led.close()
    r = _run(["show", str(c.id), "--ledger", str(db)])
    assert r.returncode == 0 and "no source: the model's reply was unusable (no code block)" in r.stdout
    assert "diff against" not in r.stdout and "\n-" not in r.stdout


def test_rejections_by_check_reach_the_run_summary_and_the_report(tmp_path, capsys):
    """run_summary's failed checks by name are what the summary after a run and the report print."""
    import argparse

    from kernel_agent.agent.cli.report import write_report
    from kernel_agent.agent.cli.run import _print_run_summary

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    for i, check in enumerate(("bounds", "bounds", "coverage")):
        c, _ = led.add_candidate("quantize_kv", as_written(f"def quantize_kv(x):\n    return {i}\n"), "search", run.id)
        led.record_checks(c.id, "full", [{"name": check, "status": "failed", "detail": "x", "duration_s": 0.1}])
        led.set_candidate_status(c.id, "rejected")
    summary = led.run_summary(run.id)
    assert summary.checks_failed == {"bounds": 2, "coverage": 1}
    _print_run_summary(summary, argparse.Namespace(json=False))
    out = capsys.readouterr().out
    assert "rejections by check" in out and "bounds" in out and "coverage" in out
    text = open(write_report(led, run, str(tmp_path / "report"))).read()
    assert "Rejections by the check that caught them: `bounds` 2, `coverage` 1" in text

"""The run ledger: schema, WAL, dedupe by hash, round trips, versions, restarts, filters."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text as sql_text

from kernel_agent.harness.field_failures import FailureKind, FieldFailure
from kernel_agent.harness.ledger import ledger as ledger_mod
from kernel_agent.harness.ledger.ledger import (
    SCHEMA_VERSION,
    BenchResult,
    Candidate,
    Ledger,
    LedgerError,
    ModelUsage,
    Run,
    RunNotesRecord,
)
from kernel_agent.sanitizer.canonical import as_written

SRC = "import triton\n\ndef quantize_kv(x):\n    return x\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def led(request, tmp_path):
    """A new ledger: a SQLite file, and the same tests again on a PostgreSQL server."""
    if request.param == "postgresql":
        lg = Ledger(request.getfixturevalue("postgres")())
    else:
        lg = Ledger(tmp_path / "runs" / "ledger.db")
    yield lg
    lg.close()


def _run(lg: Ledger, proposer="search", ops=("quantize_kv",), gpu="NVIDIA H200") -> Run:
    return lg.start_run({"budget": 3}, {"torch": "2.13", "triton": "3.9"}, proposer, list(ops), gpu, {"candidates": 10})


def _bench(
    lg: Ledger,
    median,
    candidate_id=None,
    label=None,
    shape_key="T=4,H=2,D=16",
    dtype="float16",
    gpu="NVIDIA H200",
    run_id=None,
    **kw,
) -> BenchResult:
    fields = dict(
        op="quantize_kv",
        shape_key=shape_key,
        bucket="tsmall-d16",
        dtype=dtype,
        gpu_name=gpu,
        median_ms=median,
        spread_ms=median * 0.01,
        n_samples=10,
        candidate_id=candidate_id,
        run_id=run_id,
        **kw,
    )
    if label is not None:
        fields["label"] = label
    return lg.record_bench(**fields)


def test_schema_created_with_version_and_wal(tmp_path):
    led = Ledger(tmp_path / "runs" / "ledger.db")
    try:
        _check_schema_and_wal(tmp_path, led)
    finally:
        led.close()


def _check_schema_and_wal(tmp_path, led):
    path = tmp_path / "runs" / "ledger.db"
    assert path.is_file()  # parent folder created
    con = sqlite3.connect(path)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {
            "meta",
            "run",
            "candidate",
            "proposal",
            "model_call",
            "check_result",
            "bench_result",
            "promotion",
        } <= tables
        assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()
    assert led.schema_version() == SCHEMA_VERSION
    # the session's own connections carry the per-connection pragmas
    with led._write_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 30000


def hash_source(text):
    return as_written(text).hash


def test_hash_source_normalises_trailing_whitespace():
    assert hash_source("a = 1  \nb = 2\n\n\n") == hash_source("a = 1\nb = 2")
    assert hash_source("a = 1\r\nb = 2\r\n") == hash_source("a = 1\nb = 2\n")
    assert hash_source("a = 1\n") != hash_source("a = 2\n")
    assert hash_source("  a = 1\n") != hash_source("a = 1\n")  # leading whitespace matters in Python


def test_add_candidate_dedupes_by_hash_and_records_proposals(led):
    r1 = _run(led)
    c1, new1 = led.add_candidate("quantize_kv", as_written(SRC), "search", r1.id, label="blk64")
    c2, new2 = led.add_candidate("quantize_kv", as_written(SRC + "   \n\n"), "model", r1.id)
    assert new1 and not new2
    assert c1.id == c2.id and c2.label == "blk64" and c2.proposer == "search"
    assert c1.source_hash == hash_source(SRC) and c1.first_run_id == r1.id and c1.status == "proposed"
    # the same source for another op is another candidate
    c3, new3 = led.add_candidate("matmul", as_written(SRC), "search", r1.id)
    assert new3 and c3.id != c1.id
    # a second run re-proposing a known source is recorded as a duplicate proposal
    r2 = _run(led)
    c4, new4 = led.add_candidate("quantize_kv", as_written(SRC), "model", r2.id, parent_id=c3.id)
    assert not new4 and c4.id == c1.id and c4.parent_id is None
    props = led.proposals(candidate_id=c1.id)
    assert [(p.run_id, p.duplicate) for p in props] == [(r1.id, False), (r1.id, True), (r2.id, True)]
    assert [c.id for c in led.candidates(run_id=r2.id)] == [c1.id]
    assert {c.id for c in led.candidates(run_id=r1.id)} == {c1.id, c3.id}
    assert [c.id for c in led.candidates(op="matmul")] == [c3.id]
    assert led.find_candidate("quantize_kv", as_written(SRC + "\n")).id == c1.id
    assert led.find_candidate("quantize_kv", as_written("other")) is None


def test_candidate_status_and_verdict(led):
    r = _run(led)
    c, _ = led.add_candidate("quantize_kv", as_written(SRC), "search", r.id)
    led.set_candidate_status(
        c.id, "rejected", verdict={"passed": False, "checks": [{"name": "bounds"}]}, fpsan_equivalent=False
    )
    got = led.candidate(c.id)
    assert got.status == "rejected" and got.verdict["checks"][0]["name"] == "bounds"
    assert got.fpsan_equivalent is False
    led.set_candidate_status(c.id, "verified")  # verdict kept when not given
    assert led.candidate(c.id).verdict["passed"] is False
    assert [x.id for x in led.candidates(status="verified")] == [c.id]
    with pytest.raises(ValueError):
        led.set_candidate_status(c.id, "great")
    with pytest.raises(LedgerError):
        led.set_candidate_status(9999, "verified")
    assert led.candidate(9999) is None


def test_checks_and_model_calls_round_trip(led):
    r = _run(led, proposer="model")
    c, _ = led.add_candidate("quantize_kv", as_written(SRC), "model", r.id)
    led.record_checks(
        c.id,
        "quick",
        [
            {"name": "static", "status": "passed", "detail": "", "duration_s": 0.01},
            {"name": "bounds", "status": "failed", "detail": "store out of bounds at [3]", "duration_s": 1.5},
            {"name": "fpsan", "passed": True, "detail": "equal"},
        ],
    )
    led.record_checks(c.id, "gpu", [{"name": "memcheck", "status": "skipped", "detail": "no GPU", "duration_s": 0}])
    checks = led.checks(c.id)
    assert [(k.name, k.status, k.mode) for k in checks] == [
        ("static", "passed", "quick"),
        ("bounds", "failed", "quick"),
        ("fpsan", "passed", "quick"),
        ("memcheck", "skipped", "gpu"),
    ]
    assert checks[1].detail == "store out of bounds at [3]" and checks[1].duration_s == 1.5
    assert [k.name for k in led.checks(c.id, mode="gpu")] == ["memcheck"]
    with pytest.raises(ValueError):
        led.record_checks(c.id, "quick", [{"name": "x", "status": "maybe"}])

    call = led.record_model_call(r.id, "gpt-x", "write a kernel", "```python\n...```", 120, 300, 2.5)
    bad = led.record_model_call(r.id, "gpt-x", "again", None, 100, 0, 30.0, error="timeout")
    led.link_model_call(call, c.id)
    calls = led.model_calls(run_id=r.id)
    assert [m.id for m in calls] == [call, bad]
    assert calls[0].candidate_id == c.id and calls[1].error == "timeout" and calls[1].response is None
    assert [m.id for m in led.model_calls(candidate_id=c.id)] == [call]

    summary = led.run_summary(r.id)
    assert summary.model == ModelUsage(
        calls=2, errors=1, prompt_tokens=220, completion_tokens=300, total_tokens=520, latency_s=32.5
    )
    assert summary.checks_failed == {"bounds": 1}
    assert summary.candidates_by_status["proposed"] == 1 and summary.proposals == 1
    assert summary.wall_s is not None and summary.wall_s >= 0


def test_bench_round_trip(led):
    r = _run(led)
    c, _ = led.add_candidate("quantize_kv", as_written(SRC), "search", r.id)
    b = _bench(
        led,
        0.5,
        candidate_id=c.id,
        run_id=r.id,
        graph_ms=0.45,
        fraction_of_ceiling=0.6,
        ceiling_kind="memory",
        extra={"samples": [0.5, 0.51]},
    )
    _bench(led, 1.0, run_id=r.id)
    _bench(led, 0.8, label="anchor:torch.compile", run_id=r.id)
    got = led.bench_results(candidate_id=c.id)
    assert len(got) == 1 and got[0].id == b.id and got[0].label == "candidate"
    assert got[0].graph_ms == 0.45 and got[0].extra == {"samples": [0.5, 0.51]} and got[0].implausible is False
    assert [x.label for x in led.bench_results(run_id=r.id)] == ["candidate", "baseline", "anchor:torch.compile"]
    assert led.bench_results(op="matmul") == []
    with pytest.raises(TypeError):
        led.record_bench(op="quantize_kv", median_ms=1.0)
    with pytest.raises(TypeError):
        _bench(led, 1.0, colour="red")


def test_promotions_active_and_demote(led):
    r = _run(led)
    c1, _ = led.add_candidate("quantize_kv", as_written(SRC), "search", r.id)
    c2, _ = led.add_candidate("quantize_kv", as_written(SRC + "# v2\n"), "search", r.id)
    key = dict(op="quantize_kv", bucket="tsmall-d16", dtype="float16", gpu_name="NVIDIA H200")
    assert led.active_promotion(**key) is None
    p1 = led.record_promotion(
        **key,
        run_id=r.id,
        candidate_id=c1.id,
        new_ms=0.9,
        old_ms=1.0,
        gain=0.1,
        spread=0.02,
        reason="10% faster",
        versions={"torch": "2.13"},
    )
    assert p1.replaced_candidate_id is None and p1.versions == {"torch": "2.13"}
    assert led.candidate(c1.id).status == "promoted"
    assert led.active_promotion(**key).id == p1.id
    # another key is independent
    assert led.active_promotion(**{**key, "dtype": "bfloat16"}) is None

    p2 = led.record_promotion(
        **key, run_id=r.id, candidate_id=c2.id, new_ms=0.7, old_ms=0.9, gain=0.22, spread=0.02, reason="22% faster"
    )
    assert p2.replaced_candidate_id == c1.id
    act = led.active_promotion(**key)
    assert act.id == p2.id
    old = [p for p in led.promotions(op="quantize_kv") if p.id == p1.id][0]
    assert old.demoted_at is not None and f"promotion {p2.id}" in old.demote_reason
    assert led.candidate(c1.id).status == "benchmarked" and led.candidate(c2.id).status == "promoted"

    assert led.demote(p2.id, "CI re-verification failed: bounds") is True
    assert led.demote(p2.id, "again") is False
    assert led.active_promotion(**key) is None
    assert [p.demote_reason for p in led.promotions() if p.id == p2.id] == ["CI re-verification failed: bounds"]
    assert led.promotions(active_only=True) == []
    assert [p.id for p in led.promotions()] == [p2.id, p1.id]  # newest first
    with pytest.raises(LedgerError):
        led.demote(12345, "nope")
    summary = led.run_summary(r.id)
    assert [p.id for p in summary.promotions] == [p1.id, p2.id]
    assert not any(p.active for p in summary.promotions)


def field_failure(**changes) -> FieldFailure:
    """A field failure of quantize_kv's tsmall-d16 bucket on the H200, as the serving guard builds one."""
    fields = dict(
        op="quantize_kv",
        bucket="tsmall-d16",
        dtype="float16",
        gpu="nvidia-h200",
        kernel="quantize_kv__tsmall-d16__float16__nvidia-h200.py",
        source_hash="a" * 64,
        shape_class="BLOCK=64|T%16|tsmall-d16",
        shapes=((3, 2, 16), (3, 2, 16), (3, 2)),
        strides=((32, 16, 1), (32, 16, 1), (2, 1)),
        dtypes=("float16", "int8", "float32"),
        kind=FailureKind.MISMATCH,
        detail="out[2,1,7]: 0.5 against 0.25",
        at=datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc),
    )
    fields.update(changes)
    return FieldFailure(**fields)  # type: ignore[arg-type]


def test_field_failures_round_trip_count_repeats_and_resolve_by_bucket(led):
    first = field_failure()
    fid = led.record_field_failure(first)
    later = datetime(2026, 12, 1, 11, 0, tzinfo=timezone.utc)
    # the same kernel, class and kind again while unresolved: counted on its row, the first evidence kept
    assert led.record_field_failure(field_failure(detail="another element", at=later)) == fid
    oom = led.record_field_failure(field_failure(kind=FailureKind.OUT_OF_MEMORY, detail="64 GiB"))
    other_bucket = led.record_field_failure(field_failure(bucket="tlarge-d16"))
    assert len({fid, oom, other_bucket}) == 3
    (row,) = [r for r in led.field_failures() if r.id == fid]
    assert (row.count, row.first_seen, row.last_seen, row.resolved) == (2, first.at, later, False)
    assert row.failure() == first  # what the guard handed over, read back whole (shapes, strides, dtypes, kind)
    assert [r.id for r in led.field_failures(unresolved_only=True, op="quantize_kv", bucket="tsmall-d16")] == [
        fid,
        oom,
    ]
    assert led.field_failures(op="matmul") == []
    # the bucket's failures on this GPU, however its name is spelled; the other bucket's stay
    assert led.resolve_field_failures("quantize_kv", "tsmall-d16", "float16", "NVIDIA H200", by="r-demote") == 2
    assert led.resolve_field_failures("quantize_kv", "tsmall-d16", "float16", "NVIDIA H200", by="again") == 0
    assert [r.id for r in led.field_failures(unresolved_only=True)] == [other_bucket]
    resolved = led.field_failures(resolved_by="r-demote")
    assert {r.id for r in resolved} == {fid, oom} and all(r.resolved_at is not None for r in resolved)
    # seen again after its resolution (a kernel promoted again, say): a new row, unresolved
    again = led.record_field_failure(field_failure())
    assert again not in (fid, oom) and led.field_failures(unresolved_only=True, bucket="tsmall-d16")[0].count == 1
    # one kernel's failures only, given its hash
    assert led.resolve_field_failures("quantize_kv", "tlarge-d16", "float16", "nvidia-h200", "x", "b" * 64) == 0
    assert led.resolve_field_failures("quantize_kv", "tlarge-d16", "float16", "nvidia-h200", "x", "a" * 64) == 1
    with pytest.raises(ValueError):
        led.record_field_failure(field_failure(kind="melted"))


def _benchmark(
    lg: Ledger,
    cid,
    run_id,
    cand_ms,
    inc_ms,
    anchor_ms=None,
    shape_key="T=4,H=2,D=16",
    dtype="float16",
    inc_label="baseline",
    graph=(None, None, None),
    **kw,
) -> None:
    """One benchmark as the loop records it: the incumbent, the candidate and the anchor under the
    candidate's id. graph: (candidate, incumbent, anchor) CUDA-graph times, None for none."""
    for label, ms, g in (
        (inc_label, inc_ms, graph[1]),
        ("candidate", cand_ms, graph[0]),
        ("anchor:torch.compile", anchor_ms, graph[2]),
    ):
        if ms is not None:
            _bench(
                lg,
                ms,
                candidate_id=cid,
                label=label,
                run_id=run_id,
                shape_key=shape_key,
                dtype=dtype,
                graph_ms=g,
                extra={"graph_spread_ms": g * 0.01} if g else None,
                **(kw if label == "candidate" else {}),
            )


def test_leaderboard_shows_the_candidates_that_beat_the_incumbent_timed_beside_them(led):
    r = _run(led)
    fast, _ = led.add_candidate("quantize_kv", as_written(SRC + "# fast\n"), "search", r.id, label="fast")
    slow, _ = led.add_candidate("quantize_kv", as_written(SRC + "# slow\n"), "search", r.id, label="slow")
    bad, _ = led.add_candidate("quantize_kv", as_written(SRC + "# wrong\n"), "search", r.id, label="wrong")
    odd, _ = led.add_candidate("quantize_kv", as_written(SRC + "# odd\n"), "search", r.id, label="odd")
    for c in (fast, slow, odd):
        led.set_candidate_status(c.id, "benchmarked")
    led.set_candidate_status(bad.id, "rejected")  # fastest of all, but rejected
    _bench(led, 0.4)  # a baseline timed on its own (`bench`): beside no candidate, so no figure's incumbent
    _benchmark(led, fast.id, r.id, 0.5, 1.0, anchor_ms=0.7)
    _benchmark(led, slow.id, r.id, 0.8, 1.2)
    _benchmark(led, bad.id, r.id, 0.1, 1.0)
    _benchmark(led, odd.id, r.id, 0.05, 1.0, implausible=True)  # above a ceiling: ignored
    # shape B: every candidate is slower than its incumbent there
    _benchmark(led, fast.id, r.id, 2.0, 1.9, shape_key="T=8,H=2,D=16")
    _benchmark(led, slow.id, r.id, 2.5, 1.9, shape_key="T=8,H=2,D=16")
    # another dtype
    _benchmark(led, fast.id, r.id, 1.0, 2.0, dtype="float32")

    board = led.leaderboard("quantize_kv", dtype="float16")
    [a] = board.entries
    assert a.figure.shape_key == "T=4,H=2,D=16" and a.figure.candidate_id == fast.id and a.label == "fast"
    assert (a.figure.kernel_ms, a.figure.incumbent_ms, a.figure.anchor_ms) == (0.5, 1.0, 0.7)
    assert a.figure.speedup == pytest.approx(2.0) and a.figure.clock == "event"
    assert board.unbeaten == ("tsmall-d16 T=8,H=2,D=16 float16 NVIDIA H200",)
    everything = led.leaderboard("quantize_kv")
    assert {(e.figure.dtype, e.figure.shape_key) for e in everything.entries} == {
        ("float16", "T=4,H=2,D=16"),
        ("float32", "T=4,H=2,D=16"),
    }
    assert led.leaderboard("matmul").entries == ()
    doc = everything.to_json()  # what `history --leaderboard --json` prints
    assert doc["entries"][0]["speedup"] == pytest.approx(2.0) and doc["entries"][0]["incumbent"] == "baseline"


def test_leaderboard_reads_graph_times_per_figure_not_per_shape(led):
    """A candidate slow enough to have no CUDA-graph time puts only its own figure on events; the small
    kernels are compared on graph replays, as the rule judged them."""
    r = _run(led)
    fast, _ = led.add_candidate("quantize_kv", as_written(SRC + "# fast\n"), "search", r.id, label="fast")
    slow, _ = led.add_candidate("quantize_kv", as_written(SRC + "# slow\n"), "search", r.id, label="slow")
    for c in (fast, slow):
        led.set_candidate_status(c.id, "benchmarked")
    # event times inflated by launch overhead: by events the fast one is slower than its incumbent
    _benchmark(led, fast.id, r.id, 0.090, 0.085, anchor_ms=0.060, graph=(0.050, 0.055, 0.040))
    _benchmark(led, slow.id, r.id, 0.300, 0.095, graph=(None, 0.055, None))
    [row] = led.leaderboard("quantize_kv").entries
    assert row.figure.clock == "graph" and row.figure.candidate_id == fast.id and row.figure.kernel_ms == 0.050
    assert row.figure.incumbent_ms == 0.055 and row.figure.anchor_ms == 0.040
    assert row.figure.speedup == pytest.approx(0.055 / 0.050)
    slow_fig = next(f for f in led.figures() if f.candidate_id == slow.id)
    assert slow_fig.clock == "event" and slow_fig.speedup == pytest.approx(0.095 / 0.300)


def test_leaderboard_compares_a_candidate_with_its_own_benchmark_after_a_promotion(led):
    """After a promotion the incumbent is the promoted kernel: a later candidate is judged against it,
    the promoted kernel keeps the speedup over the baseline it was timed beside."""
    r = _run(led)
    first, _ = led.add_candidate("quantize_kv", as_written(SRC + "# first\n"), "search", r.id, label="first")
    later, _ = led.add_candidate("quantize_kv", as_written(SRC + "# later\n"), "search", r.id, label="later")
    for c in (first, later):
        led.set_candidate_status(c.id, "benchmarked")
    _benchmark(led, first.id, r.id, 0.90, 1.00)
    _benchmark(led, later.id, r.id, 0.95, 0.90, inc_label="serving:quantize_kv__x.py")
    [row] = led.leaderboard("quantize_kv").entries
    assert row.figure.candidate_id == first.id and row.figure.speedup == pytest.approx(1.0 / 0.9)
    assert {f.candidate_id: f.incumbent_label for f in led.figures()} == {
        first.id: "baseline",
        later.id: "serving:quantize_kv__x.py",
    }


def test_newer_or_older_schema_version_is_refused(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    # (an older ledger this version can migrate: tests/test_ledger_migrations.py)
    for stored, hint in ((SCHEMA_VERSION + 1, "upgrade kernel-agent"), (0, "start a new ledger")):
        con = sqlite3.connect(path)
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(stored),))
        con.commit()
        con.close()
        before = path.read_bytes()
        with pytest.raises(LedgerError, match=f"schema version {stored}.*{hint}") as info:
            Ledger(path)
        assert "\n" not in str(info.value)
        assert path.read_bytes() == before  # not silently altered


def test_non_database_file_is_refused(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="not a SQLite database"):
        Ledger(path)
    assert path.read_bytes() == before
    with pytest.raises(LedgerError, match="directory"):
        Ledger(tmp_path)


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="not a kernel-agent ledger"):
        Ledger(path)
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # untouched
    con.close()


def test_data_survives_a_restart(tmp_path):
    path = tmp_path / "ledger.db"
    first = Ledger(path)
    r = _run(first)
    c, _ = first.add_candidate("quantize_kv", as_written(SRC), "search", r.id)
    first.record_checks(c.id, "full", [{"name": "bounds", "status": "passed", "detail": "", "duration_s": 0.2}])
    _bench(first, 0.5, candidate_id=c.id, run_id=r.id)
    # no close(): a killed process leaves committed steps behind, in the WAL file
    second = Ledger(path)
    try:
        got = second.get_run(r.id)
        assert got is not None and got.status == "running" and got.config == {"budget": 3}
        assert got.versions["triton"] == "3.9" and got.budget == {"candidates": 10} and got.op_list == ["quantize_kv"]
        assert [x.id for x in second.candidates(run_id=r.id)] == [c.id]
        assert second.candidate(c.id).source == SRC
        assert [k.name for k in second.checks(c.id)] == ["bounds"]
        assert second.bench_results(run_id=r.id)[0].median_ms == 0.5
        # the resumed process re-proposes the same source: no new candidate
        again, new = second.add_candidate("quantize_kv", as_written(SRC), "search", r.id)
        assert not new and again.id == c.id
        second.set_run_status(r.id, "interrupted")
        assert first.get_run(r.id).status == "interrupted"  # and the first instance sees it
    finally:
        first.close()
        second.close()


def test_run_status_and_filters(led):
    a = _run(led, proposer="search", ops=("quantize_kv", "matmul"))
    b = _run(led, proposer="model", ops=("attention",))
    c = _run(led, proposer="model", ops=("matmul",))
    assert a.status == "running" and a.finished_at is None and a.id.startswith("r")
    led.set_run_status(a.id, "finished")
    got = led.get_run(a.id)
    assert got.status == "finished" and got.finished_at is not None and got.finished_at >= got.started_at
    led.set_run_status(a.id, "running", finished=False)  # resumed
    assert led.get_run(a.id).finished_at is None
    led.set_run_status(a.id, "finished", finished=True)
    led.set_run_status(b.id, "failed")
    with pytest.raises(ValueError):
        led.set_run_status(b.id, "exploded", finished=True)
    assert led.get_run("r-missing") is None

    assert [r.id for r in led.runs()] == [c.id, b.id, a.id]  # newest first
    assert [r.id for r in led.runs(op="matmul")] == [c.id, a.id]
    assert [r.id for r in led.runs(op="quantize")] == []  # whole names only
    assert [r.id for r in led.runs(status="failed")] == [b.id]
    assert [r.id for r in led.runs(proposer="model")] == [c.id, b.id]
    assert [r.id for r in led.runs(proposer="model", op="matmul")] == [c.id]
    assert len(led.runs(limit=2)) == 2

    now = datetime.now(timezone.utc)
    assert len(led.runs(since=now - timedelta(hours=1))) == 3
    assert led.runs(since=now + timedelta(hours=1)) == []
    assert led.runs(until=now - timedelta(days=2)) == []
    assert len(led.runs(until=now.date())) == 3  # a bare date includes its whole day
    assert len(led.runs(since=(now - timedelta(days=1)).date().isoformat())) == 3


def test_run_notes_read_as_a_record_and_an_older_runs_plain_text_still_reads(led):
    """The notes column holds text on either backend: the JSON object `run` writes reads back as its fields
    (a key this version does not know kept), and the free text an older ledger's run holds as a record of it."""
    a, b, c = _run(led), _run(led), _run(led)
    assert led.get_run(a.id).notes == RunNotesRecord()  # none recorded: every field empty
    sessions = [{"candidates": 3, "resumed": False}]
    written = RunNotesRecord(elapsed_s=12.5, tokens=40, sessions=sessions, stop="budget", other={"branch": "x"})
    led.set_run_status(a.id, "finished", notes=written)
    got = led.get_run(a.id).notes
    assert got == written and got.sessions == sessions and got.other == {"branch": "x"} and got.text == ""
    with led._write.begin() as s:  # as an older version wrote them: plain text, and a JSON document that is no object
        s.execute(sql_text("UPDATE run SET notes = :n WHERE id = :i"), {"n": "tuned by hand {see log}", "i": b.id})
        s.execute(sql_text("UPDATE run SET notes = :n WHERE id = :i"), {"n": "[1, 2]", "i": c.id})
    old = led.get_run(b.id).notes
    assert old.text == "tuned by hand {see log}" and old.to_json() == {} and old.sessions is None
    assert led.get_run(c.id).notes.text == "[1, 2]"
    led.set_run_status(b.id, "finished", notes=old)  # read and written back, it is the same text
    with led._read() as s:
        assert s.execute(sql_text("SELECT notes FROM run WHERE id = :i"), {"i": b.id}).scalar_one() == old.text


def test_run_dates_filter_with_backdated_runs(led):
    """Runs started on different days, to check the date bounds precisely."""
    ids = []
    for day in (1, 2, 3):
        r = _run(led)
        ids.append(r.id)
        with led._write.begin() as s:
            s.get(Run, r.id).started_at = datetime(2026, 11, day, 12, 0, tzinfo=timezone.utc)
    assert [r.id for r in led.runs(since="2026-11-02")] == [ids[2], ids[1]]
    assert [r.id for r in led.runs(until="2026-11-02")] == [ids[1], ids[0]]
    assert [r.id for r in led.runs(since="2026-11-02", until="2026-11-02")] == [ids[1]]
    assert [r.id for r in led.runs(until=datetime(2026, 11, 2, 11, 0, tzinfo=timezone.utc))] == [ids[0]]


def test_one_source_hash_for_ledger_and_serving_set_blind_to_whitespace_habits_only():
    h = hash_source  # one definition (sanitizer/canonical.py), for the ledger and the serving set alike
    assert h(SRC + "  \n\n") == h(SRC) and h("x\r\ny\r\n") == h("x\ny") == h("x  \ny\n\n")
    assert h("x\ny") != h("x\n y") and h("x\ny") != h("x\n\ny") and h("") != h("x")


def test_candidate_type_is_detached_and_readable_after_close(tmp_path):
    lg = Ledger(tmp_path / "l.db")
    r = _run(lg)
    c, _ = lg.add_candidate("quantize_kv", as_written(SRC), "search", r.id)
    lg.close()
    assert isinstance(c, Candidate) and c.op == "quantize_kv" and c.source == SRC


@pytest.mark.parametrize("media_writable", [True, False])
def test_a_ledger_opened_read_only_is_read_and_not_changed(tmp_path, monkeypatch, media_writable):
    """Read commands open the ledger read-only (SQLite's immutable mode where its folder cannot be
    written, as on read-only media): they read it whole and cannot change it."""

    db = tmp_path / "l.db"
    led = Ledger(db)
    run = led.start_run({}, {}, "search", ["matmul"], None, {})
    led.add_candidate("matmul", as_written("x = 1\n"), "search", run.id, label="a")
    led.close()
    before = db.read_bytes()
    monkeypatch.setattr(ledger_mod, "_writable_dir", lambda p: media_writable)
    ro = Ledger(db, read_only=True)
    assert [r.id for r in ro.runs()] == [run.id] and [c.label for c in ro.candidates(run_id=run.id)] == ["a"]
    with pytest.raises(Exception):
        ro.start_run({}, {}, "search", ["matmul"], None, {})
    ro.close()
    assert db.read_bytes() == before
    with pytest.raises(LedgerError):
        Ledger(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()


def test_every_ledger_a_command_opens_is_closed_however_it_ends(tmp_path, monkeypatch, capsys):
    """`main` closes the ledgers its command opened: after a command that succeeds and after one that fails
    (on PostgreSQL each open engine holds server connections until then)."""
    from kernel_agent.agent.cli import parser as cli

    path = tmp_path / "ledger.db"
    with Ledger(path) as lg:
        _run(lg)
    closed = []
    real_close = Ledger.close
    monkeypatch.setattr(Ledger, "close", lambda self: (closed.append(self), real_close(self)))
    assert cli.main(["history", "--ledger", str(path)]) == 0
    assert len(closed) == 1
    assert cli.main(["show", "r-no-such-run", "--ledger", str(path)]) != 0
    assert len(closed) == 2 and closed[0] is not closed[1]
    capsys.readouterr()
    # within a command, every step that asks gets the one ledger it opened (bench asks after every shape)
    from kernel_agent.agent.cli.common import open_ledger

    args = cli.build_parser().parse_args(["history", "--ledger", str(path)])
    assert open_ledger(args) is open_ledger(args) and open_ledger(args, read=True) is not open_ledger(args)
    for led in args._ledgers.values():
        real_close(led)

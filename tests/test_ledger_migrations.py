"""Schema migrations of the ledger (harness/ledger/ledger_migrations.py), on SQLite and on PostgreSQL: a
version-1 ledger made from the version-1 DDL (tests/ledger_v1_schema.py) is read as it is by the read
commands, refused by the writing ones with the command that upgrades it, and upgraded keeping every row,
to the schema a new ledger has; a newer ledger is still refused; two processes upgrading at once
migrate once."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy import inspect as sa_inspect

from kernel_agent.agent.cli import parser as cli
from kernel_agent.harness.field_failures import FailureKind, FieldFailure
from kernel_agent.harness.ledger import ledger_migrations as migrations
from kernel_agent.harness.ledger.ledger import SCHEMA_VERSION, WRITE_LOCK_KEY, Ledger, LedgerError, upgrade_ledger
from ledger_v1_schema import V1_DDL
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = ("meta", "run", "candidate", "proposal", "model_call", "check_result", "bench_result", "promotion")
T0 = datetime(2026, 3, 1, 12, 0, 0)


def _url(location) -> str:
    return location if "://" in str(location) else f"sqlite:///{location}"


def _make_v1(location, dialect: str) -> None:
    """A version-1 ledger as kernel-agent wrote one: its DDL, then a run with a candidate at every stage
    the tables record (proposal, model call, checks, benchmark rows of two buckets, a promotion)."""
    engine = create_engine(_url(location))
    with engine.begin() as conn:
        if dialect == "sqlite":
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        for stmt in V1_DDL[dialect]:
            conn.exec_driver_sql(stmt)
        conn.execute(
            text(
                "INSERT INTO run (id, started_at, finished_at, status, config_json, versions_json, gpu_name, "
                "proposer, ops, budget_json, notes) VALUES ('r1', :t, :t, 'finished', '{}', '{}', "
                "'NVIDIA H200', 'search', 'quantize_kv', '{}', 'old notes')"
            ),
            {"t": T0},
        )
        conn.execute(
            text(
                "INSERT INTO candidate (id, op, source_hash, source, path, parent_id, proposer, label, "
                "created_at, first_run_id, status, verdict_json, fpsan_equivalent) VALUES (1, 'quantize_kv', "
                "'abc', 'x = 1', 'kernels/candidates/quantize_kv/b0/a.py', NULL, 'search', 'blk64', :t, "
                "'r1', 'promoted', '{\"passed\": true}', :yes)"
            ),
            {"t": T0, "yes": True},
        )
        conn.execute(
            text(
                "INSERT INTO proposal (id, run_id, candidate_id, proposer, created_at, duplicate) "
                "VALUES (1, 'r1', 1, 'search', :t, :no)"
            ),
            {"t": T0, "no": False},
        )
        conn.execute(
            text(
                "INSERT INTO model_call (id, run_id, candidate_id, model, prompt, response, prompt_tokens, "
                "completion_tokens, latency_s, error, created_at) VALUES (1, 'r1', 1, 'm', 'p', 'r', 10, 20, "
                "1.5, NULL, :t)"
            ),
            {"t": T0},
        )
        conn.execute(
            text(
                "INSERT INTO check_result (id, candidate_id, name, status, detail, duration_s, mode, "
                "created_at) VALUES (1, 1, 'bounds', 'passed', '', 0.5, 'full', :t)"
            ),
            {"t": T0},
        )
        for i, (label, bucket) in enumerate([("candidate", "b0"), ("baseline", "b0"), ("baseline", "b1")], start=1):
            conn.execute(
                text(
                    "INSERT INTO bench_result (id, run_id, candidate_id, label, op, shape_key, bucket, dtype, "
                    "gpu_name, median_ms, spread_ms, n_samples, graph_ms, fraction_of_ceiling, ceiling_kind, "
                    "implausible, extra_json, created_at) VALUES (:i, 'r1', :c, :label, 'quantize_kv', "
                    "'T=4', :bucket, 'float16', 'NVIDIA H200', :ms, 0.001, 10, NULL, NULL, NULL, :no, NULL, "
                    ":t)"
                ),
                {
                    "i": i,
                    "c": 1 if label == "candidate" else None,
                    "label": label,
                    "bucket": bucket,
                    "ms": 0.1 * i,
                    "no": False,
                    "t": T0,
                },
            )
        conn.execute(
            text(
                "INSERT INTO promotion (id, run_id, op, bucket, dtype, gpu_name, candidate_id, "
                "replaced_candidate_id, new_ms, old_ms, gain, spread, reason, versions_json, created_at, "
                "demoted_at, demote_reason) VALUES (1, 'r1', 'quantize_kv', 'b0', 'float16', 'NVIDIA H200', "
                "1, NULL, 0.1, 0.2, 0.5, 0.01, 'faster', '{}', :t, NULL, NULL)"
            ),
            {"t": T0},
        )
    engine.dispose()


def _rows(location) -> dict:
    engine = create_engine(_url(location))
    with engine.connect() as conn:
        rows = {t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1"))] for t in TABLES}
    engine.dispose()
    return rows


def _schema(location) -> dict:
    """Tables, columns, keys, indices and unique constraints, as SQLAlchemy reads them back."""
    engine = create_engine(_url(location))
    insp = sa_inspect(engine)
    out = {}
    for t in sorted(insp.get_table_names()):
        out[t] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(t)],
            "pk": insp.get_pk_constraint(t)["constrained_columns"],
            "fks": sorted((tuple(f["constrained_columns"]), f["referred_table"]) for f in insp.get_foreign_keys(t)),
            "indices": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(t)),
            "unique": sorted((u["name"], tuple(u["column_names"])) for u in insp.get_unique_constraints(t)),
        }
    engine.dispose()
    return out


def _version(location) -> int:
    engine = create_engine(_url(location))
    with engine.connect() as conn:
        v = int(conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar_one())
    engine.dispose()
    return v


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path):
    """(dialect, a function returning a new empty ledger location)."""
    if request.param == "postgresql":
        return "postgresql", request.getfixturevalue("postgres")
    names = iter(range(100))
    return "sqlite", lambda: str(tmp_path / f"ledger{next(names)}.db")


def test_the_registry_is_one_documented_chain_to_the_schema_version():
    assert [m.from_version for m in migrations.MIGRATIONS] == list(range(1, SCHEMA_VERSION))
    assert all(m.doc and m.to_version == m.from_version + 1 for m in migrations.MIGRATIONS)
    migrations.check_registry(SCHEMA_VERSION)
    with pytest.raises(AssertionError, match="needs"):
        migrations.check_registry(SCHEMA_VERSION + 1)  # a version without its step


def test_a_version_1_ledger_is_read_as_it_is_refused_for_writing_and_upgraded_keeping_every_row(backend):
    dialect, new_location = backend
    old = new_location()
    _make_v1(old, dialect)
    rows, schema_v1 = _rows(old), _schema(old)
    before = open(old, "rb").read() if dialect == "sqlite" else None

    with Ledger(old, read_only=True) as ro:  # the read commands read it, unchanged
        assert ro.schema_version() == 1
        assert [r.id for r in ro.runs()] == ["r1"]
        assert ro.run_summary("r1").candidates_by_status["promoted"] == 1
        assert [b.id for b in ro.bench_results(op="quantize_kv", bucket="b0", dtype="float16")] == [1, 2]
    assert _version(old) == 1 and _schema(old) == schema_v1
    if dialect == "sqlite":
        assert open(old, "rb").read() == before

    with pytest.raises(LedgerError, match="schema version 1, older .*`kernel-agent ledger upgrade --ledger ") as info:
        Ledger(old)
    assert "\n" not in str(info.value) and _version(old) == 1

    done = upgrade_ledger(old)
    assert (done.from_version, done.version, done.reached) == (1, SCHEMA_VERSION, list(range(2, SCHEMA_VERSION + 1)))
    assert _rows(old) == {**rows, "meta": [("schema_version", str(SCHEMA_VERSION))]}  # every row kept
    fresh = new_location()
    Ledger(fresh).close()
    assert _schema(old) == _schema(fresh)  # the same end schema as a new ledger's
    assert ("ix_bench_result_op_bucket_dtype", ("op", "bucket", "dtype"), False) in _schema(old)["bench_result"][
        "indices"
    ]
    if dialect == "sqlite":  # the file as it was, kept beside it
        assert done.backup is not None and str(done.backup) == f"{old}.v1.bak"
        assert _rows(done.backup) == rows and _schema(done.backup) == schema_v1
        with sqlite3.connect(done.backup) as con:
            assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file, no WAL beside it
    else:
        assert done.backup is None

    with Ledger(old) as led:  # written as any ledger now
        run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
        assert led.get_run(run.id) is not None and led.candidate(1).label == "blk64"
    again = upgrade_ledger(old)
    assert again.reached == [] and again.version == SCHEMA_VERSION


def test_a_newer_ledger_is_refused_for_reading_writing_and_upgrading(backend):
    dialect, new_location = backend
    loc = new_location()
    Ledger(loc).close()
    engine = create_engine(_url(loc))
    with engine.begin() as conn:
        conn.execute(text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": str(SCHEMA_VERSION + 1)})
    engine.dispose()
    for open_it in (lambda: Ledger(loc), lambda: Ledger(loc, read_only=True), lambda: upgrade_ledger(loc)):
        with pytest.raises(LedgerError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade kernel-agent"):
            open_it()
    assert _version(loc) == SCHEMA_VERSION + 1
    if dialect == "sqlite":
        assert not os.path.exists(f"{loc}.v{SCHEMA_VERSION + 1}.bak")


def test_a_ledger_older_than_every_migration_is_refused(tmp_path):
    path = tmp_path / "l.db"
    _make_v1(path, "sqlite")
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value = '0' WHERE key = 'schema_version'")
    for open_it in (lambda: Ledger(path), lambda: Ledger(path, read_only=True), lambda: upgrade_ledger(path)):
        with pytest.raises(LedgerError, match="no migration from it: start a new ledger"):
            open_it()
    assert not (tmp_path / "l.db.v0.bak").exists()


UPGRADER = (
    "import sys\nfrom kernel_agent.harness.ledger.ledger import upgrade_ledger\n"
    "print(upgrade_ledger(sys.argv[1]).reached)\n"
)


def _hold_write_lock(location, dialect):
    """A connection holding the ledger's write lock, as a writer in a transaction does."""
    engine = create_engine(_url(location))
    conn = engine.connect()
    if dialect == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # (pysqlite would begin lazily; this takes the lock now)
    else:
        conn.begin()
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
    return engine, conn


def _waiting_for_lock(location, dialect, n, timeout=60.0):
    """Until `n` upgraders wait on the write lock (PostgreSQL shows them; on SQLite give them time)."""
    if dialect == "sqlite":
        time.sleep(5.0)
        return
    engine = create_engine(_url(location))
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            with engine.connect() as conn:
                if (
                    conn.exec_driver_sql(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    ).scalar()
                    >= n
                ):
                    return
            time.sleep(0.2)
        raise AssertionError(f"{n} upgraders did not reach the write lock")
    finally:
        engine.dispose()


def test_two_processes_upgrading_at_once_migrate_once(backend, tmp_path):
    """Both find version 1, both wait on the write lock (held here until they do), and the one that gets
    it second finds the version raised and applies nothing."""
    dialect, new_location = backend
    loc = new_location()
    _make_v1(loc, dialect)
    rows = _rows(loc)
    script = tmp_path / "upgrade.py"
    script.write_text(UPGRADER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    engine, holder = _hold_write_lock(loc, dialect)
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), loc], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            for _ in range(2)
        ]
        _waiting_for_lock(loc, dialect, 2)
    finally:
        holder.rollback()
        holder.close()
        engine.dispose()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
    # each step is applied once, by whichever process took the lock for it (one may take them all)
    reached = [json.loads(o[0].strip()) for o in outs]
    assert sorted(v for r in reached for v in r) == list(range(2, SCHEMA_VERSION + 1))
    assert _version(loc) == SCHEMA_VERSION and _rows(loc) == {**rows, "meta": [("schema_version", str(SCHEMA_VERSION))]}


@exhaustive  # `run` refused in a process, twice, then the upgrade: the quick tier reads a version 1 ledger above
def test_the_commands_on_a_version_1_ledger(tmp_path, capsys):
    """`history` reads a version-1 file without changing it; `run` refuses it with the one line that names
    `kernel-agent ledger upgrade`, which upgrades it and says where the old file is kept."""
    path = tmp_path / "l.db"
    _make_v1(path, "sqlite")
    before = path.read_bytes()
    assert cli.main(["history", "--ledger", str(path)]) == 0
    assert "r1" in capsys.readouterr().out and path.read_bytes() == before
    env = dict(os.environ, TRITON_INTERPRET="1", KERNEL_AGENT_SERVING_DIR=str(tmp_path / "serving"))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_agent.agent.cli",
            "run",
            "--ops",
            "quantize_kv",
            "--candidates",
            "1",
            "--ledger",
            str(path),
            "--candidates-dir",
            str(tmp_path / "c"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = run.stderr.strip()
    assert run.returncode == 2 and len(err.splitlines()) == 1, err[-2000:]
    assert f"`kernel-agent ledger upgrade --ledger {path}`" in err
    assert path.read_bytes() == before
    # on a cluster too, and before the cluster is contacted (nothing listens at that address)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_agent.agent.cli",
            "run",
            "--ops",
            "quantize_kv",
            "--cluster",
            "127.0.0.1:9",
            "--ledger",
            str(path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = run.stderr.strip()
    assert run.returncode == 2 and "kernel-agent ledger upgrade" in err and "cluster" not in err, err[-2000:]
    assert path.read_bytes() == before
    assert cli.main(["ledger", "upgrade", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"upgraded from schema version 1 to {SCHEMA_VERSION}" in out and f"{path}.v1.bak" in out
    assert cli.main(["ledger", "upgrade", "--ledger", str(path)]) == 0
    assert "nothing to upgrade" in capsys.readouterr().out
    assert cli.main(["ledger", "upgrade", "--ledger", str(tmp_path / "typo.db")]) == 2
    assert not (tmp_path / "typo.db").exists()


def _make_v3(location, dialect: str) -> None:
    """A version-3 ledger as the kernel-agent of version 3 left one: the version-1 ledger above upgraded
    by the steps to 3 (which end at the schema a new version-3 ledger had: the test above compared them
    while 3 was the newest), with a diagnosis and a pruned proposal of its own."""
    _make_v1(location, dialect)
    engine = create_engine(_url(location))
    assert migrations.migrate(engine, 3) == [2, 3]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO diagnosis (id, run_id, op, bucket, dtype, source_hash, incumbent, bound, "
                "document_json, created_at) VALUES (1, 'r1', 'quantize_kv', 'b0', 'float16', 'abc', 'baseline', "
                "'memory', '{}', :t)"
            ),
            {"t": T0},
        )
        conn.execute(
            text(
                "INSERT INTO pruned_proposal (id, run_id, op, bucket, dtype, label, source_hash, reason, "
                "created_at) VALUES (1, 'r1', 'quantize_kv', 'b0', 'float16', 'cfg', 'def', 'spills', :t)"
            ),
            {"t": T0},
        )
    engine.dispose()


def test_a_version_3_ledger_gets_the_field_failure_table_keeping_every_row(backend):
    dialect, new_location = backend
    old = new_location()
    _make_v3(old, dialect)
    tables = TABLES + ("diagnosis", "pruned_proposal")
    engine = create_engine(_url(old))
    with engine.connect() as conn:
        rows = {t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1"))] for t in tables}
    engine.dispose()
    assert "field_failure" not in _schema(old)
    with Ledger(old, read_only=True) as ro:  # read as it is: a ledger with no field failures
        assert ro.schema_version() == 3 and ro.field_failures() == [] and len(ro.diagnoses()) == 1
    with pytest.raises(LedgerError, match="schema version 3, older .*kernel-agent ledger upgrade"):
        Ledger(old)

    done = upgrade_ledger(old)
    assert (done.from_version, done.reached) == (3, [4])
    if dialect == "sqlite":
        assert str(done.backup) == f"{old}.v3.bak"
    fresh = new_location()
    Ledger(fresh).close()
    assert _schema(old) == _schema(fresh)
    engine = create_engine(_url(old))
    with engine.connect() as conn:
        after = {t: [tuple(r) for r in conn.execute(text(f"SELECT * FROM {t} ORDER BY 1"))] for t in tables}
    engine.dispose()
    assert after == {**rows, "meta": [("schema_version", str(SCHEMA_VERSION))]}
    ff = FieldFailure(
        "quantize_kv",
        "b0",
        "float16",
        "nvidia-h200",
        "k.py",
        "abc",
        "cls",
        ((4,),),
        ((1,),),
        ("float16",),
        FailureKind.TIMEOUT,
        "past 30 s",
    )
    with Ledger(old) as led:
        fid = led.record_field_failure(ff)
        assert [r.failure() for r in led.field_failures(unresolved_only=True)] == [ff] and fid >= 1

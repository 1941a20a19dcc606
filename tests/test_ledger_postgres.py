"""The ledger on a real PostgreSQL server (tests/conftest.py starts one): what a server ledger refuses,
several processes and several runs writing one ledger at once, and the commands reading it unchanged.
(tests/test_ledger.py runs the whole ledger suite on PostgreSQL as well as on SQLite.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sqlalchemy import create_engine

from kernel_agent.harness.ledger.ledger import SCHEMA_VERSION, WRITE_LOCK_KEY, Ledger, LedgerError, server_url
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
SRC = "import triton\n\ndef quantize_kv(x):\n    return x  # {}\n"


def test_urls_name_a_server_or_a_file(tmp_path):
    assert server_url(tmp_path / "l.db") is None and server_url("runs/ledger.db") is None
    assert server_url(f"sqlite:///{tmp_path}/l.db") is None  # a file, as a URL
    url = server_url("postgresql://u:secret@db.example:5432/ledger")
    assert url.drivername == "postgresql+psycopg" and url.database == "ledger"
    with pytest.raises(LedgerError, match="SQLite file or a PostgreSQL database"):
        server_url("mysql://u@host/db")
    led = Ledger(f"sqlite:///{tmp_path}/via-url.db")
    led.close()
    assert (tmp_path / "via-url.db").is_file()


def test_a_server_ledger_is_created_versioned_and_refuses_what_is_not_one(postgres):
    url = postgres()
    with Ledger(url) as led:
        assert led.schema_version() == SCHEMA_VERSION and led.path is None
        run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    with Ledger(url, read_only=True) as ro:  # read back, and read-only on the server
        assert ro.get_run(run.id).proposer == "search"
        with pytest.raises(Exception, match="read-only"):
            ro.start_run({}, {}, "search", ["quantize_kv"], None, {})
    engine = create_engine(url)
    with engine.begin() as conn:  # a newer kernel-agent wrote it: refused before anything is written
        conn.exec_driver_sql(f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="upgrade kernel-agent"):
        Ledger(url)
    other = postgres()  # a database of something else
    engine.dispose()
    engine = create_engine(other)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE orders (id integer)")
    engine.dispose()
    with pytest.raises(LedgerError, match="no kernel-agent ledger"):
        Ledger(other)
    with pytest.raises(LedgerError, match="no ledger in"):
        Ledger(postgres(), read_only=True)
    with pytest.raises(LedgerError, match="cannot be opened"):
        Ledger("postgresql://nobody@127.0.0.1:9/none?connect_timeout=2")


WRITER = textwrap.dedent("""
    import sys
    from kernel_agent.harness.ledger.ledger import Ledger
    from kernel_agent.sanitizer.canonical import as_written
    url, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    led = Ledger(url)
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    for i in range(n):
        # every writer proposes the shared sources in the same order, and one of its own each time
        led.add_candidate("quantize_kv", as_written(SRC.format(f"shared {i}")), "search", run.id)
        led.add_candidate("quantize_kv", as_written(SRC.format(f"{who} {i}")), "search", run.id)
    led.set_run_status(run.id, "finished")
    print(run.id)
""")


def test_concurrent_writers_on_one_server_ledger_record_each_source_once(postgres, tmp_path):
    """Four processes propose 15 shared sources and 15 of their own at once: each source is one
    candidate, proposed first by exactly one run; every proposal is recorded; the write lock is what
    serializes them (without it, the read-then-insert of a first proposal races)."""
    url = postgres()
    Ledger(url).close()  # the schema, created once (concurrent creation is the next test's)
    script = tmp_path / "writer.py"
    script.write_text(f"SRC = {SRC!r}\n" + WRITER)
    n = 15
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, f"w{k}", str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-800:] for o in outs]
    run_ids = [o[0].strip() for o in outs]
    with Ledger(url, read_only=True) as led:
        assert all(led.get_run(r).status == "finished" for r in run_ids)
        engine = create_engine(url)
        with engine.connect() as conn:
            per_source = conn.exec_driver_sql(
                "SELECT source_hash, count(*) FROM candidate GROUP BY source_hash"
            ).fetchall()
            proposals = conn.exec_driver_sql("SELECT duplicate, count(*) FROM proposal GROUP BY duplicate").fetchall()
            firsts = conn.exec_driver_sql("SELECT count(*) FROM candidate WHERE first_run_id IS NOT NULL").scalar()
        engine.dispose()
    assert len(per_source) == n + 4 * n and all(c == 1 for _, c in per_source)
    counts = dict(proposals)
    assert counts[False] == n + 4 * n and counts[True] == 3 * n  # each shared source: 1 first, 3 repeats
    assert firsts == n + 4 * n


def test_concurrent_first_opens_of_a_new_server_ledger_create_it_once(postgres, tmp_path):
    url = postgres()
    script = tmp_path / "open.py"
    script.write_text(
        "import sys\nfrom kernel_agent.harness.ledger.ledger import Ledger\nLedger(sys.argv[1]).close()\n"
    )
    procs = [subprocess.Popen([sys.executable, str(script), url], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-800:] for e in errs]
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM meta WHERE key = 'schema_version'").scalar() == 1
    engine.dispose()


def test_the_write_lock_serializes_writers_and_not_readers(postgres):
    """While one connection holds the ledger's write lock, a second writer waits and a reader does not."""
    url = postgres()
    led = Ledger(url)
    holder = create_engine(url)
    try:
        with holder.begin() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
            waiter = create_engine(url)
            with waiter.connect() as other:
                got = other.exec_driver_sql(f"SELECT pg_try_advisory_xact_lock({WRITE_LOCK_KEY})").scalar()
                other.rollback()
            waiter.dispose()
            assert got is False  # a writer would queue here
            assert led.runs() == []  # a reader goes on
    finally:
        holder.dispose()
        led.close()


@exhaustive  # two whole runs: the quick tier's concurrent writers are the processes above
def test_two_concurrent_runs_write_one_server_ledger_and_the_commands_read_it(postgres, tmp_path):
    """Two `kernel-agent run`s at once (CPU: the sanitizer, no benchmark) on one PostgreSQL ledger, then
    `history`, `show` and `report` read it as they read a file."""
    url = postgres()
    env = dict(os.environ, TRITON_INTERPRET="1", KERNEL_AGENT_SERVING_DIR=str(tmp_path / "serving"))
    runs = [
        subprocess.Popen(
            CLI
            + [
                "run",
                "--ops",
                "quantize_kv",
                "--candidates",
                "1",
                "--per-round",
                "1",
                "--seed",
                str(seed),
                "--jobs",
                "1",
                "--ledger",
                url,
                "--json",
                "--candidates-dir",
                str(tmp_path / f"cands{seed}"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    outs = [p.communicate(timeout=900) for p in runs]
    assert all(p.returncode == 0 for p in runs), [o[1][-1500:] for o in outs]
    summaries = [json.loads(o[0]) for o in outs]
    ids = [s["run_id"] for s in summaries]
    assert len(set(ids)) == 2
    hist = subprocess.run(
        CLI + ["history", "--ledger", url], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert hist.returncode == 0 and all(i in hist.stdout for i in ids), hist.stderr[-800:]
    for i in ids:
        show = subprocess.run(
            CLI + ["show", i, "--ledger", url], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert show.returncode == 0 and i in show.stdout, show.stderr[-800:]
    rep = subprocess.run(
        CLI + ["report", ids[0], "--ledger", url, "--out", str(tmp_path / "report")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0 and (tmp_path / "report" / "report.md").is_file(), rep.stderr[-800:]
    with Ledger(url, read_only=True) as led:
        assert all(led.get_run(i).status == "finished" for i in ids)
    engine = create_engine(url)
    with engine.connect() as conn:
        per_run = dict(conn.exec_driver_sql("SELECT run_id, count(*) FROM proposal GROUP BY run_id").fetchall())
        per_source = conn.exec_driver_sql("SELECT count(*) FROM candidate GROUP BY op, source_hash").fetchall()
    engine.dispose()
    assert all(per_run.get(i, 0) >= 1 for i in ids) and all(c == (1,) for c in per_source)


HOLDER = textwrap.dedent("""
    import os
    import time


    def test_holds_the_server(postgres):
        postgres()
        with open(os.environ["KA_SERVER_READY"] + ".part", "w") as f:
            f.write(postgres.pgdata)
        os.rename(os.environ["KA_SERVER_READY"] + ".part", os.environ["KA_SERVER_READY"])
        time.sleep(600)
""")


def _pgdata_processes(pgdata) -> list:
    """The processes whose command line names the data folder (the postmaster: `postgres -D PGDATA ...`)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(pgdata).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize(
    "sig,workers",
    [
        pytest.param(signal.SIGKILL, [], id="SIGKILL"),
        pytest.param(signal.SIGTERM, [], id="SIGTERM", marks=exhaustive),
        pytest.param(signal.SIGINT, [], id="SIGINT", marks=exhaustive),
    ],
)
def test_the_sessions_server_stops_when_the_test_run_is_killed(sig, workers, tmp_path):
    """pytest on a test that holds the `postgres` fixture, killed with SIG once the server is up: the
    postmaster is gone within seconds and its data folder removed, whatever the signal (SIGKILL leaves no
    teardown, only the watchdog). (A case killing pytest-xdist's controller passed without the controller
    watch too, so it showed nothing, and timed out under load: it is not kept.)"""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder's own rootdir: none of the repository's addopts
    (tmp_path / "test_holder.py").write_text(HOLDER)
    ready = tmp_path / "ready"
    env = dict(os.environ, KA_SERVER_READY=str(ready), PYTHONPATH=os.path.join(ROOT, "tests"))
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "conftest", "--basetemp", str(tmp_path / "base"), *workers]
        + ["test_holder.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Ctrl-C's default, also where these tests run with SIGINT ignored (a non-interactive shell's background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not ready.exists():
            pytest.fail(f"the server did not start: {run.communicate(timeout=60)[0].decode()[-2000:]}")
        pgdata = ready.read_text()
        assert _pgdata_processes(pgdata), "the server is not running"
        run.send_signal(sig)
        run.wait(timeout=60)  # (not its output: an xdist worker left running holds the pipe)
        deadline = time.monotonic() + 30
        while _pgdata_processes(pgdata) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _pgdata_processes(pgdata), f"the server outlived a test run killed with {sig.name}"
        while os.path.exists(pgdata) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(pgdata), "the server's data folder is left behind"
    finally:
        try:  # the run, and a worker the killed controller left running (one process group)
            os.killpg(run.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        run.wait()
        run.stdout.close()

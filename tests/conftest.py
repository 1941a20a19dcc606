"""Test setup: Triton kernels run in the interpreter on the CPU (set before triton is imported)."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))  # tests/openai_stub.py, tests/mutants.py
warnings.filterwarnings("ignore", message="divide by zero encountered", category=RuntimeWarning)
warnings.filterwarnings("ignore", message="invalid value encountered", category=RuntimeWarning)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_test_leaves_children_refused():
    """A hard stop refuses new children process-wide while it kills; a test that left it so would fail
    every later test that starts a child, far from the cause. Name the test instead."""
    yield
    from kernel_agent.isolation import isolation

    if isolation._stopping.is_set():
        isolation.resume_starting()
        pytest.fail("this test left the sanitizer runner refusing new children (a stop without its release)")


def _watchdog(pgdata) -> subprocess.Popen:
    """tests/postgres_watchdog.py for this process and PGDATA, in a session of its own: it stops the server
    once this process is gone, even killed (SIGTERM, SIGKILL), when no teardown runs, and removes PGDATA."""
    script = os.path.join(os.path.dirname(__file__), "postgres_watchdog.py")
    # a pytest-xdist worker's parent is the controller, which a kill ends without its workers
    controller = [str(os.getppid())] if os.environ.get("PYTEST_XDIST_WORKER") else []
    return subprocess.Popen(
        [sys.executable, script, str(os.getpid()), str(pgdata), *controller],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (the pgserver package's binaries, in a temporary folder),
    as a function that creates a fresh database and returns its URL. Skipped where pgserver or the
    psycopg driver is not installed (requirements-dev.txt installs both). Under pytest-xdist each worker
    starts its own. The server stops at the session's end, and when the session is killed (a watchdog)."""
    pgserver = pytest.importorskip("pgserver", reason="PostgreSQL ledger tests need pgserver")
    pytest.importorskip("psycopg", reason="PostgreSQL ledger tests need psycopg")
    import itertools

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    # Not under pytest's temporary root: run as root, pgserver runs the server as its own user and opens the
    # folders above the data to it, and every pytest that starts (another session's, an xdist worker's) closes
    # that root to its owner again, so a server starting then fails.
    pgdata = tempfile.mkdtemp(prefix="kernel-agent-tests-postgres-")
    watchdog = _watchdog(pgdata)  # before the server: a kill while it starts still stops it
    try:
        server = pgserver.get_server(str(pgdata), cleanup_mode="stop")
        base = make_url(server.get_uri()).set(drivername="postgresql+psycopg")
        admin = create_engine(base, isolation_level="AUTOCOMMIT")
        counter = itertools.count()

        def new_database() -> str:
            name = f"ledger_{next(counter)}"
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            return base.set(database=name).render_as_string(hide_password=False)

        new_database.pgdata = pgdata  # where tests/test_ledger_postgres.py looks for the server
        yield new_database
        admin.dispose()
        server.cleanup()
    finally:
        watchdog.kill()
        watchdog.wait()
        shutil.rmtree(pgdata, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A selection of the `gpu` mark (`-m gpu`) runs in this one process, one test at a time, whatever `-n` says:
    the GPU tests share one device, and under `-n auto` (pyproject.toml's addopts) four workers ran them at once,
    timing each under the others' load (a 17% spread that refused a real gain) and allocating beside them (a
    16 GiB region ran out of memory on an 80 GB card). Runs before pytest-xdist's own hook, which reads -n."""
    words = re.findall(r"[A-Za-z_]\w*", config.option.markexpr or "")
    if "gpu" in words and not re.search(r"\bnot\s+gpu\b", config.option.markexpr):
        if getattr(config.option, "numprocesses", None):
            config.option.numprocesses = 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml's addopts): a worker per core, at most four. The tests judge candidates in child
    processes of their own, so more workers than cores only queue, and each worker holds torch (about 0.5 GB)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))

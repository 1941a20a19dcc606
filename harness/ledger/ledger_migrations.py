"""The ledger's schema migrations: an ordered registry of steps, each from one schema version to the next.

This is the ledger's equivalent of Alembic, kept small on purpose: the ledger has one schema and a
handful of tables, and every step is a few statements that read best as plain SQL next to the reason
for them. The rules:

- Each step goes from `from_version` to `from_version + 1`; the registry holds them in order, with no
  gap, and the last one reaches the ledger's SCHEMA_VERSION (harness/ledger/ledger.py, which checks it).
- Each step runs in one transaction with the new version written into `meta` in the same transaction,
  so a step is applied entirely or not at all. The transaction is the ledger's write transaction: on
  SQLite `BEGIN IMMEDIATE`, on PostgreSQL the ledger's advisory write lock, so two processes upgrading
  one ledger at once queue, and the second finds the version already raised and applies nothing.
  (Both backends run DDL inside a transaction.)
- A step's docstring says what it changes and why.
- `reads_older`: whether this kernel-agent can still read a ledger that has not had the step yet (a
  step that only adds indices leaves every table as the code reads it). The read commands (history,
  show, report) read an older ledger without changing it when every pending step says so; otherwise
  they ask for `kernel-agent ledger upgrade` as the writing commands do.
- A new ledger is created at the current version directly from the models in harness/ledger/ledger.py; the
  models and the steps must end at the same schema (tests/test_ledger_migrations.py compares a
  migrated ledger with a new one).

This module depends on nothing of the ledger's (the ledger imports it): the steps use SQL text and the
`meta` table by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine


@dataclass(frozen=True)
class Migration:
    """One step of the ledger's schema: `apply(conn)` moves a ledger at `from_version` to the next."""

    from_version: int
    apply: Callable[[Connection], None]
    reads_older: bool  # this kernel-agent reads a ledger that has not had this step yet

    @property
    def to_version(self) -> int:
        return self.from_version + 1

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip()


def _v1_indices_for_a_large_ledger(conn: Connection) -> None:
    """Version 1 -> 2: `bench_result` gets an index on (op, bucket, dtype) in place of the one on op.

    Why: after every benchmark the loop decides what serves the bucket (harness/serving/dispatch.py,
    `measured_choices`) from that bucket's benchmark rows, and `kernel-agent dispatch` does the same per
    op; on version 1 those queries could only select by op, so each read every benchmark row of the op
    (every shape, bucket and dtype ever timed) and filtered the rest in Python: on a shared ledger of a
    month of runs, tens of times the rows it needs, once per benchmark. The index selects one
    (op, bucket, dtype), and it serves the queries by op alone (its first column), so the index on op
    is dropped rather than kept as a second copy every insert would update. Measured on a synthetic
    ledger of 600,000 benchmark rows, 150,000 of them one op's, reading one (bucket, dtype)'s 12,400
    rows: 0.68 s as version 1 read them (all the op's rows), on SQLite and PostgreSQL alike; with the
    bucket and dtype selected in SQL (`Ledger.bench_results`), 0.062 s through the op index and
    0.050 s through this one on SQLite, and on PostgreSQL 39 ms of the server's time through the op
    index against 9.9 ms through this one.

    The other queries of `history`, `show`, `report` and the loop already have their indices: runs by
    start time and status; candidates by op, status and (op, source hash); proposals, model calls,
    checks and benchmarks by run and by candidate; promotions by run and op. The foreign keys no query
    selects by (a candidate's parent and first run, a promotion's candidates) get none: the ledger
    never deletes, so an index there would cost every insert and serve nothing. `gate` reads the
    serving manifest, not the ledger."""
    conn.execute(text("CREATE INDEX ix_bench_result_op_bucket_dtype ON bench_result (op, bucket, dtype)"))
    conn.execute(text("DROP INDEX ix_bench_result_op"))


def _v2_diagnoses_and_pruned_proposals(conn: Connection) -> None:
    """Version 2 -> 3: two new tables, `diagnosis` and `pruned_proposal`, each indexed by run and by
    (op, bucket, dtype).

    Why: the built-in search now reads what bounds each incumbent (registers, spills, shared memory and
    programs of its compiled kernel, with the roofline fraction the ledger measured) before it proposes,
    and hands the same diagnosis to the code model; `show` and `report` print it. Compiling an incumbent
    for sm_90 takes seconds to a minute on the CPU, so the diagnosis is stored per source and bucket and
    reused by later runs. `pruned_proposal` holds each proposal the search did not send to the GPU (its
    compiled kernel spills or overflows shared memory, or the model fitted to the ledger's timings
    predicts a loss), with the reason, so that no run proposes it again and a run's summary counts them.
    Nothing existing changes: a ledger that has not had this step reads as one with no diagnoses."""
    dt = "TIMESTAMP WITHOUT TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
    pk = "SERIAL" if conn.dialect.name == "postgresql" else "INTEGER"
    conn.execute(
        text(f"""CREATE TABLE diagnosis (
    id {pk} NOT NULL, run_id VARCHAR, op VARCHAR NOT NULL, bucket VARCHAR NOT NULL, dtype VARCHAR NOT NULL,
    source_hash VARCHAR(64) NOT NULL, incumbent VARCHAR NOT NULL, bound VARCHAR NOT NULL,
    document_json TEXT NOT NULL, created_at {dt} NOT NULL,
    PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES run (id))""")
    )
    conn.execute(
        text(f"""CREATE TABLE pruned_proposal (
    id {pk} NOT NULL, run_id VARCHAR, op VARCHAR NOT NULL, bucket VARCHAR NOT NULL, dtype VARCHAR NOT NULL,
    label VARCHAR NOT NULL, source_hash VARCHAR(64) NOT NULL, reason TEXT NOT NULL, created_at {dt} NOT NULL,
    PRIMARY KEY (id), FOREIGN KEY(run_id) REFERENCES run (id))""")
    )
    for table in ("diagnosis", "pruned_proposal"):
        conn.execute(text(f"CREATE INDEX ix_{table}_run_id ON {table} (run_id)"))
        conn.execute(text(f"CREATE INDEX ix_{table}_op_bucket_dtype ON {table} (op, bucket, dtype)"))


def _v3_field_failures(conn: Connection) -> None:
    """Version 3 -> 4: a new table, `field_failure`, indexed by (op, bucket, dtype).

    Why: the checks draw inputs from a domain that has no end, so a promoted kernel is verified again on
    the device on the first real call of each shape class it serves (the serving guard). A class whose
    check fails is retired in the serving process, and the failure is recorded here so that `gate` fails
    while it is unresolved, `demote` resolves it, and `show`, `history`, the web view and `pr` name it.
    One row per unresolved (bucket, GPU, kernel hash, shape class, kind): seen again, its `count` rises.
    Nothing existing changes: a ledger that has not had this step reads as one with no field failures."""
    dt = "TIMESTAMP WITHOUT TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
    pk = "SERIAL" if conn.dialect.name == "postgresql" else "INTEGER"
    conn.execute(
        text(f"""CREATE TABLE field_failure (
    id {pk} NOT NULL, op VARCHAR NOT NULL, bucket VARCHAR NOT NULL, dtype VARCHAR NOT NULL, gpu VARCHAR NOT NULL,
    kernel VARCHAR NOT NULL, source_hash VARCHAR(64) NOT NULL, shape_class TEXT NOT NULL,
    shapes_json TEXT NOT NULL, strides_json TEXT NOT NULL, dtypes_json TEXT NOT NULL, kind VARCHAR NOT NULL,
    detail TEXT NOT NULL, first_seen {dt} NOT NULL, last_seen {dt} NOT NULL, count INTEGER NOT NULL,
    resolved_at {dt}, resolved_by TEXT,
    PRIMARY KEY (id))""")
    )
    conn.execute(text("CREATE INDEX ix_field_failure_op_bucket_dtype ON field_failure (op, bucket, dtype)"))


MIGRATIONS: Sequence[Migration] = (
    Migration(1, _v1_indices_for_a_large_ledger, reads_older=True),
    Migration(2, _v2_diagnoses_and_pruned_proposals, reads_older=True),
    Migration(3, _v3_field_failures, reads_older=True),
)

OLDEST_VERSION = MIGRATIONS[0].from_version if MIGRATIONS else 1  # the oldest ledger this code can upgrade


def check_registry(schema_version: int) -> None:
    """Fail loudly at import when the registry is not one unbroken chain ending at `schema_version`."""
    versions = [m.from_version for m in MIGRATIONS]
    expected = list(range(OLDEST_VERSION, schema_version))
    if versions != expected:
        raise AssertionError(
            f"ledger migrations go from versions {versions}; a chain to schema version "
            f"{schema_version} needs {expected}"
        )
    undocumented = [m.from_version for m in MIGRATIONS if not m.doc]
    if undocumented:
        raise AssertionError(f"ledger migrations from versions {undocumented} have no docstring")


def pending(version: int, target: int) -> List[Migration]:
    """The steps that take a ledger at `version` to `target`, in order."""
    return [m for m in MIGRATIONS if version <= m.from_version < target]


def stored_version(conn: Connection) -> int:
    return int(conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar_one())


def migrate(engine: Engine, target: int) -> List[int]:
    """Apply the steps up to `target`, one transaction each, through `engine`, whose transactions are the
    ledger's write transactions (they begin by taking its write lock). The version is read again inside
    each transaction, so a step another process applied meanwhile is skipped. Returns the versions this
    call reached (empty when another process, or nobody, had anything left to do)."""
    reached: List[int] = []
    while True:
        with engine.begin() as conn:
            version = stored_version(conn)
            if version >= target:
                return reached
            step = next((m for m in MIGRATIONS if m.from_version == version), None)
            if step is None:
                raise ValueError(f"no ledger migration from schema version {version}")
            step.apply(conn)
            conn.execute(text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": str(step.to_version)})
        reached.append(step.to_version)


__all__ = ["Migration", "MIGRATIONS", "OLDEST_VERSION", "check_registry", "pending", "stored_version", "migrate"]

"""The run ledger: every step of every run, in one SQLite file or a PostgreSQL database
(docs/ARCHITECTURE.md lists its tables).

Why SQLite through the SQLAlchemy typed ORM: an overnight run is a single process
(plus a `history` reader now and then), the ledger must survive a killed process, and
people browse it with ordinary tools. So:

- WAL journal mode and `synchronous=NORMAL` on every connection: readers never block
  the writer, and a commit costs no fsync of the main file.
- Each recording method is one short transaction that commits at its end, so a killed
  process loses at most the step in progress. Write transactions start with
  `BEGIN IMMEDIATE`, so two writers queue on the busy timeout instead of failing on a
  lock upgrade halfway through.
- The schema version lives in the `meta` table. A file that is not a ledger at all, or a
  ledger of a newer version, is refused with `LedgerError` before anything is written to
  it (not even the journal mode). An older ledger is read as it is where this version can
  read it (read-only), and is written only once `upgrade_ledger` (`kernel-agent ledger
  upgrade`) has migrated it: the steps and the rules they follow are in
  harness/ledger/ledger_migrations.py.

A ledger shared by several machines lives in PostgreSQL (`Ledger("postgresql://...")`, with the
`postgres` extra's driver). The same rules hold there: the schema version is checked before anything
is written, each recording method is one short transaction, and writers are serialized as SQLite
serializes them: every write transaction first takes one transaction-scoped advisory lock, so two
drivers recording at once queue instead of racing a read-then-write (a run id, a source's first
proposal). Readers take no lock.

Times are stored as naive UTC and come back as timezone-aware UTC datetimes.
Objects returned by `Ledger` are detached from their session (no lazy loading; read
the foreign keys and ask the ledger again).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    case,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from ...sanitizer.canonical import JudgedText
from ...sanitizer.verdict import CheckStatus, SanitizerMode, Verdict
from ..bench import figures as _figures
from ..field_failures import FailureKind, FieldFailure
from ..manifest import gpu_slug
from . import ledger_migrations as _migrations

# The version of the schema the models below create; an older ledger reaches it through the steps of
# harness/ledger/ledger_migrations.py (checked at import: one unbroken chain of steps ending here).
SCHEMA_VERSION = 4
_migrations.check_registry(SCHEMA_VERSION)
BUSY_TIMEOUT_S = 30.0
# The advisory lock every write transaction of a PostgreSQL ledger takes first (any constant will do,
# as long as every kernel-agent uses the same one): "kaledger" in ASCII, a positive signed 64-bit key.
WRITE_LOCK_KEY = int.from_bytes(b"kaledger", "big")


class RunStatus(str, Enum):
    """A run's status in the ledger; the member is the string stored and printed."""

    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    def __str__(self) -> str:  # f-strings and str() give the stored word, not RunStatus.RUNNING
        return self.value


class CandidateStatus(str, Enum):
    """How far a candidate got: proposed, then rejected, or verified (sanitizer passed), benchmarked (timed and
    judged), promoted (serving). The member is the string stored and printed."""

    PROPOSED = "proposed"
    REJECTED = "rejected"
    VERIFIED = "verified"
    BENCHMARKED = "benchmarked"
    PROMOTED = "promoted"

    def __str__(self) -> str:
        return self.value


RUN_STATUSES = tuple(s.value for s in RunStatus)
CANDIDATE_STATUSES = tuple(s.value for s in CandidateStatus)
CHECK_STATUSES = tuple(s.value for s in CheckStatus)
CHECK_MODES = tuple(m.value for m in SanitizerMode)
CEILING_KINDS = ("compute", "memory")


# --------------------------------------------------------------------------------------
# what a run did: the record `run_summary` returns and the command line and reports read


@dataclass(slots=True)
class PromotionSummary:
    id: int
    op: str
    bucket: str
    dtype: str
    gpu_name: str
    candidate_id: Optional[int]
    replaced_candidate_id: Optional[int]
    new_ms: float
    old_ms: float
    gain: float
    spread: float
    reason: str
    active: bool  # not demoted since


@dataclass(slots=True)
class ModelUsage:
    calls: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    latency_s: float = 0.0


@dataclass(slots=True)
class RunSession:
    """How the session of `kernel-agent run` that just ended went (the loop adds it; the ledger alone has none)."""

    stop_reason: Optional[str]
    gpu: Optional[str]  # the GPU's name, None when candidates were verified, not benchmarked
    benchmarked: bool
    throughput: Dict[str, Any]  # the figures kept in the run's notes (agent.loop.Throughput, as a dict)
    throughput_line: str
    serving: Dict[str, Any]  # where promotions went (agent.publish.TargetInfo.to_json())
    serving_line: str


@dataclass(slots=True)
class RunSummary:
    """What a run did, for the summary after a run, `show`, `history` and reports."""

    run_id: str
    status: RunStatus
    proposer: str
    ops: List[str]
    gpu_name: Optional[str]
    started_at: datetime
    finished_at: Optional[datetime]
    wall_s: Optional[float]
    proposals: int
    duplicates: int  # proposals of a source judged before: replayed, not judged again
    candidates: int
    candidates_by_status: Dict[str, int]  # every CandidateStatus, 0 where none
    checks_failed: Dict[str, int]  # check name -> candidates it rejected, most first
    bench_results: int
    promotions: List[PromotionSummary]
    model: ModelUsage
    # the run's own work apart from what it replayed: candidates it judged (new to the ledger, or timed by it) by
    # status, and candidates earlier runs had judged, replayed from the ledger (counted in `candidates` too)
    judged_now_by_status: Dict[str, int] = field(default_factory=dict)
    replayed: int = 0
    session: Optional[RunSession] = None
    pruned: int = 0  # proposals kept off the GPU by the search's screens (agent/screen.py), with reasons in the ledger

    @property
    def judged_now(self) -> int:
        """Candidates the run judged itself to a verdict (those still 'proposed' it stopped or left in flight)."""
        return sum(n for st, n in self.judged_now_by_status.items() if st != CandidateStatus.PROPOSED)

    def to_json(self) -> Dict[str, Any]:
        """The document `run --json` and `show --json` print: the run's fields, then the session's."""
        doc = asdict(self)
        doc["status"] = self.status.value
        session = doc.pop("session")
        out: Dict[str, Any] = {}
        for key, value in doc.items():
            if key == "judged_now_by_status":  # the count `run` and `history` print, before its statuses
                out["judged_now"] = self.judged_now
            out[key] = value
        return {**out, **(session or {})}


class LedgerError(Exception):
    """The ledger cannot be opened or used as asked (one-line message)."""


# --------------------------------------------------------------------------------------
# helpers


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _to_utc(value: datetime | date | str) -> datetime:
    """A bound for a date filter: aware datetimes are converted, naive ones and dates
    are taken as UTC, strings are ISO 8601."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 date or time: {value!r}") from None
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _is_bare_date(value: datetime | date | str) -> bool:
    if isinstance(value, str):
        return len(value.strip()) == 10  # YYYY-MM-DD
    return not isinstance(value, datetime)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _loads(text: Optional[str]) -> Any:
    return None if text is None else json.loads(text)


def _check_choice(kind: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"invalid {kind} {value!r}; expected one of {', '.join(allowed)}")


class UTCDateTime(TypeDecorator):
    """Stores naive UTC (SQLite has no time zones) and returns aware UTC datetimes."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: Optional[datetime], dialect) -> Optional[datetime]:
        if value is None:
            return None
        return _to_utc(value).replace(tzinfo=None)

    def process_result_value(self, value: Optional[datetime], dialect) -> Optional[datetime]:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc)


_NOTES_KEYS = ("elapsed_s", "tokens", "sessions", "serving", "stop")  # RunNotesRecord's fields, in stored order


@dataclass(frozen=True)
class RunNotesRecord:
    """A run's notes, as the ledger reads them: the JSON object `run` and `promote` write, or the plain text an
    older run may hold (`text`; every field is then empty). A key this version does not know is kept in `other`,
    so a record read and written back loses nothing."""

    elapsed_s: Optional[float] = None  # the run's time so far, over its sessions (a resume's time limit adds to it)
    tokens: Optional[int] = None  # the model's tokens so far
    sessions: Optional[List[Dict[str, Any]]] = None  # each ended session's throughput (agent/throughput.py)
    serving: Optional[Dict[str, Any]] = None  # where promotions went (agent.publish.TargetInfo.to_json())
    stop: Optional[str] = None  # why the last session ended
    other: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # notes that are no JSON object: an older run's free text

    @classmethod
    def from_stored(cls, stored: Optional[str]) -> "RunNotesRecord":
        """The record of a stored value: a JSON object's fields, or any other text as it is."""
        try:
            doc = json.loads(stored) if stored else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(text=stored or "")
        return cls(
            **{k: doc[k] for k in _NOTES_KEYS if k in doc}, other={k: v for k, v in doc.items() if k not in _NOTES_KEYS}
        )

    def to_json(self) -> Dict[str, Any]:
        """The JSON object of the fields that are set (an older run's text has none)."""
        doc = {k: getattr(self, k) for k in _NOTES_KEYS if getattr(self, k) is not None}
        return {**doc, **{k: v for k, v in self.other.items() if k not in doc}}

    def stored(self) -> str:
        """What the column holds: the JSON object, or the free text where there are no fields ('' for none)."""
        doc = self.to_json()
        return json.dumps(doc) if doc else self.text


class RunNotesColumn(TypeDecorator):
    """A run's notes: stored as text (so a ledger of any version holds them as it did), read as a RunNotesRecord."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Optional[RunNotesRecord], dialect) -> Optional[str]:
        return None if value is None else value.stored()

    def process_result_value(self, value: Optional[str], dialect) -> RunNotesRecord:
        return RunNotesRecord.from_stored(value)


# --------------------------------------------------------------------------------------
# schema


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String, primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Run(Base):
    __tablename__ = "run"

    id: Mapped[str] = mapped_column(String, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String, index=True)
    config_json: Mapped[str] = mapped_column(Text, default="{}")
    versions_json: Mapped[str] = mapped_column(Text, default="{}")
    gpu_name: Mapped[Optional[str]] = mapped_column(String)
    proposer: Mapped[str] = mapped_column(String)
    ops: Mapped[str] = mapped_column(Text, default="")
    budget_json: Mapped[str] = mapped_column(Text, default="{}")
    notes: Mapped[RunNotesRecord] = mapped_column(RunNotesColumn, default=RunNotesRecord())

    @property
    def config(self) -> dict:
        return _loads(self.config_json) or {}

    @property
    def versions(self) -> dict:
        return _loads(self.versions_json) or {}

    @property
    def budget(self) -> dict:
        return _loads(self.budget_json) or {}

    @property
    def op_list(self) -> list[str]:
        return [o for o in self.ops.split(",") if o]

    def __repr__(self) -> str:
        return f"Run({self.id!r}, status={self.status!r}, ops={self.ops!r})"


class Candidate(Base):
    __tablename__ = "candidate"
    __table_args__ = (UniqueConstraint("op", "source_hash", name="uq_candidate_op_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String, index=True)
    source_hash: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    path: Mapped[Optional[str]] = mapped_column(Text)
    parent_id: Mapped[Optional[int]] = mapped_column(ForeignKey("candidate.id"))
    proposer: Mapped[str] = mapped_column(String)
    label: Mapped[Optional[str]] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    first_run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"))
    status: Mapped[str] = mapped_column(String, default=CandidateStatus.PROPOSED.value, index=True)
    verdict_json: Mapped[Optional[str]] = mapped_column(Text)
    fpsan_equivalent: Mapped[Optional[bool]] = mapped_column(Boolean)

    @property
    def verdict(self) -> Optional[dict]:
        return _loads(self.verdict_json)

    @property
    def stored_verdict(self) -> Verdict:
        """The verdict document as a Verdict (an empty one where none is stored): `failure()` says why it
        failed, as every reader of a stored verdict says it."""
        return Verdict.from_json(self.verdict or {})

    def __repr__(self) -> str:
        return f"Candidate({self.id}, op={self.op!r}, status={self.status!r}, label={self.label!r})"


class Proposal(Base):
    __tablename__ = "proposal"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"), index=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidate.id"), index=True)
    proposer: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    duplicate: Mapped[bool] = mapped_column(Boolean, default=False)


class ModelCall(Base):
    __tablename__ = "model_call"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"), index=True)
    candidate_id: Mapped[Optional[int]] = mapped_column(ForeignKey("candidate.id"), index=True)
    model: Mapped[str] = mapped_column(String)
    prompt: Mapped[str] = mapped_column(Text)
    response: Mapped[Optional[str]] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_s: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class CheckResult(Base):
    __tablename__ = "check_result"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidate.id"), index=True)
    name: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String)
    detail: Mapped[str] = mapped_column(Text, default="")
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    mode: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    @property
    def passed(self) -> bool:
        return self.status == CheckStatus.PASSED


class BenchResult(Base):
    __tablename__ = "bench_result"
    # what serves a bucket is read from its rows after every benchmark (schema version 2's step says why)
    __table_args__ = (Index("ix_bench_result_op_bucket_dtype", "op", "bucket", "dtype"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"), index=True)
    candidate_id: Mapped[Optional[int]] = mapped_column(ForeignKey("candidate.id"), index=True)
    label: Mapped[str] = mapped_column(String, default="candidate")
    op: Mapped[str] = mapped_column(String)
    shape_key: Mapped[str] = mapped_column(String)
    bucket: Mapped[str] = mapped_column(String)
    dtype: Mapped[str] = mapped_column(String)
    gpu_name: Mapped[str] = mapped_column(String)
    median_ms: Mapped[float] = mapped_column(Float)
    spread_ms: Mapped[float] = mapped_column(Float)
    n_samples: Mapped[int] = mapped_column(Integer)
    graph_ms: Mapped[Optional[float]] = mapped_column(Float)
    fraction_of_ceiling: Mapped[Optional[float]] = mapped_column(Float)
    ceiling_kind: Mapped[Optional[str]] = mapped_column(String)
    implausible: Mapped[bool] = mapped_column(Boolean, default=False)
    extra_json: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    @property
    def extra(self) -> Optional[dict]:
        return _loads(self.extra_json)


class Promotion(Base):
    __tablename__ = "promotion"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"), index=True)
    op: Mapped[str] = mapped_column(String, index=True)
    bucket: Mapped[str] = mapped_column(String)
    dtype: Mapped[str] = mapped_column(String)
    gpu_name: Mapped[str] = mapped_column(String)
    candidate_id: Mapped[Optional[int]] = mapped_column(ForeignKey("candidate.id"))
    replaced_candidate_id: Mapped[Optional[int]] = mapped_column(ForeignKey("candidate.id"))
    new_ms: Mapped[float] = mapped_column(Float)
    old_ms: Mapped[float] = mapped_column(Float)
    gain: Mapped[float] = mapped_column(Float)
    spread: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    versions_json: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    demoted_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    demote_reason: Mapped[Optional[str]] = mapped_column(Text)

    @property
    def versions(self) -> dict:
        return _loads(self.versions_json) or {}

    @property
    def active(self) -> bool:
        return self.demoted_at is None


class DiagnosisRecord(Base):
    """Where an incumbent stands on its bucket (harness/bench/diagnosis.py): what bounds it and why."""

    __tablename__ = "diagnosis"
    __table_args__ = (Index("ix_diagnosis_op_bucket_dtype", "op", "bucket", "dtype"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"), index=True)
    op: Mapped[str] = mapped_column(String)
    bucket: Mapped[str] = mapped_column(String)
    dtype: Mapped[str] = mapped_column(String)
    source_hash: Mapped[str] = mapped_column(String(64))
    incumbent: Mapped[str] = mapped_column(String)
    bound: Mapped[str] = mapped_column(String)
    document_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    @property
    def document(self) -> dict:
        return _loads(self.document_json) or {}


class PrunedProposal(Base):
    """A proposal the search did not send to the GPU, and why (compile-time resources, a predicted loss)."""

    __tablename__ = "pruned_proposal"
    __table_args__ = (Index("ix_pruned_proposal_op_bucket_dtype", "op", "bucket", "dtype"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[Optional[str]] = mapped_column(ForeignKey("run.id"), index=True)
    op: Mapped[str] = mapped_column(String)
    bucket: Mapped[str] = mapped_column(String)
    dtype: Mapped[str] = mapped_column(String)
    label: Mapped[str] = mapped_column(String)
    source_hash: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class FieldFailureRecord(Base):
    """A promoted kernel the serving guard retired for a shape class (harness/field_failures.py), until a
    demotion of its bucket resolves it. The same failure seen again while unresolved (the same bucket, GPU,
    kernel hash, class and kind) is one row: `count` goes up and `last_seen` moves, the first call's
    shapes and detail stay (the first evidence is what a reviewer reproduces)."""

    __tablename__ = "field_failure"
    __table_args__ = (Index("ix_field_failure_op_bucket_dtype", "op", "bucket", "dtype"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(String)
    bucket: Mapped[str] = mapped_column(String)
    dtype: Mapped[str] = mapped_column(String)
    gpu: Mapped[str] = mapped_column(String)
    kernel: Mapped[str] = mapped_column(String)
    source_hash: Mapped[str] = mapped_column(String(64))
    shape_class: Mapped[str] = mapped_column(Text)
    shapes_json: Mapped[str] = mapped_column(Text)
    strides_json: Mapped[str] = mapped_column(Text)
    dtypes_json: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String)
    detail: Mapped[str] = mapped_column(Text)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    count: Mapped[int] = mapped_column(Integer)
    resolved_at: Mapped[Optional[datetime]] = mapped_column(UTCDateTime)
    resolved_by: Mapped[Optional[str]] = mapped_column(Text)  # the demotion's run id, or why in words

    @property
    def resolved(self) -> bool:
        return self.resolved_at is not None

    def failure(self) -> FieldFailure:
        """The record as the guard handed it over (its first sighting)."""
        return FieldFailure(
            op=self.op,
            bucket=self.bucket,
            dtype=self.dtype,
            gpu=self.gpu,
            kernel=self.kernel,
            source_hash=self.source_hash,
            shape_class=self.shape_class,
            shapes=tuple(tuple(s) for s in _loads(self.shapes_json)),
            strides=tuple(tuple(s) for s in _loads(self.strides_json)),
            dtypes=tuple(_loads(self.dtypes_json)),
            kind=FailureKind(self.kind),
            detail=self.detail,
            at=self.first_seen,
        )


# Fields a caller may pass to record_bench / record_promotion (the rest are managed here).
_BENCH_REQUIRED = ("op", "shape_key", "bucket", "dtype", "gpu_name", "median_ms", "spread_ms", "n_samples")
_BENCH_OPTIONAL = (
    "run_id",
    "candidate_id",
    "label",
    "graph_ms",
    "fraction_of_ceiling",
    "ceiling_kind",
    "implausible",
    "extra_json",
    "extra",
    "created_at",
)
_PROMOTION_REQUIRED = ("op", "bucket", "dtype", "gpu_name", "new_ms", "old_ms", "gain", "spread")
_PROMOTION_OPTIONAL = (
    "run_id",
    "candidate_id",
    "replaced_candidate_id",
    "reason",
    "versions_json",
    "versions",
    "created_at",
)


def _where_equal(q, model, **values: Any):
    """`q` narrowed to the rows whose columns equal the given values; a value of None is no filter
    (how every query method here takes its optional arguments)."""
    for column, value in values.items():
        if value is not None:
            q = q.where(getattr(model, column) == value)
    return q


def _check_fields(what: str, fields: Mapping[str, Any], required: Sequence[str], optional: Sequence[str]) -> None:
    unknown = sorted(set(fields) - set(required) - set(optional))
    if unknown:
        raise TypeError(f"{what}: unknown field(s) {', '.join(unknown)}")
    missing = [k for k in required if k not in fields]
    if missing:
        raise TypeError(f"{what}: missing field(s) {', '.join(missing)}")


# --------------------------------------------------------------------------------------
# opening a file safely


def _writable_dir(path: Path) -> bool:
    """Whether SQLite may create the ledger's side files (-wal, -shm) beside it."""
    return os.access(path.resolve().parent, os.W_OK)


def _check_file_access(path: Path, shown: str, read_only: bool) -> None:
    """One line for a ledger file this command cannot use as asked: an empty file to read (nothing was ever
    recorded in it), a read-only file (or folder: SQLite writes its journal beside the file) to write."""
    if not path.is_file():
        return
    if read_only and path.stat().st_size == 0:
        raise LedgerError(
            f"ledger {shown} is an empty file (0 bytes): nothing was ever recorded in it "
            f"(`kernel-agent run --ledger {shown}` records a run there)"
        )
    if not read_only and not os.access(path, os.W_OK):
        raise LedgerError(
            f"ledger {shown} is read-only: this command records in it (history, show and report only "
            f"read, and read it as it is)"
        )
    if not read_only and not _writable_dir(path):
        raise LedgerError(f"ledger {shown}: its folder is read-only, and SQLite writes its journal beside the file")


def _inspect_existing(path: Path, shown: str, immutable: bool = False, purpose: str = "write") -> Optional[int]:
    """Refuse a file that is not a ledger this version may use for `purpose` ('write', 'read' or
    'upgrade': see `_check_version`), before SQLAlchemy (which would set the journal mode and create
    tables) touches it. Returns the ledger's schema version, None for a new or empty database."""
    if path.is_dir():
        raise LedgerError(f"ledger {shown} is a directory, not a SQLite database")
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        conn = sqlite3.connect(
            path.resolve().as_uri() + ("?immutable=1" if immutable else "?mode=ro"), uri=True, timeout=BUSY_TIMEOUT_S
        )
    except sqlite3.Error as e:
        raise LedgerError(f"ledger {shown} cannot be opened: {e}") from None
    try:
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise LedgerError(f"ledger {shown} is not a SQLite database ({e})") from None
        if not tables:
            return None  # an empty database: ours to initialise
        if "meta" not in tables:
            raise LedgerError(
                f"ledger {shown} is a SQLite database but not a kernel-agent ledger "
                f"(no meta table); refusing to modify it"
            )
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as e:
            raise LedgerError(f"ledger {shown} has an unreadable meta table ({e})") from None
    finally:
        conn.close()
    return _check_version(None if row is None else row[0], shown, purpose)


def server_url(location: str | Path) -> URL | None:
    """The SQLAlchemy URL of a ledger on a database server, or None for a file (a path, or a
    `sqlite:///PATH` URL, which names a file too). A plain `postgresql://` URL gets the psycopg (3)
    driver, the one the `postgres` extra installs."""
    text = str(location)
    if "://" not in text:
        return None
    try:
        url = make_url(text)
    except ArgumentError as e:
        raise LedgerError(f"ledger {text!r} is not a database URL: {e}") from None
    if url.get_backend_name() == "sqlite":
        return None
    if url.get_backend_name() != "postgresql":
        raise LedgerError(
            f"ledger {url.render_as_string(hide_password=True)}: a ledger is a SQLite file or a "
            f"PostgreSQL database (postgresql://...), not {url.get_backend_name()}"
        )
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


def sqlite_path(location: str | Path) -> Path:
    """The file of a SQLite ledger given as a path or as a sqlite:/// URL."""
    text = str(location)
    if text.startswith("sqlite:"):
        database = make_url(text).database
        if not database or database == ":memory:":
            raise LedgerError(f"ledger {text!r}: a ledger must be a file (sqlite:///PATH)")
        return Path(database)
    return Path(location)


def _server_engines(url: URL, shown: str, read_only: bool) -> tuple[Engine, Engine]:
    """(write engine, read engine) of a PostgreSQL ledger. Every write transaction first takes the
    ledger's advisory lock; a read-only ledger's sessions are read-only on the server too."""
    try:
        read = create_engine(url, pool_pre_ping=True)
        if read_only:
            read = read.execution_options(postgresql_readonly=True)
            return read, read
        write = create_engine(url, pool_pre_ping=True)
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise LedgerError(
            f"ledger {shown} cannot be opened: {e} (a PostgreSQL ledger needs its driver: "
            f"pip install 'kernel-agent[postgres]')"
        ) from None

    @event.listens_for(write, "begin")
    def _take_write_lock(conn) -> None:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")

    return write, read


def _inspect_server(engine: Engine, shown: str, purpose: str = "write") -> Optional[int]:
    """What `_inspect_existing` does for a file, for a database on a server: refuse a database that
    holds other tables than a ledger's, or a ledger this version may not use for `purpose`, before
    writing to it. Returns the ledger's schema version, None for an empty database."""
    try:
        with engine.connect() as conn:
            tables = set(sa_inspect(conn).get_table_names())
            if not tables:
                return None
            if "meta" not in tables:
                raise LedgerError(
                    f"ledger {shown} holds tables but no kernel-agent ledger (no meta table); refusing to modify it"
                )
            row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar_one_or_none()
    except DBAPIError as e:
        raise LedgerError(f"ledger {shown} cannot be opened: {str(e.orig).strip().splitlines()[0]}") from None
    return _check_version(row, shown, purpose)


def _check_version(value: str | None, shown: str, purpose: str = "write") -> int:
    """The ledger's schema version, if this kernel-agent may use the ledger for `purpose`:
    'write' needs the current version; 'read' also takes an older ledger whose pending migrations all
    leave it readable (it is read as it is, not changed); 'upgrade' takes any version a chain of
    migrations starts from. A newer ledger is refused for all three: its writer knows what changed."""
    if value is None:
        raise LedgerError(f"ledger {shown} has no schema version; refusing to modify it")
    try:
        version = int(value)
    except (TypeError, ValueError):
        raise LedgerError(f"ledger {shown} has an invalid schema version {value!r}") from None
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"ledger {shown} has schema version {version}; this kernel-agent reads version "
            f"{SCHEMA_VERSION} (upgrade kernel-agent)"
        )
    if version == SCHEMA_VERSION:
        return version
    if version < _migrations.OLDEST_VERSION:
        raise LedgerError(
            f"ledger {shown} has schema version {version}; this kernel-agent reads version "
            f"{SCHEMA_VERSION} (the ledger is older, and this version has no migration from it: "
            f"start a new ledger)"
        )
    if purpose == "upgrade":
        return version
    if purpose == "read" and all(m.reads_older for m in _migrations.pending(version, SCHEMA_VERSION)):
        return version
    raise LedgerError(
        f"ledger {shown} has schema version {version}, older than this kernel-agent's "
        f"{SCHEMA_VERSION}: upgrade it with `kernel-agent ledger upgrade --ledger {shown}`"
    )


def _make_engine(path: Path, begin: str, read_only: str = "") -> Engine:
    """An engine whose transactions start with `begin` ('BEGIN' or 'BEGIN IMMEDIATE').

    The sqlite3 driver's own transaction handling is switched off (isolation_level =
    None) so that SQLAlchemy's begin hook decides how a transaction starts. `read_only`:
    SQLite URI parameters ('mode=ro', or 'immutable=1' where the folder is not writable, so
    that a WAL ledger on read-only media can be read)."""
    if read_only:
        uri = f"{path.resolve().as_uri()}?{read_only}"
        engine = create_engine(
            "sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        )
    else:
        engine = create_engine(URL.create("sqlite", database=str(path)), connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, connection_record) -> None:
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        try:
            if not read_only:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql(begin)

    return engine


# --------------------------------------------------------------------------------------
# upgrading an older ledger


@dataclass(slots=True)
class Upgrade:
    """What `upgrade_ledger` did."""

    location: str
    from_version: int  # the version found
    version: int  # the version the ledger is at now
    reached: List[int]  # the versions this call's steps reached: empty when there was nothing left to do
    backup: Optional[Path]  # the copy of a SQLite file taken before the first step


def upgrade_ledger(location: str | Path, backup: bool = True) -> Upgrade:
    """Migrate the ledger at `location` (a SQLite file or a PostgreSQL URL) to SCHEMA_VERSION, one step
    per transaction under the ledger's write lock (harness/ledger/ledger_migrations.py). A SQLite file is first
    copied to `<file>.v<version>.bak` (unless `backup` is False); a server's database is backed up by
    whoever runs the server. A ledger already at the version is left as it is, a newer one refused."""
    url = server_url(location)
    if url is None:
        return _upgrade_file(sqlite_path(location), str(location), backup)
    shown = make_url(str(location)).render_as_string(hide_password=True)
    write, read = _server_engines(url, shown, read_only=False)
    try:
        found = _inspect_server(read, shown, purpose="upgrade")
        if found is None:
            raise LedgerError(f"no ledger in {shown}")
        reached = _migrations.migrate(write, SCHEMA_VERSION)
        with read.connect() as conn:
            now = _migrations.stored_version(conn)
    except DBAPIError as e:
        raise LedgerError(f"ledger {shown} cannot be upgraded: {str(e.orig).strip().splitlines()[0]}") from None
    finally:
        write.dispose()
        read.dispose()
    return Upgrade(shown, found, now, reached, None)


def _upgrade_file(path: Path, shown: str, backup: bool) -> Upgrade:
    if not path.is_file():
        raise LedgerError(f"no ledger at {shown}")
    found = _inspect_existing(path, shown, purpose="upgrade")
    if found is None:
        raise LedgerError(f"no ledger at {shown} (an empty database)")
    copy = _backup_file(path, shown, found) if backup and found < SCHEMA_VERSION else None
    engine = _make_engine(path, "BEGIN IMMEDIATE")
    try:
        reached = _migrations.migrate(engine, SCHEMA_VERSION)
        with engine.connect() as conn:
            now = _migrations.stored_version(conn)
    except DBAPIError as e:
        raise LedgerError(f"ledger {shown} cannot be upgraded: {e.orig}") from None
    finally:
        engine.dispose()
    return Upgrade(shown, found, now, reached, copy)


def _backup_file(path: Path, shown: str, version: int) -> Path:
    """A copy of a SQLite ledger as it is before an upgrade, `<file>.v<version>.bak`, one file (no WAL
    beside it). SQLite's backup API copies a consistent snapshot even while another process writes. The
    copy is written under a temporary name and renamed, so a backup left by an earlier attempt is
    replaced only by a complete one."""
    dest = path.with_name(f"{path.name}.v{version}.bak")
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    try:
        src = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            dst = sqlite3.connect(part)
            try:
                src.backup(dst)
                dst.execute("PRAGMA journal_mode=DELETE")
            finally:
                dst.close()
        finally:
            src.close()
        os.replace(part, dest)
    except (OSError, sqlite3.Error) as e:
        part.unlink(missing_ok=True)
        raise LedgerError(f"ledger {shown}: cannot write its backup {dest} before upgrading ({e})") from None
    return dest


# --------------------------------------------------------------------------------------
# the ledger


# The one reading of recorded rows lives in harness/bench/figures.py (the promotion rule's clock choice);
# these names stay importable from here for the loop.
row_clock, row_ms, row_spread = _figures.row_clock, _figures.row_ms, _figures.row_spread


def row_time(rows: Sequence[BenchResult]) -> Callable[[BenchResult], float]:
    """How to read the time of benchmark rows that are compared with each other (one shape), on
    their `row_clock`."""
    clock = row_clock(rows)
    return lambda row: row_ms(row, clock)


class Ledger:
    """The run ledger in one SQLite file, or in a PostgreSQL database (a `postgresql://` URL). Safe to
    open from several processes, and for a database from several machines."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.url = server_url(path)
        if self.url is not None:
            self.path = None
            self._shown = make_url(str(path)).render_as_string(hide_password=True)  # as the user wrote it
            self._open_server(read_only)
            return
        self.path = sqlite_path(path)
        self._shown = str(path)
        _check_file_access(self.path, self._shown, read_only)
        _inspect_existing(
            self.path,
            self._shown,
            immutable=read_only and not _writable_dir(self.path),
            purpose="read" if read_only else "write",
        )
        if read_only:  # reads an existing ledger, even on read-only media; writes fail
            if not self.path.is_file():
                raise LedgerError(f"no ledger at {self._shown}")
            params = "immutable=1" if not _writable_dir(self.path) else "mode=ro"
            self._write_engine = self._read_engine = _make_engine(self.path, "BEGIN", params)
            self._write = self._read = sessionmaker(self._read_engine, expire_on_commit=False)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(f"ledger {self._shown}: cannot create its folder ({e})") from None
        self._write_engine = _make_engine(self.path, "BEGIN IMMEDIATE")
        self._read_engine = _make_engine(self.path, "BEGIN")
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self._read = sessionmaker(self._read_engine, expire_on_commit=False)
        try:
            self._init_schema()
        except DBAPIError as e:
            self.close()
            raise LedgerError(f"ledger {self._shown} cannot be initialised: {e.orig}") from None

    def _open_server(self, read_only: bool) -> None:
        self._write_engine, self._read_engine = _server_engines(self.url, self._shown, read_only)  # type: ignore[arg-type]
        self._write = sessionmaker(self._write_engine, expire_on_commit=False)
        self._read = sessionmaker(self._read_engine, expire_on_commit=False)
        try:
            _inspect_server(self._read_engine, self._shown, purpose="read" if read_only else "write")
            if read_only:
                with self._read_engine.connect() as conn:
                    if "meta" not in sa_inspect(conn).get_table_names():
                        raise LedgerError(f"no ledger in {self._shown}")
                return
            self._init_schema()
        except DBAPIError as e:
            self.close()
            raise LedgerError(
                f"ledger {self._shown} cannot be initialised: {str(e.orig).strip().splitlines()[0]}"
            ) from None
        except LedgerError:
            self.close()
            raise

    @property
    def location(self) -> str:
        """Where the ledger is, as a user names it (a server's password hidden)."""
        return self._shown

    def _init_schema(self) -> None:
        with self._write_engine.begin() as conn:
            # BEGIN IMMEDIATE (a server: the write lock): a second process initialising the same new
            # ledger waits here, then finds the tables (checkfirst) and the version row in place.
            Base.metadata.create_all(conn, checkfirst=True)
            row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar_one_or_none()
            if row is None:
                conn.execute(Meta.__table__.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))  # type: ignore[attr-defined]
            elif int(row) != SCHEMA_VERSION:  # changed between the inspection and now
                raise LedgerError(
                    f"ledger {self._shown} has schema version {row}; this kernel-agent reads version {SCHEMA_VERSION}"
                )

    def close(self) -> None:
        """Release the connections (the file stays consistent either way)."""
        self._write_engine.dispose()
        self._read_engine.dispose()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self._shown!r})"

    @property
    def shown(self) -> str:
        """Where the ledger is, as the user named it (a database URL without its password), for messages."""
        return self._shown

    def schema_version(self) -> int:
        with self._read() as s:
            return int(s.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar_one())

    # -- runs ---------------------------------------------------------------------------
    def start_run(
        self,
        config: dict,
        versions: dict,
        proposer: str,
        ops: list[str],
        gpu_name: str | None,
        budget: dict,
        notes: RunNotesRecord = RunNotesRecord(),
    ) -> Run:
        """Record a new run (status 'running') and return it."""
        for _ in range(5):
            now = utcnow()
            run = Run(
                id=f"r{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}",
                started_at=now,
                finished_at=None,
                status=RunStatus.RUNNING,
                config_json=_dumps(config),
                versions_json=_dumps(versions),
                gpu_name=gpu_name,
                proposer=proposer,
                ops=",".join(ops),
                budget_json=_dumps(budget),
                notes=notes,
            )
            try:
                with self._write.begin() as s:
                    s.add(run)
                return run
            except IntegrityError:  # the same second and the same 16 random bits: draw again
                continue
        raise LedgerError("could not allocate a unique run id")

    def get_run(self, run_id: str) -> Run | None:
        with self._read() as s:
            return s.get(Run, run_id)

    def set_run_status(
        self, run_id: str, status: str, finished: bool | None = None, notes: RunNotesRecord | None = None
    ) -> Run:
        """Set a run's status. `finished` (default: status is not 'running') stamps
        finished_at now; False clears it (a resumed run)."""
        _check_choice("run status", status, RUN_STATUSES)
        if finished is None:
            finished = status != RunStatus.RUNNING
        with self._write.begin() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise LedgerError(f"no run {run_id!r} in ledger {self._shown}")
            run.status = status
            run.finished_at = utcnow() if finished else None
            if notes is not None:
                run.notes = notes
        return run

    def runs(
        self,
        op: str | None = None,
        status: str | None = None,
        since: datetime | date | str | None = None,
        until: datetime | date | str | None = None,
        proposer: str | None = None,
        limit: int | None = 50,
        gpu: str | None = None,
    ) -> list[Run]:
        """Runs, newest first. `op` matches runs whose op list includes it; `since` and
        `until` bound the start time (a bare date as `until` includes that whole day); `gpu` is the
        GPU's name as recorded, '' for runs without one."""
        q = select(Run)
        if op is not None:
            q = q.where(("," + Run.ops + ",").contains(f",{op},", autoescape=True))
        q = _where_equal(q, Run, status=status, proposer=proposer)
        if gpu is not None:
            q = q.where(Run.gpu_name == gpu) if gpu else q.where(Run.gpu_name.is_(None))
        if since is not None:
            q = q.where(Run.started_at >= _to_utc(since))
        if until is not None:
            if _is_bare_date(until):  # the whole day
                q = q.where(Run.started_at < _to_utc(until) + timedelta(days=1))
            else:
                q = q.where(Run.started_at <= _to_utc(until))
        q = q.order_by(Run.started_at.desc(), Run.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return list(s.scalars(q))

    # -- candidates ---------------------------------------------------------------------
    def add_candidate(
        self,
        op: str,
        judged: JudgedText,
        proposer: str,
        run_id: str | None,
        parent_id: int | None = None,
        path: str | None = None,
        label: str | None = None,
        replayed: bool | None = None,
    ) -> tuple[Candidate, bool]:
        """Record that `run_id` proposed the text `judged` for `op`, keyed by its hash. Returns the candidate and
        whether it is new; a known (op, hash) returns the existing candidate untouched,
        so the same source is evaluated once. A Proposal row is recorded either way, a duplicate (replayed,
        not judged again) when `replayed` says so, by default when the candidate was known (a known one
        that is judged again, one a time limit stopped say, is no replay)."""
        h = judged.hash
        with self._write.begin() as s:
            cand = s.scalars(select(Candidate).where(Candidate.op == op, Candidate.source_hash == h)).one_or_none()
            new = cand is None
            now = utcnow()
            if new:
                cand = Candidate(
                    op=op,
                    source_hash=h,
                    source=judged.text,
                    path=path,
                    parent_id=parent_id,
                    proposer=proposer,
                    label=label,
                    created_at=now,
                    first_run_id=run_id,
                    status=CandidateStatus.PROPOSED,
                )
                s.add(cand)
                s.flush()
            duplicate = (not new) if replayed is None else (replayed and not new)
            s.add(Proposal(run_id=run_id, candidate_id=cand.id, proposer=proposer, created_at=now, duplicate=duplicate))  # type: ignore[union-attr]
        return cand, new  # type: ignore[return-value]

    def find_candidate(self, op: str, judged: JudgedText) -> Candidate | None:
        """The candidate with this text's hash, if it was ever proposed."""
        return self.find_candidate_by_hash(op, judged.hash)

    def find_candidate_by_hash(self, op: str, source_hash: str) -> Candidate | None:
        """The candidate of `op` whose text has this hash (a JudgedText's), if it was ever proposed."""
        with self._read() as s:
            return s.scalars(
                select(Candidate).where(Candidate.op == op, Candidate.source_hash == source_hash)
            ).one_or_none()

    def set_candidate_status(
        self, cid: int, status: str, verdict: dict | None = None, fpsan_equivalent: bool | None = None
    ) -> Candidate:
        """Move a candidate along proposed -> rejected | verified -> benchmarked -> promoted.
        `verdict` and `fpsan_equivalent` are stored when given, kept otherwise."""
        _check_choice("candidate status", status, CANDIDATE_STATUSES)
        with self._write.begin() as s:
            cand = self._get_candidate(s, cid)
            cand.status = status
            if verdict is not None:
                cand.verdict_json = _dumps(verdict)
            if fpsan_equivalent is not None:
                cand.fpsan_equivalent = bool(fpsan_equivalent)
        return cand

    def _get_candidate(self, s: Session, cid: int) -> Candidate:
        cand = s.get(Candidate, cid)
        if cand is None:
            raise LedgerError(f"no candidate {cid} in ledger {self._shown}")
        return cand

    def candidate(self, cid: int) -> Candidate | None:
        with self._read() as s:
            return s.get(Candidate, cid)

    def candidates(
        self, run_id: str | None = None, op: str | None = None, status: str | None = None
    ) -> list[Candidate]:
        """Candidates in id order; with `run_id`, those that run proposed (new or not)."""
        q = select(Candidate)
        if run_id is not None:
            q = q.where(Candidate.id.in_(select(Proposal.candidate_id).where(Proposal.run_id == run_id)))
        q = _where_equal(q, Candidate, op=op, status=status)
        with self._read() as s:
            return list(s.scalars(q.order_by(Candidate.id)))

    def proposals(self, run_id: str | None = None, candidate_id: int | None = None) -> list[Proposal]:
        q = _where_equal(select(Proposal), Proposal, run_id=run_id, candidate_id=candidate_id)
        with self._read() as s:
            return list(s.scalars(q.order_by(Proposal.id)))

    # -- checks -------------------------------------------------------------------------
    def record_checks(self, cid: int, mode: SanitizerMode, checks: Iterable[Mapping[str, Any]]) -> list[CheckResult]:
        """Store a sanitizer pass's checks for a candidate. Each check has name, status
        ('passed'|'failed'|'skipped'; a bool `passed` is accepted instead), detail and
        duration_s."""
        _check_choice("check mode", mode, CHECK_MODES)
        rows = []
        now = utcnow()
        for c in checks:
            status = c.get("status")
            if status is None:
                if c.get("skipped"):
                    status = CheckStatus.SKIPPED
                elif "passed" in c:
                    status = CheckStatus.PASSED if c["passed"] else CheckStatus.FAILED
            _check_choice(f"status of check {c.get('name')!r}", status, CHECK_STATUSES)  # type: ignore[arg-type]
            rows.append(
                CheckResult(
                    candidate_id=cid,
                    name=str(c["name"]),
                    status=status,
                    detail=str(c.get("detail") or ""),
                    duration_s=float(c.get("duration_s") or 0.0),
                    mode=mode,
                    created_at=now,
                )
            )
        with self._write.begin() as s:
            self._get_candidate(s, cid)
            s.add_all(rows)
        return rows

    def checks(self, cid: int, mode: SanitizerMode | None = None) -> list[CheckResult]:
        q = _where_equal(select(CheckResult), CheckResult, candidate_id=cid, mode=mode)
        with self._read() as s:
            return list(s.scalars(q.order_by(CheckResult.id)))

    # -- model calls --------------------------------------------------------------------
    def record_model_call(
        self,
        run_id: str | None,
        model: str,
        prompt: str,
        response: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        latency_s: float,
        error: str | None = None,
        candidate_id: int | None = None,
    ) -> int:
        """Store one call to the code model (failed calls too: they cost tokens and time)."""
        call = ModelCall(
            run_id=run_id,
            candidate_id=candidate_id,
            model=model,
            prompt=prompt,
            response=response,
            prompt_tokens=int(prompt_tokens or 0),
            completion_tokens=int(completion_tokens or 0),
            latency_s=float(latency_s or 0.0),
            error=error,
            created_at=utcnow(),
        )
        with self._write.begin() as s:
            s.add(call)
            s.flush()
            return call.id

    def link_model_call(self, call_id: int, candidate_id: int) -> None:
        """Attach a call to the candidate its response became (known only after parsing)."""
        with self._write.begin() as s:
            call = s.get(ModelCall, call_id)
            if call is None:
                raise LedgerError(f"no model call {call_id} in ledger {self._shown}")
            call.candidate_id = candidate_id

    def model_calls(self, run_id: str | None = None, candidate_id: int | None = None) -> list[ModelCall]:
        q = _where_equal(select(ModelCall), ModelCall, run_id=run_id, candidate_id=candidate_id)
        with self._read() as s:
            return list(s.scalars(q.order_by(ModelCall.id)))

    # -- diagnoses and pruned proposals (schema version 3) --------------------------------
    def _has_v3(self) -> bool:
        """Whether the tables of version 3 exist (an older ledger is read as it is: it has none)."""
        return self.schema_version() >= 3

    def record_diagnosis(
        self,
        run_id: str | None,
        op: str,
        bucket: str,
        dtype: str,
        source_hash: str,
        incumbent: str,
        bound: str,
        document: Mapping[str, Any],
    ) -> int:
        row = DiagnosisRecord(
            run_id=run_id,
            op=op,
            bucket=bucket,
            dtype=dtype,
            source_hash=source_hash,
            incumbent=incumbent,
            bound=bound,
            document_json=json.dumps(document),
            created_at=utcnow(),
        )
        with self._write.begin() as s:
            s.add(row)
            s.flush()
            return row.id

    def diagnoses(
        self,
        run_id: str | None = None,
        op: str | None = None,
        bucket: str | None = None,
        dtype: str | None = None,
        source_hash: str | None = None,
    ) -> list[DiagnosisRecord]:
        if not self._has_v3():
            return []
        q = _where_equal(
            select(DiagnosisRecord),
            DiagnosisRecord,
            run_id=run_id,
            op=op,
            bucket=bucket,
            dtype=dtype,
            source_hash=source_hash,
        )
        with self._read() as s:
            return list(s.scalars(q.order_by(DiagnosisRecord.id)))

    def record_pruned(
        self, run_id: str | None, op: str, bucket: str, dtype: str, label: str, source_hash: str, reason: str
    ) -> int:
        row = PrunedProposal(
            run_id=run_id,
            op=op,
            bucket=bucket,
            dtype=dtype,
            label=label,
            source_hash=source_hash,
            reason=reason,
            created_at=utcnow(),
        )
        with self._write.begin() as s:
            s.add(row)
            s.flush()
            return row.id

    def pruned(
        self, run_id: str | None = None, op: str | None = None, bucket: str | None = None, dtype: str | None = None
    ) -> list[PrunedProposal]:
        if not self._has_v3():
            return []
        q = _where_equal(select(PrunedProposal), PrunedProposal, run_id=run_id, op=op, bucket=bucket, dtype=dtype)
        with self._read() as s:
            return list(s.scalars(q.order_by(PrunedProposal.id)))

    # -- field failures (schema version 4) --------------------------------------------------
    def _has_v4(self) -> bool:
        """Whether the table of version 4 exists (an older ledger is read as it is: it has none)."""
        return self.schema_version() >= 4

    def record_field_failure(self, ff: FieldFailure) -> int:
        """Record what the serving guard found; returns the row's id. The same failure again while it is
        unresolved (op, bucket, dtype, GPU, kernel hash, shape class and kind alike) is counted on the
        row it has: `count` + 1 and `last_seen`, the first sighting's shapes and detail kept."""
        kind = FailureKind(ff.kind).value  # a kind the guard does not know is refused, not stored
        seen = _to_utc(ff.at)
        with self._write.begin() as s:  # the write lock: two processes recording it at once count it twice
            row = s.scalars(
                _where_equal(
                    select(FieldFailureRecord),
                    FieldFailureRecord,
                    op=ff.op,
                    bucket=ff.bucket,
                    dtype=ff.dtype,
                    gpu=ff.gpu,
                    source_hash=ff.source_hash,
                    shape_class=ff.shape_class,
                    kind=kind,
                )
                .where(FieldFailureRecord.resolved_at.is_(None))
                .order_by(FieldFailureRecord.id)
                .limit(1)
            ).first()
            if row is not None:
                row.count += 1
                row.last_seen = max(row.last_seen, seen)
                return row.id
            doc = ff.to_json()
            row = FieldFailureRecord(
                op=ff.op,
                bucket=ff.bucket,
                dtype=ff.dtype,
                gpu=ff.gpu,
                kernel=ff.kernel,
                source_hash=ff.source_hash,
                shape_class=ff.shape_class,
                shapes_json=json.dumps(doc["shapes"]),
                strides_json=json.dumps(doc["strides"]),
                dtypes_json=json.dumps(doc["dtypes"]),
                kind=kind,
                detail=ff.detail,
                first_seen=seen,
                last_seen=seen,
                count=1,
            )
            s.add(row)
            s.flush()
            return row.id

    def field_failures(
        self,
        unresolved_only: bool = False,
        op: str | None = None,
        bucket: str | None = None,
        dtype: str | None = None,
        gpu: str | None = None,
        source_hash: str | None = None,
        resolved_by: str | None = None,
    ) -> list[FieldFailureRecord]:
        """Field failures, oldest first. `gpu` matches however the GPU is spelled ('NVIDIA H200' or the
        manifest's 'nvidia-h200')."""
        if not self._has_v4():
            return []
        q = _where_equal(
            select(FieldFailureRecord),
            FieldFailureRecord,
            op=op,
            bucket=bucket,
            dtype=dtype,
            source_hash=source_hash,
            resolved_by=resolved_by,
        )
        if unresolved_only:
            q = q.where(FieldFailureRecord.resolved_at.is_(None))
        with self._read() as s:
            rows = list(s.scalars(q.order_by(FieldFailureRecord.id)))
        return [r for r in rows if gpu is None or gpu_slug(r.gpu) == gpu_slug(gpu)]

    def resolve_field_failures(
        self, op: str, bucket: str, dtype: str, gpu: str, by: str, source_hash: str | None = None
    ) -> int:
        """Mark the unresolved field failures of a bucket on a GPU (of one kernel, given `source_hash`)
        resolved by `by` (the demotion's run id, or why in words); returns how many."""
        now = utcnow()
        with self._write.begin() as s:
            q = _where_equal(
                select(FieldFailureRecord),
                FieldFailureRecord,
                op=op,
                bucket=bucket,
                dtype=dtype,
                source_hash=source_hash,
            ).where(FieldFailureRecord.resolved_at.is_(None))
            rows = [r for r in s.scalars(q) if gpu_slug(r.gpu) == gpu_slug(gpu)]
            for r in rows:
                r.resolved_at = now
                r.resolved_by = by
            return len(rows)

    # -- benchmarks ---------------------------------------------------------------------
    def record_bench(self, **fields: Any) -> BenchResult:
        """Store one timing. Required: op, shape_key, bucket, dtype, gpu_name, median_ms,
        spread_ms, n_samples. Optional: run_id, candidate_id (None for baseline and
        anchors), label ('candidate' by default), graph_ms, fraction_of_ceiling,
        ceiling_kind, implausible, extra (a dict) or extra_json."""
        _check_fields("record_bench", fields, _BENCH_REQUIRED, _BENCH_OPTIONAL)
        f = dict(fields)
        if "extra" in f:
            extra = f.pop("extra")
            f["extra_json"] = None if extra is None else _dumps(extra)
        if f.get("ceiling_kind") is not None:
            _check_choice("ceiling kind", f["ceiling_kind"], CEILING_KINDS)
        f.setdefault("label", "candidate" if f.get("candidate_id") is not None else "baseline")
        f.setdefault("implausible", False)
        f.setdefault("created_at", utcnow())
        row = BenchResult(**f)
        with self._write.begin() as s:
            s.add(row)
        return row

    def bench_results(
        self,
        candidate_id: int | None = None,
        run_id: str | None = None,
        op: str | None = None,
        label: str | None = None,
        bucket: str | None = None,
        dtype: str | None = None,
    ) -> list[BenchResult]:
        q = _where_equal(
            select(BenchResult),
            BenchResult,
            candidate_id=candidate_id,
            run_id=run_id,
            op=op,
            bucket=bucket,
            dtype=dtype,
            label=label,
        )
        with self._read() as s:
            return list(s.scalars(q.order_by(BenchResult.id)))

    # -- promotions ---------------------------------------------------------------------
    def record_promotion(self, **fields: Any) -> Promotion:
        """Store a promotion for (op, bucket, dtype, gpu_name). Required: op, bucket,
        dtype, gpu_name, new_ms, old_ms, gain, spread. Optional: run_id, candidate_id,
        replaced_candidate_id (default: the active promotion's candidate, None for the
        baseline), reason, versions (a dict) or versions_json.

        In the same transaction, the promotion it replaces is demoted and the candidate's
        status becomes 'promoted'."""
        _check_fields("record_promotion", fields, _PROMOTION_REQUIRED, _PROMOTION_OPTIONAL)
        f = dict(fields)
        if "versions" in f:
            f["versions_json"] = _dumps(f.pop("versions") or {})
        f.setdefault("created_at", utcnow())
        with self._write.begin() as s:
            old = self._active(s, f["op"], f["bucket"], f["dtype"], f["gpu_name"])
            if "replaced_candidate_id" not in f:
                f["replaced_candidate_id"] = old.candidate_id if old is not None else None
            promo = Promotion(**f)
            s.add(promo)
            s.flush()
            if old is not None:
                who = f"candidate {promo.candidate_id}" if promo.candidate_id is not None else "the baseline"
                self._demote(s, old, f"replaced by {who} (promotion {promo.id})", promo.created_at)
            if promo.candidate_id is not None:
                self._get_candidate(s, promo.candidate_id).status = CandidateStatus.PROMOTED
        return promo

    @staticmethod
    def _active(s: Session, op: str, bucket: str, dtype: str, gpu_name: str) -> Promotion | None:
        return s.scalars(
            select(Promotion)
            .where(
                Promotion.op == op,
                Promotion.bucket == bucket,
                Promotion.dtype == dtype,
                Promotion.gpu_name == gpu_name,
                Promotion.demoted_at.is_(None),
            )
            .order_by(Promotion.created_at.desc(), Promotion.id.desc())
            .limit(1)
        ).first()

    def _demote(self, s: Session, promo: Promotion, reason: str, when: datetime) -> None:
        promo.demoted_at = when
        promo.demote_reason = reason
        s.flush()
        if promo.candidate_id is None:
            return
        # a candidate serving no bucket any more is back to 'benchmarked'
        still = s.scalar(
            select(func.count(Promotion.id)).where(
                Promotion.candidate_id == promo.candidate_id, Promotion.demoted_at.is_(None)
            )
        )
        cand = s.get(Candidate, promo.candidate_id)
        if cand is not None and not still and cand.status == CandidateStatus.PROMOTED:
            cand.status = CandidateStatus.BENCHMARKED

    def active_promotion(self, op: str, bucket: str, dtype: str, gpu_name: str) -> Promotion | None:
        """The newest promotion for this key that has not been demoted."""
        with self._read() as s:
            return self._active(s, op, bucket, dtype, gpu_name)

    def demote(self, promotion_id: int, reason: str) -> bool:
        """Mark a promotion demoted. False when it already was (the first reason stays)."""
        with self._write.begin() as s:
            promo = s.get(Promotion, promotion_id)
            if promo is None:
                raise LedgerError(f"no promotion {promotion_id} in ledger {self._shown}")
            if promo.demoted_at is not None:
                return False
            self._demote(s, promo, reason, utcnow())
            return True

    def promotions(
        self, op: str | None = None, active_only: bool = False, run_id: str | None = None
    ) -> list[Promotion]:
        """Promotions, newest first."""
        q = _where_equal(select(Promotion), Promotion, op=op, run_id=run_id)
        if active_only:
            q = q.where(Promotion.demoted_at.is_(None))
        with self._read() as s:
            return list(s.scalars(q.order_by(Promotion.created_at.desc(), Promotion.id.desc())))

    # -- views for people -----------------------------------------------------------------
    def figures(
        self,
        op: str | None = None,
        run_id: str | None = None,
        candidate_id: int | None = None,
        judged_only: bool = True,
    ) -> list[_figures.JudgedFigure]:
        """The judged figures (harness/bench/figures.py) of the candidates' benchmarks, in the order recorded:
        each candidate at each shape against the incumbent and the anchor timed beside it. judged_only:
        only candidates whose benchmark stands (status 'benchmarked' or 'promoted'; one rejected
        afterwards, say by a GPU check, is not a result)."""
        q = select(BenchResult).where(BenchResult.candidate_id.is_not(None))
        if judged_only:
            q = q.join(Candidate, Candidate.id == BenchResult.candidate_id).where(
                Candidate.status.in_(_figures.JUDGED_STATUSES)
            )
        q = _where_equal(q, BenchResult, op=op, run_id=run_id, candidate_id=candidate_id)
        with self._read() as s:
            return _figures.judged_figures(s.scalars(q.order_by(BenchResult.id)))

    def leaderboard(self, op: str, dtype: str | None = None) -> _figures.Leaderboard:
        """Per (bucket, shape_key, dtype, gpu_name): the judged figure (see `figures`) with the highest
        speedup over the incumbent timed beside it, among the figures that beat it (speedup above
        1.000x as printed); candidates slower than their incumbent are not on the board, and the
        shapes where no candidate beat it are listed as `unbeaten`. Implausible timings are left
        out. A speedup over a promoted kernel is over that kernel, not carried through to the
        baseline: the entry names its incumbent."""
        figs = [f for f in self.figures(op=op) if dtype is None or f.dtype == dtype]
        ids = {f.candidate_id for f in figs}
        with self._read() as s:
            labels = {
                cid: (label, status)
                for cid, label, status in s.execute(
                    select(Candidate.id, Candidate.label, Candidate.status).where(Candidate.id.in_(ids))
                )
            }
        return _figures.leaderboard(op, figs, labels)

    def judged_now(self, run_id: str) -> set[int]:
        """The candidates a run judged itself: proposed by it first, or timed by it (one an earlier run only
        verified). The others it proposed were judged by earlier runs and replayed from the ledger."""
        with self._read() as s:
            proposed = set(s.scalars(select(Proposal.candidate_id).where(Proposal.run_id == run_id)))
            new = set(
                s.scalars(select(Proposal.candidate_id).where(Proposal.run_id == run_id, Proposal.duplicate.is_(False)))
            )
            timed = set(
                s.scalars(
                    select(BenchResult.candidate_id).where(
                        BenchResult.run_id == run_id, BenchResult.candidate_id.is_not(None)
                    )
                )
            )
        return (new | timed) & proposed  # type: ignore[return-value]

    def run_summary(self, run_id: str) -> RunSummary:
        """What a run did, for `show` and reports: candidates by status, failed checks by
        name, promotions, model usage and wall time."""
        run = self.get_run(run_id)
        if run is None:
            raise LedgerError(f"no run {run_id!r} in ledger {self._shown}")
        proposed = select(Proposal.candidate_id).where(Proposal.run_id == run_id)
        now_ids = self.judged_now(run_id)
        has_v3 = self._has_v3()  # (read before the session: it reads the version in one of its own)
        with self._read() as s:
            by_status = _count_by_status(s, proposed)
            proposed_ids = set(s.scalars(proposed))
            now_by_status = _count_by_status(s, now_ids)
            n_prop, n_dup = s.execute(
                select(
                    func.count(Proposal.id),
                    func.coalesce(func.sum(case((Proposal.duplicate, 1), else_=0)), 0),
                ).where(Proposal.run_id == run_id)
            ).one()
            failed = {
                name: n
                for name, n in s.execute(
                    select(CheckResult.name, func.count(CheckResult.id))
                    .where(CheckResult.candidate_id.in_(now_ids), CheckResult.status == CheckStatus.FAILED.value)
                    .group_by(CheckResult.name)
                    .order_by(func.count(CheckResult.id).desc(), CheckResult.name)
                )
            }
            model = _model_usage(s, run_id)
            n_bench = s.scalar(select(func.count(BenchResult.id)).where(BenchResult.run_id == run_id))
            promos = list(s.scalars(select(Promotion).where(Promotion.run_id == run_id).order_by(Promotion.id)))
            n_pruned = (
                s.scalar(select(func.count(PrunedProposal.id)).where(PrunedProposal.run_id == run_id)) if has_v3 else 0
            )
        end = run.finished_at or (utcnow() if run.status == RunStatus.RUNNING else None)
        return RunSummary(
            run_id=run.id,
            status=RunStatus(run.status),
            proposer=run.proposer,
            ops=run.op_list,
            gpu_name=run.gpu_name,
            started_at=run.started_at,
            finished_at=run.finished_at,
            wall_s=(end - run.started_at).total_seconds() if end is not None else None,
            proposals=int(n_prop),
            duplicates=int(n_dup),
            candidates=sum(by_status.values()),
            candidates_by_status={st: by_status.get(st, 0) for st in CANDIDATE_STATUSES},
            checks_failed=failed,
            bench_results=int(n_bench or 0),
            promotions=[_promotion_summary(p) for p in promos],
            model=model,
            judged_now_by_status={st: now_by_status.get(st, 0) for st in CANDIDATE_STATUSES},
            replayed=len(proposed_ids - now_ids),
            pruned=int(n_pruned or 0),
        )


def _count_by_status(s: Session, candidate_ids) -> Dict[str, int]:
    """How many of the candidates (a set of ids, or a query of them) have each status."""
    return {
        st: n
        for st, n in s.execute(
            select(Candidate.status, func.count(Candidate.id))
            .where(Candidate.id.in_(candidate_ids))
            .group_by(Candidate.status)
        )
    }


def _model_usage(s: Session, run_id: str) -> ModelUsage:
    """The code model's calls of a run: how many, how many failed, the tokens and the time they took."""
    calls, errors, ptok, ctok, lat = s.execute(
        select(
            func.count(ModelCall.id),
            func.count(ModelCall.error),
            func.coalesce(func.sum(ModelCall.prompt_tokens), 0),
            func.coalesce(func.sum(ModelCall.completion_tokens), 0),
            func.coalesce(func.sum(ModelCall.latency_s), 0.0),
        ).where(ModelCall.run_id == run_id)
    ).one()
    return ModelUsage(
        calls=int(calls),
        errors=int(errors),
        prompt_tokens=int(ptok),
        completion_tokens=int(ctok),
        total_tokens=int(ptok) + int(ctok),
        latency_s=float(lat),
    )


def _promotion_summary(p: Promotion) -> PromotionSummary:
    """A promotion row as `show` and reports read it (active: not demoted since)."""
    return PromotionSummary(
        id=p.id,
        op=p.op,
        bucket=p.bucket,
        dtype=p.dtype,
        gpu_name=p.gpu_name,
        candidate_id=p.candidate_id,
        replaced_candidate_id=p.replaced_candidate_id,
        new_ms=p.new_ms,
        old_ms=p.old_ms,
        gain=p.gain,
        spread=p.spread,
        reason=p.reason,
        active=p.demoted_at is None,
    )


__all__ = [
    "SCHEMA_VERSION",
    "WRITE_LOCK_KEY",
    "row_time",
    "LedgerError",
    "RunStatus",
    "CandidateStatus",
    "RunSummary",
    "RunSession",
    "PromotionSummary",
    "ModelUsage",
    "Ledger",
    "Upgrade",
    "upgrade_ledger",
    "server_url",
    "sqlite_path",
    "Base",
    "Meta",
    "Run",
    "RunNotesRecord",
    "Candidate",
    "Proposal",
    "ModelCall",
    "CheckResult",
    "BenchResult",
    "Promotion",
    "DiagnosisRecord",
    "PrunedProposal",
    "FieldFailureRecord",
    "RUN_STATUSES",
    "CANDIDATE_STATUSES",
    "CHECK_STATUSES",
    "CHECK_MODES",
]

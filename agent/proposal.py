"""What proposers produce and what they are told (shared by the search and model proposers), and the thread a
run calls its proposer on."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..harness.bench.diagnosis import Diagnosis
from ..ops.common import Shape


@dataclass
class Proposal:
    op: str
    source: str
    label: str
    proposer: str
    note: str = ""
    parent_id: Optional[int] = None
    model_call_id: Optional[int] = None
    rejected: str = ""  # set when the reply could not become a candidate (no code, truncated, ...), or none came
    # set when the model call itself failed (no reply came back), as distinct from an unusable reply: its error
    model_call_error: Optional[str] = None

    @classmethod
    def no_reply(cls, op: str, label: str, proposer: str, call_id: Optional[int], error: str) -> "Proposal":
        """A proposal whose model call failed: no candidate, and `rejected` says why."""
        why = f"model call failed: {error}"
        return cls(op, "", label, proposer, model_call_id=call_id, rejected=why, model_call_error=error)

    @property
    def call_failed(self) -> bool:
        """Whether the model call failed (no reply came back): not a candidate, not an unusable reply either."""
        return self.model_call_error is not None


@dataclass
class Attempt:
    """Feedback about an earlier candidate, for the next prompt."""

    label: str
    passed: bool
    summary: str  # first failing check with its detail, or the timing
    median_ms: Optional[float] = None
    fraction_of_ceiling: Optional[float] = None


@dataclass
class ProposeContext:
    op: str
    bucket: str
    dtype: str
    shapes: List[Shape]
    incumbent_source: str
    incumbent_label: str = "baseline"
    incumbent_ms: Optional[float] = None
    gpu: Optional[str] = None
    ceilings: Optional[Dict[str, Any]] = None
    attempts: List[Attempt] = field(default_factory=list)
    archive: List[str] = field(default_factory=list)  # sources of diverse good candidates
    diagnosis: Optional[Diagnosis] = None  # what bounds the incumbent on this bucket (harness/bench/diagnosis.py)
    repeats: int = 0  # the proposer's latest replies for this bucket in a row that repeated a source already tried


class Proposer:
    name = "proposer"
    # Proposals in a row, for one bucket, that repeat a source already proposed before the bucket counts as
    # exhausted; and whether a source an earlier run judged counts as a repeat. Not for the built-in search:
    # its replays of what earlier runs judged are free (finitely many: it re-walks its climb and moves on).
    repeat_limit = 25
    replays_are_repeats = False

    def propose(self, ctx: ProposeContext, n: int) -> List[Proposal]:
        raise NotImplementedError

    def feedback(self, ctx: ProposeContext, proposal: Proposal, passed: bool, median_ms: Optional[float]) -> None:
        """Told after each candidate is evaluated (the search proposer climbs on it)."""

    def set_incumbent_time(self, ctx: ProposeContext, median_ms: float) -> None:
        """Told the incumbent's measured time for the bucket."""


class ProposerThread:
    """A proposer's calls, in the order they are made, on a thread of their own: a model call never holds the
    stream. Feedback is queued behind the call in flight; `drain` waits until the proposer has taken it all."""

    def __init__(self, proposer: Proposer):
        self.proposer = proposer
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ka-proposer")

    @property
    def name(self) -> str:
        return self.proposer.name

    def propose(self, ctx: ProposeContext, n: int) -> "Future[List[Proposal]]":
        return self._thread.submit(self.proposer.propose, ctx, n)

    def feedback(self, ctx: ProposeContext, p: Proposal, passed: bool, ms: Optional[float]) -> None:
        self._thread.submit(self.proposer.feedback, ctx, p, passed, ms)

    def incumbent_time(self, ctx: ProposeContext, ms: float) -> None:
        self._thread.submit(self.proposer.set_incumbent_time, ctx, ms)

    def tokens(self) -> int:
        return getattr(self.proposer, "tokens_used", 0)

    def drain(self) -> None:
        self._thread.submit(lambda: None).result()

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

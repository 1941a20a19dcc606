"""What proposers produce and what they are told (shared by the search and model proposers)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..harness.diagnosis import Diagnosis
from ..harness.ops.common import Shape


@dataclass
class Proposal:
    op: str
    source: str
    label: str
    proposer: str
    note: str = ""
    parent_id: Optional[int] = None
    model_call_id: Optional[int] = None
    rejected: str = ""  # set when the reply could not become a candidate (no code, truncated, ...)


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
    diagnosis: Optional[Diagnosis] = None  # what bounds the incumbent on this bucket (harness/diagnosis.py)


class Proposer:
    name = "proposer"

    def propose(self, ctx: ProposeContext, n: int) -> List[Proposal]:
        raise NotImplementedError

    def feedback(self, ctx: ProposeContext, proposal: Proposal, passed: bool, median_ms: Optional[float]) -> None:
        """Told after each candidate is evaluated (the search proposer climbs on it)."""

    def set_incumbent_time(self, ctx: ProposeContext, median_ms: float) -> None:
        """Told the incumbent's measured time for the bucket."""

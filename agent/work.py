"""What a run's parts hand each other: the `Stage`s of a candidate, the `Incumbent` a target's candidates are
judged against, a candidate's `Work` for one target, and the events a run reports (`RunEvents`, drawn by the
command line; `LiveStatus`, where a streaming run stands)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Dict, Optional, Set

from ..harness.bench.promotion import Judgement
from ..sanitizer.canonical import JudgedText
from ..sanitizer.verdict import SanitizerMode
from . import ui
from .proposal import Proposal, ProposeContext
from .run_config import Target


class Stage(str, Enum):
    """A stage of one candidate, as the stream queues it, the placement runs it and the ledger records its
    checks (quick, full and gpu are the sanitizer's modes)."""

    QUICK = "quick"  # the quick sanitizer (CPU)
    FULL = "full"  # the full sanitizer (CPU)
    GPU = "gpu"  # the GPU checks a benchmark waits for (determinism)
    BENCH = "bench"  # the benchmark against the bucket's incumbent
    PROMOTE = "promote"  # a winner's promotion checks (compute-sanitizer, the device suite)

    def __str__(self) -> str:  # f-strings and str() give the word, not Stage.QUICK
        return self.value

    @property
    def mode(self) -> SanitizerMode:
        """The sanitizer mode a sanitizer stage runs (the promotion checks run the GPU mode's)."""
        return SanitizerMode.GPU if self == Stage.PROMOTE else SanitizerMode(self.value)

    @property
    def sanitizer(self) -> bool:
        """Whether the stage is a sanitizer stage judged once for every work that shares the candidate."""
        return self in SANITIZER_STAGES


SANITIZER_STAGES = (Stage.QUICK, Stage.FULL, Stage.GPU)


@dataclass(frozen=True)
class Incumbent:
    """What a target's candidates are judged against: the kernel serving its bucket now."""

    label: str  # "baseline", or "serving:<file>" for a promoted kernel
    file: Optional[str]  # None for the baseline
    judged: JudgedText  # a promoted kernel's canonical text; the baseline's file as written

    @property
    def source(self) -> str:
        return self.judged.text


@dataclass
class Work:
    """One candidate being evaluated for one target (a source proposed for two buckets is one
    candidate with two works: sanitized once, benchmarked for each)."""

    target: Target
    ctx: ProposeContext
    proposal: Proposal
    cid: int
    path: str
    # the text the loop holds for it (proposal.source, canonical unless refused) and its hash: what every verdict,
    # the benchmark and the promotion are held against, whatever becomes of the file at `path`
    judged: JudgedText
    judgement: Optional[Judgement] = None  # set by the benchmark, read by the promotion checks
    passed: Set[Stage] = field(default_factory=set)  # sanitizer stages passed (full, gpu)
    rejected: bool = False  # a stage failed: whatever runs beside it is recorded, nothing follows


@dataclass
class RunEvents:
    """Callbacks for progress output (the CLI draws them; tests collect them)."""

    note: Callable[[str], None] = lambda s: None
    candidate: Callable[[str, str, str], None] = lambda label, status, detail: None
    status: Callable[["LiveStatus"], None] = lambda st: None  # about once a second while the run streams
    started: Callable[[str], None] = lambda run_id: None  # the run's id, once it is recorded or resumed
    # the command that resumes a run, as the hints print it (the CLI adds the ledger and how it was started)
    resume_command: Callable[[str], str] = lambda run_id: f"kernel-agent run --resume {run_id}"


@dataclass
class LiveStatus:
    """Where a streaming run stands: what each stage holds, the budget, and the best gain so far."""

    elapsed_s: float
    time_limit_s: float
    new_candidates: int
    max_candidates: Optional[int]
    running: Dict[str, int]  # stage -> tasks running
    queued: int  # stages waiting for a slot
    judged: int
    best_gain: Optional[float]  # the best benchmarked gain over the incumbent, as the rule computed it

    def describe(self) -> str:
        budget = f"{self.new_candidates}" + (f"/{self.max_candidates}" if self.max_candidates is not None else "")
        stages = " ".join(
            f"{k} {self.running.get(k, 0)}" for k in Stage if k in self.running or k in (Stage.QUICK, Stage.FULL)
        )
        best = f"best {self.best_gain:+.1%}" if self.best_gain is not None else "best -"
        return (
            f"{ui.clock(self.elapsed_s)}/{ui.clock(self.time_limit_s)} cand {budget}; {stages}; queued {self.queued}; "
            f"judged {self.judged}; {best}"
        )

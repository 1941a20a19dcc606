"""How a run used the machine: the figures each session of `kernel-agent run` keeps in the run's notes,
and the throughput line they are read back as (after a run, in `show`, `history` and the web view)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:  # (the type only: the ledger loads SQLAlchemy)
    from ..harness.ledger.ledger import RunNotesRecord


@dataclass
class Throughput:
    """How the run used the machine (from the placement's task log)."""

    first_benchmark_s: Optional[float] = None  # from the start to the first finished benchmark
    judged: int = 0  # candidates with a final verdict: rejected, benchmarked or promoted
    gpu_busy_fraction: Optional[float] = None  # of the wall time after the first 3 minutes
    stage_s: Dict[str, float] = field(default_factory=dict)  # median seconds per task of each stage
    benchmarks: int = 0  # benchmark children run
    raced_out: int = 0  # of which stopped early at a shape the rule refuses on its own
    stopped_early: int = 0  # of which stopped by the sequential test (harness/bench/sequential.py)
    wall_s: float = 0.0
    # GPU wall seconds per candidate (placement.gpu_seconds): the median per stage and in total, leased seconds
    gpu_s: Dict[str, float] = field(default_factory=dict)
    gpu_busy_s: Optional[float] = None  # the seconds the GPUs had at least one task (the union of the spans)
    tokens: int = 0  # the code model's tokens (prompt and reply) this session spent
    # each candidate's GPU seconds by stage, by candidate id (as text: the notes are JSON)
    gpu_s_by_candidate: Dict[str, Dict[str, float]] = field(default_factory=dict)

    def tokens_per_judged(self) -> Optional[float]:
        return self.tokens / self.judged if self.tokens and self.judged else None

    def per_gpu_hour(self, n_gpus: int) -> Optional[float]:
        if not n_gpus or self.wall_s <= 0:
            return None
        return self.judged / (self.wall_s * n_gpus / 3600.0)

    def describe(self, n_gpus: int) -> str:
        parts = []
        if self.first_benchmark_s is not None:
            parts.append(f"first benchmark after {self.first_benchmark_s:.0f}s")
        rate = self.per_gpu_hour(n_gpus)
        parts.append(f"{self.judged} judged" + (f" ({rate:.0f} per GPU-hour)" if rate is not None else ""))
        if self.gpu_busy_fraction is not None:
            parts.append(f"GPU busy {self.gpu_busy_fraction:.0%} after the first 3 minutes")
        if self.stage_s:
            parts.append("median s per task: " + ", ".join(f"{k} {v:.1f}" for k, v in self.stage_s.items()))
        if self.gpu_s:
            parts.append(gpu_seconds_words(self.gpu_s, self.gpu_busy_s, self.judged))
        if self.stopped_early:
            parts.append(f"{self.stopped_early} benchmark(s) stopped early by the sequential test")
        per = self.tokens_per_judged()
        if per is not None:
            parts.append(f"{per:.0f} model tokens per judged candidate")
        return "; ".join(parts)


# What each GPU stage is called in the throughput line (placement task kinds).
GPU_STAGE_WORDS = {"gpu": "GPU checks", "bench": "benchmark", "promote": "promotion checks", "total": "total"}


def gpu_seconds_words(gpu_s: Dict[str, float], busy_s: Optional[float], judged: int) -> str:
    """'GPU s per candidate (median, leased): GPU checks 8.1, benchmark 20.3, total 27.0; GPU busy 1234 s, 12.3 s
    per judged candidate'. Leased seconds overlap where checks share a GPU; the busy seconds count them once."""
    order = sorted(gpu_s, key=lambda k: (list(GPU_STAGE_WORDS).index(k) if k in GPU_STAGE_WORDS else 3, k))
    figures = ", ".join(f"{GPU_STAGE_WORDS.get(k, k)} {gpu_s[k]:.1f}" for k in order)
    text = f"GPU s per candidate (median, leased): {figures}"
    if busy_s is not None:
        text += f"; GPU busy {busy_s:.0f} s" + (f", {busy_s / judged:.1f} s per judged candidate" if judged else "")
    return text


def session_lines(notes: RunNotesRecord) -> List[str]:
    """The throughput line of each session a run's notes recorded: the run, then each `--resume`. A session
    still going has none yet (the loop records it when the session ends)."""
    sessions = notes.sessions
    known = {f.name for f in fields(Throughput)}
    lines = []
    for s in sessions if isinstance(sessions, list) else []:
        if not isinstance(s, dict):
            continue
        th = Throughput(**{k: v for k, v in s.items() if k in known})
        lines.append(f"{'resume' if s.get('resumed') else 'run'}: {th.describe(int(s.get('n_gpus') or 0))}")
    return lines

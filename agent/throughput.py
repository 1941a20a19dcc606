"""How a run used the machine: the figures each session of `kernel-agent run` keeps in the run's notes,
and the throughput line they are read back as (after a run, in `show`, `history` and the web view)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional


@dataclass
class Throughput:
    """How the run used the machine (from the placement's task log)."""

    first_benchmark_s: Optional[float] = None  # from the start to the first finished benchmark
    judged: int = 0  # candidates with a final verdict: rejected, benchmarked or promoted
    gpu_busy_fraction: Optional[float] = None  # of the wall time after the first 3 minutes
    stage_s: Dict[str, float] = field(default_factory=dict)  # median seconds per task of each stage
    benchmarks: int = 0  # benchmark children run
    raced_out: int = 0  # of which stopped early at a shape the rule refuses on its own
    wall_s: float = 0.0

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
        return "; ".join(parts)


def session_lines(notes: Any) -> List[str]:
    """The throughput line of each session a run's notes (parsed JSON) recorded: the run, then each
    `--resume`. A session still going has none yet (the loop records it when the session ends)."""
    sessions = notes.get("sessions") if isinstance(notes, dict) else None
    known = {f.name for f in fields(Throughput)}
    lines = []
    for s in sessions if isinstance(sessions, list) else []:
        if not isinstance(s, dict):
            continue
        th = Throughput(**{k: v for k, v in s.items() if k in known})
        lines.append(f"{'resume' if s.get('resumed') else 'run'}: {th.describe(int(s.get('n_gpus') or 0))}")
    return lines

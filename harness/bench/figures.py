"""Judged figures: the one reading of recorded benchmark rows that every surface shows.

The report (its tables and plots), `history --trend`, the leaderboard and `show` all read
benchmark rows through `judged_figures`, so that one kernel at one shape has one set of
numbers everywhere. The conventions:

- A figure compares a candidate with the incumbent and the anchor timed beside it, in the same
  benchmark (the rows the loop stores under the candidate's id, in the same run). It never mixes
  in an incumbent timed elsewhere: after a promotion the incumbent changes, and a time from before
  it is not what a later candidate was judged against.
- The clock: CUDA-graph replay times ('graph') where both the candidate and its incumbent have
  them, else CUDA-event times ('event'), chosen per figure with the promotion rule's own
  `promotion.clock_of`, so a figure is what the rule judged. A slow candidate without graph
  times puts only its own figure on events, not the whole shape.
- Times are rounded to 4 significant figures (`round_ms`), and every ratio is computed from the
  rounded times, so a reader recomputing from the printed numbers gets the printed result.
- speedup = incumbent time / candidate time (above 1 is faster). A percentage is the time
  saved, 1 - candidate / incumbent = 1 - 1 / speedup, computed from the printed speedup: the same
  quantity as `promotion.Decision.gain` and the rule's reasons ("3.5% faster" = 3.5% less time).
- Over the shapes of a bucket, a candidate's speedup is the geometric mean of its per-shape
  speedups, as the rule judges a bucket.

Pure functions over row objects (`ledger.BenchResult` or anything with its fields): no database
here, so the ledger can build on this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .promotion import clock_of

SIGNIFICANT = 4
CLOCK_WORDS = {"graph": "graph", "event": "events"}  # how tables name a clock
CLOCK_PHRASES = {"graph": "CUDA-graph replay times", "event": "CUDA-event times"}
JUDGED_STATUSES = ("benchmarked", "promoted")  # candidates whose benchmark was judged and stands


# -- numbers as printed -------------------------------------------------------------------------


def round_ms(x: float) -> float:
    """A time at the precision it is printed with (4 significant figures)."""
    if not x:
        return x
    return round(x, SIGNIFICANT - 1 - int(math.floor(math.log10(abs(x)))))


def fmt_ms(x: Optional[float]) -> str:
    """A time in ms as printed everywhere: 4 significant figures, trailing zeros kept ('0.05000')."""
    if x is None:
        return ""
    if abs(x) >= 10**SIGNIFICANT:
        return f"{x:.0f}"
    return f"{round_ms(x):#.{SIGNIFICANT}g}".rstrip(".")


def fmt_spread(x: Optional[float]) -> str:
    """A spread in ms: 2 significant figures (it is an uncertainty)."""
    return f"{x:#.2g}".rstrip(".") if x is not None else ""


def fmt_x(speedup: Optional[float]) -> str:
    return f"{speedup:.3f}x" if speedup is not None else ""


def time_saved(speedup: float) -> float:
    """The fraction of time saved (negative: time added) for a speedup, from the speedup as printed."""
    return 1.0 - 1.0 / round(speedup, 3)


def fmt_saved(speedup: Optional[float]) -> str:
    """'3.5% less time' / '2.0% more time' for a speedup, computed from its printed value."""
    if speedup is None:
        return ""
    s = time_saved(speedup)
    return f"{abs(s):.1%} {'less' if s >= 0 else 'more'} time"


def _ratio(num: float, den: float) -> float:
    return round_ms(num) / round_ms(den)


# -- reading one row ------------------------------------------------------------------------------


def _graph_spread(row: Any) -> Optional[float]:
    return (row.extra or {}).get("graph_spread_ms")


def row_graph_timed(row: Any) -> bool:
    """Whether a recorded row has a CUDA-graph replay time to be judged on: the time and its spread
    (`promotion.graph_timed` for a measurement; the ledger does not keep the rounds)."""
    return bool(row.graph_ms) and _graph_spread(row) is not None


def row_clock(rows: Sequence[Any]) -> str:
    """The clock on which recorded rows compared with each other are read (`promotion.clock_of`)."""
    return clock_of(row_graph_timed(r) for r in rows)


def row_ms(row: Any, clock: str) -> float:
    return row.graph_ms if clock == "graph" else row.median_ms


def row_spread(row: Any, clock: str) -> Optional[float]:
    return _graph_spread(row) if clock == "graph" else row.spread_ms


def is_incumbent_label(label: str) -> bool:
    """The labels under which an incumbent is recorded: the baseline, a serving kernel, or a plain
    'incumbent' (a benchmark run outside the loop)."""
    return label in ("baseline", "incumbent") or label.startswith("serving:")


def _role(label: str) -> str:
    return "incumbent" if is_incumbent_label(label) else "anchor" if label.startswith("anchor") else label


@dataclass(frozen=True)
class Reading:
    """One kernel's timing in one benchmark, on both clocks where it has them (ms, unrounded).
    fraction_of_ceiling is as recorded, on event times (`on` converts it)."""

    label: str
    bench_id: int
    event_ms: float
    event_spread_ms: float
    graph_ms: Optional[float]
    graph_spread_ms: Optional[float]
    n_samples: int
    fraction_of_ceiling: Optional[float]
    ceiling_kind: Optional[str]
    implausible: bool

    @classmethod
    def from_row(cls, row: Any) -> "Reading":
        timed = row_graph_timed(row)
        return cls(
            row.label,
            row.id,
            row.median_ms,
            row.spread_ms,
            row.graph_ms if timed else None,
            _graph_spread(row) if timed else None,
            row.n_samples,
            row.fraction_of_ceiling,
            row.ceiling_kind,
            bool(row.implausible),
        )

    @property
    def graph_timed(self) -> bool:
        return self.graph_ms is not None

    def has(self, clock: str) -> bool:
        return clock == "event" or self.graph_timed

    def ms(self, clock: str) -> float:
        """The time on `clock`, rounded as printed."""
        # callers ask for the graph clock only where has("graph")
        return round_ms(self.graph_ms if clock == "graph" else self.event_ms)  # type: ignore[arg-type]

    def spread_ms(self, clock: str) -> Optional[float]:
        s = self.graph_spread_ms if clock == "graph" else self.event_spread_ms
        return round_ms(s) if s is not None else None

    def fraction(self, clock: str) -> Optional[float]:
        """The fraction of the hardware ceiling on `clock`: a rate follows the time it is divided by,
        so the recorded (event-time) fraction is scaled by event time / time on the clock."""
        if not self.fraction_of_ceiling:
            return None
        raw = self.graph_ms if clock == "graph" else self.event_ms
        # callers ask for the graph clock only where has("graph")
        return self.fraction_of_ceiling * self.event_ms / raw  # type: ignore[operator]


@dataclass(frozen=True)
class JudgedFigure:
    """A candidate at one shape against the incumbent (and the anchor) timed beside it.

    clock: 'graph' | 'event', over the candidate and the incumbent (the promotion rule's choice).
    incumbent: None when the benchmark recorded none (then there is no speedup). anchor: the torch
    anchor of the same benchmark, compared on `clock` where it has that clock (`anchor_ratio`)."""

    op: str
    bucket: str
    shape_key: str
    dtype: str
    gpu_name: str
    run_id: Optional[str]
    candidate_id: int
    created_at: Optional[datetime]
    kernel: Reading
    incumbent: Optional[Reading]
    anchor: Optional[Reading]
    clock: str

    @property
    def kernel_ms(self) -> float:
        return self.kernel.ms(self.clock)

    @property
    def kernel_spread_ms(self) -> Optional[float]:
        return self.kernel.spread_ms(self.clock)

    @property
    def incumbent_ms(self) -> Optional[float]:
        return self.incumbent.ms(self.clock) if self.incumbent is not None else None

    @property
    def incumbent_spread_ms(self) -> Optional[float]:
        return self.incumbent.spread_ms(self.clock) if self.incumbent is not None else None

    @property
    def incumbent_label(self) -> Optional[str]:
        return self.incumbent.label if self.incumbent is not None else None

    @property
    def speedup(self) -> Optional[float]:
        """incumbent time / candidate time on `clock`, from the rounded times."""
        if self.incumbent is None:
            return None
        return _ratio(self.incumbent.ms(self.clock), self.kernel.ms(self.clock))

    @property
    def anchor_clock(self) -> Optional[str]:
        """The clock the anchor is shown on: the figure's where the anchor has it, else events."""
        if self.anchor is None:
            return None
        return self.clock if self.anchor.has(self.clock) else "event"

    @property
    def anchor_ms(self) -> Optional[float]:
        # anchor_clock is set whenever there is an anchor
        return self.anchor.ms(self.anchor_clock) if self.anchor is not None else None  # type: ignore[arg-type]

    def anchor_ratio(self, who: Optional[Reading] = None) -> Optional[float]:
        """anchor time / `who`'s time (default the candidate), when both are on the figure's clock:
        above 1, `who` is faster than the anchor."""
        who = who or self.kernel
        if self.anchor is None or self.anchor_clock != self.clock:
            return None
        return _ratio(self.anchor.ms(self.clock), who.ms(self.clock))

    @property
    def anchor_speedup(self) -> Optional[float]:
        """incumbent time / anchor time, when both are on the figure's clock: the anchor's speedup
        over the same incumbent, the bar beside the candidate's in the plots."""
        if self.anchor is None or self.incumbent is None or self.anchor_clock != self.clock:
            return None
        return _ratio(self.incumbent.ms(self.clock), self.anchor.ms(self.clock))

    @property
    def implausible(self) -> bool:
        """A timing of the candidate or its incumbent above a measured ceiling: not a figure to judge by."""
        return self.kernel.implausible or (self.incumbent is not None and self.incumbent.implausible)

    @property
    def beats_incumbent(self) -> bool:
        """Faster than the incumbent as printed (speedup above 1.000x)."""
        return self.speedup is not None and round(self.speedup, 3) > 1.0

    def to_json(self) -> Dict[str, Any]:
        return {
            "op": self.op,
            "bucket": self.bucket,
            "shape_key": self.shape_key,
            "dtype": self.dtype,
            "gpu_name": self.gpu_name,
            "run_id": self.run_id,
            "candidate_id": self.candidate_id,
            "clock": self.clock,
            "kernel_ms": self.kernel_ms,
            "kernel_spread_ms": self.kernel_spread_ms,
            "incumbent": self.incumbent_label,
            "incumbent_ms": self.incumbent_ms,
            "incumbent_spread_ms": self.incumbent_spread_ms,
            "speedup": self.speedup,
            "anchor": self.anchor.label if self.anchor is not None else None,
            "anchor_ms": self.anchor_ms,
            "anchor_clock": self.anchor_clock,
            "vs_anchor": self.anchor_ratio(),
            "fraction_of_ceiling": self.kernel.fraction(self.clock),
            "ceiling_kind": self.kernel.ceiling_kind,
            "implausible": self.implausible,
        }


def judged_figures(rows: Iterable[Any]) -> List[JudgedFigure]:
    """The judged figures of benchmark rows (`ledger.BenchResult`), one per candidate row, in the
    order recorded. A benchmark is the rows stored under one candidate id in one run at one shape
    (its 'candidate' row, the incumbent and the anchor timed beside it); a role (candidate,
    incumbent, anchor) met twice there starts the next benchmark of the same candidate. Rows with no candidate
    id (timed on their own by `bench`) belong to no benchmark of a candidate and give no figure."""
    groups: Dict[tuple, List[List[Any]]] = {}
    for r in sorted(rows, key=lambda r: r.id):
        if r.candidate_id is None:
            continue
        key = (r.run_id, r.candidate_id, r.op, r.bucket, r.shape_key, r.dtype, r.gpu_name)
        benches = groups.setdefault(key, [[]])
        if any(_role(x.label) == _role(r.label) for x in benches[-1]):
            benches.append([])
        benches[-1].append(r)
    out = []
    for benches in groups.values():
        for bench in benches:
            cand = next((r for r in bench if r.label == "candidate"), None)
            if cand is None:
                continue
            inc = next((r for r in bench if is_incumbent_label(r.label)), None)
            anc = next((r for r in bench if r.label.startswith("anchor") and not r.implausible), None)
            kernel = Reading.from_row(cand)
            incumbent = Reading.from_row(inc) if inc is not None else None
            clock = clock_of([kernel.graph_timed] + ([incumbent.graph_timed] if incumbent else []))
            out.append(
                JudgedFigure(
                    cand.op,
                    cand.bucket,
                    cand.shape_key,
                    cand.dtype,
                    cand.gpu_name,
                    cand.run_id,
                    cand.candidate_id,
                    cand.created_at,
                    kernel,
                    incumbent,
                    Reading.from_row(anc) if anc is not None else None,
                    clock,
                )
            )
    out.sort(key=lambda f: f.kernel.bench_id)
    return out


# -- a candidate over its bucket's shapes ----------------------------------------------------------


@dataclass(frozen=True)
class CandidateResult:
    """One benchmark of a candidate over the shapes of its bucket (one figure per shape)."""

    op: str
    bucket: str
    dtype: str
    gpu_name: str
    run_id: Optional[str]
    candidate_id: int
    figures: Tuple[JudgedFigure, ...] = field(default_factory=tuple)

    @property
    def speedup(self) -> Optional[float]:
        """Geometric mean of the per-shape speedups (None when a shape has no incumbent)."""
        sps = [f.speedup for f in self.figures]
        known = [s for s in sps if s is not None]
        if not sps or len(known) < len(sps):
            return None
        return math.exp(sum(math.log(s) for s in known) / len(known))

    @property
    def clocks(self) -> str:
        """The clocks of its figures: 'graph', 'event' or 'graph+event'."""
        seen = list(dict.fromkeys(f.clock for f in self.figures))
        return "+".join(seen)

    @property
    def incumbent_label(self) -> Optional[str]:
        labels = {f.incumbent_label for f in self.figures}
        return labels.pop() if len(labels) == 1 else None

    @property
    def started_at(self) -> Optional[datetime]:
        return min((f.created_at for f in self.figures if f.created_at is not None), default=None)

    @property
    def implausible(self) -> bool:
        return any(f.implausible for f in self.figures)

    def to_json(self) -> Dict[str, Any]:
        return {
            "op": self.op,
            "bucket": self.bucket,
            "dtype": self.dtype,
            "gpu_name": self.gpu_name,
            "run_id": self.run_id,
            "candidate_id": self.candidate_id,
            "speedup": self.speedup,
            "clocks": self.clocks,
            "incumbent": self.incumbent_label,
            "figures": [f.to_json() for f in self.figures],
        }


def candidate_results(figures: Iterable[JudgedFigure]) -> List[CandidateResult]:
    """The figures grouped by benchmark of a candidate (run, candidate, bucket, dtype, GPU), in the
    order recorded. A benchmark stopped early (at a shape slower beyond the noise) has fewer figures."""
    groups: Dict[tuple, List[JudgedFigure]] = {}
    for f in figures:
        groups.setdefault((f.run_id, f.candidate_id, f.op, f.bucket, f.dtype, f.gpu_name), []).append(f)
    return [CandidateResult(k[2], k[3], k[4], k[5], k[0], k[1], tuple(fs)) for k, fs in groups.items()]


def best_per_bucket(results: Iterable[CandidateResult]) -> Dict[tuple, CandidateResult]:
    """Per (op, bucket, dtype, GPU): the result with the highest speedup (implausible ones and those
    without a speedup left out; the earlier one on a tie)."""
    best: Dict[tuple, CandidateResult] = {}
    for r in results:
        if r.implausible or r.speedup is None:
            continue
        key = (r.op, r.bucket, r.dtype, r.gpu_name)
        # only results with a speedup reach best
        if key not in best or r.speedup > best[key].speedup:  # type: ignore[operator]
            best[key] = r
    return best


def best_result(results: Iterable[CandidateResult]) -> Optional[CandidateResult]:
    """The result with the highest speedup among the best per bucket (None when there is none)."""
    best = list(best_per_bucket(results).values())
    # best_per_bucket keeps only results with a speedup
    return max(best, key=lambda r: r.speedup) if best else None  # type: ignore[arg-type, return-value]


# -- the leaderboard ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaderboardEntry:
    """The best figure at one (bucket, shape, dtype, GPU) and the candidate it belongs to."""

    figure: JudgedFigure
    label: Optional[str]
    status: str

    def to_json(self) -> Dict[str, Any]:
        return dict(self.figure.to_json(), label=self.label, status=self.status)


@dataclass(frozen=True)
class Leaderboard:
    """entries: per (bucket, shape, dtype, GPU), the candidate with the highest speedup over the
    incumbent timed beside it, among those that beat it. unbeaten: the shapes where candidates were
    judged and none beat its incumbent ('bucket shape dtype GPU')."""

    op: str
    entries: Tuple[LeaderboardEntry, ...]
    unbeaten: Tuple[str, ...]

    def to_json(self) -> Dict[str, Any]:
        return {"op": self.op, "entries": [e.to_json() for e in self.entries], "unbeaten": list(self.unbeaten)}


def leaderboard(op: str, figures: Iterable[JudgedFigure], labels: Dict[int, Tuple[Optional[str], str]]) -> Leaderboard:
    """The leaderboard from judged figures; `labels`: candidate id -> (label, status)."""
    best: Dict[tuple, JudgedFigure] = {}
    seen: set = set()
    for f in figures:
        if f.implausible:
            continue
        key = (f.bucket, f.shape_key, f.dtype, f.gpu_name)
        seen.add(key)
        # a figure that beats its incumbent has a speedup
        if f.beats_incumbent and (key not in best or f.speedup > best[key].speedup):  # type: ignore[operator]
            best[key] = f
    entries = tuple(LeaderboardEntry(best[k], *labels.get(best[k].candidate_id, (None, ""))) for k in sorted(best))
    return Leaderboard(op, entries, tuple(" ".join(k) for k in sorted(seen - set(best))))


@dataclass(frozen=True)
class TrendPoint:
    """A run's best result for one op (`best_result` over its judged candidates)."""

    run_id: str
    started_at: datetime
    best: CandidateResult

    @property
    def speedup(self) -> float:
        return self.best.speedup  # type: ignore[return-value]  # best_result has a speedup

    def to_json(self) -> Dict[str, Any]:
        return {
            "run": self.run_id,
            "started": self.started_at.isoformat(),
            "speedup": self.speedup,
            "candidate_id": self.best.candidate_id,
            "bucket": self.best.bucket,
            "clocks": self.best.clocks,
            "incumbent": self.best.incumbent_label,
        }


__all__ = [
    "Reading",
    "JudgedFigure",
    "CandidateResult",
    "Leaderboard",
    "LeaderboardEntry",
    "TrendPoint",
    "judged_figures",
    "candidate_results",
    "best_per_bucket",
    "best_result",
    "leaderboard",
    "round_ms",
    "fmt_ms",
    "fmt_spread",
    "fmt_x",
    "fmt_saved",
    "time_saved",
    "row_clock",
    "row_ms",
    "row_spread",
    "row_graph_timed",
    "is_incumbent_label",
    "CLOCK_WORDS",
    "CLOCK_PHRASES",
    "JUDGED_STATUSES",
]

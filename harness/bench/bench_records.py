"""What a benchmark is asked and what it answers, as typed records: the spec the parent hands the benchmark
child (`BenchSpec`, its contenders `BenchKernel`) and the child's document (`BenchOutcome` of `ShapeResult`s of
`Measurement`s). They cross a process as JSON; each is parsed once where it comes in (`from_json`) and passed
typed from there. Free of torch, so that the promotion rule and the parent read them without loading it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .sequential import EarlyStop

INCUMBENT = "incumbent"
CANDIDATE = "candidate"


@dataclass
class Measurement:
    """One contender's figures at one shape (harness/bench/bench.py says how each is taken)."""

    label: str
    median_ms: float  # the position-balanced median of the rounds (balanced_median)
    spread_ms: float  # max(within-run spread, REPRO_FLOOR * median)
    n: int
    rounds: List[float]
    positions: List[int] = field(default_factory=list)  # each round's position in the interleaving order
    within_spread_ms: Optional[float] = None  # half the interquartile range of the round medians
    graph_ms: Optional[float] = None  # CUDA-graph replays' position-balanced median (small kernels)
    graph_spread_ms: Optional[float] = None  # max(half the IQR of the graph rounds, REPRO_FLOOR * graph_ms)
    graph_rounds: List[float] = field(default_factory=list)
    graph_positions: List[int] = field(default_factory=list)
    device_ms: Optional[float] = None  # wall time per call of a synchronized batch
    tflops: Optional[float] = None
    tbps: Optional[float] = None
    fraction_of_ceiling: Optional[float] = None
    ceiling_kind: Optional[str] = None
    implausible: bool = False
    serves: bool = False  # the anchor is a servable implementation: a promotion must beat it too
    note: str = ""
    error: str = ""
    # outputs of timed calls compared with the reference of that call's inputs (evidence for the parent):
    # {"call": k, "ok": bool, "detail": str}, k counting the kernel's timed calls at this shape from 1
    timed_checks: List[Dict[str, Any]] = field(default_factory=list)
    processes: Optional[int] = None  # merged from this many processes (bench.merge_processes); None: one

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["rounds"] = [round(x, 5) for x in self.rounds]
        d["graph_rounds"] = [round(x, 5) for x in self.graph_rounds]
        if self.processes is None:
            del d["processes"]
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Measurement":
        """A measurement document; keys it does not know (a report's added figures) are left out, and the
        figures of one that failed before it was timed read as not a number."""
        known = {f.name for f in fields(cls)}
        optional = {
            "within_spread_ms",
            "graph_ms",
            "graph_spread_ms",
            "device_ms",
            "tflops",
            "tbps",
            "fraction_of_ceiling",
            "ceiling_kind",
            "processes",
        }
        kw = {k: v for k, v in d.items() if k in known and (v is not None or k in optional)}
        kw.setdefault("label", "")
        kw.setdefault("median_ms", math.nan)
        kw.setdefault("spread_ms", math.nan)
        kw.setdefault("n", 0)
        kw.setdefault("rounds", [])
        # the figures the rule computes with, as numbers (TypeError / ValueError for what is not one)
        kw.update(median_ms=float(kw["median_ms"]), spread_ms=float(kw["spread_ms"]), n=int(kw["n"]))
        return cls(**kw)

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note else text


@dataclass
class ShapeResult:
    """Every contender's measurement at one shape of one benchmark."""

    op: str
    shape: str
    bucket: str
    dtype: str
    gpu: str
    measurements: List[Measurement]
    # the candidate's timing stopped by the sequential test (harness/bench/sequential.py): slower than the incumbent
    stopped_early: Optional[EarlyStop] = None

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "op": self.op,
            "shape": self.shape,
            "bucket": self.bucket,
            "dtype": self.dtype,
            "gpu": self.gpu,
            "measurements": [m.to_json() for m in self.measurements],
        }
        if self.stopped_early is not None:
            d["stopped_early"] = self.stopped_early.to_json()
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ShapeResult":
        return cls(
            d.get("op", ""),
            d["shape"],
            d.get("bucket", ""),
            d.get("dtype", ""),
            d.get("gpu", ""),
            [Measurement.from_json(m) for m in d.get("measurements") or []],
            EarlyStop.from_json(d.get("stopped_early")),
        )

    def measurement(self, label: str) -> Optional[Measurement]:
        return next((m for m in self.measurements if m.label == label), None)


@dataclass(frozen=True)
class BenchKernel:
    """A contender of a benchmark: its label, and its file (None: the op's baseline, from the package) with
    the identity of the text it must hold (a JudgedText's hash, sanitizer/canonical.py; '' when not checked)."""

    label: str
    file: Optional[str] = None
    source_hash: str = ""

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"label": self.label, "file": self.file}
        if self.source_hash:
            d["source_hash"] = self.source_hash
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BenchKernel":
        return cls(str(d["label"]), d.get("file"), d.get("source_hash") or "")


@dataclass(frozen=True)
class BenchSpec:
    """What one benchmark child times (harness/bench/bench_worker.py): `kernels` at each of `shapes` (shape keys).
    A run's benchmark names an incumbent and a candidate (`BenchSpec.judging`); `bench` times any list.
    race: stop at a shape on which the rule refuses the candidate alone. references: time the serving
    engines' libraries too. gated and ceilings are the parent's (bench_worker.run_bench_isolated). drawn: the
    keys among `shapes` drawn at random inside the bucket (bench.with_drawn_shape, from `draw_seed`), timed
    after the bucket's points and judged apart from them (promotion.judge_benchmark)."""

    op: str
    shapes: Tuple[str, ...]
    dtype: str
    kernels: Tuple[BenchKernel, ...]
    seed: int = 0
    race: bool = False
    references: bool = False
    gated: bool = False
    ceilings: Optional[Dict[str, Any]] = None
    drawn: Tuple[str, ...] = ()
    draw_seed: Optional[int] = None

    @classmethod
    def judging(
        cls,
        op: str,
        shapes: Sequence[str],
        dtype: str,
        incumbent: BenchKernel,
        candidate: BenchKernel,
        race: bool = False,
    ) -> "BenchSpec":
        """The benchmark of a candidate against a bucket's incumbent (labelled as the rule reads them)."""
        return cls(
            op,
            tuple(shapes),
            dtype,
            (replace(incumbent, label=INCUMBENT), replace(candidate, label=CANDIDATE)),
            race=race,
        )

    def kernel(self, label: str) -> Optional[BenchKernel]:
        return next((k for k in self.kernels if k.label == label), None)

    @property
    def incumbent(self) -> Optional[BenchKernel]:
        return self.kernel(INCUMBENT)

    @property
    def candidate(self) -> Optional[BenchKernel]:
        return self.kernel(CANDIDATE)

    def files(self) -> List[str]:
        return [k.file for k in self.kernels if k.file]

    def with_files(self, files: Dict[str, str]) -> "BenchSpec":
        """The spec with each kernel file replaced by its copy in `files` (file -> copy)."""
        return replace(self, kernels=tuple(replace(k, file=files[k.file]) if k.file else k for k in self.kernels))

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "op": self.op,
            "shapes": list(self.shapes),
            "dtype": self.dtype,
            "kernels": [k.to_json() for k in self.kernels],
            "seed": self.seed,
            "race": self.race,
            "references": self.references,
            "gated": self.gated,
        }
        if self.ceilings:
            d["ceilings"] = self.ceilings
        if self.drawn:
            d["drawn"], d["draw_seed"] = list(self.drawn), self.draw_seed
        return d

    @property
    def points(self) -> Tuple[str, ...]:
        """The bucket's own shapes: `shapes` without the drawn ones."""
        return tuple(s for s in self.shapes if s not in self.drawn)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BenchSpec":
        return cls(
            str(d["op"]),
            tuple(d.get("shapes") or ()),
            str(d.get("dtype") or "bfloat16"),
            tuple(BenchKernel.from_json(k) for k in d.get("kernels") or ()),
            int(d.get("seed") or 0),
            bool(d.get("race")),
            bool(d.get("references")),
            bool(d.get("gated")),
            d.get("ceilings") or None,
            tuple(d.get("drawn") or ()),
            None if d.get("draw_seed") is None else int(d["draw_seed"]),
        )


@dataclass
class BenchOutcome:
    """The benchmark child's document, as the parent reads it: each shape's results, the ceilings, the error
    that ended it ('' none), the seconds of its phases, where a race stopped it, its log and wall time."""

    results: List[ShapeResult] = field(default_factory=list)
    error: str = ""
    ceilings: Optional[Dict[str, Any]] = None
    phases: Dict[str, float] = field(default_factory=dict)
    raced_out: Optional[Dict[str, Any]] = None
    log: str = ""
    wall_s: Optional[float] = None
    sandbox_refused: List[Any] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "BenchOutcome":
        """A document from the benchmark child (or an evaluator standing in for it); what is not of its type is
        left out, as an untrusted child's document may hold anything."""
        results, phases = d.get("results"), d.get("phases")
        results = results if isinstance(results, list) else []
        phases = phases if isinstance(phases, dict) else {}
        try:
            shapes = [ShapeResult.from_json(r) for r in results]
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # not a benchmark's results: no verdict on them
            return cls(error=f"the benchmark's results cannot be read ({type(e).__name__}: {str(e)[:200]})")
        return cls(
            shapes,
            str(d.get("error") or ""),
            d.get("ceilings") if isinstance(d.get("ceilings"), dict) else None,
            {k: float(v) for k, v in phases.items() if isinstance(v, (int, float))},
            d.get("raced_out") or None,
            str(d.get("log") or ""),
            d.get("wall_s"),
            list(d.get("sandbox_refused") or []),
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "results": [r.to_json() for r in self.results],
            "error": self.error or None,
            "ceilings": self.ceilings,
            "phases": self.phases,
            "raced_out": self.raced_out,
            "log": self.log,
            "wall_s": self.wall_s,
            "sandbox_refused": self.sandbox_refused,
        }


__all__ = ["INCUMBENT", "CANDIDATE", "Measurement", "ShapeResult", "BenchKernel", "BenchSpec", "BenchOutcome"]

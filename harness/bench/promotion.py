"""The promotion rule.

A candidate replaces the incumbent for one (op, shape bucket, dtype, GPU) only when
its gain is larger than the measured spread of both timings plus a safety margin.
Why a margin on top of the spread: medians and spreads come from a finite number of
interleaved samples on a machine whose clocks and neighbours drift, so a gain that
merely equals the noise is as likely to be luck as speed, and every promotion costs a
reviewer's time and a risk. Correctness is decided elsewhere (the sanitizer); this
rule refuses anything the sanitizer did not pass, and any timing the benchmark
flagged as implausible (faster than a measured hardware ceiling is a bug, not a win), and a candidate
that does not also win at a shape drawn at random inside the bucket (drawn_refusal).

This module is pure arithmetic: no GPU, no ledger, so it is trivially testable and
the same rule can be replayed over recorded timings.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple

from .bench_records import CANDIDATE, INCUMBENT, BenchOutcome, Measurement

DEFAULT_MARGIN = 0.02
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Timing:
    """A benchmark summary: median time, its spread (both in ms) and the sample count."""

    median_ms: float
    spread_ms: float
    n: int


@dataclass(frozen=True)
class Decision:
    """promote: whether to promote. gain: fraction of the incumbent's time saved (0.12
    = 12% less time; negative when slower). spread: the relative noise the gain was
    held against (a fraction, margin excluded). reason: one sentence with the numbers."""

    promote: bool
    gain: float
    spread: float
    reason: str


def _ms(x: float) -> str:
    """Milliseconds with three significant figures (kernels run from microseconds up)."""
    return f"{x:.3f}" if abs(x) >= 0.1 else f"{x:.3g}"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _faster_or_slower(gain: float, what: str) -> str:
    return f"{_pct(gain)} faster than {what}" if gain >= 0 else f"{_pct(-gain)} slower than {what}"


def _invalid(t: Timing, name: str) -> Optional[str]:
    if not (math.isfinite(t.median_ms) and t.median_ms > 0):
        return f"the {name}'s median time {t.median_ms!r} ms is not a positive number"
    if not (math.isfinite(t.spread_ms) and t.spread_ms >= 0):
        return f"the {name}'s spread {t.spread_ms!r} ms is not a non-negative number"
    return None


def _gate(candidate: Timing, incumbent: Timing, sanitizer_passed: bool, implausible: bool) -> Optional[str]:
    """The reason to refuse before looking at the gain, or None."""
    if not sanitizer_passed:
        return "not promoted: the candidate did not pass the sanitizer"
    if implausible:
        return "not promoted: the timing is implausible (above a measured hardware ceiling), which is a bug, not a win"
    for t, name in ((candidate, "candidate"), (incumbent, "incumbent")):
        if t.n < MIN_SAMPLES:
            return f"not promoted: the {name} has {t.n} timing sample(s), fewer than {MIN_SAMPLES}"
        bad = _invalid(t, name)
        if bad:
            return f"not promoted: {bad}"
    return None


def decide(
    candidate: Timing,
    incumbent: Timing,
    sanitizer_passed: bool,
    implausible: bool = False,
    margin: float = DEFAULT_MARGIN,
) -> Decision:
    """Promote `candidate` over `incumbent` on one shape only if
    gain > (candidate.spread + incumbent.spread) / incumbent.median + margin."""
    refused = _gate(candidate, incumbent, sanitizer_passed, implausible)
    if refused:
        gain = noise = math.nan
        if _invalid(candidate, "candidate") is None and _invalid(incumbent, "incumbent") is None:
            gain = (incumbent.median_ms - candidate.median_ms) / incumbent.median_ms
            noise = (candidate.spread_ms + incumbent.spread_ms) / incumbent.median_ms
        return Decision(False, gain, noise, refused)
    gain = (incumbent.median_ms - candidate.median_ms) / incumbent.median_ms
    noise = (candidate.spread_ms + incumbent.spread_ms) / incumbent.median_ms
    promote = gain > noise + margin
    times = f"({_ms(incumbent.median_ms)} ms -> {_ms(candidate.median_ms)} ms)"
    threshold = f"the noise {_pct(noise)} + margin {_pct(margin)}"
    if promote:
        reason = f"{_faster_or_slower(gain, 'the incumbent')} {times}, above {threshold}"
    else:
        reason = f"not promoted: {_faster_or_slower(gain, 'the incumbent')} {times}, not above {threshold}"
    return Decision(promote, gain, noise, reason)


def refused_at_shape(cand: Timing, inc: Timing, name: str, against: str = "the incumbent") -> Optional[Decision]:
    """The refusal one shape alone decides for the whole bucket (too few samples, invalid times, or
    slower beyond its own noise), or None. A benchmark may stop timing at such a shape: the other
    shapes cannot change the verdict. `against`: what `inc` is, in words."""
    refused = _gate(cand, inc, True, False)
    if refused:
        return Decision(False, math.nan, math.nan, f"{refused} (on {name})")
    gain = (inc.median_ms - cand.median_ms) / inc.median_ms
    noise = (cand.spread_ms + inc.spread_ms) / inc.median_ms
    if gain < -noise:
        return Decision(
            False,
            gain,
            noise,
            f"not promoted: {_pct(-gain)} slower than {against} on {name} "
            f"({_ms(inc.median_ms)} ms -> {_ms(cand.median_ms)} ms), beyond the noise {_pct(noise)}",
        )
    return None


def decide_over_shapes(
    per_shape: Sequence[tuple[Timing, Timing]],
    sanitizer_passed: bool,
    implausible: bool = False,
    margin: float = DEFAULT_MARGIN,
    labels: Optional[Sequence[str]] = None,
    against: str = "the incumbent",
) -> Decision:
    """The rule for a bucket timed on several shapes: each pair is (candidate, reference), the
    reference being what serves the shape now (`against` names it in the reason).

    Refused when any shape is slower beyond its own noise (a bucket-wide win must not
    hide a regression on a shape someone serves), otherwise judged on the geometric
    mean of the time ratios against the mean relative noise plus `margin`. Why the
    geometric mean: shapes take very different absolute times, and a ratio is what a
    user of any one shape gets."""
    if not per_shape:
        return Decision(False, math.nan, math.nan, "not promoted: no shapes were timed")
    if labels is not None and len(labels) != len(per_shape):
        raise ValueError(f"decide_over_shapes: {len(labels)} labels for {len(per_shape)} shapes")
    names = list(labels) if labels is not None else [f"shape {i + 1}" for i in range(len(per_shape))]
    if not sanitizer_passed or implausible:
        return Decision(False, math.nan, math.nan, _gate(*per_shape[0], sanitizer_passed, implausible) or "")
    log_ratios = []
    noises = []
    for name, (cand, inc) in zip(names, per_shape):
        refused = refused_at_shape(cand, inc, name, against)
        if refused:
            return refused
        noise = (cand.spread_ms + inc.spread_ms) / inc.median_ms
        log_ratios.append(math.log(cand.median_ms / inc.median_ms))
        noises.append(noise)
    gain = 1.0 - math.exp(sum(log_ratios) / len(log_ratios))
    noise = sum(noises) / len(noises)
    n = len(per_shape)
    head = f"{_faster_or_slower(gain, against)} (geometric mean over {n} shape{'s' if n != 1 else ''})"
    threshold = f"the mean noise {_pct(noise)} + margin {_pct(margin)}"
    if gain > noise + margin:
        return Decision(True, gain, noise, f"{head}, above {threshold}, and no shape slower beyond its noise")
    return Decision(False, gain, noise, f"not promoted: {head}, not above {threshold}")


def graph_timing(m: Measurement) -> Optional[Timing]:
    """A measurement's CUDA-graph replay figures, where it has replay rounds to judge it on; else None."""
    if m.graph_ms and m.graph_spread_ms is not None and len(m.graph_rounds) >= 3:
        return Timing(m.graph_ms, m.graph_spread_ms, len(m.graph_rounds))
    return None


def drawn_refusal(cand: Timing, ref: Timing, name: str, against: str = "the incumbent") -> Optional[Decision]:
    """The refusal at a shape drawn at random inside the bucket (Op.drawn_in_bucket), or None when the candidate
    wins there: faster than the reference by more than the two timings' noise. Why a win and not only no
    loss: a kernel tuned to the exact benchmark point and no better elsewhere would claim for the whole bucket
    a gain it makes at one shape. Why no margin on top: the bucket's points carry it; here the question is
    only whether the gain is there at all."""
    refused = _gate(cand, ref, True, False)
    if refused:
        return Decision(False, math.nan, math.nan, f"{refused} (on {name}, drawn at random inside the bucket)")
    gain = (ref.median_ms - cand.median_ms) / ref.median_ms
    noise = (cand.spread_ms + ref.spread_ms) / ref.median_ms
    if gain > noise:
        return None
    return Decision(
        False,
        gain,
        noise,
        f"not promoted: at {name}, drawn at random inside the bucket, {_faster_or_slower(gain, against)} "
        f"({_ms(ref.median_ms)} ms -> {_ms(cand.median_ms)} ms), not above the noise {_pct(noise)}: the gain at "
        f"the bucket's benchmark points does not hold inside the bucket",
    )


def graph_timed(m: Measurement) -> bool:
    """Whether a measurement has CUDA-graph replay rounds to judge it on."""
    return graph_timing(m) is not None


def clock_of(graph_timed_flags: Iterable[bool]) -> str:
    """The clock on which kernels compared with each other are read: 'graph' (CUDA-graph replays)
    where every one of them has graph times, else 'event'. The one choice the rule and every figure
    shown of it (harness/bench/figures.py) make."""
    flags = list(graph_timed_flags)
    return "graph" if flags and all(flags) else "event"


def judged_pair(candidate: Measurement, incumbent: Measurement) -> Tuple[Timing, Timing, str]:
    """The figures a promotion is judged on, from two benchmark measurements: (candidate, incumbent, 'graph' |
    'event'). The CUDA-graph replay times where both have graph rounds (small kernels, whose event times
    carry host launch overhead), else the event times."""
    graph_c, graph_i = graph_timing(candidate), graph_timing(incumbent)
    if clock_of((graph_c is not None, graph_i is not None)) == "graph":
        assert graph_c is not None and graph_i is not None  # clock_of: 'graph' only where both have replays
        return graph_c, graph_i, "graph"
    return (
        Timing(candidate.median_ms, candidate.spread_ms, candidate.n),
        Timing(incumbent.median_ms, incumbent.spread_ms, incumbent.n),
        "event",
    )


@dataclass(frozen=True)
class ShapePair:
    """One shape of a benchmark as the rule reads it: the candidate against the reference, the faster of
    the incumbent and a servable torch anchor (Op.torch_impl: the serving set would dispatch to it), on
    one clock. reference: the reference's label ('incumbent' or 'anchor:<name>')."""

    candidate: Timing
    reference: Timing
    clock: str  # 'graph' | 'event'
    reference_label: str


def shape_pair(measurements: Sequence[Measurement]) -> Tuple[Optional[ShapePair], str]:
    """(the pair, '') for one shape's measurements, or (None, why not). A torch anchor counts only where it
    serves (`serves`) and was timed without error: a candidate is promoted only when it beats what a
    serving stack would otherwise run."""
    ms = {m.label: m for m in measurements}
    c, inc = ms.get(CANDIDATE), ms.get(INCUMBENT)
    if c is None or inc is None or c.error or inc.error:
        return None, (c.error if c else "") or (inc.error if inc else "") or "missing measurement"
    for m in (c, inc):
        wrong = timed_call_mismatch(m)
        if wrong:
            return None, f"{m.label}: {wrong}"
    ref, ref_label = inc, INCUMBENT
    torch_m = next((m for m in measurements if m.serves and not m.error), None)
    if torch_m is not None:
        t_inc, t_torch, _ = judged_pair(inc, torch_m)
        if t_torch.median_ms < t_inc.median_ms:
            ref, ref_label = torch_m, torch_m.label
    tc, tr, clock = judged_pair(c, ref)
    return ShapePair(tc, tr, clock, ref_label), ""


def timed_call_mismatch(m: Measurement) -> str:
    """Why a measurement's timed outputs refuse it ('' when none does): the benchmark compares the output of
    a timed call, drawn at random, with the reference of that call's fresh inputs (bench.timed_calls). A
    kernel right on the probe and wrong while timed (a cache over repeated inputs, an output block reused
    between calls) is caught there; so is one wrong only on CUDA-graph replays, whose last replay of each round
    is compared too (a record with "clock": "graph")."""
    for chk in m.timed_checks:
        if isinstance(chk, dict) and not chk.get("ok", False):
            if chk.get("clock") == "graph":
                where = f"the last CUDA-graph replay of round {chk.get('round')}"
            else:
                where = f"timed call {chk.get('call')}"
            return f"output of {where} differs from the reference: {str(chk.get('detail'))[:300]}"
    return ""


def reference_words(labels: Sequence[str]) -> str:
    """What a candidate was held against, in words, from the reference labels of its shapes."""
    torch_labels = sorted({x for x in labels if x != "incumbent"})
    if not torch_labels:
        return "the incumbent"
    name = ", ".join(x.split(":", 1)[-1] for x in torch_labels)
    if len(torch_labels) == len(set(labels)) and "incumbent" not in labels:
        return f"torch ({name})"
    return f"the faster of the incumbent and torch ({name}) per shape"


@dataclass
class Judgement:
    """The rule applied to one benchmark of a candidate over a bucket's shapes, against the reference of
    each shape (see ShapePair). error: why the benchmark cannot be judged ('' when it can; then
    `decision` is set)."""

    error: str = ""
    decision: Optional[Decision] = None
    pairs: List[Tuple[Timing, Timing]] = field(default_factory=list)  # judged (candidate, reference) per shape
    kinds: List[str] = field(default_factory=list)  # 'graph' | 'event' per shape
    shapes: List[str] = field(default_factory=list)
    references: List[str] = field(default_factory=list)  # the reference's label per shape
    fraction_of_ceiling: Optional[float] = None  # the candidate's, mean over the shapes
    # the shapes drawn at random inside the bucket (BenchSpec.drawn) and their judged pairs: held apart from the
    # bucket's points (the times and gain above are the points'), each must be won on its own (drawn_refusal)
    drawn: List[str] = field(default_factory=list)
    drawn_pairs: List[Tuple[Timing, Timing]] = field(default_factory=list)

    @property
    def candidate_ms(self) -> float:
        return sum(c.median_ms for c, _ in self.pairs) / len(self.pairs)

    @property
    def incumbent_ms(self) -> float:
        """The mean time of what the candidate was held against (the incumbent, or torch where it is faster)."""
        return sum(i.median_ms for _, i in self.pairs) / len(self.pairs)

    @property
    def against(self) -> str:
        return reference_words(self.references)


def judge_benchmark(
    outcome: BenchOutcome, shapes: Sequence[str], margin: float = DEFAULT_MARGIN, drawn: Sequence[str] = ()
) -> Judgement:
    """Judge a benchmark (the child's document, read: each shape's measurements labelled 'candidate',
    'incumbent' and the anchor, and its error) over `shapes`, the bucket's shape keys, and `drawn`, the shapes
    drawn at random inside the bucket beside them (BenchSpec.drawn), each of which the candidate must win too
    (drawn_refusal). A failed measurement or a missing shape makes the benchmark unusable, not a refusal on
    timings."""
    j = Judgement()
    fractions = []
    implausible = False
    for res in outcome.results:
        pair, err = shape_pair(res.measurements)
        if pair is None:
            j.error = j.error or f"{res.shape}: {err}"
            continue
        c = res.measurement(CANDIDATE)
        assert c is not None  # shape_pair found it
        implausible = implausible or bool(c.implausible)
        if res.shape in drawn:
            j.drawn.append(res.shape)
            j.drawn_pairs.append((pair.candidate, pair.reference))
            continue
        fractions.append(c.fraction_of_ceiling or 0.0)
        j.pairs.append((pair.candidate, pair.reference))
        j.kinds.append(pair.clock)
        j.shapes.append(res.shape)
        j.references.append(pair.reference_label)
    raced = bool(outcome.raced_out) and bool(j.pairs)  # stopped at a shape slower beyond the noise
    complete = len(j.pairs) == len(shapes) and len(j.drawn) == len(drawn)
    j.error = outcome.error or j.error or ("" if complete or raced else "benchmark incomplete")
    if j.error:
        return j
    j.fraction_of_ceiling = sum(fractions) / len(fractions) if fractions else None
    stop = next((r.stopped_early for r in outcome.results if r.stopped_early is not None), None)
    if stop is not None:  # the sequential test stopped the timing: slower than the incumbent beyond the noise
        j.decision = Decision(False, -stop.slower, math.nan, f"not promoted: {stop.verdict()}")
        return j
    d = decide_over_shapes(
        j.pairs, sanitizer_passed=True, implausible=implausible, margin=margin, labels=j.shapes, against=j.against
    )
    for name, (cand, ref) in zip(j.drawn, j.drawn_pairs):
        if d.promote:
            d = drawn_refusal(cand, ref, name, j.against) or d
    if raced and d.promote:  # cannot happen with the rule as it is: a raced-out shape refuses
        j.error = "the benchmark stopped early at a shape the rule does not refuse"
        return j
    if raced and len(j.pairs) < len(shapes):
        d = dataclasses.replace(
            d, reason=d.reason + f" (timing stopped there: {len(shapes) - len(j.pairs)} shape(s) not timed)"
        )
    if "graph" in j.kinds:
        d = dataclasses.replace(d, reason=d.reason + " (CUDA-graph replay times)")
    j.decision = d
    return j


__all__ = [
    "Timing",
    "refused_at_shape",
    "graph_timing",
    "graph_timed",
    "timed_call_mismatch",
    "Decision",
    "decide",
    "decide_over_shapes",
    "clock_of",
    "judged_pair",
    "ShapePair",
    "shape_pair",
    "reference_words",
    "Judgement",
    "judge_benchmark",
    "drawn_refusal",
    "DEFAULT_MARGIN",
    "MIN_SAMPLES",
]

"""Stopping a benchmark early: the sequential test that ends the timing of a candidate that is slower than
the incumbent beyond the noise, before the rounds, the CUDA-graph replays and the bucket's other shapes are
spent on it.

The test: a group-sequential one-sided paired t-test with a Bonferroni bound. The benchmark times candidate and
incumbent in the same interleaved rounds; each round gives one paired log-ratio d = ln(t_candidate /
t_incumbent), which the round's shared clock and thermal drift cancel out of. After round n (n from FIRST_LOOK
up to the benchmark's round limit R: at most K = R - FIRST_LOOK + 1 looks), the candidate is stopped when

    (mean(d) - ln(1 + MIN_SLOWDOWN)) / (sd(d) / sqrt(n))  >  t_{1 - alpha/K, n - 1}

(Student's t quantile with n - 1 degrees of freedom). Each look alone wrongly stops a candidate whose true
mean log-ratio is at most ln(1 + MIN_SLOWDOWN) with probability at most alpha/K (the t-test is exact for
independent normal round ratios), so over all K looks (union bound) the probability of stopping a candidate
that is truly at least as fast as the incumbent is at most alpha: ALPHA = 1% by default. A candidate stopped
is slower than the incumbent, with that confidence, by more than MIN_SLOWDOWN, the least noise the promotion
rule ever allows a shape (twice bench.REPRO_FLOOR): the rule would refuse it there (promotion.refused_at_shape
refuses a shape slower beyond its noise; a promotion needs a gain above the noise plus a margin).

What the bound assumes: independent round ratios, near normal. Heavy tails (a round hit by a neighbour's
burst) widen sd(d) and make the test stop later, not wrongly; tests/test_sequential.py measures the stopping
rate over simulated streams as noisy as the H200's rounds, with such bursts and position effects
(docs/BENCHMARK.md quotes the figures). Pure arithmetic: no torch, no GPU.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Dict, Optional, Sequence

ALPHA = 0.01
FIRST_LOOK = 3  # with fewer rounds the t quantile at alpha/K is in the hundreds: no look could stop
MIN_SLOWDOWN = 0.01  # twice bench.REPRO_FLOOR: the least relative noise the promotion rule uses at a shape


@dataclass(frozen=True)
class EarlyStop:
    """A candidate stopped by the sequential test: how much slower than the incumbent (the geometric mean of
    its round ratios, minus one: 0.07 = 7% slower), after how many rounds, at which error rate."""

    slower: float
    rounds: int
    alpha: float

    def verdict(self) -> str:
        return (
            f"stopped early: slower than the incumbent by {self.slower * 100:.1f}% "
            f"(sequential test, alpha {self.alpha * 100:g}%, after {self.rounds} rounds)"
        )

    def to_json(self) -> Dict[str, Any]:
        return {"slower": round(self.slower, 5), "rounds": self.rounds, "alpha": self.alpha}

    @classmethod
    def from_json(cls, d: Any) -> Optional["EarlyStop"]:
        """An early stop from a benchmark child's document; None for anything that is not one (the child runs
        candidate code: its document is read as untrusted)."""
        if not isinstance(d, dict):
            return None
        try:
            stop = cls(float(d["slower"]), int(d["rounds"]), float(d["alpha"]))
        except (KeyError, TypeError, ValueError):
            return None
        ok = math.isfinite(stop.slower) and stop.rounds > 0 and 0 < stop.alpha < 1
        return stop if ok else None


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function for an integer number of degrees of freedom, in closed form
    (Abramowitz and Stegun 26.7.3 and 26.7.4: finite sums in the angle atan(t / sqrt(df)))."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 3) // 2 + 1):  # 1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...
            term *= (2 * k) / (2 * k + 1) * c2
            total += term
        inside = (2 / math.pi) * (theta + (s * math.cos(theta) * total if df > 1 else 0.0))
    else:
        term, total = 1.0, 1.0
        for k in range(1, (df - 2) // 2 + 1):  # 1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        inside = s * total
    return 0.5 + math.copysign(inside / 2, t)  # inside = P(|T| < |t|)


@lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for 0.5 < p < 1, by bisection on t_cdf (to 1e-9 relative)."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile wants 0.5 < p < 1, not {p}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def looks(max_rounds: int) -> int:
    """How many looks a benchmark of at most `max_rounds` rounds takes: one after each round from FIRST_LOOK."""
    return max(1, max_rounds - FIRST_LOOK + 1)


def sequential_stop(
    candidate: Sequence[float],
    incumbent: Sequence[float],
    max_rounds: int,
    alpha: float = ALPHA,
    min_slowdown: float = MIN_SLOWDOWN,
) -> Optional[EarlyStop]:
    """The look after the latest round: an EarlyStop when the candidate's round times (`candidate`, paired by
    round with `incumbent`'s) show it slower beyond the noise at the test's error rate (module docstring), else
    None. `max_rounds`: the most rounds the benchmark takes, which fixes the number of looks the error rate is
    shared over; a look past it is refused (it would spend error the bound did not count)."""
    n = min(len(candidate), len(incumbent))
    if n > max_rounds:
        raise ValueError(f"look after round {n} of a benchmark of at most {max_rounds} rounds")
    if n < FIRST_LOOK:
        return None
    d = [math.log(c / i) for c, i in zip(candidate[:n], incumbent[:n])]
    mean = statistics.fmean(d)
    threshold = math.log1p(min_slowdown)
    if mean <= threshold:
        return None
    sd = statistics.stdev(d)
    stat = math.inf if sd == 0 else (mean - threshold) / (sd / math.sqrt(n))
    if stat > t_quantile(1 - alpha / looks(max_rounds), n - 1):
        return EarlyStop(math.expm1(mean), n, alpha)
    return None


__all__ = ["ALPHA", "FIRST_LOOK", "MIN_SLOWDOWN", "EarlyStop", "sequential_stop", "t_cdf", "t_quantile", "looks"]

"""A workload trace replayed into decode steps, and the op calls and shape buckets those steps make
(`kernel-agent workload analyze`, `run --workload`; docs/WORKLOADS.md).

The schedule. Continuous batching as vLLM and SGLang run it, decode only: at every step the requests that
have arrived are admitted first come, first served while the batch has room (`max_batch` sequences) and the
KV cache has the pages for the request's whole sequence (prompt + output, in pages of the model's
page_size, the layout of the serving kernels' paged cache); every running sequence then makes one token;
a sequence that made its last token leaves and frees its pages. Reserving the whole sequence's pages at
admission means no sequence is ever preempted and the cache never holds more than the budget (an engine
that allocates page by page admits a little more and preempts when it guesses wrong). The prompt's
prefill is not a decode step and is left out; the k-th output token is made at context prompt + k.

The clock. A step takes its roofline time (StepModel: harness.workload.model_step.step_op_calls at the step's batch
and mean context, over every layer), so that requests arrive between steps as they did. With
`arrivals=False` every request is waiting from the start: the engine's throughput when it is never idle.

Streaming. The trace is read once, record by record; the schedule keeps only the running sequences and,
per (batch, block-table capacity in pages), a count of steps, their cached tokens and their time: memory
is bounded by max_batch x the longest context in pages, whatever the trace's length.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ... import ops  # the package door: its torch-bound names (dtype_from_name) load on first use
from ...ops import get_op
from .model_step import ModelConfig, ModelConfigError, cache_bytes_per_token, roofline_ms, step_op_calls
from .workload_trace import EngineStep, Request, TraceReader

DEFAULT_MAX_BATCH = 256  # vLLM's default max_num_seqs
DEFAULT_KV_BUDGET = "60GiB"  # a KV-cache budget per GPU that fits an H200 beside an 8B model's weights
PROGRESS_EVERY = 16384  # records between progress callbacks


@dataclass(frozen=True)
class CallLine:
    """One op call of a layer's step at a fixed batch, as a line in the context: its shape, FLOPs and bytes
    at a context of one page, and what each further page adds (step_op_calls at one and at two pages; the
    ops' FLOPs, bytes and shape fields grow in proportion to the context, which tests check)."""

    label: str
    op: str
    dtype: str
    bucket: str  # at one page
    shape: Any  # at one page
    grows: Tuple[Tuple[str, int], ...]  # (shape field, what a page adds): the fields that follow the context
    flops: Tuple[float, float]  # (at one page, per further page)
    bytes: Tuple[float, float]


class StepModel:
    """A model's decode step in one KV mode, per batch: step_op_calls read twice per batch, then any context
    in whole pages from its lines, with no op call. `ms(batch, pages)`: the whole model's step (every layer)
    at that mean context, by the roofline; `calls_at(batch, pages)`: each call's op, bucket (the op's own
    bucket function) and shape at that block-table capacity."""

    def __init__(self, model: ModelConfig, kv: str, dtype: str = "bfloat16"):
        self.model, self.kv, self.dtype = model, kv, dtype
        self._lines: Dict[int, List[CallLine]] = {}
        self.cached: Dict[Tuple[int, int], float] = {}  # (batch, pages) -> ms, as `ms` computed them

    def lines(self, batch: int) -> List[CallLine]:
        got = self._lines.get(batch)
        if got is None:
            page = self.model.page_size
            one = step_op_calls(self.model, batch, page, self.kv, self.dtype)
            two = step_op_calls(self.model, batch, 2 * page, self.kv, self.dtype)
            got = []
            for a, b in zip(one, two):
                grows = tuple(
                    (f.name, getattr(b.shape, f.name) - getattr(a.shape, f.name))
                    for f in dataclasses.fields(a.shape)
                    if getattr(b.shape, f.name) != getattr(a.shape, f.name)
                )
                got.append(
                    CallLine(
                        a.label,
                        a.op,
                        a.dtype,
                        a.bucket,
                        a.shape,
                        grows,
                        (a.flops, b.flops - a.flops),
                        (a.bytes, b.bytes - a.bytes),
                    )
                )
            self._lines[batch] = got
        return got

    def call_ms(self, batch: int, pages: int) -> List[float]:
        """Each call's roofline time (one layer) at a context of `pages` pages."""
        j = pages - 1
        return [roofline_ms(c.flops[0] + c.flops[1] * j, c.bytes[0] + c.bytes[1] * j) for c in self.lines(batch)]

    def ms(self, batch: int, pages: int) -> float:
        v = self.cached.get((batch, pages))
        if v is None:
            v = self.cached[(batch, pages)] = sum(self.call_ms(batch, pages)) * self.model.layers
        return v

    def calls_at(self, batch: int, pages: int) -> List[Tuple[str, str, Any]]:
        """(op, bucket, shape) of each call at a block table of `pages` pages."""
        out = []
        for c in self.lines(batch):
            if c.grows:
                shape = dataclasses.replace(c.shape, **{f: getattr(c.shape, f) + d * (pages - 1) for f, d in c.grows})
                out.append((c.op, get_op(c.op).bucket(shape), shape))
            else:  # the same call at every context (a matmul of the batch)
                out.append((c.op, c.bucket, c.shape))
        return out


@dataclass
class Schedule:
    """What a replay did: totals, and per (batch, block-table capacity in pages) [steps, cached tokens, ms]."""

    kv: str
    page_size: int
    budget_pages: int
    max_batch: int
    source: str = "requests"  # "requests": simulated from them; "steps": the engine's recorded steps replayed
    steps: int = 0
    decode_tokens: int = 0  # tokens made: one per sequence per step
    busy_s: float = 0.0  # the steps' time
    clock_s: float = 0.0  # the last step's end, idle time between arrivals included
    requests: int = 0
    finished: int = 0
    dropped: int = 0  # requests whose whole sequence needs more pages than the budget holds
    peak_pages: int = 0  # most pages reserved at once
    groups: Dict[Tuple[int, int], List[float]] = field(default_factory=dict)

    def add_steps(self, n: int, batch: int, kv_tokens: int, cap_pages: int, ms: float) -> None:
        """`n` steps of `batch` sequences at one block-table capacity, `kv_tokens` cached in all of them, `ms`
        of time in all."""
        g = self.groups.get((batch, cap_pages))
        if g is None:
            self.groups[(batch, cap_pages)] = [n, kv_tokens, ms]
        else:
            g[0] += n
            g[1] += kv_tokens
            g[2] += ms
        self.steps += n
        self.decode_tokens += n * batch
        self.busy_s += ms / 1e3

    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.busy_s if self.busy_s else 0.0


# audit(step, running, schedule) with running {seq: (context now, prompt + output, pages reserved)}: the
# tests' check of the schedule's invariants, step by step
Audit = Callable[[int, Dict[int, Tuple[int, int, int]], "Schedule"], None]


def budget_pages(model: ModelConfig, kv: str, budget_bytes: int) -> int:
    """Pages of the KV cache a budget holds: a page is page_size tokens of every layer's K and V."""
    pages = budget_bytes // (model.page_size * cache_bytes_per_token(model, kv))
    if pages < 1:
        raise ModelConfigError(f"a KV budget of {budget_bytes} bytes holds no page of {model.page_size} tokens in {kv}")
    return int(pages)


# long: one hot loop, its state in locals
def simulate(
    requests: Iterable[Request],
    model: ModelConfig,
    kv: str,
    budget_bytes: int,
    max_batch: int = DEFAULT_MAX_BATCH,
    cost: Optional[StepModel] = None,
    arrivals: bool = True,
    audit: Optional[Audit] = None,
    schedule: Optional[Schedule] = None,
) -> Schedule:
    """The decode schedule of `requests` (in arrival order) under the budget (see the module's docstring).
    A sequence admitted at step g with prompt p has context p + 1 + (s - g) at step s: its `base` is
    p + 1 - g, so the batch's cached tokens are sum(base) + batch * s and its longest context max(base) + s,
    kept without touching each sequence. Steps between two changes (below, and an arrival) are
    counted as one run; with `audit` every step is its own run and is audited."""
    page = model.page_size
    cost = cost or StepModel(model, kv)
    sched = schedule or Schedule(kv, page, budget_pages(model, kv, budget_bytes), max_batch)
    limit = sched.budget_pages
    step_ms = cost.cached  # read first: a replay asks for the same few thousand points again and again
    it = iter(requests)
    head: Optional[Request] = next(it, None)
    ends: List[Tuple[int, int]] = []  # (step it leaves at, seq)
    tops: List[Tuple[int, int]] = []  # (-base, seq): the longest context, lazily cleaned
    live: Dict[int, Tuple[int, int, int]] = {}  # seq -> (base, pages reserved, prompt + output)
    reserved = sum_base = step = seq = steps = made = 0
    clock = busy_ms = 0.0
    groups, peak = sched.groups, sched.peak_pages
    while True:
        while ends and ends[0][0] == step:
            base, pages, _ = live.pop(heapq.heappop(ends)[1])
            reserved -= pages
            sum_base -= base
            sched.finished += 1
        while head is not None and len(live) < max_batch and (not arrivals or head.arrival_s <= clock):
            total = head.prompt_tokens + head.output_tokens
            pages = -(-total // page)
            if pages > limit:  # it could never run: dropped, and said so
                sched.requests += 1
                sched.dropped += 1
                head = next(it, None)
                continue
            if reserved + pages > limit:
                break
            base = head.prompt_tokens + 1 - step
            live[seq] = (base, pages, total)
            heapq.heappush(ends, (step + head.output_tokens, seq))
            heapq.heappush(tops, (-base, seq))
            reserved += pages
            sum_base += base
            seq += 1
            sched.requests += 1
            head = next(it, None)
        if not live:
            if head is None:
                break
            clock = max(clock, head.arrival_s)  # idle until the next request arrives
            continue
        while tops[0][1] not in live:
            heapq.heappop(tops)
        batch = len(live)
        tokens = sum_base + batch * step
        longest = step - tops[0][0]
        if reserved > peak:
            peak = reserved
        mean_pages = -(-tokens // (batch * page))
        cap_pages = -(-longest // page)
        ms = step_ms.get((batch, mean_pages)) or cost.ms(batch, mean_pages)
        if audit is not None:
            audit(step, {s: (b + step, t, p) for s, (b, p, t) in live.items()}, sched)
            n = 1
        else:
            # the run: until the next sequence leaves, the mean context reaches its next page (the step's cost
            # changes) or the longest context does (the block table's capacity changes); contexts grow by one
            # token a step
            n = min(
                ends[0][0] - step, (mean_pages * batch * page - tokens) // batch + 1, cap_pages * page - longest + 1
            )
            if (
                arrivals
                and head is not None
                and batch < max_batch
                and reserved + -(-(head.prompt_tokens + head.output_tokens) // page) <= limit
            ):
                # the next request fits: the run ends at the step whose start is past its arrival
                n = min(n, max(1, math.ceil((head.arrival_s - clock) / (ms / 1e3))))
        g = groups.get((batch, cap_pages))  # Schedule.add_steps, inline: this is the loop's hottest line
        if g is None:
            groups[(batch, cap_pages)] = [n, n * tokens + batch * n * (n - 1) // 2, n * ms]
        else:
            g[0] += n
            g[1] += n * tokens + batch * n * (n - 1) // 2
            g[2] += n * ms
        steps += n
        made += n * batch
        busy_ms += n * ms
        clock += n * ms / 1e3
        step += n
    sched.steps += steps
    sched.decode_tokens += made
    sched.busy_s += busy_ms / 1e3
    sched.peak_pages = peak
    sched.clock_s = clock
    return sched


def replay_steps(
    steps: Iterable[EngineStep],
    model: ModelConfig,
    kv: str,
    budget_bytes: int,
    cost: Optional[StepModel] = None,
    schedule: Optional[Schedule] = None,
) -> Schedule:
    """An engine's recorded decode steps, as they were (the budget is only reported: the engine had its
    own). A step without its longest context is taken at its mean context (a lower bound of the block
    table's capacity: the attention bucket may be one too low)."""
    page = model.page_size
    cost = cost or StepModel(model, kv)
    sched = schedule or Schedule(kv, page, budget_pages(model, kv, budget_bytes), 0, source="steps")
    for st in steps:
        top = st.max_context if st.max_context is not None else -(-st.kv_tokens // st.batch)
        ms = cost.ms(st.batch, -(-st.kv_tokens // (st.batch * page)))
        sched.add_steps(1, st.batch, st.kv_tokens, -(-top // page), ms)
        sched.max_batch = max(sched.max_batch, st.batch)
        sched.clock_s += ms / 1e3
    return sched


def replay_trace(
    path: str,
    model: ModelConfig,
    kv: str,
    budget_bytes: int,
    max_batch: int = DEFAULT_MAX_BATCH,
    arrivals: bool = True,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Schedule:
    """One pass over the trace: its requests simulated (`simulate`), its recorded engine steps replayed
    beside them; the schedule of the requests when there are any, else the engine's. progress(bytes read,
    file size) is called as the file is read."""
    reader = TraceReader(path)
    steps = Schedule(kv, model.page_size, budget_pages(model, kv, budget_bytes), 0, source="steps")
    cost = StepModel(model, kv)

    def requests_only():
        n = 0
        for rec in reader:
            n += 1
            if progress is not None and n % PROGRESS_EVERY == 0:
                progress(reader.bytes_read, reader.size)
            if isinstance(rec, Request):
                yield rec
            else:
                replay_steps((rec,), model, kv, budget_bytes, cost, steps)

    sched = simulate(requests_only(), model, kv, budget_bytes, max_batch, cost, arrivals)
    if progress is not None:
        progress(reader.size, reader.size)
    if sched.requests == 0 and steps.steps == 0:
        raise ValueError(f"{path}: the trace holds no request and no decode step")
    return sched if sched.requests else steps


# -- what the steps call --------------------------------------------------------------------------------


@dataclass
class BucketShare:
    """The op calls of one (op, shape bucket) over a schedule."""

    kv: str
    op: str
    bucket: str
    dtype: str
    calls: int = 0
    ms: float = 0.0  # their time: the roofline's, times measured_ratio when a ledger measured the bucket
    share: float = 0.0  # of the schedule's step time
    shape: Any = None  # the shape of the heaviest (batch, capacity) point that calls it
    shape_ms: float = 0.0
    shapes: int = 0  # distinct shapes
    measured_ratio: Optional[float] = None  # measured / roofline time of its incumbent (a ledger), applied to ms

    def to_json(self) -> Dict[str, Any]:
        return {
            "kv": self.kv,
            "op": self.op,
            "bucket": self.bucket,
            "dtype": self.dtype,
            "calls": self.calls,
            "time_s": round(self.ms / 1e3, 6),
            "share": round(self.share, 6),
            "measured_ratio": None if self.measured_ratio is None else round(self.measured_ratio, 4),
            "shape": self.shape.key() if self.shape is not None else None,
            "shapes": self.shapes,
        }


@dataclass
class WeightedPoint:
    """A (batch, context) point standing for every step whose op calls fall in the same buckets, with
    their share of the time: what `run --workload` targets (agent/loop.py, model_targets)."""

    kv: str
    batch: int
    context: int
    weight: float

    def to_json(self) -> List[Any]:
        return [self.kv, self.batch, self.context, round(self.weight, 6)]


def bucket_shares(
    sched: Schedule, model: ModelConfig, dtype: str = "bfloat16", cost: Optional[StepModel] = None
) -> Tuple[List[BucketShare], List[WeightedPoint]]:
    """Each (op, bucket)'s calls and share of the schedule's time, heaviest first, and the weighted points.
    A group of steps (one batch, one block-table capacity) calls the shapes of that capacity (the
    dispatcher's bucket) and splits its time among them in proportion to their roofline times at the
    group's mean context."""
    cost = cost or StepModel(model, sched.kv, dtype)
    rows: Dict[Tuple[str, str], BucketShare] = {}
    seen_shapes: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    signatures: Dict[Tuple[Tuple[str, str], ...], List[Any]] = {}  # buckets of a step -> [ms, heaviest, its ms]
    total = sum(g[2] for g in sched.groups.values()) or 1.0
    for (batch, cap_pages), (n, tokens, ms) in sched.groups.items():
        calls = cost.calls_at(batch, cap_pages)
        parts = cost.call_ms(batch, max(1, -(-int(tokens) // (int(n) * batch * model.page_size))))
        whole = sum(parts)
        for (op, bucket, shape), part in zip(calls, parts):
            row = rows.setdefault((op, bucket), BucketShare(sched.kv, op, bucket, dtype))
            row.calls += int(n) * model.layers
            row.ms += ms * part / whole
            seen_shapes[(op, bucket)].add(shape)
            if ms * part / whole > row.shape_ms:
                row.shape, row.shape_ms = shape, ms * part / whole
        acc = signatures.setdefault(tuple(sorted({(op, bucket) for op, bucket, _ in calls})), [0.0, None, -1.0])
        acc[0] += ms
        if ms > acc[2]:
            acc[1], acc[2] = (batch, cap_pages * model.page_size), ms
    for key, row in rows.items():
        row.share = row.ms / total
        row.shapes = len(seen_shapes[key])
    points = [WeightedPoint(sched.kv, acc[1][0], acc[1][1], acc[0] / total) for acc in signatures.values()]
    return (sorted(rows.values(), key=lambda r: -r.ms), sorted(points, key=lambda p: -p.weight))


def measured_ratios(
    rows: Iterable[Any], dtype: str = "bfloat16", gpu: Optional[str] = None
) -> Dict[Tuple[str, str], float]:
    """(op, bucket) -> what the bucket's incumbent took over its roofline time, from a ledger's benchmark rows
    (harness.ledger.ledger.BenchResult): the incumbent rows (label 'baseline' or 'serving:<file>') of the bucket's
    latest benchmarked run, each at its graph-replay time where it has one (the clock the promotion rule
    prefers) and else its event time, the median of their ratios. Implausible rows are left out."""
    dt = ops.dtype_from_name(dtype)
    by_bucket: Dict[Tuple[str, str], List[Any]] = collections.defaultdict(list)
    for r in rows:
        if (
            (r.label == "baseline" or r.label.startswith("serving:"))
            and r.dtype == dtype
            and not r.implausible
            and (gpu is None or r.gpu_name == gpu)
        ):
            by_bucket[(r.op, r.bucket)].append(r)
    out = {}
    for (op_name, bucket), rs in by_bucket.items():
        latest = max(rs, key=lambda r: r.id).run_id
        op = get_op(op_name)
        ratios = sorted(
            ((r.graph_ms or r.median_ms) / roofline_ms(op.flops(shape), op.bytes(shape, dt)))
            for r in rs
            if r.run_id == latest
            for shape in [op.parse_shape(r.shape_key)]
        )
        out[(op_name, bucket)] = ratios[len(ratios) // 2]
    return out


def apply_measured(buckets: List[BucketShare], ratios: Dict[Tuple[str, str], float]) -> int:
    """Each bucket with a measured ratio takes its roofline time times the ratio; the shares are recomputed
    over the new total, heaviest first. Returns how many buckets were measured."""
    n = 0
    for b in buckets:
        r = ratios.get((b.op, b.bucket))
        if r is not None:
            b.ms *= r
            b.measured_ratio = r
            n += 1
    total = sum(b.ms for b in buckets) or 1.0
    for b in buckets:
        b.share = b.ms / total
    buckets.sort(key=lambda b: -b.ms)
    return n


def _bin(v: int) -> str:
    """The power-of-two range holding v: 1, 2, 3-4, 5-8, ..."""
    hi = 1 << max(0, math.ceil(math.log2(v)))
    lo = hi // 2 + 1
    return str(hi) if lo >= hi else f"{lo}-{hi}"


def distribution(sched: Schedule, top: int = 20) -> Dict[str, Any]:
    """The (batch, context) points of the steps: a histogram in power-of-two ranges (context: the block
    table's capacity in tokens), each cell's share of the steps and of the time, and the heaviest exact
    points."""
    cells: Dict[Tuple[str, str], List[float]] = {}
    order: Dict[Tuple[str, str], Tuple[int, int]] = {}
    steps = max(sched.steps, 1)
    total = sum(g[2] for g in sched.groups.values()) or 1.0
    for (batch, cap_pages), (n, _, ms) in sched.groups.items():
        ctx = cap_pages * sched.page_size
        key = (_bin(batch), _bin(ctx))
        c = cells.setdefault(key, [0.0, 0.0])
        c[0] += n / steps
        c[1] += ms / total
        order[key] = (1 << max(0, math.ceil(math.log2(batch))), 1 << max(0, math.ceil(math.log2(ctx))))
    hist = [
        {"batch": k[0], "context": k[1], "steps": round(v[0], 6), "time": round(v[1], 6)}
        for k, v in sorted(cells.items(), key=lambda kv: order[kv[0]])
    ]
    heavy = sorted(sched.groups.items(), key=lambda kv: -kv[1][2])[:top]
    points = [
        {
            "batch": b,
            "context": cp * sched.page_size,
            "steps": int(n),
            "mean_context": round(t / (n * b), 1),
            "time": round(ms / total, 6),
        }
        for (b, cp), (n, t, ms) in heavy
    ]
    return {"histogram": hist, "top_points": points}


def schedule_json(sched: Schedule) -> Dict[str, Any]:
    return {
        "source": sched.source,
        "kv": sched.kv,
        "page_size": sched.page_size,
        "budget_pages": sched.budget_pages,
        "max_batch": sched.max_batch,
        "steps": sched.steps,
        "decode_tokens": sched.decode_tokens,
        "busy_s": round(sched.busy_s, 6),
        "clock_s": round(sched.clock_s, 6),
        "tokens_per_s": round(sched.tokens_per_s(), 3),
        "mean_batch": round(sched.decode_tokens / sched.steps, 3) if sched.steps else 0.0,
        "requests": sched.requests,
        "finished": sched.finished,
        "dropped": sched.dropped,
        "peak_pages": sched.peak_pages,
        "groups": len(sched.groups),
    }


@dataclass
class Analysis:
    schedule: Schedule
    buckets: List[BucketShare]
    points: List[WeightedPoint]

    def to_json(self) -> Dict[str, Any]:
        return {
            "schedule": schedule_json(self.schedule),
            "distribution": distribution(self.schedule),
            "buckets": [b.to_json() for b in self.buckets],
            "weighted_points": [p.to_json() for p in self.points],
        }


def analyze(
    path: str,
    model: ModelConfig,
    kv_modes: Sequence[str],
    budget_bytes: int,
    max_batch: int = DEFAULT_MAX_BATCH,
    dtype: str = "bfloat16",
    arrivals: bool = True,
    progress: Optional[Callable[[str, int, int], None]] = None,
    ratios: Optional[Dict[Tuple[str, str], float]] = None,
) -> Dict[str, Analysis]:
    """Per KV mode (each its own pass over the trace: an int8 cache holds more sequences), the schedule, its
    buckets and weighted points. progress(kv, bytes read, file size). ratios (`measured_ratios`): buckets a
    ledger measured take their measured time (the schedule's clock and the weighted points stay the
    roofline's)."""
    out: Dict[str, Analysis] = {}
    for kv in kv_modes:
        sched = replay_trace(
            path,
            model,
            kv,
            budget_bytes,
            max_batch,
            arrivals,
            None if progress is None else functools.partial(progress, kv),
        )
        buckets, points = bucket_shares(sched, model, dtype)
        if ratios:
            apply_measured(buckets, ratios)
        out[kv] = Analysis(sched, buckets, points)
    return out


def workload_points(analyses: Dict[str, Analysis]) -> List[List[Any]]:
    """The weighted points of every KV mode, each mode's weights scaled to 1 / (number of modes): the
    `target_weights` of a run (RunConfig), the form `--target-points` takes with equal weights."""
    n = len(analyses)
    return [[p.kv, p.batch, p.context, p.weight / n] for a in analyses.values() for p in a.points]


__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_KV_BUDGET",
    "CallLine",
    "StepModel",
    "Schedule",
    "budget_pages",
    "simulate",
    "replay_steps",
    "replay_trace",
    "BucketShare",
    "WeightedPoint",
    "bucket_shares",
    "distribution",
    "schedule_json",
    "Analysis",
    "analyze",
    "workload_points",
    "measured_ratios",
    "apply_measured",
]

"""GPU benchmarking: the protocol every timing of kernel-agent follows.

Protocol, per (op, shape, dtype):
  * every kernel is first checked against the reference on the device, and the
    profiler must see at least one of its own Triton kernels run (no silent no-ops);
  * timing uses device events with an L2 flush before each repetition (timed_calls:
    triton.testing.do_bench's protocol, the median), rotating among several input sets (never
    zeros), each given fresh values in place before every timed call (refresher), so that no
    two timed calls see the same inputs: a cache over repeated inputs or a reused output block
    buys nothing; the output of one timed call per kernel in every round, drawn at random, is
    compared with the reference of that call's inputs (Measurement.timed_checks; the parent refuses a
    mismatch: promotion.shape_pair), and so is the output of each graph round's last replay (below);
  * the candidates, the incumbent and the torch anchor are interleaved round by round
    (A B C A B C ..., the order rotating every round) in one process, so clock and
    thermal drift hit all of them alike;
  * rounds continue until every kernel's within-run spread (half the interquartile range
    of its round medians) is under 1% of its median, or the round limit, and at least until every
    kernel has been timed at every position of the order;
  * a kernel's time (`median_ms`, `graph_ms`) is its position-balanced median: the median of its
    rounds at each position of the order, averaged over the positions. Why: a power-hungry kernel
    is timed slower right after itself than right after another kernel, so a plain median lands on
    either mode from one session to the next; averaging over positions gives every kernel of a
    shape the same mix of predecessors;
  * a kernel's spread (`spread_ms`, what the promotion rule compares on) is the within-run
    spread, but never less than REPRO_FLOOR of the median: the round medians of one process share
    its allocations and clocks, and two processes differ by more than one process's rounds show;
  * small kernels (a round under 200 us) are also timed as CUDA-graph replays, as a serving stack
    runs them, in interleaved rounds of their own with a median and spread; for them the
    graph time is the one judged (`promotion.judged_pair`): their event time includes whatever of
    the host's launch overhead the L2 flush does not hide, which another process on the same host
    can inflate severalfold;
  * the spread above says how far another process's rounds would fall; a figure meant for another
    run, another day or another GPU of the same model (bench's "reported" column) also carries
    RUN_TO_RUN_FLOOR (CHOSEN_BY_TIMING_FLOOR for torch.compile, whose kernel configs each process
    picks by timing): clocks under power and thermal limits differ between sessions far more than
    any one run's rounds show. The promotion rule does not use it: candidate and incumbent are
    interleaved in one process, so what moves between sessions moves both alike;
  * the GPU is brought up from its idle clocks before any timing;
  * the device is synchronized around every measurement, and the wall time of a
    synchronized batch of calls is compared with the event time: work hidden on another
    stream or deferred past the events shows up as a gap and marks the result
    implausible, as does a rate above the measured ceilings (by events, and by graph replays
    for the compute ceiling, and the memory one for data too large for L2) and a graph capture
    that finds work forked onto another stream and never joined back.

The measurements behind each of these choices and constants are in results/h200/protocol_evidence.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import secrets
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ...ops import get_op
from ...ops.common import DTYPE_NAMES, Case, Op, ReferenceUnavailable, Shape, dtype_from_name
from ..env import slug, versions
from .bench_records import CANDIDATE, INCUMBENT, BenchSpec, Measurement, ShapeResult
from .promotion import graph_timing
from .sequential import EarlyStop, sequential_stop

REL_SPREAD_TARGET = 0.01
MIN_ROUNDS, MAX_ROUNDS = 3, 8
GRAPH_BELOW_MS = 0.2
PLAUSIBLE_MARGIN = 1.05  # over twice the copy rate: a memory-bound kernel reads and writes at most that
# Over 1.25x the measured matmul rate is implausible. Why so much headroom: clocks vary with power, so a
# kernel can beat a ceiling measured minutes earlier by several percent; the bugs this catches (an
# empty or skipped launch, work hidden from the events) are off by far more.
COMPUTE_PLAUSIBLE = 1.25
REPRO_FLOOR = 0.005  # the least relative spread reported (see the module docstring)
# The least relative spread of a figure reported for another run, by what bounds the kernel: how far
# one kernel moved between sessions on separate machines.
RUN_TO_RUN_FLOOR = {"compute": 0.05, "memory": 0.04}
# Kernels whose code each new process picks by timing, with the least relative spread of their reported
# figure: torch.compile benchmarks near-tied Inductor configs at the first call, so two processes can
# serve the same anchor with configs several percent apart. Inductor's deterministic mode would pin the
# slower one.
CHOSEN_BY_TIMING_FLOOR = {"anchor:torch.compile": 0.07}
GRAPH_ROUNDS = 5
WARM_S = 0.3


class NoGPU(Exception):
    """Benchmarks need a CUDA GPU; the interpreter's times are not GPU times."""


NO_GPU = (
    "benchmarks need a CUDA GPU and none is available here (Triton interpreter times are not GPU times); "
    "run `kernel-agent bench` on a GPU machine"
)


def require_gpu() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        raise NoGPU(NO_GPU)


# -- ceilings ------------------------------------------------------------------------------


@dataclass
class Ceilings:
    gpu: str
    copy_tbps: float  # device-to-device copy, bytes read + written
    bf16_tflops: float  # torch.matmul bf16 on random data, the better of 4096^3 and 8192^3
    measured_at: str
    versions: Dict[str, Any] = field(default_factory=dict)


def ceilings_path(cache_dir: Optional[str] = None) -> str:
    d = cache_dir or os.environ.get(
        "KERNEL_AGENT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "kernel-agent")
    )
    v = versions()
    return os.path.join(d, f"ceilings-v2-{slug(v['gpu'])}-{slug(v['driver'])}.json")  # v2: two matmul sizes


def warm_gpu(seconds: float = WARM_S) -> None:
    """Keep the GPU busy for `seconds` so that timing starts at working clocks, not idle ones."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
    del a


def measure_ceilings() -> Ceilings:
    import triton.testing  # deferred: only a timing needs triton; the loop imports this module to record results

    require_gpu()
    warm_gpu(1.0)
    n = 1 << 30  # 1 GiB each way
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    copy_tbps = 2 * n / ms / 1e9
    del src, dst
    tflops = 0.0
    for n in (4096, 8192):  # the better of two sizes: cuBLAS often runs 4096^3 at a higher rate
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
        tflops = max(tflops, 2 * n**3 / ms / 1e9)
        del a, b
    torch.cuda.empty_cache()
    v = versions()
    return Ceilings(v["gpu"] or "?", round(copy_tbps, 3), round(tflops, 1), time.strftime("%Y-%m-%dT%H:%M:%S"), v)


def load_ceilings(cache_dir: Optional[str] = None, remeasure: bool = False) -> Ceilings:
    """The ceilings of this GPU, measured once and cached per (GPU, driver)."""
    path = ceilings_path(cache_dir)
    if not remeasure and os.path.exists(path):
        with open(path) as f:
            return Ceilings(**json.load(f))
    c = measure_ceilings()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # benchmark children on other GPUs may read it meanwhile
    with open(tmp, "w") as f:
        json.dump(asdict(c), f, indent=1)
    os.replace(tmp, path)
    return c


# -- kernels under test ------------------------------------------------------------------


@dataclass
class Contender:
    label: str  # 'baseline', 'incumbent', 'candidate:<name>', 'anchor:<name>'
    fn: Callable  # called with the case's arguments
    kernel_names: Sequence[str] = ()  # Triton kernels that must be seen running ('' for anchors)
    is_anchor: bool = False
    serves: bool = False  # an anchor that is also a servable implementation of the contract (Op.torch_impl)


def anchor_for(op: Op, case: Case) -> Contender:
    """The torch anchor of each op: its torch implementation (cuBLAS, SDPA, torch.compile), which the
    serving set may also serve, or else what the op names as its benchmark anchor (Op.bench_anchor: for
    the paged decodes, SDPA over the cache gathered ahead of time)."""
    impl = op.torch_impl()
    if impl is not None:
        return Contender(op.torch_label, lambda **kw: impl(**kw), is_anchor=True, serves=True)
    anchor = op.bench_anchor(case)
    if anchor is None:
        raise ValueError(f"{op.name} has no torch anchor")
    return Contender(anchor.label, anchor.fn, is_anchor=True)


# -- measurement -----------------------------------------------------------------------------


def _iqr_half(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return float("inf")
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / 2


def balanced_median(rounds: Sequence[float], positions: Sequence[int] = ()) -> float:
    """The median of the rounds at each position of the interleaving order, averaged over the
    positions (the module docstring says why); the plain median when positions are not known."""
    if not positions:
        return statistics.median(rounds)
    if len(positions) != len(rounds):
        raise ValueError(f"{len(rounds)} rounds but {len(positions)} positions")
    by_position: Dict[int, List[float]] = {}
    for x, p in zip(rounds, positions):
        by_position.setdefault(p, []).append(x)
    return statistics.fmean(statistics.median(xs) for xs in by_position.values())


def _rotation(items: Sequence[Any], r: int) -> List[Tuple[int, Any]]:
    """Round r's order of the interleaved items, each with its position: the order rotates by one
    every round, so over len(items) rounds every item is timed once at every position."""
    k = len(items)
    return [(pos, items[(pos + r) % k]) for pos in range(k)]


def restore_positions(res: Dict[str, Any]) -> Dict[str, Any]:
    """A shape's result (ShapeResult JSON) recorded before rounds carried their positions, with the
    positions the rotation gave them (the timed kernels are the measurements with rounds, in order) and
    its times re-estimated position-balanced; measurements that have positions are left alone."""
    timed = [m for m in res["measurements"] if m.get("rounds")]
    for rounds_key, positions_key, ms_key in (
        ("rounds", "positions", "median_ms"),
        ("graph_rounds", "graph_positions", "graph_ms"),
    ):
        live = [m for m in timed if m.get(rounds_key)]
        for i, m in enumerate(live):
            if m.get(positions_key):
                continue
            m[positions_key] = [
                next(p for p, x in _rotation(range(len(live)), r) if x == i) for r in range(len(m[rounds_key]))
            ]
            m[ms_key] = balanced_median(m[rounds_key], m[positions_key])
    return res


def _spread(rounds: Sequence[float], median: float, between: float = 0.0) -> float:
    """A kernel's spread: half the interquartile range of its rounds, at least `between` (half the range
    of several processes' medians), never under REPRO_FLOOR of the median."""
    return max(_iqr_half(rounds), between, REPRO_FLOOR * median)


def _beyond_ceilings(
    ms: float, flops: float, nbytes: float, ceilings: Ceilings, l2_flushed: bool = True, l2_bytes: int = 0
) -> bool:
    """Faster than the measured ceilings allow: over COMPUTE_PLAUSIBLE times the matmul rate, or over twice
    the copy rate (a memory-bound kernel may read at more than the copy rate, as a copy also writes). A
    time without an L2 flush (a graph replay) is held to the memory bound only for data too large for L2."""
    if flops / ms / 1e9 > ceilings.bf16_tflops * COMPUTE_PLAUSIBLE:
        return True
    return (l2_flushed or nbytes > 2 * l2_bytes) and nbytes / ms / 1e9 > 2 * ceilings.copy_tbps * PLAUSIBLE_MARGIN


def sdpa_backend(kernel_names: Sequence[str]) -> str:
    """Which of torch's SDPA backends ran, from the CUDA kernels one call launched: cuDNN, FlashAttention,
    memory-efficient (CUTLASS), or the math fallback (plain matmuls and softmax)."""
    names = " ".join(kernel_names).lower()
    if "cudnn" in names:
        return "cuDNN"
    if "flash" in names:
        return "flash"
    if "fmha" in names or "efficient" in names or "mem_eff" in names:
        return "memory-efficient"
    return "math" if names else "unknown (no kernel seen)"


def refresher(case: Case, seed: int) -> Callable[..., None]:
    """A function that gives the case's inputs fresh values in place before a timed call, with the spread each
    had (integer codes get fresh codes; block tables and lengths are kept, so the case stays valid): no two
    timed calls see the same inputs, so a cache over repeated inputs, or over a reused output block, answers
    nothing or answers wrong. `refresh(graph=True)` draws from the default generator, which CUDA graph
    capture supports."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(seed))
    floats = []
    for v in case.args.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            finite = v[torch.isfinite(v)].float()
            floats.append((v, float(finite.std()) if finite.numel() > 1 else 1.0))
    codes = [v for v in case.args.values() if isinstance(v, torch.Tensor) and v.dtype == torch.int8]

    def refresh(graph: bool = False) -> None:
        g = None if graph else gen
        for v, std in floats:
            v.normal_(0.0, std or 1.0, generator=g)
        for v in codes:
            v.random_(-127, 128, generator=g)

    return refresh


def timed_calls(
    fn: Callable[[], Any],
    refresh: Callable[[], None],
    warmup_ms: float = 10,
    rep_ms: float = 30,
    check_at: Optional[float] = None,
    check: Optional[Callable[[Any], None]] = None,
) -> float:
    """triton.testing.do_bench's protocol (an estimate, warm-up, then each repetition timed alone by device
    events after an L2 flush; the median), with fresh inputs before every call (`refresh`, outside the
    events and before the flush, so the values it writes are not left in L2), and `check(output)` called on
    the output of one timed call (`check_at`: where, as a fraction of the repetitions).

    What it costs in fidelity: the refresh writes every input between two timed calls, which a serving stack
    does too (new tokens); the flush that follows evicts them, as before. The checked call stalls the host for
    the reference, after that call's end event: the next call starts from an idle GPU, one repetition of
    many, and the median absorbs it."""
    from triton import runtime  # deferred: as in measure_ceilings

    driver = runtime.driver.active
    cache = driver.get_empty_cache_for_benchmark()
    clear = getattr(driver, "clear_cache", None) or (lambda buf: buf.zero_())
    refresh()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        clear(cache)
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-4)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    n = max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    at = None if check is None or check_at is None else min(n - 1, int(check_at * n))
    for i in range(n):
        refresh()
        clear(cache)
        starts[i].record()
        out = fn()
        ends[i].record()
        if i == at:
            torch.cuda.synchronize()
            check(out)  # type: ignore[misc]
        del out
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def checked_output(op: Op, case: Case, out: Any, where: Dict[str, Any]) -> Dict[str, Any]:
    """The record of one timed output compared with the reference of the inputs it was computed from (`case`'s
    arguments as they are now): `where` (which call: {"call": k}, or {"clock": "graph", "round": r}) with
    "ok" and "detail". The parent reads these records (promotion.timed_call_mismatch), never a verdict."""
    cmp = op.compare(out, case.args, op.reference(case.args, torch.float32))
    return dict(where, ok=cmp.ok, detail=cmp.describe()[:300])


def kernels_seen(fn: Callable, kwargs: Dict[str, Any]) -> List[str]:
    """Names of the CUDA kernels one call runs (profiler), after a warm-up call."""
    from torch.profiler import ProfilerActivity, profile  # deferred: the profiler loads only for this diagnosis

    fn(**kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(**kwargs)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def prepare_shape(op: Op, shape: Shape, dtype: torch.dtype, contenders: Sequence[Contender], seed: int = 0) -> None:
    """Compile every contender (and the anchor, torch.compile's included) on one shape by calling each
    once: the part of a benchmark that needs the GPU but times nothing, so it may share the GPU with
    correctness checks while the timing waits for the GPU alone. Failures are left for the timing to
    report, which calls every contender again before it times anything."""
    require_gpu()
    probe = op.make_case(shape, dtype, seed=seed, device="cuda")
    try:
        every = list(contenders) + [anchor_for(op, probe)]
    except ValueError:
        every = list(contenders)
    for c in every:
        try:
            c.fn(**probe.args)
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - benchmark_shape reports it, with the same call
            pass
    del probe
    torch.cuda.empty_cache()


def _reference_contenders(op: Op, probe, results: Dict[str, Measurement]) -> List[Contender]:
    """The op's reference anchors as contenders; one that cannot run here is a row with its one-line reason."""
    try:
        return [Contender(a.label, a.fn, is_anchor=True) for a in op.reference_anchors(probe)]
    except ReferenceUnavailable as e:
        label = f"anchor:{str(e).split(':')[0]}"
        results[label] = Measurement(label, math.nan, math.nan, 0, [], error=str(e))
        return []


def benchmark_shape(
    op: Op,
    shape: Shape,
    dtype: torch.dtype,
    contenders: Sequence[Contender],
    ceilings: Ceilings,
    n_sets: Optional[int] = None,
    seed: int = 0,
    check: bool = True,
    log: Optional[Callable[[str], None]] = None,
    references: bool = False,
    stop_early: bool = False,
) -> ShapeResult:
    """Time every contender on one shape (see the module docstring for the protocol). references: also time
    the op's reference anchors (Op.reference_anchors: what serving engines run), after the torch anchor.
    stop_early: stop timing as soon as the contender labelled 'candidate' is slower than the one labelled
    'incumbent' beyond the noise (interleaved_rounds); the result then carries its `stopped_early`.

    In order: input sets, a first checked call of each contender (`_first_calls`), interleaved event-timed
    rounds (`_timed_rounds`), each survivor's figures and synchronized wall time (`_measurement`), CUDA-graph
    replays of the small ones (`_graph_rounds`)."""
    require_gpu()
    log = log or (lambda s: None)
    probe = op.make_case(shape, dtype, seed=seed, device="cuda")
    nbytes = sum(v.numel() * v.element_size() for v in probe.args.values() if isinstance(v, torch.Tensor))
    n_sets = n_sets or (2 if nbytes > (1 << 30) else 3)
    cases = [probe] + [op.make_case(shape, dtype, seed=seed + i, device="cuda") for i in range(1, n_sets)]
    results: Dict[str, Measurement] = {}
    all_c = _all_contenders(op, probe, contenders, references, results)
    live, notes = _first_calls(op, probe, all_c, check, results, log)
    timed = _timed_rounds(op, cases, live, seed, check, stop_early)
    if timed.stop is not None:
        log(f"  {CANDIDATE}: {timed.stop.verdict()}")
    flops = op.flops(shape)
    nbytes_min = op.bytes(shape, dtype)
    for c in live:
        results[c.label] = _measurement(op, shape, c, timed, cases, flops, nbytes_min, ceilings, notes.get(c.label))
    l2_bytes = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or 0
    _graph_rounds(  # none for a candidate stopped early: the rule refuses it on its event rounds
        [c for c in live if is_small(results[c.label])] if timed.stop is None else [],
        cases[0].args,
        results,
        lambda ms: _beyond_ceilings(ms, flops, nbytes_min, ceilings, l2_flushed=False, l2_bytes=l2_bytes),
        refresh=timed.refreshers[0],
        check=(lambda out, where: checked_output(op, cases[0], out, where)) if check else None,
    )
    ordered = [results[c.label] for c in all_c if c.label in results] + (
        [results["anchor"]] if "anchor" in results else []
    )
    del cases, probe
    torch.cuda.empty_cache()
    return ShapeResult(
        op.name, shape.key(), op.bucket(shape), DTYPE_NAMES[dtype], ceilings.gpu, ordered, stopped_early=timed.stop
    )


def _all_contenders(
    op: Op, probe: Case, contenders: Sequence[Contender], references: bool, results: Dict[str, Measurement]
) -> List[Contender]:
    """The contenders, the op's torch anchor after them and, with `references`, its reference anchors; an anchor
    that cannot be built for these inputs is a measurement with its error in `results`."""
    try:
        all_c = list(contenders) + [anchor_for(op, probe)]
    except ValueError as e:  # e.g. ragged sequence lengths: SDPA over a gathered cache needs one length
        all_c = list(contenders)
        results["anchor"] = Measurement("anchor", math.nan, math.nan, 0, [], error=f"no anchor: {e}")
    if references:
        all_c += _reference_contenders(op, probe, results)
    return all_c


def _first_calls(
    op: Op,
    probe: Case,
    all_c: Sequence[Contender],
    check: bool,
    results: Dict[str, Measurement],
    log: Callable[[str], None],
) -> Tuple[List[Contender], Dict[str, str]]:
    """(the contenders that are timed, a note per label): each is called once on the probe and, with `check`,
    compared with the reference; its Triton kernels must be what ran. A contender that fails is a measurement
    with its error in `results` and is not timed."""
    ref = op.reference(probe.args, torch.float32) if check else None
    live: List[Contender] = []
    notes: Dict[str, str] = {}
    for c in all_c:
        try:
            out = c.fn(**probe.args)
            torch.cuda.synchronize()
            if check and not c.is_anchor:
                cmp = op.compare(out, probe.args, ref)
                if not cmp.ok:
                    raise RuntimeError(f"wrong result on the device: {cmp.describe()}")
            if c.label.startswith("anchor:sdpa"):  # say which backend the anchor really is
                notes[c.label] = f"SDPA backend: {sdpa_backend(kernels_seen(c.fn, probe.args))}"
            if c.kernel_names:
                seen = kernels_seen(c.fn, probe.args)
                if not any(any(k in s for k in c.kernel_names) for s in seen):
                    raise RuntimeError(
                        f"none of its Triton kernels ({', '.join(c.kernel_names)}) ran; the profiler saw {seen[:4]}"
                    )
            live.append(c)
        except Exception as e:  # noqa: BLE001 - a contender that fails is reported, the others are timed
            results[c.label] = Measurement(c.label, math.nan, math.nan, 0, [], error=str(e).splitlines()[0][:300])
            log(f"  {c.label}: {results[c.label].error}")
    return live, notes


@dataclass
class _Timed:
    """What the interleaved rounds left, per label: the round times, their positions in each round, the checked
    calls; the input sets' refreshers (the graph replays use the first) and the early stop, if any."""

    rounds: Dict[str, List[float]]
    positions: Dict[str, List[int]]
    checks: Dict[str, List[Dict[str, Any]]]
    refreshers: List[Callable[..., None]]
    stop: Optional[EarlyStop]


def _timed_rounds(
    op: Op, cases: Sequence[Case], live: Sequence[Contender], seed: int, check: bool, stop_early: bool
) -> _Timed:
    """The event-timed rounds of the live contenders, interleaved (interleaved_rounds), each call on the next
    input set, refreshed between calls."""
    rounds: Dict[str, List[float]] = {c.label: [] for c in live}
    positions: Dict[str, List[int]] = {c.label: [] for c in live}
    counters = {c.label: 0 for c in live}
    refreshers = [refresher(case, seed * 7919 + 104729 + i) for i, case in enumerate(cases)]
    checks: Dict[str, List[Dict[str, Any]]] = {c.label: [] for c in live}
    # one timed call of every round is checked, at a drawn place: a kernel that answers right only while it
    # may be checked (the first rounds, the first calls) cannot know which call, nor stop being checked
    rng = random.Random(seed * 31 + 7)

    def runner(c: Contender):
        def call():
            return c.fn(**cases[counters[c.label] % len(cases)].args)

        def refresh():
            counters[c.label] += 1
            refreshers[counters[c.label] % len(cases)]()

        def check(out):
            checks[c.label].append(
                checked_output(op, cases[counters[c.label] % len(cases)], out, {"call": counters[c.label]})
            )

        return call, refresh, check

    by_label = {c.label: c for c in live}

    def time_round(label: str) -> float:
        c = by_label[label]
        call, refresh, verify = runner(c)
        checked = check and not c.is_anchor
        return timed_calls(
            call, refresh, warmup_ms=10, rep_ms=30, check_at=rng.random(), check=verify if checked else None
        )

    warm_gpu()
    stop = interleaved_rounds(list(by_label), time_round, rounds, positions, stop_early=stop_early)
    return _Timed(rounds, positions, checks, refreshers, stop)


def _measurement(
    op: Op,
    shape: Shape,
    c: Contender,
    timed: _Timed,
    cases: Sequence[Case],
    flops: float,
    nbytes_min: float,
    ceilings: Ceilings,
    note: Optional[str],
) -> Measurement:
    """A timed contender's figures: the balanced median of its rounds and their spread, its fraction of the
    measured ceilings, and its synchronized wall time per call against the event time (work hidden outside the
    timed stream)."""
    xs = timed.rounds[c.label]
    med = balanced_median(xs, timed.positions[c.label])
    bound = op.bound(shape)
    m = Measurement(
        c.label,
        med,
        _spread(xs, med),
        len(xs),
        xs,
        positions=timed.positions[c.label],
        within_spread_ms=_iqr_half(xs),
        serves=c.serves,
        timed_checks=timed.checks[c.label],
    )
    m.tflops = flops / med / 1e9
    m.tbps = nbytes_min / med / 1e9
    m.ceiling_kind = bound
    m.fraction_of_ceiling = (m.tflops / ceilings.bf16_tflops) if bound == "compute" else (m.tbps / ceilings.copy_tbps)
    if _beyond_ceilings(med, flops, nbytes_min, ceilings):
        m.implausible = True
        m.add_note("faster than the measured ceilings allow")
    # hidden work: wall time of a synchronized batch against the event time
    torch.cuda.synchronize()
    reps = max(3, min(50, int(20.0 / max(med, 1e-3))))
    t0 = time.perf_counter()
    for i in range(reps):
        c.fn(**cases[i % len(cases)].args)
    torch.cuda.synchronize()
    m.device_ms = (time.perf_counter() - t0) * 1e3 / reps
    if m.device_ms > 2.0 * med + 0.1:
        m.add_note(
            f"synchronized wall time {m.device_ms:.3f} ms per call is far above the event time: work "
            f"outside the timed stream or host-bound"
        )
        if not c.is_anchor and m.device_ms > 5.0 * med + 0.2:
            m.implausible = True
    if note is not None:
        m.add_note(note)
    return m


def interleaved_rounds(
    labels: Sequence[str],
    time_round: Callable[[str], float],
    rounds: Dict[str, List[float]],
    positions: Dict[str, List[int]],
    stop_early: bool = False,
) -> Optional[EarlyStop]:
    """Time the kernels named by `labels` in interleaved rounds (`time_round(label)`: one round of one kernel,
    in ms), appending each round's time and position to `rounds` and `positions`, until every kernel's spread
    is under REL_SPREAD_TARGET (and every kernel was timed at every position) or the round limit. With
    `stop_early`, a sequential test after each round (harness/bench/sequential.py) stops the timing as soon as the
    candidate is slower than the incumbent beyond the noise, and its EarlyStop is returned (else None)."""
    n_rounds = max(MAX_ROUNDS, len(labels))
    for r in range(n_rounds):
        for pos, label in _rotation(labels, r):
            rounds[label].append(time_round(label))
            positions[label].append(pos)
        stop = _early_stop(rounds, n_rounds) if stop_early else None
        if stop is not None:
            return stop
        if r + 1 >= max(MIN_ROUNDS, len(labels)) and all(
            _iqr_half(v) <= REL_SPREAD_TARGET * statistics.median(v) for v in rounds.values()
        ):
            break
    return None


def _early_stop(rounds: Dict[str, List[float]], n_rounds: int) -> Optional[EarlyStop]:
    """The sequential test on the candidate's rounds against the incumbent's, where both were timed and neither is
    small: a small kernel is judged on CUDA-graph replays (promotion.judged_pair), and its event rounds carry host
    launch overhead that would stop a candidate the replays find as fast."""
    cand, inc = rounds.get(CANDIDATE), rounds.get(INCUMBENT)
    if not cand or not inc or min(cand) < GRAPH_BELOW_MS or min(inc) < GRAPH_BELOW_MS:
        return None
    return sequential_stop(cand, inc, n_rounds)


def is_small(m: Measurement) -> bool:
    """Whether a kernel is small enough to be timed as CUDA-graph replays too: its fastest event round is
    under GRAPH_BELOW_MS. Not its median: the event rounds of a small kernel can carry the host's launch
    overhead, which a busy host inflates for some rounds, and a median lifted over the line by those
    rounds would leave the kernel judged on exactly the times the graph replays are there to avoid."""
    return bool(m.rounds) and min(m.rounds) < GRAPH_BELOW_MS


UNJOINED_NOTE = (
    "work forked onto another stream is not joined back to the caller's stream (graph capture: "
    "unjoined work), so events on the caller's stream cannot time it"
)


def _graph_failed(m: Measurement, c: Contender, e: Exception) -> None:
    """A graph capture that fails leaves the kernel to event timing, except when it failed because the
    call forks work onto another stream and never joins it back: the events on the caller's stream then
    time only the fork, and the kernel is marked implausible (an anchor only gets the note)."""
    text = str(e)
    if "njoined" in text or "StreamCaptureUnjoined" in text:
        m.add_note(UNJOINED_NOTE)
        m.implausible = m.implausible or not c.is_anchor
    else:
        m.add_note(f"CUDA graph timing failed: {text[:120]}")


def _graph_rounds(
    small: Sequence[Contender],
    kwargs: Dict[str, Any],
    results: Dict[str, Measurement],
    too_fast: Callable[[float], bool] = lambda ms: False,
    refresh: Optional[Callable[..., None]] = None,
    check: Optional[Callable[[Any, Dict[str, Any]], Dict[str, Any]]] = None,
) -> None:
    """CUDA-graph replay times of the small kernels, interleaved round by round like the event rounds.
    A replay time faster than the ceilings allow (`too_fast`) marks the kernel implausible, as an
    event time does: work launched outside the captured streams is missing from the graph.

    With `refresh`, each replayed call gets fresh inputs (captured in the graph: a replay of identical inputs
    would let a cache answer), and the kernel's time is the graph of refresh + call minus the graph of the
    refresh alone, timed in the same round. What it costs in fidelity: the difference of two medians is
    noisier than one median (the spread shows it), and the call reads inputs the refresh just wrote, partly
    from L2, as graph replays (which flush nothing) always did.

    With `check(output, where)`, the output of the last call of each round's last replay is compared with the
    reference of the inputs that call read (`kwargs` as the replay left them) and the record joins the
    kernel's timed_checks (anchors are not checked): a kernel that does the work in eager calls and skips it
    on replays (state kept on the device across a graph's many calls) is refused as one wrong in a timed
    eager call is."""
    live = []
    for c in small:
        try:
            _warm_for_capture(c.fn, kwargs)
            live.append(c)
        except Exception as e:  # noqa: BLE001 - reported on the measurement
            _graph_failed(results[c.label], c, e)
    failed = set()
    for r in range(GRAPH_ROUNDS):
        for pos, c in _rotation(live, r):
            m = results[c.label]
            if c.label in failed:
                continue
            try:
                ms, out = _graph_round(c.fn, kwargs, refresh)
                m.graph_rounds.append(ms)
                m.graph_positions.append(pos)
                if check is not None and not c.is_anchor:
                    m.timed_checks.append(check(out, {"clock": "graph", "round": r + 1}))
                del out
            except Exception as e:  # noqa: BLE001 - e.g. a host sync inside the kernel wrapper
                _graph_failed(m, c, e)
                failed.add(c.label)
                m.graph_rounds, m.graph_positions = [], []
    for c in live:
        m = results[c.label]
        if m.graph_rounds:
            m.graph_ms = balanced_median(m.graph_rounds, m.graph_positions)
            m.graph_spread_ms = _spread(m.graph_rounds, m.graph_ms)
            if too_fast(m.graph_ms) and not c.is_anchor:
                m.implausible = True
                m.add_note("graph replay faster than the measured ceilings allow")


def _warm_for_capture(fn: Callable[..., Any], kwargs: Dict[str, Any]) -> None:
    """Call `fn` a few times on a side stream, as graph capture requires (compiles, allocator warm-up)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(**kwargs)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def _graph_round(
    fn: Callable[..., Any], kwargs: Dict[str, Any], refresh: Optional[Callable[..., None]]
) -> Tuple[float, Any]:
    """One round of graph replays of `fn(**kwargs)` (with `refresh(graph=True)` before each call when given):
    (ms per call, the output of the last call of the last replay). Why that output is the last replay's:
    triton.testing.do_bench_cudagraph calls `fn` eagerly, then captures its calls, then replays the graph; the
    tensor the last captured call returned is kept alive here, so its memory (in the graph's pool) holds what
    the last call of the last replay wrote, and `kwargs` hold the inputs the last refresh wrote for it."""
    import triton.testing  # deferred: as in measure_ceilings

    last: List[Any] = [None]

    def step():
        if refresh is not None:
            refresh(graph=True)
        last[0] = fn(**kwargs)

    # the refresh alone first: the graph of both then leaves the inputs as the output's call read them
    alone = 0.0
    if refresh is not None:
        alone = triton.testing.do_bench_cudagraph(lambda: refresh(graph=True), rep=20, return_mode="median")
    both = triton.testing.do_bench_cudagraph(step, rep=20, return_mode="median")
    torch.cuda.synchronize()
    return max(both - alone, 1e-4), last[0]


def reported_time(m: Measurement, timing: Optional[str] = None) -> Tuple[float, float, str]:
    """One kernel's figure as a benchmark reports it for another run to check: (ms, spread ms, 'graph' |
    'event'). The time judged (CUDA-graph replays for small kernels, as in `promotion.judged_pair`;
    timing='event' asks for the event time) and its spread, never less than RUN_TO_RUN_FLOOR of it
    (CHOSEN_BY_TIMING_FLOOR for a kernel that each process picks by timing)."""
    graph = graph_timing(m) if timing != "event" else None
    if graph is not None:
        ms, spread, kind = graph.median_ms, graph.spread_ms, "graph"
    else:
        ms, spread, kind = m.median_ms, m.spread_ms, "event"
    floor = max(
        RUN_TO_RUN_FLOOR.get(m.ceiling_kind or "compute", RUN_TO_RUN_FLOOR["compute"]),
        CHOSEN_BY_TIMING_FLOOR.get(m.label, 0.0),
    )
    return ms, max(spread, floor * ms), kind


def with_reported_times(res: ShapeResult) -> Dict[str, Any]:
    """A shape's result as a report shows it (ShapeResult JSON), each good measurement with its reported
    figure added: reported_ms, reported_spread_ms, reported_timing."""
    doc = res.to_json()
    for m, d in zip(res.measurements, doc["measurements"]):
        if not m.error:
            d["reported_ms"], d["reported_spread_ms"], d["reported_timing"] = reported_time(m)
    return doc


def merge_processes(runs: Sequence[ShapeResult]) -> ShapeResult:
    """One shape's results timed by several processes, merged into one: the position-balanced median of all
    their rounds, and a spread that is the largest of the pooled within-run spread, half the range of the
    processes' medians, and the floor. Why: each process has its own allocations and meets the GPU at its
    own clocks, and two processes differ by more than one process's rounds do; `bench --processes 2`
    reports a spread that includes that."""
    if len(runs) == 1:
        return runs[0]
    by_label: Dict[str, List[Measurement]] = {}
    for r in runs:
        for m in r.measurements:
            by_label.setdefault(m.label, []).append(m)
    merged = []
    for label, ms in by_label.items():
        good = [m for m in ms if not m.error]
        if len(good) < len(ms):  # a kernel that failed in any process failed
            merged.append(next(m for m in ms if m.error))
            continue
        rounds, positions, med, spread = _pooled(good, "rounds", "positions", "median_ms")
        scale = good[0].median_ms / med  # rates follow the time
        m = dataclasses.replace(
            good[0],
            median_ms=med,
            rounds=rounds,
            positions=positions,
            n=len(rounds),
            within_spread_ms=_iqr_half(rounds),
            spread_ms=spread,
            implausible=any(g.implausible for g in good),
            note="; ".join(dict.fromkeys(g.note for g in good if g.note)),
            processes=len(good),
            **{
                k: getattr(good[0], k) * scale
                for k in ("tflops", "tbps", "fraction_of_ceiling")
                if getattr(good[0], k) is not None
            },
        )
        if all(g.graph_rounds for g in good):
            grounds, gpositions, gmed, gspread = _pooled(good, "graph_rounds", "graph_positions", "graph_ms")
            m = dataclasses.replace(
                m, graph_rounds=grounds, graph_positions=gpositions, graph_ms=gmed, graph_spread_ms=gspread
            )
        else:
            m = dataclasses.replace(m, graph_rounds=[], graph_positions=[], graph_ms=None, graph_spread_ms=None)
        merged.append(m)
    return dataclasses.replace(runs[0], measurements=merged)


def _pooled(
    measurements: Sequence[Measurement], rounds_key: str, positions_key: str, ms_key: str
) -> Tuple[List[float], List[int], float, float]:
    """One kernel's rounds (event or graph) from several processes, pooled: (rounds, positions, their
    position-balanced median, a spread of at least half the range of the processes' own times). The
    positions are left out (plain median) unless every process recorded them."""
    rounds = [x for g in measurements for x in getattr(g, rounds_key)]
    positions = (
        [p for g in measurements for p in getattr(g, positions_key)]
        if all(len(getattr(g, positions_key)) == len(getattr(g, rounds_key)) for g in measurements)
        else []
    )
    med = balanced_median(rounds, positions)
    times = [getattr(g, ms_key) for g in measurements]
    return rounds, positions, med, _spread(rounds, med, between=(max(times) - min(times)) / 2)


def with_drawn_shape(spec: BenchSpec, seed: Optional[int] = None) -> BenchSpec:
    """A promotion's benchmark (`spec`, a bucket's points) with one shape drawn at random inside the bucket
    (Op.drawn_in_bucket) timed after them, and the seed it was drawn from (a fresh secret one unless given:
    a candidate cannot know the shape in advance; recorded in the spec and the ledger to reproduce it). The
    spec as it was where the bucket leaves no shape to draw."""
    seed = secrets.randbelow(1 << 31) if seed is None else seed
    op = get_op(spec.op)
    points = spec.points  # a spec drawn for before is drawn for again, around its points
    shape = op.drawn_in_bucket([op.parse_shape(k) for k in points], random.Random(seed), dtype_from_name(spec.dtype))
    if shape is None:
        return dataclasses.replace(spec, shapes=points, drawn=(), draw_seed=None)
    key = shape.key()
    return dataclasses.replace(spec, shapes=points + (key,), drawn=(key,), draw_seed=seed)


def record_shape_result(
    ledger,
    run_id: Optional[str],
    res: ShapeResult,
    candidate_id: Optional[int] = None,
    incumbent_label: str = "incumbent",
    incumbent_hash: Optional[str] = None,
    drawn_seed: Optional[int] = None,
) -> None:
    """Store one shape's measurements in the ledger, every row of it under the candidate id (the incumbent
    and the anchor timed beside it too: the label says which), the 'incumbent' row under `incumbent_label`,
    with the source hash of the incumbent where given (what the candidate was judged against, for its
    diff); failed measurements not at all. `drawn_seed`: the shape was drawn at random inside the bucket from
    this seed (with_drawn_shape), recorded with every row as extra "drawn_in_bucket_seed"."""
    for m in res.measurements:
        if m.error:
            continue
        extra = {
            k: getattr(m, k) for k in ("tflops", "tbps", "device_ms", "note", "within_spread_ms", "graph_spread_ms")
        }
        if m.label == "incumbent" and incumbent_hash:
            extra["incumbent_hash"] = incumbent_hash
        if drawn_seed is not None:
            extra["drawn_in_bucket_seed"] = drawn_seed
        ledger.record_bench(
            run_id=run_id,
            candidate_id=candidate_id,
            label=incumbent_label if m.label == "incumbent" else m.label,
            op=res.op,
            shape_key=res.shape,
            bucket=res.bucket,
            dtype=res.dtype,
            gpu_name=res.gpu,
            median_ms=m.median_ms,
            spread_ms=m.spread_ms,
            n_samples=m.n,
            graph_ms=m.graph_ms,
            fraction_of_ceiling=m.fraction_of_ceiling,
            ceiling_kind=m.ceiling_kind,
            implausible=bool(m.implausible),
            extra=extra,
        )


def resolve_shapes(op: Op, spec: str) -> List[Shape]:
    """'serving' | 'tiny' | 'near_serving' | explicit shapes 'a,b,c;d,e,f' (the op's fields in order)."""
    if spec in ("serving", "tiny", "near_serving"):
        return op.shapes(spec)
    return [op.parse_shape(s) for s in spec.split(";") if s.strip()]

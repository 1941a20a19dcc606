"""The serving guard: a promoted kernel serves a shape class only after one call of that class was verified.

The sanitizer samples a domain without end; a kernel that is wrong, slow, greedy or destructive only on
shapes it never drew passes it. The guard is the last line of defence, at the point of use. For a
"kernel" resolution (harness/serving/serving.py's Dispatcher) the first call of each *shape class*:

  - is answered by the trusted implementation (the op's baseline kernel), in this process;
  - is checked in the background: the promoted kernel is imported, compiled and run once on a copy of that
    call's inputs in the sanitizer's sandboxed executor (sanitizer/executor.py: the static gate again, the
    sandbox, an address-space limit, a cap on GPU memory, a wall-clock limit with a hard kill), which sends
    back its outputs and its copies of the inputs as the call left them;
  - passes when this process finds the outputs within the op's own check (`Op.compare`, the sanitizer's
    contract check against the float64 reference), every input's storage byte for byte what was sent, and
    the kernel's time within `slow_factor` times the trusted implementation's.

A class that passes is served by the kernel in this process from then on (a dict lookup per call). A class
that fails is retired (the trusted implementation serves it in this process from then on) and a
`FieldFailure` (harness/field_failures.py) goes to the sink: by default the ledger's
`record_field_failure`, or a JSON line (`default_sink`).

The shape class is the call's exact metadata: per argument in signature order, a tensor's dtype, shape,
stride, storage offset, device type and whether its address is 16-byte aligned, and a scalar's type and
value; plus the bucket, dtype, GPU and the kernel's hash. The static gate lets a candidate's host code read
nothing of a tensor but this metadata (no values, no addresses, no state across calls), and Triton
specialises a launch on the same things (argument values, 16-byte alignment, constexprs computed by the
host code from them), so every branch the host code takes, every grid, every constexpr and every compiled
variant is a function of the class key: one verified call stands for every call of its class as far as
the host code decides. What the key does not fix is what the kernel body does with tensor *values* (a
sequence length, a page id): the sanitizer's checks own that; the check of a class also runs the kernel at
the class's corners (`Op.class_corners`: a paged decode's sequence filling its whole table over the pool's
last pages), in the same child, so that a kernel wrong only on values the first call never held is retired
at that call; and the sampled re-checks (`recheck_rate`) are the guard's net for the rest.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ...ops import DTYPE_NAMES, get_op
from ...ops.common import Shape
from ..field_failures import FailureKind, FieldFailure
from ..manifest import ManifestEntry

ENV_GUARD = "KERNEL_AGENT_SERVING_GUARD"
ENV_LEDGER = "KERNEL_AGENT_LEDGER"
ENV_FIELD_FAILURES = "KERNEL_AGENT_FIELD_FAILURES"
DEFAULT_LEDGER = os.path.join("runs", "ledger.db")
FIELD_FAILURES_FILE = "field_failures.jsonl"

# a class's states
VERIFIED = "verified"
CHECKING = "checking"
RETIRED = "retired"

# which path served a call (Guard.counts)
SERVED_KERNEL = "kernel"  # a verified class: the promoted kernel, in this process
SERVED_CHECKING = "trusted, checking"  # the class's check is in flight: the trusted output
SERVED_RETIRED = "trusted, retired"  # the class failed its check
SERVED_CAPTURING = "trusted, capturing"  # an unverified class met while a CUDA graph is being captured

Sink = Callable[[FieldFailure], None]


def guard_wanted(on: Optional[bool]) -> bool:
    """Whether the guard is on: the argument when given, else on unless KERNEL_AGENT_SERVING_GUARD=off."""
    if on is not None:
        return bool(on)
    return os.environ.get(ENV_GUARD, "on").strip().lower() not in ("off", "0", "false", "no")


@dataclass(frozen=True)
class GuardConfig:
    """The guard's limits. `time_limit_s`: the child's wall clock, startup and compile included;
    `memory_gib`: its address space (not applied on a GPU, where CUDA reserves huge ranges);
    `gpu_memory_gib`: a cap on its GPU allocations (None: 4 x the call's input bytes + 2 GiB);
    `slow_factor`, `slow_slack_s`: on a GPU the kernel fails when its warm call takes longer than slow_factor x
    the trusted call + slow_slack_s (`too_slow`); `recheck_rate`: the fraction of a verified class's calls
    checked again (never while a CUDA graph is captured); `asynchronous`: checks run in background threads
    (else the first call of a class waits for its check, and still returns the trusted output); `max_checks`:
    checks in flight at once (each holds a copy of its call's inputs; a class met while that many are in
    flight is served by the trusted implementation and claimed by a later call)."""

    time_limit_s: float = 120.0
    memory_gib: float = 8.0
    gpu_memory_gib: Optional[float] = None
    slow_factor: float = 10.0
    slow_slack_s: float = 0.005
    recheck_rate: float = 0.0
    asynchronous: bool = True
    max_checks: int = 2


# --------------------------------------------------------------------------------------
# the shape class


_ABSENT = object()  # an optional argument the call left out


def class_key(bound: Mapping[str, Any], names: Sequence[str]) -> tuple:
    """The shape class of a call's arguments (`bound`: by name; `names`: the op's parameters in signature order,
    so that a call by position and one by keyword meet the same class): see the module. Built on every call
    of a guarded kernel, so it holds torch's own hashable objects (dtype, Size, device), converted to text
    only when a class is first met (`class_text`)."""
    key: list[tuple] = []
    storages: list[int] = []  # each tensor argument's storage, in order: which arguments share one is the class's
    for name in names:
        v = bound.get(name, _ABSENT)
        if isinstance(v, torch.Tensor):
            base = v.untyped_storage().data_ptr()
            shares = storages.index(base) if base in storages else -1
            storages.append(base)
            key.append(
                (name, v.dtype, v.shape, v.stride(), v.storage_offset(), v.device, v.data_ptr() % 16 == 0, shares)
            )
        elif v is not _ABSENT:  # a scalar by its text: a NaN is then equal to itself, a list hashable
            key.append((name, type(v), repr(v)))
    return tuple(key)


def class_text(key: tuple) -> str:
    """The class key as stable text: `x:float16[4,2,16]/[32,16,1]+0@cpu,a16; sm_scale=0.125`."""
    parts = []
    for name, *k in key:
        if len(k) == 7:
            dtype, shape, stride, offset, device, aligned, shares = k
            dims = ",".join(map(str, shape))
            strides = ",".join(map(str, stride))
            dname = DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
            where = f"{device.type},{'a16' if aligned else 'unaligned'}"
            with_ = f" (the storage of tensor argument {shares})" if shares >= 0 else ""
            parts.append(f"{name}:{dname}[{dims}]/[{strides}]+{offset}@{where}{with_}")
        else:
            parts.append(f"{name}={k[1]}")
    return "; ".join(parts)


def _metadata(bound: Mapping[str, Any]) -> tuple[tuple, tuple, tuple]:
    """(shapes, strides, dtypes) of the call's tensor arguments, in signature order."""
    tensors = [v for v in bound.values() if isinstance(v, torch.Tensor)]
    return (
        tuple(tuple(int(s) for s in t.shape) for t in tensors),
        tuple(tuple(int(s) for s in t.stride()) for t in tensors),
        tuple(DTYPE_NAMES.get(t.dtype, str(t.dtype)) for t in tensors),
    )


# --------------------------------------------------------------------------------------
# copies of the inputs, and their checksums


def snapshot(bound: Mapping[str, Any]) -> dict[str, Any]:
    """CPU copies of a call's tensor arguments, each with its whole storage and its view (shape, stride,
    offset), so that the child sees exactly the layout the kernel would have seen; a storage several arguments
    share (vLLM's `kv[0]` and `kv[1]`, slices of one fused QKV) is copied once and shared by their copies, as
    the wire keeps it (sanitizer/wire.py). Other values as they are."""
    from ...sanitizer.wire import storage_key  # deferred: the wire module is the sanitizer's

    copies: dict[tuple, Any] = {}
    out = {}
    for name, v in bound.items():
        if not isinstance(v, torch.Tensor):
            out[name] = v
            continue
        storage = v.untyped_storage()
        key = storage_key(v)
        if key not in copies:
            copy = storage.cpu() if storage.device.type != "cpu" else storage.clone()
            if copy.data_ptr() == storage.data_ptr():  # `.cpu()` of a CPU storage is itself
                copy = storage.clone()
            copies[key] = copy
        out[name] = torch.empty(0, dtype=v.dtype).set_(
            copies[key], v.storage_offset(), tuple(v.shape), tuple(v.stride())
        )
    return out


def storage_digest(t: torch.Tensor) -> str:
    """A hash of a tensor's whole storage: the bytes around a strided view count too."""
    from ...sanitizer.wire import digest  # deferred: the wire module is the sanitizer's

    return digest(t)


# --------------------------------------------------------------------------------------
# sinks


def default_sink(serving_dir: Path) -> Sink:
    """The sink a dispatcher uses unless given one: the ledger named by KERNEL_AGENT_LEDGER (else
    runs/ledger.db where it exists), through `Ledger.record_field_failure`; where there is no such ledger or
    it cannot record field failures, one JSON line per failure appended to KERNEL_AGENT_FIELD_FAILURES, else to
    `field_failures.jsonl` beside the serving folder. A serving process never creates a ledger."""

    def sink(ff: FieldFailure) -> None:
        location = os.environ.get(ENV_LEDGER) or (DEFAULT_LEDGER if os.path.exists(DEFAULT_LEDGER) else None)
        if location and _record_in_ledger(location, ff):
            return
        path = Path(os.environ.get(ENV_FIELD_FAILURES) or Path(serving_dir).parent / FIELD_FAILURES_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(ff.to_json(), sort_keys=True) + "\n")

    return sink


def _record_in_ledger(location: str, ff: FieldFailure) -> bool:
    """Record `ff` in the ledger at `location`; False where that ledger cannot (it cannot be opened or written,
    or has no record_field_failure): the failure then goes to the JSON-lines file, never lost."""
    from ..ledger.ledger import Ledger  # deferred: serving imports no database code until a failure is recorded

    try:
        ledger = Ledger(location)
    except Exception as e:  # noqa: BLE001 - a ledger that cannot be opened: the file takes the failure
        warnings.warn(f"serving guard: ledger {location} cannot be opened ({e}); written to a file", stacklevel=3)
        return False
    try:
        record = getattr(ledger, "record_field_failure", None)
        if record is None:
            return False
        record(ff)
        return True
    except Exception as e:  # noqa: BLE001 - as above
        warnings.warn(f"serving guard: ledger {location} did not take it ({e}); written to a file", stacklevel=3)
        return False
    finally:
        ledger.close()


# --------------------------------------------------------------------------------------
# one check


@dataclass
class CheckOutcome:
    """What one check found: `kind` None when the kernel passed."""

    kind: Optional[FailureKind]
    detail: str
    child_s: float = 0.0  # the check's wall time: the child's start, import, compile and run, and the comparison
    kernel_s: float = 0.0  # the kernel call's own time in the child
    trusted_s: float = 0.0


class _GuardCase:
    """What Executor.call reads of a case: the arguments by name."""

    def __init__(self, args: dict[str, Any]):
        self.args = args


def _memory_kind(text: str) -> FailureKind:
    low = text.lower()
    if "out of memory" in low or "can't allocate memory" in low or "outofmemory" in low or "cannot allocate" in low:
        return FailureKind.OUT_OF_MEMORY
    return FailureKind.CRASH


def _child_env(device: torch.device) -> dict[str, str]:
    """The GPU the child may see: the call's own (by its index as this process sees it)."""
    if device.type != "cuda":
        return {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in visible.split(",")] if visible else []
    return {"CUDA_VISIBLE_DEVICES": ids[index] if index < len(ids) else str(index)}


def _gpu_cap(config: GuardConfig, inputs: Mapping[str, Any]) -> Optional[float]:
    if config.gpu_memory_gib is not None:
        return config.gpu_memory_gib
    nbytes = sum(v.untyped_storage().nbytes() for v in inputs.values() if isinstance(v, torch.Tensor))
    return 4 * nbytes / (1 << 30) + 2.0


def run_in_child(
    path: Path,
    op: str,
    inputs: dict[str, Any],
    device: torch.device,
    config: GuardConfig,
    corners: Sequence[dict[str, Any]] = (),
) -> tuple[Optional[Any], Optional[CheckOutcome]]:
    """Run the kernel file once on `inputs` (CPU copies) in a sandboxed executor on `device` (on the CPU, in
    the interpreter). Returns (its RunResult, None), or (None, the failure) when it could not run. Each of
    `corners` (inputs of the same class) runs after, in the same child, its RunResult in `res.corners`."""
    from ...sanitizer.executor import Executor, ExecutorError  # deferred: serving's read side stays light

    on_gpu = device.type == "cuda"
    try:
        ex = Executor(
            str(path),
            op,
            "cuda" if on_gpu else "cpu",
            deadline=time.time() + config.time_limit_s,
            env_extra=_child_env(device),
            memory_gib=config.memory_gib,
            gpu_memory_gib=_gpu_cap(config, inputs) if on_gpu else None,
        )
    except Exception as e:  # noqa: BLE001 - a text the gate refuses, a child that cannot start
        return None, CheckOutcome(FailureKind.CRASH, f"the kernel's child could not start: {e}"[:300])
    try:
        hello = ex.start()
        if hello.get("load_error"):
            return None, CheckOutcome(FailureKind.CRASH, f"the kernel did not load: {hello['load_error']}"[:300])
        case = _GuardCase(inputs)
        res = ex.call(case, bounds=False, return_inputs=True)
        if not res.error:  # the first call compiled (or was first interpreted): time a warm one, on fresh copies
            warm = ex.call(_GuardCase(snapshot(inputs)), bounds=False)
            res.elapsed_s = warm.elapsed_s if not warm.error else res.elapsed_s
        res.corners = [] if res.error else [ex.call(_GuardCase(c), bounds=False, return_inputs=True) for c in corners]
        return res, None
    except ExecutorError as e:
        if e.timed_out:
            return None, CheckOutcome(FailureKind.TIMEOUT, f"no answer within {config.time_limit_s:g} s")
        return None, CheckOutcome(_memory_kind(str(e)), str(e)[:300])
    finally:
        ex.close()


def judge_run(
    op: str,
    res: Any,
    sent: Mapping[str, Any],
    digests: Mapping[str, str],
    device: torch.device,
    trusted_out: Any = None,
) -> Optional[CheckOutcome]:
    """The trusted verdict on the child's evidence: an error, a changed input, a wrong output (None: it passed).
    `sent`: the inputs as sent (CPU copies); `digests`: their storages' hashes, taken before sending;
    `trusted_out`: the trusted implementation's output on them, the error budget's measure (None: no budget)."""
    if res.error or res.guard or res.bounds:  # (bounds: what the interpreter refuses on every run, on the CPU)
        text = res.error or (f"host code: {res.guard[0]}" if res.guard else res.bounds[0])
        return CheckOutcome(_memory_kind(text), text[:300])
    changed = [
        k for k, d in digests.items() if k not in res.returned_inputs or storage_digest(res.returned_inputs[k]) != d
    ]
    if changed or res.mutated:
        names = ", ".join(dict.fromkeys(changed + list(res.mutated)))
        return CheckOutcome(FailureKind.INPUT_CHANGED, f"the kernel changed its input(s) {names}")
    problem = _compare(op, res.out, sent, device, trusted_out)
    return CheckOutcome(FailureKind.MISMATCH, problem[:300]) if problem else None


def _compare(op: str, out: Any, sent: Mapping[str, Any], device: torch.device, trusted_out: Any = None) -> str:
    """What is wrong with `out` ('' when nothing): the op's own check on the call's device (where the tolerance's
    model of rounding is the device's; on the CPU when the device has no room for the float64 reference), then
    the error budget the sanitizer's checks apply, against the trusted output on the same inputs: the contract's
    tolerance grows with a matmul's K, and an output 10% off passes it at K = 16384."""
    if device.type == "cuda":
        try:
            return _judge_output(op, _to(out, device), {k: _to(v, device) for k, v in sent.items()}, trusted_out)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    return _judge_output(op, out, dict(sent), trusted_out)


def _judge_output(op: str, out: Any, args: dict[str, Any], trusted_out: Any) -> str:
    spec = get_op(op)
    ref64 = spec.reference(args, torch.float64)
    cmp = spec.compare(out, args, ref64)
    if not cmp.ok:
        return cmp.describe()
    if trusted_out is None or spec.exact_check:
        return ""
    b = spec.error_budget(out, trusted_out, ref64, spec.output_dtype(args))
    if not b.ok:
        return (
            f"error {b.error:.3g} exceeds the budget {b.allowed:.3g} "
            f"(2x the trusted implementation's {b.trusted_error:.3g})"
        )
    return ""


def _to(v: Any, device: torch.device) -> Any:
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (tuple, list)):
        return type(v)(_to(x, device) for x in v)
    return v


def too_slow(kernel_s: float, trusted_s: float, config: GuardConfig) -> Optional[CheckOutcome]:
    """The TOO_SLOW failure when the kernel's warm call took longer than slow_factor x the trusted call plus
    the slack, else None. Applied on a GPU only: on the CPU the child interprets the kernel under
    instrumentation the serving process does not have, so the two times say nothing of the kernel's speed."""
    if kernel_s <= config.slow_factor * trusted_s + config.slow_slack_s:
        return None
    return CheckOutcome(
        FailureKind.TOO_SLOW,
        f"{kernel_s * 1e3:.3g} ms against the trusted {trusted_s * 1e3:.3g} ms "
        f"(limit {config.slow_factor:g}x + {config.slow_slack_s * 1e3:g} ms)",
    )


def check_call(
    path: Path,
    op: str,
    sent: dict[str, Any],
    device: torch.device,
    trusted_s: float,
    config: GuardConfig,
    trusted_out: Any = None,
) -> CheckOutcome:
    """One check of a kernel file on one call's inputs (CPU copies in `sent`): run it in the child, then judge
    its evidence here. `trusted_s`, `trusted_out`: the trusted implementation's time and output on the same call."""
    t0 = time.perf_counter()
    corners = get_op(op).class_corners(sent)  # first: it may write where the call reads nothing
    digests = {k: storage_digest(v) for k, v in sent.items() if isinstance(v, torch.Tensor)}
    res, failed = run_in_child(path, op, sent, device, config, [c for _, c in corners])
    if failed is None:
        failed = judge_run(op, res, sent, digests, device, trusted_out)
    for (what, corner), corner_res in zip(corners, res.corners if failed is None and res is not None else []):
        # the class's corner, against the reference alone (no trusted output was computed on it)
        corner_digests = {k: d if corner[k] is sent[k] else storage_digest(corner[k]) for k, d in digests.items()}
        failed = judge_run(op, corner_res, corner, corner_digests, device)
        if failed is not None:
            failed.detail = f"at the class's corner ({what}): {failed.detail}"[:300]
            break
    kernel_s = res.elapsed_s if res is not None else 0.0
    if failed is None and device.type == "cuda":
        failed = too_slow(kernel_s, trusted_s, config)
    outcome = failed or CheckOutcome(None, "passed")
    outcome.child_s, outcome.kernel_s, outcome.trusted_s = time.perf_counter() - t0, kernel_s, trusted_s
    return outcome


# --------------------------------------------------------------------------------------
# the guard of one dispatcher


@dataclass
class ClassRecord:
    """What the guard knows of one (kernel, shape class)."""

    state: str
    text: str
    outcomes: list[CheckOutcome] = field(default_factory=list)
    rechecking: bool = False  # a sampled re-check is in flight (the class stays verified meanwhile)


class Guard:
    """The per-class verification of one dispatcher's promoted kernels (see the module). `trusted`: the
    trusted implementation; `path_of(entry)`: the file holding a kernel entry's checked source; `name_of(entry)`:
    the name a field failure gives the kernel (serving.entry_name)."""

    def __init__(
        self,
        op: str,
        trusted: Callable[..., Any],
        path_of: Callable[[ManifestEntry], Path],
        config: Optional[GuardConfig] = None,
        sink: Optional[Sink] = None,
        name_of: Callable[[ManifestEntry], str] = lambda entry: entry.file or entry.op,
    ):
        self.op = op
        spec = get_op(op)
        self.names = tuple(spec.arg_names) + tuple(spec.optional_args)
        self.trusted = trusted
        self.path_of = path_of
        self.name_of = name_of
        self.config = config or GuardConfig()
        self.sink = sink
        self.classes: dict[tuple, ClassRecord] = {}
        self.counts: Counter = Counter()
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(max(1, self.config.max_checks))
        self._threads: list[threading.Thread] = []
        self._in_flight = 0  # checks claimed and not yet settled
        self._random = random.Random()

    # -- the call path ----------------------------------------------------------------
    def serve(
        self, entry: ManifestEntry, kernel: Callable[[], Callable], gpu: str, bound: dict[str, Any], args, kwargs
    ) -> Any:
        """Answer one call that the manifest gives to `entry`'s kernel (`kernel()` loads it)."""
        key = (entry.source_hash, entry.bucket, entry.dtype, gpu, class_key(bound, self.names))
        record = self.classes.get(key)
        if record is not None and record.state == VERIFIED:
            if (
                self.config.recheck_rate <= 0
                or record.rechecking
                or self._random.random() >= self.config.recheck_rate
                or _capturing()
                or not self._begin(key, recheck=True)
            ):
                self.counts[SERVED_KERNEL] += 1
                return kernel()(*args, **kwargs)
            return self._check_and_answer(entry, key, gpu, bound, args, kwargs, recheck=True)
        if record is not None:
            self.counts[SERVED_RETIRED if record.state == RETIRED else SERVED_CHECKING] += 1
            return self.trusted(*args, **kwargs)
        if _capturing():  # no copy or second process inside a capture: the graph records the trusted call
            self.counts[SERVED_CAPTURING] += 1
            return self.trusted(*args, **kwargs)
        # loaded (gated and imported: definitions only, nothing runs or compiles) as unguarded serving loads it,
        # so that a text that is not the judged one, or that the gate refuses, is the caller's ServingError
        kernel()
        if not self._begin(key, recheck=False):  # met by another thread meanwhile, or max_checks in flight
            self.counts[SERVED_CHECKING] += 1
            return self.trusted(*args, **kwargs)
        return self._check_and_answer(entry, key, gpu, bound, args, kwargs, recheck=False)

    def _begin(self, key: tuple, recheck: bool) -> bool:
        """Claim a check of the class: False when one is in flight for it, or `max_checks` are in flight in all
        (each holds a copy of its call's inputs: the bound on that memory). A class left unclaimed stays
        unseen, and a later call claims it."""
        with self._lock:
            record = self.classes.get(key)
            if self._in_flight >= self.config.max_checks:
                return False
            if recheck and record is not None and not record.rechecking:
                record.rechecking = True
            elif not recheck and record is None:
                self.classes[key] = ClassRecord(CHECKING, class_text(key[-1]))
            else:
                return False
            self._in_flight += 1
            return True

    def _abandon(self, key: tuple, recheck: bool) -> None:
        """Release a claim whose call failed before its check started (the trusted call raised)."""
        with self._lock:
            self._in_flight -= 1
            if recheck:
                self.classes[key].rechecking = False
            else:
                del self.classes[key]

    def _check_and_answer(self, entry, key, gpu, bound, args, kwargs, recheck: bool) -> Any:
        """The trusted output for this call, and a check of the kernel on a copy of its inputs (in the
        background unless the guard is synchronous)."""
        try:
            sent = snapshot(bound)
            device = _device_of(bound)
            t0 = time.perf_counter()
            out = self.trusted(*args, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            trusted_s = time.perf_counter() - t0
        except BaseException:
            self._abandon(key, recheck)
            raise
        self.counts[SERVED_CHECKING] += 1
        job = (entry, key, gpu, sent, device, trusted_s, _metadata(bound), _to(out, torch.device("cpu")))
        if self.config.asynchronous:
            self._start(job)
        else:
            self._run(job)
        return out

    def _start(self, job: tuple) -> None:
        thread = threading.Thread(target=self._run, args=(job,), name=f"serving-guard-{self.op}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _run(self, job: tuple) -> CheckOutcome:
        entry, key, gpu, sent, device, trusted_s, meta, trusted_out = job
        with self._slots:
            try:
                outcome = check_call(self.path_of(entry), self.op, sent, device, trusted_s, self.config, trusted_out)
            except Exception as e:  # noqa: BLE001 - the guard's own failure retires the class, never serves it
                outcome = CheckOutcome(FailureKind.CRASH, f"the check itself failed: {type(e).__name__}: {e}"[:300])
        self._settle(entry, key, gpu, meta, outcome)
        return outcome

    def _settle(self, entry, key, gpu, meta, outcome: CheckOutcome) -> None:
        with self._lock:
            self._in_flight -= 1
            record = self.classes[key]
            record.outcomes.append(outcome)
            record.rechecking = False
            record.state = VERIFIED if outcome.kind is None else RETIRED
        if outcome.kind is not None:
            self._report(entry, gpu, record.text, meta, outcome)

    def _report(self, entry: ManifestEntry, gpu: str, text: str, meta: tuple, outcome: CheckOutcome) -> None:
        shapes, strides, dtypes = meta
        assert outcome.kind is not None
        ff = FieldFailure(
            op=self.op,
            bucket=entry.bucket,
            dtype=entry.dtype,
            gpu=gpu,
            kernel=self.name_of(entry),
            source_hash=entry.source_hash or "",
            shape_class=text,
            shapes=shapes,
            strides=strides,
            dtypes=dtypes,
            kind=outcome.kind,
            detail=outcome.detail,
        )
        try:
            (self.sink or (lambda ff: None))(ff)
        except Exception as e:  # noqa: BLE001 - recording must never break serving; the class stays retired
            warnings.warn(f"serving guard: the field failure of {ff.kernel} could not be recorded: {e}", stacklevel=2)

    def check_now(self, entry: ManifestEntry, gpu: str, bound: dict[str, Any]) -> CheckOutcome:
        """Check the class of a call synchronously (warm-up): a class already settled answers with its last
        outcome. The trusted implementation is timed warm (its second call), as traffic would find it."""
        key = (entry.source_hash, entry.bucket, entry.dtype, gpu, class_key(bound, self.names))
        with self._lock:
            record = self.classes.get(key)
            if record is not None and record.state != CHECKING:
                return record.outcomes[-1] if record.outcomes else CheckOutcome(None, record.state)
            if record is None:
                self.classes[key] = ClassRecord(CHECKING, class_text(key[-1]))
                self._in_flight += 1  # warm-up waits for no slot: it is the caller's own, synchronous
        if record is not None:  # a call's check of the class is in flight: its outcome is this one's
            self.wait(self.config.time_limit_s + 60)
            return record.outcomes[-1] if record.outcomes else CheckOutcome(FailureKind.TIMEOUT, "still checking")
        try:
            sent = snapshot(bound)
            device = _device_of(bound)
            self.trusted(**bound)
            t0 = time.perf_counter()
            out = self.trusted(**bound)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            trusted_s = time.perf_counter() - t0
        except BaseException:
            self._abandon(key, recheck=False)
            raise
        return self._run((entry, key, gpu, sent, device, trusted_s, _metadata(bound), _to(out, torch.device("cpu"))))

    # -- waiting and reading ----------------------------------------------------------
    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Wait for the checks in flight; False if some are still running after `timeout_s`."""
        end = None if timeout_s is None else time.time() + timeout_s
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(None if end is None else max(0.0, end - time.time()))
        return not any(t.is_alive() for t in threads)

    def state_of(self, entry: ManifestEntry, gpu: str, bound: dict[str, Any]) -> Optional[str]:
        """The state of the class of a call (None: never seen)."""
        record = self.classes.get((entry.source_hash, entry.bucket, entry.dtype, gpu, class_key(bound, self.names)))
        return record.state if record is not None else None


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _device_of(bound: Mapping[str, Any]) -> torch.device:
    for v in bound.values():
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


# --------------------------------------------------------------------------------------
# warm-up


@dataclass(frozen=True)
class WarmupResult:
    """One warm-up call: the class, what serves it, and what its check found (`passed`, `kind`, `detail`)."""

    bucket: str
    shape_class: str
    impl: str  # what the manifest resolves the call to: 'kernel' (checked), 'baseline' or 'torch' (trusted)
    passed: bool
    kind: Optional[FailureKind]
    detail: str
    check_s: float


def warmup_calls(
    dispatcher: Any, calls: Sequence[Any], dtype: Optional[torch.dtype] = None, device: Optional[str] = None
) -> list[WarmupResult]:
    """Verify, synchronously, the class of each call before traffic (serving.warmup's body). A call is a
    mapping of argument names to values, a tuple of positional arguments, (args, kwargs), or a shape (the op's
    Shape, or its text such as "T=4,H=2,D=16"): its inputs are then made by the op in `dtype` on `device`
    (default bfloat16 on a GPU, float32 on the CPU), contiguous: the class of traffic laid out so."""
    results = []
    for call in calls:
        args, kwargs = _split_call(call, dispatcher.op, dtype, device)
        results.append(dispatcher.verify(*args, **kwargs))
    return results


def _split_call(call: Any, op: str, dtype: Optional[torch.dtype], device: Optional[str]) -> tuple[tuple, dict]:
    spec = get_op(op)
    if isinstance(call, str):
        call = spec.parse_shape(call)  # ValueError, one line, for a shape the op does not read
    if isinstance(call, Shape) and isinstance(call, spec.shape_cls):
        where = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dt = dtype or (torch.bfloat16 if where.startswith("cuda") else torch.float32)
        return (), dict(spec.make_case(call, dt, seed=0, device=where).args)
    if isinstance(call, Mapping):
        return (), dict(call)
    if isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], tuple) and isinstance(call[1], Mapping):
        return call[0], dict(call[1])
    if isinstance(call, (tuple, list)):
        return tuple(call), {}
    raise TypeError(
        f"a warm-up call of {op} is a mapping, a tuple of arguments, (args, kwargs) or a shape of {op}, "
        f"not {type(call).__name__}"
    )

"""Where evaluation work runs: the one seam between the loop and the machines.

The loop decides *what* to evaluate next; a placement decides *where* and runs it. A task is
plain data (a file path and op, or a benchmark spec), so the same tasks can later be shipped to
other machines; its result is a Verdict or a benchmark document. `LocalPlacement` runs each task
in child processes of this machine (sanitizer/runner.py, harness/bench/bench_worker.py):

- CPU tasks (the interpreter's sanitizer stages) on `cpu_slots` threads, each driving one judge;
- GPU tasks on the visible GPUs. A benchmark's timing has its GPU to itself: two kernels sharing a
  GPU would time each other. GPU checks (correctness, not timing) share a GPU with each other, up to
  `checks_per_gpu` at once: most of a check's time is its processes starting and compiling, not
  the GPU, so they overlap well. Tasks are gated (isolation/lease.py): a child starts, imports and
  loads before it holds any of the GPU, then asks for a shared lease, and a benchmark later for the
  GPU alone; from that request on no lease is granted there, and the timing begins once the tasks
  on the GPU have ended. So a child's seconds of starting hold nothing, and a benchmark's compiling
  does not keep the checks off the GPU.

`stop()` is the hard stop: no task starts after it, and every running child is killed at once.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Union

from ..harness.bench import bench_worker, compile_probe
from ..harness.bench.bench_records import CANDIDATE, BenchSpec
from ..harness.bench.compile_probe import CompileProfile
from ..harness.env import gpu_name
from ..isolation import isolation
from ..isolation.lease import OnReady
from ..sanitizer import runner
from ..sanitizer.verdict import SanitizerMode, Verdict


@dataclass(frozen=True)
class SanitizeTask:
    """One sanitizer stage of one candidate file: mode quick / full (CPU, the interpreter) or gpu."""

    path: str
    op: str
    mode: SanitizerMode
    checks: Optional[Tuple[str, ...]] = None
    stage: str = ""  # what the run calls this task (default: the mode)
    gated: bool = False  # gpu mode: the judge starts without the GPU and asks for it (isolation/lease.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", SanitizerMode(self.mode))  # (a caller may name it by its word)

    @property
    def resource(self) -> str:
        return "gpu" if self.mode == SanitizerMode.GPU else "cpu"

    @property
    def kind(self) -> str:
        return self.stage or self.mode.value

    @property
    def subject(self) -> str:
        """The candidate the task is for (its file), for the seconds spent on each candidate."""
        return self.path

    exclusive = False  # a check may share its GPU with other checks


@dataclass(frozen=True)
class BenchTask:
    """One benchmark (harness/bench/bench_worker.py): candidate against incumbent on a bucket's shapes."""

    spec: BenchSpec
    resource: str = "gpu"
    kind: str = "bench"
    exclusive: bool = True  # a timing has its GPU to itself
    gated: bool = True  # it starts without the GPU, compiles sharing it, and has it alone only to time

    @property
    def subject(self) -> str:
        """The candidate the benchmark is for (its file), for the seconds spent on each candidate."""
        return next((k.file or "" for k in self.spec.kernels if k.label == CANDIDATE), "")


Task = Union[SanitizeTask, BenchTask]


@dataclass(frozen=True)
class TaskLost:
    """The result of a task that did not finish because the machine it ran on went away (a cluster node
    died or was removed): it says nothing about the candidate, so the loop queues the task again
    instead of judging the candidate on it."""

    reason: str


GPU_CHECKS_PER_GPU = 3


class TaskSpan(NamedTuple):
    """When one task ran, and where."""

    kind: str  # the task's stage: quick, full, gpu, bench, promote
    resource: str  # cpu | gpu
    start: float
    end: float
    gpu: Optional[str] = None  # the CUDA_VISIBLE_DEVICES entry it ran on
    subject: str = ""  # the candidate it was for (Task.subject)


def gpu_seconds_by_subject(spans: Sequence[TaskSpan]) -> Dict[str, Dict[str, float]]:
    """The GPU wall seconds of each candidate (Task.subject), by stage. A task's GPU seconds run from when it got
    its GPU (a gated task: its lease, logged as "<stage> on gpu") to its end; the "<stage> alone" spans lie
    inside those and are not counted again, and a gated task's whole span holds no GPU."""
    per: Dict[str, Dict[str, float]] = {}
    for s in spans:
        if s.gpu is None or s.kind.endswith(" alone"):
            continue
        stage = s.kind[: -len(" on gpu")] if s.kind.endswith(" on gpu") else s.kind
        by_stage = per.setdefault(s.subject, {})
        by_stage[stage] = by_stage.get(stage, 0.0) + (s.end - s.start)
    return per


def gpu_seconds(spans: Sequence[TaskSpan]) -> Dict[str, float]:
    """The GPU wall seconds each candidate cost, by stage (gpu_seconds_by_subject): {stage: the median over the
    candidates that ran it of their seconds in it, "total": the median over all candidates of their seconds on
    the GPU}. Leased seconds: checks that share a GPU each count the time they held it."""
    per = gpu_seconds_by_subject(spans)
    stages = sorted({k for d in per.values() for k in d})
    out = {k: statistics.median(d[k] for d in per.values() if k in d) for k in stages}
    if per:
        out["total"] = statistics.median(sum(d.values()) for d in per.values())
    return out


def occupied_fraction(spans: Sequence[TaskSpan], lo: float, hi: float, gpus: Sequence[str]) -> float:
    """The fraction of [lo, hi] during which the GPUs had at least one task each, averaged over the
    GPUs (tasks that share a GPU count once: the union of their spans)."""
    if hi <= lo or not gpus:
        return 0.0
    return occupied_seconds(spans, lo, hi, gpus) / ((hi - lo) * len(gpus))


def occupied_seconds(spans: Sequence[TaskSpan], lo: float, hi: float, gpus: Sequence[str]) -> float:
    """The seconds of [lo, hi] during which each GPU had at least one task, summed over the GPUs (tasks that
    share a GPU count once: the union of their spans)."""
    total = 0.0
    for g in gpus:
        cur_start: float = 0.0  # read only once cur_end is set
        cur_end: Optional[float] = None
        for s in sorted((x for x in spans if x.gpu == g), key=lambda x: x.start):
            a, b = max(s.start, lo), min(s.end, hi)
            if b <= a:
                continue
            if cur_end is None or a > cur_end:
                if cur_end is not None:
                    total += cur_end - cur_start
                cur_start, cur_end = a, b
            else:
                cur_end = max(cur_end, b)
        if cur_end is not None:
            total += cur_end - cur_start
    return total


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_jobs(n_gpus: int, cores: Optional[int] = None) -> int:
    """Sanitizer processes for a machine: one per usable core, less one per GPU for its GPU child
    (a benchmark or a GPU check compiles and launches from a core of its own)."""
    cores = cores or usable_cores()
    return max(1, cores - n_gpus)


def threads_per_child(jobs: int, cores: Optional[int] = None) -> int:
    """Intra-op threads for each sanitizer child: the cores shared out, so that `jobs` children each
    with a thread pool the size of the machine do not thrash."""
    cores = cores or usable_cores()
    return max(1, cores // max(1, jobs))


class Evaluator(Protocol):
    """What runs a task's child processes and stops them: the judge of a sanitizer stage, the benchmark
    child. `ChildEvaluator` is this machine's; tests hand a placement a fake."""

    def sanitize(
        self,
        path: str,
        op: str,
        mode: SanitizerMode,
        checks: Optional[Sequence[str]] = None,
        env: Optional[Dict[str, str]] = None,
        on_ready: Optional[OnReady] = None,
    ) -> Verdict: ...

    def bench(
        self, spec: Dict[str, Any], env: Optional[Dict[str, str]] = None, on_ready: Optional[OnReady] = None
    ) -> Dict[str, Any]: ...

    # (a benchmark's spec and its document are JSON here, as they cross into the child: BenchSpec.to_json in,
    # BenchOutcome.from_json out)

    def stop_all(self) -> None: ...

    def resume_starting(self) -> None: ...


class ChildEvaluator:
    """Each task in sandboxed children of this process: the sanitizer's judge (sanitizer/runner.py) and
    the benchmark child (harness/bench/bench_worker.py), under the process-wide hard stop (isolation/isolation.py)."""

    def sanitize(
        self,
        path: str,
        op: str,
        mode: SanitizerMode,
        checks: Optional[Sequence[str]] = None,
        env: Optional[Dict[str, str]] = None,
        on_ready: Optional[OnReady] = None,
    ) -> Verdict:
        return runner.run_isolated(path, op, mode, checks=checks, env=env, on_ready=on_ready)

    def bench(
        self, spec: Dict[str, Any], env: Optional[Dict[str, str]] = None, on_ready: Optional[OnReady] = None
    ) -> Dict[str, Any]:
        return bench_worker.run_bench_isolated(spec, env=env, on_ready=on_ready)

    def profile(
        self,
        source: str,
        op: str,
        shapes: Sequence[str],
        dtype: str,
        timeout_s: float = compile_probe.INCUMBENT_TIMEOUT_S,
    ) -> CompileProfile:
        """The kernel compiled for the H200 on this machine's CPU, in a sandboxed child
        (harness/bench/compile_probe.py). An evaluator without `profile` (a test's fake) gives the run no compiled
        diagnosis or compile screen."""
        return compile_probe.profile_source(source, op, shapes, dtype, timeout_s)

    def stop_all(self) -> None:
        isolation.stop_all()

    def resume_starting(self) -> None:
        isolation.resume_starting()


def run_task(
    task: Task,
    env: Optional[Dict[str, str]] = None,
    on_ready: Optional[OnReady] = None,
    evaluator: Optional[Evaluator] = None,
) -> Any:
    """Run one task through `evaluator` (default: this machine's children). `on_ready`: a gated task's
    requests for the GPU (isolation/lease.py)."""
    evaluator = evaluator or ChildEvaluator()
    if isinstance(task, SanitizeTask):
        return evaluator.sanitize(task.path, task.op, task.mode, checks=task.checks, env=env, on_ready=on_ready)
    return evaluator.bench(task.spec.to_json(), env=env, on_ready=on_ready)


class Devices(Protocol):
    """The GPUs a run may use: whether it has any, their model's name, and their CUDA_VISIBLE_DEVICES
    entries. `LocalDevices` asks this machine, `ClusterDevices` a cluster's placement; tests pass fakes."""

    def available(self) -> bool: ...

    def name(self) -> Optional[str]: ...

    def visible(self, limit: Optional[int] = None) -> List[str]: ...


# what an NVIDIA driver creates (Linux; WSL2's GPU device); a machine without either has no CUDA GPU
NVIDIA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg")


class LocalDevices:
    """This machine's GPUs, as torch sees them (none while Triton interprets: the run is on the CPU)."""

    def available(self) -> bool:
        if os.environ.get("TRITON_INTERPRET") == "1":
            return False
        if not any(os.path.exists(d) for d in NVIDIA_DEVICE_FILES):  # no driver: no CUDA GPU, known without torch
            return False
        import torch  # deferred: the cluster nodes import placement and never ask which GPUs this machine has

        return torch.cuda.is_available()

    def name(self) -> Optional[str]:
        return gpu_name()

    def visible(self, limit: Optional[int] = None) -> List[str]:
        """At most `limit` of the GPUs this process may use."""
        import torch  # deferred: as in `available`

        n = torch.cuda.device_count()
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x.strip() for x in env.split(",") if x.strip()][:n] if env else [str(i) for i in range(n)]
        return ids[:limit] if limit else ids


class ClusterDevices:
    """A cluster placement's GPUs (agent/ray_placement.py): the run's GPUs are the cluster's, not this machine's."""

    def __init__(self, placement: Any):
        self.placement = placement

    def available(self) -> bool:
        return bool(self.placement.gpus)

    def name(self) -> Optional[str]:
        return self.placement.gpu_name if self.placement.gpus else None

    def visible(self, limit: Optional[int] = None) -> List[str]:
        gpus = list(self.placement.gpus)
        return gpus[:limit] if limit else gpus


class LocalPlacement:
    """Tasks on this machine: `cpu_slots` CPU tasks at once, and on each GPU in `gpus`
    (CUDA_VISIBLE_DEVICES entries) either one task alone or up to `checks_per_gpu` sharing it.

    A gated task (isolation/lease.py) is admitted before it holds the GPU: its child starts, imports
    and loads without it, then asks for a shared lease ("gpu"), and a benchmark later for the GPU alone
    ("alone"). Up to `2 * checks_per_gpu` gated tasks are admitted per GPU (those starting overlap with
    those on the GPU), and one benchmark: two waiting to time alone would wait on each other. From a
    request for the GPU alone until the timing ends no lease is granted on that GPU, so the tasks on it
    drain and none joins the timing."""

    def __init__(
        self,
        cpu_slots: int,
        gpus: Sequence[str] = (),
        threads: Optional[int] = None,
        checks_per_gpu: int = GPU_CHECKS_PER_GPU,
        evaluator: Optional[Evaluator] = None,
    ):
        self.evaluator = evaluator or ChildEvaluator()
        self.cpu_slots = max(1, cpu_slots)
        self.gpus = list(gpus)
        self.checks_per_gpu = max(1, checks_per_gpu)
        self.admitted_per_gpu = 2 * self.checks_per_gpu
        self.threads = threads or threads_per_child(self.cpu_slots)
        self._cpu = ThreadPoolExecutor(max_workers=self.cpu_slots, thread_name_prefix="ka-cpu")
        self._gpu = ThreadPoolExecutor(
            max_workers=max(1, len(self.gpus) * (self.admitted_per_gpu + 1)), thread_name_prefix="ka-gpu"
        )
        self._lock = threading.Condition()  # notified whenever a lease comes back
        self._shared = {g: 0 for g in self.gpus}  # GPU -> shared leases (checks, benchmarks compiling)
        self._alone = {g: False for g in self.gpus}  # GPU -> a task has it alone (a timing)
        self._admitted = {g: 0 for g in self.gpus}  # GPU -> gated tasks admitted, leased or not yet
        self._benches = {g: 0 for g in self.gpus}  # GPU -> gated benchmarks admitted (at most one)
        self._draining = {g: False for g in self.gpus}  # GPU -> a timing waits for it: no lease is granted
        self._running = {"cpu": 0, "gpu": 0}
        self._log: List[TaskSpan] = []  # every task run so far
        self.stopped = False

    def _gpu_for(self, task: Task) -> Optional[str]:
        """A GPU that can take `task` now (call under the lock): for a gated task, the admitted GPU with
        the fewest tasks; otherwise the first that can lease it at once."""
        if task.gated:
            free = [
                g
                for g in self.gpus
                if self._admitted[g] < self.admitted_per_gpu and not (task.exclusive and self._benches[g])
            ]
            return min(free, key=lambda g: (self._admitted[g] + self._shared[g], self.gpus.index(g)), default=None)
        for g in self.gpus:
            if self._alone[g] or self._draining[g]:
                continue
            if task.exclusive and self._shared[g] == 0 and not self._benches[g]:
                return g
            if not task.exclusive and self._shared[g] < self.checks_per_gpu:
                return g
        return None

    def _lease(self, gpu: str, phase: str, still_wanted: Callable[[], bool]) -> bool:
        """A gated task on `gpu` asks for `phase`: "gpu" waits for a shared lease, "alone" turns the
        task's shared lease into the GPU alone once the others have drained. False when the placement
        stops or the task no longer waits (its lease, if any, stays as it was)."""
        with self._lock:
            if phase == "gpu":
                if not self._wait_until(
                    lambda: not (self._alone[gpu] or self._draining[gpu] or self._shared[gpu] >= self.checks_per_gpu),
                    still_wanted,
                ):
                    return False
                self._shared[gpu] += 1
                return True
            self._draining[gpu] = True
            try:
                if not self._wait_until(lambda: self._shared[gpu] <= 1 and not self._alone[gpu], still_wanted):
                    return False
                self._shared[gpu] -= 1
                self._alone[gpu] = True
                return True
            finally:
                self._draining[gpu] = False
                self._lock.notify_all()

    def _wait_until(self, ready: Callable[[], bool], still_wanted: Callable[[], bool]) -> bool:
        """(under the lock) Wait until `ready()`; False as soon as the placement stops or the task no
        longer waits."""
        while True:
            if self.stopped or not still_wanted():
                return False
            if ready():
                return True
            self._lock.wait(0.1)

    def can_start(self, task: Task) -> bool:
        """Whether `task` would start at once (a free CPU slot, or a GPU that can take it)."""
        with self._lock:
            if task.resource == "cpu":
                return self._running["cpu"] < self.cpu_slots
            return self._gpu_for(task) is not None

    def running(self, resource: str) -> int:
        with self._lock:
            return self._running[resource]

    def submit(self, task: Task) -> "Future[Any]":
        """Start `task` (GPU tasks: only when `can_start` says so; CPU tasks queue for a slot)."""
        resource = task.resource
        gpu = None
        with self._lock:
            if resource == "gpu":
                gpu = self._gpu_for(task)
                if gpu is None:
                    raise ValueError(
                        "no GPU can take this task now" if self.gpus else "a GPU task on a placement without GPUs"
                    )
                if task.gated:
                    self._admitted[gpu] += 1
                    self._benches[gpu] += int(task.exclusive)
                elif task.exclusive:
                    self._alone[gpu] = True
                else:
                    self._shared[gpu] += 1
            self._running[resource] += 1
        pool = self._gpu if resource == "gpu" else self._cpu
        return pool.submit(self._run, task, resource, gpu)

    def _run(self, task: Task, resource: str, gpu: Optional[str]) -> Any:
        t0 = time.time()
        gated = gpu is not None and task.gated
        granted: Dict[str, float] = {}  # phase -> when a gated task got it

        def on_ready(phase: str, still_wanted: Callable[[], bool]) -> bool:
            if phase == "alone" and not task.exclusive:
                return False  # a check has no business timing
            if self._lease(gpu, phase, still_wanted):  # type: ignore[arg-type]
                granted[phase] = time.time()
                return True
            return False

        try:
            if self.stopped:
                raise ChildProcessError("stopped: no new task starts")
            # the children's thread pools share the cores out (torch reads these at import)
            env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
                env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
            return run_task(task, env, on_ready if gated else None, self.evaluator)
        finally:
            with self._lock:
                end = time.time()
                self._running[resource] -= 1
                if gpu is not None:
                    self._release(task, gpu, gated, granted)
                # a gated task's whole span holds no GPU; its leased spans below do
                subject = task.subject
                self._log.append(TaskSpan(task.kind, resource, t0, end, None if gated else gpu, subject))
                if "gpu" in granted:
                    self._log.append(TaskSpan(f"{task.kind} on gpu", resource, granted["gpu"], end, gpu, subject))
                if "alone" in granted:
                    self._log.append(TaskSpan(f"{task.kind} alone", resource, granted["alone"], end, gpu, subject))
                self._lock.notify_all()
                self._release_if_idle()

    def _release(self, task: Task, gpu: str, gated: bool, granted: Dict[str, float]) -> None:
        """(under the lock) Give back what `task` held on `gpu`."""
        if gated:
            self._admitted[gpu] -= 1
            self._benches[gpu] -= int(task.exclusive)
            if "alone" in granted:
                self._alone[gpu] = False
            elif "gpu" in granted:
                self._shared[gpu] -= 1
        elif task.exclusive:
            self._alone[gpu] = False
        else:
            self._shared[gpu] -= 1

    def log(self) -> List[TaskSpan]:
        """Every task run so far."""
        with self._lock:
            return list(self._log)

    def stop(self) -> None:
        """No new task starts; every running child is killed (their tasks return failed results).
        Children are refused process-wide only until this placement's last task has returned: a task
        that passed its start check races no kill, and nothing else in the process stays blocked."""
        with self._lock:
            self.stopped = True
            self.evaluator.stop_all()
            self._release_if_idle()

    def _release_if_idle(self) -> None:
        """(under the lock) After a stop, once no task of this placement runs, children may start again."""
        if self.stopped and not any(self._running.values()):
            self.evaluator.resume_starting()

    def close(self, wait: bool = True) -> None:
        self._cpu.shutdown(wait=wait, cancel_futures=True)
        self._gpu.shutdown(wait=wait, cancel_futures=True)


def describe(placement: LocalPlacement) -> str:
    if hasattr(placement, "describe"):  # a cluster's placement says what it chose itself
        return placement.describe()
    gpus = (
        f"{len(placement.gpus)} GPU{'s' if len(placement.gpus) != 1 else ''} ({', '.join(placement.gpus)})"
        if placement.gpus
        else "no GPU"
    )
    return (
        f"{placement.cpu_slots} sanitizer process{'es' if placement.cpu_slots != 1 else ''} "
        f"({placement.threads} thread{'s' if placement.threads != 1 else ''} each, {usable_cores()} usable "
        f"cores), {gpus}"
    )


__all__: List[str] = [
    "SanitizeTask",
    "BenchTask",
    "Task",
    "TaskLost",
    "LocalPlacement",
    "run_task",
    "Evaluator",
    "ChildEvaluator",
    "Devices",
    "LocalDevices",
    "ClusterDevices",
    "default_jobs",
    "GPU_CHECKS_PER_GPU",
    "TaskSpan",
    "occupied_fraction",
    "occupied_seconds",
    "gpu_seconds",
    "gpu_seconds_by_subject",
    "threads_per_child",
    "usable_cores",
    "describe",
]

"""Where evaluation work runs: the one seam between the loop and the machines.

The loop decides *what* to evaluate next; a placement decides *where* and runs it. A task is
plain data (a file path and op, or a benchmark spec), so the same tasks can later be shipped to
other machines; its result is a Verdict or a benchmark document. `LocalPlacement` runs each task
in child processes of this machine (sanitizer/runner.py, harness/bench_worker.py):

- CPU tasks (the interpreter's sanitizer stages) on `cpu_slots` threads, each driving one judge;
- GPU tasks on the visible GPUs. A benchmark has its GPU to itself: two kernels sharing a GPU would
  time each other. GPU checks (correctness, not timing) share a GPU with each other, up to
  `checks_per_gpu` at once: most of a check's time is its processes starting and compiling, not
  the GPU, so they overlap well; none starts beside a benchmark.

`stop()` is the hard stop: no task starts after it, and every running child is killed at once.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union


@dataclass(frozen=True)
class SanitizeTask:
    """One sanitizer stage of one candidate file: mode quick / full (CPU, the interpreter) or gpu."""

    path: str
    op: str
    mode: str
    checks: Optional[Tuple[str, ...]] = None
    stage: str = ""  # what the run calls this task (default: the mode)

    @property
    def resource(self) -> str:
        return "gpu" if self.mode == "gpu" else "cpu"

    @property
    def kind(self) -> str:
        return self.stage or self.mode

    exclusive = False  # a check may share its GPU with other checks


@dataclass(frozen=True)
class BenchTask:
    """One benchmark (harness/bench_worker.py spec): candidate against incumbent on a bucket's shapes."""

    spec: Dict[str, Any]
    resource: str = "gpu"
    kind: str = "bench"
    exclusive: bool = True  # a timing has its GPU to itself


Task = Union[SanitizeTask, BenchTask]


GPU_CHECKS_PER_GPU = 3


class TaskSpan(NamedTuple):
    """When one task ran, and where."""

    kind: str  # the task's stage: quick, full, gpu, bench, promote
    resource: str  # cpu | gpu
    start: float
    end: float
    gpu: Optional[str] = None  # the CUDA_VISIBLE_DEVICES entry it ran on


def occupied_fraction(spans: Sequence[TaskSpan], lo: float, hi: float, gpus: Sequence[str]) -> float:
    """The fraction of [lo, hi] during which the GPUs had at least one task each, averaged over the
    GPUs (tasks that share a GPU count once: the union of their spans)."""
    if hi <= lo or not gpus:
        return 0.0
    total = 0.0
    for g in gpus:
        cur_start = cur_end = None
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
    return total / ((hi - lo) * len(gpus))


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


def run_task(task: Task, env: Optional[Dict[str, str]] = None) -> Any:
    """Run one task in this machine's child processes (looked up at call time: tests put fakes there)."""
    if isinstance(task, SanitizeTask):
        from ..sanitizer import runner
        return runner.run_isolated(task.path, task.op, task.mode, checks=task.checks, env=env)
    from ..harness import bench_worker
    return bench_worker.run_bench_isolated(task.spec, env=env)


class LocalPlacement:
    """Tasks on this machine: `cpu_slots` CPU tasks at once, and on each GPU in `gpus`
    (CUDA_VISIBLE_DEVICES entries) either one exclusive task or up to `checks_per_gpu` shared ones."""

    def __init__(self, cpu_slots: int, gpus: Sequence[str] = (), threads: Optional[int] = None,
                 checks_per_gpu: int = GPU_CHECKS_PER_GPU):
        self.cpu_slots = max(1, cpu_slots)
        self.gpus = list(gpus)
        self.checks_per_gpu = max(1, checks_per_gpu)
        self.threads = threads or threads_per_child(self.cpu_slots)
        self._cpu = ThreadPoolExecutor(max_workers=self.cpu_slots, thread_name_prefix="ka-cpu")
        self._gpu = ThreadPoolExecutor(max_workers=max(1, len(self.gpus) * self.checks_per_gpu),
                                       thread_name_prefix="ka-gpu")
        self._lock = threading.Lock()
        self._shared = {g: 0 for g in self.gpus}  # GPU -> checks running on it
        self._exclusive = {g: False for g in self.gpus}  # GPU -> a benchmark is running on it
        self._running = {"cpu": 0, "gpu": 0}
        self._log: List[TaskSpan] = []  # every task run so far
        self.stopped = False

    def _gpu_for(self, task: Task) -> Optional[str]:
        """A GPU that can take `task` now (call under the lock)."""
        for g in self.gpus:
            if self._exclusive[g]:
                continue
            if task.exclusive and self._shared[g] == 0:
                return g
            if not task.exclusive and self._shared[g] < self.checks_per_gpu:
                return g
        return None

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
                    raise ValueError("no GPU can take this task now" if self.gpus else
                                     "a GPU task on a placement without GPUs")
                if task.exclusive:
                    self._exclusive[gpu] = True
                else:
                    self._shared[gpu] += 1
            self._running[resource] += 1
        pool = self._gpu if resource == "gpu" else self._cpu
        return pool.submit(self._run, task, resource, gpu)

    def _run(self, task: Task, resource: str, gpu: Optional[str]) -> Any:
        t0 = time.time()
        try:
            if self.stopped:
                raise ChildProcessError("stopped: no new task starts")
            # the children's thread pools share the cores out (torch reads these at import)
            env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
                env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
            return run_task(task, env)
        finally:
            with self._lock:
                self._running[resource] -= 1
                if gpu is not None:
                    if task.exclusive:
                        self._exclusive[gpu] = False
                    else:
                        self._shared[gpu] -= 1
                self._log.append(TaskSpan(task.kind, resource, t0, time.time(), gpu))
                self._release_if_idle()

    def log(self) -> List[TaskSpan]:
        """Every task run so far."""
        with self._lock:
            return list(self._log)

    def stop(self) -> None:
        """No new task starts; every running child is killed (their tasks return failed results).
        Children are refused process-wide only until this placement's last task has returned: a task
        that passed its start check races no kill, and nothing else in the process stays blocked."""
        from ..sanitizer import isolation
        with self._lock:
            self.stopped = True
            isolation.stop_all()
            self._release_if_idle()

    def _release_if_idle(self) -> None:
        """(under the lock) After a stop, once no task of this placement runs, children may start again."""
        if self.stopped and not any(self._running.values()):
            from ..sanitizer import isolation
            isolation.resume_starting()

    def close(self, wait: bool = True) -> None:
        self._cpu.shutdown(wait=wait, cancel_futures=True)
        self._gpu.shutdown(wait=wait, cancel_futures=True)


def describe(placement: LocalPlacement) -> str:
    gpus = f"{len(placement.gpus)} GPU{'s' if len(placement.gpus) != 1 else ''} ({', '.join(placement.gpus)})" \
        if placement.gpus else "no GPU"
    return (f"{placement.cpu_slots} sanitizer process{'es' if placement.cpu_slots != 1 else ''} "
            f"({placement.threads} thread{'s' if placement.threads != 1 else ''} each, {usable_cores()} usable "
            f"cores), {gpus}")


__all__: List[str] = ["SanitizeTask", "BenchTask", "Task", "LocalPlacement", "run_task", "default_jobs",
                      "GPU_CHECKS_PER_GPU", "TaskSpan", "occupied_fraction",
                      "threads_per_child", "usable_cores", "describe"]

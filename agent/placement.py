"""Where evaluation work runs: the one seam between the loop and the machines.

The loop decides *what* to evaluate next; a placement decides *where* and runs it. A task is
plain data (a file path and op, or a benchmark spec), so the same tasks can later be shipped to
other machines; its result is a Verdict or a benchmark document. `LocalPlacement` runs each task
in child processes of this machine (sanitizer/runner.py, harness/bench_worker.py):

- CPU tasks (the interpreter's sanitizer stages) on `cpu_slots` threads, each driving one judge;
- GPU tasks on the visible GPUs, one child per GPU at a time, because two kernels sharing a GPU
  would time each other (and a GPU check beside a benchmark would disturb it).

`stop()` is the hard stop: no task starts after it, and every running child is killed at once.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union


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


@dataclass(frozen=True)
class BenchTask:
    """One benchmark (harness/bench_worker.py spec): candidate against incumbent on a bucket's shapes."""

    spec: Dict[str, Any]
    resource: str = "gpu"
    kind: str = "bench"


Task = Union[SanitizeTask, BenchTask]


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
    """Tasks on this machine: `cpu_slots` CPU tasks at once, and one GPU task per GPU in `gpus`
    (CUDA_VISIBLE_DEVICES entries)."""

    def __init__(self, cpu_slots: int, gpus: Sequence[str] = (), threads: Optional[int] = None):
        self.cpu_slots = max(1, cpu_slots)
        self.gpus = list(gpus)
        self.threads = threads or threads_per_child(self.cpu_slots)
        self._cpu = ThreadPoolExecutor(max_workers=self.cpu_slots, thread_name_prefix="ka-cpu")
        self._gpu = ThreadPoolExecutor(max_workers=max(1, len(self.gpus)), thread_name_prefix="ka-gpu")
        self._free: "queue.Queue[str]" = queue.Queue()
        for g in self.gpus:
            self._free.put(g)
        self._lock = threading.Lock()
        self._running = {"cpu": 0, "gpu": 0}
        self._log: List[Tuple[str, str, float, float]] = []  # (kind, resource, start, end) of every task
        self.stopped = False

    def slots(self, resource: str) -> int:
        return self.cpu_slots if resource == "cpu" else len(self.gpus)

    def submit(self, task: Task) -> "Future[Any]":
        resource = task.resource
        if resource == "gpu" and not self.gpus:
            raise ValueError("a GPU task on a placement without GPUs")
        with self._lock:
            self._running[resource] += 1
        pool = self._gpu if resource == "gpu" else self._cpu
        return pool.submit(self._run, task, resource)

    def _run(self, task: Task, resource: str) -> Any:
        t0 = time.time()
        gpu = None
        try:
            if self.stopped:
                raise ChildProcessError("stopped: no new task starts")
            # the children's thread pools share the cores out (torch reads these at import)
            env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
            if resource == "gpu":
                gpu = self._free.get()
                t0 = time.time()
                env["CUDA_VISIBLE_DEVICES"] = gpu
                env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
            return run_task(task, env)
        finally:
            with self._lock:
                self._running[resource] -= 1
                self._log.append((task.kind, resource, t0, time.time()))
            if gpu is not None:
                self._free.put(gpu)

    def log(self) -> List[Tuple[str, str, float, float]]:
        """(kind, resource, start, end) of every task run so far."""
        with self._lock:
            return list(self._log)

    def stop(self) -> None:
        """No new task starts; every running child is killed (their tasks return failed results)."""
        from ..sanitizer import runner
        self.stopped = True
        runner.stop_all()

    def close(self, wait: bool = True) -> None:
        from ..sanitizer import runner
        self._cpu.shutdown(wait=wait, cancel_futures=True)
        self._gpu.shutdown(wait=wait, cancel_futures=True)
        if self.stopped:
            runner.resume_starting()


def describe(placement: LocalPlacement) -> str:
    gpus = f"{len(placement.gpus)} GPU{'s' if len(placement.gpus) != 1 else ''} ({', '.join(placement.gpus)})" \
        if placement.gpus else "no GPU"
    return (f"{placement.cpu_slots} sanitizer process{'es' if placement.cpu_slots != 1 else ''} "
            f"({placement.threads} thread{'s' if placement.threads != 1 else ''} each, {usable_cores()} usable "
            f"cores), {gpus}")


__all__: List[str] = ["SanitizeTask", "BenchTask", "Task", "LocalPlacement", "run_task", "default_jobs",
                      "threads_per_child", "usable_cores", "describe"]

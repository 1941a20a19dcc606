"""Evaluation on a Ray cluster: the placement seam of agent/placement.py, with each task run on a node
of the cluster instead of in this machine's children. Imported only by `kernel-agent run --cluster`
(Ray is the optional extra `kernel-agent[cluster]`).

- CPU tasks (the interpreter's quick and full sanitizer stages) are Ray tasks of one CPU each; on its
  node each still runs `placement.run_task`, so the judge and the candidate run in their own sandboxed
  children there, exactly as on one machine.
- GPU tasks (GPU checks, benchmarks, promotion checks) are Ray tasks of one GPU (and one CPU, for the
  child that compiles and launches). Each holds its GPU for the whole task, ungated: the lease
  handshake of isolation/lease.py, which lets GPU checks share a GPU and a benchmark's start and
  compile hold none of it, is a conversation with this process and is not carried over the cluster.
  A GPU therefore runs one task at a time here, and a benchmark still has its GPU to itself.
- Nodes are told apart by their GPU model (Ray's `accelerator_type:<model>` resource): a run uses the
  GPUs of one model, so its buckets and promotions stay per GPU. Every GPU task's result says which
  GPU it ran on; one of another model is refused as a failed result.
- Candidate sources travel as text: the driver reads each file the task names and the node writes it
  to a scratch folder before running the task. The driver keeps the ledger, the proposer, the
  promotion rule and the serving set.

Faults: tasks are never retried by Ray (max_retries=0): one whose worker or node dies comes back as
`TaskLost`, which the loop queues again, so the candidate is neither judged on it nor lost. A task
over its time limit is cancelled (ray.cancel force=True) and comes back failed, as a child over its
limit does on one machine. `stop()` cancels every running task and starts no new one.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

import ray

from ..harness.env import gpu_name
from ..sanitizer.runner import DEFAULT_TIMEOUT
from ..sanitizer.verdict import Verdict
from . import placement
from .placement import SanitizeTask, Task, TaskLost, TaskSpan

# A module whose `run_task(task, env)` and `gpu_name()` the nodes use instead of this package's (set in
# the environment of `ray start`). Tests use it to stand in for GPU work on nodes without a GPU.
RUNNER_ENV = "KERNEL_AGENT_RAY_RUNNER"
# The benchmark child's own limit (harness/bench/bench_worker.py) and the sanitizer's per mode (sanitizer/runner.py)
BENCH_TIMEOUT_S = 900.0
# On top of the task's own limit: starting a Ray worker, moving the sources, the child's own teardown.
TIME_LIMIT_SLACK_S = 120.0
ACCELERATOR_PREFIX = "accelerator_type:"


# -- on the node -----------------------------------------------------------------------------------


def _runner():
    name = os.environ.get(RUNNER_ENV)
    if name:
        return importlib.import_module(name)
    return placement


def node_gpu_name() -> Optional[str]:
    """The name of the GPU this Ray worker was given (the name the ledger keys buckets by)."""
    runner = _runner()
    if hasattr(runner, "gpu_name"):
        return runner.gpu_name()
    return gpu_name()


def _gpu_slot() -> Optional[str]:
    ids = ray.get_gpu_ids()
    if not ids:
        return None
    return f"{ray.get_runtime_context().get_node_id()[:8]}:{ids[0]}"


def execute_on_node(task: Task, sources: Dict[str, str], threads: int) -> Dict[str, Any]:
    """Run one task on this node: write the sources it names (path -> text) to a scratch folder, point the
    task at them, and run it in this node's children. Returns the result and where it ran."""
    t0 = time.time()
    scratch = tempfile.mkdtemp(prefix="ka-ray-")
    try:
        local: Dict[str, str] = {}
        for i, (path, text) in enumerate(sorted(sources.items())):
            d = os.path.join(scratch, str(i))
            os.makedirs(d)
            local[path] = os.path.join(d, os.path.basename(path))
            with open(local[path], "w") as f:
                f.write(text)
            os.chmod(local[path], 0o644)  # readable by the sandbox identity whatever this process's umask
        slot = _gpu_slot()
        # the children's thread pools share the node's cores out; a GPU child needs one (as on one machine)
        n = "1" if slot else str(threads)
        env = dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n)
        result = _runner().run_task(_pointed_at(task, local), env)
        return {
            "result": result,
            "gpu": slot,
            "gpu_name": node_gpu_name() if slot else None,
            "start": t0,
            "end": time.time(),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _probe_gpu() -> Optional[str]:
    return node_gpu_name()


# -- the sources a task names, and the task pointed at copies of them ------------------------------


def task_sources(task: Task) -> Dict[str, str]:
    """The files a task reads (candidate, incumbent), as text: what travels to the node."""
    paths = [task.path] if isinstance(task, SanitizeTask) else task.spec.files()
    out = {}
    for p in paths:
        with open(p) as f:
            out[p] = f.read()
    return out


def _pointed_at(task: Task, local: Dict[str, str]) -> Task:
    if isinstance(task, SanitizeTask):
        return replace(task, path=local[task.path])
    return replace(task, spec=task.spec.with_files(local))


def _with_driver_paths(task: Task, result: Any) -> Any:
    """A verdict names the file it judged: the driver's, not the node's scratch copy."""
    if isinstance(task, SanitizeTask) and hasattr(result, "file"):
        result.file = os.path.abspath(task.path)
    return result


def failed_result(task: Task, why: str) -> Any:
    """A failed result of the task's kind (a verdict, or a benchmark document), as a child's fault gives."""
    if isinstance(task, SanitizeTask):
        return Verdict(os.path.abspath(task.path), task.op, task.mode, error=why)
    return {"results": [], "error": why}


def time_limit(task: Task) -> float:
    if isinstance(task, SanitizeTask):
        return DEFAULT_TIMEOUT[task.mode] + TIME_LIMIT_SLACK_S
    return BENCH_TIMEOUT_S + TIME_LIMIT_SLACK_S


# -- the cluster's shape ---------------------------------------------------------------------------


@dataclass
class Node:
    node_id: str
    address: str
    cpus: int
    gpus: int
    gpu_model: Optional[str]  # Ray's accelerator type (e.g. H200); None: GPUs of no declared model


def cluster_nodes() -> List[Node]:
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        models = [k[len(ACCELERATOR_PREFIX) :] for k in res if k.startswith(ACCELERATOR_PREFIX)]
        nodes.append(
            Node(
                n["NodeID"],
                n.get("NodeManagerAddress", "?"),
                int(res.get("CPU", 0)),
                int(res.get("GPU", 0)),
                models[0] if models else None,
            )
        )
    return nodes


def choose_gpu_model(nodes: List[Node], wanted: Optional[str] = None) -> Optional[str]:
    """The GPU model a run uses: `wanted`, else the model with the most GPUs in the cluster."""
    counts: Dict[Optional[str], int] = {}
    for n in nodes:
        if n.gpus:
            counts[n.gpu_model] = counts.get(n.gpu_model, 0) + n.gpus
    if wanted is not None:
        if wanted not in counts:
            raise ValueError(
                f"no node of the cluster has a {wanted} GPU (models: {', '.join(str(m) for m in counts) or 'none'})"
            )
        return wanted
    if not counts:
        return None
    return max(counts, key=lambda m: (counts[m], str(m)))


@dataclass
class _Running:
    task: Task
    future: "Future[Any]"
    resource: str
    submitted: float
    limit_s: float
    cancelled_for: Optional[str] = None  # why the placement cancelled it: "time limit" | "stop"


@dataclass
class _Shape:
    nodes: List[Node] = field(default_factory=list)
    gpu_model: Optional[str] = None
    gpus: List[str] = field(default_factory=list)  # one slot per GPU of the run's model: '<node>:<index>'
    cpus: int = 0


class RayPlacement:
    """Tasks on a Ray cluster (see the module's docstring). `address`: what `ray.init` connects to (`auto`,
    `ray://host:port`, `host:port`); `gpu_model`: the accelerator type to use where the cluster has
    several; `time_limits`: seconds per task kind, over the defaults (tests)."""

    remote = True  # the loop takes GPU and GPU name from the cluster, not from this machine

    def __init__(
        self,
        address: Optional[str] = None,
        gpu_model: Optional[str] = None,
        time_limits: Optional[Dict[str, float]] = None,
        poll_s: float = 0.2,
    ):
        self._ray = ray
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            ray.init(address=address or "auto", logging_level=logging.ERROR, log_to_driver=False)
        self.address = address or "auto"
        self.time_limits = dict(time_limits or {})
        self.poll_s = poll_s
        self._wanted_model = gpu_model
        self._lock = threading.Condition()
        self._tasks: Dict[Any, _Running] = {}  # ObjectRef -> what it is
        self._running = {"cpu": 0, "gpu": 0}
        self._log: List[TaskSpan] = []
        self.stopped = False
        self._closed = False
        self._shape = self._read_shape()
        self.gpu_name: Optional[str] = self._probe_gpu_name() if self._shape.gpus else None
        self._remote = ray.remote(execute_on_node)
        self._watcher = threading.Thread(target=self._watch, name="ka-ray-watch", daemon=True)
        self._watcher.start()

    # -- what the cluster offers -------------------------------------------------------------------
    def _read_shape(self) -> _Shape:
        nodes = cluster_nodes()
        model = choose_gpu_model(nodes, self._wanted_model)
        gpus = [f"{n.node_id[:8]}:{i}" for n in nodes if n.gpus and n.gpu_model == model for i in range(n.gpus)]
        cpus = sum(n.cpus for n in nodes)
        return _Shape(nodes, model, gpus, cpus)

    @property
    def gpus(self) -> List[str]:
        return list(self._shape.gpus)

    @property
    def gpu_model(self) -> Optional[str]:
        return self._shape.gpu_model

    @property
    def cpu_slots(self) -> int:
        """Sanitizer tasks at once: the cluster's CPUs, less one per GPU for its GPU task's child."""
        return max(1, self._shape.cpus - len(self._shape.gpus))

    @property
    def threads(self) -> int:
        return 1  # one CPU per Ray task: the child's thread pool stays inside it

    def _gpu_options(self) -> Dict[str, Any]:
        opts: Dict[str, Any] = {"num_gpus": 1, "num_cpus": 1, "max_retries": 0}
        if self._shape.gpu_model is not None:  # only on nodes of the run's GPU model
            opts["resources"] = {f"{ACCELERATOR_PREFIX}{self._shape.gpu_model}": 0.001}
        return opts

    def _probe_gpu_name(self) -> Optional[str]:
        """The full name of the run's GPU model (as the ledger and the serving set key it), asked of one
        of its nodes."""
        ray = self._ray
        ref = ray.remote(_probe_gpu).options(**self._gpu_options()).remote()
        try:
            name = ray.get(ref, timeout=300)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise RuntimeError("no GPU of the cluster answered within 300 s (all busy?)") from None
        if not name:  # every result would then be refused: say why now
            raise RuntimeError(
                "a GPU node of the cluster sees no CUDA device (TRITON_INTERPRET=1 in the "
                "environment of its `ray start`?)"
            )
        return name

    def describe(self) -> str:
        s = self._shape
        models = sorted({str(n.gpu_model) for n in s.nodes if n.gpus})
        gpus = (
            f"{len(s.gpus)} {self.gpu_name or s.gpu_model or 'GPU'} GPU{'s' if len(s.gpus) != 1 else ''}"
            if s.gpus
            else "no GPU"
        )
        other = [m for m in models if m != str(s.gpu_model)]
        return (
            f"Ray cluster at {self.address}: {len(s.nodes)} node{'s' if len(s.nodes) != 1 else ''}, "
            f"{s.cpus} CPUs, {gpus}; {self.cpu_slots} sanitizer task{'s' if self.cpu_slots != 1 else ''} at "
            f"once" + (f"; GPUs of other models left unused: {', '.join(other)}" if other else "")
        )

    # -- the seam ----------------------------------------------------------------------------------
    def can_start(self, task: Task) -> bool:
        with self._lock:
            if self.stopped:
                return False
            if task.resource == "cpu":
                return self._running["cpu"] < self.cpu_slots
            return self._running["gpu"] < len(self._shape.gpus)

    def running(self, resource: str) -> int:
        with self._lock:
            return self._running[resource]

    def submit(self, task: Task) -> "Future[Any]":
        fut: "Future[Any]" = Future()
        with self._lock:
            if self.stopped:
                fut.set_result(TaskLost("stopped: no new task starts"))
                return fut
            if task.resource == "gpu" and not self._shape.gpus:
                raise ValueError("a GPU task on a cluster without GPUs of the run's model")
            sources = task_sources(task)
            remote = self._remote
            if task.resource == "gpu":
                ref = remote.options(**self._gpu_options()).remote(task, sources, 1)
            else:
                ref = remote.options(num_cpus=1, max_retries=0).remote(task, sources, self.threads)
            self._tasks[ref] = _Running(
                task, fut, task.resource, time.time(), self.time_limits.get(task.kind, time_limit(task))
            )
            self._running[task.resource] += 1
            self._lock.notify_all()
        return fut

    def _watch(self) -> None:
        """Settle each task's future as it ends; cancel those over their time limit."""
        ray = self._ray
        while True:
            with self._lock:
                while not self._tasks and not self._closed:
                    self._lock.wait(1.0)
                if self._closed and not self._tasks:
                    return
                refs = list(self._tasks)
            try:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.poll_s)
            except Exception:  # the connection is gone (shut down, or the head died): nothing more settles
                self._abandon("the cluster connection was lost")
                return
            for ref in ready:
                self._settle(ref)
            now = time.time()
            with self._lock:
                late = [
                    (ref, r)
                    for ref, r in self._tasks.items()
                    if r.cancelled_for is None and now - r.submitted > r.limit_s
                ]
                for _, r in late:
                    r.cancelled_for = "time limit"
            for ref, _ in late:
                ray.cancel(ref, force=True)

    def _settle(self, ref) -> None:
        ray = self._ray
        with self._lock:
            r = self._tasks.get(ref)
        if r is None:
            return
        info: Optional[Dict[str, Any]] = None
        error: Optional[BaseException] = None
        try:
            info = ray.get(ref)
            result = _with_driver_paths(r.task, info["result"])
            if r.resource == "gpu" and info.get("gpu_name") != self.gpu_name:
                result = failed_result(r.task, f"ran on a {info.get('gpu_name')}, not the run's {self.gpu_name}")
        except ray.exceptions.TaskCancelledError:
            if r.cancelled_for == "time limit":
                result = failed_result(r.task, f"cancelled: over its time limit of {r.limit_s:.0f}s on the cluster")
            else:
                result = TaskLost("stopped")
        except ray.exceptions.RayTaskError as e:  # the stage function itself raised: as on one machine
            error = e.as_instanceof_cause()
            result = None
        except ray.exceptions.RayError as e:  # the worker or its node died, or the object went with it
            result = TaskLost(f"node lost ({type(e).__name__})")
        end = time.time()
        with self._lock:
            self._tasks.pop(ref, None)
            self._running[r.resource] -= 1
            start = info["start"] if info else r.submitted
            self._log.append(
                TaskSpan(
                    r.task.kind,
                    r.resource,
                    start,
                    info["end"] if info else end,
                    info.get("gpu") if info else None,
                    r.task.subject,
                )
            )
            self._lock.notify_all()
        if isinstance(result, TaskLost) and not self.stopped:
            self._refresh_shape()
        if error is not None:
            r.future.set_exception(error)
        else:
            r.future.set_result(result)

    def _refresh_shape(self) -> None:
        """A node went away: what is left is what the loop may start on (the GPU model stays the run's)."""
        try:
            nodes = cluster_nodes()
        except Exception:  # the cluster's state service itself is unreachable: keep the last shape
            return
        model = self._shape.gpu_model
        gpus = [f"{n.node_id[:8]}:{i}" for n in nodes if n.gpus and n.gpu_model == model for i in range(n.gpus)]
        with self._lock:
            self._shape = _Shape(nodes, model, gpus, sum(n.cpus for n in nodes))

    def log(self) -> List[TaskSpan]:
        with self._lock:
            return list(self._log)

    def stop(self) -> None:
        """No new task starts; every running one is cancelled (its worker killed): they come back as
        `TaskLost`, not as verdicts."""
        with self._lock:
            self.stopped = True
            refs = list(self._tasks)
            for ref in refs:
                if self._tasks[ref].cancelled_for is None:
                    self._tasks[ref].cancelled_for = "stop"
        for ref in refs:
            self._ray.cancel(ref, force=True)

    def _abandon(self, why: str) -> None:
        """Settle every task still open as lost (the connection to the cluster is gone)."""
        with self._lock:
            left = list(self._tasks.values())
            self._tasks.clear()
            for r in left:
                self._running[r.resource] -= 1
            self._lock.notify_all()
        for r in left:
            if not r.future.done():
                r.future.set_result(TaskLost(why))

    def close(self, wait: bool = True) -> None:
        """Cancel what still runs and, where this placement opened the connection, close it (after the
        cancelled tasks have settled, or a short grace)."""
        self.stop()
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._watcher.join(timeout=30 if wait else 5)
        if self._owns_connection:
            self._ray.shutdown()


__all__ = [
    "RayPlacement",
    "execute_on_node",
    "cluster_nodes",
    "choose_gpu_model",
    "task_sources",
    "failed_result",
    "time_limit",
    "RUNNER_ENV",
    "Node",
]

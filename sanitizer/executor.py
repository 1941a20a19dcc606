"""The sandboxed process that imports and runs one candidate, and the judge's handle on it.

The judge (sanitizer/worker.py, trusted: it never imports candidate code) starts an
executor per candidate: `python -m kernel_agent.sanitizer.executor --fd N ...`. The
executor enters the sandbox (isolation/sandbox.py) before it reads anything, checks the
file against the static gate again, imports it, and then serves calls over a socket
(sanitizer/wire.py): the judge sends a case's tensors and how to instrument the call
(bounds, program order, FpSan, allocation sentinel), the executor runs the candidate in
the Triton interpreter (or on the GPU) and returns what it saw: the outputs, the bounds
and host-code violations, the number of launches, which inputs the call changed
and what the sandbox refused. The judge decides; nothing the executor says is a verdict.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from .. import sanitizer  # the package door: sanitizer.wire loads wire (and torch) on first use, as the judge needs
from ..isolation import sandbox
from ..isolation.sandbox import REFUSED_EXIT
from .canonical import TextRefused, judge_text

PROTOCOL = 1


# -- the sandboxed side -----------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The sandboxed child, in order: enter the sandbox, import the trusted code (torch, the sanitizer's own
    modules, Triton's interpreter or the GPU's libraries), arm the audit hook, gate and import the candidate,
    then serve the judge's calls until it says exit or hangs up."""
    args = _arguments(argv)
    limits = sandbox.Limits(memory_bytes=int(args.memory_gib * (1 << 30)) or None, cpu_seconds=args.cpu_seconds or None)
    first, _, last = args.tool_ports.partition("-")
    tool_ports = range(int(first), int(last or first) + 1) if first else range(0)
    prot = sandbox.enter(
        os.environ.get("KA_SANDBOX_SCRATCH", os.getcwd()),
        gpu=args.device == "cuda",
        limits=limits,
        tool_ports=tool_ports,
    )
    sock = socket.socket(fileno=args.fd)
    import torch  # deferred: the trusted imports happen inside the sandbox, before the hook is armed

    from . import wire  # deferred: inside the sandbox
    from .branches import BranchRecorder  # deferred: inside the sandbox
    from .execution import describe_exception, execute_call, load_module  # deferred: inside the sandbox
    from .guard import HostGuard  # noqa: F401 - deferred: inside the sandbox
    from .host_probe import run_at, warm  # deferred: inside the sandbox
    from .kernel_branches import KernelRecorder  # deferred: inside the sandbox
    from .static_gate import check_source  # deferred: inside the sandbox

    trusted = _Trusted(torch, wire, BranchRecorder, KernelRecorder, check_source, load_module, execute_call, run_at)
    if args.device == "cpu":
        import triton.runtime.interpreter  # noqa: F401 - deferred: inside the sandbox, TRITON_INTERPRET set

        warm()  # the modules a fake tensor imports on first use, imported before the hook refuses an import
    else:
        sandbox.prepare_gpu()  # what torch and Triton do through ctypes, done before the hook refuses it
        if args.gpu_memory_gib > 0:  # RLIMIT_AS cannot bound device memory; torch's allocator can
            _cap_gpu_memory(torch, args.gpu_memory_gib)
    sandbox.arm_audit_hook()  # fatal: the first refused action ends this process (exit 86)

    hello: Dict[str, Any] = {"protocol": PROTOCOL, "sandbox": prot.active, "missing": prot.missing}
    try:
        loaded = _load_candidate(args, trusted)
        hello["signature"] = _signature(loaded.fn)
    except BaseException as e:  # noqa: BLE001 - whatever the import did is evidence
        hello["load_error"] = describe_exception(e, args.file)
        hello["violations"] = _started_processes()
        wire.send(sock, hello)
        return 0
    hello["violations"] = _started_processes()
    wire.send(sock, hello)
    return _Served(args, sock, trusted, loaded).serve()


def _arguments(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--op", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cpu-seconds", type=int, default=0)
    ap.add_argument("--memory-gib", type=float, default=8.0)
    ap.add_argument("--gpu-memory-gib", type=float, default=0.0, help="a cap on the caching allocator (0: none)")
    ap.add_argument("--skip-gate", action="store_true")
    ap.add_argument("--tool-ports", default="", help="FIRST-LAST: TCP ports of a wrapping tool's front end")
    return ap.parse_args(argv)


def _started_processes() -> List[str]:
    """What the sandbox saw of the candidate between calls: processes it started in its namespace."""
    procs = sandbox.foreign_processes()
    return [f"the candidate started processes (pids {procs[:5]} in its namespace)"] if procs else []


class _Trusted(NamedTuple):
    """The trusted code the child uses once the audit hook is armed, bound by main before it and before the
    candidate's code first runs."""

    torch: Any
    wire: Any
    BranchRecorder: Any
    KernelRecorder: Any
    check_source: Callable
    load_module: Callable
    execute_call: Callable
    run_at: Callable  # host_probe.run_at: the host code at a serving size, on fake tensors


class _Loaded(NamedTuple):
    fn: Any  # the candidate's entry point
    recorder: Any  # its host-code branches (branches.BranchRecorder)
    indicators: Any  # its kernel-body branches and min/max indicators (kernel_branches.KernelRecorder)


def _load_candidate(args: argparse.Namespace, t: _Trusted) -> _Loaded:
    """The candidate gated again and imported, with the executor's own branch recorders installed before its code
    first runs."""
    with open(args.file) as f:
        source = f.read()
    if not args.skip_gate:
        gate = t.check_source(source, args.op)
        if not gate.passed:
            raise ImportError(f"the static gate rejects the file: {gate.describe()}")
    # the branch recorder is the executor's own, installed before the candidate's code first runs
    recorder = t.BranchRecorder(os.path.abspath(args.file))
    indicators = t.KernelRecorder(os.path.abspath(args.file))
    cpu = args.device == "cpu"
    if cpu:
        indicators.install_interpreter()  # kernel bodies run as Python only in the interpreter
    recorder.install()
    try:
        # the recording `min`/`max` only where kernels run as Python: Triton's compiler resolves a kernel's `min`
        # in the module's globals before its builtins, and a Python function there breaks every native compile
        # of a kernel that calls `min` (the GPU stage judges host jumps alone: sanitizer/gpu.py)
        fn = t.load_module(args.file, args.op, prepare=indicators.prepare_module if cpu else None)
    finally:
        sys.settrace(None)
    return _Loaded(fn, recorder, indicators)


class _Served:
    """The judge's requests to the loaded candidate, answered one at a time (sanitizer/wire.py): calls, the
    digests of a kept call's outputs, the coverage so far, a reset between checks."""

    def __init__(self, args: argparse.Namespace, sock: socket.socket, trusted: _Trusted, loaded: _Loaded) -> None:
        self.args = args
        self.sock = sock
        self.t = trusted
        self.loaded = loaded
        self.cases: Dict[str, Dict[str, Any]] = {}
        self.pristine: Dict[str, Dict[str, Any]] = {}  # a case's inputs as they arrived, where the judge asked
        self.kept: Dict[int, List[Any]] = {}
        self.specs: Dict[str, None] = {}  # every specialisation launched, in order
        self.calls = 0

    def serve(self) -> int:
        wire = self.t.wire
        while True:
            try:
                req, tensors = wire.recv(self.sock, device=self.args.device)
            except wire.WireError:
                return 0
            cmd = req.get("cmd")
            if cmd == "exit":
                return 0
            if cmd == "call":
                self.call(req, tensors)
            else:
                wire.send(self.sock, self.answer(cmd, req))

    def answer(self, cmd: Any, req: Dict[str, Any]) -> Dict[str, Any]:
        """The answer to a request other than a call."""
        torch, wire = self.t.torch, self.t.wire
        if cmd == "reset":
            self.cases.clear()
            self.pristine.clear()
            self.kept.clear()
            return {"ok": True}
        if cmd == "digests":
            outs = self.kept.get(wire.as_int(req.get("call"), -1))
            return {
                "digests": None
                if outs is None
                else [wire.digest(t) if isinstance(t, torch.Tensor) else None for t in outs]
            }
        if cmd == "coverage":  # the host-code branches taken and the specialisations launched, over all calls
            return {"arcs": self.loaded.recorder.evidence()[:20000], "specs": list(self.specs)[:2000]}
        if cmd == "indicators":  # the kernel-body branches and host min/max indicators taken, over all calls
            return {"hits": self.loaded.indicators.evidence()[:20000]}
        if cmd == "probe" and self.args.device == "cpu":  # the host code at a serving size (host_probe.py)
            hits = set(self.loaded.indicators.hits)  # no verified call: what it takes is not coverage
            try:
                return {
                    "results": [
                        self.t.run_at(
                            self.loaded.fn,
                            wire.optional_list(p.get("args")) or [],
                            self.args.file,
                            "cuda" if p.get("device") == "cuda" else "cpu",
                            wire.as_int(p.get("sms")),
                        )
                        for p in wire.optional_list(req.get("points")) or []
                        if isinstance(p, dict)
                    ]
                }
            finally:
                self.loaded.indicators.hits = hits
        return {"error": "unknown command"}

    def call(self, req: Dict[str, Any], tensors: List[Any]) -> None:
        """One call of the candidate on the judge's tensors, instrumented as asked; the evidence goes back."""
        torch, wire, args = self.t.torch, self.t.wire, self.args
        self.calls += 1
        case_id = str(req.get("case"))
        if req.get("again"):  # the case's inputs once more, from the copy kept as they arrived: nothing was sent
            kept = self.pristine.get(case_id)
            if kept is None or case_id not in self.cases:
                missing = "internal: `again` for a case whose inputs were not kept"
                wire.send(self.sock, {"call": self.calls, "error": missing, "outputs": None})
                return
            for n, t in kept.items():
                self.cases[case_id][n].copy_(t)
            call_args = {k: self.cases[case_id][k] for k in req["order"]}
        else:
            call_args = _bind_tensors(torch, req, tensors, self.cases)
            if req.get("keep_inputs"):
                self.pristine[case_id] = {n: call_args[n].clone() for n in req["tensor_names"]}
        readable = dict(zip(req.get("readable", []), tensors[len(req["tensor_names"]) :]))
        opts = req.get("opts", {})
        res = self.t.execute_call(
            self.loaded.fn, call_args, readable, args.file, device=args.device, recorder=self.loaded.recorder, **opts
        )
        self.specs.update(dict.fromkeys(res.specs))
        outs = list(res.out) if isinstance(res.out, (tuple, list)) else [res.out]
        if req.get("keep"):
            self.kept[self.calls] = outs
        out_tensors = [
            t.detach().cpu() if t.device.type != "cpu" else t.detach() for t in outs if isinstance(t, torch.Tensor)
        ]
        # the inputs as the call left them, for a parent that checksums them itself (the serving guard)
        returned = [call_args[n].detach().cpu() for n in req["tensor_names"]] if req.get("return_inputs") else []
        wire.send(
            self.sock,
            {
                "call": self.calls,
                "error": res.error,
                "bounds": res.bounds[:5],
                "guard": res.guard[:5],
                "launches": res.launches,
                "fpsan_unsupported": res.fpsan_unsupported[:5],
                "specs": res.specs[:50],
                "outputs": [("tensor" if isinstance(t, torch.Tensor) else type(t).__name__) for t in outs]
                if res.out is not None
                else None,
                "tuple": isinstance(res.out, (tuple, list)),
                "mutated": res.mutated[:10],
                "elapsed_s": res.elapsed_s,
                "returned_inputs": len(returned),
                "violations": _started_processes(),
            },
            out_tensors + returned,
        )


def _cap_gpu_memory(torch: Any, gib: float) -> None:
    """Bound what this process's caching allocator may hold on its GPU to `gib` (an allocation past it raises
    torch's out-of-memory error), so that a candidate's allocation cannot starve the GPU's other processes.
    `torch`: the module, which the sandboxed side loads inside its sandbox (main)."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * (1 << 30) / total))


def _signature(fn) -> List[List[Any]]:
    return [
        [p.name, int(p.kind), p.default is not inspect.Parameter.empty]
        for p in inspect.signature(fn).parameters.values()
    ]


def _bind_tensors(torch: Any, req, tensors, cases):
    """The call's arguments: a new case, or the same buffers again with the judge's new contents
    (the judge reuses a case's tensors exactly where it did in one process: recycled buffers). `torch`: the
    module, which the sandboxed side loads inside its sandbox (main)."""
    names = req["tensor_names"]
    case_id = str(req.get("case"))
    fresh = dict(zip(names, tensors[: len(names)]))  # already on the device, in the judge's exact layout
    old = cases.get(case_id)
    if old is not None and all(
        isinstance(old.get(n), torch.Tensor)
        and old[n].shape == fresh[n].shape
        and old[n].untyped_storage().nbytes() == fresh[n].untyped_storage().nbytes()
        for n in names
    ):
        for n in names:
            old[n].untyped_storage().copy_(fresh[n].untyped_storage())
        args = old
    else:
        args = dict(fresh)
        cases[case_id] = args
    for k, v in req.get("values", {}).items():
        args[k] = v
    return {k: args[k] for k in req["order"]}


# -- the judge's side -------------------------------------------------------------------------


class ExecutorError(Exception):
    """The executor died, broke the protocol or did not answer in time: a verdict, not an outage."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def _write_judged_copy(path: str, dest: str, skip_gate: bool) -> None:
    """Write the executor's own copy of the candidate at dest (inside its scratch directory): the canonical
    text, which is what the gate judged (Python and Triton read no other bytes of the file). A text that has
    no canonical form raises TextRefused, unless skip_gate."""
    with open(path, "rb") as src:
        raw = src.read()
    try:
        text = judge_text(raw).text.encode("utf-8")
    except TextRefused:
        if not skip_gate:
            raise
        text = raw  # tests only: the layers behind the gate are shown the file as it is
    with open(dest, "wb") as dst:
        dst.write(text)
    os.chmod(dest, 0o644)  # readable by the sandbox identity whatever this process's umask


def _executor_command(
    fd: int,
    op: str,
    file: str,
    device: str,
    cpu_s: int,
    skip_gate: bool,
    tool_ports: Sequence[int],
    wrapper: Sequence[str],
    memory_gib: Optional[float] = None,
    gpu_memory_gib: Optional[float] = None,
) -> List[str]:
    """The executor's command line: it serves calls over the socket fd, under a CPU-time limit of cpu_s."""
    cmd = [
        sys.executable,
        "-m",
        "kernel_agent.sanitizer.executor",
        "--fd",
        str(fd),
        "--op",
        op,
        "--file",
        file,
        "--device",
        device,
        "--cpu-seconds",
        str(cpu_s),
    ]
    if memory_gib:
        cmd.append(f"--memory-gib={memory_gib:g}")
    if gpu_memory_gib:
        cmd.append(f"--gpu-memory-gib={gpu_memory_gib:g}")
    if skip_gate:
        cmd.append("--skip-gate")
    if tool_ports:
        cmd.append(f"--tool-ports={min(tool_ports)}-{max(tool_ports)}")
    if wrapper:
        # the tool and the executor in namespaces of their own: the tool's ports on their loopback alone
        cmd = sandbox.tool_namespace_command(list(wrapper) + cmd)
    return cmd


class Executor:
    """A sandboxed executor for one candidate file, driven by the judge."""

    def __init__(
        self,
        path: str,
        op: str,
        device: str = "cpu",
        deadline: Optional[float] = None,
        skip_gate: bool = False,
        wrapper: Sequence[str] = (),
        env_extra: Optional[Dict[str, str]] = None,
        tool_ports: Sequence[int] = (),
        memory_gib: Optional[float] = None,
        gpu_memory_gib: Optional[float] = None,
    ):
        """`memory_gib`: the child's address space (default 8 GiB; not applied on a GPU, where CUDA reserves
        huge ranges); `gpu_memory_gib`: a cap on what it may allocate on the GPU (default none)."""
        self.path, self.op, self.device = path, op, device
        self.deadline = deadline or (time.time() + 600)
        self.scratch = sandbox.make_scratch("ka-exec-")
        self.file = os.path.join(self.scratch, "candidate.py")
        try:
            _write_judged_copy(path, self.file, skip_gate)
        except TextRefused:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        parent, child = socket.socketpair()
        self.sock = parent
        self.log_path = os.path.join(sandbox.make_scratch("ka-exec-log-"), "executor.log")
        env = sandbox.child_env(self.scratch, env_extra)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        else:
            env.pop("TRITON_INTERPRET", None)
        cpu_s = max(30, int(self.deadline - time.time()) + 30)
        cmd = _executor_command(
            child.fileno(), op, self.file, device, cpu_s, skip_gate, tool_ports, wrapper, memory_gib, gpu_memory_gib
        )
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.scratch,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(child.fileno(),),
                start_new_session=True,
            )
        child.close()
        self.calls = 0
        self.hello: Dict[str, Any] = {}
        self.violations: List[str] = []
        self._case_ids = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Dict[str, Any]:
        """Wait for the executor to import the candidate; its hello names the sandbox and the signature."""
        self.hello, _ = self._recv()
        self.violations = sanitizer.wire.strings(self.hello.get("violations"))
        return self.hello

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.sock.settimeout(1.0)
                sanitizer.wire.send(self.sock, {"cmd": "exit"})
                self.proc.wait(timeout=2)
            except (OSError, sanitizer.wire.WireError, subprocess.TimeoutExpired):
                pass
        self.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.sock.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(os.path.dirname(self.log_path), ignore_errors=True)

    def finish(self, timeout_s: float = 60.0):
        """Ask the executor to exit and wait for it; (exit code or None, the tail of its output). For the
        tools that wrap it (compute-sanitizer reports when the process ends)."""
        try:
            self.sock.settimeout(5.0)
            sanitizer.wire.send(self.sock, {"cmd": "exit"})
        except (OSError, sanitizer.wire.WireError):
            pass
        try:
            rc: Optional[int] = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, self.log_tail(16000)

    def log_tail(self, limit: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def death(self) -> str:
        """Why the executor stopped answering, for the verdict."""
        try:
            rc = self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.kill()
            return "the candidate's process stopped answering"
        lines = [ln for ln in self.log_tail(2000).splitlines() if ln.strip()]
        tail = lines[-1][:200] if lines else ""
        if rc == REFUSED_EXIT:
            refused = next((ln for ln in reversed(lines) if ln.startswith("sandbox refused:")), "")
            return f"the sandbox refused an action of the candidate and ended it: {refused[17:].strip()[:200]!r}"
        if rc < 0 or rc >= 128:
            sig = -rc if rc < 0 else rc - 128
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            what = f"the candidate's process was killed by {name}"
        else:
            what = f"the candidate's process exited with code {rc}"
        return what + (f": {tail!r}" if tail else "")

    # -- calls -----------------------------------------------------------------------------
    def _recv(self, max_payload: int = 1 << 20):
        """The executor's next message; `max_payload` bounds what the judge will allocate for it."""
        left = self.deadline - time.time()
        if left > 0:
            self.sock.settimeout(left)
            try:
                return sanitizer.wire.recv(self.sock, device="cpu", max_payload=max_payload)
            except sanitizer.wire.WireError as e:
                if time.time() < self.deadline:
                    raise ExecutorError(f"{self.death()} ({e})") from None
        self.kill()
        raise ExecutorError("the candidate did not answer within the time limit", timed_out=True)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the outer process; the PID namespace takes the rest
        except (ProcessLookupError, PermissionError):
            pass

    def _send(self, header, tensors=()):
        self.sock.settimeout(max(1.0, self.deadline - time.time()))
        try:
            sanitizer.wire.send(self.sock, header, tensors)
        except (OSError, sanitizer.wire.WireError) as e:
            raise ExecutorError(f"{self.death()} ({e})") from None

    def reset(self) -> None:
        self._send({"cmd": "reset"})
        self._recv()

    def call(
        self,
        case,
        *,
        bounds: bool = True,
        order: str = "natural",
        seed: int = 0,
        fpsan: bool = False,
        sentinel: int = 0,
        readable: Optional[Dict[str, Any]] = None,
        keep: bool = False,
        return_inputs: bool = False,
        keep_inputs: bool = False,
        again: bool = False,
    ):
        """Run the candidate on a case; returns the evidence as a RunResult (outputs on the CPU). With
        `return_inputs`, the executor also sends its copies of the tensor inputs back as the call left them
        (RunResult.returned_inputs), for a caller that checksums them itself. `keep_inputs`: the executor keeps a
        copy of the inputs as they arrived, on their device; `again`: the case is run once more on that copy,
        and nothing is sent (gigabytes for a serving shape, a call after call of the determinism check)."""
        import torch  # deferred: the judge starts its executor before it loads torch (worker.py)

        if not hasattr(case, "_executor_id"):
            self._case_ids += 1
            case._executor_id = self._case_ids
        tensors = {k: v for k, v in case.args.items() if isinstance(v, torch.Tensor)}
        values = {k: v for k, v in case.args.items() if not isinstance(v, torch.Tensor)}
        readable = readable or {}
        if again and readable:
            raise ValueError("`again` sends nothing: a call with readable masks must send its case")
        payload = [] if again else [v.cpu() for v in tensors.values()] + [m.cpu() for m in readable.values()]
        self._send(
            {
                "cmd": "call",
                "case": case._executor_id,
                "order": list(case.args),
                "tensor_names": list(tensors),
                "values": values,
                "readable": list(readable),
                "keep": keep,
                "return_inputs": return_inputs,
                "keep_inputs": keep_inputs,
                "again": again,
                "opts": {"bounds": bounds, "order": order, "seed": seed, "fpsan": fpsan, "sentinel": sentinel},
            },
            payload,
        )
        # outputs are never larger than a few times the inputs: a bigger answer is refused unread
        sent = sum(v.untyped_storage().nbytes() for v in tensors.values()) + sum(
            m.untyped_storage().nbytes() for m in readable.values()
        )
        reply, outs = self._recv(max_payload=4 * sent + (64 << 20))
        self.calls += 1
        self.violations = sanitizer.wire.strings(reply.get("violations"))
        res = _evidence(reply, outs, list(tensors), return_inputs)
        if self.violations and not res.error:
            res.error = f"the sandbox refused: {self.violations[0]}"
        return res

    def probe(self, points: List[Dict[str, Any]], timeout_s: float) -> List[Any]:
        """The candidate's host code on serving-size points' fake tensors (host_probe.Point.wire; CPU executors
        only), one answer each: what it raised, allocated and launched. No answer within `timeout_s` ends the
        executor."""
        self._send({"cmd": "probe", "points": points})
        deadline = self.deadline
        self.deadline = min(deadline, time.time() + timeout_s)
        try:
            reply, _ = self._recv()
        finally:
            self.deadline = deadline
        return sanitizer.wire.optional_list(reply.get("results")) or []

    def coverage(self):
        """(arcs, specialisations): the host-code branches the candidate's calls took (branches.Arc lists) and
        the specialisations they launched, over every call so far. Evidence: the judge decides."""
        self._send({"cmd": "coverage"})
        reply, _ = self._recv()
        arcs = [
            a for a in (sanitizer.wire.optional_list(reply.get("arcs")) or []) if isinstance(a, list) and len(a) == 4
        ]
        return arcs, sanitizer.wire.strings(reply.get("specs"), 2000)

    def indicator_coverage(self) -> List[list]:
        """The kernel-body branches and host min/max indicators the candidate's calls took
        (sanitizer/kernel_branches.py: Hit lists), over every call so far. Evidence: the judge decides."""
        self._send({"cmd": "indicators"})
        reply, _ = self._recv()
        return [
            h for h in (sanitizer.wire.optional_list(reply.get("hits")) or []) if isinstance(h, list) and len(h) == 4
        ]

    def output_digests(self, handle: int) -> Optional[List[Optional[str]]]:
        self._send({"cmd": "digests", "call": handle})
        reply, _ = self._recv()
        return sanitizer.wire.optional_list(reply.get("digests"))


def _evidence(reply: Dict[str, Any], outs: List[Any], tensor_names: List[str], return_inputs: bool):
    """The executor's answer to a call as a RunResult: its outputs, what it saw, and (with `return_inputs`)
    its copies of the inputs, sent after the outputs."""
    res = sanitizer.execution.RunResult()
    res.handle = sanitizer.wire.as_int(reply.get("call"))
    res.error = sanitizer.wire.text(reply.get("error"), 400)
    res.bounds = sanitizer.wire.strings(reply.get("bounds"))
    res.guard = sanitizer.wire.strings(reply.get("guard"))
    res.launches = sanitizer.wire.as_int(reply.get("launches"))
    res.fpsan_unsupported = sanitizer.wire.strings(reply.get("fpsan_unsupported"))
    res.specs = sanitizer.wire.strings(reply.get("specs"))
    res.mutated = [k for k in sanitizer.wire.strings(reply.get("mutated")) if k in tensor_names]
    res.elapsed_s = sanitizer.wire.seconds(reply.get("elapsed_s"))  # the serving guard holds it to a limit
    n_back = min(len(outs), sanitizer.wire.as_int(reply.get("returned_inputs"))) if return_inputs else 0
    if n_back:
        outs, back = outs[: len(outs) - n_back], outs[len(outs) - n_back :]
        res.returned_inputs = dict(zip(tensor_names, back))
    kinds = sanitizer.wire.optional_list(reply.get("outputs"))
    if kinds is not None:
        it = iter(outs)
        vals = [next(it, None) if k == "tensor" else f"<{sanitizer.wire.text(k, 40)}>" for k in kinds]
        res.out = tuple(vals) if reply.get("tuple") else (vals[0] if vals else None)
    return res


if __name__ == "__main__":
    sys.exit(main())

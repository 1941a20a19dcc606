"""Try each way out of the GPU sandbox, and check that a legitimate GPU kernel still runs in it.

    PYTHONPATH=. python3 scripts/gpu_sandbox_probe.py [--cpu] [--quick]

A candidate-like child enters the sandbox as the GPU checks' executor does
(isolation/sandbox.py: `enter(gpu=True)`, torch and Triton imported, `prepare_gpu`, the audit
hook armed) and tries each escape. Each attempt is made in three places:

* executor: the executor's sandbox with the audit hook armed (record-only here, so that every
  attempt is seen; the executor's own hook ends the process at the first refusal);
* below the hook: the same sandbox with the hook left unarmed, as a candidate that got past
  it would be: only the kernel's layers (namespaces, Landlock, seccomp) stand;
* tool namespace: below the hook again, inside the namespaces compute-sanitizer and the
  executor it wraps share (`tool_namespace_command`), with the tool's ports 49152-49167 open to
  Landlock.

The host side listens where an escape would arrive (TCP on loopback, TCP on 0.0.0.0 at a port
of the tool's range, UDP on loopback) and plants a world-readable canary file outside every
folder the sandbox may read. An attempt escaped when its syscall succeeded (a read returned the
canary, a connect connected, a datagram was sent) or a host listener heard from it.

Legitimate work, which must still succeed: a tiny Triton kernel on CUDA in the executor's
sandbox with the fatal hook and in the tool namespace, under compute-sanitizer memcheck (when
installed), the GPU checks on the quantize_kv baseline, and a benchmark child timing it and its
torch.compile anchor with nothing refused. When the kernel fails in the executor's sandbox, the
probe finds which layer is in the way (and, for reads, which top-level folder).

--cpu: no GPU (a CPU machine): the escapes only. --quick: skip the GPU checks and the benchmark.
Prints a table last; exits 1 when any attempt escaped or any legitimate run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

from kernel_agent.isolation import sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOOL_PORTS = (49152, 49168)  # compute-sanitizer's range (sanitizer/gpu.py)

# The child: written into its own scratch directory (the one place it may read besides the system's),
# run as `python child.py CONFIG_JSON`. Triton needs the kernel's source in a file.
CHILD = r"""
import json, os, socket, sys, threading
config = json.loads(sys.argv[1])
from kernel_agent.isolation import sandbox
for patch in config.get("patches", []):
    exec(patch)  # the probe's own diagnosis variants (a layer loosened), never a candidate's text
tool_ports = range(*config["tool_ports"]) if config.get("tool_ports") else ()
prot = sandbox.enter(os.getcwd(), gpu=True, tool_ports=tool_ports)
import torch
import triton
import triton.language as tl
sandbox.prepare_gpu()
if config.get("hook") == "fatal":
    sandbox.arm_audit_hook(fatal=True)
elif config.get("hook") == "record":
    sandbox.arm_audit_hook(fatal=False)
result = {"active": prot.active, "missing": prot.missing}


@triton.jit
def _add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def legit():
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    _add_one[(triton.cdiv(1000, 256),)](x, y, 1000, BLOCK=256)
    torch.cuda.synchronize()
    ok = bool(torch.equal(y, x + 1))
    return ["ran" if ok else "wrong result", f"{torch.cuda.get_device_name()}, {y.sum().item():.0f}"]


def outcome(fn):
    try:
        detail = fn()
        return ["succeeded", str(detail)[:80]]
    except PermissionError as e:
        if str(e).startswith("sandbox:"):
            return ["refused", "hook: " + str(e)[9:70]]
        return ["refused", f"errno {e.errno} ({os.strerror(e.errno) if e.errno else e})"]
    except OSError as e:
        return ["refused", f"errno {e.errno} ({os.strerror(e.errno) if e.errno else e})"]
    except Exception as e:  # noqa: BLE001 - anything else that stopped the attempt is a refusal to report
        return ["refused", f"{type(e).__name__}: {str(e)[:60]}"]


def read(path):
    with open(path, "rb") as f:
        return f.read(64).decode(errors="replace").strip()


def write(path, data):
    fd = os.open(path, os.O_WRONLY)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def ctypes_call():
    import ctypes
    return ctypes.CDLL(None).getpid()


def udp(addr):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(config["marker"].encode(), addr)


def tcp(addr):
    with socket.create_connection(addr, timeout=4) as s:
        s.sendall(config["marker"].encode())
        return "connected"


def thread_name():
    return write(f"/proc/self/task/{threading.get_native_id()}/comm", b"renamed")


attempts = {
    "ctypes": ctypes_call,
    "read_canary": lambda: read(config["canary"]),
    "read_shadow": lambda: read("/etc/shadow"),
    "read_git": lambda: read(config["git"]),
    "write_proc": lambda: write("/proc/self/oom_score_adj", b"500"),
    "write_thread_name": thread_name,
    "udp_loopback": lambda: udp(("127.0.0.1", config["udp_port"])),
    "udp_outside": lambda: udp(("8.8.8.8", 53)),
    "tcp_loopback": lambda: tcp(("127.0.0.1", config["tcp_port"])),
    "tcp_tool_port_outward": lambda: tcp((config["outward"], config["tool_port"])) if config["outward"] else
        (_ for _ in ()).throw(OSError(0, "this host has no address but loopback")),
    "tcp_outside": lambda: tcp(("1.1.1.1", 443)),
}
for name in config.get("attempts", []):
    result[name] = outcome(attempts[name])
if config.get("legit"):
    result["legit"] = legit()
print("PROBE-RESULT " + json.dumps(result), flush=True)
"""

# (key, what is tried, in which places it counts: the hook alone can refuse ctypes, and the kernel grants
# this process's thread names to the CUDA driver, so there only the hook counts)
ATTEMPTS = [
    ("ctypes", "ctypes: load libc, call getpid", ("executor",)),
    # reads are not confined on a GPU, and its own /proc is writable there, below the hook (isolation/sandbox.py
    # _landlock: the narrower rules failed CUDA's initialisation on the H200): these rows are shown, not counted,
    # except where the hook or file permissions still refuse them
    ("read_canary", "read a world-readable file outside (GPU: allowed)", ()),
    ("read_shadow", "read /etc/shadow", ("executor", "below hook", "tool ns")),
    ("read_git", "read the repository's .git (GPU: allowed)", ()),
    ("write_proc", "write /proc/self/oom_score_adj", ("executor",)),
    ("write_thread_name", "write a thread name (CUDA's grant)", ("executor",)),
    ("udp_loopback", "UDP sendto 127.0.0.1", ("executor", "below hook", "tool ns")),
    ("udp_outside", "UDP sendto 8.8.8.8:53", ("executor", "below hook", "tool ns")),
    ("tcp_loopback", "TCP connect 127.0.0.1 (host listener)", ("executor", "below hook", "tool ns")),
    ("tcp_tool_port_outward", "TCP connect tool port, host address", ("executor", "below hook", "tool ns")),
    ("tcp_outside", "TCP connect 1.1.1.1:443", ("executor", "below hook", "tool ns")),
]
PLACES = {
    "executor": {"hook": "record"},
    "below hook": {"hook": None},
    "tool ns": {"hook": None, "tool_ports": TOOL_PORTS, "namespace": True},
}


class Listeners:
    """Where an escape would arrive on the host: TCP on loopback, TCP on every address at a port of the
    tool's range, UDP on loopback. Each records what it heard."""

    def __init__(self):
        self.heard: Dict[str, List[bytes]] = {"tcp_loopback": [], "tcp_tool_port_outward": [], "udp_loopback": []}
        self.tcp_lo = self._tcp("127.0.0.1", 0)
        self.tcp_out, self.tool_port = None, 0
        for port in range(*TOOL_PORTS):
            try:
                self.tcp_out = self._tcp("0.0.0.0", port)
                self.tool_port = port
                break
            except OSError:
                continue
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.settimeout(0.2)
        self._stop = threading.Event()
        for sock, key in ((self.tcp_lo, "tcp_loopback"), (self.tcp_out, "tcp_tool_port_outward")):
            if sock is not None:
                threading.Thread(target=self._accept, args=(sock, key), daemon=True).start()
        threading.Thread(target=self._recv, daemon=True).start()

    @staticmethod
    def _tcp(host, port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(8)
        s.settimeout(0.2)
        return s

    def _accept(self, sock, key):
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    self.heard[key].append(conn.recv(200) or b"(connected)")
                except OSError:
                    self.heard[key].append(b"(connected)")

    def _recv(self):
        while not self._stop.is_set():
            try:
                self.heard["udp_loopback"].append(self.udp.recv(200))
            except OSError:
                continue

    def close(self):
        self._stop.set()
        for s in (self.tcp_lo, self.tcp_out, self.udp):
            if s is not None:
                s.close()


def outward_address() -> Optional[str]:
    """This host's address on its default route (no packet is sent), or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        addr = s.getsockname()[0]
        return None if addr.startswith("127.") else addr
    except OSError:
        return None
    finally:
        s.close()


def run_child(
    config: dict, wrapper: Tuple[str, ...] = (), timeout_s: float = 240, tool_namespace: bool = True
) -> Tuple[Optional[dict], str]:
    """Run the child in a fresh scratch directory; (its result, or None; the tail of its output).
    `wrapper` runs in the tool namespace unless `tool_namespace` is False (a tracer of the probe's own)."""
    scratch = sandbox.make_scratch("ka-probe-")
    try:
        path = os.path.join(scratch, "child.py")
        with open(path, "w") as f:
            f.write(CHILD)
        os.chmod(path, 0o644)
        cmd = list(wrapper) + [sys.executable, path, json.dumps(config)]
        if config.get("namespace") or (wrapper and tool_namespace):
            cmd = sandbox.tool_namespace_command(cmd)
        env = sandbox.child_env(scratch, base=dict(os.environ, PYTHONPATH=ROOT))
        env.pop("TRITON_INTERPRET", None)
        try:
            r = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout_s)
            out = r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            out = f"timed out after {timeout_s:.0f}s: {(e.stdout or b'')[-500:]!r}"
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("PROBE-RESULT ")), None)
        return (json.loads(line[13:]) if line else None), out[-3000:]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def last_error(out: str) -> str:
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.startswith("PROBE-RESULT")]
    picked = [ln for ln in lines if "Error" in ln or "refused" in ln or "error" in ln]
    return (picked or lines or ["no output"])[-1][:160]


def legit_runs(gpu: bool, quick: bool) -> List[Tuple[str, Optional[bool], str]]:
    """(what, succeeded (None: not run here), detail) for each legitimate run."""
    if not gpu:
        return [("Triton kernel on CUDA", None, "no CUDA GPU (--cpu)")]
    rows = []
    for what, config in (
        ("Triton kernel, executor's sandbox", {"hook": "fatal", "legit": True}),
        (
            "Triton kernel, tool namespace",
            {"hook": "fatal", "legit": True, "namespace": True, "tool_ports": TOOL_PORTS},
        ),
    ):
        res, out = run_child(config)
        ok = bool(res and res.get("legit", [""])[0] == "ran")
        rows.append((what, ok, res["legit"][1] if ok else last_error(out)))
        if not ok:
            print(f"--- {what} failed; its output:\n{out}\n---", flush=True)
        if not ok and "namespace" not in config:
            rows += diagnose()
    from kernel_agent.sanitizer.gpu import TOOL_PORT_BASE, TOOL_PORT_COUNT, find_compute_sanitizer

    exe = find_compute_sanitizer()
    if exe:
        wrapper = (
            exe,
            "--tool",
            "memcheck",
            "--error-exitcode",
            "97",
            "--port",
            str(TOOL_PORT_BASE),
            "--max-connections",
            str(TOOL_PORT_COUNT),
        )
        res, out = run_child({"hook": "fatal", "legit": True, "tool_ports": TOOL_PORTS}, wrapper=wrapper)
        ok = bool(res and res.get("legit", [""])[0] == "ran") and "ERROR SUMMARY: 0 errors" in out
        rows.append(("Triton kernel under memcheck", ok, "ERROR SUMMARY: 0 errors" if ok else last_error(out)))
        if not ok:
            print(f"--- the kernel under memcheck failed; its output:\n{out}\n---", flush=True)
    else:
        rows.append(("Triton kernel under memcheck", None, "compute-sanitizer is not installed"))
    if not quick:
        rows += pipeline_runs()
    return rows


def pipeline_runs() -> List[Tuple[str, bool, str]]:
    """The sanitizer's GPU checks and a benchmark child on the quantize_kv baseline, through the product."""
    from kernel_agent.harness.bench.bench_worker import run_bench_isolated
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.runner import run_isolated

    rows = []
    path = os.path.join(ROOT, "kernels", "baseline", "quantize_kv.py")
    v = run_isolated(path, "quantize_kv", "gpu", checks=("gpu_differential", "memcheck"), timeout_s=300)
    rows.append(
        (
            "GPU checks on the quantize_kv baseline",
            v.passed,
            "; ".join(f"{c.name} {c.status.value}" for c in v.checks)[:160] if v.passed else v.summary()[:160],
        )
    )
    shape = get_op("quantize_kv").shapes("serving")[0].key()
    doc = run_bench_isolated(
        {
            "op": "quantize_kv",
            "shapes": [shape],
            "dtype": "bfloat16",
            "seed": 0,
            "kernels": [{"label": "baseline", "file": None}],
        },
        timeout_s=300,
    )
    ms = [m for r in doc.get("results", []) for m in r.get("measurements", [])]
    errors = [f"{m['label']}: {m['error']}" for m in ms if m.get("error")]
    refused = doc.get("sandbox_refused") or []
    ok = not doc.get("error") and len(ms) >= 2 and not errors and not refused
    detail = (
        ", ".join(f"{m['label']} {m.get('median_ms') or 0:.4f} ms" for m in ms)
        if ok
        else str(doc.get("error") or errors or refused or "no measurement")[:160]
    )
    rows.append(("benchmark child, baseline and anchor", ok, detail))
    return rows


# Each variant loosens one layer in the child, to name the layer that stops the legitimate kernel.
VARIANTS = [
    ("reads unconfined", "_o = sandbox.readable_paths; sandbox.readable_paths = lambda gpu=False: _o(gpu) + ['/']"),
    ("all of /proc writable", "sandbox.GPU_PROC_WRITABLE = ('..',)"),
    ("no seccomp filter", "sandbox._seccomp = lambda prot: None"),
]


def diagnose() -> List[Tuple[str, bool, str]]:
    rows = []
    for what, patch in VARIANTS:
        res, out = run_child({"hook": "fatal", "legit": True, "patches": [patch]})
        ok = bool(res and res.get("legit", [""])[0] == "ran")
        rows.append(
            (
                f"  diagnosis: with {what}",
                True,
                "the kernel runs: this layer is in the way" if ok else f"still fails: {last_error(out)}",
            )
        )
        if ok and what == "reads unconfined":
            rows += diagnose_reads()
    return rows


def diagnose_reads(base: Tuple[str, ...] = ()) -> List[Tuple[str, bool, str]]:
    """Which top-level folder, and which entry in it, made readable lets the kernel run: halves of the
    candidates tried in turn (one child each), assuming one is missing. `base`: patches every try keeps."""
    allowed = set(sandbox.readable_paths(True))

    def runs_with(paths: List[str]) -> bool:
        patch = f"_o = sandbox.readable_paths; sandbox.readable_paths = lambda gpu=False: _o(gpu) + {paths!r}"
        res, _ = run_child({"hook": "fatal", "legit": True, "patches": [*base, patch]}, timeout_s=150)
        return bool(res and res.get("legit", [""])[0] == "ran")

    def bisect(candidates: List[str]) -> List[str]:
        while len(candidates) > 1:
            half = candidates[: len(candidates) // 2]
            if runs_with(half):
                candidates = half
            elif runs_with(candidates[len(half) :]):
                candidates = candidates[len(half) :]
            else:
                return candidates  # more than one is needed: all of them named
        return candidates

    tops = [
        p
        for p in ("/" + n for n in sorted(os.listdir("/")))
        if p not in allowed and os.path.isdir(p) and not os.path.islink(p)
    ]
    if not tops or not runs_with(tops):
        return [("  diagnosis: reads needed under", True, "no top-level folder alone")]
    found = bisect(tops)
    if len(found) == 1:
        try:
            entries = [os.path.join(found[0], n) for n in sorted(os.listdir(found[0]))]
        except OSError:
            entries = []
        entries = [e for e in entries if e not in allowed]
        if entries and runs_with(entries):
            found = bisect(entries)
    return [("  diagnosis: reads needed under", True, ", ".join(found)[:160])]


# The narrower GPU rules (isolation/sandbox.py), each tried on its own and together by --reads
NARROW_RULES = [
    ("reads confined", ("sandbox.GPU_CONFINED_READS = True",)),
    ("/proc narrowed to thread names", ("sandbox.GPU_NARROW_PROC = True",)),
    ("both", ("sandbox.GPU_CONFINED_READS = True", "sandbox.GPU_NARROW_PROC = True")),
]


def refused_paths(patches: Tuple[str, ...]) -> List[str]:
    """The paths whose file syscalls failed with EACCES or EPERM in a child under `patches`, traced by
    strace (the Landlock refusals CUDA met), most frequent first; [] without strace."""
    strace = shutil.which("strace")
    if not strace:
        return ["(strace is not installed)"]
    log_dir = tempfile.mkdtemp(prefix="ka-probe-trace-")
    log = os.path.join(log_dir, "trace")
    try:
        run_child(
            {"hook": "fatal", "legit": True, "patches": list(patches)},
            timeout_s=150,
            tool_namespace=False,
            wrapper=(strace, "-f", "-qq", "-e", "trace=%file,%desc", "-o", log),
        )
        counts: Dict[str, int] = {}
        with open(log, errors="replace") as f:
            for line in f:
                if "= -1 EACCES" in line or "= -1 EPERM" in line:
                    start = line.find('"')
                    what = line[start + 1 : line.find('"', start + 1)] if start >= 0 else line.split("(")[0]
                    key = f"{what} ({line.split('= -1 ')[1].split()[0]})"
                    counts[key] = counts.get(key, 0) + 1
        return [k for k, _ in sorted(counts.items(), key=lambda kv: -kv[1])][:40]
    except OSError as e:
        return [f"(no trace: {e})"]
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def narrow_rule_runs() -> List[Tuple[str, bool, str]]:
    """--reads: the legitimate kernel under each narrower rule; for a rule CUDA fails under, the paths it
    was refused (strace) and the top-level folder that, made readable, lets it run."""
    rows = []
    for what, patches in NARROW_RULES:
        res, out = run_child({"hook": "fatal", "legit": True, "patches": list(patches)}, timeout_s=150)
        ok = bool(res and res.get("legit", [""])[0] == "ran")
        rows.append((f"Triton kernel, {what}", ok, res["legit"][1] if ok else last_error(out)))
        if ok or what == "both":
            continue
        print(f"--- {what}: the kernel failed; its output:\n{out[-1500:]}\n---", flush=True)
        refused = refused_paths(patches)
        print(f"--- {what}: refused file syscalls:\n" + "\n".join(refused) + "\n---", flush=True)
        rows.append((f"  refused under {what}", True, ", ".join(refused)[:300]))
        if what == "reads confined":
            rows += diagnose_reads(patches)
    return rows


def escape_rows(listeners: Listeners, outward: Optional[str], canary: str, marker: str) -> Tuple[List, dict]:
    """Every attempt in every place: (rows, the executor's protections)."""
    config = {
        "attempts": [a[0] for a in ATTEMPTS],
        "canary": canary,
        "git": os.path.join(ROOT, ".git"),
        "udp_port": listeners.udp.getsockname()[1],
        "tcp_port": listeners.tcp_lo.getsockname()[1],
        "tool_port": listeners.tool_port,
        "outward": outward,
        "marker": marker,
    }
    results, protections = {}, {}
    for place, extra in PLACES.items():
        res, out = run_child(dict(config, **extra))
        if res is None:
            print(f"--- the child for '{place}' gave no result; its output:\n{out}", flush=True)
        results[place] = res or {}
        if place == "executor" and res:
            protections.update(active=res["active"], missing=res["missing"])
        if place == "tool ns" and res:
            protections["tool"] = [a for a in res["active"] if "namespace" in a] + [
                f"NOT AVAILABLE: {m}" for m in res["missing"]
            ]
    time.sleep(1.0)  # the listeners' last accepts
    rows = []
    for key, what, counted in ATTEMPTS:
        cells, escaped = [], False
        for place in PLACES:
            got = results[place].get(key)
            if got is None:
                cells.append("no result")
                escaped = escaped or place in counted
                continue
            status, detail = got
            cells.append(
                f"{'ESCAPED' if status == 'succeeded' else 'refused'}: {detail}"[:34]
                if place in counted
                else f"({status}: {detail})"[:34]
            )
            escaped = escaped or (place in counted and status == "succeeded")
        heard = [h for h in listeners.heard.get(key, []) if marker.encode() in h or h == b"(connected)"]
        if heard:
            escaped = True
            cells[-1] += " | host heard it"
        rows.append((what, cells, escaped))
    return rows, protections


def table(escapes, legit, protections, host: str) -> str:
    w0, w = 38, 36
    lines = [
        "",
        f"GPU sandbox probe on {host}; the executor's protections:",
        *[f"  + {a}" for a in protections.get("active", [])],
        *[f"  - NOT AVAILABLE: {m}" for m in protections.get("missing", [])],
        *[f"  tool namespace: {t}" for t in protections.get("tool", [])],
        "",
        f"{'attempt':<{w0}} " + " ".join(f"{p:<{w}}" for p in PLACES) + " verdict",
    ]
    for what, cells, escaped in escapes:
        lines.append(f"{what:<{w0}} " + " ".join(f"{c:<{w}}" for c in cells) + (" ESCAPED" if escaped else " refused"))
    lines.append("")
    lines.append(f"{'legitimate run':<{w0}} {'result':<8} detail")
    for what, ok, detail in legit:
        lines.append(f"{what:<{w0}} {'skipped' if ok is None else 'ok' if ok else 'FAILED':<8} {detail}")
    n_esc = sum(1 for *_, e in escapes if e)
    n_bad = sum(1 for _, ok, _ in legit if ok is False)
    n_run = sum(1 for _, ok, _ in legit if ok is not None)
    lines.append("")
    lines.append(
        f"{len(escapes) - n_esc}/{len(escapes)} attempts refused everywhere they count; "
        f"{n_run - n_bad}/{n_run} legitimate runs ok"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="no GPU: try the escapes only")
    ap.add_argument("--quick", action="store_true", help="skip the GPU checks and the benchmark child")
    ap.add_argument(
        "--reads",
        action="store_true",
        help="only the legitimate kernel under each narrower GPU "
        "rule (confined reads, /proc narrowed), with what CUDA was refused",
    )
    args = ap.parse_args(argv)
    gpu = not args.cpu
    import torch
    import triton

    if gpu and not torch.cuda.is_available():
        print("gpu_sandbox_probe: no CUDA GPU here (use --cpu on a CPU machine)", file=sys.stderr)
        return 2
    host = (
        f"{torch.cuda.get_device_name() if gpu else 'no GPU'}, torch {torch.__version__}, triton "
        f"{triton.__version__}, Linux {os.uname().release}, uid {os.getuid()}"
    )
    print(host, flush=True)
    if args.reads and gpu:
        rows = narrow_rule_runs()
        for what, ok, detail in rows:
            print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}")
        return 0 if all(ok for _, ok, _ in rows) else 1
    marker = "ka-probe-" + os.urandom(6).hex()
    secret_dir = tempfile.mkdtemp(prefix="ka-probe-secret-", dir="/tmp")
    os.chmod(secret_dir, 0o755)
    canary = os.path.join(secret_dir, "canary.txt")
    with open(canary, "w") as f:
        f.write(marker + "\n")
    os.chmod(canary, 0o644)  # readable by anyone: only the sandbox may stop the read
    listeners = Listeners()
    try:
        escapes, protections = escape_rows(listeners, outward_address(), canary, marker)
        legit = legit_runs(gpu, args.quick)
    finally:
        listeners.close()
        shutil.rmtree(secret_dir, ignore_errors=True)
    print(table(escapes, legit, protections, host))
    return 1 if any(e for *_, e in escapes) or any(ok is False for _, ok, _ in legit) else 0


if __name__ == "__main__":
    sys.exit(main())

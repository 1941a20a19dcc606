"""The sandbox around every process that imports or runs candidate code.

A candidate may come from a reward-hacking or prompt-injected model, so the process that
runs it (the sanitizer's executor, the GPU checks' executors, the benchmark child) is
confined before the candidate file is even read. Two halves:

* `child_env` and `make_scratch`, used by the trusted parent when it starts the child:
  the environment is an allowlist (no API keys, tokens or credentials reach the child),
  and a fresh private scratch directory is its working directory, HOME and TMPDIR.
* `enter`, called by the child itself as its first action, while it is still
  single-threaded and before torch is imported. In order:

  1. namespaces: a network namespace (no interface but a loopback that is down, so
     every connect fails), a PID namespace and a mount namespace with its own /proc
     (the child sees no other process of the host, and when its first process dies the
     kernel kills every process left in it: nothing outlives the child), created as
     root directly or, for an ordinary user, inside a user namespace;
  2. resource limits: address space (CPU runs), file size, CPU time, open files, core
     dumps off, and processes where the kernel enforces them (not for uid 0);
  3. identity: started as root, it becomes `nobody` when the interpreter and the
     package are readable to it, otherwise it stays uid 0 with every capability dropped
     (bounding set included, so no exec can regain one);
  4. no_new_privs, and the parent-death signal (the child dies with its parent);
  5. seccomp: no UDP, raw or other non-stream IP socket, no io_uring, no syscall of
     another ABI;
  6. Landlock: reads only of the interpreter, the package, the system's libraries and,
     on a GPU, the CUDA driver's and toolkit's folders (GPU_READABLE); writes only
     beneath the scratch directory (and to the few device files a run needs; on a GPU
     the driver's nodes and its thread names under /proc, GPU_PROC_WRITABLE), TCP bind
     and connect denied (ABI 4+), signals and abstract unix sockets scoped to the
     sandbox (ABI 6+);
  7. a Python audit hook that refuses sockets, process creation (apart from the
     compilers Triton runs on a GPU), writes outside scratch, and ctypes after start-up
     (on a GPU too: `prepare_gpu` makes torch's and Triton's ctypes calls first); every
     refusal is recorded, and the judge fails a verdict with any.

A tool that wraps the child and talks to it over loopback TCP (compute-sanitizer) runs
with it in namespaces of their own (`tool_namespace_command`): the child then keeps that
network and PID namespace instead of making its own, and may connect to the tool's ports.

Each layer that the host cannot provide is reported as missing (`Protections.missing`),
never silently assumed. `kernel-agent sanitize --sandbox` prints what this host gives.
"""

from __future__ import annotations

import ctypes
import fcntl
import glob
import json
import os
import platform
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

NOBODY = 65534
# What a child may inherit: locale, paths to the interpreter and libraries, the GPU it may use,
# thread counts. Everything else (OPENAI_API_KEY, tokens, cloud credentials, ...) is dropped.
ENV_ALLOWED = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "TRITON_INTERPRET",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_INSTRUMENTATION_MODE",
    "TRITON_FPSAN_HOMOMORPHIC_CASTS",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "TORCH_CUDA_ARCH_LIST",
    "CC",
)
# Variable names that are never passed on, even if a caller adds them to the allowlist.
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x4000, 0x40000, 0x2, 0x4, 0x8
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 38, 47, 4
PR_SET_SECUREBITS, SECURE_NOROOT_ALL = 28, 0x3 | 0xC | 0x30  # noroot, no_setuid_fixup, keep_caps_locked ... locked

# Landlock (linux/landlock.h): syscall numbers are the same on x86-64 and arm64.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LL_WRITE_FILE, LL_REMOVE_DIR, LL_REMOVE_FILE, LL_MAKE_CHAR, LL_MAKE_DIR = 1 << 1, 1 << 4, 1 << 5, 1 << 6, 1 << 7
LL_MAKE_REG, LL_MAKE_SOCK, LL_MAKE_FIFO, LL_MAKE_BLOCK, LL_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
LL_REFER, LL_TRUNCATE = 1 << 13, 1 << 14
LL_READ_FILE, LL_READ_DIR = 1 << 2, 1 << 3
# What a CPU run may read besides the interpreter, its libraries and the package: system libraries and
# the few files the C library and Python read at start-up. Secrets elsewhere (keys in a home
# directory, a .netrc, the ledger) are out of reach.
READABLE_SYSTEM = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/dev",
    "/proc",
    "/sys",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/python3",
    "/etc/python3.11",
)
PACKAGE_DIRS = ("kernel_agent", "agent", "sanitizer", "harness", "kernels", "ops", "isolation")
# What a GPU run may read on top of what a CPU run may. Most of what CUDA, torch and Triton read is already
# there: the interpreter's prefixes and site-packages (torch, triton with its ptxas and libdevice, the
# nvidia-* wheels' CUDA libraries), /usr (the driver's libcuda and libnvidia-*, /usr/local/cuda, gcc and the
# headers Triton builds its launchers with), /dev (the device nodes), /proc (this sandbox's own: the
# driver's /proc/driver/nvidia and the process's maps), /sys (the PCI and NUMA topology the driver reads)
# and /etc/ld.so.cache (`ldconfig -p`, which Triton runs to find libcuda). Each entry: where the path comes
# from, and why a GPU run needs it. "env:NAME" is each path of that variable (the file's folder for a file);
# "ld.so.conf" the folders the loader is configured with; an absolute path is that file alone.
GPU_READABLE = (
    ("env:CUDA_HOME", "a CUDA toolkit outside /usr (ptxas, headers, libdevice)"),
    ("env:CUDA_PATH", "the same, as some images name it"),
    ("env:TRITON_PTXAS_PATH", "the ptxas Triton was told to use"),
    ("env:TRITON_LIBCUDA_PATH", "where Triton was told libcuda is"),
    ("env:LD_LIBRARY_PATH", "where the loader finds libcuda and the CUDA libraries (containers: /usr/local/nvidia)"),
    ("env:CUDA_INJECTION64_PATH", "the library compute-sanitizer injects into the process it wraps"),
    ("env:LD_PRELOAD", "libraries a wrapping tool preloads"),
    (
        "env:KA_SANDBOX_TOOL_DIR",
        "the wrapping tool's installation, whose libraries it loads into the process "
        "(compute-sanitizer outside /usr); set by tool_namespace_main",
    ),
    ("ld.so.conf", "the loader's configured folders, where libcuda may lie outside /usr (an /opt driver)"),
    (
        "compiler",
        "the C compiler Triton builds its launchers with (CC, else gcc, cc or clang on PATH), where it is "
        "installed outside /usr (an /opt toolchain): its prefix, for its driver, cc1, headers and libraries",
    ),
    ("/etc/hosts", "the name `localhost`, by which a wrapping tool's injected library may reach its front end"),
    ("/etc/host.conf", "the same lookup's configuration"),
    ("/etc/gai.conf", "the same lookup's address order"),
)
# Writes under /proc a GPU run needs, beneath this process's own folder. The CUDA driver names the threads
# it starts by writing /proc/<pid>/task/<tid>/comm (pthread_setname_np on another thread); when that write
# is refused, cuInit fails with error 304. Landlock cannot name files that do not exist yet (the threads),
# so the grant is beneath task/ (file writes only: no create, remove or truncate). /proc/self/mem,
# oom_score_adj, /proc/sys and every other process's files stay unwritable; task/<tid>/mem is beneath the
# grant, so only the audit hook (which refuses writes outside scratch and ctypes) keeps Python from it.
GPU_PROC_WRITABLE = ("task",)
# The narrower GPU rules, off until the H200 runs CUDA under them (scripts/gpu_sandbox_probe.py --reads finds
# what is missing): reads confined to readable_paths(gpu=True), and /proc writable only beneath
# GPU_PROC_WRITABLE of this process. With either on, cuInit failed on the H200 (error 304).
GPU_CONFINED_READS = False
GPU_NARROW_PROC = False
LL_NET_BIND_TCP, LL_NET_CONNECT_TCP = 1 << 0, 1 << 1
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1 << 0, 1 << 1
LANDLOCK_RULE_NET_PORT = 2
# Device files a run writes to: /dev/null and friends, and the NVIDIA driver's nodes on a GPU.
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random")
# Executables Triton runs on a GPU to compile a kernel and its launcher.
GPU_TOOLS = (
    "ptxas",
    "ptxas-blackwell",
    "nvdisasm",
    "cuobjdump",
    "gcc",
    "cc",
    "clang",
    "x86_64-linux-gnu-gcc",
    "ldconfig",
    "ldconfig.real",
    "nvidia-smi",
    "nvcc",
    "file",
)


@dataclass
class Limits:
    """Resource limits of a sandboxed child (None: not limited)."""

    memory_bytes: Optional[int] = 8 << 30  # address space; None on a GPU (CUDA reserves huge ranges)
    cpu_seconds: Optional[int] = None  # set from the wall-clock limit by the parent
    file_bytes: int = 1 << 30
    open_files: int = 1024
    processes: int = 512  # threads count too; not enforced by the kernel for uid 0


@dataclass
class Protections:
    """What `enter` put in place on this host, and what it could not."""

    active: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)

    def describe(self) -> str:
        text = "; ".join(self.active)
        if self.missing:
            text += "; NOT AVAILABLE: " + "; ".join(self.missing)
        return text


def child_env(
    scratch: str, extra: Optional[Dict[str, str]] = None, base: Optional[Dict[str, str]] = None
) -> Dict[str, str]:
    """The environment of a sandboxed child: an allowlist of the parent's variables, with HOME, TMPDIR
    and the caches pointed into its scratch directory. Names that look like secrets never pass."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in ENV_ALLOWED and not _looks_secret(k)}
    env.update(
        {
            "HOME": scratch,
            "TMPDIR": scratch,
            "TMP": scratch,
            "TEMP": scratch,
            "TRITON_CACHE_DIR": os.path.join(scratch, ".triton"),
            "TRITON_HOME": scratch,
            "XDG_CACHE_HOME": os.path.join(scratch, ".cache"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONNOUSERSITE": "1",
            "KA_SANDBOX_SCRATCH": scratch,
            "KA_SANDBOX_IDENTITY": identity_plan(),
        }
    )
    env.setdefault("PYTHONHASHSEED", "0")
    for k, v in (extra or {}).items():
        if not _looks_secret(k):
            env[k] = v
    return env


def env_for(scratch: str, given: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """`child_env` for a caller's `given` variables: a whole environment (os.environ plus a GPU, say)
    passes through the allowlist like ours; a few variables are added on top of it."""
    return child_env(scratch, base=given) if given and "PATH" in given else child_env(scratch, extra=given)


def _looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(m in upper for m in _SECRET_MARKERS)


def make_scratch(prefix: str = "ka-scratch-") -> str:
    """A fresh private directory for one sandboxed child (owned by the sandbox identity). It lies in the
    system's temporary directory, not under the caller's (whose own temporary directory may be private
    to it, so that uid nobody could not reach a scratch directory inside it)."""
    root = "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK) else None
    path = tempfile.mkdtemp(prefix=prefix, dir=root)
    os.chmod(path, 0o700)
    if os.geteuid() == 0 and identity_plan() == "nobody":
        os.chown(path, NOBODY, NOBODY)
    return path


# -- the child's half ---------------------------------------------------------------------

_libc = None
_pinned: List[int] = []  # file descriptors a Landlock rule needs kept open (see _landlock)


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _err(what: str) -> str:
    e = ctypes.get_errno()
    return f"{what}: {os.strerror(e) if e else 'failed'}"


def _world_accessible(path: str, want_read: bool) -> bool:
    """Whether uid `nobody` can reach `path` (every directory above it searchable by others)."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:
        return True  # a path that does not exist needs no access
    need = (stat.S_IROTH if want_read else 0) | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    if st.st_mode & need != need:
        return False
    parent = os.path.dirname(path)
    while parent and parent != "/":
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(parent)
    return True


_plan: Optional[str] = None


def identity_plan() -> str:
    """'nobody' when started as root and uid nobody can read the interpreter, the package and the
    import paths it needs; 'root-without-capabilities' when root but it cannot; 'self' when not root.
    The parent decides (it owns the scratch directory) and the child obeys (KA_SANDBOX_IDENTITY), so
    the two never disagree."""
    global _plan
    if _plan is None:
        given = os.environ.get("KA_SANDBOX_IDENTITY")
        if os.geteuid() != 0:
            _plan = "self"
        elif given in ("nobody", "root-without-capabilities"):
            _plan = given
        else:
            paths = [
                sys.executable,
                os.path.realpath(sys.executable),
                sys.prefix,
                sys.base_prefix,
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            ]
            paths += [sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")]
            paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            _plan = "nobody" if all(_world_accessible(p, True) for p in paths if p) else "root-without-capabilities"
    return _plan


def _unshare(prot: Protections, network: bool = True, pid: bool = True) -> bool:
    """Network, PID and mount namespaces (without the first two when told); True when a PID namespace
    was made."""
    libc = _c()
    flags = (CLONE_NEWNET if network else 0) | (CLONE_NEWPID if pid else 0) | CLONE_NEWNS
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    if libc.unshare(flags) != 0:
        prot.missing.append(
            _err("namespaces (network, PID, mount) could not be created")
            + ": the network is reachable unless Landlock blocks TCP, and a process the candidate "
            "starts outside the session could survive it"
        )
        return False
    if flags & CLONE_NEWUSER:  # map our own ids, so nothing changes for file access
        try:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        except OSError as e:
            prot.missing.append(f"user namespace id maps: {e}")
    if network:
        prot.active.append("network namespace (no network)")
    return pid


def _become_pid1(prot: Protections) -> None:
    """Fork into the new PID namespace. The parent only waits and passes the exit status on; the
    child is the namespace's first process: when it dies, the kernel kills everything left in it."""
    pid = os.fork()
    if pid:
        _c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:
            os._exit(137)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, f: (os.kill(pid, signal.SIGKILL), os._exit(128 + s)))  # type: ignore[func-returns-value]
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except ChildProcessError:
                os._exit(1)
            except InterruptedError:
                continue
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    libc = _c()
    # our own /proc: the host's processes (and their environments) are not visible
    if (
        libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
        and libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) == 0
    ):
        prot.active.append("PID namespace with its own /proc (no other process visible; all die with it)")
    else:
        prot.active.append("PID namespace (all its processes die with it)")
        prot.missing.append(_err("a private /proc could not be mounted") + ": host processes stay listed")


def _limits(limits: Limits, prot: Protections) -> None:
    def setl(which, value, label):
        try:
            resource.setrlimit(which, (value, value))
            return label
        except (ValueError, OSError) as e:
            prot.missing.append(f"limit on {label}: {e}")
            return None

    done = [
        setl(resource.RLIMIT_CORE, 0, "core dumps (off)"),
        setl(resource.RLIMIT_FSIZE, limits.file_bytes, f"file size ({limits.file_bytes >> 20} MiB)"),
        setl(resource.RLIMIT_NOFILE, limits.open_files, f"open files ({limits.open_files})"),
    ]
    if limits.memory_bytes:
        done.append(setl(resource.RLIMIT_AS, limits.memory_bytes, f"memory ({limits.memory_bytes >> 30} GiB)"))
    if limits.cpu_seconds:
        done.append(setl(resource.RLIMIT_CPU, limits.cpu_seconds, f"CPU time ({limits.cpu_seconds} s)"))
    if os.geteuid() != 0:
        done.append(setl(resource.RLIMIT_NPROC, limits.processes, f"processes ({limits.processes})"))
    prot.active.append("limits: " + ", ".join(d for d in done if d))


def _drop_identity(scratch: str, prot: Protections) -> None:
    libc = _c()
    plan = identity_plan()
    if plan == "self":
        prot.active.append(f"runs as uid {os.getuid()} (not root)")
        return
    if plan == "nobody":
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        prot.active.append("unprivileged identity (uid nobody)")
        return
    # root, but the interpreter lies where nobody cannot read it: stay uid 0 without capabilities
    libc.prctl(PR_SET_SECUREBITS, SECURE_NOROOT_ALL, 0, 0, 0)  # exec of anything grants no capability
    last = 63
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        pass
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capset(ctypes.byref(hdr), data) != 0:
        prot.missing.append(_err("capabilities could not be dropped") + ": the child keeps root's privileges")
        return
    prot.active.append("uid 0 without any capability (the interpreter is not readable to uid nobody here)")


def readable_paths(gpu: bool = False) -> List[str]:
    """What a sandboxed run may read: the interpreter's prefixes and import paths, the package's own
    folders, the system files of READABLE_SYSTEM and, on a GPU, what GPU_READABLE names."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
    paths += [sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib", "include")]
    paths += [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) not in ("/", root)]
    paths += [os.path.join(root, d) for d in PACKAGE_DIRS]
    paths += list(READABLE_SYSTEM)
    if gpu:
        paths += gpu_readable_paths()
    out = []
    for p in paths:
        if p and p not in out:
            out.append(p)
    return out


def gpu_readable_paths(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """The folders GPU_READABLE names on this host (never "/": a variable naming it is ignored)."""
    env = os.environ if environ is None else environ
    out: List[str] = []
    for source, _why in GPU_READABLE:
        if source.startswith("env:"):
            value = env.get(source[4:], "")
            found = [p for p in value.replace(" ", os.pathsep).split(os.pathsep) if os.path.isabs(p)]
        elif source == "ld.so.conf":
            found = _loader_folders()
        elif source == "compiler":
            found = _compiler_prefixes(env)
        else:
            out.append(source)  # a file: readable itself, not its folder
            continue
        for p in found:
            p = os.path.dirname(p) if os.path.isfile(p) else p
            if os.path.realpath(p) != "/" and p not in out:
                out.append(p)
    return out


def _compiler_prefixes(env: Mapping[str, str]) -> List[str]:
    """The installation prefix (the folder above bin/) of each C compiler Triton may call, outside /usr."""
    out: List[str] = []
    for name in [env.get("CC", ""), "gcc", "cc", "clang"]:
        found = shutil.which(name, path=env.get("PATH")) if name else None
        if not found:
            continue
        for path in (os.path.abspath(found), os.path.realpath(found)):  # the link Triton opens, and its target
            prefix = os.path.dirname(os.path.dirname(path))
            if prefix not in ("/", "/usr", "/usr/local") and prefix not in out:
                out.append(prefix)
    return out


def _loader_folders(conf: str = "/etc/ld.so.conf", depth: int = 0) -> List[str]:
    """The folders of the dynamic loader's configuration (`include` lines followed, globs expanded)."""
    out: List[str] = []
    try:
        with open(conf) as f:
            lines = [ln.split("#", 1)[0].strip() for ln in f]
    except OSError:
        return out
    for ln in lines:
        if ln.startswith("include") and depth < 4:
            pattern = ln.split(None, 1)[1] if len(ln.split(None, 1)) > 1 else ""
            if not os.path.isabs(pattern):
                pattern = os.path.join(os.path.dirname(conf), pattern)
            for inc in sorted(glob.glob(pattern)):
                out += _loader_folders(inc, depth + 1)
        elif os.path.isabs(ln):
            out.append(ln)
    return out


def landlock_abi() -> int:
    try:
        return max(0, int(_c().syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)))
    except (AttributeError, OSError):
        return 0


class _LandlockAttr(ctypes.Structure):
    """struct landlock_ruleset_attr: the access kinds a ruleset handles (files, TCP, scopes)."""

    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    """struct landlock_path_beneath_attr: the access granted beneath an open folder or on a file."""

    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    """struct landlock_net_port_attr: the TCP access granted on a port."""

    _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _landlock(scratch: str, gpu: bool, prot: Protections, tool_ports: Sequence[int] = ()) -> None:
    """Confine this process with Landlock: writes only in `scratch` (and the device nodes a run needs), reads
    confined on a CPU run, TCP denied but for connects to `tool_ports`. What is enforced, or missing, goes to
    `prot`."""
    libc = _c()
    abi = landlock_abi()
    if abi < 1:
        prot.missing.append(
            "Landlock (kernel without it): writes are limited only by file permissions and the audit hook"
        )
        return
    write = _landlock_write_rights(abi)
    # Reads are confined on a CPU run. On a GPU they are not yet: with reads confined to GPU_READABLE the CUDA
    # driver's initialisation failed on the H200 (cudaGetDeviceCount: error 304, also with /proc writable),
    # so a GPU run keeps the rules the H200 has run under (unconfined reads, its own /proc writable) until
    # scripts/gpu_sandbox_probe.py finds the narrower set that CUDA accepts (docs/ARCHITECTURE.md, trust).
    confine_reads = not gpu or GPU_CONFINED_READS
    read = (LL_READ_FILE | LL_READ_DIR) if confine_reads else 0
    attr = _LandlockAttr(
        write | read,
        (LL_NET_BIND_TCP | LL_NET_CONNECT_TCP) if abi >= 4 else 0,
        (LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        prot.missing.append(_err("Landlock ruleset"))
        return
    file_rights = LL_WRITE_FILE | (LL_TRUNCATE if abi >= 3 else 0)
    _add_path_rules(libc, ruleset, _landlock_targets(scratch, gpu, confine_reads, write | read, read, file_rights))
    if abi >= 4:
        for port in tool_ports:  # connect only: the tool's front end listens, the sandbox never does
            port_rule = _NetPort(LL_NET_CONNECT_TCP, port)
            libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_NET_PORT, ctypes.byref(port_rule), 0)
    if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        prot.missing.append(_err("Landlock could not be enforced"))
        os.close(ruleset)
        return
    os.close(ruleset)
    prot.active.append(_landlock_description(abi, gpu, tool_ports))


def _landlock_write_rights(abi: int) -> int:
    """Every access that changes the file system, as far as this ABI names them."""
    write = (
        LL_WRITE_FILE
        | LL_REMOVE_DIR
        | LL_REMOVE_FILE
        | LL_MAKE_CHAR
        | LL_MAKE_DIR
        | LL_MAKE_REG
        | LL_MAKE_SOCK
        | LL_MAKE_FIFO
        | LL_MAKE_BLOCK
        | LL_MAKE_SYM
    )
    if abi >= 2:
        write |= LL_REFER
    if abi >= 3:
        write |= LL_TRUNCATE
    return write


def _landlock_targets(
    scratch: str, gpu: bool, confine_reads: bool, scratch_rights: int, read: int, file_rights: int
) -> List[Tuple[str, int]]:
    """(path, rights) of every rule: the scratch folder, the writable devices, what a confined run reads, and on
    a GPU the driver's device nodes and this process's /proc."""
    targets = [(scratch, scratch_rights)] + [(d, file_rights) for d in WRITABLE_DEVICES]
    if confine_reads:
        targets += [(p, read) for p in readable_paths(gpu)]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        targets += [(root, LL_READ_DIR)]  # the package's folder is listed by the import system, not read
    if gpu:
        # the CUDA driver opens its device nodes read-write, and names its threads (GPU_PROC_WRITABLE)
        targets += [
            (os.path.join("/dev", n), file_rights) for n in sorted(os.listdir("/dev")) if n.startswith("nvidia")
        ]
        # /proc is this process's own (PID namespace); the narrower GPU_PROC_WRITABLE alone failed on the H200
        if GPU_NARROW_PROC:
            targets += [(os.path.join("/proc", str(os.getpid()), n), file_rights) for n in GPU_PROC_WRITABLE]
        else:
            targets += [("/proc", file_rights)]
    return targets


def _add_path_rules(libc: Any, ruleset: int, targets: Sequence[Tuple[str, int]]) -> None:
    """A path-beneath rule per target that exists (a file takes file rights only)."""
    for path, rights in targets:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE  # a file takes file rights only
            rule = _PathBeneath(rights, fd)
            libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)
        finally:
            if path.startswith("/proc/"):
                # a rule holds the inode, not the path: a procfs folder dropped from the dentry cache comes
                # back as a new inode the rule does not name, so the folder is kept open (a candidate that
                # closes it only loses its own grant)
                _pinned.append(fd)
            else:
                os.close(fd)


def _landlock_description(abi: int, gpu: bool, tool_ports: Sequence[int]) -> str:
    """What the enforced ruleset allows, in a line of the sandbox's report."""
    what = [f"Landlock ABI {abi}: writes only in scratch"]
    what.append(
        "reads only of the interpreter, the package and system libraries"
        + (", and the CUDA driver's and toolkit's folders" if gpu else "")
    )
    if gpu:
        what.append("writes under /proc only to this process's thread names (the CUDA driver's)")
    if abi < 4:
        what.append("TCP not covered (ABI < 4)")
    elif tool_ports:
        what.append(f"TCP denied except connect to the wrapping tool's ports {min(tool_ports)}-{max(tool_ports)}")
    else:
        what.append("TCP bind/connect denied")
    if abi >= 6:
        what.append("signals and abstract sockets scoped to the sandbox")
    return ", ".join(what)


# seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h): a classic BPF program over the syscall's number
# and arguments. Landlock has rules for TCP only (ABI 4+); this filter refuses every IP socket that is not
# a stream (UDP, raw, ICMP "ping" sockets, SCTP's sequenced packets), so no datagram leaves even where a
# namespace is shared with a tool. It also refuses io_uring (its socket and open requests bypass the
# syscall table this filter sees) and any syscall of another ABI (32-bit int 0x80, x32), which would have
# other numbers.
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_AND_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
AF_INET, AF_INET6, SOCK_STREAM, SOCK_TYPE_MASK = 2, 10, 1, 0xF
X32_SYSCALL_BIT = 0x40000000
# machine -> (audit arch, socket's number, io_uring_setup's number)
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}


def seccomp_program(machine: str) -> Optional[List[tuple]]:
    """The filter as (code, jump-if-true, jump-if-false, k) instructions; None for an unknown machine.
    Offsets into struct seccomp_data: nr 0, arch 4, args[i] 16 + 8 i (the low 32 bits, little endian)."""
    if machine not in SECCOMP_ARCH:
        return None
    arch, nr_socket, nr_io_uring = SECCOMP_ARCH[machine]
    deny = SECCOMP_RET_ERRNO | 13  # EACCES, as Landlock answers
    prog = [
        (BPF_LD_W_ABS, 0, 0, 4),
        (BPF_JEQ_K, 1, 0, arch),  # another ABI: refused
        (BPF_RET_K, 0, 0, deny),
        (BPF_LD_W_ABS, 0, 0, 0),
        (BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),  # x32 numbers: refused
        (BPF_RET_K, 0, 0, deny),
        (BPF_JEQ_K, 0, 1, nr_io_uring),
        (BPF_RET_K, 0, 0, deny),
        (BPF_JEQ_K, 1, 0, nr_socket),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),  # not socket(): allowed
        (BPF_LD_W_ABS, 0, 0, 16),  # the family
        (BPF_JEQ_K, 2, 0, AF_INET),
        (BPF_JEQ_K, 1, 0, AF_INET6),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),  # unix sockets (the judge's pair), netlink: allowed
        (BPF_LD_W_ABS, 0, 0, 24),  # the type, without SOCK_NONBLOCK / SOCK_CLOEXEC
        (BPF_AND_K, 0, 0, SOCK_TYPE_MASK),
        (BPF_JEQ_K, 0, 1, SOCK_STREAM),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),  # TCP: left to the namespace and Landlock
        (BPF_RET_K, 0, 0, deny),
    ]
    return prog


def _seccomp(prot: Protections) -> None:
    """Install the filter (after no_new_privs, which an unprivileged filter needs). It is inherited by
    every process the sandbox starts and cannot be removed."""
    prog = seccomp_program(platform.machine())
    if prog is None:
        prot.missing.append(
            f"seccomp filter (no syscall table for {platform.machine()}): UDP and raw sockets are "
            f"stopped only by the network namespace and the audit hook"
        )
        return

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(prog))(*[Filter(*ins) for ins in prog])
    fprog = Program(len(prog), filters)
    if _c().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        prot.missing.append(
            _err("seccomp filter") + ": UDP and raw sockets are stopped only by the network "
            "namespace and the audit hook"
        )
        return
    prot.active.append("seccomp: no UDP, raw or other non-stream IP socket, no io_uring, no foreign-ABI syscall")


# -- the audit hook ------------------------------------------------------------------------

TOOL_NAMESPACE_ENV = "KA_SANDBOX_TOOL_NETNS"  # set by tool_namespace_main: the namespace it made for the tool
TOOL_DIR_ENV = "KA_SANDBOX_TOOL_DIR"  # set by tool_namespace_main: where the tool is installed (GPU_READABLE)
REFUSED_EXIT = 86  # the exit code of a process the fatal audit hook ended
_violations: List[str] = []
_config: Dict[str, Any] = {"scratch": "", "gpu": False}


def violations() -> List[str]:
    """What a record-only audit hook refused so far (the benchmark child reports these)."""
    return list(_violations)


# The events the hook refuses by name (immutable: the hook binds them when it is made)
_NETWORK_EVENTS = frozenset(
    (
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
    )
)
_SPAWN_EVENTS = frozenset(("os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"))
_PROCESS_CONTROL_EVENTS = frozenset(
    (
        "os.system",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "sys.addaudithook",
    )
)
_FILESYSTEM_CHANGE_EVENTS = frozenset(
    (
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
        "shutil.copyfile",
    )
)
_INTROSPECTION_EVENTS = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents"))


def _make_audit(scratch: str, gpu: bool, fatal: bool):
    """The hook, with everything it needs bound now: nothing a candidate reaches afterwards (module
    globals, os functions) changes what it refuses. Fatal: the process ends at the first refusal (exit
    REFUSED_EXIT, the reason on stderr), so a candidate cannot swallow the error and carry on."""
    fsdecode, basename, tools = os.fsdecode, os.path.basename, GPU_TOOLS
    network, spawn, control, fs_change, introspection = (
        _NETWORK_EVENTS,
        _SPAWN_EVENTS,
        _PROCESS_CONTROL_EVENTS,
        _FILESYSTEM_CHANGE_EVENTS,
        _INTROSPECTION_EVENTS,
    )
    writing_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    refuse, inside_scratch = _make_refuse(fatal), _make_inside_scratch(scratch, gpu)

    def tool(args) -> str:
        return basename(fsdecode(args[0])) if args and isinstance(args[0], (str, bytes)) else ""

    def audit(event: str, args) -> None:
        if event.startswith("socket."):
            if event == "socket.__new__" and args and len(args) > 1 and args[1] == 1:
                return  # a unix socket pair is how the judge talks to the executor
            if event in network:
                refuse(f"network access ({event})")
        elif event in spawn:
            # subprocess spawns through the os events; on a GPU Triton runs its compilers
            if not (gpu and tool(args) in tools):
                refuse(f"process creation ({event} {tool(args) or '?'})")
        elif event in control:
            refuse(f"process control ({event})" if event != "sys.addaudithook" else "a second audit hook")
        elif event == "open" and len(args) >= 2:
            path, mode = args[0], args[1]
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & writing_flags)
            if writing and not isinstance(path, int) and not inside_scratch(path):
                refuse(f"write outside scratch ({fsdecode(path)[:120]})")
        elif event in fs_change:
            path = args[0] if args else ""
            if not inside_scratch(path):
                refuse(f"filesystem change outside scratch ({event} {fsdecode(path)[:120] if path else ''})")
        elif event.startswith("ctypes."):  # on a GPU too: prepare_gpu made torch's and Triton's calls
            refuse(f"native code through ctypes ({event})")
        elif event in introspection and not gpu:
            refuse(f"introspection ({event})")  # (torch.compile, an anchor timed beside GPU kernels, walks them)

    return audit


def _make_refuse(fatal: bool):
    """The hook's refusal, bound now like the hook (_make_audit): fatal, it ends the process at once;
    else it records what it refused (the first 50) and raises PermissionError."""
    write_stderr, exit_now, record = os.write, os._exit, _violations

    def refuse(what: str):
        what = what[:300]
        if fatal:
            write_stderr(2, f"\nsandbox refused: {what}\n".encode(errors="replace"))
            exit_now(REFUSED_EXIT)
        if len(record) < 50:
            record.append(what)
        raise PermissionError(f"sandbox: {what[:200]}")

    return refuse


def _make_inside_scratch(scratch: str, gpu: bool):
    """Whether a path the hook sees is one the sandbox may write: inside scratch, a writable device, or (on a
    GPU) an NVIDIA device; bound now like the hook (_make_audit)."""
    fsdecode, realpath, sep, devices = os.fsdecode, os.path.realpath, os.sep, WRITABLE_DEVICES

    def inside_scratch(path) -> bool:
        try:
            p = realpath(fsdecode(path)) if not isinstance(path, int) else ""
        except (TypeError, ValueError):
            return False
        return bool(p) and (
            p == scratch or p.startswith(scratch + sep) or p in devices or (gpu and p.startswith("/dev/nvidia"))
        )

    return inside_scratch


def arm_audit_hook(fatal: bool = True) -> None:
    """Install the hook (after the trusted imports: torch and triton do some of these things while they
    load). Audit hooks cannot be removed; the hook refuses a second one."""
    sys.addaudithook(_make_audit(_config["scratch"], _config["gpu"], fatal))


def foreign_processes() -> List[int]:
    """Processes other than this one in its PID namespace (this process is its first, pid 1): read
    fresh from /proc, so a candidate that got past the hook is still seen starting processes."""
    if os.getpid() != 1:
        return []
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1"]
    except OSError:
        return []


# -- entering the sandbox -------------------------------------------------------------------


def enter(
    scratch: str, gpu: bool = False, limits: Optional[Limits] = None, tool_ports: Sequence[int] = ()
) -> Protections:
    """Confine this process (call it first thing, single-threaded, before importing torch).

    `tool_ports`: the process runs under a tool that talks to it over TCP on loopback and finds it by
    its pid (compute-sanitizer's front end). It then stays in the tool's network and PID namespaces,
    which `tool_namespace_main` made for the tool and this process alone (a loopback that is up, no other
    interface, a /proc of their own): Landlock lets it connect to those ports only (no other TCP, no
    bind), the seccomp filter refuses UDP, and the audit hook still refuses every socket and process
    the Python side opens."""
    prot = Protections()
    limits = limits or Limits()
    if gpu:
        limits.memory_bytes = None
    scratch = os.path.realpath(scratch)
    os.chdir(scratch)
    if platform.system() != "Linux":
        prot.missing.append(f"every kernel-level protection ({platform.system()} is not Linux)")
        _finish(scratch, gpu, prot)
        return prot
    _c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    shared = False
    if _unshare(prot, network=not tool_ports, pid=not tool_ports):
        _become_pid1(prot)
    elif tool_ports:
        shared = _tool_namespaces(prot)
    _limits(limits, prot)
    _drop_identity(scratch, prot)
    if _c().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        prot.active.append("no_new_privs")
    _c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # cleared by a change of identity: set again
    _seccomp(prot)
    _landlock(scratch, gpu, prot, tool_ports)
    if (
        tool_ports
        and not shared
        and not any(a.startswith("Landlock") and "TCP denied except" in a for a in prot.active)
    ):
        prot.missing.append(
            "network: the host's, kept for the wrapping tool, and TCP not confined (Landlock without TCP rules)"
        )
    _finish(scratch, gpu, prot)
    return prot


def _tool_namespaces(prot: Protections) -> bool:
    """Under a wrapping tool: whether this process is in the namespaces `tool_namespace_main` made for the
    tool (it names its network namespace in TOOL_NAMESPACE_ENV), or in the host's."""
    try:
        here = os.readlink("/proc/self/ns/net")
    except OSError:
        here = ""
    if here and os.environ.get(TOOL_NAMESPACE_ENV) == here:
        prot.active.append(
            "network namespace shared with the wrapping tool alone (loopback only), and a PID "
            "namespace with its own /proc"
        )
        return True
    prot.missing.append(
        "network and PID namespaces (the wrapping tool runs in the host's, and reaches this "
        "process over loopback TCP and by its pid): the host's loopback ports of the tool "
        "are reachable, and host processes are listed in /proc"
    )
    return False


def _finish(scratch: str, gpu: bool, prot: Protections) -> None:
    _config.update(scratch=scratch, gpu=gpu)
    prot.active.append("audit hook (sockets, processes, writes outside scratch, native code, object-graph walks)")


def host_protections(gpu: bool = False) -> Protections:
    """What `enter` gives on this host, found by entering it in a throwaway child."""
    scratch = make_scratch()
    try:
        code = (
            "import json,sys; from kernel_agent.isolation import sandbox as s; p = s.enter(sys.argv[1], "
            "sys.argv[2] == '1'); print(json.dumps([p.active, p.missing]))"
        )
        r = subprocess.run(
            [sys.executable, "-c", code, scratch, "1" if gpu else "0"],
            env=child_env(scratch),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=scratch,
        )
        active, missing = json.loads(r.stdout.strip().splitlines()[-1])
        return Protections(active, missing)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as e:
        return Protections([], [f"the sandbox could not be entered: {e}"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- what runs before the sandbox's last layers ---------------------------------------------------


def prepare_gpu() -> None:
    """Do now, in trusted code and before the audit hook is armed, what torch and Triton do through
    ctypes on their way to the GPU, so that the hook can refuse ctypes in a GPU run too: torch counts
    devices through NVML (ctypes) until CUDA is initialised, and Triton's driver probes libcuda (ctypes,
    cuInit) the first time a kernel is launched. Both results are cached for the process's life."""
    import torch  # deferred: a sandboxed child enters its sandbox before it imports what it runs

    if not torch.cuda.is_available():
        return
    torch.cuda.init()
    torch.cuda.device_count()  # cached once CUDA is initialised: NVML is not asked again
    from triton.runtime.driver import driver  # deferred: as torch

    driver.active.get_current_device()


def tool_namespace_command(cmd: Sequence[str]) -> List[str]:
    """`cmd` (a tool that wraps a sandboxed child and talks to it over loopback TCP) run by
    `tool_namespace_main`, in network, PID and mount namespaces made for it and its child alone."""
    return [sys.executable, "-m", "kernel_agent.isolation.sandbox", "--tool-namespace", "--", *cmd]


def tool_namespace_main(cmd: Sequence[str]) -> int:
    """Make a network namespace with its loopback up and no other interface, a PID namespace with its
    own /proc and a mount namespace, then run `cmd` there as its first process (everything in it dies
    with it, and it dies with this process). The tool and the child it wraps share that loopback, and
    see each other's pids as they are; nothing of the host's network or processes is in reach. Where
    the namespaces cannot be made, `cmd` runs in the host's and the child reports them missing."""
    if not cmd:
        sys.stderr.write("sandbox: --tool-namespace needs a command\n")
        return 2
    _c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prot = Protections()
    if platform.system() == "Linux" and _unshare(prot, network=True, pid=True):
        _become_pid1(prot)  # returns in the namespace's first process, with its own /proc
        _c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            _loopback_up()
            os.environ[TOOL_NAMESPACE_ENV] = os.readlink("/proc/self/ns/net")
        except OSError as e:
            sys.stderr.write(f"sandbox: the tool's loopback could not be brought up ({e}): it cannot reach its child\n")
    for line in prot.missing:
        sys.stderr.write(f"sandbox: {line}\n")
    os.environ[TOOL_DIR_ENV] = os.pathsep.join(tool_folders(cmd[0]))
    try:
        os.execvp(cmd[0], list(cmd))
    except OSError as e:
        sys.stderr.write(f"sandbox: cannot run {cmd[0]}: {e}\n")
    return 127


def tool_folders(tool: str) -> List[str]:
    """The folder of the tool's executable and the installation above it (compute-sanitizer's bin/ or
    its own folder, and the toolkit holding it), never a top-level folder such as /opt or /usr."""
    found = shutil.which(tool)
    if not found:
        return []
    here = os.path.dirname(os.path.realpath(found))
    return [p for p in (here, os.path.dirname(here)) if os.path.dirname(p) not in ("/", "")]


def _loopback_up() -> None:
    """Bring up the loopback interface of this (new) network namespace: SIOCGIFFLAGS, SIOCSIFFLAGS."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), siocgifflags, ifreq))[1]
        fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


if __name__ == "__main__":
    if sys.argv[1:3] == ["--tool-namespace", "--"]:
        sys.exit(tool_namespace_main(sys.argv[3:]))
    sys.stderr.write("usage: python -m kernel_agent.isolation.sandbox --tool-namespace -- COMMAND...\n")
    sys.exit(2)

"""The serving kernel set: promoted kernels, their manifest, and the API a serving stack calls.

Layout: the folder `kernels/serving/` holds `manifest.json` and one kernel file per promoted code change
for an (op, shape bucket, dtype, GPU), named `<op>__<bucket>__<dtype>__<gpu-slug>.py`. Each file is a
complete candidate: it defines a function named after the op with the op's contract signature. A promoted
launch configuration (the search's `_config` override, sanitizer/config_variant.py) has no file: its entry
records what it tuned (the baseline, or the promoted file it replaced) with that source's hash, and the
configuration, and the kernel is rebuilt from them and checked against the hash that was judged.

Each (op, bucket, dtype, GPU) is served by the fastest trusted implementation of three:
  - "kernel": a promoted kernel (it beat the other two when it was promoted);
  - "baseline": the project's baseline kernel;
  - "torch": the op's torch implementation (Op.torch_impl: cuBLAS, SDPA, torch.compile), trusted
    without sanitizing because it is the reference library.
A manifest entry records the choice for its key with the measurements behind it (`set_choice`,
from the benchmarks in the ledger). A key without an entry takes the choice that won most of the
op's measured buckets on that GPU (else on any GPU; else the baseline): the committed manifest is
the committed bench. Promotion writes the set (`serving_install.install`, `remove`); CI re-verifies its
kernels; a serving stack only reads it, through `get`:

    from kernel_agent.harness.serving import serving
    quantize_kv = serving.get("quantize_kv")
    x_q, scale = quantize_kv(x)          # the fastest trusted implementation for x's bucket
    quantize_kv.resolve(x)               # which one, and why

Writes are atomic (a temporary file, then os.replace), so a reader never sees half a
kernel or half a manifest. The manifest is sorted, so promotions diff cleanly in pull
requests. This module imports no database code and not the static gate: serving needs torch, triton, the
op registry and the manifest. The gate comes in with the first promoted kernel loaded (it is re-gated as it is
imported); the write side that judges a promotion's text is `serving_install.py`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from ... import kernels as kernels_package
from ...ops import DTYPE_NAMES, DTYPES, get_op
from ...sanitizer.canonical import TextRefused, as_written, judge_text, read_back
from ...sanitizer.config_variant import ConfigStep, baseline_source, rebuild
from ..field_failures import FieldFailure
from ..manifest import (
    BASE_BASELINE,
    BASELINE,
    KERNEL,
    MANIFEST_VERSION,
    TORCH,
    Manifest,
    ManifestEntry,
    Variant,
    gpu_slug,
)
from . import serving_guard
from .serving_guard import Guard, GuardConfig, WarmupResult, guard_wanted

if TYPE_CHECKING:
    from ...sanitizer.canonical import JudgedText

MANIFEST_NAME = "manifest.json"
ENV_DIR = "KERNEL_AGENT_SERVING_DIR"


class ServingError(Exception):
    """The serving set is inconsistent or a kernel cannot be loaded (one-line message)."""


# --------------------------------------------------------------------------------------
# names and files


def serving_dir() -> Path:
    """`$KERNEL_AGENT_SERVING_DIR`, else `kernels/serving` beside the installed
    kernel_agent.kernels package (the repository folder in an editable install)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    return Path(kernels_package.__file__).resolve().parent / "serving"


def kernel_file_name(op: str, bucket: str, dtype: str, gpu: str) -> str:
    safe_bucket = re.sub(r"[^A-Za-z0-9_.=-]+", "-", bucket)
    return f"{op}__{safe_bucket}__{dtype}__{gpu_slug(gpu)}.py"


def _dir(dir: str | Path | None) -> Path:
    return Path(dir) if dir is not None else serving_dir()


def _atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_manifest(dir: str | Path | None = None) -> Manifest:
    """The manifest of the serving set in `dir` (default serving_dir()), parsed into its records; a missing
    file is an empty set, anything that is not a manifest a one-line ServingError naming the file."""
    path = _dir(dir) / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Manifest()
    try:
        return Manifest.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise ServingError(f"{path} is not valid JSON ({e})") from None
    except ValueError as e:
        raise ServingError(f"{path}: {e}") from None


def manifest_text(manifest: Manifest) -> str:
    """The manifest file's text: sorted keys, two-space indent, so that promotions diff cleanly."""
    return json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n"


def _write_manifest(dir: Path, entries: Sequence[ManifestEntry]) -> Manifest:
    manifest = Manifest(entries=tuple(entries))
    _atomic_write(dir / MANIFEST_NAME, manifest_text(manifest))
    return manifest


def lookup(op: str, bucket: str, dtype: str, gpu: str, dir: str | Path | None = None) -> Optional[ManifestEntry]:
    """The manifest entry for this key (GPU names compare by slug), or None."""
    return load_manifest(dir).find(op, bucket, dtype, gpu)


def promoted(op: str, bucket: str, dtype: str, gpu: str, dir: str | Path | None = None) -> Optional[ManifestEntry]:
    """The promoted kernel's entry for this key, or None (the key is served by the baseline or torch)."""
    e = lookup(op, bucket, dtype, gpu, dir)
    return e if e is not None and e.is_kernel else None


def _base_files(entries: Sequence[ManifestEntry]) -> set[str]:
    return {e.variant.base for e in entries if e.variant is not None and e.variant.base != BASE_BASELINE}


def _files(entries: Sequence[ManifestEntry]) -> set[str]:
    """Every file the entries need: their own kernel files and the files their variants rebuild from."""
    return {e.file for e in entries if e.file} | _base_files(entries)


def set_choice(
    op: str,
    bucket: str,
    dtype: str,
    gpu: str,
    impl: str,
    reason: str,
    measured: dict,
    dir: str | Path | None = None,
    replace_kernel: Optional[int] = None,
) -> Optional[ManifestEntry]:
    """Record that (op, bucket, dtype, gpu) is served by `impl` ('baseline' or 'torch'), with the
    measurements that chose it (`measured`: the times compared, their clock and shapes), and return the
    entry. A promoted kernel is replaced only when `replace_kernel` is its candidate id (the measurement
    compared torch with that very kernel): else None, and nothing changes. The manifest is rewritten
    only when the choice changes."""
    spec = get_op(op)
    if impl not in (BASELINE, TORCH):
        raise ValueError(f"set_choice: impl {impl!r}; expected {BASELINE!r} or {TORCH!r}")
    if impl == TORCH and spec.torch_impl() is None:
        raise ServingError(f"{op} has no torch implementation to serve")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    d = _dir(dir)
    manifest = load_manifest(d)
    old = manifest.find(op, bucket, dtype, gpu)
    if old is not None and old.is_kernel and (replace_kernel is None or old.candidate_id != replace_kernel):
        return None
    entry = ManifestEntry(op, bucket, dtype, gpu, impl, reason=reason, measured=dict(measured))
    if old is not None and _choice_fields(old) == _choice_fields(entry):
        return old
    entry = dataclasses.replace(entry, measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    written = _write_manifest(d, [*manifest.without(op, bucket, dtype, gpu), entry])
    _delete_orphans(d, written, [old] if old is not None else [])
    return entry


def _choice_fields(e: ManifestEntry) -> tuple:
    """What a choice records, without its time: the same choice again changes nothing."""
    return (e.op, e.bucket, e.dtype, e.gpu, e.impl, e.reason, e.measured)


def default_choice(op: str, dtype: str, gpu: str, entries: Sequence[ManifestEntry]) -> tuple[str, str]:
    """(impl, why) for a key that nothing was measured for: the choice that won most of the op's
    measured buckets in this dtype on this GPU, else on any GPU, else the baseline."""
    spec = get_op(op)
    if spec.torch_impl() is None:
        return BASELINE, f"{op} has no torch implementation; the baseline serves where nothing was promoted"
    chosen = [e for e in entries if e.op == op and e.dtype == dtype and e.impl in (BASELINE, TORCH)]
    here = [e for e in chosen if gpu_slug(e.gpu) == gpu_slug(gpu)]
    pool, where = (here, f"on {gpu}") if here else (chosen, "on other GPUs")
    n_torch = sum(1 for e in pool if e.impl == TORCH)
    if not pool:
        return BASELINE, f"nothing measured for {op} {dtype}: the baseline"
    impl = TORCH if n_torch * 2 > len(pool) else BASELINE
    return impl, (
        f"this bucket was not measured; {'torch' if impl == TORCH else 'the baseline'} was faster in "
        f"{n_torch if impl == TORCH else len(pool) - n_torch} of the {len(pool)} measured {op} {dtype} "
        f"buckets {where}"
    )


def remove(op: str, bucket: str, dtype: str, gpu: str, dir: str | Path | None = None) -> bool:
    """Take (op, bucket, dtype, gpu) out of the serving set (calls fall back to the
    default choice). False when there was no such entry."""
    d = _dir(dir)
    manifest = load_manifest(d)
    old = [e for e in manifest.entries if e.matches(op, bucket, dtype, gpu)]
    if not old:
        return False
    written = _write_manifest(d, manifest.without(op, bucket, dtype, gpu))
    _delete_orphans(d, written, old)
    return True


def _delete_orphans(d: Path, manifest: Manifest, old: Sequence[ManifestEntry]) -> None:
    """Delete files of dropped entries that no remaining entry names (after the manifest
    stopped naming them, so no reader is sent to a missing file)."""
    used = _files(manifest.entries)
    for f in _files(old):
        if f not in used:
            try:
                (d / f).unlink()
            except FileNotFoundError:
                pass


# --------------------------------------------------------------------------------------
# loading kernels

_module_ids = itertools.count()


def _baseline_text(op: str) -> str:
    """The canonical text of the op's baseline: what a variant of it is rebuilt from and hashed against."""
    return judge_text(baseline_source(op)).text


# this process's private folder for the texts it imports: rebuilt variants and the canonical text of each load
_rebuilt_dir: Optional[Path] = None
_rebuilt_lock = threading.Lock()


def _private_copy(text: str, name: str) -> Path:
    """`text` written under `name` into this process's private folder (mode 0700), in a folder of its own
    per load: what is imported is exactly the text that was checked, whatever happens to the original."""
    global _rebuilt_dir
    with _rebuilt_lock:
        if _rebuilt_dir is None:
            _rebuilt_dir = Path(tempfile.mkdtemp(prefix="kernel-agent-serving-"))
        folder = Path(tempfile.mkdtemp(prefix="load-", dir=_rebuilt_dir))
    path = folder / name
    _atomic_write(path, text)
    return path


def load_kernel_file(path: str | Path, op: str) -> Callable:
    """Import a kernel file's canonical text under a fresh module name and return its function named `op`.

    A promoted kernel was written by a model, and this process serves it: its bytes are read once and must
    read one way only, their canonical text (sanitizer/canonical.py) must pass the static gate (whose kernel
    language is also all that Triton's code generator may call while it compiles the kernels), and only that
    text, written to a private file, is imported; Triton and inspect read the kernels' source from that
    file. Anything else is a one-line ServingError, and nothing of the file has run. A fresh module name per
    load keeps two files (or two versions of one file) from sharing a module."""
    path = Path(path)
    if not path.is_file():
        raise ServingError(f"kernel file {path} does not exist")
    try:
        text = judge_text(path.read_bytes()).text
    except TextRefused as e:
        raise ServingError(f"kernel file {path} is refused by the static gate: {e}") from None
    from ...sanitizer.static_gate import check_source  # deferred: only a stack serving a promoted kernel loads the gate

    gate = check_source(text, op)
    if not gate.passed:
        raise ServingError(f"kernel file {path} is refused by the static gate: {gate.describe()}")
    stem = re.sub(r"\W", "_", path.stem)
    mod_name = f"kernel_agent_serving_{stem}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(mod_name, _private_copy(text, f"{stem}.py"))
    if spec is None or spec.loader is None:
        raise ServingError(f"kernel file {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise ServingError(f"kernel file {path} failed to import: {type(e).__name__}: {e}") from e
    fn = getattr(module, op, None)
    if not callable(fn):
        sys.modules.pop(mod_name, None)
        raise ServingError(f"kernel file {path} defines no function named {op!r}")
    return fn


def entry_name(entry: ManifestEntry) -> str:
    """The name a kernel entry is known by: its file, or for a variant the file it would have had."""
    return entry.file or kernel_file_name(entry.op, entry.bucket, entry.dtype, entry.gpu)


def variant_steps(entry: ManifestEntry) -> list[ConfigStep]:
    """The configurations of a variant entry, in the order they were stacked (empty for a file entry)."""
    return list(entry.variant.configs) if entry.variant is not None else []


def describe_entry(entry: ManifestEntry) -> str:
    """A kernel entry in a line: its file, or the base it tunes and its last configuration."""
    v = entry.variant
    if v is None:
        return entry.file or ""
    base = f"kernels/baseline/{entry.op}.py" if v.base == BASE_BASELINE else v.base
    steps = v.configs
    earlier = f" (over {len(steps) - 1} earlier)" if len(steps) > 1 else ""
    return f"{entry_name(entry)}: {base} with {steps[-1].describe()}{earlier}"


def rebuild_variant(op: str, variant: Variant, dir: str | Path | None = None) -> str:
    """The source a variant record stands for: its base (checked against the recorded hash) with its
    configurations applied by the function the search wrote them with (sanitizer/config_variant.py)."""
    base = variant.base
    if base == BASE_BASELINE:
        where, text = f"the baseline of {op}", _baseline_text(op)
    else:
        path = _dir(dir) / base
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ServingError(f"{path}, the base of a promoted configuration of {op}, is missing") from None
    if read_back(text, variant.base_hash) is None:
        raise ServingError(
            f"{where} changed since a configuration of it was promoted (hash "
            f"{as_written(text).hash[:12]}, recorded {variant.base_hash[:12]}); re-verify and "
            f"reinstall it"
        )
    try:
        return rebuild(text, list(variant.configs))
    except ValueError as e:
        raise ServingError(f"the promoted configuration of {op} cannot be applied to {where}: {e}") from None


def entry_source(entry: ManifestEntry, dir: str | Path | None = None) -> JudgedText:
    """The text a kernel entry serves, as `read_back` gives it: held to the `source_hash` the sanitizer and
    benchmark judged (the file's text, or the variant rebuilt from its base). ServingError (one line)
    otherwise. An entry that records no hash (written before hashes were) is its text as read."""
    name = entry_name(entry)
    if entry.variant is not None:
        text = rebuild_variant(entry.op, entry.variant, dir)
        held = read_back(text, entry.source_hash) if entry.source_hash is not None else None
        if held is None:
            raise ServingError(
                f"serving kernel {name} rebuilt from its base and configuration does not match its "
                f"manifest hash (configuration edited after promotion?); re-verify and reinstall it"
            )
        return held
    path = _dir(dir) / name
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ServingError(f"serving kernel {path} named in the manifest is missing") from None
    except UnicodeDecodeError:
        raise ServingError(f"serving kernel {path} is not UTF-8 text (edited after promotion?)") from None
    held = read_back(text, entry.source_hash or as_written(text).hash)
    if held is None:
        raise ServingError(
            f"serving kernel {path} does not match its manifest hash "
            f"(edited after promotion?); re-verify and reinstall it"
        )
    return held


def entry_path(entry: ManifestEntry, dir: str | Path | None = None) -> Path:
    """A file holding the entry's checked source, for what imports or judges kernels by path (Triton reads
    a kernel's source from its file): the serving file itself, or the rebuilt variant written once per
    process into a private temporary folder under the name the entry is known by."""
    text = entry_source(entry, dir).text
    if entry.variant is None:
        return _dir(dir) / entry_name(entry)
    global _rebuilt_dir
    with _rebuilt_lock:
        if _rebuilt_dir is None:
            _rebuilt_dir = Path(tempfile.mkdtemp(prefix="kernel-agent-serving-"))
        folder = _rebuilt_dir / str(entry.source_hash)[:16]
        path = folder / entry_name(entry)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            _atomic_write(path, text)
    return path


def baseline(op: str) -> Callable:
    """The baseline kernel of `op` (kernel_agent.kernels.baseline.<op>.<op>)."""
    get_op(op)  # ValueError for an unknown op
    module = importlib.import_module(f"kernel_agent.kernels.baseline.{op}")
    fn = getattr(module, op, None)
    if not callable(fn):
        raise ServingError(f"baseline module kernel_agent.kernels.baseline.{op} defines no function {op!r}")
    return fn


# --------------------------------------------------------------------------------------
# the dispatcher

_gpu_names: dict[int, str] = {}


def _device_gpu_name(first: Any) -> str:
    """The GPU the call runs on: the first tensor's CUDA device, else the current CUDA
    device, else 'cpu'. Cached per device (the driver call is not free)."""
    index: Optional[int] = None
    if isinstance(first, torch.Tensor) and first.is_cuda:
        index = first.device.index if first.device.index is not None else torch.cuda.current_device()
    elif torch.cuda.is_available():
        index = torch.cuda.current_device()
    if index is None:
        return "cpu"
    name = _gpu_names.get(index)
    if name is None:
        name = _gpu_names[index] = torch.cuda.get_device_name(index)
    return name


@dataclass(frozen=True)
class Resolution:
    """Which implementation serves a call, and why. impl: 'kernel' | 'baseline' | 'torch'; file: the
    promoted kernel's file name, or the name a promoted configuration is known by (`entry_name`; impl
    'kernel' only); why: the recorded reason or the default's."""

    impl: str
    why: str
    file: Optional[str] = None

    def __str__(self) -> str:
        return self.file if self.impl == KERNEL and self.file else self.impl


class Dispatcher:
    """Calls the fastest trusted implementation for each call's (bucket, dtype, GPU): the promoted
    kernel, the baseline or the op's torch implementation, as the manifest records (see the module).

    Accepts exactly the op's arguments (positional or by keyword) and passes them on
    unchanged. The manifest is re-read when its file changes (one stat per call), and
    each kernel file is imported once."""

    def __init__(
        self,
        op: str,
        gpu: str | None = None,
        dir: str | Path | None = None,
        guard: Optional[bool] = None,
        guard_config: Optional["GuardConfig"] = None,
        sink: Optional[Callable[[FieldFailure], None]] = None,
    ):
        self.op = op
        self._spec = get_op(op)
        self._params = tuple(self._spec.arg_names) + tuple(self._spec.optional_args)
        self._required = tuple(self._spec.arg_names)
        self.gpu = gpu
        self.dir = _dir(dir)
        self.__name__ = op
        self.__qualname__ = f"serving.get({op!r})"
        self.__doc__ = f"Serving dispatcher for {op}.\n\n{self._spec.contract}"
        self._lock = threading.Lock()
        self._stamp: Optional[tuple] = ("never read",)
        self._table: dict[tuple[str, str, str], ManifestEntry] = {}
        self._fns: dict[tuple[str, str], Callable] = {}
        self._baseline: Optional[Callable] = None
        self._entries: tuple[ManifestEntry, ...] = ()
        self._defaults: dict[tuple[str, str], tuple[str, str]] = {}
        self.guard: Optional[Guard] = None
        if guard_wanted(guard):
            self.guard = _new_guard(self, guard_config, sink)

    def __repr__(self) -> str:
        return f"<serving dispatcher {self.op} dir={str(self.dir)!r}>"

    # -- arguments --------------------------------------------------------------------
    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The call's arguments by name, with a TypeError for what the op would reject."""
        if len(args) > len(self._params):
            raise TypeError(f"{self.op}() takes at most {len(self._params)} arguments ({len(args)} given)")
        bound = dict(zip(self._params, args))
        for k, v in kwargs.items():
            if k not in self._params:
                raise TypeError(f"{self.op}() got an unexpected keyword argument {k!r}")
            if k in bound:
                raise TypeError(f"{self.op}() got multiple values for argument {k!r}")
            bound[k] = v
        missing = [p for p in self._required if p not in bound]
        if missing:
            raise TypeError(f"{self.op}() missing required argument(s): {', '.join(missing)}")
        return bound

    def key(self, *args: Any, **kwargs: Any) -> tuple[str, str, str]:
        """(bucket, dtype name, GPU name) of a call."""
        return self._key_of(self.bind(*args, **kwargs))

    def _key_of(self, bound: dict[str, Any]) -> tuple[str, str, str]:
        first = bound[self._required[0]]
        shape = self._spec.shape_of(bound)
        bucket = self._spec.bucket(shape)
        dtype = DTYPE_NAMES.get(getattr(first, "dtype", None), str(getattr(first, "dtype", "")))  # type: ignore[arg-type]
        gpu = self.gpu if self.gpu is not None else _device_gpu_name(first)
        return bucket, dtype, gpu

    # -- the manifest -----------------------------------------------------------------
    def _refresh(self) -> None:
        path = self.dir / MANIFEST_NAME
        try:
            st = path.stat()
            stamp: Optional[tuple] = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        with self._lock:
            manifest = load_manifest(self.dir) if stamp is not None else Manifest()
            self._table = {(e.bucket, e.dtype, gpu_slug(e.gpu)): e for e in manifest.entries if e.op == self.op}
            self._entries = manifest.entries
            self._defaults = {}
            self._stamp = stamp

    def _entry(self, bucket: str, dtype: str, gpu: str) -> Optional[ManifestEntry]:
        self._refresh()
        return self._table.get((bucket, dtype, gpu_slug(gpu)))

    def _load(self, entry: ManifestEntry) -> Callable:
        cache_key = (entry_name(entry), entry.source_hash or "")
        fn = self._fns.get(cache_key)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._fns.get(cache_key)
            if fn is None:
                fn = self._fns[cache_key] = load_kernel_file(entry_path(entry, self.dir), self.op)
        return fn

    def _baseline_fn(self) -> Callable:
        if self._baseline is None:
            self._baseline = baseline(self.op)
        return self._baseline

    def _torch_fn(self) -> Callable:
        fn = self._spec.torch_impl()
        if fn is None:  # a hand-edited manifest: set_choice refuses this
            raise ServingError(f"the serving manifest chooses torch for {self.op}, which has no torch implementation")
        return fn

    # -- the API ----------------------------------------------------------------------
    def _resolve_key(self, bucket: str, dtype: str, gpu: str) -> tuple[Resolution, Optional[ManifestEntry]]:
        entry = self._entry(bucket, dtype, gpu)
        if entry is not None:
            return Resolution(entry.impl, entry.reason or "", entry_name(entry) if entry.is_kernel else None), entry
        key = (dtype, gpu_slug(gpu))
        if key not in self._defaults:
            self._defaults[key] = default_choice(self.op, dtype, gpu, self._entries)
        return Resolution(*self._defaults[key]), None

    def resolve(self, *args: Any, **kwargs: Any) -> Resolution:
        """Which implementation a call with these arguments would run, and why."""
        return self._resolve_key(*self.key(*args, **kwargs))[0]

    def kernel_for(self, *args: Any, **kwargs: Any) -> Callable:
        """The function the manifest gives a call with these arguments: for a promoted kernel, the kernel itself,
        which calling directly bypasses the guard (the dispatcher's own call is guarded)."""
        r, entry = self._resolve_key(*self.key(*args, **kwargs))
        if entry is not None and entry.is_kernel:
            return self._load(entry)
        return self._torch_fn() if r.impl == TORCH else self._baseline_fn()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.bind(*args, **kwargs)
        bucket, dtype, gpu = self._key_of(bound)
        r, entry = self._resolve_key(bucket, dtype, gpu)
        if entry is not None and entry.is_kernel:
            if self.guard is not None:
                return self.guard.serve(entry, lambda: self._load(entry), gpu, bound, args, kwargs)
            return self._load(entry)(*args, **kwargs)
        return (self._torch_fn() if r.impl == TORCH else self._baseline_fn())(*args, **kwargs)

    def verify(self, *args: Any, **kwargs: Any) -> WarmupResult:
        """Check the class of this call now (synchronously) where a promoted kernel serves it, and say what
        was found; a class served by the baseline or torch is trusted and not checked. The class's state
        follows the result: verified (the kernel serves it) or retired (the trusted implementation does)."""
        bound = self.bind(*args, **kwargs)
        bucket, dtype, gpu = self._key_of(bound)
        r, entry = self._resolve_key(bucket, dtype, gpu)
        text = serving_guard.class_text(serving_guard.class_key(bound, self._params))
        if entry is None or not entry.is_kernel:
            return WarmupResult(bucket, text, r.impl, True, None, f"{r.impl}: trusted, not checked", 0.0)
        if self.guard is None:
            return WarmupResult(bucket, text, KERNEL, False, None, "the guard is off: nothing was checked", 0.0)
        outcome = self.guard.check_now(entry, gpu, bound)
        passed = outcome.kind is None
        return WarmupResult(bucket, text, KERNEL, passed, outcome.kind, outcome.detail, outcome.child_s)

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Wait for the guard's checks in flight (True at once when the guard is off)."""
        return self.guard.wait(timeout_s) if self.guard is not None else True


def _new_guard(d: Dispatcher, config: Optional[GuardConfig], sink: Optional[Callable[[FieldFailure], None]]) -> Guard:
    """The guard of a dispatcher: the baseline is its trusted implementation, the module's sink its default."""
    return Guard(
        d.op,
        trusted=lambda *a, **k: d._baseline_fn()(*a, **k),
        path_of=lambda entry: entry_path(entry, d.dir),
        config=config,
        sink=sink or (lambda ff: _field_failure_sink(d.dir)(ff)),
        name_of=entry_name,
    )


_sink_override: Optional[Callable[[FieldFailure], None]] = None


def set_field_failure_sink(sink: Optional[Callable[[FieldFailure], None]]) -> None:
    """Where every dispatcher made without a sink of its own sends its field failures from now on (None:
    back to the default, serving_guard.default_sink: the ledger, else a JSON-lines file)."""
    global _sink_override
    _sink_override = sink


def _field_failure_sink(dir: Path) -> Callable[[FieldFailure], None]:
    return _sink_override or serving_guard.default_sink(dir)


def get(
    op: str,
    gpu: str | None = None,
    dir: str | Path | None = None,
    guard: Optional[bool] = None,
    guard_config: Optional[GuardConfig] = None,
    sink: Optional[Callable[[FieldFailure], None]] = None,
) -> Dispatcher:
    """The serving entry point: a callable with `op`'s signature that runs, for each call's shape
    bucket, dtype and GPU, the fastest trusted implementation (a promoted kernel, the baseline or
    torch; `resolve` says which and why).
    `gpu` pins the GPU name (default: the device of the call); `dir` the serving set.
    `guard`: verify each shape class of a promoted kernel before it serves it (harness/serving/serving_guard.py;
    default on unless KERNEL_AGENT_SERVING_GUARD=off); `guard_config` its limits; `sink` where its field
    failures go (default: set_field_failure_sink's, else the ledger)."""
    return Dispatcher(op, gpu=gpu, dir=dir, guard=guard, guard_config=guard_config, sink=sink)


def warmup(
    op: str,
    calls: Sequence[Any],
    dir: str | Path | None = None,
    gpu: str | None = None,
    sink: Optional[Callable[[FieldFailure], None]] = None,
    config: Optional[GuardConfig] = None,
    dispatcher: Optional[Dispatcher] = None,
    dtype: Optional[torch.dtype] = None,
    device: Optional[str] = None,
) -> list[WarmupResult]:
    """Verify the shape class of each call before traffic, synchronously, and return what each found. A call
    is a mapping of argument names to tensors and values, a tuple of positional arguments, (args, kwargs), or
    a shape (the op's Shape or its text, "T=4,H=2,D=16"), whose inputs the op makes in `dtype` on `device`
    (default bfloat16 on a GPU, float32 on the CPU). `dispatcher`: the one that will serve (its classes are
    marked); default a guarded one made here."""
    d = dispatcher or get(op, gpu=gpu, dir=dir, guard=True, guard_config=config, sink=sink)
    return serving_guard.warmup_calls(d, calls, dtype, device)


__all__ = [
    "ServingError",
    "ENV_DIR",
    "Dispatcher",
    "Resolution",
    "get",
    "warmup",
    "set_field_failure_sink",
    "GuardConfig",
    "WarmupResult",
    "FieldFailure",
    "serving_dir",
    "load_manifest",
    "manifest_text",
    "Manifest",
    "ManifestEntry",
    "Variant",
    "set_choice",
    "default_choice",
    "remove",
    "lookup",
    "promoted",
    "load_kernel_file",
    "baseline",
    "entry_name",
    "entry_source",
    "entry_path",
    "rebuild_variant",
    "variant_steps",
    "describe_entry",
    "gpu_slug",
    "kernel_file_name",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "KERNEL",
    "BASELINE",
    "TORCH",
    "BASE_BASELINE",
]

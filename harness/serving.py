"""The serving kernel set: promoted kernels, their manifest, and the API a serving stack calls.

Layout (DESIGN section 6): the folder `kernels/serving/` holds `manifest.json` and one
kernel file per promoted (op, shape bucket, dtype, GPU), named
`<op>__<bucket>__<dtype>__<gpu-slug>.py`. Each file is a complete candidate: it
defines a function named after the op with the op's contract signature. Promotion
writes the set (`install`, `remove`); CI re-verifies it; a serving stack only reads
it, through `get`:

    from kernel_agent.harness import serving
    quantize_kv = serving.get("quantize_kv")
    x_q, scale = quantize_kv(x)          # the promoted kernel for x's bucket, or the baseline

Writes are atomic (a temporary file, then os.replace), so a reader never sees half a
kernel or half a manifest. The manifest is sorted, so promotions diff cleanly in pull
requests. This module imports no database code: serving needs torch, triton and the
op registry only.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..sanitizer.static_gate import check_source
from .ops import DTYPE_NAMES, DTYPES, get_op

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
ENV_DIR = "KERNEL_AGENT_SERVING_DIR"
BASELINE = "baseline"


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
    import kernel_agent.kernels

    return Path(kernel_agent.kernels.__file__).resolve().parent / "serving"


def gpu_slug(gpu: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': lowercase, runs of other characters to '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    return slug or "unknown"


def kernel_file_name(op: str, bucket: str, dtype: str, gpu: str) -> str:
    safe_bucket = re.sub(r"[^A-Za-z0-9_.=-]+", "-", bucket)
    return f"{op}__{safe_bucket}__{dtype}__{gpu_slug(gpu)}.py"


def source_hash(text: str) -> str:
    """The same normalised hash as kernel_agent.harness.ledger.hash_source (kept here
    so that serving does not import the database layer; a test keeps them equal)."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


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


def _empty_manifest() -> dict:
    return {"version": MANIFEST_VERSION, "entries": []}


def load_manifest(dir: str | Path | None = None) -> dict:
    """The manifest of the serving set in `dir` (default serving_dir()); a missing file
    is an empty set."""
    path = _dir(dir) / MANIFEST_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _empty_manifest()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ServingError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ServingError(f"{path} is not a serving manifest (expected an object with an 'entries' list)")
    if data.get("version") != MANIFEST_VERSION:
        raise ServingError(f"{path} has manifest version {data.get('version')!r}; this kernel-agent reads "
                           f"version {MANIFEST_VERSION}")
    return data


def _write_manifest(dir: Path, manifest: dict) -> None:
    entries = sorted(manifest["entries"], key=lambda e: (e["op"], e["bucket"], e["dtype"], gpu_slug(e["gpu"])))
    doc = {"version": MANIFEST_VERSION, "entries": entries}
    _atomic_write(dir / MANIFEST_NAME, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _same_key(entry: dict, op: str, bucket: str, dtype: str, gpu: str) -> bool:
    return (entry.get("op") == op and entry.get("bucket") == bucket and entry.get("dtype") == dtype
            and gpu_slug(str(entry.get("gpu", ""))) == gpu_slug(gpu))


def lookup(op: str, bucket: str, dtype: str, gpu: str, dir: str | Path | None = None) -> dict | None:
    """The manifest entry for this key (GPU names compare by slug), or None."""
    for e in load_manifest(dir)["entries"]:
        if _same_key(e, op, bucket, dtype, gpu):
            return e
    return None


def _defines_function(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ServingError(f"kernel source does not parse: {e.msg} (line {e.lineno})") from None
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def install(op: str, bucket: str, dtype: str, gpu: str, source: str, candidate_id: int | None, gain: float,
            reason: str, versions: dict, dir: str | Path | None = None, shapes: Sequence[str] = ()) -> dict:
    """Put `source` in the serving set for (op, bucket, dtype, gpu), replacing any entry
    for that key, and return the manifest entry. `shapes`: the shape keys it was judged on (a
    reviewer, and a check of the serving set, find them there). The kernel file is written before
    the manifest names it, so a reader never finds an entry without its file."""
    get_op(op)  # ValueError for an unknown op
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if not _defines_function(source, op):
        raise ServingError(f"kernel source for {op} defines no top-level function named {op!r}")
    gate = check_source(source, op)
    if not gate.passed:
        raise ServingError(f"kernel source for {op} is refused by the static gate: {gate.describe()}")
    d = _dir(dir)
    name = kernel_file_name(op, bucket, dtype, gpu)
    text = source if source.endswith("\n") else source + "\n"
    _atomic_write(d / name, text)
    entry = {
        "op": op, "bucket": bucket, "dtype": dtype, "gpu": gpu, "file": name,
        "source_hash": source_hash(text), "candidate_id": candidate_id,
        "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "gain": float(gain), "reason": reason, "versions": dict(versions or {}), "shapes": list(shapes),
    }
    manifest = load_manifest(d)
    old = [e for e in manifest["entries"] if _same_key(e, op, bucket, dtype, gpu)]
    manifest["entries"] = [e for e in manifest["entries"] if not _same_key(e, op, bucket, dtype, gpu)] + [entry]
    _write_manifest(d, manifest)
    _delete_orphans(d, manifest, old)
    return entry


def remove(op: str, bucket: str, dtype: str, gpu: str, dir: str | Path | None = None) -> bool:
    """Take (op, bucket, dtype, gpu) out of the serving set (calls fall back to the
    baseline). False when there was no such entry."""
    d = _dir(dir)
    manifest = load_manifest(d)
    old = [e for e in manifest["entries"] if _same_key(e, op, bucket, dtype, gpu)]
    if not old:
        return False
    manifest["entries"] = [e for e in manifest["entries"] if not _same_key(e, op, bucket, dtype, gpu)]
    _write_manifest(d, manifest)
    _delete_orphans(d, manifest, old)
    return True


def _delete_orphans(d: Path, manifest: dict, old: list[dict]) -> None:
    """Delete files of dropped entries that no remaining entry names (after the manifest
    stopped naming them, so no reader is sent to a missing file)."""
    used = {e.get("file") for e in manifest["entries"]}
    for e in old:
        f = e.get("file")
        if f and f not in used:
            try:
                (d / f).unlink()
            except FileNotFoundError:
                pass


# --------------------------------------------------------------------------------------
# loading kernels

_module_ids = itertools.count()


def load_kernel_file(path: str | Path, op: str) -> Callable:
    """Import a kernel file by path under a fresh module name and return its function
    named `op`. A fresh name per load keeps two files (or two versions of one file)
    from sharing a module; the module is registered in sys.modules because Triton
    and inspect look functions' modules up there."""
    path = Path(path)
    if not path.is_file():
        raise ServingError(f"kernel file {path} does not exist")
    # A promoted kernel was written by a model: it is imported only if it is still in the candidate
    # language (a file edited after promotion, or one that never passed the sanitizer, is refused).
    gate = check_source(path.read_text(), op)
    if not gate.passed:
        raise ServingError(f"kernel file {path} is refused by the static gate: {gate.describe()}")
    stem = re.sub(r"\W", "_", path.stem)
    mod_name = f"kernel_agent_serving_{stem}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
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
    import torch

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


class Dispatcher:
    """Calls the promoted kernel for each call's (bucket, dtype, GPU), or the baseline.

    Accepts exactly the op's arguments (positional or by keyword) and passes them on
    unchanged. The manifest is re-read when its file changes (one stat per call), and
    each kernel file is imported once."""

    def __init__(self, op: str, gpu: str | None = None, dir: str | Path | None = None):
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
        self._table: dict[tuple[str, str, str], dict] = {}
        self._fns: dict[tuple[str, str], Callable] = {}
        self._baseline: Optional[Callable] = None

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
        bound = self.bind(*args, **kwargs)
        first = bound[self._required[0]]
        shape = self._spec.shape_of(bound)
        bucket = self._spec.bucket(shape)
        dtype = DTYPE_NAMES.get(getattr(first, "dtype", None), str(getattr(first, "dtype", "")))
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
            manifest = load_manifest(self.dir) if stamp is not None else _empty_manifest()
            self._table = {(e["bucket"], e["dtype"], gpu_slug(str(e["gpu"]))): e
                           for e in manifest["entries"] if e.get("op") == self.op}
            self._stamp = stamp

    def _entry(self, bucket: str, dtype: str, gpu: str) -> Optional[dict]:
        self._refresh()
        return self._table.get((bucket, dtype, gpu_slug(gpu)))

    def _load(self, entry: dict) -> Callable:
        cache_key = (entry["file"], entry.get("source_hash", ""))
        fn = self._fns.get(cache_key)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._fns.get(cache_key)
            if fn is None:
                path = self.dir / entry["file"]
                try:
                    text = path.read_text(encoding="utf-8")
                except FileNotFoundError:
                    raise ServingError(f"serving kernel {path} named in the manifest is missing") from None
                if entry.get("source_hash") and source_hash(text) != entry["source_hash"]:
                    raise ServingError(f"serving kernel {path} does not match its manifest hash "
                                       f"(edited after promotion?); re-verify and reinstall it")
                fn = self._fns[cache_key] = load_kernel_file(path, self.op)
        return fn

    def _baseline_fn(self) -> Callable:
        if self._baseline is None:
            self._baseline = baseline(self.op)
        return self._baseline

    # -- the API ----------------------------------------------------------------------
    def resolve(self, *args: Any, **kwargs: Any) -> str:
        """Which kernel a call with these arguments would run: its file name, or 'baseline'."""
        entry = self._entry(*self.key(*args, **kwargs))
        return entry["file"] if entry is not None else BASELINE

    def kernel_for(self, *args: Any, **kwargs: Any) -> Callable:
        """The function a call with these arguments would run."""
        entry = self._entry(*self.key(*args, **kwargs))
        return self._load(entry) if entry is not None else self._baseline_fn()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.kernel_for(*args, **kwargs)(*args, **kwargs)


def get(op: str, gpu: str | None = None, dir: str | Path | None = None) -> Dispatcher:
    """The serving entry point: a callable with `op`'s signature that runs the promoted
    kernel for each call's shape bucket, dtype and GPU, and the baseline otherwise.
    `gpu` pins the GPU name (default: the device of the call); `dir` the serving set."""
    return Dispatcher(op, gpu=gpu, dir=dir)


__all__ = ["ServingError", "Dispatcher", "get", "serving_dir", "load_manifest", "install", "remove", "lookup",
           "load_kernel_file", "baseline", "gpu_slug", "kernel_file_name", "source_hash", "MANIFEST_NAME"]

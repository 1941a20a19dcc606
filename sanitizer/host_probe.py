"""Serving sizes: a candidate's host code run at the sizes serving sends it, with nothing allocated.

The checks run kernels at the sizes Triton's interpreter affords; serving sends batches of 254, pools of 66000
pages, 131072-token contexts, bfloat16. What the host code does there (raise, allocate 64 GiB of scratch, launch
a kernel per sequence, loop for seconds) is decided by metadata alone: the candidate language lets host code
read shapes, strides, dtypes and the device and allocate with torch.empty*, never read a tensor's values or
catch an exception (sanitizer/guard.py, sanitizer/static_gate.py). So the host code is run at those sizes
exactly, on fake tensors (torch's FakeTensorMode: a shape, strides, a dtype and a CPU device, and no memory),
with every Triton launch counted and not run, and compared with the baseline's host code at the same point:

* it raises, or does what host code may not, at a size the contract admits (the baseline does not raise there);
* it allocates more than ALLOC_FACTOR times the baseline's bytes plus ALLOC_SLACK;
* it launches more than LAUNCH_FACTOR times the baseline's kernels plus LAUNCH_SLACK;
* its host code takes longer than HOST_S;
* it launches a grid past CUDA's limits (GRID_LIMITS: 65535 programs on y and z), which fails on the device
  while the interpreter runs it.

The points (points()): every region of the op's domain (the GPU's too), every shape of its shape suites, and
each of those suite shapes with one contract dimension at its largest value (Op.value_dims), or the largest
power-of-two fraction of it whose inputs fit, in every dtype the op admits, each on fake CPU tensors and on
fake CUDA tensors of a 132-SM GPU, every third point also of another SM count (host code may read the device),
up to MAX_POINT_BYTES of inputs and the baseline's allocations (served_by_baseline). What it cannot see: a kernel's
own behaviour (no kernel runs here), and host code that tells fake tensors apart from real ones, which the
candidate language leaves no way to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode

ALLOC_FACTOR = 64  # a candidate may allocate this many times the baseline's bytes (32 split-K partials in float32)
ALLOC_SLACK = 1 << 30  # ... plus this much
LAUNCH_FACTOR = 16  # launches per call: this many times the baseline's ...
LAUNCH_SLACK = 16  # ... plus this many
HOST_S = 5.0  # one call's host code at one point (fake tensors cost about 0.1 ms an operation)
POINT_TIMEOUT_S = 30.0  # the executor's answer for one request of points; past it a call stalled
POINTS_PER_REQUEST = 48  # points sent to the executor at once (each is milliseconds; a round trip costs as much)
MAX_POINT_BYTES = 1 << 37  # a point's inputs plus the baseline's allocations: past it, no GPU of today holds it


@dataclass(frozen=True)
class Point:
    """One call's arguments as metadata: `args` is a list of (name, value), where a tensor is a dict of its
    shape, strides, storage offset, dtype, storage size in elements and a storage key shared by views of one
    storage (a K and a V cache in one buffer)."""

    label: str
    args: Tuple[Tuple[str, Any], ...]
    input_bytes: int
    device: str = "cpu"  # where the fake tensors say they live: "cpu", or "cuda" with `sms` multiprocessors
    sms: int = 0

    def wire(self) -> Dict[str, Any]:
        return {"label": self.label, "args": [[k, v] for k, v in self.args], "device": self.device, "sms": self.sms}


def _spec(t: torch.Tensor, storages: Dict[int, int]) -> Dict[str, Any]:
    key = storages.setdefault(t.untyped_storage()._cdata, len(storages))
    return {
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset": t.storage_offset(),
        "dtype": str(t.dtype).replace("torch.", ""),
        "numel": t.untyped_storage().nbytes() // t.element_size(),
        "storage": key,
    }


def _point(label: str, args: Dict[str, Any]) -> Optional[Point]:
    storages: Dict[int, int] = {}
    out: List[Tuple[str, Any]] = []
    total = 0
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            out.append((k, _spec(v, storages)))
            total += v.untyped_storage().nbytes()
        elif v is None or isinstance(v, (bool, int, float)):
            out.append((k, v))
        else:
            return None
    return Point(label, tuple(out), total) if total <= MAX_POINT_BYTES else None


_POINTS: Dict[str, List[Point]] = {}


def points(op) -> List[Point]:
    """The serving sizes of `op` to run the host code at (see the module's docstring), each once; made once per
    op and process."""
    if op.name not in _POINTS:
        _POINTS[op.name] = [v for i, p in enumerate(_make_points(op)) for v in _on_devices(p, i)]
    return _POINTS[op.name]


# SM counts a point is also run at on a CUDA device besides the H100's and H200's 132, one a point in turn: an
# A100's, a B200's, an H100 PCIe's
OTHER_SMS = (108, 148, 114)


def _on_devices(p: Point, i: int) -> List[Point]:
    """The point on fake CPU tensors and on fake CUDA tensors of a 132-SM GPU, and every third point on one of
    another SM count: host code may read the device (`q.is_cuda`, the SM count), and serving calls it on CUDA."""
    sms = [132] + ([OTHER_SMS[(i // 3) % len(OTHER_SMS)]] if i % 3 == 0 else [])
    return [p] + [dataclasses.replace(p, label=f"{p.label}, on CUDA with {n} SMs", device="cuda", sms=n) for n in sms]


def _make_points(op) -> List[Point]:
    shapes: List[Tuple[str, Any, str, Tuple]] = [(r.name, r.shape, r.layout, r.args) for r in op.domain().regions]
    suites = [sh for _, suite in sorted(op.shape_suites().items()) for sh in suite]
    shapes += [(str(sh), sh, "contiguous", ()) for sh in suites]
    for sh in suites:
        for dim in op.value_dims:
            pushed = _largest_that_fits(op, sh, dim)
            if pushed is not None:
                shapes.append((f"{sh} with {dim.name}={pushed[0]}", pushed[1], "contiguous", ()))
    out: List[Point] = []
    seen = set()
    for label, shape, layout, extra in shapes:
        for dtype in op.dtypes:
            try:
                case = op.make_case(shape, dtype, seed=0, dist="normal", layout=layout, device="meta")
            except (ValueError, RuntimeError, NotImplementedError, TypeError):
                continue  # a region the op cannot lay out at this dtype
            case.args.update(dict(extra))
            p = _point(f"{label}, {str(dtype).replace('torch.', '')}", case.args)
            if p is None or repr(p.args) in seen:
                continue
            seen.add(repr(p.args))
            out.append(p)
    return out


def _largest_that_fits(op, shape, dim) -> Optional[Tuple[int, Any]]:
    """(value, shape): `shape` with dimension `dim` at the contract's largest value whose inputs fit half of
    MAX_POINT_BYTES, or within a factor of 2 of it (a batch of 2048 prompts of 4096 tokens at 32 heads where 4096
    would not fit), or None where even the shape's own size at that dimension does not."""
    value = dim.hi
    while value >= 1:
        try:
            pushed = op.with_value(shape, dim.name, value)
            case = op.make_case(pushed, op.dtypes[0], seed=0, dist="normal", device="meta")
        except (ValueError, TypeError, RuntimeError, NotImplementedError):
            return None
        inputs = sum(v.untyped_storage().nbytes() for v in case.args.values() if isinstance(v, torch.Tensor))
        if inputs <= MAX_POINT_BYTES // 2:  # half of it: the outputs and the baseline's scratch come on top
            return value, pushed
        value //= 2
    return None


def build(args: List[List[Any]], device: str = "cpu") -> Dict[str, Any]:
    """The call's arguments from a point's wire form: fake tensors on `device`, made inside the caller's
    FakeTensorMode."""
    storages: Dict[Any, torch.Tensor] = {}
    out: Dict[str, Any] = {}
    for name, v in args:
        if not isinstance(v, dict):
            out[str(name)] = v
            continue
        dtype = getattr(torch, str(v["dtype"]))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a dtype: {v['dtype']!r}")
        base = storages.get(v["storage"])
        if base is None or base.numel() < int(v["numel"]) or base.dtype != dtype:
            base = storages[v["storage"]] = torch.empty(int(v["numel"]), dtype=dtype, device=device)
        out[str(name)] = base.as_strided([int(x) for x in v["shape"]], [int(x) for x in v["stride"]], int(v["offset"]))
    return out


# CUDA's largest grid: x up to 2^31 - 1 programs, y and z up to 65535 (a launch past them fails on the device,
# while Triton's interpreter runs it)
GRID_LIMITS = ((1 << 31) - 1, 65535, 65535)


def _grid(grid: Any, names: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[int, ...]:
    """A launch's grid as numbers ((), where it cannot be told): a callable one is given the launch's arguments by
    name, as Triton gives them (its meta-parameters among them)."""
    try:
        if callable(grid):
            grid = grid({**dict(zip(names or (), args)), **kwargs})
        if not isinstance(grid, (tuple, list)):
            grid = (grid,)
        return tuple(int(g) for g in grid)
    except Exception:  # noqa: BLE001 - a grid this cannot evaluate is left to the device's own launch
        return ()


@contextlib.contextmanager
def _launches_counted(count: List[int], oversized: List[str]):
    """Every Triton launch counted and not run (the interpreter's, or the compiled launcher's on a GPU); a launch
    whose grid is past GRID_LIMITS is named in `oversized`."""
    import triton.runtime.interpreter as interp  # deferred: triton reads TRITON_INTERPRET when first imported
    from triton.runtime.jit import JITFunction  # deferred: triton reads TRITON_INTERPRET when first imported

    def counted(self, *args, **kwargs):
        count[0] += 1
        grid = _grid(kwargs.pop("grid", getattr(self, "grid", (1,))), getattr(self, "arg_names", None), args, kwargs)
        if any(g > limit for g, limit in zip(grid, GRID_LIMITS)) and not oversized:
            name = getattr(getattr(self, "fn", None), "__name__", None) or getattr(self, "__name__", "a kernel")
            oversized.append(f"{name} with grid {grid}")

    saved = (interp.GridExecutor.__call__, JITFunction.run)
    interp.GridExecutor.__call__, JITFunction.run = counted, counted
    try:
        yield
    finally:
        interp.GridExecutor.__call__, JITFunction.run = saved


@contextlib.contextmanager
def _gpu_of(device: str, sms: int):
    """On a fake CUDA device, torch.cuda.get_device_properties answers for a GPU of `sms` multiprocessors (the one
    property the candidate language reads), and FakeTensorMode does not make the one real CUDA tensor it makes
    on a GPU machine the first time it fakes one (for autograd, which nothing here uses): a judge on the CPU stage
    must not open a CUDA context. Nothing changes on the CPU."""
    if device != "cuda":
        yield
        return
    props = types.SimpleNamespace(multi_processor_count=sms, name=f"a GPU of {sms} SMs", major=9, minor=0)
    saved = torch.cuda.get_device_properties, getattr(fake_tensor, "init_gpu_context", None)
    torch.cuda.get_device_properties = lambda *a, **k: props  # type: ignore[assignment]
    if saved[1] is not None:
        fake_tensor.init_gpu_context = lambda device: None  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.get_device_properties = saved[0]
        if saved[1] is not None:
            fake_tensor.init_gpu_context = saved[1]


def _fakes_without_a_gpu(device: str) -> str:
    """Why fake `device` tensors cannot be made here without touching a real GPU ('' when they can): on a torch
    whose FakeTensorMode initialises CUDA by another way than init_gpu_context, a visible GPU is left alone."""
    if device == "cuda" and not hasattr(fake_tensor, "init_gpu_context") and torch.cuda.is_available():
        return "fake CUDA tensors would initialise the visible GPU on this torch"
    return ""


def run_at(fn: Callable, point_args: List[List[Any]], path: str, device: str = "cpu", sms: int = 0) -> Dict[str, Any]:
    """One call of `fn`'s host code on a point's fake tensors (on `device`, a GPU of `sms` multiprocessors for
    "cuda"): what it raised (or the guard refused), the bytes it allocated, its launches and its time. `path`:
    the file whose line an error names."""
    from .execution import describe_exception  # deferred: execution imports triton
    from .guard import HostGuard  # deferred: guard imports the interpreter's hooks

    if device not in ("cpu", "cuda"):
        raise ValueError(f"no fake device {device!r}")
    why_not = _fakes_without_a_gpu(device)
    if why_not:
        return {"unavailable": why_not}
    mode = FakeTensorMode()
    try:
        with _gpu_of(device, sms), mode:
            args = build(point_args, device)
    except Exception as e:  # noqa: BLE001 - trusted code before the candidate's: this host cannot fake the device
        return {"unavailable": f"fake {device} tensors cannot be made here: {type(e).__name__}: {e}"[:300]}
    guard = HostGuard(sentinel=-1)
    count = [0]
    oversized: List[str] = []
    error = ""
    t0 = time.perf_counter()
    try:
        # the guard compares storages by address to tell a view from a copy; a fake one has none (and says so)
        with warnings.catch_warnings(), _gpu_of(device, sms), _launches_counted(count, oversized), mode, guard:
            warnings.simplefilter("ignore")
            fn(**args)
    except BaseException as e:  # noqa: BLE001 - the candidate's failure is evidence, whatever it is
        if isinstance(e, KeyboardInterrupt):
            raise
        error = guard.violations[0] if guard.violations else describe_exception(e, path)
    elapsed = time.perf_counter() - t0
    allocated = sum(t.untyped_storage().nbytes() for t in guard.fresh if isinstance(t, torch.Tensor))
    return {
        "error": error,
        "bytes": int(allocated),
        "launches": count[0],
        "oversized": oversized[0] if oversized else "",
        "elapsed_s": elapsed,
    }


def unavailable(result: Dict[str, Any]) -> str:
    """Why run_at could not run a point at all ('' when it ran): the host cannot fake the point's device."""
    return str(result.get("unavailable") or "")


def judge(label: str, got: Dict[str, Any], baseline: Dict[str, Any]) -> str:
    """Why the candidate's host code at one point is a fault ('' when it is none); `baseline`: the baseline's
    run_at at the same point, which did not raise."""
    if got.get("error"):
        return f"its host code fails at a size the contract admits ({label}): {got['error']}"
    if got.get("oversized"):
        return (
            f"it launches {got['oversized']} at {label}: past CUDA's grid of 2^31-1 x 65535 x 65535 programs, "
            f"a launch that fails on the device"
        )
    gib = 1 << 30
    if got["bytes"] > ALLOC_FACTOR * baseline["bytes"] + ALLOC_SLACK:
        return (
            f"its host code allocates {got['bytes'] / gib:.2f} GiB per call at {label}, the baseline "
            f"{baseline['bytes'] / gib:.3f} GiB (at most {ALLOC_FACTOR}x plus {ALLOC_SLACK / gib:.0f} GiB)"
        )
    if got["launches"] > LAUNCH_FACTOR * baseline["launches"] + LAUNCH_SLACK:
        return (
            f"its host code launches {got['launches']} kernels per call at {label}, the baseline "
            f"{baseline['launches']} (at most {LAUNCH_FACTOR}x plus {LAUNCH_SLACK})"
        )
    if got["elapsed_s"] > HOST_S:
        return f"its host code took {got['elapsed_s']:.1f} s of one call at {label} (at most {HOST_S:.0f} s)"
    return ""


def warm() -> None:
    """Everything run_at uses, run once: the executor calls it before its audit hook is armed, since the first
    fake tensor imports modules of torch's (an import inside the sandbox is refused)."""

    def fn(x):
        return torch.empty_like(x[:1])

    x = {"shape": [2, 3], "stride": [3, 1], "offset": 0, "dtype": "float16", "numel": 6, "storage": 0}
    run_at(fn, [["x", x]], "")
    run_at(fn, [["x", x]], "", "cuda", 132)  # where fake CUDA tensors cannot be made, it says so, and nothing more


_BASELINES: Dict[str, List[Dict[str, Any]]] = {}


def served_by_baseline(p: Point, baseline: Dict[str, Any]) -> bool:
    """Whether `p` is a serving size: the baseline's host code runs there (a point it refuses is outside the
    contract) and its inputs and the baseline's allocations fit MAX_POINT_BYTES. False where this host could not
    make the point's fake tensors (unavailable)."""
    if unavailable(baseline):
        return False
    return not baseline["error"] and p.input_bytes + baseline["bytes"] <= MAX_POINT_BYTES


def baseline_runs(op, fn: Callable, path: str) -> List[Dict[str, Any]]:
    """The baseline `fn`'s run_at at every one of points(op), in order (trusted code, run in this process), kept
    per op like the points."""
    if op.name not in _BASELINES:
        _BASELINES[op.name] = [run_at(fn, p.wire()["args"], path, p.device, p.sms) for p in points(op)]
    return _BASELINES[op.name]

"""Hooks into Triton's interpreter (TRITON_INTERPRET=1) for the CPU checks.

The interpreter runs each program of a grid one after another and dereferences raw host
pointers, so an out-of-bounds load reads (or a store corrupts) whatever memory lies
there. `Instrumentation` patches the interpreter's builder while a candidate runs:

* bounds: every active lane of every load, store and atomic is checked *before* the
  access against the exact extent of the tensor it falls in. Inputs the sanitizer passed
  in are read-only, and only their readable elements may be read (for the paged caches,
  the slots of live tokens); buffers the candidate allocated may be read and written
  inside the views it passed to the kernel. An address in no tensor argument of the
  launch is a violation too.
* order: program ids are permuted (reversed, or shuffled with a seed), which is the same
  as running the grid's programs in another order; a kernel whose programs depend on
  each other's side effects gives different bits.
* fpsan: floating-point arithmetic is replaced by FpSan's payload algebra (fpsan.py).
  Values stay IEEE bit patterns in memory and in registers, as in Triton's own FpSan:
  each operation embeds its operands, computes on payloads and unembeds the result.

Also recorded: which kernels were launched (name and source file) and how many times.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, NoReturn, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from . import fpsan as F
from .branches import BranchRecorder, launch_spec

# Imported lazily: the interpreter module pulls in triton, which the static gate does not need.
_interp = None


def _interpreter():
    global _interp
    if _interp is None:
        import triton.runtime.interpreter as interp  # deferred: triton reads TRITON_INTERPRET when first imported

        _interp = interp
    return _interp


class _NothingToRestore:
    """The scope of a language patch that was skipped (it was in place already)."""

    def restore(self):
        pass


class BoundsViolation(Exception):
    """An active lane addressed memory outside what its launch may touch."""


class GuardPause:
    """A flag the host-code guard reads: while a launch runs, torch calls are the interpreter's own."""

    depth = 0


@dataclass
class Watched:
    """An input the sanitizer passed to the candidate: read-only, optionally partly readable."""

    name: str
    tensor: torch.Tensor
    readable: Optional[torch.Tensor] = None  # bool mask, same shape as tensor


@dataclass
class Launch:
    kernel: str
    source_file: str
    grid: Tuple[int, int, int] = (1, 1, 1)


def _storage_span(t: torch.Tensor) -> Tuple[int, int]:
    st = t.untyped_storage()
    return int(st.data_ptr()), int(st.nbytes())


def _element_indices(t: torch.Tensor) -> torch.Tensor:
    """Storage element indices (in units of t's dtype) of every element of the view t."""
    n = t.untyped_storage().nbytes() // t.element_size()
    base = torch.arange(n, dtype=torch.int64)
    return torch.as_strided(base, t.shape, t.stride(), t.storage_offset())


class _Region:
    """One storage: which elements (per element size) may be read and written."""

    def __init__(self, base: int, nbytes: int, label: str):
        self.base = base
        self.nbytes = nbytes
        self.label = label
        self.views: List[Tuple[torch.Tensor, Optional[torch.Tensor], bool, str]] = []
        self._maps: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

    def add_view(self, t: torch.Tensor, readable: Optional[torch.Tensor], writable: bool, name: str):
        self.views.append((t, readable, writable, name))
        self._maps.clear()

    def maps(self, esize: int) -> Tuple[np.ndarray, np.ndarray]:
        """(readable, writable) element maps for accesses of `esize` bytes."""
        if esize in self._maps:
            return self._maps[esize]
        n = self.nbytes // esize
        if all(v[0].element_size() == esize for v in self.views):
            read: np.ndarray = np.zeros(n, dtype=bool)
            write: np.ndarray = np.zeros(n, dtype=bool)
            for t, readable, writable, _ in self.views:
                self._mark(t, readable, read, write if writable else None)
        else:  # views of other widths: an access is allowed when every byte it covers is
            rb = np.zeros(self.nbytes, dtype=bool)
            wb = np.zeros(self.nbytes, dtype=bool)
            for t, readable, writable, _ in self.views:
                e = t.element_size()
                idx = _element_indices(t)
                if readable is not None:
                    idx = idx[readable]
                flat = idx.reshape(-1).numpy()
                byte_idx = (flat[:, None] * e + np.arange(e)[None, :]).reshape(-1)
                rb[byte_idx] = True
                if writable:
                    wb[byte_idx] = True
            read = rb[: n * esize].reshape(n, esize).all(axis=1)  # type: ignore[assignment]
            write = wb[: n * esize].reshape(n, esize).all(axis=1)  # type: ignore[assignment]
        self._maps[esize] = (read, write)
        return read, write

    @staticmethod
    def _mark(t: torch.Tensor, readable, read: np.ndarray, write: Optional[np.ndarray]):
        if readable is None and t.is_contiguous():
            lo = t.storage_offset()
            read[lo : lo + t.numel()] = True
            if write is not None:
                write[lo : lo + t.numel()] = True
            return
        idx = _element_indices(t)
        if readable is not None:
            idx = idx[readable.to(torch.bool)]
        flat = idx.reshape(-1).numpy()
        read[flat] = True
        if write is not None:
            write[flat] = True

    def describe(self, offset_bytes: int, esize: int) -> str:
        """Name the element an offset falls on, relative to the first view of this storage."""
        t, readable, _, name = self.views[0]
        e = offset_bytes // t.element_size()
        idx = (_element_indices(t) == e).nonzero()
        if idx.numel():
            where = list(int(i) for i in idx[0].tolist())
            extra = ""
            if readable is not None and not bool(readable[tuple(where)]):
                extra = " (an element the kernel must not read: not owned by a live token)"
            return f"{name}{where}{extra}"
        lo = t.storage_offset() * t.element_size()
        hi = lo + (t.numel() and (max((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size())
        if offset_bytes < lo:
            return f"{name}: {lo - offset_bytes} bytes before the tensor, inside its allocation"
        if offset_bytes >= hi:
            return f"{name}: {offset_bytes - hi + 1} bytes past the end of the tensor, inside its allocation"
        return f"{name}: a gap between its strided elements"


@dataclass
class Instrumentation:
    """What to instrument, and what was seen. Use as a context manager around candidate calls."""

    bounds: bool = True
    order: str = "natural"  # natural | reverse | shuffle
    seed: int = 0
    fpsan: bool = False
    watched: List[Watched] = field(default_factory=list)
    launches: List[Launch] = field(default_factory=list)
    violations: List[str] = field(default_factory=list)
    fpsan_unsupported: List[str] = field(default_factory=list)
    specs: List[str] = field(default_factory=list)  # each launch's specialisation (branches.launch_spec)
    # the tensors the candidate's host code allocated in this call (HostGuard.fresh): a load of an element of
    # theirs that no kernel of the call stored first reads whatever the allocator left there, which is how a
    # kernel keeps state from call to call (a counter in a workspace) that the checks never see
    fresh: List[torch.Tensor] = field(default_factory=list)

    # per launch
    _regions: List[_Region] = field(default_factory=list)
    _starts: Optional[np.ndarray] = None
    _kernel: str = ""
    _perm: Optional[np.ndarray] = None
    _written: Dict[int, np.ndarray] = field(default_factory=dict)  # storage base -> bytes stored, this call
    _fresh_bases: Set[int] = field(default_factory=set)  # storage bases of `fresh`, as of this launch

    # -- launch bookkeeping ------------------------------------------------------------
    def _begin_launch(self, fn, args: Sequence[Any], kwargs: Dict[str, Any]):
        name = getattr(fn, "__name__", "?")
        code = getattr(fn, "__code__", None)
        self._kernel = name
        self.launches.append(Launch(name, code.co_filename if code else "?"))
        if not self.bounds:
            return
        regions: Dict[int, _Region] = {}
        watched_ptrs = set()
        for w in self.watched:
            base, nbytes = _storage_span(w.tensor)
            watched_ptrs.add(base)
            r = regions.setdefault(base, _Region(base, nbytes, w.name))
            r.add_view(w.tensor, w.readable, False, f"input `{w.name}`")
        for i, t in enumerate(_tensors_in(list(args) + list(kwargs.values()))):
            base, nbytes = _storage_span(t)
            if base in watched_ptrs:
                continue  # a view of an input: the input's own rules apply
            r = regions.setdefault(base, _Region(base, nbytes, f"buffer #{i}"))
            r.add_view(
                t, None, True, f"kernel argument {i} (a {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} buffer)"
            )
        self._regions = sorted(regions.values(), key=lambda r: r.base)
        self._starts = np.array([r.base for r in self._regions], dtype=np.uint64)
        # once per launch, not per access: host code allocates before it launches
        self._fresh_bases = {_storage_span(t)[0] for t in self.fresh}

    def _check(self, ptrs: np.ndarray, mask: Optional[np.ndarray], esize: int, kind: str):
        if not self.bounds:
            return
        p = np.asarray(ptrs, dtype=np.uint64)
        if mask is not None:
            m = np.broadcast_to(np.asarray(mask, dtype=bool), p.shape)
            p = p[m]
        p = p.reshape(-1)
        if p.size == 0:
            return
        if self._starts is None or self._starts.size == 0:
            self._fail(kind, f"address {int(p[0]):#x} while the launch has no tensor arguments")
        idx = np.searchsorted(self._starts, p, side="right").astype(np.int64) - 1
        bad_lane = None
        reason = ""
        outside = idx < 0
        if outside.any():
            bad_lane = int(np.argmax(outside))
            reason = "an address below every tensor argument"
        else:
            for ri in np.unique(idx):
                r = self._regions[int(ri)]
                sel = idx == ri
                off = (p[sel] - np.uint64(r.base)).astype(np.int64)
                beyond = off + esize > r.nbytes
                if beyond.any():
                    j = int(np.argmax(beyond))
                    nearest = r.views[0][3]
                    self._fail(
                        kind,
                        f"{int(off[j]) + esize - r.nbytes} bytes past the end of the allocation of "
                        f"{nearest} (or in memory no argument owns)",
                    )
                misaligned = off % esize != 0
                if misaligned.any():
                    j = int(np.argmax(misaligned))
                    self._fail(kind, f"misaligned {esize}-byte access at byte {int(off[j])} of {r.views[0][3]}")
                self._track_init(r, off, esize, kind)
                read, write = r.maps(esize)
                allowed = (write if kind == "store" else read)[off // esize]
                if kind == "atomic":
                    allowed = allowed & write[off // esize]
                if not allowed.all():
                    j = int(np.argmax(~allowed))
                    where = r.describe(int(off[j]), esize)
                    if kind != "load" and not write.any():
                        where += " (inputs are read-only)"
                    self._fail(kind, f"element {where}")
        if bad_lane is not None:
            self._fail(kind, reason)

    def _track_init(self, r: "_Region", off: np.ndarray, esize: int, kind: str) -> None:
        """Stores mark the bytes of a fresh allocation written; a load of bytes not yet written fails."""
        if r.base not in self._fresh_bases:
            return
        written = self._written.setdefault(r.base, np.zeros(r.nbytes, dtype=bool))
        idx = (off[:, None] + np.arange(esize)[None, :]).reshape(-1)
        idx = idx[(idx >= 0) & (idx < r.nbytes)]
        if kind == "store":
            written[idx] = True
            return
        unset = ~written[idx]
        if unset.any():
            at = int(idx[int(np.argmax(unset))])
            self._fail(
                kind,
                f"byte {at} of {r.views[0][3]}, which this call allocated and no kernel of it stored "
                f"before (its contents are whatever the allocator left, so a kernel can keep state there "
                f"from call to call)",
                title="uninitialised",
            )
        if kind == "atomic":
            written[idx] = True

    def _fail(self, kind: str, what: str, title: str = "out-of-bounds") -> NoReturn:
        pid = getattr(_interpreter().interpreter_builder, "grid_idx", None)
        msg = f"{title} {kind} in kernel `{self._kernel}` (program {tuple(pid) if pid else '?'}): {what}"
        self.violations.append(msg)
        raise BoundsViolation(msg)

    # -- patching ----------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Every interpreter hook installed for the calls inside, and each restored on exit (_Patches)."""
        interp = _interpreter()
        builder = interp.interpreter_builder
        patches = _Patches()
        self._patch_launches(interp, patches)
        self._patch_memory(interp, builder, patches)
        if self.order != "natural":
            self._patch_order(builder, patches)
        if self.fpsan:
            for name, impl in _fpsan_builder_ops(builder, self).items():
                patches.set(builder, name, impl)
            for owner, name, impl in _fpsan_reduce_ops(interp):
                patches.set(owner, name, impl)
        try:
            with np.errstate(all="ignore"):
                yield self
        finally:
            patches.restore()
            self._regions = []
            self._starts = None

    def _patch_launches(self, interp, patches: "_Patches") -> None:
        """Each launch: recorded (its specialisation, its tensors' regions) with the guard and the branch
        recorder paused, and the language patched once per launch rather than once per device-function call."""
        inst = self
        orig_call = interp.GridExecutor.__call__
        launch: Dict[str, Any] = {"langs": None}  # the language modules patched for the launch in progress

        def grid_call(executor, *args, **kwargs):
            GuardPause.depth += 1  # from here on, torch calls are the sanitizer's and the interpreter's
            launch["langs"] = set()
            traced = BranchRecorder.pause()  # the interpreter's Python is not the candidate's host code
            try:
                inst.specs.append(
                    launch_spec(
                        executor.fn,
                        getattr(executor, "constexprs", ()),
                        getattr(executor, "arg_names", None),
                        args,
                        kwargs,
                    )
                )
                inst._begin_launch(executor.fn, args, kwargs)
                return orig_call(executor, *args, **kwargs)
            finally:
                BranchRecorder.resume(traced)
                launch["langs"] = None
                GuardPause.depth -= 1

        patches.set(interp.GridExecutor, "__call__", grid_call)

        # The interpreter patches triton.language again on every call of a device function (tl.cdiv, the
        # combine functions of tl.sum and tl.max, a kernel's own helpers): the same patches the launch
        # already made, at the cost of inspecting each module's members, a sixth of a check's time. Inside
        # a launch, a call whose modules are all patched already is skipped; anything else patches as before.
        orig_patch_lang = interp._patch_lang

        def patch_lang(fn):
            langs = {
                id(v)
                for v in fn.__globals__.values()
                if isinstance(v, types.ModuleType) and (v is interp.tl or v is interp.tl.core)
            }
            done = launch["langs"]
            if done and langs and langs <= done:
                return _NothingToRestore()
            scope = orig_patch_lang(fn)
            if done is not None:
                done.update(langs)
            return scope

        patches.set(interp, "_patch_lang", patch_lang)

    def _patch_memory(self, interp, builder, patches: "_Patches") -> None:
        """Every load, store and atomic checked against the launch's regions; a pointer turned into an integer
        refused; and a scalar index read the way numpy >= 2.5 allows."""
        inst = self
        cls = type(builder)
        orig_masked_load = cls.create_masked_load
        orig_masked_store = cls.create_masked_store
        orig_rmw = cls.create_atomic_rmw
        orig_cas = cls.create_atomic_cas

        # The trailing arguments (cache and eviction hints, volatility, memory semantics) differ
        # between Triton versions; they pass through untouched.
        def masked_load(ptrs, mask, *rest, **kw):
            inst._check(ptrs.data, mask.data, _esize(ptrs), "load")
            return orig_masked_load(builder, ptrs, mask, *rest, **kw)

        def masked_store(ptrs, value, mask, *rest, **kw):
            inst._check(ptrs.data, mask.data, _esize(ptrs), "store")
            return orig_masked_store(builder, ptrs, value, mask, *rest, **kw)

        def atomic_rmw(rmwOp, ptr, val, mask, *rest, **kw):
            inst._check(ptr.data, None if mask is None else mask.data, _esize(ptr), "atomic")
            if inst.fpsan and val.dtype.scalar.is_floating():
                return _fpsan_atomic(builder, rmwOp, ptr, val, mask)
            return orig_rmw(builder, rmwOp, ptr, val, mask, *rest, **kw)

        def atomic_cas(ptr, *rest, **kw):
            inst._check(ptr.data, None, _esize(ptr), "atomic")
            return orig_cas(builder, ptr, *rest, **kw)

        # Triton 3.6 converts a scalar to an index with int() of a 1-element array, which
        # numpy >= 2.5 refuses (`range(lo, hi)` over tensor bounds); squeeze first, as 3.9 does.
        orig_patch_tensor = interp._patch_lang_tensor

        def patch_lang_tensor(tensor, scope):
            orig_patch_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

        patches.set(interp, "_patch_lang_tensor", patch_lang_tensor)

        def ptr_to_int(src, dst_type):  # `p.to(tl.int64)`, `tl.cast(p, tl.int64, bitcast=True)`, a pointer's truth
            inst._fail(
                "cast",
                "a pointer converted to an integer: a kernel may not read its own addresses (with them it can tell "
                "how the caller laid its arguments out, e.g. two views of one cache, from how the checks did)",
                title="refused",
            )

        patches.set(builder, "create_ptr_to_int", ptr_to_int)
        patches.set(builder, "create_masked_load", masked_load)
        patches.set(builder, "create_masked_store", masked_store)
        patches.set(builder, "create_atomic_rmw", atomic_rmw)
        patches.set(builder, "create_atomic_cas", atomic_cas)

    def _patch_order(self, builder, patches: "_Patches") -> None:
        """The grid's programs run in reverse, or shuffled with the seed (plus the grid's size)."""
        inst = self
        cls = type(builder)
        orig_dim = cls.set_grid_dim
        orig_idx = cls.set_grid_idx

        def set_grid_dim(nx, ny, nz):
            orig_dim(builder, nx, ny, nz)
            n = nx * ny * nz
            if inst.order == "reverse":
                inst._perm = np.arange(n)[::-1].copy()
            else:
                inst._perm = np.random.default_rng(inst.seed + n).permutation(n)

        def set_grid_idx(x, y, z):
            nx, ny, nz = builder.grid_dim
            lin = int(inst._perm[(x * ny + y) * nz + z])  # type: ignore[index]  # set_grid_dim came first
            orig_idx(builder, lin // (ny * nz), (lin // nz) % ny, lin % nz)

        patches.set(builder, "set_grid_dim", set_grid_dim)
        patches.set(builder, "set_grid_idx", set_grid_idx)


class _Patches:
    """Attributes set on the interpreter for one activation, each put back (or removed, where it was inherited)
    on restore, the last first."""

    def __init__(self) -> None:
        self._saved: List[Tuple[Any, str, Any, bool]] = []

    def set(self, obj, name: str, value) -> None:
        had = name in vars(obj) if not isinstance(obj, type) else name in obj.__dict__
        self._saved.append((obj, name, getattr(obj, name, None), had))
        setattr(obj, name, value)

    def restore(self) -> None:
        for obj, name, value, had in reversed(self._saved):
            if had:
                setattr(obj, name, value)
            else:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass


def _esize(ptrs) -> int:
    ety = ptrs.get_element_ty()
    return max(1, ety.primitive_bitwidth // 8)


def _tensors_in(values: Iterable[Any]) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out.extend(_tensors_in(v))
        elif hasattr(v, "base") and isinstance(v.base, torch.Tensor):  # TensorDescriptor
            out.append(v.base)
        elif hasattr(v, "base") and hasattr(v.base, "base"):  # TensorWrapper
            b = v.base
            if isinstance(b, torch.Tensor):
                out.append(b)
    return out


# -- FpSan in the interpreter ------------------------------------------------------------


def _fmt_of(tt) -> Optional[F.Format]:
    tl = _interpreter().tl  # triton.language, loaded with the interpreter
    s = tt.scalar if hasattr(tt, "scalar") else tt
    if s == tl.float16:
        return F.fmt("fp16")
    if s == tl.bfloat16:
        return F.fmt("bf16")
    if s == tl.float32:
        return F.fmt("fp32")
    if s == tl.float64:
        return F.fmt("fp64")
    return None


def _float_fmt(tt) -> F.Format:
    """_fmt_of for a value the hook receives only in a float format (the hooks of float operations)."""
    return _fmt_of(tt)  # type: ignore[return-value]


_NP_FLOAT = {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32, "fp64": np.float64}


def _bits(data: np.ndarray, f: F.Format) -> np.ndarray:
    return np.asarray(data).view(F._UINT[f.w])


def _payload(h, f: F.Format) -> np.ndarray:
    return F.embed(_bits(h.data, f), f)


# The interpreter's builder ops of float arithmetic and their FpSan payload rules (ops a Triton version lacks
# are left out): a binary op on two payloads of width w, a unary one on a payload and its format, and the ops
# FpSan models as an opaque tag of their argument.
_FPSAN_BINARY = {
    "create_fadd": F.add,
    "create_fsub": F.sub,
    "create_fmul": F.mul,
    "create_fdiv": F.div,
    "create_precise_divf": F.div,
    "create_approx_divf": F.div,
    "create_minimumf": F.smin,
    "create_minnumf": F.smin,
    "create_maximumf": F.smax,
    "create_maxnumf": F.smax,
}
_FPSAN_UNSUPPORTED = {"create_frem": "frem (floating-point remainder)"}
_FPSAN_UNARY = {
    "create_fneg": lambda p, f: F.neg(p, f.w),
    "create_fabs": lambda p, f: F.sabs(p, f.w),
    "create_exp": lambda p, f: F.exp(p, f),
    "create_exp2": lambda p, f: F.exp2(p, f.w),
}
_FPSAN_TAGGED = {
    "create_log": "log",
    "create_log2": "log2",
    "create_sqrt": "sqrt",
    "create_precise_sqrt": "sqrt",
    "create_rsqrt": "rsqrt",
    "create_erf": "erf",
    "create_floor": "floor",
    "create_ceil": "ceil",
    "create_sin": "sin",
    "create_cos": "cos",
}
# the float comparisons, ordered (O) and unordered (U) alike: on payloads, signed
_FPSAN_COMPARES = {
    "OLT": np.less,
    "OGT": np.greater,
    "OLE": np.less_equal,
    "OGE": np.greater_equal,
    "OEQ": np.equal,
    "ONE": np.not_equal,
}


def _fpsan_builder_ops(builder, inst: Instrumentation) -> Dict[str, Any]:
    """The builder's float ops under FpSan, by name (_FpSanOps: one rule each)."""
    return _FpSanOps(builder, inst).ops()


class _FpSanOps:
    """The FpSan rules of one interpreter builder's float ops: each computes on payloads (sanitizer/fpsan.py)
    where its operands are floats, and calls the builder's own op otherwise."""

    def __init__(self, builder, inst: Instrumentation) -> None:
        self.interp = _interpreter()
        self.builder = builder
        self.inst = inst
        self.cls = type(builder)

    def ops(self) -> Dict[str, Any]:
        m = lambda name: getattr(self.cls, name, None)  # noqa: E731 - methods differ between Triton versions
        ops: Dict[str, Any] = {name: self.binary(op, m(name)) for name, op in _FPSAN_BINARY.items()}
        ops.update({name: self.unsupported(what) for name, what in _FPSAN_UNSUPPORTED.items()})
        ops.update({name: self.unary(op, m(name)) for name, op in _FPSAN_UNARY.items()})
        for name, tagname in _FPSAN_TAGGED.items():
            ops[name] = self.unary(lambda p, f, t=tagname: F.tag(p, t, f.w), m(name))
        for suffix, op in _FPSAN_COMPARES.items():
            ops[f"create_fcmp{suffix}"] = self.compare(op)
            ops[f"create_fcmpU{suffix[1:]}"] = self.compare(op)
        ops.update(
            {
                "create_fma": self.fma,
                "create_clampf": self.clampf,
                "create_fp_to_fp": self.cast_float,
                "create_fp_ext": self.cast_float,
                "create_fp_trunc": self.cast_float,
                "create_si_to_fp": self.int_to_float(True),
                "create_ui_to_fp": self.int_to_float(False),
                "create_fp_to_si": self.float_to_int,
                "create_fp_to_ui": self.float_to_int,
                "create_dot": self.dot,
            }
        )
        return {k: v for k, v in ops.items() if v is not None}

    def wrap(self, payload, f: F.Format, tt):
        """A tensor handle of the payload's float bits, of type `tt`'s scalar."""
        return self.interp.TensorHandle(
            F.unembed(payload, f).view(_NP_FLOAT[f.name]), tt.scalar if hasattr(tt, "scalar") else tt
        )

    def binary(self, op, original):
        if original is None:  # not in this Triton version
            return None

        def impl(lhs, rhs):
            f = _fmt_of(lhs.dtype)
            if f is None:
                return original(self.builder, lhs, rhs)
            return self.wrap(op(_payload(lhs, f), _payload(rhs, f), f.w), f, lhs.dtype)

        return impl

    def unary(self, op, original):
        if original is None:
            return None

        def impl(arg):
            f = _fmt_of(arg.dtype)
            if f is None:
                return original(self.builder, arg)
            return self.wrap(op(_payload(arg, f), f), f, arg.dtype)

        return impl

    def compare(self, op):
        def impl(lhs, rhs):
            f = _float_fmt(lhs.dtype)
            a = F.signed(_payload(lhs, f), f.w)
            b = F.signed(_payload(rhs, f), f.w)
            return self.interp.TensorHandle(op(a, b), self.interp.tl.int1)

        return impl

    def unsupported(self, name: str):
        def impl(*args, **kwargs):
            self.inst.fpsan_unsupported.append(name)
            raise F.FpSanUnsupported(f"FpSan has no model for {name}")

        return impl

    def fma(self, x, y, z):
        f = _fmt_of(z.dtype)
        if f is None:
            return self.cls.create_fma(self.builder, x, y, z)
        return self.wrap(F.add(F.mul(_payload(x, f), _payload(y, f), f.w), _payload(z, f), f.w), f, z.dtype)

    def clampf(self, arg, lo, hi, propagate_nans):
        f = _float_fmt(arg.dtype)
        p = F.smin(F.smax(_payload(arg, f), _payload(lo, f), f.w), _payload(hi, f), f.w)
        return self.wrap(p, f, arg.dtype)

    def cast_float(self, src, dst_type, *rest):
        fs, fd = _float_fmt(src.dtype), _float_fmt(dst_type)
        return self.wrap(F.sext(_payload(src, fs), fs.w, fd.w), fd, dst_type)

    def int_to_float(self, signed_src: bool):
        # homomorphic: integer i becomes the payload i modulo 2^w (sign- or zero-extended)
        def impl(src, dst_type):
            fd = _float_fmt(dst_type)
            data = np.asarray(src.data)
            wide = data.astype(np.int64).astype(np.uint64) if signed_src else data.astype(np.uint64)
            return self.wrap(wide.astype(F._UINT[fd.w]), fd, dst_type)

        return impl

    def float_to_int(self, src, dst_type):
        fs = _float_fmt(src.dtype)
        np_dst = self.interp._get_np_dtype(dst_type)
        p = F.signed(_payload(src, fs), fs.w)
        return self.interp.TensorHandle(p.astype(np_dst), dst_type.scalar)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        fa, fb, fd = _fmt_of(a.dtype), _fmt_of(b.dtype), _fmt_of(d.dtype)
        if fa is None or fb is None or fd is None:
            return self.cls.create_dot(self.builder, a, b, d, input_precision, max_num_imprecise_acc)
        res = F.dot(_payload(a, fa), _payload(b, fb), _payload(d, fd), fa.w, fb.w, fd.w)
        return self.wrap(res, fd, d.dtype)


def _fpsan_atomic(builder, rmwOp, ptr, val, mask):
    """Float atomics under FpSan, applied lane by lane in order (the interpreter is sequential)."""
    interp = _interpreter()
    f = _float_fmt(val.dtype)
    np_t = _NP_FLOAT[f.name]
    m = np.ones(ptr.data.shape, bool) if mask is None else np.broadcast_to(mask.data, ptr.data.shape)
    old = interp._interpreter.load(ptr.data, m, np.zeros(ptr.data.shape, np_t), np.dtype(np_t))
    name = str(rmwOp).split(".")[-1].upper()
    p_old = F.embed(np.asarray(old).view(F._UINT[f.w]), f)
    p_val = F.embed(np.broadcast_to(val.data, ptr.data.shape).view(F._UINT[f.w]), f)
    if "ADD" in name:
        new = F.add(p_old, p_val, f.w)
    elif "MAX" in name:
        new = F.smax(p_old, p_val, f.w)
    elif "MIN" in name:
        new = F.smin(p_old, p_val, f.w)
    elif "XCHG" in name:
        new = p_val
    else:
        raise F.FpSanUnsupported(f"FpSan has no model for float atomic {name}")
    interp._interpreter.store(ptr.data, F.unembed(new, f).view(np_t), m)
    return interp.TensorHandle(np.asarray(old), val.dtype.scalar)


def _fpsan_reduce_ops(interp):
    RO, SO = interp.ReduceOps, interp.ScanOps
    orig_sum, orig_minmax = RO.sum, RO.min_max
    orig_cumsum, orig_cumprod = SO.cumsum, SO.cumprod

    def fsum(self, input):
        f = _fmt_of(input.dtype)
        if f is None:
            return orig_sum(self, input)
        p = _payload(input.handle, f).astype(np.uint64)
        s = np.sum(p, axis=self.axis, keepdims=self.keep_dims, dtype=np.uint64).astype(F._UINT[f.w])
        return self.to_tensor(F.unembed(s, f).view(_NP_FLOAT[f.name]), input.dtype)

    def fminmax(self, input, val_reduce_op, idx_reduce_op=None):
        inp = input[0] if isinstance(input, tuple) else input
        f = _fmt_of(inp.dtype)
        if f is None:
            return orig_minmax(self, input, val_reduce_op, idx_reduce_op)
        s = F.signed(_payload(inp.handle, f), f.w)
        is_max = (val_reduce_op in (np.nanmax, np.max)) or (idx_reduce_op in (np.nanargmax, np.argmax))
        val = idx = None
        if val_reduce_op is not None:
            v = (np.max if is_max else np.min)(s, axis=self.axis, keepdims=self.keep_dims)
            val = self.to_tensor(F.unembed(np.asarray(v).view(F._UINT[f.w]), f).view(_NP_FLOAT[f.name]), inp.dtype)
        if idx_reduce_op is not None:
            i = (np.argmax if is_max else np.argmin)(s, axis=self.axis, keepdims=self.keep_dims)
            idx = self.to_tensor(i, interp.tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx

    def fcumsum(self, input):
        f = _fmt_of(input.dtype)
        if f is None:
            return orig_cumsum(self, input)
        p = _payload(input.handle, f)
        if self.reverse:
            p = np.flip(p, self.axis)
        c = np.cumsum(p.astype(np.uint64), axis=self.axis, dtype=np.uint64).astype(F._UINT[f.w])
        if self.reverse:
            c = np.flip(c, self.axis)
        return self.to_tensor(F.unembed(c, f).view(_NP_FLOAT[f.name]), input.dtype)

    def fcumprod(self, input):
        f = _fmt_of(input.dtype)
        if f is None:
            return orig_cumprod(self, input)
        p = _payload(input.handle, f)
        if self.reverse:
            p = np.flip(p, self.axis)
        with np.errstate(over="ignore"):
            c = np.cumprod(p.astype(np.uint64), axis=self.axis, dtype=np.uint64).astype(F._UINT[f.w])
        if self.reverse:
            c = np.flip(c, self.axis)
        return self.to_tensor(F.unembed(c, f).view(_NP_FLOAT[f.name]), input.dtype)

    return [(RO, "sum", fsum), (RO, "min_max", fminmax), (SO, "cumsum", fcumsum), (SO, "cumprod", fcumprod)]

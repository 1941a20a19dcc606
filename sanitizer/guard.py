"""The run-time guard on a candidate's host code.

A TorchFunctionMode sees every torch call the candidate's Python wrapper makes. It lets
through what the candidate language allows (sanitizer/static_gate.py) (allocation with torch.empty*, reading shapes,
strides and dtypes, and views that alias their input), fills every allocation with a
sentinel (so an element no kernel writes shows up in the coverage check, and a kernel
that reads a workspace before writing it shows up too), and stops anything else with a
GuardViolation: torch.matmul, .sum(), a copy made by .contiguous() or .reshape(), a
read-back with .item(). While a Triton launch runs, the interpreter's own torch calls
are not the candidate's and pass (interp.GuardPause).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch
from torch.overrides import TorchFunctionMode, resolve_name

from .interp import GuardPause

METADATA = {
    "torch.Tensor.shape.__get__",
    "torch.Tensor.dtype.__get__",
    "torch.Tensor.device.__get__",
    "torch.Tensor.ndim.__get__",
    "torch.Tensor.is_cuda.__get__",
    "torch.Tensor.layout.__get__",
    "torch.Tensor.size",
    "torch.Tensor.stride",
    "torch.Tensor.dim",
    "torch.Tensor.ndimension",
    "torch.Tensor.numel",
    "torch.Tensor.nelement",
    "torch.Tensor.is_contiguous",
    "torch.Tensor.element_size",
    "torch.Tensor.storage_offset",
    "torch.Tensor.__len__",
    "torch.Tensor.nbytes.__get__",
    "torch.Tensor.itemsize.__get__",
    "torch.Tensor.get_device",
    "torch.Tensor.is_floating_point",
    "torch.is_tensor",
    "torch.Tensor.requires_grad.__get__",
    "torch.Tensor.is_leaf.__get__",
    "torch.Tensor.data_ptr",  # Triton's launcher reads it; the static gate keeps it out of candidates
    "torch.Tensor.__hash__",  # identity hashing inside Triton's argument handling
}
ALLOCATORS = {
    "torch.empty",
    "torch.empty_like",
    "torch.empty_strided",
    "torch.Tensor.new_empty",
    "torch.Tensor.new_empty_strided",
}
VIEWS = {
    "torch.Tensor.view",
    "torch.Tensor.view_as",
    "torch.Tensor.reshape",
    "torch.Tensor.reshape_as",
    "torch.Tensor.transpose",
    "torch.Tensor.permute",
    "torch.Tensor.t",
    "torch.Tensor.T.__get__",
    "torch.Tensor.mT.__get__",
    "torch.Tensor.unsqueeze",
    "torch.Tensor.squeeze",
    "torch.Tensor.expand",
    "torch.Tensor.expand_as",
    "torch.Tensor.as_strided",
    "torch.Tensor.__getitem__",
    "torch.Tensor.select",
    "torch.Tensor.narrow",
    "torch.Tensor.flatten",
    "torch.Tensor.unflatten",
    "torch.Tensor.movedim",
    "torch.Tensor.split",
    "torch.Tensor.chunk",
    "torch.Tensor.unbind",
    "torch.Tensor.contiguous",
    "torch.Tensor.swapaxes",
    "torch.Tensor.swapdims",
    "torch.transpose",
    "torch.permute",
    "torch.reshape",
    "torch.squeeze",
    "torch.unsqueeze",
    "torch.as_strided",
    "torch.narrow",
    "torch.flatten",
    "torch.select",
}


class GuardViolation(Exception):
    """The candidate's host code did something a candidate may not do."""


def sentinel_value(dtype: torch.dtype, which: int):
    """Two sentinels per dtype: NaN-like first, an unlikely finite value second."""
    if dtype.is_floating_point:
        return float("nan") if which == 0 else -12344.0
    if dtype == torch.int8:
        return -128 if which == 0 else 99
    if dtype == torch.uint8:
        return 255 if which == 0 else 77
    if dtype == torch.bool:
        return True if which == 0 else False
    info = torch.iinfo(dtype)
    return info.min + 7 if which == 0 else 0x5A5A5A5A % info.max


@dataclass
class HostGuard(TorchFunctionMode):
    sentinel: int = 0  # which sentinel fills allocations (0 or 1); -1: leave them as allocated
    violations: List[str] = field(default_factory=list)
    allocations: int = 0
    fresh: List[torch.Tensor] = field(default_factory=list)  # what this call allocated (Instrumentation's init map)

    def __post_init__(self):
        super().__init__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if GuardPause.depth > 0:
            return func(*args, **kwargs)
        name = resolve_name(func) or getattr(func, "__qualname__", repr(func))
        if name in METADATA:
            return func(*args, **kwargs)
        if name in ALLOCATORS:
            out = func(*args, **kwargs)
            self.allocations += 1
            if isinstance(out, torch.Tensor):
                self.fresh.append(out)
            if self.sentinel >= 0 and isinstance(out, torch.Tensor) and out.numel():
                out.fill_(sentinel_value(out.dtype, self.sentinel))
            return out
        if name in VIEWS:
            out = func(*args, **kwargs)
            sources = {t.untyped_storage().data_ptr() for t in _tensors(args) + _tensors(list(kwargs.values()))}
            for t in _tensors([out]):
                if t.untyped_storage().data_ptr() not in sources:
                    self._violate(
                        f"`{_short(name)}` copied tensor data (host code may only make views; "
                        f"pass strides to the kernel instead)"
                    )
            return out
        self._violate(
            f"`{_short(name)}` was called on tensor data in host code (a candidate may only allocate "
            f"with torch.empty*, read shapes and make views)"
        )

    def _violate(self, msg: str):
        self.violations.append(msg)
        raise GuardViolation(msg)


def _short(name: str) -> str:
    return name.replace("torch.Tensor.", "Tensor.").replace(".__get__", "")


def _tensors(values) -> List[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out

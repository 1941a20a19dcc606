"""The op registry: one module per op, each defining OP (see common.Op).

NAMES is the registry: the op modules, in the order the command line, the loop and the reports list
them. It is known without importing torch, so that the command line reports a usage error at once;
OPS, get_op and the shared types load the op modules (and torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:
    from .common import DTYPE_NAMES, DTYPES, Case, Comparison, Op, Shape, Tolerance, dtype_from_name

NAMES = ("matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8")

_FROM_COMMON = ("DTYPE_NAMES", "DTYPES", "Case", "Comparison", "Op", "Shape", "Tolerance", "dtype_from_name")


def _load() -> Dict[str, "Op"]:
    ops = {}
    for name in NAMES:
        op = importlib.import_module(f".{name}", __name__).OP
        if op.name != name:  # the module's name is the op's: the baseline and the serving files use it
            raise ImportError(f"ops/{name}.py defines the op {op.name!r}")
        ops[name] = op
    return ops


def __getattr__(attr: str) -> Any:
    if attr == "OPS":
        ops = _load()
        globals()["OPS"] = ops
        return ops
    if attr in _FROM_COMMON:
        from . import common  # deferred: the shared types load torch; NAMES is known without it

        return getattr(common, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def get_op(name: str) -> "Op":
    ops = globals().get("OPS") or __getattr__("OPS")
    try:
        return ops[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; expected one of {', '.join(NAMES)}") from None


__all__ = [
    "NAMES",
    "OPS",
    "get_op",
    "Op",
    "Shape",
    "Case",
    "Comparison",
    "Tolerance",
    "DTYPES",
    "DTYPE_NAMES",
    "dtype_from_name",
]

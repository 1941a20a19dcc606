"""The op registry: one module per op, each defining OP (see common.Op)."""
from __future__ import annotations

from typing import Dict

from .common import DTYPE_NAMES, DTYPES, Case, Comparison, Op, Shape, Tolerance, dtype_from_name
from . import attention, decode_attention, decode_attention_int8, matmul, quantize_kv

OPS: Dict[str, Op] = {m.OP.name: m.OP for m in (matmul, attention, decode_attention, quantize_kv,
                                                 decode_attention_int8)}


def get_op(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; expected one of {', '.join(OPS)}") from None


__all__ = ["OPS", "get_op", "Op", "Shape", "Case", "Comparison", "Tolerance", "DTYPES", "DTYPE_NAMES",
           "dtype_from_name"]

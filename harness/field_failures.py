"""Field failures: what the serving guard found when a promoted kernel met a real input.

A promoted kernel serves a shape class only after one call of that class was verified on the device
(harness/serving/serving.py's guard: compiled and run in a sandboxed child, its output compared with the trusted
implementation's, its inputs checksummed). A class whose check fails is retired (the trusted implementation
serves it from then on), and the failure is a `FieldFailure`: the record crosses from the serving process to
the ledger (`Ledger.record_field_failure`), where `gate` fails while any is unresolved and `demote` resolves
the kernel's failures. This module is plain data: the serving side needs no database code to build one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


class FailureKind(str, enum.Enum):
    """Why the guard retired a kernel for a shape class."""

    MISMATCH = "mismatch"  # output differs from the trusted implementation's beyond the op's tolerance
    OUT_OF_MEMORY = "out_of_memory"  # the child ran out of its memory limit (host or device)
    TIMEOUT = "timeout"  # compile plus run past the child's time limit
    TOO_SLOW = "too_slow"  # ran, but past k times the trusted implementation's time
    INPUT_CHANGED = "input_changed"  # a checksum of an input buffer changed: it wrote outside its outputs
    CRASH = "crash"  # the child died or raised (a launch error, a fault, a refused call)


@dataclass(frozen=True)
class FieldFailure:
    """One retired (kernel, shape class): which kernel, the class, the call's metadata, and what failed."""

    op: str
    bucket: str
    dtype: str
    gpu: str
    kernel: str  # the manifest entry's name: its file, or the variant it rebuilds
    source_hash: str  # the judged text's hash (the manifest entry's)
    shape_class: str  # the class key, as text (stable: the same class gives the same text)
    shapes: tuple[tuple[int, ...], ...]  # every tensor argument's shape, in the op's signature order
    strides: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    kind: FailureKind
    detail: str  # one line: the first bad element, the limit crossed, the input that changed
    at: datetime = field(default_factory=lambda: datetime.now(timezone.utc).replace(microsecond=0))

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "bucket": self.bucket,
            "dtype": self.dtype,
            "gpu": self.gpu,
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "shape_class": self.shape_class,
            "shapes": [list(s) for s in self.shapes],
            "strides": [list(s) for s in self.strides],
            "dtypes": list(self.dtypes),
            "kind": self.kind.value,
            "detail": self.detail,
            "at": self.at.isoformat(timespec="seconds"),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "FieldFailure":
        return cls(
            op=str(d["op"]),
            bucket=str(d["bucket"]),
            dtype=str(d["dtype"]),
            gpu=str(d["gpu"]),
            kernel=str(d["kernel"]),
            source_hash=str(d["source_hash"]),
            shape_class=str(d["shape_class"]),
            shapes=tuple(tuple(int(x) for x in s) for s in d["shapes"]),
            strides=tuple(tuple(int(x) for x in s) for s in d["strides"]),
            dtypes=tuple(str(x) for x in d["dtypes"]),
            kind=FailureKind(d["kind"]),
            detail=str(d["detail"]),
            at=datetime.fromisoformat(d["at"]),
        )

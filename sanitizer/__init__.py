"""The sanitizer: the static gate, the canonical text, the judge and its sandboxed executor, the checks and
their verdicts (docs/SANITIZER.md).

Importing the package loads none of its modules. `__all__` names the ones other packages use; every module
also loads on first use as an attribute of the package (PEP 562), which is how a module of the sanitizer
reaches one it must not load at import (one that loads torch or Triton, before the judge has started its
executor or set TRITON_INTERPRET): `sanitizer.wire.send(...)` where `sanitizer` is this package.
"""

import importlib
from typing import Any

__all__ = [
    "canonical",
    "config_reader",
    "config_variant",
    "execution",
    "executor",
    "gpu",
    "report",
    "runner",
    "static_gate",
    "verdict",
    "wire",
]

_MODULES = frozenset(
    __all__
    + [
        "branches",
        "checks",
        "compared",
        "fpsan",
        "guard",
        "host_probe",
        "interp",
        "kernel_branches",
        "worker",
    ]
)


def __getattr__(name: str) -> Any:
    """A module of the package, loaded on first use."""
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""What the built-in search may change in an op's baseline: its launch-configuration space.

Each baseline (kernels/baseline/<op>.py) keeps its launch configuration in one host function,
`_config(...)`, returning a tuple; the op's `tuning_space` names the tuple's fields, the values each
may take, and which tuples the hardware can hold at a shape (agent/search.py climbs over them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Tuple

SMEM_LIMIT = 220 * 1024  # bytes of shared memory a program may use on Hopper (232448 minus headroom)


@dataclass(frozen=True)
class Space:
    fields: Tuple[str, ...]
    values: Tuple[Tuple[int, ...], ...]
    valid: Callable[[Tuple[int, ...], Any], bool]  # (configuration, a shape of the op's own Shape class)

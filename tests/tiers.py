"""The two tiers of the tests (docs/CONTRIBUTING.md). `pytest -q` runs the quick tier: pyproject.toml's addopts
deselect the tests marked `exhaustive`, which `pytest -m exhaustive` runs (.ci/run runs both). A suite
parametrized over many cases keeps a representative of each family in the quick tier (`first_of_each`), so
that a quick run still meets every check, op and layer, and leaves the rest to the exhaustive tier."""

from typing import Callable, Hashable, Iterable, List, Optional, Sequence

import pytest

exhaustive = pytest.mark.exhaustive


def first_of_each(
    values: Iterable,
    family: Callable[[object], Hashable],
    ids: Optional[Callable[[object], str]] = None,
    marks: Callable[[object], Sequence] = lambda v: (),
    several: bool = False,
) -> List:
    """`values` as pytest params: the first value of each family in the quick tier, the others marked
    exhaustive; `marks` adds a value's own marks (an xfail). With `several`, each value is a tuple of the
    test's several arguments."""
    seen = set()
    params = []
    for v in values:
        tier = [exhaustive] if family(v) in seen else []
        seen.add(family(v))
        args = v if several else (v,)
        params.append(pytest.param(*args, id=ids(v) if ids else None, marks=[*marks(v), *tier]))
    return params

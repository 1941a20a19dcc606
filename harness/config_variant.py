"""A launch-configuration variant: a kernel source with its `_config` overridden for one bucket.

The built-in search (agent/search.py) tunes a kernel without touching its kernels: `with_config`
renames the source's `_config` and appends a new one that returns another tuple wherever the old one
returned the tuple the bucket's shapes use. Such a variant is fully described by the source it tuned
and the configuration (`ConfigStep`), so the serving set (harness/serving.py) stores it as those two and
rebuilds the text with the very function that wrote it; `split_config` recognises a variant in a
candidate's text, exactly (the text regenerated from what it finds must equal the candidate byte for
byte, else it is not a variant and is kept as a whole file).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from .source_text import normalized_source

if TYPE_CHECKING:  # the op registry imports torch; reading and writing overrides needs neither
    from .ops.tuning import Space


def baseline_source(op_name: str) -> str:
    """The text of the op's baseline kernel (kernels/baseline/<op>.py), as the search starts from it."""
    mod = importlib.import_module(f"kernel_agent.kernels.baseline.{op_name}")
    return inspect.getsource(mod)


def has_config(source: str) -> bool:
    return re.search(r"^def _config\(", source, re.M) is not None


@dataclass(frozen=True)
class ConfigStep:
    """One override: where `_config` returned `tuned_from` for bucket `bucket`, it returns `tuned_to`.
    fields: the names of the tuple's fields (the op's tuning space when the search wrote it)."""

    bucket: str
    fields: Tuple[str, ...]
    tuned_from: Tuple
    tuned_to: Tuple

    def describe(self) -> str:
        """One line, e.g. `_config for bucket tsmall-d16: (64, 4) -> (32, 8)  [BLOCK_R=32, num_warps=8]`."""
        return (f"_config for bucket {self.bucket}: {tuple(self.tuned_from)!r} -> {tuple(self.tuned_to)!r}  "
                f"[{_fields_text(self.fields, self.tuned_to)}]")

    def to_json(self) -> dict:
        return {"bucket": self.bucket, "fields": list(self.fields), "tuned_from": list(self.tuned_from),
                "tuned_to": list(self.tuned_to)}

    @classmethod
    def from_json(cls, d: dict) -> "ConfigStep":
        try:
            return cls(str(d["bucket"]), tuple(str(f) for f in d["fields"]), tuple(d["tuned_from"]),
                       tuple(d["tuned_to"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"a configuration record lacks {e} (expected bucket, fields, tuned_from, "
                             f"tuned_to)") from None


def _fields_text(fields: Sequence[str], values: Sequence) -> str:
    return ", ".join(f"{f}={v}" for f, v in zip(fields, values))


def with_config(source: str, old: tuple, new: tuple, bucket: str, space: "Space") -> str:
    """The source with `_config` overridden for the shapes that used `old`. A source that is
    itself a variant keeps its override; the new one is stacked on top under fresh names."""
    return apply_config(source, ConfigStep(bucket, tuple(space.fields), tuple(old), tuple(new)))


def apply_config(source: str, step: ConfigStep) -> str:
    """`with_config` for a recorded step: the text is a function of the source and the step alone, so the
    serving set can rebuild a promoted variant from its base."""
    if not has_config(source):
        raise ValueError("the source has no module-level `_config` function")
    n = 0
    while re.search(rf"\b(_config_base|_TUNED_FROM|_TUNED_TO){n or ''}\b", source):
        n += 1
    sfx = str(n or "")
    renamed = re.sub(r"^def _config\(", f"def _config_base{sfx}(", source, flags=re.M)
    desc = _fields_text(step.fields, step.tuned_to)
    return renamed.rstrip() + f'''


# Launch configuration found by kernel-agent's search for bucket {step.bucket}: {desc}
_TUNED_FROM{sfx} = {tuple(step.tuned_from)!r}
_TUNED_TO{sfx} = {tuple(step.tuned_to)!r}


def _config(*args):
    cfg = tuple(_config_base{sfx}(*args))
    return _TUNED_TO{sfx} if cfg == _TUNED_FROM{sfx} else cfg
'''


def rebuild(base: str, steps: Sequence[ConfigStep]) -> str:
    """The variant made of `base` and its overrides, in the order they were stacked."""
    text = base
    for step in steps:
        text = apply_config(text, step)
    return text


_OVERRIDE = re.compile(
    r"\n\n\n# Launch configuration found by kernel-agent's search for bucket (?P<bucket>.*): (?P<desc>.*)\n"
    r"_TUNED_FROM(?P<sfx>\d*) = (?P<old>.*)\n_TUNED_TO(?P=sfx) = (?P<new>.*)\n\n\n"
    r"def _config\(\*args\):\n    cfg = tuple\(_config_base(?P=sfx)\(\*args\)\)\n"
    r"    return _TUNED_TO(?P=sfx) if cfg == _TUNED_FROM(?P=sfx) else cfg\n\Z")


def split_config(source: str) -> Optional[Tuple[str, ConfigStep]]:
    """(the source it tuned, the step) when `source` is exactly what `apply_config` makes of some source,
    else None. The recovered source lost only the trailing blank lines `apply_config` strips (a hash of it,
    harness/source_text.py, ignores them); regenerating from it gives `source` byte for byte."""
    m = _OVERRIDE.search(source)
    if m is None:
        return None
    try:
        old, new = ast.literal_eval(m["old"]), ast.literal_eval(m["new"])
    except (ValueError, SyntaxError):
        return None
    if not isinstance(old, tuple) or not isinstance(new, tuple):
        return None
    pairs = [p.split("=", 1) for p in m["desc"].split(", ")] if m["desc"] else []
    if any(len(p) != 2 for p in pairs):
        return None
    step = ConfigStep(m["bucket"], tuple(p[0] for p in pairs), old, new)
    head = source[:m.start()]
    sfx = m["sfx"]
    base = re.sub(rf"^def _config_base{sfx}\(", "def _config(", head, flags=re.M) + "\n"
    try:
        regenerated = apply_config(base, step)
    except ValueError:
        return None
    return (base, step) if regenerated == source else None


def steps_over(old: str, new: str) -> Optional[List[ConfigStep]]:
    """The configurations that make `new` out of `old` (in the order they were stacked) when `new` is `old`
    with overrides only, else None. Texts compare normalised, as their hashes do (harness/source_text.py)."""
    steps: List[ConfigStep] = []
    current = new
    while (found := split_config(current)) is not None:
        current, step = found
        steps.insert(0, step)
        if normalized_source(current) == normalized_source(old):
            return steps
    return None


__all__ = ["ConfigStep", "with_config", "apply_config", "rebuild", "split_config", "steps_over", "baseline_source", "has_config"]

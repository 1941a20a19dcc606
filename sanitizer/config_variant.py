"""A launch-configuration variant: a kernel source with its `_config` overridden for one bucket.

The built-in search (agent/search.py) tunes a kernel without touching its kernels: `with_config`
renames the source's `_config` and appends a new one that returns another tuple wherever the old one
returned the tuple the bucket's shapes use. Such a variant is fully described by the source it tuned
and the configuration (`ConfigStep`), so the serving set (harness/serving/serving.py) stores it as those two and
rebuilds the text with the very function that wrote it; `split_config` recognises a variant in a
candidate's text, exactly (the text regenerated from what it finds must equal the candidate byte for
byte, else it is not a variant and is kept as a whole file). A variant is canonical text
(sanitizer/canonical.py), as every candidate is once proposed: its bucket and fields are constants of the
file, not a comment.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from .canonical import TextRefused, judge_text, parse_expression, parse_module

if TYPE_CHECKING:  # the op registry imports torch; reading and writing overrides needs neither
    from ..ops.tuning import Space


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
        return (
            f"_config for bucket {self.bucket}: {tuple(self.tuned_from)!r} -> {tuple(self.tuned_to)!r}  "
            f"[{_fields_text(self.fields, self.tuned_to)}]"
        )

    def to_json(self) -> dict:
        return {
            "bucket": self.bucket,
            "fields": list(self.fields),
            "tuned_from": list(self.tuned_from),
            "tuned_to": list(self.tuned_to),
        }

    @classmethod
    def from_json(cls, d: dict) -> "ConfigStep":
        try:
            return cls(
                str(d["bucket"]), tuple(str(f) for f in d["fields"]), tuple(d["tuned_from"]), tuple(d["tuned_to"])
            )
        except (KeyError, TypeError) as e:
            raise ValueError(
                f"a configuration record lacks {e} (expected bucket, fields, tuned_from, tuned_to)"
            ) from None


def _fields_text(fields: Sequence[str], values: Sequence) -> str:
    return ", ".join(f"{f}={v}" for f, v in zip(fields, values))


def with_config(source: str, old: tuple, new: tuple, bucket: str, space: "Space") -> str:
    """The source with `_config` overridden for the shapes that used `old`. A source that is
    itself a variant keeps its override; the new one is stacked on top under fresh names."""
    return apply_config(source, ConfigStep(bucket, tuple(space.fields), tuple(old), tuple(new)))


def apply_config(source: str, step: ConfigStep) -> str:
    """`with_config` for a recorded step: the text is a function of the source and the step alone, so the
    serving set can rebuild a promoted variant from its base. The result is canonical text
    (sanitizer/canonical.py), whatever form `source` was in: the override holds its bucket and fields as
    constants, so that nothing of it lives in a comment the canonical text drops."""
    tree = parse_module(judge_text(source).text)
    own = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_config"]
    if not own:
        raise ValueError("the source has no module-level `_config` function")
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
    }
    n = 0
    while any(f"{name}{n or ''}" in used for name in ("_config_base",) + _OVERRIDE_NAMES):
        n += 1
    sfx = str(n or "")
    own[0].name = f"_config_base{sfx}"
    tree.body += parse_module(f"""
_TUNED_BUCKET{sfx} = {step.bucket!r}
_TUNED_FIELDS{sfx} = {tuple(step.fields)!r}
_TUNED_FROM{sfx} = {tuple(step.tuned_from)!r}
_TUNED_TO{sfx} = {tuple(step.tuned_to)!r}


def _config(*args):
    cfg = tuple(_config_base{sfx}(*args))
    return _TUNED_TO{sfx} if cfg == _TUNED_FROM{sfx} else cfg
""").body
    return judge_text(ast.unparse(tree)).text


def rebuild(base: str, steps: Sequence[ConfigStep]) -> str:
    """The variant made of `base` and its overrides, in the order they were stacked (canonical text)."""
    text = judge_text(base).text
    for step in steps:
        text = apply_config(text, step)
    return text


_OVERRIDE_NAMES = ("_TUNED_BUCKET", "_TUNED_FIELDS", "_TUNED_FROM", "_TUNED_TO")


def _override(tail: Sequence[ast.stmt]) -> Optional[Tuple[str, ConfigStep]]:
    """(the suffix, the step) when the module's last five statements are an override as `apply_config`
    writes it (its text is checked afterwards by regenerating it)."""
    *consts, fn = tail
    if (
        not isinstance(fn, ast.FunctionDef)
        or fn.name != "_config"
        or not all(
            isinstance(c, ast.Assign) and len(c.targets) == 1 and isinstance(c.targets[0], ast.Name) for c in consts
        )
    ):
        return None
    names = [c.targets[0].id for c in consts]  # type: ignore[attr-defined]  # checked above
    sfx = names[0][len(_OVERRIDE_NAMES[0]) :]
    if names != [f"{name}{sfx}" for name in _OVERRIDE_NAMES] or not (sfx == "" or sfx.isdigit()):
        return None
    try:
        bucket, fields, old, new = (ast.literal_eval(c.value) for c in consts)  # type: ignore[attr-defined]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not (
        isinstance(bucket, str)
        and isinstance(fields, tuple)
        and all(isinstance(f, str) for f in fields)
        and isinstance(old, tuple)
        and isinstance(new, tuple)
    ):
        return None
    return sfx, ConfigStep(bucket, fields, old, new)


def split_config(source: str) -> Optional[Tuple[str, ConfigStep]]:
    """(the source it tuned, the step) when `source` is exactly what `apply_config` makes of some source,
    else None. The recovered source is canonical text; regenerating from it gives `source` byte for byte."""
    try:
        tree = parse_module(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if len(tree.body) < 6 or (found := _override(tree.body[-5:])) is None:
        return None
    sfx, step = found
    tree.body = tree.body[:-5]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == f"_config_base{sfx}":
            node.name = "_config"
    try:
        base = judge_text(ast.unparse(tree)).text
        regenerated = apply_config(base, step)
    except ValueError:  # TextRefused is one
        return None
    return (base, step) if regenerated == source else None


# The format of the versions before canonical text: the step in a comment, which canonical text drops. Ledgers
# written then hold such variants; they are read (for `show`, `report` and `pr`), never written.
_LEGACY_OVERRIDE = re.compile(
    r"\n\n\n# Launch configuration found by kernel-agent's search for bucket (?P<bucket>.*): (?P<desc>.*)\n"
    r"_TUNED_FROM(?P<sfx>\d*) = (?P<old>.*)\n_TUNED_TO(?P=sfx) = (?P<new>.*)\n\n\n"
    r"def _config\(\*args\):\n    cfg = tuple\(_config_base(?P=sfx)\(\*args\)\)\n"
    r"    return _TUNED_TO(?P=sfx) if cfg == _TUNED_FROM(?P=sfx) else cfg\n\Z"
)


def _legacy_split(source: str) -> Optional[Tuple[str, ConfigStep]]:
    """split_config for a variant in the comment format of earlier versions (its base as it was stored)."""
    m = _LEGACY_OVERRIDE.search(source)
    if m is None:
        return None
    try:
        old, new = ast.literal_eval(parse_expression(m["old"])), ast.literal_eval(parse_expression(m["new"]))
    except (ValueError, SyntaxError):
        return None
    pairs = [p.split("=", 1) for p in m["desc"].split(", ")] if m["desc"] else []
    if not isinstance(old, tuple) or not isinstance(new, tuple) or any(len(p) != 2 for p in pairs):
        return None
    base = re.sub(rf"^def _config_base{m['sfx']}\(", "def _config(", source[: m.start()], flags=re.M) + "\n"
    return base, ConfigStep(m["bucket"], tuple(p[0] for p in pairs), old, new)


def split_stored(source: str) -> Optional[Tuple[str, ConfigStep]]:
    """split_config, or for a variant a ledger stored in the comment format of earlier versions, its base as
    stored and its step: what a review diffs a variant against."""
    return split_config(source) or _legacy_split(source)


def _canonical_or_none(text: str) -> Optional[str]:
    try:
        return judge_text(text).text
    except TextRefused:
        return None


def steps_over(old: str, new: str) -> Optional[List[ConfigStep]]:
    """The configurations that make `new` out of `old` (in the order they were stacked) when `new` is `old`
    with overrides only, else None. Texts compare canonical, as their hashes are taken (sanitizer/canonical.py);
    variants in the comment format of earlier versions are read too."""
    old_text = _canonical_or_none(old)
    if old_text is None:
        return None
    steps: List[ConfigStep] = []
    current = new
    while (found := split_stored(current)) is not None:
        current, step = found
        steps.insert(0, step)
        if _canonical_or_none(current) == old_text:
            return steps
    return None


__all__ = [
    "ConfigStep",
    "with_config",
    "apply_config",
    "rebuild",
    "split_config",
    "split_stored",
    "steps_over",
    "baseline_source",
    "has_config",
]

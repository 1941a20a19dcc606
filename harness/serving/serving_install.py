"""The write side of the serving set that judges text: `install` puts a judged kernel into the set.

A promoted kernel's text is checked here before anything is written: it defines the op's function, the
static gate (sanitizer/static_gate.py) admits it, and its canonical text is the text that was judged (the
`JudgedText` the sanitizer and the benchmark held it to). A launch-configuration variant of the baseline or
of the kernel it replaces is recorded as that base and its configuration (`as_variant`); anything else is a
file of its own.

This module is apart from `serving.py` so that a serving stack, which only reads the set and dispatches,
never imports the static gate and the syntax-tree code behind it; the manifest's other writes (`set_choice`,
`remove`) judge no text and stay there.
"""

from __future__ import annotations

import ast
import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from ...ops import DTYPES, get_op
from ...sanitizer.canonical import JudgedText, as_written, judge_text, parse_module
from ...sanitizer.config_variant import ConfigStep, baseline_source, split_config
from ...sanitizer.static_gate import check_source
from ..manifest import BASE_BASELINE, KERNEL, Manifest, ManifestEntry, Variant
from .serving import (
    ServingError,
    _atomic_write,
    _base_files,
    _delete_orphans,
    _dir,
    _files,
    _write_manifest,
    kernel_file_name,
    load_manifest,
    rebuild_variant,
)


def _defines_function(source: str, name: str) -> bool:
    try:
        tree = parse_module(source)
    except SyntaxError as e:
        raise ServingError(f"kernel source does not parse: {e.msg} (line {e.lineno})") from None
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def _installable_text(op: str, bucket: str, dtype: str, judged: JudgedText) -> JudgedText:
    """The canonical text of `judged` (what the set holds and hashes: the text that runs,
    sanitizer/canonical.py), once it is known to be a kernel of `op` that the static gate admits and the text
    that was judged: its canonical text has the record's hash."""
    get_op(op)  # ValueError for an unknown op
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    source = judged.text
    if not _defines_function(source, op):
        raise ServingError(f"kernel source for {op} defines no top-level function named {op!r}")
    gate = check_source(source, op)
    if not gate.passed:
        raise ServingError(f"kernel source for {op} is refused by the static gate: {gate.describe()}")
    canonical = judge_text(source)
    if canonical.hash != judged.hash:
        raise ServingError(
            f"kernel source for {op} {bucket} is not the judged text (sha256 {canonical.hash[:12]}, "
            f"judged {judged.hash[:12]}): not installed"
        )
    return canonical


def install(
    op: str,
    bucket: str,
    dtype: str,
    gpu: str,
    judged: JudgedText,
    candidate_id: int | None,
    gain: float,
    reason: str,
    versions: dict,
    dir: str | Path | None = None,
    shapes: Sequence[str] = (),
) -> ManifestEntry:
    """Put the judged text `judged` in the serving set for (op, bucket, dtype, gpu), replacing any entry
    for that key, and return the manifest entry. `judged`: the record the sanitizer and the benchmark judged
    (sanitizer/canonical.py's `judge_text`, or the record a promotion carries); a text whose canonical text
    is not the one judged is refused (ServingError, one line) before anything is written. `shapes`: the shape
    keys it was judged on (a reviewer, and a check of the serving set, find them there). A launch-configuration
    variant of the baseline or of the kernel it replaces is recorded as that base and its configuration
    (`as_variant`); anything else is written as a file, before the manifest names it, so a reader never finds
    an entry without its file."""
    canonical = _installable_text(op, bucket, dtype, judged)
    text = canonical.text
    d = _dir(dir)
    manifest = load_manifest(d)
    old = [e for e in manifest.entries if e.matches(op, bucket, dtype, gpu)]
    entry = ManifestEntry(
        op,
        bucket,
        dtype,
        gpu,
        KERNEL,
        source_hash=canonical.hash,
        candidate_id=candidate_id,
        promoted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        gain=float(gain),
        reason=reason,
        versions=dict(versions or {}),
        shapes=tuple(shapes),
    )
    variant = as_variant(op, text, [e for e in old if e.is_kernel], d)
    if variant is not None:
        entry = dataclasses.replace(entry, variant=variant)
    else:
        name = _free_file_name(manifest, kernel_file_name(op, bucket, dtype, gpu))
        entry = dataclasses.replace(entry, file=name)
        _atomic_write(d / name, text)
    written = _write_manifest(d, [*manifest.without(op, bucket, dtype, gpu), entry])
    _delete_orphans(d, written, old)
    return entry


def as_variant(op: str, text: str, replaced: Sequence[ManifestEntry], d: Path) -> Optional[Variant]:
    """The `variant` record of `text` when it is the search's configuration override (stacked any number of
    times) of the op's baseline or of a kernel entry it replaces; else None (a code change: a whole file).
    The text rebuilt from the record must equal `text`, so the record holds exactly what was judged."""
    steps: list[ConfigStep] = []
    current = text
    while (found := split_config(current)) is not None:
        current, step = found
        steps.insert(0, step)
        stored = _stored_base(op, as_written(current).hash, replaced, d)
        if stored is None:
            continue
        base, base_hash, earlier = stored
        variant = Variant(base, base_hash, (*earlier, *steps))
        try:
            if rebuild_variant(op, variant, d) == text:
                return variant
        except ServingError:
            pass
    return None


def _stored_base(
    op: str, h: str, replaced: Sequence[ManifestEntry], d: Path
) -> Optional[tuple[str, str, tuple[ConfigStep, ...]]]:
    """(base, its hash, configurations stacked on it before) when the set can rebuild a source of hash `h`:
    the baseline, the file of the entry being replaced, or the variant being replaced (its own base)."""
    if judge_text(baseline_source(op)).hash == h:
        return BASE_BASELINE, h, ()
    for e in replaced:
        if e.source_hash != h:
            continue
        if e.variant is not None:
            return e.variant.base, e.variant.base_hash, e.variant.configs
        if e.file and (d / e.file).is_file():
            return e.file, h, ()
    return None


def _free_file_name(manifest: Manifest, name: str) -> str:
    """`name`, unless a variant of the set rebuilds from a file of that name (the entry being replaced
    tuned it): then a name of its own, so that readers of the old manifest still find the base they hash."""
    if name not in _base_files(manifest.entries):
        return name
    stem = name[:-3] if name.endswith(".py") else name
    n = 2
    while f"{stem}__{n}.py" in _files(manifest.entries):
        n += 1
    return f"{stem}__{n}.py"


__all__ = ["install", "as_variant"]

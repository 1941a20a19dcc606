"""The serving manifest's records, parsed once where the file is read (`serving.load_manifest`) and written
back to the same JSON: `Manifest` holds one `ManifestEntry` per (op, shape bucket, dtype, GPU), and a kernel
entry promoted as a launch configuration holds its `Variant` instead of a file.

The file's format is harness/serving/serving.py's (its module docstring and docs/ARCHITECTURE.md describe it); this
module is that format and nothing else: no files, no torch. `from_json` refuses a record that is not one
(ValueError, one line, which the reader turns into a ServingError naming the file); `to_json` writes the keys
the record was read with, so a manifest read and written again is the same text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ..sanitizer.config_variant import ConfigStep

# 2: entries carry `impl` (version 1 held promoted kernels only); 3: a kernel entry may be a configuration
# (`variant`) instead of a file. All three are read. A set without such an entry is still written as version 2,
# so that an older kernel-agent reading it is not refused a manifest it understands.
MANIFEST_VERSION = 3
PLAIN_VERSION = 2
READABLE_VERSIONS = (1, 2, 3)
BASE_BASELINE = "baseline"  # a variant's `base` when it tuned the op's baseline (else: a file of the set)
KERNEL, BASELINE, TORCH = "kernel", "baseline", "torch"
IMPLS = (KERNEL, BASELINE, TORCH)
_KEY_FIELDS = ("op", "bucket", "dtype", "gpu")
# the optional keys of an entry, each written back only when it was there (or set) and not null
_OPTIONAL_FIELDS = (
    "source_hash",
    "promoted_at",
    "gain",
    "reason",
    "versions",
    "shapes",
    "file",
    "measured",
    "measured_at",
)


def gpu_slug(gpu: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': lowercase, runs of other characters to '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    return slug or "unknown"


@dataclass(frozen=True)
class Variant:
    """A kernel promoted as a launch configuration: its `base` (BASE_BASELINE, or a file of the set) with the
    hash that base had, and the configurations stacked on it in order."""

    base: str
    base_hash: str
    configs: tuple[ConfigStep, ...]

    @classmethod
    def from_json(cls, d: Any) -> Variant:
        if not (
            isinstance(d, dict)
            and isinstance(d.get("base"), str)
            and isinstance(d.get("base_hash"), str)
            and isinstance(d.get("configs"), list)
            and d["configs"]
        ):
            raise ValueError("its variant needs base, base_hash and a non-empty configs list")
        return cls(d["base"], d["base_hash"], tuple(ConfigStep.from_json(c) for c in d["configs"]))

    def to_json(self) -> dict:
        return {"base": self.base, "base_hash": self.base_hash, "configs": [c.to_json() for c in self.configs]}


@dataclass(frozen=True)
class ManifestEntry:
    """What serves one (op, bucket, dtype, GPU): `impl` KERNEL (a promoted kernel: `source_hash`, the
    promotion's figures, and its `file` or its `variant`), BASELINE or TORCH (a choice: `reason`, `measured`,
    `measured_at`). A key absent from the file is None here, and stays absent when written."""

    op: str
    bucket: str
    dtype: str
    gpu: str
    impl: str = KERNEL
    source_hash: Optional[str] = None
    candidate_id: Optional[int] = None  # a kernel entry always records it, null for a promotion by hand
    promoted_at: Optional[str] = None
    gain: Optional[float] = None
    reason: Optional[str] = None
    versions: Optional[dict[str, str]] = None
    shapes: Optional[tuple[str, ...]] = None
    file: Optional[str] = None
    variant: Optional[Variant] = None
    measured: Optional[dict[str, Any]] = None
    measured_at: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, written back as read

    @property
    def is_kernel(self) -> bool:
        return self.impl == KERNEL

    def matches(self, op: str, bucket: str, dtype: str, gpu: str) -> bool:
        """Whether this is the entry of that key (GPU names compare by slug)."""
        return self.key() == (op, bucket, dtype, gpu_slug(gpu))

    def key(self) -> tuple[str, str, str, str]:
        """(op, bucket, dtype, GPU slug): what the entry serves, and the order the manifest is written in."""
        return (self.op, self.bucket, self.dtype, gpu_slug(self.gpu))

    @classmethod
    def from_json(cls, d: Any) -> ManifestEntry:
        """The entry of a JSON object; ValueError (one line) for one that is not an entry. A version-1 entry
        has no `impl`: it is a kernel."""
        if not isinstance(d, dict):
            raise ValueError("a manifest entry is not an object")
        if not all(isinstance(d.get(k), str) for k in _KEY_FIELDS):
            raise ValueError(f"entry {d.get('op')}/{d.get('bucket')} needs op, bucket, dtype and gpu as strings")
        where = f"entry {d['op']}/{d['bucket']}"
        impl = d.get("impl", KERNEL)
        if impl not in IMPLS:
            raise ValueError(f"{where} has impl {impl!r}; expected one of {', '.join(IMPLS)}")
        variant = None
        if impl == KERNEL and d.get("variant") is None and not isinstance(d.get("file"), str):
            raise ValueError(f"{where} names no kernel file and records no variant")
        if impl == KERNEL and d.get("variant") is not None:
            try:
                variant = Variant.from_json(d["variant"])
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        known = {*_KEY_FIELDS, "impl", "candidate_id", *_OPTIONAL_FIELDS} | ({"variant"} if impl == KERNEL else set())
        shapes = d.get("shapes")
        return cls(
            d["op"],
            d["bucket"],
            d["dtype"],
            d["gpu"],
            impl,
            source_hash=d.get("source_hash"),
            candidate_id=d.get("candidate_id"),
            promoted_at=d.get("promoted_at"),
            gain=d.get("gain"),
            reason=d.get("reason"),
            versions=d.get("versions"),
            shapes=tuple(shapes) if isinstance(shapes, list) else shapes,
            file=d.get("file"),
            variant=variant,
            measured=d.get("measured"),
            measured_at=d.get("measured_at"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_json(self) -> dict:
        """The entry as the manifest file holds it (`impl` always, as every version since 1 writes it)."""
        doc: dict[str, Any] = dict(self.extra)
        doc.update({k: getattr(self, k) for k in _KEY_FIELDS}, impl=self.impl)
        if self.is_kernel:
            doc["candidate_id"] = self.candidate_id
        for k in _OPTIONAL_FIELDS:
            value = getattr(self, k)
            if value is not None:
                doc[k] = list(value) if k == "shapes" else value
        if self.variant is not None:
            doc["variant"] = self.variant.to_json()
        return doc


@dataclass(frozen=True)
class Manifest:
    """The serving set's manifest: its version as read, and its entries."""

    version: int = PLAIN_VERSION
    entries: tuple[ManifestEntry, ...] = ()

    def kernels(self) -> list[ManifestEntry]:
        """The entries of promoted kernels (the baseline and torch choices hold no kernel of their own)."""
        return [e for e in self.entries if e.is_kernel]

    def find(self, op: str, bucket: str, dtype: str, gpu: str) -> Optional[ManifestEntry]:
        """The entry for this key (GPU names compare by slug), or None."""
        return next((e for e in self.entries if e.matches(op, bucket, dtype, gpu)), None)

    def without(self, op: str, bucket: str, dtype: str, gpu: str) -> tuple[ManifestEntry, ...]:
        """The entries of every other key."""
        return tuple(e for e in self.entries if not e.matches(op, bucket, dtype, gpu))

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """The manifest of a parsed JSON document; ValueError (one line) for one that is not a manifest."""
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise ValueError("not a serving manifest (expected an object with an 'entries' list)")
        if data.get("version") not in READABLE_VERSIONS:
            raise ValueError(
                f"manifest version {data.get('version')!r}; this kernel-agent reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}"
            )
        return cls(data["version"], tuple(ManifestEntry.from_json(e) for e in data["entries"]))

    def to_json(self) -> dict:
        """The document written: entries sorted by key (promotions diff cleanly), version 3 only where a
        variant needs it."""
        entries = sorted(self.entries, key=ManifestEntry.key)
        version = MANIFEST_VERSION if any(e.variant is not None for e in entries) else PLAIN_VERSION
        return {"version": version, "entries": [e.to_json() for e in entries]}


__all__ = [
    "Manifest",
    "ManifestEntry",
    "Variant",
    "gpu_slug",
    "MANIFEST_VERSION",
    "PLAIN_VERSION",
    "READABLE_VERSIONS",
    "BASE_BASELINE",
    "KERNEL",
    "BASELINE",
    "TORCH",
    "IMPLS",
]

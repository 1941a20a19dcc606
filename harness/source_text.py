"""A kernel source's identity: its text normalised so that editors' whitespace habits (trailing spaces,
CRLF, trailing blank lines) do not make the same kernel new, and the sha256 of that text. The ledger
keys candidates by it, the serving set checks promoted kernels against it, and a configuration variant
is recognised over a base by it; one definition, so that the three cannot disagree."""
from __future__ import annotations

import hashlib


def normalized_source(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def source_hash(text: str) -> str:
    """sha256 hex of the normalised text."""
    return hashlib.sha256(normalized_source(text).encode("utf-8")).hexdigest()

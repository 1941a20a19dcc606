"""A kernel source's identity: the sha256 of its text, normalised so that editors' whitespace habits
(trailing spaces, CRLF, trailing blank lines) do not make the same kernel new. The texts hashed are
canonical (sanitizer/canonical.py: the syntax tree printed back, what runs): the loop canonicalises a
proposal before the ledger keys it by this hash, the serving set stores and checks canonical text, and a
configuration variant and its base are canonical text. One definition, so that they cannot disagree."""
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

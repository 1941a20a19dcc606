"""A kernel source's identity: the sha256 of its text, normalised so that editors' whitespace habits
(trailing spaces, CRLF, trailing blank lines) do not make the same kernel new. The texts hashed are
canonical (sanitizer/canonical.py: the syntax tree printed back, what runs): the loop canonicalises a
proposal before the ledger keys it by this hash, the serving set stores and checks canonical text, and a
configuration variant and its base are canonical text. Defined once, beside the canonical text in
sanitizer/canonical.py, where the judge and the benchmark child hash what they load with it too."""

from __future__ import annotations

from ..sanitizer.canonical import normalized_source, source_hash

__all__ = ["normalized_source", "source_hash"]

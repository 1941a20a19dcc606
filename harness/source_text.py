"""A kernel source's identity is a `JudgedText` (sanitizer/canonical.py): the text and the sha256 of its text,
normalised so that editors' whitespace habits (trailing spaces, CRLF, trailing blank lines) do not make the same
kernel new, taken in one place there. This module names the normalisation for the harness's readers."""

from __future__ import annotations

from ..sanitizer.canonical import normalized_source

__all__ = ["normalized_source"]

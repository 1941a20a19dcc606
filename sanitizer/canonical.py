"""One canonical text for a candidate: the text that is judged is the text that runs.

Python reads a file's bytes through its PEP 263 coding cookie; Triton's interpreter builds a kernel
from the last line of its source that starts with `def ` (FunctionRewriter._find_def), and the GPU
compiler from the first `def` at column 0 of it (JITFunction). A text that the static gate parses one
way can therefore run another way: a `# coding: utf-7` cookie hides code from a UTF-8 reader, and a
`def` line inside a docstring or string literal hands either compiler a body the gate never saw.

So the bytes are refused unless they read one way only (`text_problems`): UTF-8 without a byte order
mark, no coding cookie but UTF-8, no NUL, form feed or other control character, nothing but ASCII
outside comments and string literals, and no string whose lines begin with `def ` or `@`. What is kept
and handed on is then not those bytes but `judge_text`: the module printed back from its syntax
tree (`ast.unparse`), docstrings and comments dropped. The executor, the benchmark child, the ledger and
the serving set all hold that text, and its hash is the kernel's identity: what the judge, the benchmark
and the serving set check a file against.

The text and its hash travel together as a `JudgedText`, which only this module makes (`judge_text`,
`judged_or_as_read`, `as_written`): the hash is taken in one place (`_judged`), so that no two layers can
hash the same kernel two ways, and a text read back from a file or the ledger becomes a `JudgedText` again
through the same constructors, which is its check.

`parse_module` and `parse_expression` are every syntax-tree parse of the project: Python 3.11's `ast.parse`
keeps its recursion counter in state shared by the interpreter's threads, so two parses at once can corrupt it
("AST constructor recursion depth mismatch"); they hold the one lock for the parse alone.
"""

from __future__ import annotations

import ast
import codecs
import hashlib
import io
import re
import threading
import tokenize
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional, Set, Tuple, Union

# a PEP 263 declaration, in either spelling (`# -*- coding: X -*-`, `# vim: set fileencoding=X :`)
_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
# a line that Triton's interpreter or its GPU compiler could take for the start of a kernel
_KERNEL_LINE = re.compile(r"^\s*(def\s|def$|@)")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f]")


class TextRefused(ValueError):
    """The bytes do not read one way only; `line` (1-based, 0 when the file as a whole) and a one-line reason."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.reason = message


def _decode(raw: bytes) -> str:
    if raw.startswith(codecs.BOM_UTF8) or raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise TextRefused(1, "a byte order mark: the file must be plain UTF-8 without one")
    for i, line in enumerate(raw.split(b"\n")[:2], 1):
        m = _COOKIE.match(line)
        if m and m.group(1).decode("ascii", "replace").lower().replace("_", "-") not in ("utf-8", "utf8"):
            raise TextRefused(
                i,
                f"an encoding declaration ({m.group(1).decode('ascii', 'replace')!r}): Python "
                f"would read the file in another encoding than the one judged; only UTF-8",
            )
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as e:
        raise TextRefused(0, f"the encoding cannot be read: {e.msg}") from None
    if encoding != "utf-8":
        raise TextRefused(0, f"Python would read the file as {encoding}; only plain UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextRefused(raw.count(b"\n", 0, e.start) + 1, "the file is not valid UTF-8") from None
    if "\ufeff" in text:
        raise TextRefused(text.count("\n", 0, text.index("\ufeff")) + 1, "a byte order mark (U+FEFF) inside the file")
    control = _CONTROL.search(text)
    if control:
        what = {"\x00": "a NUL byte", "\x0c": "a form feed"}.get(
            control.group(), f"the control character {control.group()!r}"
        )
        raise TextRefused(text.count("\n", 0, control.start()) + 1, f"{what}: the file must hold printable text only")
    return text


def _outside_literals(text: str) -> None:
    """Non-ASCII only inside comments and string literals (a name or an operator in another script
    reads differently to a person, a tokenizer and NFKC normalisation)."""
    if text.isascii():
        return
    lines = text.splitlines(keepends=True)
    allowed: List[Tuple[Tuple[int, int], Tuple[int, int]]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING) or tokenize.tok_name[tok.type].startswith("FSTRING"):
                allowed.append((tok.start, tok.end))
    except (tokenize.TokenError, SyntaxError, IndentationError) as e:
        raise TextRefused(0, f"the file cannot be tokenized: {e.args[0] if e.args else e}") from None
    for row, line in enumerate(lines, 1):
        for col, ch in enumerate(line):
            if ord(ch) > 127 and not any(s <= (row, col) < e for s, e in allowed):
                raise TextRefused(row, f"the non-ASCII character {ch!r} outside a comment or string literal")


def _strings(tree: ast.AST) -> None:
    """No string (a docstring included) with a line that starts a kernel: Triton's compilers read kernel
    text by lines and would take it for the kernel's definition."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            value = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            for part in value.splitlines():
                if _KERNEL_LINE.match(part):
                    raise TextRefused(
                        node.lineno,
                        f"a string literal holds a line beginning "
                        f"{part.strip()[:24]!r}: Triton would read it as kernel source",
                    )


def text_problems(source: Union[str, bytes]) -> str:
    """'' when the bytes read one way only (they may still fail the gate), else the one-line reason."""
    try:
        _parsed(source)
    except TextRefused as e:
        return str(e)
    return ""


def _parsed(source: Union[str, bytes]) -> ast.Module:
    if isinstance(source, str):
        try:
            raw = source.encode("utf-8")
        except UnicodeEncodeError:
            raise TextRefused(0, "the text is not valid Unicode (a lone surrogate)") from None
    else:
        raw = bytes(source)
    text = _decode(raw)
    try:
        tree = parse_module(text)
    except SyntaxError as e:
        raise TextRefused(e.lineno or 0, f"syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise TextRefused(0, f"the file cannot be parsed: {type(e).__name__}") from None
    _outside_literals(text)
    _strings(tree)
    return tree


def _drop_docstrings(body: List[ast.stmt], keep_empty: bool) -> List[ast.stmt]:
    """`body` without its bare string statements (docstrings, strings used as comments), recursively through
    the statements that hold statements; a body left empty gets `pass` (the module's may stay empty)."""
    kept = [
        st
        for st in body
        if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str))
    ]
    for st in kept:
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(st, name, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(st, name, _drop_docstrings(inner, name == "orelse"))
        for handler in getattr(st, "handlers", None) or []:
            handler.body = _drop_docstrings(handler.body, False)
        for case in getattr(st, "cases", None) or []:
            case.body = _drop_docstrings(case.body, False)
    return kept if kept or keep_empty else [ast.Pass()]


def _print(tree: ast.Module) -> str:
    tree.body = _drop_docstrings(tree.body, True)
    body = ast.unparse(tree)
    return body + "\n" if body else ""


# Python 3.11's ast module keeps its recursion counter in state that the interpreter's threads share, reset at the
# start of each parse and compared at its end ("AST constructor recursion depth mismatch" when another thread
# parsed in between, seen in the loop, whose threads canonicalise, read configurations and rewrite at the same
# time; python/cpython#106905). Only the parse builds syntax-tree objects in C: `ast.unparse`, `ast.walk` and the
# visitors are Python and need no lock, so the lock is held by the two parse functions alone.
_PARSE_LOCK = threading.Lock()


def parse_module(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(text, filename)` holding the parse lock: every parse of a module in the project goes here."""
    with _PARSE_LOCK:
        return ast.parse(text, filename=filename)


def parse_expression(text: str) -> ast.Expression:
    """`ast.parse(text, mode="eval")` holding the parse lock: every parse of an expression goes here."""
    with _PARSE_LOCK:
        return ast.parse(text, mode="eval")


# JudgedText's constructors pass this token; a JudgedText made anywhere else fails at once
_CANONICALIZER = object()


@dataclass(frozen=True)
class JudgedText:
    """A kernel text and its identity, made only by this module. `canonical`: the text is its own canonical
    text (what runs); False for a text kept as it was given (bytes that have no canonical text, refused by the
    judge's gate; a baseline's file as written; the note that stands for an unusable model reply)."""

    text: str
    hash: str
    canonical: bool
    _maker: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._maker is not _CANONICALIZER:
            raise TypeError(
                "a JudgedText is made by sanitizer/canonical.py (judge_text, judged_or_as_read, as_written)"
            )


def normalized_source(text: str) -> str:
    """The text with editors' whitespace habits taken out (trailing spaces, CRLF, trailing blank lines), so
    that they do not make the same kernel new."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _judged(text: str, canonical: bool) -> JudgedText:
    """The one place a kernel text's identity is taken: the sha256 hex of its normalised text, for the ledger's
    key, the verdict, the benchmark and the serving set, so that they cannot disagree."""
    digest = hashlib.sha256(normalized_source(text).encode("utf-8")).hexdigest()
    return JudgedText(text, digest, canonical, _CANONICALIZER)


# judged texts already made: of the inputs, and of the canonical texts themselves (a fixed point), so that a
# text read back (the serving set, a file the judge reads) costs a look-up
_MADE: "OrderedDict[Union[str, bytes], JudgedText]" = OrderedDict()
_MADE_LOCK = threading.Lock()
_MADE_MAX = 256


def judge_text(source: Union[str, bytes]) -> JudgedText:
    """The canonical text of a candidate and its hash: its syntax tree printed back, docstrings and comments
    dropped. TextRefused (one line) for bytes that do not read one way only. The text is a fixed point (its
    own canonical text), and every line of it that begins `def` or `@` is a definition or a decorator."""
    with _MADE_LOCK:
        if source in _MADE:
            _MADE.move_to_end(source)
            return _MADE[source]
    judged = _judged(_canonical_text(source), True)
    with _MADE_LOCK:
        _MADE[source] = _MADE[judged.text] = judged
        while len(_MADE) > _MADE_MAX:
            _MADE.popitem(last=False)
    return judged


def _canonical_text(source: Union[str, bytes]) -> str:
    tree = _parsed(source)
    try:
        text = _print(tree)
    except (ValueError, RecursionError, MemoryError) as e:
        # a tree that parses but nests too deep to print back (a 700-term constant sum): it crashed the loop
        raise TextRefused(0, f"the file cannot be printed back: {type(e).__name__}") from None
    try:
        tree = parse_module(text)
        again = _print(parse_module(text))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        again = None
    if again != text:
        raise TextRefused(0, "the printed text does not read back as itself")
    starts: Set[int] = set()
    decorators: Set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            starts.add(n.lineno)
            decorators.update(d.lineno for d in n.decorator_list)
    for i, line in enumerate(text.splitlines(), 1):
        m = _KERNEL_LINE.match(line)
        if m and i not in (decorators if m.group(1) == "@" else starts):
            raise TextRefused(i, "a line of the printed text begins like a definition but is not one")
    return text


def judged_or_as_read(raw: Union[str, bytes]) -> JudgedText:
    """What the loop holds for a proposal and the judge for the bytes it reads: the canonical text, or, for bytes
    that have none (refused, so nothing runs them), the text as it reads, not canonical."""
    try:
        return judge_text(raw)
    except TextRefused:
        return _judged(raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw, False)


def as_written(text: str) -> JudgedText:
    """A text kept as it was given, not canonicalised: a baseline's file as written (its identity in the
    benchmark rows and diagnoses), the note that stands for an unusable model reply."""
    return _judged(text, False)


def read_back(text: str, recorded_hash: str) -> Optional[JudgedText]:
    """A text read back from a file or the ledger, as it reads, held to the hash recorded with it: None when it
    does not have it (edited since). Canonical when it is its own canonical text."""
    try:
        judged: Optional[JudgedText] = judge_text(text)
    except TextRefused:
        judged = None
    if judged is None or judged.text != text:
        judged = as_written(text)
    return judged if judged.hash == recorded_hash else None


def read_judged(path: str) -> JudgedText:
    """`judged_or_as_read` of a file's bytes, read once."""
    with open(path, "rb") as f:
        return judged_or_as_read(f.read())


__all__ = [
    "JudgedText",
    "TextRefused",
    "judge_text",
    "judged_or_as_read",
    "as_written",
    "read_back",
    "read_judged",
    "parse_expression",
    "parse_module",
    "text_problems",
    "normalized_source",
]

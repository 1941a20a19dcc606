"""No function over 60 lines outside kernels and tests, unless a comment beside it says why.

A function longer than LIMIT lines (from its `def` to its last line) needs a one-line reason on the line just
above the `def` (above its decorators, if any) or at the end of the `def` line itself: `# long: <why>`. A reason
on a function that is no longer long fails too, so the reasons stay true. Kernels (kernels/) are exempt: a
Triton kernel's body is one unit the compiler sees whole.
"""

import ast
import re
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("ops", "isolation", "sanitizer", "harness", "agent", "scripts", "kernel_agent")
LIMIT = 60
REASON = re.compile(r"#\s*long:\s*\S")


def functions(source: str) -> List[Tuple[str, int, int, int]]:
    """(dotted name, first line of its decorators or def, def line, length in lines) of every function."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                top = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out.append((prefix + child.name, top, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def reason_for(lines: List[str], top: int, def_line: int) -> Optional[str]:
    """The `# long:` reason above the function (line numbers are 1-based) or on its def line, if any."""
    for text in (lines[top - 2] if top >= 2 else "", lines[def_line - 1]):
        m = REASON.search(text)
        if m:
            return text[m.start() :].strip()
    return None


def findings(source: str, rel: str) -> Tuple[List[str], List[str]]:
    """(functions over LIMIT lines without a reason, reasons on functions within LIMIT)."""
    lines = source.splitlines()
    unexplained, stale = [], []
    for name, top, def_line, length in functions(source):
        reason = reason_for(lines, top, def_line)
        if length > LIMIT and reason is None:
            unexplained.append(f"{rel}:{def_line} {name}: {length} lines (split it, or say why beside it: # long: ...)")
        elif length <= LIMIT and reason is not None:
            stale.append(f"{rel}:{def_line} {name}: {length} lines, yet marked `{reason}`")
    return unexplained, stale


def _scanned_files():
    for folder in SCANNED:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_no_function_over_the_limit_without_a_reason():
    unexplained, stale = [], []
    for path in _scanned_files():
        u, s = findings(path.read_text(), path.relative_to(ROOT).as_posix())
        unexplained += u
        stale += s
    assert not unexplained, f"functions over {LIMIT} lines:\n" + "\n".join(unexplained)
    assert not stale, "reasons on functions that are no longer long:\n" + "\n".join(stale)


def test_the_measure_counts_nested_and_decorated_functions():
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    source = (
        "import functools\n\n"
        "@functools.lru_cache\n"
        "def long_and_unexplained():\n" + body + "\n"
        "# long: a table of sixty-one rows, one per case\n"
        "@functools.lru_cache\n"
        "def long_with_a_reason():\n" + body + "\n"
        "class Holder:\n"
        "    def method(self):  # long: it holds inner\n"
        "        x = 0\n"
        "        def inner():\n" + "".join(f"            y{i} = {i}\n" for i in range(LIMIT)) + "        return inner\n"
    )
    unexplained, stale = findings(source, "m.py")
    assert [u.split(":")[1].split()[1] for u in unexplained] == ["long_and_unexplained", "Holder.method.inner"]
    assert "61 lines" in unexplained[0]
    assert stale == []  # Holder.method holds inner: 64 lines, so its reason stands
    _, stale = findings("def short():  # long: no longer\n    return 1\n", "m.py")
    assert stale == ["m.py:1 short: 2 lines, yet marked `# long: no longer`"]

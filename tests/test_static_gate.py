"""The static gate as an allowlist: what the candidate language admits, and what it rejects (with which rule)."""

from pathlib import Path

import pytest
import triton.language as tl

from kernel_agent.sanitizer import static_gate as sg
from kernel_agent.sanitizer.static_gate import Finding, GateResult, check_source

ROOT = Path(__file__).resolve().parent.parent


def _op_of(path: Path) -> str:
    if "candidates" in path.parts:
        return path.parent.name
    return path.stem.split("__")[0]


CORRECT_FILES = (
    [p for p in sorted((ROOT / "kernels" / "baseline").glob("*.py")) if p.name != "__init__.py"]
    + sorted((ROOT / "kernels" / "serving").glob("*.py"))
    + sorted((ROOT / "tests" / "candidates" / "good").glob("**/*.py"))
)


@pytest.mark.parametrize("path", CORRECT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_correct_file_is_in_the_language(path):
    r = check_source(path.read_text(), _op_of(path))
    assert r.passed, r.describe()
    assert r.jit_functions


def test_search_variants_of_the_baselines_stay_in_the_language():
    from kernel_agent.agent.search import baseline_source, with_config, with_evict_first
    from kernel_agent.ops import OPS

    for op, space in ((name, o.tuning_space) for name, o in OPS.items()):
        src = baseline_source(op)
        cfg = tuple(v[0] for v in space.values)
        other = tuple(v[-1] for v in space.values)
        once = with_config(src, cfg, other, "b", space)
        twice = with_config(once, other, cfg, "b", space)
        for s in (once, twice):
            assert check_source(s, op).passed, (op, check_source(s, op).describe())
    for op in (name for name, o in OPS.items() if o.streaming):
        evict = with_evict_first(baseline_source(op))
        assert check_source(evict, op).passed, check_source(evict, op).describe()


# -- a small file in the language, and mutations of it -------------------------------------------

GOOD = '''"""A copy kernel."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK = 128
SCALE: tl.constexpr = tl.constexpr(2)
PAIR = (1, -2.5, "x", None, True)
DT = torch.float16
SIZE = 4 * 1024


@triton.jit
def _helper(x):
    return x * 2


@triton.jit(do_not_specialize=["n"])
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr = 64):
    """Docstring."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in tl.static_range(2):
        acc += x.to(tl.float32)
    while False:
        pass
    m: tl.constexpr = BLOCK // 2
    y = tl.where(mask, _helper(acc), float("-inf"))
    y = tl.math.div_rn(y, 1.0) + tl.sum(acc, axis=0) * min(SCALE, 3)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _grid(n: int, block: int = BLOCK) -> tuple:
    return (triton.cdiv(n, block),)


def copy(x: torch.Tensor, *, scale=None) -> torch.Tensor:
    assert x.dim() == 1 and x.is_contiguous(), "1-d"
    if x.dtype not in (torch.float16, DT):
        raise ValueError("unsupported dtype")
    n = x.numel()
    y = torch.empty_like(x)
    v = x.view(-1)[: n]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.device.type == "cuda" else 132
    blocks = max(1, min(triton.next_power_of_2(n), BLOCK, sms))
    ok = all(s % 2 == 0 for s in x.stride()) and len(x.shape) == 1
    strides = [s for s in v.stride()]
    _copy[_grid(n, blocks)](v, y, n, BLOCK=blocks, num_warps=4)
    _ = math.sqrt(4) + divmod(7, 2)[0] + int(ok) + len(strides)
    return y
'''


def _check(src, op="copy"):
    return check_source(src, op)


def _rules(src, op="copy"):
    r = _check(src, op)
    assert not r.passed, "expected a rejection"
    return {f.rule for f in r.findings}


def test_the_sample_file_is_in_the_language():
    r = _check(GOOD)
    assert r.passed, r.describe()
    assert r.jit_functions == ["_helper", "_copy"]


def _edit(old, new, src=GOOD):
    assert old in src, old
    return src.replace(old, new, 1)


def _append(code):
    return GOOD + "\n\n" + code + "\n"


def _in_host(line):
    return _edit("    return y\n", f"    {line}\n    return y\n")


def _in_kernel(line):
    return _edit("    tl.store(y_ptr", f"    {line}\n    tl.store(y_ptr")


# -- the holes of the denylist gate ----------------------------------------------------------------


@pytest.mark.parametrize(
    "src,rule",
    [
        # the denylist only looked at the `tl` alias
        (
            _in_kernel(
                "y = triton.language.inline_asm_elementwise('mov', '=r', [y], dtype=tl.int32, is_pure=True, pack=1)"
            ),
            "kernel-language",
        ),
        (
            _in_kernel("y = tl.core.inline_asm_elementwise('mov', '=r', [y], dtype=tl.int32, is_pure=True, pack=1)"),
            "unverifiable",
        ),
        (_in_kernel("y = triton.language.extra.libdevice.rint(y)"), "kernel-language"),
        (_in_kernel("y = tl.extra.cuda.libdevice.rint(y)"), "unverifiable"),
        (_in_host("f = triton.language.extra.libdevice.rint"), "unverifiable"),
        # typing reached sys; tl.core reached inspect and the knobs
        (_edit("import math\n", "import math\nfrom typing import sys\n"), "import"),
        (_edit("import math\n", "import math\nfrom typing import Optional\n"), "import"),
        (_in_kernel("q = tl.core.inspect"), "unverifiable"),
        (_in_host("b = tl.core.knobs.runtime.interpret"), "unverifiable"),
        (_in_host("b = triton.knobs.runtime.interpret"), "unverifiable"),
        # mutable defaults reached through module attributes; module-level loops, walrus, expressions
        (_edit("def copy(x: torch.Tensor, *, scale=None)", "def copy(x: torch.Tensor, *, scale=torch.cuda)"), "state"),
        (
            _edit("def copy(x: torch.Tensor, *, scale=None)", "def copy(x: torch.Tensor, *, scale=math.__dict__)"),
            "state",
        ),
        (_edit("def copy(x: torch.Tensor, *, scale=None)", "def copy(x: torch.Tensor, *, scale=({},))"), "state"),
        (_append("for _CACHE in ({},):\n    pass"), "structure"),
        (_append("_C = (_D := {})"), "state"),
        (_append("(_D := {})"), "structure"),
        (_append("_helper.cache = {}"), "state"),
        (_append("print('hi')"), "structure"),
        (_append("if True:\n    X = 1"), "structure"),
        # the op function rebound at module level
        (_append("copy = _grid"), "rebind"),
        (_append("def copy(x):\n    return x"), "rebind"),
        (_append("_grid = 3"), "rebind"),
        # what names are bound to, not how they are spelled
        (_in_host("g = getattr"), "forbidden-call"),
        (_in_host("g = eval"), "forbidden-call"),
        (_in_host("e = __builtins__"), "introspection"),
        (_in_host("f = max\n    f = vars"), "forbidden-call"),
    ],
)
def test_denylist_holes_are_closed(src, rule):
    assert rule in _rules(src), _check(src).describe()


# -- one test per rule family ------------------------------------------------------------------------


def test_syntax():
    assert _rules("def copy(x:\n") == {"syntax"}


# -- one text: the bytes read one way only (sanitizer/canonical.py) ----------------------------------


def _text_rules(raw: bytes):
    r = check_source(raw, "copy")
    assert not r.passed, "expected a rejection"
    return {f.rule for f in r.findings}, r.describe()


@pytest.mark.parametrize(
    "header",
    [
        b"# coding: utf-7\n",
        b"# -*- coding: unicode_escape -*-\n",
        b"#!/usr/bin/env python\n# coding=latin-1\n",
        b"# vim: set fileencoding=utf-7 :\n",
        b"\n# vim: set fileencoding=cp1252 :\n",
        b"# coding: utf-8-sig\n",
    ],
)
def test_an_encoding_cookie_other_than_utf8_is_refused(header):
    rules, why = _text_rules(header + GOOD.encode())
    assert rules == {"text"} and "encoding" in why, why


def test_a_utf8_cookie_and_non_ascii_in_comments_and_strings_are_fine():
    src = "# -*- coding: utf-8 -*-\n# \u00e9t\u00e9 \u2014 a comment\n" + _edit(
        'PAIR = (1, -2.5, "x",', 'PAIR = (1, -2.5, "\u00b5",'
    )
    assert check_source(src.encode("utf-8"), "copy").passed, check_source(src.encode("utf-8"), "copy").describe()


@pytest.mark.parametrize(
    "raw, what",
    [
        (b"\xef\xbb\xbf" + GOOD.encode(), "byte order mark"),
        (b"\xff\xfe" + GOOD.encode("utf-16-le"), "byte order mark"),
        (GOOD.encode().replace(b'"x"', '"x\ufeff"'.encode()), "byte order mark"),
        (GOOD.encode().replace(b"BLOCK = 128\n", b"BLOCK = 128\n\x0c\n"), "form feed"),
        (GOOD.encode().replace(b"BLOCK = 128\n", b"BLOCK = 128  # \x00\n"), "NUL"),
        (GOOD.encode().replace(b"BLOCK = 128\n", b"BLOCK = 128  # \xe9t\xe9\n"), "not valid UTF-8"),
        (GOOD.encode().replace(b"BLOCK = 128\n", "BL\u039fCK = 128\n".encode()), "non-ASCII"),
        # a name NFKC folds to ASCII (`_\uff58` is read as `_x`): a person and a tool can read two names
        (GOOD.encode().replace(b"SIZE = 4 * 1024", "SIZE = 4 * 1024\n_\uff58 = 1".encode()), "non-ASCII"),
    ],
)
def test_bytes_that_could_read_two_ways_are_refused(raw, what):
    rules, why = _text_rules(raw)
    assert rules == {"text"} and what in why, why


@pytest.mark.parametrize(
    "edit",
    [
        # a docstring whose line starts a kernel: Triton's interpreter takes the last such line of a kernel
        (
            '"""Docstring."""',
            '"""Docstring.\n    def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr = 64):\n        pass\n    """',
        ),
        ('"""A copy kernel."""', '"""A copy kernel.\n\ndef copy(x):\n    return x\n"""'),
        # a string in the decorator: the GPU compiler takes the first `def` at column 0 of the kernel's text
        (
            '@triton.jit(do_not_specialize=["n"])',
            '@triton.jit(do_not_specialize=["n"], noinline="""\ndef _copy(x_ptr):\n    pass\n""")',
        ),
        # the newline written as an escape: the printed text would hold it as a line
        ('eviction_policy="evict_first"', 'eviction_policy="evict_first\\n@triton.jit"'),
        ('PAIR = (1, -2.5, "x",', 'PAIR = (1, -2.5, "x\\r  def f(",'),
    ],
)
def test_strings_holding_a_kernel_line_are_refused(edit):
    rules, why = _text_rules(_edit(*edit).encode())
    assert rules == {"text"} and "string literal" in why, why


def test_the_canonical_text_is_the_tree_printed_without_docstrings_or_comments():
    from kernel_agent.sanitizer.canonical import TextRefused, judge_text

    src = "# a comment\n" + _edit(
        "def _grid(n: int, block: int = BLOCK) -> tuple:\n",
        "def _grid(n: int, block: int = BLOCK) -> tuple:\n    'a string statement'\n    # a comment\n",
    )
    text = judge_text(src).text
    assert "comment" not in text and "Docstring" not in text and "A copy kernel" not in text
    assert "a string statement" not in text
    assert judge_text(text).text == text == judge_text(src.encode()).text  # a fixed point
    assert check_source(text, "copy").passed
    assert text.startswith("from __future__ import annotations\nimport math\n")
    only_doc = judge_text('def f():\n    """Only a docstring."""\n').text
    assert only_doc == "def f():\n    pass\n"
    with pytest.raises(TextRefused, match="encoding"):
        judge_text(b"# coding: utf-7\n" + GOOD.encode())


def test_a_module_constant_has_no_methods_in_a_kernel():
    # a constant is a Python value while Triton compiles the kernel: `.split()` would run Python there
    assert "kernel-language" in _rules(_in_kernel('parts = NAME.split(",")'.replace("NAME", "PAIR")))
    assert "kernel-language" in _rules(
        _edit("BLOCK = 128\n", "BLOCK = 128\nNAME = 'a,b'\n", _in_kernel('parts = NAME.split(",")'))
    )


@pytest.mark.parametrize(
    "line",
    [
        "import os",
        "import torch as T",
        "import triton.language",
        "import triton.language as language",
        "from torch import empty",
        "from triton import jit",
        "from triton.language import load",
        "from . import x",
        "from __future__ import division",
        "import ctypes",
        "from math import *",
    ],
)
def test_imports_are_exactly_the_four(line):
    assert "import" in _rules(_edit("import math\n", f"import math\n{line}\n"))


def test_imports_only_at_module_level():
    assert "import" in _rules(_in_host("import os"))


@pytest.mark.parametrize(
    "src",
    [
        _append("X = []"),
        _append("X = {}"),
        _append("X = set()"),
        _append("X = torch.empty(3)"),
        _append("X = torch.cuda"),
        _append("X = triton"),
        _append("X = BLOCK + len('a')"),
        _append("X += 1"),
        _append("class C:\n    pass"),
        _append("X: int"),
        _edit("def copy(x: torch.Tensor, *, scale=None)", "def copy(x: torch.Tensor, *, scale=[])"),
        _in_host("global BLOCK"),
        _in_host("x.foo = 1"),
        _in_host("_copy.cache = 1"),
        _in_host("c = _copy.cache"),
        _in_host("c = _copy.device_caches"),
    ],
)
def test_state_across_calls(src):
    assert "state" in _rules(src)


@pytest.mark.parametrize(
    "src",
    [
        _append("for i in range(3):\n    pass"),
        _append("while False:\n    pass"),
        _append("with x:\n    pass"),
        _append("try:\n    pass\nexcept Exception:\n    pass"),
        _append("del BLOCK"),
        _append("assert True"),
        _append("'a string statement'"),
        _append("BLOCK2 = BLOCK3 = 1"),
        _append("A, B = 1, 2"),
        _in_host("with torch.cuda.stream(None):\n        pass"),
        _in_host("try:\n        pass\n    finally:\n        pass"),
        _in_host("del v"),
        _in_host("g = lambda m: (1,)"),
        _in_host("d = {'a': 1}"),
        _in_host("s = {1}"),
        _in_host("d = {k: 1 for k in range(3)}"),
        _in_host("m = f'{x}'"),
        _in_host("m = '%s' % x"),
        _in_host("x.shape"),
        _in_host("def inner():\n        return 1"),
        _in_host("raise SystemExit(1)"),
        _in_host("raise ValueError('a') from None"),
        _in_host("_copy(v, y, n)"),
        _in_host("y = _grid(**{})"),
        _in_host("if (k := 3):\n        pass"),
        _in_kernel("z = [i for i in range(3)]") + "",
    ],
)
def test_structure(src):
    rules = _rules(src)
    assert rules & {"structure", "kernel-language"}, rules


@pytest.mark.parametrize(
    "line",
    [
        "t = x.type\n    z = t(torch.float64)",
        "f = x.is_floating_point\n    z = f()",
        "z = _grid(n)(1)",
        "z = [max][0](1, 2)",
        "z = BLOCK(1)",
    ],
)
def test_only_named_functions_and_methods_are_called(line):
    assert "structure" in _rules(_in_host(line))


def test_as_strided_is_not_a_host_view():
    assert "torch-compute" in _rules(_in_host("z = x.as_strided((2,), (1,), 0)"))


def test_item_assignment_and_out_are_mutation():
    assert "mutation" in _rules(_in_host("x[0] = 1"))
    assert "mutation" in _rules(_in_host("y = torch.empty(3, out=x)"))
    assert "mutation" in _rules(_in_kernel("acc[0] = 1"))


@pytest.mark.parametrize(
    "line",
    [
        "tl = 1",
        "torch = None",
        "len = 3",
        "for triton in range(2):\n        pass",
        "math, n = 1, 2",
        "_copy = 1",
        "copy = 1",
        "_grid = 2",
        "k = [tl for tl in range(2)]",
    ],
)
def test_rebinding_modules_builtins_and_functions(line):
    assert "rebind" in _rules(_in_host(line))


def test_rebinding_in_kernels_and_parameters():
    assert "rebind" in _rules(_in_kernel("tl = 1"))
    assert "rebind" in _rules(_edit("def _grid(n: int, block", "def _grid(torch, block"))
    assert "rebind" in _rules(_edit("def _helper(x):", "def _helper(len):"))
    assert "rebind" in _rules(_append("def tl():\n    return 1"))
    assert "rebind" in _rules(_append("def len():\n    return 1"))
    assert "rebind" in _rules(_append("BLOCK = 256"))


@pytest.mark.parametrize(
    "src",
    [
        _in_host("n = x.__class__"),
        _in_host("n = __name__"),
        _in_host("n = x.view(__x__=1)"),
        _append("def __getattr__(name):\n    return 1"),
    ],
)
def test_dunders(src):
    assert "introspection" in _rules(src)


@pytest.mark.parametrize(
    "name",
    [
        "getattr",
        "setattr",
        "eval",
        "exec",
        "open",
        "print",
        "compile",
        "globals",
        "vars",
        "type",
        "super",
        "id",
        "hash",
        "__import__",
        "breakpoint",
        "input",
        "memoryview",
        "object",
        "iter",
        "next",
        "isinstance",
        "str",
        "sum",
        "sorted",
        "map",
    ],
)
def test_builtins_outside_the_list(name):
    rules = _rules(_in_host(f"z = {name}(x)"))
    assert rules & {"forbidden-call", "introspection"}, rules


def test_kernel_builtins_are_fewer():
    assert "forbidden-call" in _rules(_in_kernel("print(y)"))
    assert "forbidden-call" in _rules(_in_kernel("z = all(y)"))


def test_undefined_names_are_rejected():
    assert "undefined-name" in _rules(_in_host("e = os.environ"))
    assert "undefined-name" in _rules(_in_kernel("z = libdevice.rint(y)"))
    no_math = GOOD.replace("import math\n", "")
    assert "undefined-name" in _rules(no_math)


def test_modules_only_as_roots_of_allowed_paths():
    assert "alias" in _rules(_in_host("t = torch"))
    assert "alias" in _rules(_in_host("f = _grid"))
    assert "alias" in _rules(_in_host("t = max(tl, 1)"))


@pytest.mark.parametrize(
    "line",
    [
        "z = torch.matmul(x, x)",
        "z = torch.cuda.Stream()",
        "z = torch.zeros(3)",
        "z = torch.nn.functional.relu(x)",
        "z = x.sum().item()",
        "z = x.to(torch.float32)",
        "z = x.float()",
        "z = x.clone()",
        "z = x @ x",
        "z = x.data_ptr()",
        "x.copy_(y)",
        "z = x.tolist()",
        "z = x.type(torch.float32)",
        "z = x.stride",
        "z = x.grad",
        "z = torch.cuda.is_available()",
        "z = torch.finfo(x.dtype)",
        "z = x.untyped_storage()",
    ],
)
def test_host_torch_compute(line):
    assert "torch-compute" in _rules(_in_host(line))


@pytest.mark.parametrize(
    "line",
    [
        "z = tl.inline_asm_elementwise('mov', '=r', [y], dtype=tl.int32, is_pure=True, pack=1)",
        "tl.device_print('y', y)",
        "tl.static_print(y)",
        "tl.device_assert(y > 0)",
        "z = tl.extra.libdevice.rint(y)",
        "z = tl.math.core",
        "z = tl.atomic_cas(y_ptr, 0, 1)",
        "z = tl.assume(n > 0)",
        "z = tl.rand(0, offs)",
        "z = tl.make_block_ptr(y_ptr, (n,), (1,), (0,), (BLOCK,), (0,))",
        "assert n > 0",
    ],
)
def test_unverifiable_kernel_code(line):
    assert "unverifiable" in _rules(_in_kernel(line))


@pytest.mark.parametrize(
    "line",
    [
        "z = torch.empty(3)",
        "z = math.sqrt(2.0)",
        "z = _grid(n)",
        "z = y.item()",
        "z = y.foo",
        "z = triton.cdiv(n, 2)",
        "raise ValueError('x')",
        "z = [i for i in range(2)]",
        "z = _copy[(1,)](y_ptr, y_ptr, n)",
        "z = y.__class__",
    ],
)
def test_kernel_language(line):
    rules = _rules(_in_kernel(line))
    assert rules & {"kernel-language", "introspection"}, rules


def test_autotune_and_decorators():
    auto = _edit("@triton.jit\ndef _helper", "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef _helper")
    assert "autotune" in _rules(auto)
    assert "autotune" in _rules(_in_host("c = triton.Config({}, num_warps=4)"))
    assert "decorator" in _rules(_edit("def _grid(", "@staticmethod\ndef _grid("))
    assert "decorator" in _rules(_edit("@triton.jit\ndef _helper", "@triton.jit(debug=True)\ndef _helper"))
    assert "decorator" in _rules(_edit("@triton.jit\ndef _helper", "@triton.jit(repr=print)\ndef _helper"))
    assert "decorator" in _rules(_edit("@triton.jit\ndef _helper", "@tl.jit\ndef _helper"))
    assert "structure" in _rules(_in_host("@triton.jit\n    def k(x):\n        pass"))


def test_contract():
    assert "contract" in _rules(GOOD, op="other")
    assert "contract" in _rules(_edit("def _grid(", "@triton.jit\ndef _grid("), op="_grid")
    no_kernels = "import torch\n\n\ndef copy(x):\n    return torch.empty_like(x)\n"
    assert _rules(no_kernels) == {"contract"}


def test_finding_and_result_formats():
    assert str(Finding(3, "import", "`import os` is not allowed")) == "line 3: `import os` is not allowed [import]"
    r = _check(_in_host("import os"))
    assert isinstance(r, GateResult) and not r.passed and r.describe().startswith("line ")
    assert all(f.rule in sg.RULES for f in r.findings)
    ok = _check(GOOD)
    assert ok.describe() == "2 Triton kernel(s): _helper, _copy"


def test_every_finding_has_a_line_and_a_known_rule():
    for src in [_append("for _CACHE in ({},):\n    pass"), _in_host("g = getattr"), _in_kernel("z = tl.core.x")]:
        r = _check(src)
        assert r.findings and all(f.line > 0 and f.rule in sg.RULES for f in r.findings), r.describe()


# -- the language as data ---------------------------------------------------------------------------


def test_the_allowlisted_triton_names_exist():
    assert not [n for n in sg.TL_FUNCTIONS | sg.TL_DTYPES if not hasattr(tl, n)]
    assert not [n for n in sg.TL_MATH if not hasattr(tl.math, n)]
    methods = sg.KERNEL_VALUE_ATTRS - {"dtype", "element_ty", "shape"}
    assert not [n for n in methods if not hasattr(tl.tensor, n)]
    assert not sg.TL_FUNCTIONS & set(sg.TL_REJECT_REASONS)


def test_the_prompt_summary_is_generated_from_the_gate_lists():
    text = sg.language_summary("matmul")
    assert "`matmul`" in text and text == sg.LANGUAGE_SUMMARY.replace("`<op>`", "`matmul`")
    flat = " ".join(text.split())
    for names in (
        sg.TL_FUNCTIONS,
        sg.TL_DTYPES,
        sg.TL_MATH,
        sg.KERNEL_BUILTINS,
        sg.HOST_BUILTINS,
        sg.MATH_HOST,
        sg.TORCH_HOST,
        sg.HOST_EXCEPTIONS,
    ):
        for n in names:
            assert n in flat, n
    for n in sg.HOST_METHODS:
        assert f".{n}()" in flat, n
    for n in sg.HOST_PROPERTIES | sg.KERNEL_VALUE_ATTRS:
        assert f".{n}" in flat, n
    assert "inline_asm" not in flat and "autotune or heuristics" in flat


# -- host arithmetic the sanitizer cannot follow ---------------------------------------------------------


@pytest.mark.parametrize(
    "line,rule",
    [
        # an indicator of one size with no comparison to read (a hostile author's D == 192 in bits)
        ("s = 1.0 + 0.05 * ((((n ^ 192) - 1) >> 63) & 1)", "unverifiable"),
        ("s = (n | 63) == 255", "unverifiable"),
        ("s = ~n", "unverifiable"),
        ("s = 1 << n", "unverifiable"),
        ("s = 0 ** abs(n - 192)", "unverifiable"),
        # aliased inputs are told from equal ones only by identity, and the checks draw distinct tensors
        ("s = 0.99 if x is y else 1.0", "unverifiable"),
        ("s = x is not v", "unverifiable"),
        # repeated by the input's size: a few bytes in the checks, gigabytes in serving
        ("s = [0] * n", "structure"),
        ("s = n * (0,)", "structure"),
        ("s = b'0' * (n * 4)", "structure"),
        ("s = [0.0 for _ in range(n)]", "structure"),
        ("s = len(list(range(n * 8)))", "structure"),
    ],
)
def test_host_arithmetic_the_checks_cannot_follow_is_refused(line, rule):
    assert rule in _rules(_in_host(line)), _check(_in_host(line)).describe()


@pytest.mark.parametrize(
    "line",
    [
        "s = 1 << 20",
        "s = BLOCK ** 2",
        "s = n ** 2",
        "s = scale is None",
        "s = [0] * 4",
        "s = (1,) * BLOCK",
        "for i in range(n):\n        pass",
        "s = [i for i in range(4)]",
    ],
)
def test_constant_bit_arithmetic_and_none_tests_stay_in_the_language(line):
    r = _check(_in_host(line))
    assert r.passed, r.describe()

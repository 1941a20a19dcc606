"""The static gate: what a candidate file may contain, decided on its syntax tree.

The candidate language: a candidate may use torch on the host to allocate outputs, read
shapes and strides, compute grids and make views; it may not compute on tensor data with
torch, mutate inputs, keep state between calls, start threads or streams, do I/O, or use
ctypes, inline assembly, libdevice or @triton.autotune. What the sanitizer cannot verify
it rejects.

The gate is an allowlist: a candidate file is written in a small language, and anything
outside it is rejected with its line and the reason, including code paths the dynamic
checks never reach (a torch fallback taken only at serving sizes). Every name is resolved
to what it is bound to (an imported module, a function of the file, a module constant, a
local, an allowed builtin): a name the file does not bind and the language does not
allow is rejected, and so is rebinding a module, builtin or function name. The language
is the data below (ALLOWED_IMPORTS, TL_*, KERNEL_*, TORCH_HOST, HOST_*, ...); the model is
told the same lists through `language_summary`, so prompt and gate cannot drift apart.
sanitizer/guard.py watches at run time what only run time can tell (for example whether
`.reshape()` made a view or a copy, or a tensor was turned into a Python number).
"""

from __future__ import annotations

import ast
import builtins
import textwrap
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple, Union

from .canonical import TextRefused, judge_text, parse_expression, parse_module

# -- the language ----------------------------------------------------------------------------

# (module, alias) -> the name it binds; nothing else may be imported, and only at module level
ALLOWED_IMPORTS: Dict[Tuple[str, Optional[str]], str] = {
    ("torch", None): "torch",
    ("triton", None): "triton",
    ("triton.language", "tl"): "tl",
    ("math", None): "math",
}
FUTURE_IMPORTS = {"annotations"}
MODULE_NAMES = frozenset(ALLOWED_IMPORTS.values())

# triton.language inside kernels: tl.<name>
TL_FUNCTIONS = frozenset(
    {
        "program_id",
        "num_programs",
        "arange",
        "zeros",
        "zeros_like",
        "full",
        "load",
        "store",
        "dot",
        "sum",
        "max",
        "min",
        "maximum",
        "minimum",
        "argmax",
        "argmin",
        "xor_sum",
        "cumsum",
        "cumprod",
        "exp",
        "exp2",
        "log",
        "log2",
        "sqrt",
        "sqrt_rn",
        "rsqrt",
        "abs",
        "floor",
        "ceil",
        "erf",
        "sin",
        "cos",
        "sigmoid",
        "softmax",
        "fma",
        "fdiv",
        "div_rn",
        "umulhi",
        "clamp",
        "where",
        "cdiv",
        "swizzle2d",
        "multiple_of",
        "max_contiguous",
        "max_constancy",
        "cast",
        "reshape",
        "view",
        "trans",
        "permute",
        "broadcast",
        "broadcast_to",
        "expand_dims",
        "ravel",
        "split",
        "join",
        "interleave",
        "flip",
        "static_range",
        "range",
        "constexpr",
        "static_assert",
        "debug_barrier",
        # integer max/min atomics commute; a float atomic_add does not, and the order_independence
        # check runs the programs in several orders and demands bitwise-equal results
        "atomic_add",
        "atomic_max",
        "atomic_min",
    }
)
TL_DTYPES = frozenset(
    {
        "int1",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float8e4nv",
        "float8e5",
        "float8e4b8",
        "float8e5b16",
        "float8e4b15",
    }
)
# tl.math.<name> (the same functions under the math namespace)
TL_MATH = frozenset(
    {
        "abs",
        "ceil",
        "cos",
        "div_rn",
        "erf",
        "exp",
        "exp2",
        "fdiv",
        "floor",
        "fma",
        "log",
        "log2",
        "rsqrt",
        "sin",
        "sqrt",
        "sqrt_rn",
        "umulhi",
    }
)
# why some well-known triton.language names are outside the language
TL_REJECT_REASONS = {
    "inline_asm_elementwise": "inline assembly cannot be verified",
    "extern_elementwise": "extern (libdevice) calls cannot be run by the interpreter",
    "extra": "tl.extra (libdevice) cannot be run by the interpreter",
    "device_print": "no I/O from kernels",
    "static_print": "no I/O from kernels",
    "device_assert": "no device asserts in serving kernels",
    "core": "tl.core reaches Triton's internals; use the tl.<name> functions",
    "atomic_cas": "compare-and-swap / exchange atomics (locks, flags) cannot be checked for order independence",
    "atomic_xchg": "compare-and-swap / exchange atomics (locks, flags) cannot be checked for order independence",
    "assume": "a false assumption is undefined behaviour the interpreter cannot see",
}
# attributes and methods of values (tensors, pointers, dtypes) inside kernels: x.to(...), p.dtype.element_ty
KERNEL_VALUE_ATTRS = frozenset(
    {"to", "dtype", "element_ty", "shape", "T"}
    | (
        TL_FUNCTIONS
        & {
            "abs",
            "argmax",
            "argmin",
            "broadcast_to",
            "cast",
            "cdiv",
            "ceil",
            "cos",
            "cumprod",
            "cumsum",
            "erf",
            "exp",
            "exp2",
            "expand_dims",
            "flip",
            "floor",
            "log",
            "log2",
            "max",
            "min",
            "permute",
            "ravel",
            "reshape",
            "rsqrt",
            "sigmoid",
            "sin",
            "softmax",
            "split",
            "sqrt",
            "sqrt_rn",
            "sum",
            "trans",
            "view",
            "xor_sum",
            "atomic_add",
            "atomic_max",
            "atomic_min",
        }
    )
)
KERNEL_BUILTINS = frozenset({"range", "min", "max", "float", "int", "bool", "abs", "len"})

# host code: torch.<path>, triton.<name>, math.<name>
TORCH_DTYPES = frozenset(
    {
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "float8_e4m3fn",
        "float8_e5m2",
    }
)
TORCH_HOST = frozenset({"empty", "empty_like", "empty_strided", "Size", "cuda.get_device_properties"} | TORCH_DTYPES)
TORCH_ANNOTATIONS = frozenset({"Tensor", "dtype", "device", "Size"})  # in annotations only
TRITON_HOST = frozenset({"cdiv", "next_power_of_2"})  # and triton.jit, as the decorator
JIT_KEYWORDS = frozenset({"do_not_specialize", "noinline"})
MATH_HOST = frozenset(
    {
        "sqrt",
        "isqrt",
        "log",
        "log2",
        "log10",
        "exp",
        "ceil",
        "floor",
        "trunc",
        "fabs",
        "gcd",
        "lcm",
        "prod",
        "pow",
        "copysign",
        "isfinite",
        "isinf",
        "isnan",
        "pi",
        "e",
        "inf",
        "nan",
        "tau",
    }
)
# tensor methods in host code: shape and stride queries, allocation, views (sanitizer/guard.py stops any
# view that turns out to copy at run time)
# (not .as_strided(): the one view that reaches storage outside the tensor's own elements)
HOST_METHODS = frozenset(
    {
        "stride",
        "size",
        "dim",
        "numel",
        "element_size",
        "is_contiguous",
        "storage_offset",
        "is_floating_point",
        "new_empty",
        "view",
        "reshape",
        "contiguous",
        "transpose",
        "permute",
        "t",
        "unsqueeze",
        "squeeze",
        "expand",
        "select",
        "narrow",
        "flatten",
        "unflatten",
        "movedim",
        "split",
        "chunk",
        "unbind",
        "swapaxes",
    }
)
# attributes read (not called) in host code: of tensors, devices (.type), dtypes and
# torch.cuda.get_device_properties(...). Not a device's index (`.index`, `.get_device()`): which GPU a tensor is
# on is no input of the contract, and a kernel keyed on it is judged on cuda:0 and served elsewhere.
HOST_PROPERTIES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "itemsize",
        "T",
        "mT",
        "type",
        "is_floating_point",
        "multi_processor_count",
    }
)
HOST_BUILTINS = frozenset(
    {"len", "range", "min", "max", "int", "float", "bool", "tuple", "list", "all", "any", "enumerate", "zip", "divmod"}
)
HOST_EXCEPTIONS = frozenset({"ValueError", "TypeError", "NotImplementedError", "RuntimeError"})  # `raise X("...")`
ANNOTATION_BUILTINS = frozenset({"int", "float", "bool", "str", "tuple", "list"})
MATH_CONSTANTS = frozenset({"pi", "e", "inf", "nan", "tau"})

# every builtin (not just the allowed ones) is reserved: none may be rebound (dunders are rejected anyway)
BUILTIN_NAMES = frozenset(n for n in dir(builtins) if not n.startswith("_")) | {
    "exit",
    "quit",
    "help",
    "copyright",
    "credits",
    "license",
}
RULES = (
    "text",
    "syntax",
    "import",
    "structure",
    "state",
    "mutation",
    "rebind",
    "introspection",
    "forbidden-call",
    "undefined-name",
    "alias",
    "torch-compute",
    "unverifiable",
    "autotune",
    "decorator",
    "kernel-language",
    "contract",
)


HOST_BIT_OPS = (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)
HOST_BITS_REASON = (
    "no bit operators on values in host code (compare sizes with == and <, round with triton.next_power_of_2)"
)


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _sequence(node: ast.AST) -> bool:
    """A literal list, tuple, string or bytes (what `*` repeats rather than multiplies)."""
    return isinstance(node, (ast.List, ast.Tuple, ast.ListComp)) or (
        isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))
    )


def _names(s: Iterable[str], prefix: str = "", call: bool = False) -> str:
    return ", ".join(f"`{prefix}{n}{'()' if call else ''}`" for n in sorted(s))


def _one_of(prefix: str, s: Iterable[str], suffix: str = "") -> str:
    return f"`{prefix}<name>{suffix}` with <name> one of: " + ", ".join(sorted(s))


def language_summary(op_name: str = "<op>") -> str:
    """The language in prose, for the model prompt; built from the same sets the gate checks."""
    items = [
        "Imports, exactly and only at module level: `import torch`, `import triton`, `import triton.language as tl`, "
        "`import math`, `from __future__ import annotations`. No other module, form or alias.",
        f"Module level holds only: the docstring; `@triton.jit` kernels (the decorator exactly `@triton.jit`, no "
        f"autotune or heuristics); plain host functions; the op function `{op_name}`, defined once; and assignments "
        f"of constants to plain names, each name assigned once (numbers, strings, True/False/None, tuples of them, "
        f"arithmetic on them, `tl.constexpr(<literal>)`, dtypes such as `torch.float16` or `tl.float32`). No loops, "
        f"ifs, expression statements, classes, lists, dicts or other mutable values at module level.",
        "Never bind (assign, loop over, take as a parameter) the names torch, triton, tl, math, a Python builtin or a "
        "function of the file. No dunder names (`__x__`), lambdas, dicts, sets, f-strings, `:=`, `global`, "
        "`nonlocal`, `try`, `with`, `del`, `yield`, async, nested functions, or decorators other than `@triton.jit`.",
        f"Inside kernels: {_one_of('tl.', TL_FUNCTIONS)}; dtypes {_one_of('tl.', TL_DTYPES)}; "
        f"{_one_of('tl.math.', TL_MATH)}; on values (tensors, pointers, dtypes) only the attributes and methods "
        f"{', '.join('.' + n for n in sorted(KERNEL_VALUE_ATTRS))}; the builtins {', '.join(sorted(KERNEL_BUILTINS))}; "
        f"the kernel's arguments and locals, module constants and other kernels of the file (not host functions). No "
        f"assert, print, inline assembly, libdevice (`tl.extra`), `tl.core`, torch or math inside kernels.",
        f"In host code: {_one_of('torch.', TORCH_HOST)} (and torch.Tensor, torch.dtype, torch.device in annotations); "
        f"`triton.cdiv`, `triton.next_power_of_2`; {_one_of('math.', MATH_HOST)}; tensor methods (views must not "
        f"copy) {', '.join('.' + n + '()' for n in sorted(HOST_METHODS))}; attributes "
        f"{', '.join('.' + n for n in sorted(HOST_PROPERTIES))}; the builtins {', '.join(sorted(HOST_BUILTINS))}; "
        f"`raise` of {', '.join(sorted(HOST_EXCEPTIONS))}; `assert`. A kernel is only launched, as "
        f"`kernel[grid](...)` with a tuple grid; nothing else touches a kernel object. No assignment to attributes "
        f"or items (`x[i] = ...`), no `out=`, no `@`. No bit operators (&, |, ^, ~, <<, >>) or computed exponents "
        f"on values, `is` only with None, a sequence repeated only a constant number of times, and a computed "
        f"`range(...)` only as the iterable of a `for` statement.",
    ]
    return (
        "The file's language (the static gate checks it on the syntax tree and rejects anything else, with "
        "line and reason):\n"
        + "\n".join(textwrap.fill(t, 116, initial_indent="- ", subsequent_indent="  ") for t in items)
        + "\n"
    )


LANGUAGE_SUMMARY = language_summary()


# -- results ---------------------------------------------------------------------------------


@dataclass
class Finding:
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message} [{self.rule}]"


@dataclass
class GateResult:
    passed: bool
    findings: List[Finding] = field(default_factory=list)
    jit_functions: List[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.passed:
            return f"{len(self.jit_functions)} Triton kernel(s): {', '.join(self.jit_functions)}"
        return "; ".join(str(f) for f in self.findings[:8]) + (
            f" (+{len(self.findings) - 8} more)" if len(self.findings) > 8 else ""
        )


# -- the checker -----------------------------------------------------------------------------


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_dunder(name: Optional[str]) -> bool:
    return name is not None and name.startswith("__") and name.endswith("__") and len(name) > 4


def _jit_decorator(dec: ast.AST) -> str:
    """'jit' | 'autotune' | 'other:<name>' for a decorator expression (judged by spelling: the names
    it could be spelled with, triton and tl, cannot be rebound)."""
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = _dotted(target) or ast.unparse(target)
    if name == "triton.jit":
        return "jit"
    if name in ("triton.autotune", "triton.heuristics", "triton.Config"):
        return "autotune"
    return "other:" + name


_MODULE_STATEMENT_NAMES = {
    ast.For: "a `for` loop",
    ast.While: "a `while` loop",
    ast.If: "an `if` statement",
    ast.With: "a `with` block",
    ast.Try: "a `try` block",
    ast.Delete: "`del`",
    ast.Raise: "`raise`",
    ast.Assert: "`assert`",
    ast.Pass: "`pass`",
    ast.AsyncFunctionDef: "an async function",
    ast.AsyncFor: "an async loop",
    ast.AsyncWith: "an async `with`",
}


class _Scope:
    def __init__(self, kernel: bool, name: str, local: Set[str]):
        self.kernel = kernel
        self.name = name
        self.local = local


class _Gate:
    def __init__(self, op_name: str):
        self.op_name = op_name
        self.findings: List[Finding] = []
        self.modules: Set[str] = set()  # imported module names
        self.kernels: List[str] = []
        self.host_functions: Set[str] = set()
        self.constants: Set[str] = set()
        self.bound_at_module: Dict[str, int] = {}
        self.loop_range: Optional[ast.Call] = None  # the `range(...)` a host `for` statement iterates

    def bad(self, node: Optional[ast.AST], rule: str, msg: str) -> None:
        self.findings.append(Finding(getattr(node, "lineno", 0) or 0, rule, msg))

    @property
    def functions(self) -> Set[str]:
        return set(self.kernels) | self.host_functions

    # -- module level --------------------------------------------------------------------
    def module(self, tree: ast.Module) -> None:
        defs: List[Tuple[ast.FunctionDef, bool]] = []
        # first the function names (a function may call one defined below it)
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef):
                kinds = [_jit_decorator(d) for d in stmt.decorator_list]
                if "jit" in kinds:
                    if stmt.name not in self.kernels:
                        self.kernels.append(stmt.name)
                else:
                    self.host_functions.add(stmt.name)
        for i, stmt in enumerate(tree.body):
            if (
                i == 0
                and isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                continue  # the module docstring
            if isinstance(stmt, ast.Import):
                self.import_(stmt)
            elif isinstance(stmt, ast.ImportFrom):
                self.import_from(stmt)
            elif isinstance(stmt, ast.FunctionDef):
                is_kernel = self.decorators(stmt)
                self.bind_module(stmt, stmt.name, function=True)
                defs.append((stmt, is_kernel))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                self.module_assign(stmt)
            elif isinstance(stmt, ast.AugAssign):
                self.bad(
                    stmt,
                    "state",
                    "augmented assignment at module level is not allowed: module-level variables "
                    "are constants, assigned once",
                )
            elif isinstance(stmt, ast.ClassDef):
                self.bad(stmt, "state", "classes are not allowed in a candidate (they can keep state across calls)")
            elif isinstance(stmt, (ast.Global, ast.Nonlocal)):
                self.bad(stmt, "state", "`global` / `nonlocal` statements are not allowed (state across calls)")
            elif isinstance(stmt, ast.Expr):
                self.bad(
                    stmt,
                    "structure",
                    "expression statements are not allowed at module level (only the "
                    "module docstring): module level holds imports, functions and constants",
                )
            else:
                what = _MODULE_STATEMENT_NAMES.get(type(stmt), f"a `{type(stmt).__name__}` statement")
                if type(stmt).__name__ in ("TryStar", "Match"):
                    what = "a `try` block" if type(stmt).__name__ == "TryStar" else "a `match` statement"
                self.bad(
                    stmt,
                    "structure",
                    f"{what} is not allowed at module level: module level holds only the "
                    f"docstring, imports, function definitions and constant assignments",
                )
        for fn, is_kernel in defs:
            self.function(fn, is_kernel)

    def import_(self, node: ast.Import) -> None:
        for a in node.names:
            bound = ALLOWED_IMPORTS.get((a.name, a.asname))
            if bound is None:
                shown = a.name + (f" as {a.asname}" if a.asname else "")
                self.bad(
                    node,
                    "import",
                    f"`import {shown}` is not allowed (allowed: `import torch`, `import triton`, "
                    f"`import triton.language as tl`, `import math`)",
                )
                continue
            if bound in self.modules:
                continue  # the same import twice binds the same module
            self.modules.add(bound)
            self.bind_module(node, bound, module=True)

    def import_from(self, node: ast.ImportFrom) -> None:
        if (
            node.module == "__future__"
            and not node.level
            and all(a.name in FUTURE_IMPORTS and not a.asname for a in node.names)
        ):
            return
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        self.bad(
            node,
            "import",
            f"`from {'.' * node.level}{node.module or ''} import {names}` is not allowed (only "
            f"`from __future__ import annotations`; use `import torch`, `import triton`, "
            f"`import triton.language as tl`, `import math`)",
        )

    def bind_module(self, node: ast.AST, name: str, function: bool = False, module: bool = False) -> None:
        if _is_dunder(name):
            self.bad(node, "introspection", f"`{name}` is not allowed")
            return
        if not module and (name in BUILTIN_NAMES or name in MODULE_NAMES):
            self.bad(node, "rebind", f"`{name}` is a builtin or module name and cannot be rebound")
            return
        if name in self.bound_at_module:
            what = f"the op function `{name}`" if name == self.op_name else f"`{name}`"
            self.bad(
                node,
                "rebind",
                f"{what} is already bound at line {self.bound_at_module[name]}: each module-level "
                f"name is bound once (no redefinition or rebinding)",
            )
            return
        if not function and not module and name in self.functions:
            self.bad(node, "rebind", f"`{name}` is a function of the file and cannot be rebound")
            return
        self.bound_at_module[name] = getattr(node, "lineno", 0)

    def decorators(self, fn: ast.FunctionDef) -> bool:
        is_kernel = False
        for d in fn.decorator_list:
            kind = _jit_decorator(d)
            if kind == "autotune":
                self.bad(
                    d,
                    "autotune",
                    "@triton.autotune / heuristics are not allowed: launch configs must be "
                    "explicit (choose them per shape in host code)",
                )
            elif kind != "jit":
                self.bad(d, "decorator", f"decorator `{kind[6:]}` is not allowed (only @triton.jit)")
            else:
                if is_kernel:
                    self.bad(d, "decorator", "@triton.jit twice")
                is_kernel = True
                if isinstance(d, ast.Call):
                    if d.args:
                        self.bad(d, "decorator", "@triton.jit(...) takes keyword arguments only")
                    for k in d.keywords:
                        if k.arg not in JIT_KEYWORDS or not self.literal(k.value, allow_list=True):
                            self.bad(
                                d,
                                "decorator",
                                f"@triton.jit({k.arg or '**'}=...) is not allowed (allowed: "
                                f"{', '.join(sorted(JIT_KEYWORDS))} with literal values)",
                            )
        return is_kernel

    def literal(self, node: ast.AST, allow_list: bool = False) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, (ast.Tuple, ast.List)) and (allow_list or isinstance(node, ast.Tuple)):
            return all(self.literal(e, allow_list) for e in node.elts)
        return False

    def constant(self, node: ast.AST) -> bool:
        """A constant expression: literals, tuples of constants, arithmetic on them, module constants,
        dtypes, math constants and tl.constexpr(<constant>)."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Tuple):
            return all(self.constant(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            return self.constant(node.operand)
        if isinstance(node, ast.BinOp):
            return not isinstance(node.op, ast.MatMult) and self.constant(node.left) and self.constant(node.right)
        if isinstance(node, ast.Name):
            return node.id in self.constants
        if isinstance(node, ast.Attribute):
            name = _dotted(node) or ""
            root, _, rest = name.partition(".")
            return (
                (root == "torch" and rest in TORCH_DTYPES)
                or (root == "tl" and rest in TL_DTYPES)
                or (root == "math" and rest in MATH_CONSTANTS)
            )
        if isinstance(node, ast.Call):
            return (
                _dotted(node.func) == "tl.constexpr"
                and not node.keywords
                and len(node.args) == 1
                and self.constant(node.args[0])
            )
        return False

    def module_assign(self, stmt) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if isinstance(stmt, ast.AnnAssign):
            self.annotation(stmt.annotation)
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            t = targets[0] if targets else stmt
            if isinstance(t, (ast.Attribute, ast.Subscript)):
                self.bad(
                    stmt,
                    "state",
                    f"assignment to `{ast.unparse(t)}` at module level mutates an object (state across calls)",
                )
            else:
                self.bad(stmt, "structure", "module-level assignments bind one plain name: `NAME = <constant>`")
            return
        name = targets[0].id
        value = stmt.value
        if value is None or not self.constant(value):
            self.bad(
                stmt,
                "state",
                f"module-level variable `{name}` may only hold a constant (numbers, strings, "
                f"tuples of them, dtypes, tl.constexpr(...)): anything else can keep state "
                f"across calls",
            )
        n = len(self.findings)
        self.bind_module(stmt, name)
        if len(self.findings) == n:
            self.constants.add(name)

    # -- functions -----------------------------------------------------------------------
    def function(self, fn: ast.FunctionDef, is_kernel: bool) -> None:
        if getattr(fn, "type_params", None):
            self.bad(fn, "structure", "type parameters (`def f[T](...)`) are not allowed")
        a = fn.args
        params = a.posonlyargs + a.args + a.kwonlyargs
        if a.vararg:
            params = params + [a.vararg]
            if is_kernel:
                self.bad(fn, "kernel-language", f"kernel `{fn.name}` cannot take *{a.vararg.arg}")
        if a.kwarg:
            params = params + [a.kwarg]
            self.bad(fn, "structure", f"`**{a.kwarg.arg}` parameters are not allowed")
        for p in params:
            if p.annotation is not None:
                self.annotation(p.annotation)
        if fn.returns is not None:
            self.annotation(fn.returns)
        for default in a.defaults + [d for d in a.kw_defaults if d is not None]:
            if not self.constant(default):
                self.bad(
                    default,
                    "state",
                    f"default argument of `{fn.name}` is not a constant: it can keep state across calls",
                )
        local: Set[str] = set()
        for p in params:
            self.bind_local(p, p.arg, local)
        for node in self.walk_scope(fn.body):
            for name, at in self.bound_names(node):
                self.bind_local(at, name, local)
        scope = _Scope(is_kernel, fn.name, local)
        self.body(fn.body, scope)

    def walk_scope(self, body: List[ast.stmt]):
        """The nodes of a function body, not descending into nested functions or classes (rejected anyway)."""
        stack: List[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            yield node
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            stack.extend(ast.iter_child_nodes(node))

    def bound_names(self, node: ast.AST) -> List[Tuple[str, ast.AST]]:
        out: List[Tuple[str, ast.AST]] = []

        def targets(t: ast.AST):
            if isinstance(t, ast.Name):
                out.append((t.id, t))
            elif isinstance(t, (ast.Tuple, ast.List)):
                for e in t.elts:
                    targets(e)
            elif isinstance(t, ast.Starred):
                targets(t.value)

        if isinstance(node, ast.Assign):
            for t in node.targets:
                targets(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.comprehension)):
            targets(node.target)
        elif isinstance(node, ast.NamedExpr):
            targets(node.target)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.name, node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.append(((a.asname or a.name).split(".")[0], node))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.append((node.name, node))
        return out

    def bind_local(self, node: ast.AST, name: str, local: Set[str]) -> None:
        if _is_dunder(name):
            self.bad(node, "introspection", f"`{name}` is not allowed")
        elif name in MODULE_NAMES:
            self.bad(node, "rebind", f"`{name}` is an imported module name and cannot be rebound")
        elif name in BUILTIN_NAMES:
            self.bad(node, "rebind", f"`{name}` is a Python builtin and cannot be rebound")
        elif name == self.op_name and name in self.functions:
            self.bad(node, "rebind", f"the op function `{name}` cannot be rebound")
        elif name in self.kernels:
            self.bad(node, "rebind", f"the kernel `{name}` cannot be rebound")
        elif name in self.host_functions:
            self.bad(node, "rebind", f"the function `{name}` cannot be rebound")
        local.add(name)

    def annotation(self, node: ast.AST) -> None:
        if self.annotation_ok(node):
            return
        self.bad(
            node,
            "structure",
            f"annotation `{ast.unparse(node)[:60]}` is not allowed (allowed: tl.constexpr, "
            f"tl.<dtype>, {_names(TORCH_ANNOTATIONS, 'torch.')}, "
            f"{_names(ANNOTATION_BUILTINS)}, None)",
        )

    def annotation_ok(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            if node.value is None:
                return True
            if isinstance(node.value, str):
                try:
                    return self.annotation_ok(parse_expression(node.value).body)
                except (SyntaxError, ValueError):
                    return False
            return False
        if isinstance(node, ast.Name):
            return node.id in ANNOTATION_BUILTINS
        if isinstance(node, ast.Attribute):
            name = _dotted(node) or ""
            root, _, rest = name.partition(".")
            return (root == "tl" and (rest == "constexpr" or rest in TL_DTYPES)) or (
                root == "torch" and (rest in TORCH_ANNOTATIONS or rest in TORCH_DTYPES)
            )
        if isinstance(node, ast.Subscript):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return (
                isinstance(node.value, ast.Name)
                and node.value.id in ("tuple", "list")
                and all(self.annotation_ok(e) or (isinstance(e, ast.Constant) and e.value is Ellipsis) for e in elts)
            )
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.annotation_ok(node.left) and self.annotation_ok(node.right)
        return False

    # -- statements ------------------------------------------------------------------------
    def body(self, stmts: List[ast.stmt], s: _Scope) -> None:
        for st in stmts:
            self.stmt(st, s)

    # long: the allowlist of statements, one branch per syntax node kind: the candidate language reads as one table
    def stmt(self, st: ast.stmt, s: _Scope) -> None:
        k = s.kernel
        if isinstance(st, ast.Assign):
            for t in st.targets:
                self.target(t, s)
            self.expr(st.value, s)
        elif isinstance(st, ast.AugAssign):
            self.target(st.target, s)
            self.expr(st.value, s)
        elif isinstance(st, ast.AnnAssign):
            self.annotation(st.annotation)
            self.target(st.target, s)
            if st.value is not None:
                self.expr(st.value, s)
        elif isinstance(st, ast.For):
            self.target(st.target, s)
            if not k and isinstance(st.iter, ast.Call) and _dotted(st.iter.func) == "range":
                self.loop_range = st.iter  # a loop over a computed range costs time, not a list of that length
            self.expr(st.iter, s)
            self.body(st.body, s)
            self.body(st.orelse, s)
        elif isinstance(st, ast.While):
            self.expr(st.test, s)
            self.body(st.body, s)
            self.body(st.orelse, s)
        elif isinstance(st, ast.If):
            self.expr(st.test, s)
            self.body(st.body, s)
            self.body(st.orelse, s)
        elif isinstance(st, ast.Return):
            if st.value is not None:
                self.expr(st.value, s)
        elif isinstance(st, ast.Expr):
            v = st.value
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                return  # a docstring or a string used as a comment
            if isinstance(v, ast.Call):
                self.expr(v, s)
            else:
                self.bad(st, "structure", "expression statements other than calls are not allowed")
                self.expr(v, s)
        elif isinstance(st, (ast.Pass, ast.Break, ast.Continue)):
            return
        elif isinstance(st, ast.Assert):
            if k:
                self.bad(
                    st, "unverifiable", "`assert` in a kernel is a device assert: no device asserts in serving kernels"
                )
            else:
                self.expr(st.test, s)
                if st.msg is not None:
                    self.expr(st.msg, s)
        elif isinstance(st, ast.Raise):
            if k:
                self.bad(st, "kernel-language", "`raise` is not allowed in a kernel")
                return
            exc = st.exc
            fn = exc.func if isinstance(exc, ast.Call) else exc
            if not (isinstance(fn, ast.Name) and fn.id in HOST_EXCEPTIONS) or st.cause is not None:
                self.bad(st, "structure", f"only `raise <{'|'.join(sorted(HOST_EXCEPTIONS))}>(...)` is allowed")
            if isinstance(exc, ast.Call):
                for a in exc.args:
                    self.expr(a, s)
                for kw in exc.keywords:
                    self.expr(kw.value, s)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_jit_decorator(d) == "jit" for d in st.decorator_list):
                self.bad(st, "structure", "Triton kernels must be defined at module level")
            else:
                self.bad(st, "structure", "nested functions are not allowed (define helpers at module level)")
        elif isinstance(st, ast.ClassDef):
            self.bad(st, "state", "classes are not allowed in a candidate (they can keep state across calls)")
        elif isinstance(st, (ast.Global, ast.Nonlocal)):
            statement = "global" if isinstance(st, ast.Global) else "nonlocal"
            self.bad(st, "state", f"`{statement}` statements are not allowed (state across calls)")
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            self.bad(st, "structure", "`with` blocks are not allowed in a candidate")
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            self.bad(st, "structure", "try/except is not allowed (errors must surface to the sanitizer)")
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            self.bad(
                st,
                "import",
                "imports are only allowed at module level (and only torch, triton, triton.language as tl, math)",
            )
        elif isinstance(st, ast.Delete):
            self.bad(st, "structure", "`del` is not allowed")
        else:
            self.bad(st, "structure", f"`{type(st).__name__}` statements are not allowed")

    def target(self, t: ast.AST, s: _Scope) -> None:
        if isinstance(t, ast.Name):
            return  # bound names were checked when the scope was collected
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self.target(e, s)
        elif isinstance(t, ast.Starred):
            if s.kernel:
                self.bad(t, "kernel-language", "starred assignment is not allowed in a kernel")
            self.target(t.value, s)
        elif isinstance(t, ast.Attribute):
            self.bad(
                t,
                "state",
                f"assignment to attribute `{ast.unparse(t)[:60]}` is not allowed (mutates an "
                f"object: state or input mutation)",
            )
        elif isinstance(t, ast.Subscript):
            self.bad(
                t,
                "mutation",
                "item assignment is not allowed (it writes tensor data or mutable state; kernels write with tl.store)",
            )
        else:
            self.bad(t, "structure", f"cannot assign to `{ast.unparse(t)[:60]}`")

    # -- expressions -----------------------------------------------------------------------
    # long: the allowlist of expressions, one branch per syntax node kind: the candidate language reads as one table
    def expr(self, node: ast.AST, s: _Scope) -> None:
        k = s.kernel
        if isinstance(node, ast.Constant):
            return
        if isinstance(node, ast.Name):
            self.name(node, s)
        elif isinstance(node, ast.Attribute):
            self.attribute(node, s, called=False)
        elif isinstance(node, ast.Call):
            self.call(node, s)
        elif isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id in self.kernels:
                self.bad(
                    node,
                    "state" if not k else "kernel-language",
                    f"`{node.value.id}[...]` is only allowed as a launch, `{node.value.id}[grid](...)`",
                )
            else:
                self.expr(node.value, s)
            self.expr(node.slice, s)
        elif isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self.expr(part, s)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                self.expr(e, s)
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.MatMult) and not k:
                self.bad(node, "torch-compute", "the `@` operator in host code computes on tensor data")
            if not k:
                self.host_arithmetic(node)
            if (
                isinstance(node.op, ast.Mod)
                and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str)
            ):
                self.bad(node, "structure", "%-formatting is not allowed (formatting a tensor reads its data)")
            self.expr(node.left, s)
            self.expr(node.right, s)
        elif isinstance(node, ast.UnaryOp):
            if not k and isinstance(node.op, ast.Invert) and not self.constant(node.operand):
                self.bad(node, "unverifiable", f"`{ast.unparse(node)[:40]}`: {HOST_BITS_REASON}")
            self.expr(node.operand, s)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                self.expr(v, s)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, operands, operands[1:]):
                if not k and isinstance(op, (ast.Is, ast.IsNot)) and not any(_is_none(x) for x in (a, b)):
                    # `a is b` tells aliased inputs from equal ones, and the checks draw distinct tensors
                    self.bad(node, "unverifiable", "`is` compares only with None in host code (use ==)")
            self.expr(node.left, s)
            for c in node.comparators:
                self.expr(c, s)
        elif isinstance(node, ast.IfExp):
            self.expr(node.test, s)
            self.expr(node.body, s)
            self.expr(node.orelse, s)
        elif isinstance(node, ast.Starred):
            if k:
                self.bad(node, "kernel-language", "`*` unpacking is not allowed in a kernel")
            self.expr(node.value, s)
        elif isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            if k:
                self.bad(node, "kernel-language", "comprehensions are not allowed in a kernel")
                return
            for g in node.generators:
                if g.is_async:
                    self.bad(node, "structure", "async comprehensions are not allowed")
                self.target(g.target, s)
                self.expr(g.iter, s)
                for cond in g.ifs:
                    self.expr(cond, s)
            self.expr(node.elt, s)
        elif isinstance(node, ast.Lambda):
            self.bad(node, "structure", "lambdas are not allowed (a launch grid is a tuple computed in host code)")
        elif isinstance(node, (ast.Dict, ast.Set, ast.DictComp, ast.SetComp)):
            self.bad(
                node,
                "structure",
                "dicts and sets are not in the candidate language (mutable state; pass values as arguments and tuples)",
            )
        elif isinstance(node, (ast.JoinedStr, ast.FormattedValue)):
            self.bad(
                node, "structure", "f-strings are not allowed (formatting a tensor reads its data); use a plain string"
            )
        elif isinstance(node, ast.NamedExpr):
            self.bad(node, "structure", "`:=` is not allowed")
        elif isinstance(node, (ast.Yield, ast.YieldFrom)):
            self.bad(node, "structure", "generators are not allowed")
        elif isinstance(node, ast.Await):
            self.bad(node, "structure", "async code is not allowed")
        else:
            self.bad(node, "structure", f"`{type(node).__name__}` expressions are not allowed")

    def host_arithmetic(self, node: ast.BinOp) -> None:
        """Host arithmetic the sanitizer can follow. Bit operators and a computed exponent turn a size into
        an indicator of one value with no comparison to read (`(D ^ 192) - 1 >> 63`, `0 ** abs(D - 192)`),
        and repeating a sequence by a computed count builds it at the size of the input (gigabytes in serving
        from a list that is a few bytes in the checks)."""
        constant = self.constant(node.left) and self.constant(node.right)
        if isinstance(node.op, HOST_BIT_OPS) and not constant:
            self.bad(node, "unverifiable", f"`{ast.unparse(node)[:40]}`: {HOST_BITS_REASON}")
        elif isinstance(node.op, ast.Pow) and not self.constant(node.right):
            self.bad(node, "unverifiable", f"`{ast.unparse(node)[:40]}`: an exponent in host code is a constant")
        elif isinstance(node.op, ast.Mult):
            for seq, count in ((node.left, node.right), (node.right, node.left)):
                if _sequence(seq) and not self.constant(count):
                    self.bad(
                        node,
                        "structure",
                        f"`{ast.unparse(node)[:40]}`: a sequence is repeated only a constant number of times",
                    )
                    break

    def name(self, node: ast.Name, s: _Scope, called: bool = False) -> None:
        n = node.id
        k = s.kernel
        if _is_dunder(n):
            self.bad(node, "introspection", f"`{n}` is not allowed")
        elif n in s.local and n not in MODULE_NAMES and n not in self.functions:
            return  # (a local named like a module or function was already rejected as a rebinding)
        elif n in MODULE_NAMES:
            if n in self.modules:
                self.bad(node, "alias", f"`{n}` may only be used as `{n}.<allowed name>`, not as a value")
            else:
                self.bad(node, "undefined-name", f"`{n}` is used but not imported")
        elif n in self.kernels:
            if not (k and called):
                self.bad(
                    node,
                    "state" if not k else "kernel-language",
                    f"`{n}`: host code may only launch a kernel (`{n}[grid](...)`); its attributes hold mutable "
                    f"caches that could keep state across calls"
                    if not k
                    else f"kernel `{n}` may only be called from another kernel",
                )
        elif n in self.host_functions:
            if k:
                self.bad(node, "kernel-language", f"kernels cannot use the host function `{n}`")
            elif not called:
                self.bad(node, "alias", f"the function `{n}` may only be called, not used as a value")
        elif n in self.constants:
            return
        elif n in BUILTIN_NAMES:
            allowed = KERNEL_BUILTINS if k else HOST_BUILTINS | HOST_EXCEPTIONS
            if n not in allowed:
                where = "in a kernel" if k else "in host code"
                self.bad(
                    node,
                    "forbidden-call",
                    f"`{n}` is not allowed {where} (allowed builtins: "
                    f"{', '.join(sorted(KERNEL_BUILTINS if k else HOST_BUILTINS))})",
                )
        else:
            self.bad(
                node,
                "undefined-name",
                f"`{n}` is not defined in the file (names are imported modules, "
                f"allowed builtins, the file's functions and constants, and locals)",
            )

    def attribute(self, node: ast.Attribute, s: _Scope, called: bool) -> None:
        k = s.kernel
        if _is_dunder(node.attr):
            self.bad(node, "introspection", f"dunder attribute `.{node.attr}` is not allowed")
            return
        dotted = _dotted(node)
        root = dotted.split(".")[0] if dotted else None
        if dotted and root in MODULE_NAMES:  # a local of that name was already rejected as a rebinding
            self.module_path(node, dotted, s)
            return
        if isinstance(node.value, ast.Name) and node.value.id in self.kernels:
            self.bad(
                node,
                "state",
                f"`{dotted}`: host code may only launch a kernel (`{node.value.id}[grid](...)`); "
                f"its attributes hold mutable caches that could keep state across calls",
            )
            return
        if k and isinstance(node.value, ast.Name) and node.value.id in self.constants - s.local:
            # a module constant in a kernel is a Python value at compile time: its methods would run Python
            # in the process that compiles the kernel (the serving process included)
            self.bad(
                node,
                "kernel-language",
                f"`{node.value.id}.{node.attr}`: a module constant has no attributes "
                f"in a kernel (constants are values; only tensors have methods)",
            )
            return
        if k:
            if node.attr not in KERNEL_VALUE_ATTRS:
                self.bad(
                    node,
                    "kernel-language",
                    f"`.{node.attr}` is not allowed in a kernel (values in kernels "
                    f"have only the attributes and methods listed in the rules)",
                )
        elif called:
            if node.attr not in HOST_METHODS:
                self.bad(
                    node,
                    "torch-compute",
                    f"`.{node.attr}()` is not allowed in host code: it may compute on, "
                    f"copy, read back or mutate data (host methods are shape and stride "
                    f"queries and views)",
                )
        elif node.attr not in HOST_PROPERTIES:
            self.bad(
                node,
                "torch-compute",
                f"attribute `.{node.attr}` is not allowed in host code (allowed: "
                f"{', '.join(sorted(HOST_PROPERTIES))}; methods must be called)",
            )
        self.expr(node.value, s)

    def module_path(self, node: ast.AST, dotted: str, s: _Scope) -> None:
        root, _, rest = dotted.partition(".")
        k = s.kernel
        if root not in self.modules:
            self.bad(node, "undefined-name", f"`{root}` is used but not imported")
            return
        first = rest.split(".")[0]
        if root == "tl":
            ok = (
                rest in TL_DTYPES
                or (rest in TL_FUNCTIONS if k else rest == "constexpr")
                or (k and first == "math" and rest.count(".") == 1 and rest.split(".")[1] in TL_MATH)
            )
            if not ok:
                reason = TL_REJECT_REASONS.get(first) or TL_REJECT_REASONS.get(rest.split(".")[-1])
                if reason:
                    self.bad(node, "unverifiable", f"`tl.{rest}`: {reason}")
                elif not k and rest in TL_FUNCTIONS:
                    self.bad(node, "kernel-language", f"`tl.{rest}` is only allowed inside kernels")
                else:
                    self.bad(
                        node,
                        "unverifiable",
                        f"`tl.{rest}` is not in the kernel language (allowed: the tl "
                        f"functions and dtypes listed in the rules)",
                    )
        elif root == "triton":
            if first in ("autotune", "Config", "heuristics"):
                self.bad(node, "autotune", f"`triton.{rest}` is not allowed: launch configs must be explicit")
            elif k:
                self.bad(node, "kernel-language", f"`triton.{rest}` in a kernel: use `tl.` functions")
            elif rest not in TRITON_HOST:
                self.bad(
                    node,
                    "unverifiable",
                    f"`triton.{rest}` is not allowed (allowed: {_names(TRITON_HOST, 'triton.')}; kernels use `tl.`)",
                )
        elif root == "torch":
            if k:
                self.bad(node, "kernel-language", f"`torch.{rest}` in a kernel")
            elif rest not in TORCH_HOST:
                self.bad(
                    node,
                    "torch-compute",
                    f"`torch.{rest}` is not allowed: host code may only allocate "
                    f"(torch.empty*), read shapes and make views",
                )
        elif root == "math":
            if k:
                self.bad(node, "kernel-language", f"`math.{rest}` in a kernel: use `tl.` functions")
            elif rest not in MATH_HOST:
                self.bad(
                    node, "forbidden-call", f"`math.{rest}` is not allowed (allowed: {_names(MATH_HOST, 'math.')})"
                )

    def call(self, node: ast.Call, s: _Scope) -> None:
        k = s.kernel
        fn = node.func
        if isinstance(fn, ast.Name):
            if fn.id in self.kernels and not k:
                self.bad(node, "structure", f"a kernel is only launched as `{fn.id}[grid](...)`, not called")
            elif (fn.id in s.local or fn.id in self.constants) and fn.id not in MODULE_NAMES | self.functions:
                # a value cannot be called: functions are not values in this language (a method read
                # without its call, `t = x.type`, could otherwise be called later)
                self.bad(
                    node,
                    "structure",
                    f"`{fn.id}(...)`: only builtins, the file's functions, allowed module "
                    f"functions and methods can be called, not a variable",
                )
            else:
                self.name(fn, s, called=True)
            if (
                fn.id == "range"
                and not k
                and node is not self.loop_range
                and not all(self.constant(a) for a in node.args)
            ):
                self.bad(
                    node,
                    "structure",
                    f"`{ast.unparse(node)[:40]}` outside a `for` statement: a comprehension or list over a computed "
                    f"range is as long as the input",
                )
        elif isinstance(fn, ast.Subscript) and isinstance(fn.value, ast.Name) and fn.value.id in self.kernels:
            if k:
                self.bad(node, "kernel-language", "kernels cannot launch kernels")
            self.expr(fn.slice, s)  # the launch grid
        elif isinstance(fn, ast.Attribute):
            self.attribute(fn, s, called=True)
        else:
            self.bad(
                node,
                "structure",
                "only named functions, methods and kernel launches (`kernel[grid](...)`) can be called",
            )
            self.expr(fn, s)
        for a in node.args:
            self.expr(a, s)
        for kw in node.keywords:
            if kw.arg is None:
                self.bad(kw.value, "structure", "`**` arguments are not allowed")
            elif _is_dunder(kw.arg):
                self.bad(kw.value, "introspection", f"`{kw.arg}` is not allowed")
            elif kw.arg == "out" and not k:
                self.bad(
                    kw.value, "mutation", "`out=` writes into an existing tensor (allocate outputs with torch.empty*)"
                )
            self.expr(kw.value, s)


def check_source(source: Union[str, bytes], op_name: str) -> GateResult:
    """The gate's verdict on a file's bytes (or text): first that they read one way only
    (sanitizer/canonical.py), then the language on the syntax tree. A file that passes has a canonical
    text, and that text passes too: it is what runs."""
    try:
        judge_text(source)
    except TextRefused as e:
        return GateResult(
            False,
            [
                Finding(
                    e.line,
                    "syntax" if e.reason.startswith(("syntax error", "the file cannot be parsed")) else "text",
                    e.reason,
                )
            ],
        )
    tree = parse_module(source.decode("utf-8") if isinstance(source, bytes) else source)
    gate = _Gate(op_name)
    try:
        gate.module(tree)
    except RecursionError:
        gate.bad(None, "structure", "expressions nested too deeply")
    seen = set()
    findings = []
    for f in gate.findings:  # one finding per (line, rule)
        if (f.line, f.rule) not in seen:
            seen.add((f.line, f.rule))
            findings.append(f)
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if op_name not in top:
        findings.append(Finding(0, "contract", f"no module-level function named `{op_name}`"))
    elif op_name in gate.kernels:
        findings.append(
            Finding(top[op_name].lineno, "contract", f"`{op_name}` must be the host wrapper, not a @triton.jit kernel")
        )
    if not gate.kernels:
        findings.append(
            Finding(
                0,
                "contract",
                "no @triton.jit kernel in the file: the result must be computed by Triton kernels defined in it",
            )
        )
    return GateResult(not findings, findings, list(gate.kernels))

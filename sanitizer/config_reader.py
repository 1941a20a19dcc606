"""What a kernel source's `_config` returns for a shape, read from its syntax tree: the source is never run.

The search (agent/search.py) climbs from the configuration the incumbent uses. The incumbent was written by
a model, and the loop's process holds the model's key, so its text is not imported there: `read_config`
evaluates `_config` (and the host functions it calls) with a small evaluator of its own, over Python numbers,
strings, tuples, lists (with Python's own semantics: `[D] != (D,)`) and the device. It knows a fixed table of
operations (arithmetic, comparisons, `if`, subscripts and unpacking, `min`/`max`/`int`/..., `triton.cdiv`,
`triton.next_power_of_2`, `math.*`, a device's `.type` and `.index`, and
`torch.cuda.get_device_properties(device).multi_processor_count`) and calls nothing else. The functions it calls
take numbers or flat tuples and lists of numbers (`len` and `tuple` any tuple or list). Anything outside that
(bytes, say), or a computation that runs too long or grows too large, is `ConfigUnreadable`. A value that one
operation could make large (a repetition, a concatenation, a product) is measured before it is built, and each
cell of a sequence built or read costs a step: a `_config` cannot make the loop's process spend much memory or
time.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable, Dict, List

import torch
import triton

from .canonical import TextRefused, judge_text, parse_module

MAX_STEPS = 20_000  # a step is a node evaluated, or a cell of a sequence built or read
MAX_DEPTH = 16
MAX_INT = 1 << 64
MAX_CELLS = 1024  # per value: what comparing or copying one costs, nested sequences counted in full

_BINOPS: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_COMPARE: Dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_UNARY: Dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
    ast.Invert: operator.invert,
}
_BUILTINS: Dict[str, Callable] = {
    "min": min,
    "max": max,
    "int": int,
    "float": float,
    "abs": abs,
    "bool": bool,
    "tuple": tuple,
    "len": len,
    "divmod": divmod,
}
_MATH = (
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
    "copysign",
    "isfinite",
    "isinf",
    "isnan",
)
_FUNCTIONS: Dict[str, Callable] = {
    "triton.cdiv": triton.cdiv,
    "triton.next_power_of_2": triton.next_power_of_2,
    **{f"math.{n}": getattr(math, n) for n in _MATH},
}
_CONSTANTS = {"math.pi": math.pi, "math.e": math.e, "math.inf": math.inf, "math.tau": math.tau}


class ConfigUnreadable(ValueError):
    """`_config` does something the evaluator does not know (one line says what)."""


def _cells(value: Any) -> int:
    """How many cells `value` spans: a sequence one per element plus the cells of the sequences nested in it,
    however often one recurs (a sequence repeated in itself costs its full size to compare). The count stops
    once past MAX_CELLS, so it costs about that much at most."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if not isinstance(value, (tuple, list)):
        return 1
    n = len(value)
    for e in value:
        if n > MAX_CELLS:
            break
        if isinstance(e, (str, bytes, tuple, list)):
            n += _cells(e)
    return n


def _too_large(op: ast.operator, left: Any, right: Any) -> bool:
    """Whether `left op right` would build a sequence past MAX_CELLS: measured before it exists, since building
    it is what exhausts the loop's memory (`"x" * 2**33`)."""
    seqs = (str, bytes, tuple, list)
    if isinstance(op, ast.Add) and isinstance(left, seqs) and isinstance(right, seqs):
        return _cells(left) + _cells(right) > MAX_CELLS
    if isinstance(op, ast.Mult):
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, seqs) and isinstance(times, int):
                return _cells(seq) * max(times, 0) > MAX_CELLS
    return False


def _flat_numbers(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(e, (int, float)) for e in value)


def _product_bits(args: List[Any]) -> int:
    """A bound on the bits of the product of the ints among `args` (and in their flat sequences): `math.prod` or
    `math.lcm` over many large ints builds an int as large as all of them together, one step at a time."""
    flat = [x for a in args for x in (a if isinstance(a, (tuple, list)) else (a,))]
    return sum(abs(x).bit_length() for x in flat if isinstance(x, int))


class _Props:
    """The one field of a device's properties a configuration reads."""

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise ConfigUnreadable(f"the properties of a {device.type} device")
        self.multi_processor_count = torch.cuda.get_device_properties(device).multi_processor_count


_PENDING = object()


class _Return(Exception):
    def __init__(self, value: Any):
        self.value = value


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id] + parts[::-1]) if isinstance(node, ast.Name) else ""


def _jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


class _Evaluator:
    def __init__(self, tree: ast.Module):
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and not _jit(n)}
        self.constant_nodes = {
            n.targets[0].id: n.value
            for n in tree.body
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
        }
        self.constants: Dict[str, Any] = {}
        self.steps = 0
        self.depth = 0

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise ConfigUnreadable(f"`_config` takes more than {MAX_STEPS} steps to evaluate")

    def bounded(self, value: Any) -> Any:
        """`value`, when it is of a kind the evaluator knows and within its bounds. A sequence costs a step per
        cell, as building it did: the steps then bound the memory and the time of the whole evaluation."""
        if isinstance(value, (str, tuple, list)):
            cells = _cells(value)
            if cells > MAX_CELLS:
                raise ConfigUnreadable("a value grows too large")
            self.tick(cells)
        elif isinstance(value, int) and abs(value) > MAX_INT:
            raise ConfigUnreadable("a value grows too large")
        elif not isinstance(value, (int, float, type(None), slice, torch.device, _Props)):
            raise ConfigUnreadable(f"a value of type {type(value).__name__}: not one the search evaluates")
        return value

    def call(self, name: str, args: List[Any]) -> Any:
        fn = self.functions.get(name)
        if fn is None:
            raise ConfigUnreadable(f"`{name}` is not a host function of the file")
        a = fn.args
        if a.kwonlyargs or a.kwarg or a.posonlyargs:
            raise ConfigUnreadable(f"`{name}` takes keyword-only or positional-only parameters")
        params = [p.arg for p in a.args]
        self.depth += 1  # before the defaults: they are evaluated per call, and may call `name` again
        try:
            if self.depth > MAX_DEPTH:
                raise ConfigUnreadable("host functions nest too deeply")
            defaults = [self.expr(d, {}) for d in a.defaults]
            if len(args) > len(params) and not a.vararg or len(args) < len(params) - len(defaults):
                raise ConfigUnreadable(f"`{name}` called with {len(args)} arguments")
            scope: Dict[str, Any] = dict(zip(params, args))
            for p, d in zip(params[len(params) - len(defaults) :], defaults):
                scope.setdefault(p, d)
            if a.vararg:
                scope[a.vararg.arg] = tuple(args[len(params) :])
            self.body(fn.body, scope)
        except _Return as r:
            return r.value
        finally:
            self.depth -= 1
        return None

    def body(self, stmts: List[ast.stmt], scope: Dict[str, Any]) -> None:
        for st in stmts:
            self.stmt(st, scope)

    def stmt(self, st: ast.stmt, scope: Dict[str, Any]) -> None:
        self.tick()
        if isinstance(st, ast.Return):
            raise _Return(None if st.value is None else self.expr(st.value, scope))
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and st.value is not None:
            for t in st.targets if isinstance(st, ast.Assign) else [st.target]:
                self.assign(t, self.expr(st.value, scope), scope)
        elif isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name) and type(st.op) in _BINOPS:
            scope[st.target.id] = self.binop(st.op, self.expr(st.target, scope), self.expr(st.value, scope))
        elif isinstance(st, ast.If):
            self.body(st.body if self.expr(st.test, scope) else st.orelse, scope)
        elif isinstance(st, ast.Assert):
            if not self.expr(st.test, scope):
                raise ConfigUnreadable(f"an assertion of `_config` fails: {ast.unparse(st.test)[:80]}")
        elif not isinstance(st, ast.Pass) and not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)):
            raise ConfigUnreadable(f"`{ast.unparse(st).splitlines()[0][:80]}`: not a statement the search evaluates")

    def assign(self, target: ast.AST, value: Any, scope: Dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
        elif (
            isinstance(target, (ast.Tuple, ast.List))
            and isinstance(value, (tuple, list))
            and len(target.elts) == len(value)
        ):
            for t, v in zip(target.elts, value):
                self.assign(t, v, scope)
        else:
            raise ConfigUnreadable(f"cannot assign to `{ast.unparse(target)[:60]}`")

    def binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        if isinstance(op, (ast.Pow, ast.LShift)) and (not isinstance(right, (int, float)) or abs(right) > 64):
            raise ConfigUnreadable("an exponent or shift larger than 64")
        if isinstance(op, ast.Mod) and isinstance(left, str):
            # printf-style formatting builds its string before any size check (`"%*d" % (6e10, 1)`)
            raise ConfigUnreadable("string formatting is not a computation the search evaluates")
        # reading a sequence costs a step per cell, as building one does (`t * 0` reads `t` to measure it)
        self.tick(sum(_cells(x) for x in (left, right) if isinstance(x, (str, tuple, list))))
        if _too_large(op, left, right):
            raise ConfigUnreadable("a value grows too large")
        try:
            out = _BINOPS[type(op)](left, right)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
            raise ConfigUnreadable(f"{type(e).__name__}: {e}") from None
        # the operands are bounded, and an exponent or shift at most 64: `out` is at most some 4096 bits
        return self.bounded(out)

    def elements(self, nodes: List[ast.expr], scope: Dict[str, Any]) -> List[Any]:
        """The values of a literal's or a call's elements, `*x` spread: measured as they come, so that spreading a
        sequence many times over is refused before the list holds it."""
        out: List[Any] = []
        cells = 0
        for e in nodes:
            if isinstance(e, ast.Starred):
                value = self.expr(e.value, scope)
                if not isinstance(value, (tuple, list)):
                    raise ConfigUnreadable(f"`{ast.unparse(e)[:60]}`: spreads a {type(value).__name__}")
                cells += _cells(value)
            else:
                value = (self.expr(e, scope),)
                cells += _cells(value)
            if cells > MAX_CELLS:
                raise ConfigUnreadable("a value grows too large")
            out.extend(value)
        return out

    def expr(self, node: ast.AST, scope: Dict[str, Any]) -> Any:
        self.tick()
        if isinstance(node, ast.Constant):
            return self.bounded(node.value)  # bytes, complex and `...` are refused: a config holds none
        if isinstance(node, ast.Name):
            return self.name(node.id, scope)
        if isinstance(node, ast.Tuple):
            return self.bounded(tuple(self.elements(node.elts, scope)))
        if isinstance(node, ast.List):
            return self.bounded(self.elements(node.elts, scope))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self.binop(node.op, self.expr(node.left, scope), self.expr(node.right, scope))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self.bounded(_UNARY[type(node.op)](self.expr(node.operand, scope)))
        if isinstance(node, ast.BoolOp):
            value = None
            for v in node.values:
                value = self.expr(v, scope)
                if (not value) if isinstance(node.op, ast.And) else value:
                    return value
            return value
        if isinstance(node, ast.Compare):
            left = self.expr(node.left, scope)
            for op, c in zip(node.ops, node.comparators):
                right = self.expr(c, scope)
                if isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, (tuple, list)):
                    # a substring search costs up to the product of the two lengths
                    raise ConfigUnreadable(f"`{ast.unparse(node)[:80]}`: `in` over a {type(right).__name__}")
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.expr(node.body if self.expr(node.test, scope) else node.orelse, scope)
        if isinstance(node, ast.Subscript):
            value, index = self.expr(node.value, scope), self.expr(node.slice, scope)
            if isinstance(value, (tuple, list, str)) and isinstance(index, (int, slice)):
                return self.bounded(value[index])
        if isinstance(node, ast.Slice):
            return slice(*(None if p is None else self.expr(p, scope) for p in (node.lower, node.upper, node.step)))
        if isinstance(node, ast.Call):
            return self.call_expr(node, scope)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, scope)
        raise ConfigUnreadable(f"`{ast.unparse(node)[:80]}`: not an expression the search evaluates")

    def name(self, name: str, scope: Dict[str, Any]) -> Any:
        if name in scope:
            return scope[name]
        if name in self.constant_nodes:
            if name not in self.constants:
                self.constants[name] = _PENDING  # what a constant that refers back to itself finds
                self.constants[name] = self.expr(self.constant_nodes[name], {})
            if self.constants[name] is _PENDING:
                raise ConfigUnreadable(f"the module constant `{name}` refers to itself")
            return self.constants[name]
        raise ConfigUnreadable(f"`{name}` is not a value the search knows")

    def call_expr(self, node: ast.Call, scope: Dict[str, Any]) -> Any:
        if node.keywords:
            raise ConfigUnreadable(f"`{ast.unparse(node)[:80]}`: keyword arguments")
        args = self.elements(node.args, scope)
        fn = node.func
        name = _dotted(fn)
        if isinstance(fn, ast.Name) and fn.id in self.functions and fn.id not in scope:
            return self.call(fn.id, args)
        if isinstance(fn, ast.Name) and fn.id in _BUILTINS and fn.id not in scope:
            builtin = _BUILTINS[fn.id]
        elif name in _FUNCTIONS:
            builtin = _FUNCTIONS[name]
        elif name == "torch.cuda.get_device_properties" and len(args) == 1 and isinstance(args[0], torch.device):
            return _Props(args[0])
        else:
            raise ConfigUnreadable(f"`{ast.unparse(fn)[:60]}(...)`: not a function the search evaluates")
        self.tick(sum(len(a) for a in args if isinstance(a, (tuple, list))))  # a step per element read
        # numbers in, numbers out: a string or a nested sequence is what `math.prod` repeats (`prod((2**33, "x"))`)
        if name in ("len", "tuple"):
            if not all(isinstance(a, (tuple, list)) for a in args):
                raise ConfigUnreadable(f"`{ast.unparse(node)[:80]}`: an argument that is not a tuple or a list")
        elif not all(isinstance(a, (int, float)) or _flat_numbers(a) for a in args):
            raise ConfigUnreadable(
                f"`{ast.unparse(node)[:80]}`: an argument that is not a number or a flat tuple of numbers"
            )
        if name in ("math.prod", "math.lcm") and _product_bits(args) > 2 * MAX_INT.bit_length():
            raise ConfigUnreadable("a value grows too large")
        return self.bounded(builtin(*args))

    def attribute(self, node: ast.Attribute, scope: Dict[str, Any]) -> Any:
        name = _dotted(node)
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        value = self.expr(node.value, scope)
        if isinstance(value, torch.device) and node.attr in ("type", "index"):
            return getattr(value, node.attr)
        if isinstance(value, _Props) and node.attr == "multi_processor_count":
            return value.multi_processor_count
        raise ConfigUnreadable(f"`{ast.unparse(node)[:60]}`: not an attribute the search evaluates")


def read_config(source: str, args: tuple) -> tuple:
    """What the source's `_config(*args)` returns, evaluated on its syntax tree. ConfigUnreadable (one line)
    when it cannot be read that way."""
    try:
        tree = parse_module(judge_text(source).text)
    except TextRefused as e:
        raise ConfigUnreadable(f"the source is refused: {e}") from None
    try:
        value = _Evaluator(tree).call("_config", list(args))
    except ConfigUnreadable:
        raise
    except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError, RuntimeError, MemoryError) as e:
        raise ConfigUnreadable(f"`_config` fails: {type(e).__name__}: {str(e)[:120]}") from None
    if isinstance(value, list):  # as the search's own variants read it: `tuple(_config_base(*args))`
        value = tuple(value)
    if not isinstance(value, tuple):
        raise ConfigUnreadable(f"`_config` returned {type(value).__name__}, not a tuple")
    return value


__all__ = ["ConfigUnreadable", "read_config"]

"""The integer sizes a candidate compares against: where a cheat wrong only at a magic size must show itself.

A kernel that is wrong only when `D == 192`, `K == 14336`, the GQA group is 7 or `seq_len % 1024 == 1000`
passes every check that never draws that size, and a contract's domain is too large to draw whole (head dims
1..256, contexts up to 131072). But the cheat has to test for its size, so the size is written in the code:
`compared_values` reads the candidate's syntax tree (never running it) and returns, for every comparison in
host or kernel code, the values that make it flip. The `compared_values` check (sanitizer/checks.py) draws
each of them as every dimension of the op's contract that admits it (Op.value_regions).

What is read:
* each side of a comparison that folds to a constant (`96 * 2`, a module constant, `192 if c else -1`),
  solved back through the arithmetic on the other side (`D * 3 == 576`, `(D ^ 5) == 197`, `x - 192 == 0`,
  `seq_len % 1024 == 1000` gives 1000, 2024, ... (eight residues, for a multiplied one), `D // 64 == 3` gives
  192 and 255, `D * 0.5 == 96` and `D * D == 36864` give 192); an ordering (`<`, `>=`) adds the neighbours,
  where it flips;
* each constant a `min`/`max`/`clamp` meets (an indicator with no comparison), as a comparison's;
* every integer constant inside a comparison, whatever wraps it;
* the divisor of every floor division, modulo and shift by a constant (`amax * (1 + D // 192)` flips at 192);
* every size from 1 to 4096 at which an expression of bits or powers of one name changes value, computed at
  each (`((HEAD_D ^ 192) - 1) >> 31 & 1` changes at 192 and 193), unless it changes more than 16 times (a mask).
`compared_joints` reads the sizes one condition compares together (`(H == 8) & (D == 192)`), drawn together.
A file that compares against more than MAX_COMPARED distinct values is refused: drawing them all would not
fit a check's time, and no kernel in the correct suite comes near it.
"""

from __future__ import annotations

import ast
import copy
import math
import operator
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from .canonical import parse_module

MAX_COMPARED = 48  # distinct values from comparisons; the correct suite's largest file has far fewer
LIMIT = 1 << 31  # sizes past this are not drawn as one dimension by any op
_FOLD = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.Pow: operator.pow,
}
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
Number = Union[int, float]
# calls that clamp their argument at a constant: an indicator built of them flips where the argument meets it
_CLAMPS = ("min", "max", "minimum", "maximum", "clamp")


def _next_power_of_2(n: Number) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: Number, b: Number) -> int:
    return -(int(a) // -int(b))


# calls the solver computes (a size reached through `triton.next_power_of_2(D)`, `math.log2(D)`): by the last
# name of the callee, arguments folded first
_CALLS: Dict[str, Callable[..., Number]] = {
    "next_power_of_2": _next_power_of_2,
    "cdiv": _cdiv,
    "int": int,
    "abs": abs,
    "min": min,
    "max": max,
    "round": round,
    "ceil": math.ceil,
    "floor": math.floor,
    "log2": math.log2,
    "log": math.log,
    "sqrt": math.sqrt,
    "isqrt": math.isqrt,
    "exp2": lambda x: 2.0**x,
    "pow": pow,
    "gcd": math.gcd,
}


def _number(v: Number) -> Optional[Number]:
    """A folded value as the folder holds it (an int where it is whole), or None past its bounds."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) < 1 << 62 or v != v:
        return None
    return int(v) if float(v).is_integer() else v


class TooManyCompared(ValueError):
    """The file compares against more distinct values than the check draws."""


def _module_constants(tree: ast.Module) -> Dict[str, ast.AST]:
    return {
        n.targets[0].id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
    }


class _Folder:
    """Constant folding over ints (module constants resolved, sizes bounded so that folding stays cheap)."""

    def __init__(self, constants: Dict[str, ast.AST]):
        self.constants = constants
        self.seen: set = set()

    def fold(self, node: ast.AST) -> Optional[Number]:
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not abs(v) < 1 << 62:
                return None
            return int(v) if float(v).is_integer() else v  # a float constant folds too (`D * 0.5 == 96`)
        if isinstance(node, ast.Name) and node.id in self.constants and node.id not in self.seen:
            self.seen.add(node.id)
            try:
                return self.fold(self.constants[node.id])
            finally:
                self.seen.discard(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)):
            v = self.fold(node.operand)
            if v is None:
                return None
            if isinstance(node.op, ast.Invert):
                return ~v if isinstance(v, int) else None  # `~0.5` is no number
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call) and not node.keywords and _computed(node):
            args = [self.fold(a) for a in node.args]
            if not args or any(a is None for a in args):
                return None
            try:
                v = _CALLS[_callee(node)](*args)
            except (ArithmeticError, ValueError, TypeError):
                return None
            return _number(v)
        if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
            a, b = self.fold(node.left), self.fold(node.right)
            if a is None or b is None or isinstance(node.op, (ast.Pow, ast.LShift)) and not 0 <= b <= 62:
                return None
            if isinstance(a, float) or isinstance(b, float):
                if type(node.op) not in (ast.Add, ast.Sub, ast.Mult):
                    return None
            try:
                v = _FOLD[type(node.op)](a, b)
            except (ZeroDivisionError, ValueError, OverflowError):
                return None
            return v if abs(v) < 1 << 62 else None
        return None


def _solve(f: _Folder, expr: ast.AST, target: Number, depth: int = 0) -> List[Number]:
    """Values of the free operand of `expr` (an int expression) for which `expr == target`: one step of
    arithmetic with a constant undone at a time; anything else is taken as the free operand itself."""
    if depth > 8:
        return [target]
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        return _solve(f, expr.operand, -target, depth + 1)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("int", "abs", "min", "max"):
        return [v for a in expr.args if f.fold(a) is None for v in _solve(f, a, target, depth + 1)] + (
            [-target] if expr.func.id == "abs" else []
        )
    if not isinstance(expr, ast.BinOp):
        return [target]
    left, right = f.fold(expr.left), f.fold(expr.right)
    if (
        left is None
        and right is None
        and isinstance(expr.op, ast.Mult)
        and ast.dump(expr.left) == ast.dump(expr.right)
        and target >= 0
    ):
        root = math.isqrt(int(target))  # `D * D == 36864`
        return _solve(f, expr.left, root, depth + 1) if root * root == target else []
    if right is not None and left is None:
        k, free = right, expr.left
    elif left is not None and right is None:
        k, free = left, expr.right
    else:
        return [target]
    op = type(expr.op)
    undo: List[Number]
    # Python's bit operators take ints only: with a fractional side, `target` is taken as the free operand
    if op is ast.Add:
        undo = [target - k]
    elif op is ast.Sub:
        undo = [target + k] if right is not None else [k - target]
    elif op is ast.Mult:
        undo = [target / k] if k and float(target / k).is_integer() else []  # (`D * 0.5 == 96` too)
    elif op is ast.Pow and right is not None and k == 2 and target >= 0:
        undo = [math.isqrt(int(target))] if math.isqrt(int(target)) ** 2 == target else []
    elif op is ast.FloorDiv and right is not None and k > 0:
        undo = [target * k, target * k + k - 1]
    elif op is ast.Mod and right is not None and k > 0:
        undo = [target + j * k for j in range(8)]  # residues: `(seq_len * 3) % 1024 == 1000` at 3048 / 3
    elif op is ast.RShift and right is not None and isinstance(k, int) and isinstance(target, int) and 0 <= k <= 40:
        undo = [target << k, ((target + 1) << k) - 1]
    elif op is ast.LShift and right is not None and isinstance(k, int) and isinstance(target, int) and 0 <= k <= 62:
        undo = [target >> k]
    elif op is ast.BitXor and isinstance(k, int) and isinstance(target, int):
        undo = [target ^ k]
    else:
        undo = [target]
    return [v for u in undo for v in _solve(f, free, int(u) if float(u).is_integer() else u, depth + 1)]


def _meetings(f: _Folder, node: ast.AST) -> Iterator[Tuple[ast.AST, Number, bool]]:
    """Where `node` meets a constant: (the side that is not constant, the constant, whether an ordering
    flips there, so that its neighbours count too), for each side of a comparison and each argument of a
    clamp (`min(max(D - 191, 0), 1)`: an indicator with no comparison, each argument meeting each constant);
    nothing for any other node."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for op, a, b in zip(node.ops, operands, operands[1:]):
            for free, const in ((a, f.fold(b)), (b, f.fold(a))):
                if const is not None and f.fold(free) is None:
                    yield free, const, isinstance(op, _ORDERING)
    elif isinstance(node, ast.Call) and _callee(node) in _CLAMPS:
        consts = [c for c in (f.fold(a) for a in node.args) if c is not None]
        for a in node.args:
            if f.fold(a) is None:
                for c in consts:
                    yield a, c, True


SCAN_LIMIT = 4096  # head dims, pages, groups and quantized rows all lie under it
MAX_CHANGES = 16  # an expression that changes value more often than this is no indicator of a few sizes
_BITS = (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift, ast.Pow)


def _bit_expressions(tree: ast.AST) -> Iterator[ast.AST]:
    """The int expressions holding a bit operator or a power, each with the ones inside it: where an indicator of
    one size can be built with no comparison (`((HEAD_D ^ 192) - 1) >> 31 & 1` in a kernel, on a constexpr), also
    inside a larger expression of other names (`qk * (scale * (1 + 0.05 * ...))`)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.UnaryOp)) and any(
            isinstance(n, ast.BinOp)
            and isinstance(n.op, _BITS)
            or isinstance(n, ast.UnaryOp)
            and isinstance(n.op, ast.Invert)
            for n in ast.walk(node)
        ):
            yield node


def _changes(f: _Folder, expr: ast.AST, name: str) -> List[int]:
    """The sizes 1..SCAN_LIMIT where `expr`, computed from `name` alone, takes another value than one below:
    every size an indicator built of bits or powers singles out, found by computing it at each. Empty when it
    changes more than MAX_CHANGES times (a mask or a parity, no indicator of a few sizes)."""
    out: List[int] = []
    previous: Optional[Number] = None
    for x in range(0, SCAN_LIMIT + 1):
        at = _Folder({**f.constants, name: ast.Constant(x)})
        v = at.fold(expr)
        if x and v != previous:
            out += [x - 1, x]
            if len(out) > 2 * MAX_CHANGES:
                return []
        previous = v
    return out


MAX_VARIANTS = 8  # expansions of one comparison (a helper called from several places gives one per call)


def _callee_name(call: ast.Call) -> str:
    """The function a call names: `f(...)`, `kernel[grid](...)`."""
    fn = call.func.value if isinstance(call.func, ast.Subscript) else call.func
    return fn.id if isinstance(fn, ast.Name) else ""


def _single_assignments(fn: ast.FunctionDef) -> Dict[str, ast.AST]:
    """The names a function binds exactly once, by a plain `name = value` (not a parameter, a loop's, an unpacked
    or augmented one) -> the value."""
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    counts: Dict[str, int] = {}
    values: Dict[str, ast.AST] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            counts[node.id] = counts.get(node.id, 0) + 1
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value
    return {n: v for n, v in values.items() if counts.get(n) == 1 and n not in params}


class _Scopes:
    """What a name inside a function of the file stands for, to solve a comparison written on it: a local bound
    once (`pad = triton.next_power_of_2(D) - D`), a parameter of a function the file calls (each argument
    expression at each call site, a kernel's launch too: `_impl(x, D * 2)`), followed a few levels deep."""

    def __init__(self, tree: ast.Module):
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.owner: Dict[int, ast.FunctionDef] = {}
        for fn in self.functions.values():
            for node in ast.walk(fn):
                self.owner[id(node)] = fn
        self.locals = {name: _single_assignments(fn) for name, fn in self.functions.items()}
        self.sites: Dict[str, Dict[str, List[Tuple[ast.AST, ast.FunctionDef]]]] = {}
        for caller in self.functions.values():
            for call in (n for n in ast.walk(caller) if isinstance(n, ast.Call)):
                callee = self.functions.get(_callee_name(call))
                if callee is not None:
                    self._bind(callee, call, caller)

    def _bind(self, callee: ast.FunctionDef, call: ast.Call, caller: ast.FunctionDef) -> None:
        names = [a.arg for a in callee.args.posonlyargs + callee.args.args]
        bound = self.sites.setdefault(callee.name, {})
        for name, arg in zip(names, call.args):
            if not isinstance(arg, ast.Starred):
                bound.setdefault(name, []).append((arg, caller))
        for kw in call.keywords:
            if kw.arg:
                bound.setdefault(kw.arg, []).append((kw.value, caller))

    def variants(self, node: ast.AST) -> List[ast.AST]:
        """`node` with its names replaced by what they stand for, one variant per combination (the node itself
        first), at most MAX_VARIANTS."""
        fn = self.owner.get(id(node))
        out = [node] + (self._expand(node, fn, 0) if fn is not None else [])
        unique: Dict[str, ast.AST] = {}
        for v in out:
            unique.setdefault(ast.dump(v), v)
        return list(unique.values())[:MAX_VARIANTS]

    def _options(self, name: str, fn: ast.FunctionDef, depth: int) -> List[ast.AST]:
        """What `name` stands for in `fn`: nothing where that is computed by a call the solver does not compute
        (a load, a method of a tensor: data, no size), which stays a name of its own."""
        value = self.locals.get(fn.name, {}).get(name)
        if value is not None:
            return self._expand(value, fn, depth + 1) if _computable(value) else []
        return [
            v
            for arg, caller in self.sites.get(fn.name, {}).get(name, [])
            if _computable(arg)
            for v in self._expand(arg, caller, depth + 1)
        ]

    def _expand(self, node: ast.AST, fn: ast.FunctionDef, depth: int) -> List[ast.AST]:
        if depth > 4:
            return [node]
        names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)})
        variants = [node]
        for name in names:
            options = self._options(name, fn, depth)[:MAX_VARIANTS]
            if options:
                variants = [_substitute(v, name, o) for v in variants for o in options][:MAX_VARIANTS]
        return variants


def _computable(node: ast.AST) -> bool:
    """Whether every call in `node` is one the solver computes."""
    return all(_computed(n) for n in ast.walk(node) if isinstance(n, ast.Call))


def _computed(call: ast.Call) -> bool:
    """A call the solver computes: a builtin of _CALLS by name, or a function of `triton` or `math` (a kernel's
    `tl.max` of a block is data, not a size)."""
    fn = call.func
    if isinstance(fn, ast.Name):
        return fn.id in _CALLS and fn.id in ("int", "abs", "min", "max", "round", "pow")
    return (
        isinstance(fn, ast.Attribute)
        and isinstance(fn.value, ast.Name)
        and fn.value.id in ("triton", "math")
        and fn.attr in _CALLS
    )


def _substitute(node: ast.AST, name: str, value: ast.AST) -> ast.AST:
    """A copy of `node` with every read of `name` replaced by `value`."""

    class Replace(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            return copy.deepcopy(value) if n.id == name and isinstance(n.ctx, ast.Load) else n

    return Replace().visit(copy.deepcopy(node))


MAX_SCANNED = 8  # sizes kept from one scanned comparison (the smallest: they are drawn on the CPU)


def _scan(f: _Folder, free: ast.AST, const: Number, ordering: bool) -> List[int]:
    """Where a comparison of an expression of one name that the solver cannot undo (`triton.next_power_of_2(D)
    - D == 64`) flips: computed at each size 0..SCAN_LIMIT, the sizes where it is equal (for `==`) or where an
    ordering changes side, both neighbours. Empty when the expression has no one name or calls nothing."""
    calls = [n for n in ast.walk(free) if isinstance(n, ast.Call) and _computed(n)]
    modules = {
        c.func.value.id for c in calls if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
    }
    names = {n.id for n in ast.walk(free) if isinstance(n, ast.Name) and f.fold(n) is None} - modules
    if len(names) != 1 or not calls:
        return []
    name = names.pop()
    out: List[int] = []
    previous: Optional[Tuple[bool, bool]] = None
    for x in range(0, SCAN_LIMIT + 1):
        v = _Folder({**f.constants, name: ast.Constant(x)}).fold(free)
        if v is None:
            previous = None
            continue
        if not ordering:
            out += [x] if v == const else []
        else:
            now = (v < const, v <= const)
            out += [x - 1, x] if previous is not None and now != previous else []
            previous = now
        if len(out) >= MAX_SCANNED:
            break
    return out[:MAX_SCANNED]


def compared_values(source: str) -> List[int]:
    """The sizes (0..2^31) at which some comparison or size-dependent step of `source` flips, most telling
    first: where an expression of bits changes, solved comparison sides, constants inside comparisons, divisors.
    TooManyCompared when the comparisons alone name more than MAX_COMPARED distinct values."""
    tree = parse_module(source)
    f = _Folder(_module_constants(tree))
    solved: List[Number] = []  # where a comparison or clamp flips exactly
    flips: List[Number] = []  # where an expression of bits or powers of one name changes value
    near: List[Number] = []  # its neighbours (an ordering flips between them)
    inner: List[Number] = []
    divisors: List[Number] = []  # a fractional one names no size (_unique drops it)
    scopes = _Scopes(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Compare, ast.Call)):
            for variant in scopes.variants(node):  # the comparison as written, then through locals and arguments
                for free, const, ordering in _meetings(f, variant):
                    solved += _scan(f, free, const, ordering)
                    for v in _solve(f, free, const):
                        solved.append(v)
                        near += [v - 1, v + 1] if ordering else []
        if isinstance(node, ast.Compare):
            inner += [v for sub in ast.walk(node) for v in [f.fold(sub)] if v is not None]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.RShift)):
            k = f.fold(node.right)
            if k is not None and f.fold(node.left) is None:
                k = 1 << k if isinstance(node.op, ast.RShift) and isinstance(k, int) and 0 <= k <= 30 else k
                divisors += [k - 1, k, k + 1]
    scanned = set()
    for expr in _bit_expressions(tree):
        name, dump = _free_name(f, expr), ast.dump(expr)
        if name and dump not in scanned:
            scanned.add(dump)
            flips += _changes(f, expr, name)  # exact, and rare in a kernel: drawn first
    compared = _unique(v for v in flips + solved + near + inner if 0 <= v <= LIMIT)
    if len(compared) > MAX_COMPARED:
        raise TooManyCompared(
            f"the code compares sizes against {len(compared)} distinct values (at most "
            f"{MAX_COMPARED} are drawn): a kernel needs few, a cheat hides one among many"
        )
    return _unique(list(compared) + [v for v in divisors if 0 <= v <= LIMIT])


def _free_name(f: _Folder, expr: ast.AST) -> str:
    """The one name an int expression is computed from (`D` in `D * 3 - 1`), or ""."""
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and f.fold(n) is None}
    return names.pop() if len(names) == 1 else ""


def compared_joints(source: str) -> List[Dict[str, int]]:
    """The sizes one condition compares several names against together (`(H == 8) & (D == 192)`, `H == 8 and
    D == 192`): each is drawn alone by the check, so the condition is drawn whole too, by the names."""
    tree = parse_module(source)
    f = _Folder(_module_constants(tree))
    out: List[Dict[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            parts = node.values
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            parts = [node.left, node.right]
        else:
            continue
        joint: Dict[str, int] = {}
        for part in parts:
            if not (isinstance(part, ast.Compare) and len(part.ops) == 1 and isinstance(part.ops[0], ast.Eq)):
                continue
            for free, const in ((part.left, f.fold(part.comparators[0])), (part.comparators[0], f.fold(part.left))):
                name = _free_name(f, free)
                if const is None or not name:
                    continue
                values = _unique(_solve(f, free, const))
                if values and 0 <= values[0] <= LIMIT:
                    joint[name] = values[0]
        if len(joint) >= 2 and joint not in out:
            out.append(joint)
    for joint in _runtime_pairs(tree, f):
        if joint not in out:
            out.append(joint)
    return out[:MAX_COMPARED]


# sizes two runtime values compared with each other are drawn at: equal, and unequal in each order
PAIR_VALUES = ((16, 16), (16, 32), (32, 16))


def _runtime_pairs(tree: ast.AST, f: _Folder) -> Iterator[Dict[str, int]]:
    """For every comparison of two names that hold runtime values (`if Hq == D:`, `if S > D:`, neither a
    constant), the two drawn equal and unequal, each order: a relation between sizes that the draws leave to
    chance is decided on purpose."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for a, b in zip(operands, operands[1:]):
            if (
                isinstance(a, ast.Name)
                and isinstance(b, ast.Name)
                and a.id != b.id
                and f.fold(a) is None
                and f.fold(b) is None
            ):
                for x, y in PAIR_VALUES:
                    yield {a.id: x, b.id: y}


MAX_SCALES = 16  # float thresholds drawn as sm_scale; the correct suite's files compare against none or few


def compared_scales(source: str) -> List[float]:
    """The positive real numbers a comparison or a clamp of `source` meets where a scale may flip it: every
    constant that is not a whole number (`qk_scale < 0.07`, `min(s, 0.5)`), and the whole numbers compared with
    an expression that names a scale (`sm_scale > 2`). An op with an `sm_scale` argument draws scales on both
    sides of each (sanitizer/checks.py: check_compared_values). At most MAX_SCALES, fractions first."""
    tree = parse_module(source)
    f = _Folder(_module_constants(tree))
    fractions: List[float] = []
    wholes: List[float] = []
    for node in ast.walk(tree):
        for free, const, _ in _meetings(f, node):
            if not const > 0:
                continue
            if not float(const).is_integer():
                fractions.append(float(const))
            elif any("scale" in n.id.lower() for n in ast.walk(free) if isinstance(n, ast.Name)):
                wholes.append(float(const))
    out: List[float] = []
    for v in fractions + wholes:
        if v not in out:
            out.append(v)
    return out[:MAX_SCALES]


def _callee(call: ast.Call) -> str:
    fn = call.func
    return fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""


def _unique(values: Iterable[Number]) -> List[int]:
    out: List[int] = []
    for v in values:
        if isinstance(v, float):
            if not v.is_integer():
                continue  # a size is an integer: a fractional solution names none
            v = int(v)
        if v not in out:
            out.append(v)
    return out


__all__ = ["MAX_COMPARED", "MAX_SCALES", "TooManyCompared", "compared_joints", "compared_scales", "compared_values"]

"""Kernel-body branches and host `min`/`max` indicators: the branches host_branches (sanitizer/branches.py) cannot see.

A cheat can test its magic size inside the kernel (`if HEAD_D == 192:` on a constexpr, `tl.where(n > 9000, ...)` on
a scalar argument) or pick it with no jump at all (`BLOCK = min(D, 128)` in host code). The bytecode tracer of
host_branches sees neither: Triton's interpreter runs a kernel from its rewritten syntax tree, and a `min` is a
call. So:

* the executor's `KernelRecorder` hooks the interpreter's rewriter (FunctionRewriter._transform_ast) for the
  candidate's file alone: each `if`, `while` and conditional expression of a kernel (or of a device function of
  the file) has its test wrapped in a call that records which way it went, each `tl.where` records its condition
  when that is a scalar (a block condition selects per lane: no branch), so does each comparison whose result is
  used as a value (`qk_scale * (1 + (HEAD_D == BLOCK_D - 64))`: a branch with no jump), and each function records
  that it ran;
* the same recorder binds `min` and `max` in the candidate's module to the builtins with a record of which
  argument was the result at each call site of host code (numbers only; a tie counts for each tied argument),
  and whether its arguments ever varied: a `min` of the same numbers on every call (`min(block_n, 64)` with a
  configuration's constant 128) indicates nothing of the inputs, and what would make it vary is judged where
  that is decided (a host branch, a compared size);
* the judge, which never imports the candidate, lists the same sites from the canonical text (kernel_sides,
  minmax_sides) and names each side never taken (kernel_taken decides which were).

A site is keyed by its line and its rank among the sites that start on that line (by column): the rewriter
dedents a nested kernel, which moves columns but not their order. A kernel that never ran is not judged (a host
branch, or the kernel branch that guards its launch, is); a `tl.where` or a comparison that only ever saw a block
is no branch.
"""

from __future__ import annotations

import ast
import builtins
import sys
import types
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .branches import Side, condition_exemption, device_locals, device_only, jit_names
from .canonical import parse_module

# (kind, line, rank or column, value): kind "if" / "where" (value true, false or block), "enter" (a kernel ran:
# line of its def, value its name), "minmax" (column of the call, value the index of the deciding argument)
Hit = Tuple[str, int, int, str]
RECORD_NAME = "__kernel_branch__"  # the candidate cannot name it: the static gate refuses dunder names
_KINDS = {"if", "where", "cmp", "enter", "minmax"}


def _is_where(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "where"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "tl"
        and len(node.args) == 3
    )


# calls whose comparisons hold by contract or select lanes, not a value: an assertion, a load's or store's mask
_NOT_A_VALUE_CALLS = {"static_assert", "device_assert", "assume"}
_NOT_A_VALUE_KEYWORDS = {"mask", "other"}


def _compares_as_values(fn: ast.AST) -> List[ast.Compare]:
    """The comparisons of a kernel whose result is used as a number or kept (`1 + (HEAD_D == BLOCK_D - 64)`,
    `F16: tl.constexpr = x.dtype != tl.float32`): a branch with no jump. Not those a site already tests (an `if`,
    `while` or conditional expression's test, a `tl.where` condition), nor a mask, an assertion or a nested one."""
    inside: Set[int] = set()
    for n in ast.walk(fn):
        if isinstance(n, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            inside |= {id(x) for x in ast.walk(n.test)}
        elif isinstance(n, ast.Call):
            if _is_where(n):
                inside |= {id(x) for x in ast.walk(n.args[0])}
            if _tl_call(n) in _NOT_A_VALUE_CALLS:
                inside |= {id(x) for x in ast.walk(n)}
            for k in n.keywords:
                if k.arg in _NOT_A_VALUE_KEYWORDS:
                    inside |= {id(x) for x in ast.walk(k.value)}
        elif isinstance(n, ast.Compare):
            inside |= {id(x) for x in ast.walk(n) if x is not n and isinstance(x, ast.Compare)}
    return [n for n in ast.walk(fn) if isinstance(n, ast.Compare) and id(n) not in inside]


def _sites(fn: ast.AST) -> List[Tuple[int, int, ast.AST]]:
    """(line, rank on its line, node) of every branch site of a kernel: `if`, `while`, conditional expression,
    `tl.where`, a comparison used as a value (ranked together, by column within a line)."""
    nodes: List[Any] = [n for n in ast.walk(fn) if isinstance(n, (ast.If, ast.While, ast.IfExp)) or _is_where(n)]
    nodes += _compares_as_values(fn)
    nodes.sort(key=lambda n: (n.lineno, n.col_offset))
    out: List[Tuple[int, int, ast.AST]] = []
    for n in nodes:
        rank = len([line for line, _, _ in out if line == n.lineno])
        out.append((n.lineno, rank, n))
    return out


# -- the executor's side ---------------------------------------------------------------------------------------


class _Instrument(ast.NodeTransformer):
    """Wraps each site's condition in a call of the recorder (the tree is the rewriter's, lines absolute)."""

    def __init__(self, sites: Dict[int, Tuple[int, int, str]]):
        self.sites = sites  # id(node) -> (line, rank, kind)

    def _record(self, kind: str, line: int, rank: int, value: ast.expr) -> ast.expr:
        call = ast.Call(
            func=ast.Name(id=RECORD_NAME, ctx=ast.Load()),
            args=[ast.Constant(kind), ast.Constant(line), ast.Constant(rank), value],
            keywords=[],
        )
        return ast.copy_location(call, value)

    def generic_visit(self, node: Any) -> Any:
        site = self.sites.get(id(node))
        super().generic_visit(node)
        if site is not None:
            line, rank, kind = site
            if kind == "where":
                node.args[0] = self._record("where", line, rank, node.args[0])
            elif kind == "cmp":
                return self._record("cmp", line, rank, node)  # the comparison's value, recorded on its way
            else:
                node.test = self._record("if", line, rank, node.test)
        return node


def _kind(node: ast.AST) -> str:
    """A site's kind in the hits: "where" (a `tl.where`), "cmp" (a comparison used as a value), else "if"."""
    return "where" if _is_where(node) else "cmp" if isinstance(node, ast.Compare) else "if"


def _scalar(value: Any) -> bool:
    """Whether a `tl.where` condition is one value for every lane (a Python or constexpr scalar, a 0-d tensor)."""
    if isinstance(value, (bool, int, float)):
        return True
    kind = getattr(value, "type", None)
    if kind is not None and callable(getattr(kind, "is_block", None)):
        return not kind.is_block()
    return not getattr(value, "shape", None)


class KernelRecorder:
    """Records the kernel-body branches and host min/max indicators of one file (the executor's side). Install it
    before the candidate is imported: `install_interpreter()` once, `prepare_module` on the module before it runs."""

    def __init__(self, filename: str):
        self.filename = filename
        self.hits: Set[Hit] = set()
        self._positions: Dict[types.CodeType, list] = {}
        self._first_args: Dict[Tuple[int, int], tuple] = {}  # each min/max site's first arguments

    def record(self, kind: str, line: int, rank: int, value: Any) -> Any:
        """What an instrumented condition calls: notes the way it went and returns the condition untouched."""
        if kind == "enter":
            self.hits.add(("enter", line, 0, str(value)))
            return value
        if kind in ("where", "cmp") and not _scalar(value):
            self.hits.add((kind, line, rank, "block"))
            return value
        try:
            truth = bool(value)
        except Exception:  # noqa: BLE001 - the kernel's own use of the value raises it again, as it would have
            return value
        self.hits.add((kind, line, rank, "true" if truth else "false"))
        return value

    def install_interpreter(self) -> None:
        """Instrument the kernels of this file as Triton's interpreter rewrites them (it caches a rewritten
        kernel: install before the first launch)."""
        import triton.runtime.interpreter as interp  # deferred: TRITON_INTERPRET must be set first

        rewriter = interp.FunctionRewriter
        original = rewriter._transform_ast
        recorder = self

        def transform(self_rw, src):
            tree = original(self_rw, src)
            if getattr(self_rw, "filename", "") == recorder.filename:
                recorder._instrument(tree, self_rw.fn)
            return tree

        rewriter._transform_ast = transform
        self._restore: Optional[Callable[[], None]] = lambda: setattr(rewriter, "_transform_ast", original)

    def uninstall_interpreter(self) -> None:
        """Undo install_interpreter (a process that judges several files in turn)."""
        restore = getattr(self, "_restore", None)
        if restore is not None:
            restore()
            self._restore = None

    def _instrument(self, tree: ast.Module, fn: Callable) -> None:
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        if not defs:
            return
        fn.__globals__[RECORD_NAME] = self.record
        fdef = defs[0]
        sites = {id(node): (line, rank, _kind(node)) for line, rank, node in _sites(fdef)}
        _Instrument(sites).visit(fdef)
        enter = ast.Expr(
            ast.Call(
                func=ast.Name(id=RECORD_NAME, ctx=ast.Load()),
                args=[ast.Constant("enter"), ast.Constant(fdef.lineno), ast.Constant(0), ast.Constant(fdef.name)],
                keywords=[],
            )
        )
        fdef.body.insert(0, ast.copy_location(enter, fdef.body[0]))
        ast.fix_missing_locations(tree)

    def prepare_module(self, module: types.ModuleType) -> None:
        """Bind `min` and `max` in the candidate's module to the builtins, recording at each call site of this
        file which argument decided the result."""
        module.__dict__["min"] = self._indicator(builtins.min)
        module.__dict__["max"] = self._indicator(builtins.max)

    def _indicator(self, builtin: Callable) -> Callable:
        recorder = self

        def decided(*args, **kwargs):
            result = builtin(*args, **kwargs)
            if len(args) >= 2 and not kwargs and all(type(a) in (int, float, bool) for a in args):
                recorder._note_decider(sys._getframe(1), args, result)
            return result

        decided.__name__ = builtin.__name__
        return decided

    def _note_decider(self, frame, args: Sequence, result) -> None:
        code = frame.f_code
        if code.co_filename != self.filename:
            return  # another file's call (the interpreter's, a kernel of another file)
        positions = self._positions.get(code)
        if positions is None:
            positions = self._positions[code] = list(code.co_positions())
        index = frame.f_lasti // 2
        if index >= len(positions) or positions[index][0] is None:
            return
        line, col = int(positions[index][0]), int(positions[index][2] or 0)
        first = self._first_args.setdefault((line, col), tuple(args))
        if first != tuple(args):
            self.hits.add(("minmax", line, col, "varied"))
        for i, a in enumerate(args):
            if a == result:  # a tie decides for each tied argument: the threshold was reached
                self.hits.add(("minmax", line, col, str(i)))

    def evidence(self) -> List[List]:
        return [list(h) for h in sorted(self.hits)]


# -- the judge's side ------------------------------------------------------------------------------------------


def _text(source: str, node: ast.AST) -> str:
    return " ".join((ast.get_source_segment(source, node) or ast.unparse(node)).split())[:160]


def kernel_sides(source: str) -> List[Side]:
    """Both sides of every branch site in the kernels (and device functions) of `source`: qualname
    `kernel:<function>`, firstlineno the site's line, jump its rank on the line, dest 1 for the true side."""
    tree = parse_module(source)
    jit = jit_names(tree)
    sides: List[Side] = []
    params = _device_params(tree)
    loaded = _loaded_names(tree, jit)
    for fdef in tree.body:
        if not (isinstance(fdef, ast.FunctionDef) and fdef.name in jit):
            continue
        local = {**device_locals(fdef), **params.get(fdef.name, {})}
        for line, rank, node in _sites(fdef):
            kind = _kind(node)
            test = node.args[0] if kind == "where" else node if kind == "cmp" else node.test  # type: ignore[attr-defined]
            text = _text(source, test)
            exempt = condition_exemption(text, local) or (LOADED if _reads_loaded(test, loaded[fdef.name]) else "")
            scalar = _SCALAR_SUFFIX.get(kind, "")
            for dest, value in ((1, "true"), (0, "false")):
                sides.append(
                    Side(f"kernel:{fdef.name}", line, rank, dest, bool(dest), line, text, value + scalar, exempt)
                )
    return sides


# how a site that selects lanes when its condition is a block is named; only its scalar evaluations are branches
_SCALAR_SUFFIX = {"where": " (as a scalar)", "cmp": " (as a value)"}
LOADED = "reads values the kernel loaded: the numeric checks draw those (their sizes are compared values)"
_LOADS = ("load", "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg", "atomic_and", "atomic_or")


def _reads_loaded(node: ast.AST, loaded: Set[str]) -> bool:
    """Whether an expression reads memory or a name computed from what the kernel loaded (its dtype or shape
    is no value: `q.dtype` of a loaded `q` is the dtype)."""
    if isinstance(node, ast.Attribute) and node.attr in ("dtype", "element_ty", "shape"):
        return False
    if isinstance(node, ast.Name) and node.id in loaded or isinstance(node, ast.Call) and _tl_call(node) in _LOADS:
        return True
    return any(_reads_loaded(child, loaded) for child in ast.iter_child_nodes(node))


def _tl_call(call: ast.Call) -> str:
    fn = call.func
    return fn.attr if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "tl" else ""


def _loaded_names(tree: ast.Module, jit: Set[str]) -> Dict[str, Set[str]]:
    """For each kernel and device function: the names bound to what it loaded from memory, or computed from it
    (a device function's parameter too, where a call passes such a value): data, whose conditions (`v_max > 0`,
    a zero scale) are the numeric checks' to draw, not sizes."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in jit}
    loaded: Dict[str, Set[str]] = {name: set() for name in functions}
    changed = True
    while changed:
        changed = False
        for fdef in functions.values():
            mine = loaded[fdef.name]
            for node in ast.walk(fdef):
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    if _reads_loaded(node.value, mine):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        new = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)} - mine
                        mine |= new
                        changed |= bool(new)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
                    callee = functions[node.func.id]
                    names = [a.arg for a in callee.args.posonlyargs + callee.args.args]
                    for name, arg in zip(names, node.args):
                        if _reads_loaded(arg, mine) and name not in loaded[callee.name]:
                            loaded[callee.name].add(name)
                            changed = True
    return loaded


def _device_params(tree: ast.Module) -> Dict[str, Dict[str, str]]:
    """The parameters of each function of the file that every call or launch of it passes a device-only read
    (`_codes_to(k, q.dtype)`, `DTYPE=q.dtype`, by the caller's own device-only locals) -> what they read: a
    kernel's branch on its dtype parameter is one on the dtype."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    passed: Dict[str, Dict[str, List[str]]] = {}
    for caller in functions.values():
        local = device_locals(caller)
        for call in (n for n in ast.walk(caller) if isinstance(n, ast.Call)):
            fn = call.func.value if isinstance(call.func, ast.Subscript) else call.func
            callee = functions.get(fn.id) if isinstance(fn, ast.Name) else None
            if callee is None:
                continue
            names = [a.arg for a in callee.args.posonlyargs + callee.args.args]
            bound = list(zip(names, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
            into = passed.setdefault(callee.name, {})
            for name, arg in bound:
                into.setdefault(name, []).append(ast.unparse(arg) if device_only(arg, local) else "")
    return {fn: {name: " ".join(texts) for name, texts in args.items() if all(texts)} for fn, args in passed.items()}


def _constant(node: ast.AST, constants: Mapping[str, ast.AST]) -> bool:
    """A number written in the code: a literal, a negated one, a module constant bound to one."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Name) and node.id in constants:
        return _constant(constants[node.id], {})
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _is_minmax(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("min", "max")
        and len(node.args) >= 2
        and not node.keywords
        and not any(isinstance(a, ast.Starred) for a in node.args)
    )


def minmax_sides(source: str, host: Iterable[ast.AST], constants: Mapping[str, ast.AST]) -> List[Side]:
    """The sides of every `min`/`max` of two or more numbers in the host functions `host` that clamps at a
    constant (`min(D, 128)`): each constant argument was the result on some call (alone or tied: the threshold
    was reached), and so was a computed one (one side for them all, dest -1 - the mask of their indices).
    qualname `minmax`, firstlineno the call's line, jump its column. A `min` of computed values alone selects no
    threshold of the code's. Exempt: a constant of a `max` of at most 1 (a guard against an empty size, as a
    side that only raises is) or that the other arguments provably never go below."""
    sides: List[Side] = []
    host = list(host)
    bounds = _LowerBounds(host)
    for fdef in host:
        local = device_locals(fdef)
        calls: List[Any] = [n for n in ast.walk(fdef) if _is_minmax(n)]
        for node in calls:
            args = node.args
            fixed = [i for i, a in enumerate(args) if _constant(a, constants)]
            computed = [i for i in range(len(args)) if i not in fixed]
            if not fixed or not computed:
                continue
            text = _text(source, node)
            exempt = condition_exemption(text, local) or (_TILE_FLOOR if _tile_floor(node, fixed, constants) else "")
            mask = sum(1 << i for i in computed)
            what = ", ".join(f"`{_text(source, args[i])}`" for i in computed)
            entries = [(i, f"decided by `{_text(source, args[i])}`") for i in fixed] + [
                (-1 - mask, f"decided by {what}")
            ]
            for dest, value in entries:
                why = exempt or (
                    _GUARD if dest >= 0 and node.func.id == "max" and bounds.guard(fdef, args, dest) else ""
                )
                sides.append(Side("minmax", node.lineno, node.col_offset, dest, False, node.lineno, text, value, why))
    return sides


_TILE_FLOOR = "a tile floor, `max(16, triton.next_power_of_2(n))`: a tile width, no threshold of the result"


def _tile_floor(node: Any, fixed: List[int], constants: Mapping[str, ast.AST]) -> bool:
    """`max(k, triton.next_power_of_2(x))` with k a power of two: the tile is the next power of two of
    max(k, x), which only widens the tile (the kernel masks past the size, and its own branches on the tile
    width are judged in its body)."""
    if node.func.id != "max" or len(node.args) != 2 or len(fixed) != 1:
        return False
    k, other = node.args[fixed[0]], node.args[1 - fixed[0]]
    value = k.value if isinstance(k, ast.Constant) else None
    return (
        isinstance(value, int)
        and value > 0
        and value & (value - 1) == 0
        and isinstance(other, ast.Call)
        and isinstance(other.func, ast.Attribute)
        and other.func.attr == "next_power_of_2"
        and isinstance(other.func.value, ast.Name)
        and other.func.value.id == "triton"
    )


_GUARD = "a constant of a `max` of at most 1 or that the other arguments never go below: a guard, no threshold"


class _LowerBounds:
    """Lower bounds of host integer expressions, where the code proves one: constants, the SM count (at least
    1), `triton.cdiv` and `triton.next_power_of_2` of a positive value (at least 1), sums and products of
    non-negative bounds, `min`/`max`, locals (over every assignment) and the file's functions (over every
    return). Anything else has none."""

    def __init__(self, functions: Sequence[ast.AST]):
        self.functions = {f.name: f for f in functions if isinstance(f, ast.FunctionDef)}
        self.active: Set[str] = set()

    def guard(self, fdef: ast.AST, args: Sequence[ast.expr], i: int) -> bool:
        arg = args[i]
        const = arg.value if isinstance(arg, ast.Constant) else None
        if not isinstance(const, (int, float)) or isinstance(const, bool):
            return False
        if const <= 1:
            return True  # `max(1, n)`: a guard against an empty or zero size
        others = [self.lower(fdef, a) for j, a in enumerate(args) if j != i]
        return any(b is not None and b >= const for b in others)

    def lower(self, fdef: ast.AST, node: ast.AST) -> Optional[float]:
        key = f"{getattr(fdef, 'name', '')}:{ast.dump(node)}"
        if key in self.active or len(self.active) > 32:
            return None  # a value defined through itself
        self.active.add(key)
        try:
            return self._lower(fdef, node)
        finally:
            self.active.discard(key)

    def _lower(self, fdef: ast.AST, node: ast.AST) -> Optional[float]:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Attribute) and node.attr == "multi_processor_count":
            return 1.0
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            a, b = self.lower(fdef, node.left), self.lower(fdef, node.right)
            if a is None or b is None or a < 0 or b < 0:
                return None
            return a + b if isinstance(node.op, ast.Add) else a * b
        if isinstance(node, ast.Name):
            return self._name(fdef, node.id)
        if isinstance(node, ast.Call):
            return self._call(fdef, node)
        return None

    def _call(self, fdef: ast.AST, node: ast.Call) -> Optional[float]:
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        bounds = [self.lower(fdef, a) for a in node.args]
        if name in ("cdiv", "next_power_of_2") and bounds and bounds[0] is not None and bounds[0] >= 1:
            return 1.0
        if name == "max" and any(b is not None for b in bounds):
            return max(b for b in bounds if b is not None)
        if name == "min" and bounds and all(b is not None for b in bounds):
            return min(b for b in bounds if b is not None)
        if isinstance(fn, ast.Name) and fn.id in self.functions:
            callee = self.functions[fn.id]
            returns = [r.value for r in ast.walk(callee) if isinstance(r, ast.Return) and r.value is not None]
            found = [self.lower(callee, r) for r in returns]
            return min(found) if found and all(b is not None for b in found) else None  # type: ignore[type-var]
        return None

    def _name(self, fdef: ast.AST, name: str) -> Optional[float]:
        values = [
            n.value
            for n in ast.walk(fdef)
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        ]
        rebound = any(
            isinstance(n, (ast.AugAssign, ast.For, ast.AnnAssign))
            and isinstance(n.target, ast.Name)
            and n.target.id == name
            for n in ast.walk(fdef)
        )
        if not values or rebound:
            return None
        found = [self.lower(fdef, v) for v in values]
        known = [b for b in found if b is not None]
        return min(known) if known and len(known) == len(found) else None


def host_functions(tree: ast.Module) -> List[ast.AST]:
    """The module-level functions that are not kernels (with what they nest)."""
    jit = jit_names(tree)
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name not in jit]


def indicator_sides(source: str) -> List[Side]:
    """kernel_sides and minmax_sides of the canonical text the executor runs."""
    tree = parse_module(source)
    constants = {
        n.targets[0].id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
    }
    return kernel_sides(source) + minmax_sides(source, host_functions(tree), constants)


def kernel_taken(hits: Iterable[Sequence], sides: List[Side]) -> Set[Tuple[str, int, int, int]]:
    """The keys of `sides` that the recorded hits took, and of every site that is no branch: a kernel that
    never ran (its launch is judged where it is decided), a `tl.where` that only ever saw a block condition."""
    seen: Set[Hit] = set()
    for h in hits:
        try:
            kind, line, rank, value = str(h[0]), int(h[1]), int(h[2]), str(h[3])
        except (TypeError, ValueError, IndexError):
            continue
        if kind in _KINDS:
            seen.add((kind, line, rank, value))
    ran = {value for kind, _, _, value in seen if kind == "enter"}
    scalar = {(kind, line, rank) for kind, line, rank, value in seen if kind in ("where", "cmp") and value != "block"}
    out: Set[Tuple[str, int, int, int]] = set()
    reached = {(line, col) for kind, line, col, _ in seen if kind == "minmax"}
    varied = {(line, col) for kind, line, col, value in seen if kind == "minmax" and value == "varied"}
    for s in sides:
        if s.qualname == "minmax":
            site = (s.firstlineno, s.jump)
            indices = [str(s.dest)] if s.dest >= 0 else [str(i) for i in range(64) if (-1 - s.dest) >> i & 1]
            if (
                any(("minmax", s.firstlineno, s.jump, i) in seen for i in indices)
                or site in reached
                and site not in varied
            ):
                out.add(s.key())  # taken, or the same numbers on every call: no indicator of the inputs
            continue
        if not s.qualname.startswith("kernel:"):
            continue  # a host jump: branches.taken decides it
        fn = s.qualname.split(":", 1)[1]
        value = "true" if s.dest else "false"
        kind = next((k for k, suffix in _SCALAR_SUFFIX.items() if s.value.endswith(suffix)), "if")
        if fn not in ran or kind != "if" and (kind, s.firstlineno, s.jump) not in scalar:
            out.add(s.key())  # never ran, or a `tl.where` or comparison that only ever saw a block: no branch
        elif (kind, s.firstlineno, s.jump, value) in seen:
            out.add(s.key())
    return out


__all__ = ["KernelRecorder", "indicator_sides", "kernel_sides", "kernel_taken", "minmax_sides", "RECORD_NAME"]

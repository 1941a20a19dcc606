"""The rewrite catalog: named source-to-source transformations of Triton kernel files.

Each rewrite works on the module's syntax tree: it finds the nodes its precondition names, builds
their replacements as new nodes, and changes the tree. The text is then rendered by replacing only
the source spans of the replaced nodes with their unparsed form (the rest of the file, comments
included, stays byte for byte), and the result is parsed again and compared with the changed tree:
a rendering that does not reproduce the tree is a bug, raised, never a candidate. A rewrite whose
precondition does not hold raises `NotApplicable` with one line saying which.

Every rewrite keeps the op's contract on any input: hints (eviction, cache level, contiguity) change
how data moves, not what is computed, and exp -> exp2 folds the constant log2(e) into the argument
(the FpSan algebra defines exp(x) as exp2(x * log2e), so the two are the same symbolic function).
The candidate is judged by the sanitizer like any other. docs/REWRITES.md lists the catalog for readers.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeGuard, cast

from ..harness.ops import get_op
from ..sanitizer.canonical import holding_ast_lock

LOG2E = 1.4426950408889634  # float32 log2(e) is the FpSan payload constant exp is defined by


class NotApplicable(ValueError):
    """The rewrite's precondition does not hold for this source (one line: which)."""


@dataclass(frozen=True)
class RewriteTarget:
    """What a rewrite may know about the op besides the text: whether it reads its inputs once
    (Op.streaming) and the names its kernels give the tiles of those inputs."""

    streaming: bool = False
    streamed_names: Tuple[str, ...] = ("k", "v", "x")


def target_for(op_name: str) -> RewriteTarget:
    """The target of an op in the registry; a kernel for another op passes its own RewriteTarget."""
    return RewriteTarget(streaming=bool(get_op(op_name).streaming))


Edit = Tuple[Any, ast.AST]  # (node of the parsed tree, with its position; its replacement)


@dataclass(frozen=True)
class Rewrite:
    name: str
    summary: str  # what it does, one line
    helps: Tuple[str, ...]  # the bounds it addresses: "memory", "compute", "latency"
    precondition: str  # when it applies, in words (the code says it exactly)
    collect: Callable[[ast.Module, RewriteTarget], List[Edit]]

    @holding_ast_lock
    def apply(self, source: str, target: RewriteTarget = RewriteTarget()) -> str:
        try:
            tree = ast.parse(source)
        except SyntaxError as e:
            raise NotApplicable(f"{self.name}: the source does not parse ({e.msg}, line {e.lineno})") from None
        edits = self.collect(tree, target)
        if not edits:
            raise NotApplicable(f"{self.name}: {self.precondition}: nothing in this source matches")
        return render(source, tree, edits)


# -- rendering ----------------------------------------------------------------------------------


def _offsets(data: bytes) -> List[int]:
    """Byte offset of the start of each line (1-based lines: index 0 unused); bytes split lines where
    Python's tokenizer does (\n, \r\n, \r), unlike str.splitlines."""
    starts, pos = [0, 0], 0
    for line in data.splitlines(keepends=True):
        pos += len(line)
        starts.append(pos)
    return starts


def _replace_in_tree(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for fname, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, fname, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise RuntimeError("rewrite: the node to replace is not in the tree")


def render(source: str, tree: ast.Module, edits: Sequence[Edit]) -> str:
    """The source with each edited node's span replaced by its new node's text; the tree is changed
    to match, and the text must parse back to exactly that tree. Columns are UTF-8 byte offsets."""
    data = source.encode()
    starts = _offsets(data)
    spans = sorted(
        (
            (starts[old.lineno] + old.col_offset, starts[old.end_lineno] + old.end_col_offset, old, new)
            for old, new in edits
        ),
        key=lambda s: s[0],
    )
    for (_, end, _, _), (start, _, _, _) in zip(spans, spans[1:]):
        if start < end:
            raise RuntimeError("rewrite: overlapping edits")
    out = data
    for start, end, old, new in reversed(spans):
        out = out[:start] + ast.unparse(new).encode() + out[end:]
        _replace_in_tree(tree, old, new)
    text = out.decode()
    if ast.dump(ast.parse(text)) != ast.dump(tree):
        raise RuntimeError("rewrite: the rendered text does not parse to the rewritten tree")
    return text


# -- helpers on the tree ----------------------------------------------------------------------


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _jit_functions(tree: ast.Module) -> List[ast.FunctionDef]:
    return [
        f
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and any(_dotted(d.func if isinstance(d, ast.Call) else d) in ("triton.jit", "jit") for d in f.decorator_list)
    ]


def _constexpr_params(fn: ast.FunctionDef) -> set:
    return {a.arg for a in fn.args.args if a.annotation is not None and _dotted(a.annotation) == "tl.constexpr"}


def _unwrap_to(call: ast.AST) -> ast.AST:
    """`tl.load(...).to(...)...` -> the tl.load call."""
    while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "to":
        call = call.func.value
    return call


def _is_load(node: ast.AST) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and _dotted(node.func) == "tl.load"


def _with_keyword(call: ast.Call, name: str, value: str) -> ast.Call:
    new = copy.deepcopy(call)
    new.keywords.append(ast.keyword(arg=name, value=ast.Constant(value)))
    return new


def _named_loads(tree: ast.Module, names: Sequence[str], free_of: str) -> List[ast.Call]:
    """tl.load calls (possibly followed by .to(...)) assigned to one of `names` inside a jit kernel,
    without a `free_of` keyword yet."""
    out = []
    for fn in _jit_functions(tree):
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in names
            ):
                call = _unwrap_to(node.value)
                if _is_load(call) and not any(k.arg == free_of for k in call.keywords):
                    out.append(call)
    return out


# -- the rewrites -------------------------------------------------------------------------------


def _evict_first(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    if not target.streaming:
        raise NotApplicable("evict-first: the op does not stream its inputs (its tiles are read again)")
    return [
        (c, _with_keyword(c, "eviction_policy", "evict_first"))
        for c in _named_loads(tree, target.streamed_names, "eviction_policy")
    ]


def _cache_global(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    if not target.streaming:
        raise NotApplicable("cache-global: the op does not stream its inputs (its tiles are read again)")
    return [
        (c, _with_keyword(c, "cache_modifier", ".cg"))
        for c in _named_loads(tree, target.streamed_names, "cache_modifier")
    ]


def _dot_operands(fn: ast.FunctionDef) -> set:
    """Names passed (directly or through .to(...)) as the first two arguments of tl.dot in `fn`."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and _dotted(node.func) == "tl.dot":
            for arg in node.args[:2]:
                operand = _unwrap_to(arg)
                if isinstance(operand, ast.Name):
                    names.add(operand.id)
    return names


def _evict_last(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    if target.streaming:  # data read once gains nothing from staying in L2
        raise NotApplicable("evict-last: the op streams its inputs: nothing it reads is read again")
    edits: List[Edit] = []
    for fn in _jit_functions(tree):
        operands = _dot_operands(fn)
        for loop in (n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.While))):
            for node in ast.walk(loop):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in operands
                ):
                    call = _unwrap_to(node.value)
                    if (
                        _is_load(call)
                        and not any(k.arg == "eviction_policy" for k in call.keywords)
                        and all(call is not old for old, _ in edits)
                    ):
                        edits.append((call, _with_keyword(call, "eviction_policy", "evict_last")))
    return edits


def _block_offsets(node: ast.AST, constexprs: set) -> Optional[str]:
    """The constexpr C when `node` is `X * C + tl.arange(0, C)` (either order of either operation)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return None
    for base, rng in ((node.left, node.right), (node.right, node.left)):
        if not (
            isinstance(rng, ast.Call)
            and _dotted(rng.func) == "tl.arange"
            and len(rng.args) == 2
            and isinstance(rng.args[0], ast.Constant)
            and rng.args[0].value == 0
            and isinstance(rng.args[1], ast.Name)
            and rng.args[1].id in constexprs
        ):
            continue
        c = rng.args[1].id
        if (
            isinstance(base, ast.BinOp)
            and isinstance(base.op, ast.Mult)
            and any(isinstance(s, ast.Name) and s.id == c for s in (base.left, base.right))
        ):
            return c
    return None


def _load_hints(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    edits: List[Edit] = []
    for fn in _jit_functions(tree):
        constexprs = _constexpr_params(fn)
        hinted = {
            id(n.args[0])
            for n in ast.walk(fn)
            if isinstance(n, ast.Call) and _dotted(n.func) in ("tl.multiple_of", "tl.max_contiguous") and n.args
        }
        for node in ast.walk(fn):
            c = _block_offsets(node, constexprs)
            if c and id(node) not in hinted:
                inner = ast.Call(
                    ast.Attribute(ast.Name("tl", ast.Load()), "multiple_of", ast.Load()),
                    [cast(ast.expr, copy.deepcopy(node)), ast.Name(c, ast.Load())],
                    [],
                )
                outer = ast.Call(
                    ast.Attribute(ast.Name("tl", ast.Load()), "max_contiguous", ast.Load()),
                    [inner, ast.Name(c, ast.Load())],
                    [],
                )
                edits.append((node, outer))
    return edits


def _exp2(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    edits: List[Edit] = []
    for fn in _jit_functions(tree):
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Call)
                and _dotted(node.func) in ("tl.exp", "tl.math.exp")
                and len(node.args) == 1
                and not node.keywords
            ):
                scaled = ast.BinOp(copy.deepcopy(node.args[0]), ast.Mult(), ast.Constant(LOG2E))
                edits.append(
                    (node, ast.Call(ast.Attribute(ast.Name("tl", ast.Load()), "exp2", ast.Load()), [scaled], []))
                )
    # an exp nested inside another exp's argument: rewrite the outer one only, the next pass takes the inner
    return [e for e in edits if not any(o is not e[0] and e[0] in ast.walk(o) for o, _ in edits)]


CATALOG: Dict[str, Rewrite] = {
    r.name: r
    for r in (
        Rewrite(
            "evict-first",
            "eviction_policy='evict_first' on the loads of the streamed operands",
            ("memory",),
            "the op streams its inputs (read once per call) and a kernel assigns a tl.load of a "
            "streamed operand (k, v, x) without an eviction policy",
            _evict_first,
        ),
        Rewrite(
            "cache-global",
            "cache_modifier='.cg' (cache in L2 only, bypass L1) on the loads of the streamed operands",
            ("memory",),
            "the op streams its inputs and a kernel assigns a tl.load of a streamed operand without a cache modifier",
            _cache_global,
        ),
        Rewrite(
            "evict-last",
            "eviction_policy='evict_last' on the loads that feed tl.dot inside a loop, so tiles "
            "other programs read again stay in L2",
            ("memory", "compute"),
            "the op does not stream its inputs "
            "and a loop in a kernel loads a tl.dot operand without an eviction policy",
            _evict_last,
        ),
        Rewrite(
            "load-hints",
            "tl.max_contiguous(tl.multiple_of(offs, C), C) around block offsets "
            "`X * C + tl.arange(0, C)`, so loads and stores through them vectorise",
            ("memory", "latency"),
            "a kernel builds offsets as X * C + tl.arange(0, C) with C a constexpr parameter, not hinted yet",
            _load_hints,
        ),
        Rewrite(
            "exp2",
            "tl.exp(x) -> tl.exp2(x * log2(e)): one MUFU.EX2 instead of a multiply and the ex2 "
            "sequence exp lowers to, with the constant where a scale can absorb it",
            ("compute", "latency"),
            "a kernel calls tl.exp (or tl.math.exp) with one argument",
            _exp2,
        ),
    )
}


def apply_rewrite(name: str, source: str, target: RewriteTarget = RewriteTarget()) -> str:
    """`source` rewritten by the catalog's `name`; NotApplicable (one line) when its precondition fails or
    the name is not in the catalog."""
    rewrite = CATALOG.get(name)
    if rewrite is None:
        raise NotApplicable(f"no rewrite named {name!r} in the catalog ({', '.join(CATALOG)})")
    return rewrite.apply(source, target)


def applicable(source: str, target: RewriteTarget) -> List[str]:
    """The names of the rewrites whose precondition holds for `source`."""
    out = []
    for name, rewrite in CATALOG.items():
        try:
            rewrite.apply(source, target)
        except NotApplicable:
            continue
        out.append(name)
    return out


def catalog_text() -> str:
    """The catalog as prompt lines: name, what it does, when it applies."""
    return "\n".join(f"- `{r.name}`: {r.summary}. Applies when {r.precondition}." for r in CATALOG.values())

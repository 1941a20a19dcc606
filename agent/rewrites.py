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

from ..harness.bench.diagnosis import SM_COUNT
from ..ops import get_op
from ..sanitizer.canonical import parse_module

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
    # a structural move: whether the bucket's shapes are where it pays (the search tries it first there)
    suits: Optional[Callable[[Sequence[Any]], bool]] = None
    edits_config: bool = False  # it changes the host `_config` policy, so it replaces a tuned configuration

    def apply(self, source: str, target: RewriteTarget = RewriteTarget()) -> str:
        try:
            tree = parse_module(source)
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


def _unparse_in_place(node: ast.AST) -> str:
    """A node's text for its span: a function's span starts at `def`, after its decorators, which stay."""
    if isinstance(node, ast.FunctionDef) and node.decorator_list:
        node = copy.copy(node)
        node.decorator_list = []
    return ast.unparse(node)


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
        out = out[:start] + _unparse_in_place(new).encode() + out[end:]
        _replace_in_tree(tree, old, new)
    text = out.decode()
    if ast.dump(parse_module(text)) != ast.dump(tree):
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


# -- structural moves: the plan of a kernel, not a hint ---------------------------------------------

# The combine of split-KV partials read as [16, BLOCK_D] tiles of splits: a fold of up to hundreds of splits
# in NUM_SPLITS / 16 steps instead of one split a step (two passes: the largest running max, then the
# weighted sums). Rows past NUM_SPLITS load m = -inf (weight 0), l = 0 and acc = 0. Split 0 always holds a
# token (seq_lens >= 1), so the largest max is finite and an empty split's weight is exactly 0.
_TILED_COMBINE = """
def _combine(m_ptr, l_ptr, acc_ptr, o_ptr, stride_mb, stride_mh, stride_ms, stride_ab, stride_ah, stride_as,
             stride_ad, stride_ob, stride_oh, stride_od, NUM_SPLITS, HEAD_D, BLOCK_D, EVEN_D):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_D
    offs_s = tl.arange(0, 16)
    base_m = m_ptr + b * stride_mb + h * stride_mh
    base_l = l_ptr + b * stride_mb + h * stride_mh
    base_a = acc_ptr + b * stride_ab + h * stride_ah
    m_run = tl.full([16], float('-inf'), dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, 16):
        s_live = s0 + offs_s < NUM_SPLITS
        m_run = tl.maximum(m_run, tl.load(base_m + (s0 + offs_s) * stride_ms, mask=s_live, other=float('-inf')))
    m_max = tl.max(m_run, 0)
    l_run = tl.zeros([16], dtype=tl.float32)
    o_run = tl.zeros([16, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, 16):
        s_live = s0 + offs_s < NUM_SPLITS
        w = tl.exp2(tl.load(base_m + (s0 + offs_s) * stride_ms, mask=s_live, other=float('-inf')) - m_max)
        l_run += w * tl.load(base_l + (s0 + offs_s) * stride_ms, mask=s_live, other=0.0)
        if EVEN_D:
            a_mask = s_live[:, None]
        else:
            a_mask = s_live[:, None] & d_mask[None, :]
        o_run += w[:, None] * tl.load(base_a + (s0 + offs_s)[:, None] * stride_as + offs_d[None, :] * stride_ad,
                                      mask=a_mask, other=0.0)
    o = tl.sum(o_run, 0) / tl.sum(l_run, 0)
    if EVEN_D:
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, o.to(o_ptr.dtype.element_ty))
    else:
        tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, o.to(o_ptr.dtype.element_ty),
                 mask=d_mask)
"""
_COMBINE_PARAMS = {a.arg for a in cast(ast.FunctionDef, parse_module(_TILED_COMBINE).body[0]).args.args}
SPLITS_PER_PROGRAM_TARGET = 2  # programs per SM the decode baselines' split policy aims at (at least)
SPLIT_CAP = 16  # the split count the decode baselines cap at


def _host_config(tree: ast.Module) -> Optional[ast.FunctionDef]:
    """The module's host `_config` as a kernel file writes it (a search-written override wraps the original
    under another name and is not this)."""
    found = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "_config"]
    jit = _jit_functions(tree)
    return found[0] if found and not any(found[0] is f for f in jit) else None


def _split_cap(tree: ast.Module) -> List[Edit]:
    """`splits = ... min(..., triton.cdiv(<context>, <tokens>), <constant>) ...` in `_config`: that min
    without its constant cap (the per-split token floor and the occupancy target remain)."""
    fn = _host_config(tree)
    for node in ast.walk(fn) if fn else ():
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.lower() in ("splits", "num_splits")
        ):
            continue
        for call in ast.walk(node.value):
            if not (isinstance(call, ast.Call) and _dotted(call.func) == "min" and len(call.args) >= 3):
                continue
            caps = [a for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, int)]
            floors = [a for a in call.args if isinstance(a, ast.Call) and _dotted(a.func) == "triton.cdiv"]
            if caps and floors:
                new = copy.deepcopy(call)
                new.args = [copy.deepcopy(a) for a in call.args if not any(a is c for c in caps)]
                return [(call, new)]
    return []


def _serial_combines(tree: ast.Module) -> List[Edit]:
    """Each jit kernel with the combine's parameters that folds NUM_SPLITS partials one split a step
    (`for s in range(..., NUM_SPLITS)`), with the tiled combine's body in place of its own."""
    edits: List[Edit] = []
    body = cast(ast.FunctionDef, parse_module(_TILED_COMBINE).body[0]).body
    for fn in _jit_functions(tree):
        params = {a.arg for a in fn.args.args}
        serial = any(
            isinstance(n, ast.For)
            and isinstance(n.iter, ast.Call)
            and _dotted(n.iter.func) == "range"
            and len(n.iter.args) <= 2
            and isinstance(n.iter.args[-1], ast.Name)
            and n.iter.args[-1].id == "NUM_SPLITS"
            for n in ast.walk(fn)
        )
        if serial and _COMBINE_PARAMS <= params:
            new = copy.deepcopy(fn)
            new.body = copy.deepcopy(body)
            edits.append((fn, new))
    return edits


def _kv_splits_wide(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    cap, combines = _split_cap(tree), _serial_combines(tree)
    if cap and not combines:
        raise NotApplicable("kv-splits-wide: no jit combine kernel folds the NUM_SPLITS partials a split a step")
    if combines and not cap:
        raise NotApplicable("kv-splits-wide: `_config` caps no split count at a constant beside triton.cdiv")
    return cap + combines


def _capped_splits_idle(shapes: Sequence[Any]) -> bool:
    """A decode bucket where the cap binds: B * Hkv programs a split, times the capped splits, fall short of
    the occupancy target, and the context holds more than that many splits of 256 tokens."""
    return any(
        s.B * s.Hkv * SPLIT_CAP < SPLITS_PER_PROGRAM_TARGET * SM_COUNT and s.ctx > SPLIT_CAP * 256 for s in shapes
    )


SPLIT_K_WAVES = 4  # the split-K target, in SM counts: four programs per SM, each a slice of K


def _split_k_waves(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    """In `_config`, each `if` that sets a `split_k`: the SM count it compares and divides by, times
    SPLIT_K_WAVES (not where it is scaled already)."""
    fn = _host_config(tree)
    edits: List[Edit] = []
    for node in ast.walk(fn) if fn else ():
        if not (
            isinstance(node, ast.If)
            and any(
                isinstance(t, ast.Name) and t.id == "split_k"
                for s in node.body
                if isinstance(s, ast.Assign)
                for t in s.targets
            )
        ):
            continue
        scaled = {
            id(b.right)
            for b in ast.walk(node)
            if isinstance(b, ast.BinOp)
            and isinstance(b.op, ast.Mult)
            and isinstance(b.left, ast.Constant)
            and b.left.value == SPLIT_K_WAVES
        }
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and _dotted(call.func) == "_num_sms" and id(call) not in scaled:
                edits.append((call, ast.BinOp(ast.Constant(SPLIT_K_WAVES), ast.Mult(), copy.deepcopy(call))))
    return edits


def _decode_sized(shapes: Sequence[Any]) -> bool:
    """A matmul bucket of decode-sized M (at most 64 rows) over a long K: few output tiles, much to reduce."""
    return bool(shapes) and all(s.M <= 64 and s.K >= 1024 for s in shapes)


def _parse_expr(text: str) -> ast.expr:
    return cast(ast.Expr, parse_module(text).body[0]).value


def _parse_stmt(text: str) -> ast.stmt:
    return parse_module(text).body[0]


def _planes_kernels(tree: ast.Module) -> List[ast.FunctionDef]:
    """Jit kernels of byte planes whose word tile is exactly D / 4 wide: `W: tl.constexpr = HEAD_D // 4` and
    `offs_w = tl.arange(0, W)`, without a BLOCK_W parameter yet."""
    out = []
    for fn in _jit_functions(tree):
        params = {a.arg for a in fn.args.args}
        texts = {ast.unparse(st) for st in fn.body}
        if (
            "HEAD_D" in params
            and "BLOCK_W" not in params
            and "W: tl.constexpr = HEAD_D // 4" in texts
            and "offs_w = tl.arange(0, W)" in texts
        ):
            out.append(fn)
    return out


def _insert_after(body: List[ast.stmt], assigned: str, stmt: ast.stmt) -> bool:
    for i, st in enumerate(body):
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == assigned for t in st.targets):
            body.insert(i + 1, stmt)
            return True
    return False


def _padded_planes_kernel(fn: ast.FunctionDef) -> ast.FunctionDef:
    """The planes kernel over a BLOCK_W-word tile (a power of two) of which the first W words are the head's:
    the other words load as zero codes (0.0 in every plane), add nothing to q.k and are never stored. Where W
    fills the tile (EVEN_W) no word mask is emitted, so a power-of-two D compiles to the kernel it was."""
    new = copy.deepcopy(fn)
    constexpr = _parse_expr("tl.constexpr")
    new.args.args += [ast.arg("BLOCK_W", copy.deepcopy(constexpr)), ast.arg("EVEN_W", copy.deepcopy(constexpr))]
    masks = {
        "kw": ("live[None, :]", "k_mask"),
        "vw": ("live[:, None]", "v_mask"),
    }
    for node in ast.walk(new):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in masks:
            old, name = masks[node.targets[0].id]
            load = _unwrap_to(node.value)
            for k in load.keywords if _is_load(load) else []:
                if k.arg == "mask" and ast.unparse(k.value) == old:
                    k.value = ast.Name(name, ast.Load())
        if isinstance(node, ast.keyword) and node.arg == "mask" and ast.unparse(node.value) == "h_mask[:, None]":
            node.value = ast.Name("hw_mask", ast.Load())
        if isinstance(node, ast.Call) and ast.unparse(node) == "tl.arange(0, W)":
            node.args[1] = ast.Name("BLOCK_W", ast.Load())
        if isinstance(node, ast.List) and ast.unparse(node) == "[BLOCK_H, W]":
            node.elts[1] = ast.Name("BLOCK_W", ast.Load())
    hw = _parse_stmt(
        "if EVEN_W:\n    hw_mask = h_mask[:, None]\nelse:\n    hw_mask = h_mask[:, None] & (offs_w < W)[None, :]"
    )
    kv = _parse_stmt(
        "if EVEN_W:\n    k_mask = live[None, :]\n    v_mask = live[:, None]\n"
        "else:\n    k_mask = live[None, :] & (offs_w < W)[:, None]\n    v_mask = live[:, None] & (offs_w < W)[None, :]"
    )
    loops = [n for n in new.body if isinstance(n, ast.For)]
    if not (_insert_after(new.body, "h_mask", hw) and loops and _insert_after(loops[0].body, "live", kv)):
        raise NotApplicable("planes-padded: the planes kernel defines no h_mask, or no loop defines live")
    return new


def _planes_choice(fn: ast.FunctionDef, head_d: str) -> List[Edit]:
    """In the wrapper `fn`, the two comparisons that keep the planes kernel to a power-of-two D >= 128 (`D ==
    <tile>`, `D >= 128`), as `D % 4 == 0` (whole int32 words) and `D > 64` (a tile of D = 128's width or wider)."""
    edits: List[Edit] = []
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and ast.unparse(node.left) == head_d):
            continue
        right = node.comparators[0]
        if isinstance(node.ops[0], ast.Eq) and isinstance(right, ast.Name):
            edits.append((node, _parse_expr(f"{head_d} % 4 == 0")))
        elif isinstance(node.ops[0], ast.GtE) and isinstance(right, ast.Constant) and right.value == 128:
            edits.append((node, _parse_expr(f"{head_d} > 64")))
    return edits


def _planes_padded(tree: ast.Module, target: RewriteTarget) -> List[Edit]:
    kernels = _planes_kernels(tree)
    names = {k.name for k in kernels}
    edits: List[Edit] = [(k, _padded_planes_kernel(k)) for k in kernels]
    for fn in (f for f in tree.body if isinstance(f, ast.FunctionDef) and f not in kernels):
        for call in ast.walk(fn):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Subscript)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in names
            ):
                continue
            head_d = next((ast.unparse(k.value) for k in call.keywords if k.arg == "HEAD_D"), None)
            choice = _planes_choice(fn, head_d) if head_d else []
            if len(choice) != 2:
                raise NotApplicable(
                    "planes-padded: the wrapper does not keep the planes kernel to `D == <tile>` and `D >= 128`"
                )
            launch = copy.deepcopy(call)
            tile = f"triton.next_power_of_2({head_d})"
            launch.keywords += [
                ast.keyword("BLOCK_W", _parse_expr(f"{tile} // 4")),
                ast.keyword("EVEN_W", _parse_expr(f"{tile} == {head_d}")),
            ]
            edits += [(call, launch)] + choice
    if kernels and len(edits) == len(kernels):
        raise NotApplicable("planes-padded: no wrapper launches the planes kernel with HEAD_D")
    return edits


def _padded_head_dim(shapes: Sequence[Any]) -> bool:
    """A bucket whose head dim is whole int32 words, past 64 and not a power of two (D = 96, Phi-3's): the
    per-code kernel runs there, on a tile padded to the next power of two anyway."""
    return any(s.D > 64 and s.D % 4 == 0 and s.D & (s.D - 1) for s in shapes)


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
        Rewrite(
            "kv-splits-wide",
            "the split-KV decode splits until the GPU is full at any batch and head count (no cap of 16 "
            "splits; 256 tokens a split at least), and its combine folds the splits 16 at a time as tiles",
            ("latency", "memory"),
            "a host `_config` caps the KV split count at a constant beside its per-split token floor "
            "`triton.cdiv(<context>, <tokens>)`, and a jit combine kernel folds the NUM_SPLITS partials a split a step",
            _kv_splits_wide,
            suits=_capped_splits_idle,
            edits_config=True,
        ),
        Rewrite(
            "split-k-waves",
            f"split-K until the programs fill the GPU {SPLIT_K_WAVES} times over (the SM count in the split-K "
            f"decision times {SPLIT_K_WAVES}): decode-sized M has too few output tiles to stream its weights",
            ("latency", "memory"),
            "a host `_config` decides a `split_k` in an `if` from the SM count (`_num_sms(...)`)",
            _split_k_waves,
            suits=_decode_sized,
            edits_config=True,
        ),
        Rewrite(
            "planes-padded",
            "the int8 decode reads its codes as int32 words split into byte planes at every head dim of whole "
            "words past 64 (D = 96: a 32-word tile of which 24 words are the head's), not only at powers of two",
            ("latency", "compute"),
            "a jit kernel of byte planes has a word tile exactly `W = HEAD_D // 4` wide, and its wrapper takes it "
            "only where `D == <tile>` and `D >= 128`",
            _planes_padded,
            suits=_padded_head_dim,
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


def move_suits(name: str, shapes: Sequence[Any]) -> bool:
    """Whether the catalog's `name` is a structural move whose bucket test holds at `shapes` (a shape without
    the sizes the test reads is not such a bucket)."""
    suits = CATALOG[name].suits
    try:
        return bool(suits and shapes and suits(shapes))
    except AttributeError:
        return False


def catalog_text() -> str:
    """The catalog as prompt lines: name, what it does, when it applies."""
    return "\n".join(f"- `{r.name}`: {r.summary}. Applies when {r.precondition}." for r in CATALOG.values())

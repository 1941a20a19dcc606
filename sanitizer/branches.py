"""Host-branch coverage: which sides of a candidate's host-code branches its checks took.

A cheat that is wrong only on inputs the checks never draw hides behind a host-code branch on a shape,
stride, dtype or size (`if page >= 32:`): the checks pass because they never take its other side. So
the executor records, for every conditional jump (an `if`, `while`, `assert`, conditional expression or
`and`/`or` short-circuit) of the candidate's file, which way it went on every call (BranchRecorder, a
trace function installed by the executor's trusted code before the candidate is imported, and paused
while Triton runs a kernel), and the judge, which never imports the candidate, compiles the same source
itself, lists the branches of its host functions (host_branches) and decides which sides were never
taken (uncovered), by decision: the operands of an `and`/`or` chain that jump to the same place count as
one. Exempt: a side that only raises (a guard on the contract's limits; the serving_sizes check runs the
host code at the contract's serving sizes, where taking it is a refusal), and a condition that reads the
device or bfloat16, which the interpreter cannot take (the GPU stage runs both).

Comparisons inside `min`/`max` are not branches (they compile to calls), nor is a `for` loop.
"""

from __future__ import annotations

import ast
import dis
import re
import sys
import types
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .canonical import parse_expression, parse_module
from .config_variant import ConfigStep, split_config

# (qualified name of the code object, its first line, offset of the jump, offset executed next)
Arc = Tuple[str, int, int, int]

_CONDITIONAL = re.compile(r"^(POP_JUMP_(FORWARD_|BACKWARD_)?IF_|JUMP_IF_(TRUE|FALSE)_OR_POP)")
_UNCONDITIONAL = {
    "JUMP_FORWARD",
    "JUMP_BACKWARD",
    "JUMP_ABSOLUTE",
    "JUMP",
    "JUMP_NO_INTERRUPT",
    "JUMP_BACKWARD_NO_INTERRUPT",
}
# A condition the interpreter cannot take both ways: the device a tensor lives on, bfloat16 tensors (the CPU
# checks draw bfloat16 values in float32 tensors). The GPU stage runs these.
GPU_ONLY = re.compile(r"\bdevice\b|is_cuda|\bcuda\b|get_device_properties|multi_processor_count|bfloat16")
DEVICE_READ = re.compile(r"\bdevice\b|is_cuda|\bcuda\b|get_device_properties|multi_processor_count")


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _jump_table(code: types.CodeType) -> Dict[int, int]:
    """Offsets at which an opcode event may report a conditional jump (its own, and an EXTENDED_ARG before
    it) -> the jump's offset."""
    table: Dict[int, int] = {}
    pending: List[int] = []
    for ins in dis.get_instructions(code):
        if ins.opname == "EXTENDED_ARG":
            pending.append(ins.offset)
            continue
        if _CONDITIONAL.match(ins.opname):
            for off in pending + [ins.offset]:
                table[off] = ins.offset
        pending = []
    return table


class BranchRecorder:
    """Records the arcs out of every conditional jump in one file's frames (the executor's side). Install it
    before the candidate is imported; `paused()` around each kernel launch keeps the interpreter's own Python
    untraced (it is not the candidate's, and tracing it would cost more than the launch)."""

    def __init__(self, filename: str):
        self.filename = filename
        self.arcs: Set[Arc] = set()
        self._tables: Dict[types.CodeType, Dict[int, int]] = {}
        self._last: Dict[int, int] = {}

    def _global(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename == self.filename:
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            self._last[id(frame)] = -1
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event == "opcode":
            code = frame.f_code
            table = self._tables.get(code)
            if table is None:
                table = self._tables[code] = _jump_table(code)
            key = id(frame)
            prev = self._last.get(key, -1)
            now = frame.f_lasti
            if prev in table and table[prev] != now:
                self.arcs.add((_qualname(code), code.co_firstlineno, table[prev], now))
            self._last[key] = now
        elif event == "return":
            self._last.pop(id(frame), None)
        return self._local

    def install(self) -> None:
        sys.settrace(self._global)

    @staticmethod
    def pause():
        """The trace function to restore after a launch (None where none is installed)."""
        current = sys.gettrace()
        if current is not None:
            sys.settrace(None)
        return current

    @staticmethod
    def resume(previous) -> None:
        if previous is not None:
            sys.settrace(previous)

    def evidence(self) -> List[List]:
        return [list(a) for a in sorted(self.arcs)]


# -- the judge's side: the branches of the candidate's host functions -------------------------------------


@dataclass(frozen=True)
class Side:
    qualname: str
    firstlineno: int
    jump: int  # offset of the conditional jump
    dest: int  # offset executed next on this side
    jumped: bool  # whether this side is the jump's target
    line: int
    condition: str  # the source of the condition
    value: str  # what the condition evaluates to on this side ("true", "false", "None", "not None")
    exempt: str  # why this side need not be taken ("" when it must)
    reads: str = ""  # a DEVICE_ONLY side's condition with the device-only locals it names spelled out

    @property
    def reads_the_device(self) -> bool:
        """A DEVICE_ONLY side that reads the device or its SM count (not only the dtype): one GPU takes one side."""
        return DEVICE_READ.search(self.reads or self.condition) is not None

    def key(self) -> Tuple[str, int, int, int]:
        return (self.qualname, self.firstlineno, self.jump, self.dest)

    def describe(self, path: str) -> str:
        return f"{path}:{self.line}: `{self.condition}` was never {self.value}"


def jit_names(tree: ast.Module) -> Set[str]:
    """Module-level functions decorated as Triton kernels (they run in the interpreter, not as host code)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            names.add(node.name)
    return names


def _host_codes(module_code: types.CodeType, jit: Set[str]) -> Iterable[types.CodeType]:
    """Every code object of a host function (module-level functions that are not kernels, and what they nest)."""
    stack = [c for c in module_code.co_consts if isinstance(c, types.CodeType)]
    while stack:
        code = stack.pop()
        if _qualname(code).split(".")[0] in jit or code.co_name == "<module>":
            continue
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def _raises(instrs: List[dis.Instruction], by_offset: Dict[int, int], start: int, depth: int = 0) -> bool:
    """Whether every path from `start` ends in a raise before it returns (a guard on the contract's limits)."""
    i = by_offset.get(start)
    while i is not None and i < len(instrs) and depth < 8:
        ins = instrs[i]
        if ins.opname in ("RAISE_VARARGS", "RERAISE"):
            return True
        if ins.opname.startswith("RETURN") or ins.opname in ("YIELD_VALUE",):
            return False
        if ins.opname in _UNCONDITIONAL:
            i = by_offset.get(ins.argval)
            depth += 1
            continue
        if _CONDITIONAL.match(ins.opname):
            return _raises(instrs, by_offset, ins.argval, depth + 1) and _raises(
                instrs, by_offset, instrs[i + 1].offset if i + 1 < len(instrs) else -1, depth + 1
            )
        i += 1
    return False


# What a condition the CPU cannot take may read: attributes of a tensor's or a device's kind, the dtype, the SM
# count, and the names these hang from (a size, a stride, a number or arithmetic on them would let a condition on
# the inputs shelter behind the exemption: `x.is_cuda and x.stride(0) != D`)
_GPU_ATTRS = frozenset(
    {
        "device",
        "type",
        "is_cuda",
        "dtype",
        "element_ty",
        "bfloat16",
        "float16",
        "float32",
        "cuda",
        "get_device_properties",
        "multi_processor_count",
        "torch",
        "tl",
    }
)
DEVICE_ONLY = "reads only the device, the dtype or the SM count: the GPU stage takes its other side"


def device_only(node: ast.AST, names: Mapping[str, str]) -> bool:
    """Whether an expression reads nothing but the device, the dtype or the SM count: attributes of _GPU_ATTRS
    hung from a name (`q.device.type`, `x.is_cuda`, `torch.bfloat16`), strings, comparisons and `not`/`and`/`or`
    of them, `get_device_properties(...)`, and the locals in `names` (bound to such reads alone)."""
    parents = {id(c): n for n in ast.walk(node) for c in ast.iter_child_nodes(n)}
    for sub in ast.walk(node):
        if isinstance(sub, (ast.IfExp, ast.BinOp, ast.Subscript, ast.Lambda, ast.NamedExpr, ast.Starred)):
            return False
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, (str, bool, type(None))):
            return False
        if isinstance(sub, ast.Attribute) and sub.attr not in _GPU_ATTRS:
            return False
        if isinstance(sub, ast.Call) and not (
            isinstance(sub.func, ast.Attribute) and sub.func.attr == "get_device_properties"
        ):
            return False
        if isinstance(sub, ast.Name) and not isinstance(parents.get(id(sub)), (ast.Attribute, ast.Call)):
            if sub.id not in names:
                return False  # a bare name that is no device-only local: a parameter, a size, a flag
    return True


def _reads(node: ast.AST, names: Mapping[str, str]) -> str:
    """The text of `node` with the values of the device-only locals it names (what the marker is looked for in)."""
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return " ".join([ast.unparse(node)] + [names[n] for n in sorted(used) if n in names])


def device_locals(fdef: ast.AST) -> Dict[str, str]:
    """The names a function binds, every time, to a device-only read (`dt = q.dtype`, `bf16 = dt ==
    torch.bfloat16`), never its parameters -> the text of what they read (transitively)."""
    params = set()
    if isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = fdef.args
        params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    values: Dict[str, List[ast.AST]] = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values.setdefault(node.targets[0].id, []).append(node.value)
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.comprehension, ast.NamedExpr)):
            bound = node.targets if isinstance(node, ast.Assign) else [node.target]
            for sub in (n for t in bound for n in ast.walk(t)):
                if isinstance(sub, ast.Name):  # unpacked, augmented, a loop's: bound to something else
                    values.setdefault(sub.id, []).append(ast.Constant(0))
    names: Dict[str, str] = {n: "" for n in values if n not in params}
    changed = True
    while changed:  # drop the names bound to anything else, until none is
        changed = False
        for n in list(names):
            if not all(device_only(v, names) for v in values[n]):
                del names[n]
                changed = True
    for _ in range(len(names)):  # each name's text holds what the names it reads hold
        names = {n: " ".join(_reads(v, names) for v in values[n]) for n in names}
    return names


def gpu_only_condition(text: str, names: Optional[Mapping[str, str]] = None) -> bool:
    """Whether a condition reads only the device a tensor lives on, the dtype or the SM count, and names the
    device or bfloat16 (what the interpreter cannot take both ways: the GPU stage does). Anything more in it (a
    size, a stride, a parameter, arithmetic, a conditional expression) and it must be taken both ways here.
    `names`: the function's device-only locals (device_locals)."""
    names = names or {}
    try:
        tree = parse_expression(text.strip())
    except SyntaxError:
        return False
    return device_only(tree, names) and GPU_ONLY.search(_reads(tree, names)) is not None


def condition_exemption(text: str, names: Optional[Mapping[str, str]] = None) -> str:
    """DEVICE_ONLY when the condition is gpu_only_condition, else ""."""
    return DEVICE_ONLY if gpu_only_condition(text, names) else ""


class _Positions:
    """The syntax tree of a source by the span of each node: what a jump's positions point at."""

    def __init__(self, source: str, tree: ast.Module):
        self.source = source
        self.spans: Dict[Tuple[int, int, int, int], ast.AST] = {}
        for node in ast.walk(tree):
            if getattr(node, "end_col_offset", None) is not None:
                span = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
                self.spans.setdefault(span, node)

    def condition(self, ins: dis.Instruction) -> Optional[ast.AST]:
        """The expression a jump tests: the node of its span, or the test of the `if`, `while`, conditional
        expression or `assert` whose span it has (a test that is a bare name or attribute gets the statement's)."""
        pos = getattr(ins, "positions", None)
        if not pos or pos.lineno is None or pos.col_offset is None:
            return None
        node = self.spans.get((pos.lineno, pos.col_offset, pos.end_lineno, pos.end_col_offset))
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            return node.test
        return node if isinstance(node, ast.expr) else None


def _condition_text(
    source_lines: List[str], ins: dis.Instruction, positions: Optional[_Positions] = None
) -> Tuple[int, str]:
    pos = getattr(ins, "positions", None)
    line = (pos.lineno if pos and pos.lineno else None) or ins.starts_line or 0
    node = positions.condition(ins) if positions is not None else None
    if node is not None:
        text = ast.get_source_segment(positions.source, node) or ast.unparse(node)  # type: ignore[union-attr]
        return node.lineno, " ".join(text.split())[:160]  # type: ignore[attr-defined]
    text = ""
    if pos and pos.lineno and pos.end_lineno == pos.lineno and pos.col_offset is not None and pos.end_col_offset:
        text = source_lines[pos.lineno - 1][pos.col_offset : pos.end_col_offset]
    if not text.strip() and 0 < line <= len(source_lines):
        text = source_lines[line - 1].strip()
    return line, " ".join(text.split())[:160]


_VALUES = {
    "FALSE": ("false", "true"),
    "TRUE": ("true", "false"),
    "NOT_NONE": ("not None", "None"),
    "NONE": ("None", "not None"),
}


def _sides_of(
    code: types.CodeType, source_lines: List[str], positions: _Positions, local: Mapping[str, str], override: str
) -> List[Side]:
    """Both sides of every conditional jump of one code object. `override`: why the function's comparison is
    exempt when it is a configuration override the search wrote ("" when it is none)."""
    instrs = list(dis.get_instructions(code))
    by_offset = {ins.offset: i for i, ins in enumerate(instrs)}
    sides = []
    for i, ins in enumerate(instrs):
        if not _CONDITIONAL.match(ins.opname) or i + 1 >= len(instrs):
            continue
        kind = next(
            k for k in ("NOT_NONE", "NONE", "FALSE", "TRUE") if ins.opname.endswith(k) or f"IF_{k}_" in ins.opname
        )
        when_jumped, when_not = _VALUES[kind]
        line, text = _condition_text(source_lines, ins, positions)
        why = (override if override and re.fullmatch(r"cfg == _TUNED_FROM\d*", text) else "") or condition_exemption(
            text, local
        )
        reads = _reads(parse_expression(text.strip()), local) if why == DEVICE_ONLY else ""
        for jumped, dest, value in ((True, ins.argval, when_jumped), (False, instrs[i + 1].offset, when_not)):
            exempt = why or (
                "only raises (a guard on the contract's limits)" if _raises(instrs, by_offset, dest) else ""
            )
            sides.append(
                Side(_qualname(code), code.co_firstlineno, ins.offset, dest, jumped, line, text, value, exempt, reads)
            )
    return sides


def config_overrides(source: str) -> Dict[str, ConfigStep]:
    """The functions of `source` that are launch-configuration overrides as the search writes them
    (sanitizer/config_variant.py: apply_config), each stacked one recognised by split_config, which regenerates
    the text byte for byte -> the override's step."""
    out: Dict[str, ConfigStep] = {}
    name, text = "_config", source
    while (found := split_config(text)) is not None:
        suffixes = re.findall(r"^_TUNED_BUCKET(\d*) = ", text, re.M)  # the peeled override's is the last
        text, step = found
        out[name] = step
        name = f"_config_base{suffixes[-1] if suffixes else ''}"  # the override below it, renamed by this one
    return out


def override_exemption(step: ConfigStep) -> str:
    """Why an override's comparison is no branch to cover; the configuration it selects must be launched
    instead (configs_launched)."""
    return (
        f"the search's launch-configuration override for bucket {step.bucket} ({tuple(step.tuned_from)} -> "
        f"{tuple(step.tuned_to)}): it selects a configuration, both sides compute the same function"
    )


_SPEC_FIELD = re.compile(r"(\w+)=([^,()]+)")


def configs_launched(steps: Iterable[ConfigStep], specs: Iterable[str]) -> Optional[ConfigStep]:
    """The first override whose configuration no launch of the checks used, else None. A configuration is
    launched when some specialisation (launch_spec) shows every field of it that a launch shows (a constexpr,
    num_warps, num_stages), at least one; a field that is no launch parameter (a grid size) cannot be seen."""
    launched = [dict(_SPEC_FIELD.findall(spec)) for spec in specs]
    for step in steps:
        want = {f: repr(v) for f, v in zip(step.fields, step.tuned_to)}
        if not any(
            any(f in seen for f in want) and all(seen.get(f, v) == v for f, v in want.items()) for seen in launched
        ):
            return step
    return None


def _functions_by_start(tree: ast.Module) -> Dict[Tuple[str, int], ast.AST]:
    """Every function of the tree by (name, the line its code object starts on: its first decorator's or def's)."""
    out: Dict[Tuple[str, int], ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[(node.name, first)] = node
    return out


def host_branches(source: str, path: str) -> List[Side]:
    """Both sides of every conditional jump in the host functions of `source`, compiled here (never run)."""
    tree = parse_module(source, path)
    module = compile(source, path, "exec", dont_inherit=True)
    lines = source.splitlines()
    positions = _Positions(source, tree)
    functions = _functions_by_start(tree)
    overrides = config_overrides(source)
    sides: List[Side] = []
    for code in _host_codes(module, jit_names(tree)):
        fdef = functions.get((code.co_name, code.co_firstlineno))
        local = device_locals(fdef) if fdef is not None else {}
        step = overrides.get(_qualname(code))
        sides += _sides_of(code, lines, positions, local, override_exemption(step) if step else "")
    return sides


def taken(arcs: Iterable[Sequence], sides: List[Side]) -> Set[Tuple[str, int, int, int]]:
    """The sides that the recorded arcs took (an arc that lands on neither successor counts as falling
    through: an instruction the event loop reports differently). Coverage is by decision: the operands of
    an `and`/`or` chain (and nested `if`s) that jump to the same place are one decision, so a side counts as
    taken when any jump of its function reached its destination: `if M >= 2048 and N >= 2048:` must run its
    body and skip it, not make each operand false with the others true (a correct kernel's guard of five
    stride and alignment tests cannot be driven operand by operand)."""
    keys: Set[Tuple[str, int, int, int]] = set()
    by_jump: Dict[Tuple[str, int, int], List[Side]] = {}
    for s in sides:
        by_jump.setdefault((s.qualname, s.firstlineno, s.jump), []).append(s)
    for arc in arcs:
        try:
            qual, first, jump, dest = str(arc[0]), int(arc[1]), int(arc[2]), int(arc[3])
        except (TypeError, ValueError, IndexError):
            continue
        pair = by_jump.get((qual, first, jump))
        if not pair:
            continue
        hit = next((s for s in pair if s.dest == dest), None) or next(s for s in pair if not s.jumped)
        keys.add(hit.key())
    reached = {(k[0], k[1], k[3]) for k in keys}
    return keys | {s.key() for s in sides if (s.qualname, s.firstlineno, s.dest) in reached}


def uncovered(sides: List[Side], took: Set[Tuple[str, int, int, int]]) -> List[Side]:
    """The sides that must be taken and were not, in source order."""
    return sorted((s for s in sides if not s.exempt and s.key() not in took), key=lambda s: (s.line, s.jump))


def spec_key(kernel: str, constexprs: Mapping[str, object]) -> str:
    """One Triton specialisation: the kernel and the constexpr values (and warps/stages) of a launch."""
    return f"{kernel}(" + ", ".join(f"{k}={constexprs[k]!r}" for k in sorted(constexprs)) + ")"


def launch_spec(fn, constexpr_names: Iterable[str], arg_names: Optional[List[str]], args, kwargs) -> str:
    """spec_key of one launch of kernel `fn` with these arguments."""
    names = list(arg_names or [])
    values: Dict[str, object] = {}
    for name in constexpr_names:
        if name in kwargs:
            values[name] = kwargs[name]
        elif name in names and names.index(name) < len(args):
            values[name] = args[names.index(name)]
    for k in ("num_warps", "num_stages"):
        if k in kwargs:
            values[k] = kwargs[k]
    safe = {
        k: (v if isinstance(v, (bool, int, float, str)) or v is None else type(v).__name__) for k, v in values.items()
    }
    return spec_key(getattr(fn, "__name__", "?"), safe)

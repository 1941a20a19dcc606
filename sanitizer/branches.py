"""Host-branch coverage: which sides of a candidate's host-code branches its checks took.

A cheat that is wrong only on inputs the checks never draw hides behind a host-code branch on a shape,
stride, dtype or size (`if page >= 32:`): the checks pass because they never take its other side. So
the executor records, for every conditional jump (an `if`, `while`, `assert`, conditional expression or
`and`/`or` short-circuit) of the candidate's file, which way it went on every call (BranchRecorder, a
trace function installed by the executor's trusted code before the candidate is imported, and paused
while Triton runs a kernel), and the judge, which never imports the candidate, compiles the same source
itself, lists the branches of its host functions (host_branches) and decides which sides were never
taken (uncovered), by decision: the operands of an `and`/`or` chain that jump to the same place count as
one. Exempt: a side that only raises (a guard on the contract's limits), and a condition that reads the
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

    def key(self) -> Tuple[str, int, int, int]:
        return (self.qualname, self.firstlineno, self.jump, self.dest)

    def describe(self, path: str) -> str:
        return f"{path}:{self.line}: `{self.condition}` was never {self.value}"


def _jit_names(tree: ast.Module) -> Set[str]:
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


# What a condition the CPU cannot take may read besides the device and dtype: attributes of a tensor's or a
# device's kind, the SM count, and the names these hang from (a bare name, a size, a stride or arithmetic on
# them would let a condition on the inputs shelter behind the exemption: `x.is_cuda and x.stride(0) != D`)
_GPU_ATTRS = frozenset(
    {
        "device",
        "type",
        "is_cuda",
        "dtype",
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


_DTYPES = frozenset({"bfloat16", "float16", "float32"})


def gpu_only_condition(text: str) -> bool:
    """Whether a host condition reads only the device a tensor lives on, the dtype (bfloat16) or the SM
    count: the interpreter cannot take it both ways, the GPU stage does. Anything more in it (a size, a
    stride, a bare name, arithmetic, a conditional expression) and it must be taken both ways here."""
    if not GPU_ONLY.search(text):
        return False
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return False
    parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.IfExp, ast.BinOp, ast.Subscript, ast.Lambda, ast.NamedExpr, ast.Starred)):
            return False
        if isinstance(node, ast.Constant) and not isinstance(node.value, (str, bool, type(None))):
            return False
        if isinstance(node, ast.Attribute) and node.attr not in _GPU_ATTRS:
            return False
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Attribute) and node.func.attr == "get_device_properties"
        ):
            return False
        parent = parents.get(id(node))
        if (
            isinstance(node, ast.Name)
            and not isinstance(parent, (ast.Attribute, ast.Call))
            and not (
                isinstance(parent, ast.Compare)
                and any(isinstance(c, ast.Attribute) and c.attr in _DTYPES for c in [parent.left, *parent.comparators])
            )
        ):
            return False  # a bare name, unless compared with a dtype (`dtype == torch.bfloat16`)
    return True


def _condition_text(source_lines: List[str], ins: dis.Instruction) -> Tuple[int, str]:
    pos = getattr(ins, "positions", None)
    line = (pos.lineno if pos and pos.lineno else None) or ins.starts_line or 0
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


def _sides_of(code: types.CodeType, source_lines: List[str]) -> List[Side]:
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
        line, text = _condition_text(source_lines, ins)
        gpu_only = "reads the device or bfloat16: taken on the GPU" if gpu_only_condition(text) else ""
        for jumped, dest, value in ((True, ins.argval, when_jumped), (False, instrs[i + 1].offset, when_not)):
            exempt = gpu_only or (
                "only raises (a guard on the contract's limits)" if _raises(instrs, by_offset, dest) else ""
            )
            sides.append(
                Side(_qualname(code), code.co_firstlineno, ins.offset, dest, jumped, line, text, value, exempt)
            )
    return sides


def host_branches(source: str, path: str) -> List[Side]:
    """Both sides of every conditional jump in the host functions of `source`, compiled here (never run)."""
    tree = ast.parse(source, filename=path)
    module = compile(source, path, "exec", dont_inherit=True)
    lines = source.splitlines()
    sides: List[Side] = []
    for code in _host_codes(module, _jit_names(tree)):
        sides += _sides_of(code, lines)
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

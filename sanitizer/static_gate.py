"""The static gate: what a candidate file may contain, decided on its syntax tree.

DESIGN.md section 2: a candidate may use torch on the host to allocate outputs, read
shapes and strides, compute grids and make views; it may not compute on tensor data with
torch, mutate inputs, keep state between calls, start threads or streams, do I/O, or use
ctypes, inline assembly, libdevice or @triton.autotune. What the sanitizer cannot verify
it rejects. This gate rejects what can be seen without running the code (including code
paths the dynamic checks never reach, such as a torch fallback taken only at serving
sizes); sanitizer/guard.py watches what the host code does at run time.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

ALLOWED_MODULES = {"torch", "triton", "triton.language", "math", "typing", "__future__",
                   "triton.tools.tensor_descriptor"}
# torch attributes a candidate may name: allocation, dtypes, shape records, device queries
ALLOWED_TORCH = {
    "empty", "empty_like", "empty_strided", "Size", "Tensor", "device", "dtype", "finfo", "iinfo", "is_tensor",
    "float16", "bfloat16", "float32", "float64", "half", "float", "double", "int8", "int16", "int32", "int64",
    "uint8", "bool", "long", "int", "float8_e4m3fn", "float8_e5m2",
    "cuda.get_device_properties", "cuda.current_device", "cuda.is_available", "cuda.get_device_capability",
}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars", "getattr",
                   "setattr", "delattr", "input", "breakpoint", "exit", "quit", "memoryview", "help", "print",
                   "id", "hash", "super", "object", "type", "classmethod", "staticmethod", "property"}
# Tensor methods that compute on (or copy, or read back) tensor data: never in host code.
FORBIDDEN_HOST_METHODS = {
    "item", "tolist", "numpy", "cpu", "cuda", "to", "float", "half", "bfloat16", "double", "int", "long", "bool",
    "clone", "copy_", "fill_", "zero_", "zeros_like", "ones_like", "full_like", "sum", "mean", "max", "min", "amax",
    "amin", "abs", "exp", "log", "sqrt", "softmax", "log_softmax", "matmul", "mm", "bmm", "addmm", "baddbmm", "mul",
    "mul_", "add", "add_", "sub", "sub_", "div", "div_", "neg", "pow", "round", "clamp", "clamp_", "where",
    "masked_fill", "masked_fill_", "index_select", "gather", "scatter", "scatter_", "index_put_", "cumsum",
    "sort", "topk", "argmax", "argmin", "norm", "einsum", "type", "type_as", "record_stream", "pin_memory",
    "share_memory_", "storage", "untyped_storage", "data_ptr", "set_", "resize_", "requires_grad_", "backward",
    "detach", "apply_", "map_", "copy", "tril", "triu", "repeat", "repeat_interleave", "cat", "stack",
    "nan_to_num", "exp2", "sigmoid", "tanh", "relu", "dot", "outer", "square", "reciprocal", "rsqrt",
}
FORBIDDEN_TL = {
    "inline_asm_elementwise": "inline assembly cannot be verified",
    "extern_elementwise": "extern (libdevice) calls cannot be run by the interpreter",
    "device_print": "no I/O from kernels",
    "static_print": "no I/O from kernels",
    "device_assert": "no device asserts in serving kernels",
}


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
            f" (+{len(self.findings) - 8} more)" if len(self.findings) > 8 else "")


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_jit_decorator(dec: ast.AST, aliases: Dict[str, str]) -> Optional[str]:
    """'jit' | 'autotune' | 'heuristics' | None for a decorator expression."""
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = _dotted(target)
    if not name:
        return None
    head, _, rest = name.partition(".")
    full = aliases.get(head, head) + ("." + rest if rest else "")
    if full in ("triton.jit", "triton.runtime.jit.jit"):
        return "jit"
    if full in ("triton.autotune",):
        return "autotune"
    if full in ("triton.heuristics",):
        return "heuristics"
    return "other:" + full


class _Gate(ast.NodeVisitor):
    def __init__(self, op_name: str, kernels: Optional[Set[str]] = None):
        self.op_name = op_name
        self.kernels = kernels or set()  # module-level @triton.jit names (their objects hold mutable caches)
        self.findings: List[Finding] = []
        self.aliases: Dict[str, str] = {}  # local name -> module ('tl' -> 'triton.language')
        self.jit: List[str] = []
        self.host_functions: Set[str] = set()
        self.in_jit = False
        self.depth = 0  # function nesting

    def bad(self, node: ast.AST, rule: str, msg: str):
        self.findings.append(Finding(getattr(node, "lineno", 0), rule, msg))

    # -- imports -----------------------------------------------------------------------
    def visit_Import(self, node: ast.Import):
        for a in node.names:
            if a.name not in ALLOWED_MODULES:
                self.bad(node, "import", f"import of `{a.name}` is not allowed (allowed: torch, triton, "
                                         f"triton.language, math, typing)")
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom):
        mod = node.module or ""
        if node.level:
            self.bad(node, "import", "relative imports are not allowed")
            return
        for a in node.names:
            full = f"{mod}.{a.name}"
            local = a.asname or a.name
            if full in ALLOWED_MODULES or mod in ("typing", "__future__", "math", "triton.tools.tensor_descriptor"):
                self.aliases[local] = full
            elif mod == "triton" and a.name in ("jit", "cdiv", "next_power_of_2", "language"):
                self.aliases[local] = full
            elif mod in ("triton.language",) and a.name not in FORBIDDEN_TL and a.name != "extra":
                self.aliases[local] = full
            elif mod == "torch" and a.name in ALLOWED_TORCH:
                self.aliases[local] = full
            else:
                self.bad(node, "import", f"`from {mod} import {a.name}` is not allowed")

    # -- definitions -------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef):
        kinds = [_is_jit_decorator(d, self.aliases) for d in node.decorator_list]
        for k, d in zip(kinds, node.decorator_list):
            if k == "autotune":
                self.bad(d, "autotune", "@triton.autotune is not allowed: launch configs must be explicit "
                                        "(choose them per shape in host code)")
            elif k and k.startswith("other:"):
                self.bad(d, "decorator", f"decorator `{k[6:]}` is not allowed (only @triton.jit)")
        for default in node.args.defaults + node.args.kw_defaults:
            # constants only: a mutable hidden anywhere inside a default (`_memo=({},)`) keeps state
            if default is not None and not _is_constant_expr(default, self.aliases):
                self.bad(default, "state", f"default argument of `{node.name}` is not a constant: it can keep "
                                           f"state across calls")
        is_jit = "jit" in kinds
        if self.depth == 0:
            (self.jit.append(node.name) if is_jit else self.host_functions.add(node.name))
        elif is_jit:
            self.bad(node, "structure", "Triton kernels must be defined at module level")
        prev = self.in_jit
        self.in_jit = is_jit or self.in_jit
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        self.in_jit = prev

    def visit_AsyncFunctionDef(self, node):
        self.bad(node, "structure", "async functions are not allowed")

    def visit_Lambda(self, node: ast.Lambda):
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef):
        self.bad(node, "state", "classes are not allowed in a candidate (they can keep state across calls)")

    def visit_Global(self, node):
        self.bad(node, "state", "`global` statements are not allowed (state across calls)")

    def visit_Nonlocal(self, node):
        self.bad(node, "state", "`nonlocal` statements are not allowed (state across calls)")

    def visit_With(self, node):
        self.bad(node, "structure", "`with` blocks are not allowed in a candidate")

    visit_AsyncWith = visit_With

    def visit_Try(self, node):
        self.bad(node, "structure", "try/except is not allowed (errors must surface to the sanitizer)")
        self.generic_visit(node)

    if hasattr(ast, "TryStar"):
        visit_TryStar = visit_Try

    def visit_Yield(self, node):
        self.bad(node, "structure", "generators are not allowed")

    visit_YieldFrom = visit_Yield
    visit_Await = visit_AsyncFunctionDef

    # -- module-level state ------------------------------------------------------------
    def visit_Module(self, node: ast.Module):
        for stmt in node.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                value = stmt.value
                if isinstance(stmt, ast.AugAssign) or value is None or not _is_constant_expr(value, self.aliases):
                    self.bad(stmt, "state", "module-level variables may only hold constants (numbers, strings, "
                                            "tuples of them, dtypes): anything else can keep state across calls")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign):
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign):
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self._check_target(node.target)
        self.generic_visit(node)

    def _check_target(self, t: ast.AST):
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._check_target(e)
        elif isinstance(t, ast.Attribute):
            self.bad(t, "state", f"assignment to attribute `{_dotted(t) or t.attr}` is not allowed "
                                 f"(mutates an object: state or input mutation)")
        elif isinstance(t, ast.Subscript) and not self.in_jit:
            self.bad(t, "mutation", "item assignment in host code is not allowed (it writes tensor data or "
                                    "mutable state)")

    # -- names and attributes ----------------------------------------------------------
    def visit_Name(self, node: ast.Name):
        if node.id.startswith("__") and node.id.endswith("__") and node.id not in ("__name__",):
            self.bad(node, "introspection", f"`{node.id}` is not allowed")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute):
        if node.attr.startswith("__") and node.attr.endswith("__"):
            self.bad(node, "introspection", f"dunder attribute `.{node.attr}` is not allowed")
        name = _dotted(node)
        if name:
            head, _, rest = name.partition(".")
            if head in self.kernels and not self.in_jit:
                self.bad(node, "state", f"`{name}`: host code may only launch a kernel (`{head}[grid](...)`); its "
                                        f"attributes hold mutable caches that could keep state across calls")
                return
            mod = self.aliases.get(head)
            if mod == "torch" and rest:
                if rest not in ALLOWED_TORCH and not any(rest.startswith(a + ".") for a in ALLOWED_TORCH):
                    self.bad(node, "torch-compute", f"`torch.{rest}` is not allowed: host code may only allocate "
                                                     f"(torch.empty*), read shapes and make views")
                return  # the whole dotted name was judged: do not judge its prefixes again
            if mod in ("triton.language", "triton.language.math") and rest:
                leaf = rest.split(".")[0]
                if leaf in FORBIDDEN_TL:
                    self.bad(node, "unverifiable", f"`tl.{leaf}`: {FORBIDDEN_TL[leaf]}")
                    return
                if leaf == "extra":
                    self.bad(node, "unverifiable", "`tl.extra` (libdevice) cannot be run by the interpreter")
                    return
            if mod == "triton" and rest and rest.split(".")[0] in ("autotune", "Config", "runtime", "compiler",
                                                                    "backends", "testing", "knobs"):
                self.bad(node, "autotune" if "autotune" in rest or "Config" in rest else "unverifiable",
                         f"`triton.{rest}` is not allowed in a candidate")
                return
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call):
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in FORBIDDEN_CALLS:
            self.bad(node, "forbidden-call", f"call to `{fn.id}()` is not allowed")
        if isinstance(fn, ast.Attribute) and not self.in_jit and fn.attr in FORBIDDEN_HOST_METHODS:
            base = _dotted(fn.value) or ""
            if self.aliases.get(base.split(".")[0]) not in ("math", "triton", "triton.language"):
                self.bad(node, "torch-compute", f"`.{fn.attr}()` in host code computes on, copies or reads back "
                                                f"tensor data")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp):
        if isinstance(node.op, ast.MatMult) and not self.in_jit:
            self.bad(node, "torch-compute", "the `@` operator in host code computes on tensor data")
        self.generic_visit(node)


def _is_constant_expr(node: ast.AST, aliases: Dict[str, str]) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(_is_constant_expr(e, aliases) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _is_constant_expr(node.operand, aliases)
    if isinstance(node, ast.BinOp):
        return _is_constant_expr(node.left, aliases) and _is_constant_expr(node.right, aliases)
    if isinstance(node, ast.Attribute):  # torch.float16, tl.float32, math.pi
        name = _dotted(node) or ""
        return aliases.get(name.split(".")[0]) in ("torch", "triton.language", "math", "triton")
    if isinstance(node, ast.Name):
        return node.id in ("None", "True", "False")
    if isinstance(node, ast.Call):  # tl.constexpr(4)
        name = _dotted(node.func) or ""
        return name.endswith("constexpr") and all(_is_constant_expr(a, aliases) for a in node.args)
    return False


def check_source(source: str, op_name: str) -> GateResult:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return GateResult(False, [Finding(e.lineno or 0, "syntax", f"syntax error: {e.msg}")])
    kernels = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and any(
        (_dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith("jit") for d in n.decorator_list)}
    gate = _Gate(op_name, kernels)
    gate.visit(tree)
    seen = set()
    findings = []
    for f in gate.findings:  # one finding per (line, rule)
        if (f.line, f.rule) not in seen:
            seen.add((f.line, f.rule))
            findings.append(f)
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if op_name not in top:
        findings.append(Finding(0, "contract", f"no module-level function named `{op_name}`"))
    elif op_name in gate.jit:
        findings.append(Finding(top[op_name].lineno, "contract", f"`{op_name}` must be the host wrapper, not a "
                                                                 f"@triton.jit kernel"))
    if not gate.jit:
        findings.append(Finding(0, "contract", "no @triton.jit kernel in the file: the result must be computed by "
                                               "Triton kernels defined in it"))
    return GateResult(not findings, findings, gate.jit)

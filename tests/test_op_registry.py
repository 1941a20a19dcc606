"""The op owns what is particular to it; every other layer asks the op and never branches on its name.

Adding an op is one op module (ops/<name>.py, named in ops/__init__.NAMES), one baseline
(kernels/baseline/<name>.py) and its tests. The scan below fails wherever code outside the registry keys a
decision on an op's name or copies the list of ops; the hook tests check that each op answers what the other
layers ask it.
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import torch

from kernel_agent.ops import NAMES, OPS, get_op

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("agent", "harness", "isolation", "sanitizer", "scripts")
NOT_SCANNED = ("ops",)  # the registry itself: each op module names its own op

# (file, scope) -> why an op name may be matched there. The scope is the enclosing function or class
# (dotted), or the module-level name assigned, or "<module>".
ALLOWED = {
    (
        "harness/workload/model_step.py",
        "DecodeStep.__init__",
    ): "a Llama decode step: the client that calls the very ops it is made of, as a serving stack does",
    (
        "harness/workload/model_step.py",
        "DecodeStep.__call__",
    ): "a Llama decode step: the client that calls the very ops it is made of, as a serving stack does",
    (
        "harness/workload/model_step.py",
        "DecodeStep.served",
    ): "the hybrid stack is defined as torch.matmul with the Triton attention; it names the op it swaps",
    (
        "agent/cli/bench.py",
        "print_model_bench",
    ): "the decode step's call labels (qkv, quantize_kv, attention, o, ...): two are spelled like op names",
    (
        "scripts/tune_baselines.py",
        "CONFIGS",
    ): "the hand-picked sweeps that chose each baseline's _config, kept as the record of that tuning",
    (
        "scripts/foundation_table.py",
        "FLOORS",
    ): "the Foundation issue's acceptance floors, quoted per op as that issue set them (a record)",
    (
        "scripts/foundation_table.py",
        "floor",
    ): "checks the Foundation issue's per-op floors on a recorded bench output (a record)",
}


def _str_constants(node: ast.AST) -> Iterator[ast.Constant]:
    """String literals of `node`, and of the elements of a tuple, list or set literal."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    for it in items:
        if isinstance(it, ast.Constant) and isinstance(it.value, str):
            yield it


def _keyed_literals(node: ast.AST) -> Iterator[ast.Constant]:
    """The string literals `node` decides or looks up on: compared (==, !=, in, not in, either side), a dict
    literal's keys, a subscript's key, a match case's values."""
    if isinstance(node, ast.Compare):
        for side in [node.left, *node.comparators]:
            yield from _str_constants(side)
    elif isinstance(node, ast.Dict):
        for k in node.keys:
            if k is not None:
                yield from _str_constants(k)
    elif isinstance(node, ast.Subscript):
        yield from _str_constants(node.slice)
    elif isinstance(node, ast.match_case):
        for p in ast.walk(node.pattern):
            if isinstance(p, ast.MatchValue):
                yield from _str_constants(p.value)


def _scopes(tree: ast.Module) -> Iterator[Tuple[str, ast.AST]]:
    """(scope, node) for every node: the dotted function/class path, else the module-level name assigned."""

    def walk(node, path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield ".".join(path + [child.name]), child
                yield from walk(child, path + [child.name])
            else:
                yield ".".join(path) or "<module>", child
                yield from walk(child, path)

    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield stmt.name, stmt
            yield from walk(stmt, [stmt.name])
            continue
        targets = (
            stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        )
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        scope = names[0] if names else "<module>"
        yield scope, stmt
        for n in ast.walk(stmt):
            if n is not stmt:
                yield scope, n


def _name_lists(node: ast.AST, names) -> Iterator[ast.Constant]:
    """The op names of a tuple, list or set literal of strings holding two or more: a copy of the op list,
    or of a part of it picked by hand."""
    if (
        isinstance(node, (ast.Tuple, ast.List, ast.Set))
        and node.elts
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    ):
        hits = [e for e in node.elts if e.value in names]
        if len({e.value for e in hits}) >= 2:
            yield from hits


def op_name_branches(source: str, filename: str, names=NAMES) -> List[Tuple[str, int, str, str]]:
    """(file, line, scope, name) of each op name that code in `source` compares, keys or matches on, or lists."""
    out = set()
    for scope, node in _scopes(ast.parse(source, filename)):
        for lit in _keyed_literals(node):
            if lit.value in names:
                out.add((filename, lit.lineno, scope, lit.value))
        for lit in _name_lists(node, names):
            out.add((filename, lit.lineno, scope, lit.value))
    return sorted(out)


def _scanned_files() -> List[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel == d or rel.startswith(d + "/") for d in NOT_SCANNED):
                files.append(path)
    return files


def test_the_scan_finds_each_kind_of_branch_on_an_op_name():
    src = """
def f(op, table):
    if op.name == "matmul":
        pass
    if op in ("attention", "conv"):
        pass
    x = {"quantize_kv": 1}
    y = table["decode_attention"]
    match op:
        case "decode_attention_int8":
            pass
    return "matmul"  # a plain value is no branch

OPS = ("matmul", "attention")
CALL = ("attention", "matmul", 3)  # a record mixing names and other values is no list of ops
"""
    found = op_name_branches(src, "x.py")
    assert [(line, scope, name) for _, line, scope, name in found] == [
        (3, "f", "matmul"),
        (5, "f", "attention"),
        (7, "f", "quantize_kv"),
        (8, "f", "decode_attention"),
        (10, "f", "decode_attention_int8"),
        (14, "OPS", "attention"),
        (14, "OPS", "matmul"),
    ]
    assert op_name_branches('T = {"matmul": 1}\n', "m.py") == [("m.py", 1, "T", "matmul")]


def test_no_layer_outside_the_registry_branches_on_an_op_name():
    found = []
    for path in _scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        found += [f for f in op_name_branches(path.read_text(), rel) if (rel, f[2]) not in ALLOWED]
    assert not found, (
        "ask the op (ops/) instead of matching its name, and take the list of ops from "
        "ops.NAMES:\n" + "\n".join(f"  {file}:{line} in {scope}: {name!r}" for file, line, scope, name in found)
    )


def test_every_allowance_is_still_used():
    used = set()
    for path in _scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        used |= {(rel, f[2]) for f in op_name_branches(path.read_text(), rel)}
    assert not set(ALLOWED) - used, f"allowances with nothing left to allow: {sorted(set(ALLOWED) - used)}"


def test_the_op_list_comes_from_the_registry():
    from kernel_agent.agent import run_config
    from kernel_agent.agent.cli import common as cli_common

    assert tuple(OPS) == NAMES
    assert cli_common.OP_NAMES is NAMES and run_config.ALL_OPS is NAMES
    # every op module of ops/ (a module defining OP) is registered, under its own name
    modules = {
        p.stem
        for p in (ROOT / "ops").glob("*.py")
        if any(
            isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "OP" for t in s.targets)
            for s in ast.parse(p.read_text()).body
        )
    }
    assert modules == set(NAMES)
    assert all(get_op(n).name == n for n in NAMES)


def test_the_registry_names_load_without_torch():
    code = "import sys; from kernel_agent.ops import NAMES; print(len(NAMES), 'torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.stdout.split() == [str(len(NAMES)), "False"], r.stdout + r.stderr


@pytest.mark.parametrize("name", NAMES)
def test_the_search_can_ask_the_op_for_its_tuning_space(name):
    from kernel_agent.agent.search import baseline_config, one_field_neighbours

    op = get_op(name)
    space = op.tuning_space
    assert space is not None and len(space.fields) == len(space.values)
    for shape in op.shapes("tiny") + op.shapes("serving"):
        cfg = baseline_config(name, shape)  # the baseline's _config, called as op.config_args says
        assert len(cfg) == len(space.fields), (shape, cfg)
    assert one_field_neighbours(space, baseline_config(name, op.shapes("serving")[0]), op.shapes("serving"))


@pytest.mark.parametrize("name", NAMES)
def test_every_op_has_a_benchmark_anchor_that_computes_its_contract(name):
    from kernel_agent.harness.bench.bench import anchor_for

    op = get_op(name)
    # equal sequence lengths: the gathered-cache anchor of the paged decodes times serving shapes
    shape = [s for s in op.shapes("tiny") if not getattr(s, "ragged", False)][-1]
    case = op.make_case(shape, torch.float32, seed=3)
    anchor = anchor_for(op, case)
    assert anchor.is_anchor and anchor.label.startswith("anchor:")
    assert anchor.serves == (op.torch_impl() is not None)
    assert (op.torch_impl() is None) == (op.bench_anchor(case) is not None)
    cmp = op.compare(anchor.fn(**case.args), case.args)
    assert cmp.ok, cmp.describe()

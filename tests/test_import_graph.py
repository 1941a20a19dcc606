"""Layers import downward only, no modules import each other in a loop, and an import inside a function
says why it is there.

The layer map is the table under "## Layers" in docs/ARCHITECTURE.md; this test reads it and keeps no copy.
Every module under ops/, kernels/, isolation/, sanitizer/, harness/, agent/ and scripts/ is parsed with `ast`
(imports at module level and inside functions alike, and `importlib.import_module` of a package path spelled as
a literal) and mapped to its layer. An import from a lower layer into a higher one, or a cycle between modules, fails
with the modules and layers named. A cycle between layers needs an upward import, so it fails as one.

Imports belong at the top of a module; one inside a function of agent/, harness/ or sanitizer/ needs a
comment on its line saying why (docs/ARCHITECTURE.md lists the reasons), and fails without one.

The scripts are the top layer: each imports the package by its installed name (`kernel_agent....`), never
another script or a module of tests/, and none edits `sys.path` (a checkout that was never installed puts its
root on PYTHONPATH instead, as scripts/gpu_*.sh do).
"""

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ops", "kernels", "isolation", "sanitizer", "harness", "agent", "scripts")
NOT_CODE = ("kernels/candidates/",)  # files the tool judges (adversarial, possibly not even Python), not its code
NAMESPACE = "kernel_agent."  # the installed name of the repository's folders (pyproject.toml)


@dataclass(frozen=True)
class Layer:
    rank: int  # 1 is the bottom
    name: str
    paths: Tuple[str, ...]  # repository paths: a folder ends with "/", a module with ".py"


@dataclass(frozen=True)
class Import:
    importer: str  # repository path of the importing module, e.g. "agent/cli.py"
    imported: str
    line: int


def read_layers(architecture: str) -> List[Layer]:
    """The rows of the table under "## Layers": | rank | layer | `path`, `path` | what it holds |."""
    section = architecture.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers = []
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit():
            layers.append(Layer(int(cells[0]), cells[1], tuple(re.findall(r"`([^`]+)`", cells[2]))))
    return layers


def layer_of(path: str, layers: Sequence[Layer]) -> Optional[Layer]:
    """The layer whose entry names `path` most precisely (the longest matching entry)."""
    best, best_len = None, -1
    for layer in layers:
        for entry in layer.paths:
            if (path == entry or (entry.endswith("/") and path.startswith(entry))) and len(entry) > best_len:
                best, best_len = layer, len(entry)
    return best


def module_files(root: Path, packages: Sequence[str] = PACKAGES) -> Dict[str, str]:
    """Dotted module name (as imported under the namespace, without it) -> repository path."""
    modules = {}
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            if rel.startswith(NOT_CODE):
                continue
            dotted = rel[:-3].replace("/", ".")
            modules[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = rel
    return modules


def _type_checking_nodes(tree: ast.AST) -> set:
    """Nodes under `if TYPE_CHECKING:`: they never run."""
    skipped = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, (ast.Name, ast.Attribute))
            and (getattr(node.test, "id", None) or getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        ):
            for stmt in node.body:
                skipped |= {id(n) for n in ast.walk(stmt)}
    return skipped


def _literal_module(call: ast.Call) -> Optional[str]:
    """`importlib.import_module("kernel_agent.x.y")` or `(f"kernel_agent.x.y.{name}")`: the literal part."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "import_module" and call.args):
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".")
    return None


def _targets(node: ast.AST, dotted: str, is_package: bool, modules: Dict[str, str]) -> List[str]:
    """The project modules an import statement (or a literal import_module call) loads."""

    def known(name: str) -> Optional[str]:
        while name and name not in modules:  # `kernel_agent.kernels.baseline.matmul` when only the package is known
            name = name.rpartition(".")[0]
        return name or None

    def strip(name: str) -> str:
        return name[len(NAMESPACE) :] if name.startswith(NAMESPACE) else ""

    found: List[Optional[str]] = []
    if isinstance(node, ast.Import):
        found = [known(strip(a.name)) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = dotted.split(".") if is_package else dotted.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = strip(node.module or "")
        for alias in node.names:
            submodule = f"{base}.{alias.name}" if base else alias.name
            found.append(submodule if submodule in modules else known(base))
    elif isinstance(node, ast.Call):
        literal = _literal_module(node)
        found = [known(strip(literal))] if literal else []
    return [m for m in found if m and m != dotted]


def imports(root: Path = ROOT, packages: Sequence[str] = PACKAGES) -> List[Import]:
    modules = module_files(root, packages)
    out = []
    for dotted, rel in modules.items():
        tree = ast.parse((root / rel).read_text(), filename=rel)
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for target in _targets(node, dotted, rel.endswith("__init__.py"), modules):
                out.append(Import(rel, modules[target], node.lineno))
    return out


def upward_imports(edges: Sequence[Import], layers: Sequence[Layer]) -> List[str]:
    problems = []
    for e in edges:
        low, high = layer_of(e.importer, layers), layer_of(e.imported, layers)
        if low is None or high is None:
            continue  # reported by test_every_module_has_a_layer
        if high.rank > low.rank:
            problems.append(
                f"{e.importer}:{e.line} (layer {low.rank} {low.name}) imports {e.imported} "
                f"(layer {high.rank} {high.name}): a lower layer may not import a higher one"
            )
    return problems


def cycles(edges: Sequence[Import]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    graph: Dict[str, set] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: set = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe_cycle(component: Sequence[str], edges: Sequence[Import]) -> str:
    inside = set(component)
    links = sorted(
        {f"{e.importer}:{e.line} -> {e.imported}" for e in edges if e.importer in inside and e.imported in inside}
    )
    return f"modules that import each other: {', '.join(component)} ({'; '.join(links)})"


# where an import inside a function needs its reason beside it
EXPLAINED = ("ops", "isolation", "sanitizer", "harness", "agent")


def unexplained_imports(source: str, rel: str) -> List[str]:
    """Imports inside functions with no comment on any line of the statement."""
    commented = {
        tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    }
    found: Dict[int, str] = {}
    for fn in ast.walk(ast.parse(source, filename=rel)):  # outer functions first: the innermost names the import
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not commented.intersection(
                range(node.lineno, node.end_lineno + 1)
            ):
                found[node.lineno] = f"{rel}:{node.lineno} {fn.name}: {ast.unparse(node)}"
    return [found[line] for line in sorted(found)]


def project_layers() -> List[Layer]:
    return read_layers((ROOT / "docs" / "ARCHITECTURE.md").read_text())


# -- the checks on this repository --------------------------------------------------------------------


def test_the_layer_table_is_read():
    layers = project_layers()
    assert [layer.rank for layer in layers] == list(range(1, len(layers) + 1)), "ranks run 1, 2, ... from the bottom"
    names = [layer.name for layer in layers]
    assert names[:2] == ["ops", "kernels"] and names[-2:] == ["cli", "scripts"]
    for layer in layers:
        for entry in layer.paths:
            assert (ROOT / entry).exists(), f"the layer table names {entry} (layer {layer.name}), which does not exist"


def test_every_module_has_a_layer():
    layers = project_layers()
    missing = [rel for rel in module_files(ROOT).values() if layer_of(rel, layers) is None]
    assert not missing, f"modules in no layer of docs/ARCHITECTURE.md: {missing}"


def test_no_layer_imports_a_higher_one():
    problems = upward_imports(imports(), project_layers())
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_no_modules_import_each_other_in_a_loop():
    edges = imports()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(describe_cycle(c, edges) for c in found)


def test_every_import_inside_a_function_says_why():
    found = []
    for package in EXPLAINED:
        for file in sorted((ROOT / package).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            if not rel.startswith(NOT_CODE):
                found += unexplained_imports(file.read_text(), rel)
    assert not found, (
        "imports inside functions without a comment saying why (move each to the top of its "
        "module, or say why it stays):\n" + "\n".join(found)
    )


def script_problems(root: Path = ROOT) -> List[str]:
    """Each script's `sys.path` edit, and its import of another script or of a module of tests/ (by the bare
    name that a `sys.path` edit makes importable)."""
    scripts = {p.stem for p in (root / "scripts").glob("*.py")}
    test_modules = {p.stem for p in (root / "tests").glob("*.py")} | {"tests"}
    problems: List[Tuple[str, int, str]] = []
    for file in sorted((root / "scripts").glob("*.py")):
        rel = file.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(file.read_text(), filename=rel)):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "sys" and node.attr == "path":
                problems.append((rel, node.lineno, "edits sys.path: import the package as installed"))
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in scripts or top in test_modules:
                    what = "another script" if top in scripts else "a module of tests/"
                    problems.append((rel, node.lineno, f"imports {name}, {what}: move what it shares into the package"))
    return [f"{rel}:{line} {what}" for rel, line, what in sorted(problems)]


def test_scripts_import_the_package_only():
    problems = script_problems()
    assert not problems, "scripts:\n" + "\n".join(problems)


# -- the check itself, on a small tree that breaks each rule ----------------------------------------------

TABLE = """# Architecture

## Layers

| rank | layer | modules | what |
|---|---|---|---|
| 1 | ops | `harness/ops/` | contracts |
| 2 | harness | `harness/` | bench |
| 3 | agent | `agent/` | loop |

## Data
"""


def _tree(tmp_path: Path, files: Dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_check_names_an_upward_import_inside_a_function(tmp_path):
    root = _tree(
        tmp_path,
        {
            "harness/__init__.py": "",
            "harness/ops/__init__.py": "",
            "agent/__init__.py": "",
            "harness/ops/common.py": "def f():\n    from ...agent import loop\n",
            "harness/bench.py": "from .ops import common\n",
            "agent/loop.py": "from kernel_agent.harness import bench\n",
        },
    )
    edges = imports(root, ("agent", "harness"))
    problems = upward_imports(edges, read_layers(TABLE))
    assert problems == [
        "harness/ops/common.py:2 (layer 1 ops) imports agent/loop.py (layer 3 agent): "
        "a lower layer may not import a higher one"
    ]
    assert cycles(edges) == [["agent/loop.py", "harness/bench.py", "harness/ops/common.py"]]


def test_the_check_finds_a_cycle_within_a_layer_and_skips_type_checking(tmp_path):
    root = _tree(
        tmp_path,
        {
            "agent/__init__.py": "",
            "agent/cli.py": "from . import commands\n",
            "agent/commands.py": "import importlib\nimportlib.import_module('kernel_agent.agent.cli')\n",
            "agent/review.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .cli import main\n",
        },
    )
    edges = imports(root, ("agent",))
    assert not upward_imports(edges, read_layers(TABLE))
    assert cycles(edges) == [["agent/cli.py", "agent/commands.py"]]
    assert "agent/commands.py:2 -> agent/cli.py" in describe_cycle(cycles(edges)[0], edges)
    assert not any(e.importer == "agent/review.py" for e in edges)


def test_the_most_precise_entry_decides_the_layer():
    layers = read_layers(TABLE)
    assert layer_of("harness/ops/matmul.py", layers).name == "ops"
    assert layer_of("harness/bench.py", layers).name == "harness"
    assert layer_of("scripts/x.py", layers) is None


def test_the_check_names_an_import_inside_a_function_without_a_reason():
    source = (
        "import os\n\n"
        "def light():\n"
        "    import torch  # keeps the startup light\n"
        "    from . import (wire,  # deferred: inside the sandbox\n"
        "                   guard)\n\n"
        "class Holder:\n"
        "    def method(self):\n"
        "        def inner():\n"
        "            import json\n"
        "        return inner\n"
    )
    assert unexplained_imports(source, "m.py") == ["m.py:11 inner: import json"]


def test_the_check_names_a_script_that_edits_sys_path_or_imports_a_script_or_a_test_module(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tests/helper.py": "",
            "scripts/a.py": "import sys\nsys.path.insert(0, '..')\nfrom b import x\n",
            "scripts/b.py": "import helper\nfrom kernel_agent.agent import loop\n",
        },
    )
    assert script_problems(root) == [
        "scripts/a.py:2 edits sys.path: import the package as installed",
        "scripts/a.py:3 imports b, another script: move what it shares into the package",
        "scripts/b.py:1 imports helper, a module of tests/: move what it shares into the package",
    ]

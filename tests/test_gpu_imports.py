"""The GPU tests cannot rot unseen: CI has no GPU, so tests/test_gpu.py never runs there, but a CPU can check
what the file takes from the project. Every project name it imports (at the top and inside its test
functions) must exist; so must every attribute it reads off an imported project module (`serving.get`),
every module it names in a string (`-m kernel_agent.agent.cli`, `import_module(f"kernel_agent...{op}")`) and
every repository file it joins onto ROOT (`scripts/gpu_sandbox_probe.py`); and every call of a project
function or class must fit its signature (a removed parameter, a keyword renamed)."""

import ast
import importlib
import inspect
import os
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_TEST_FILES = ["tests/test_gpu.py"]
PACKAGE = "kernel_agent"


def _parse(path):
    return ast.parse(open(os.path.join(ROOT, path)).read())


def project_imports(path):
    """(line, module, name or None) for every `from kernel_agent... import name` and `import kernel_agent...`."""
    for node in ast.walk(_parse(path)):
        yield from _imports_of(node)


def _imports_of(node):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
        for alias in node.names:
            yield node.lineno, node.module, alias.name
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith(PACKAGE):
                yield node.lineno, alias.name, None


def _resolve(module, name):
    """The object `from module import name` binds (name None: the module), or an ImportError/AttributeError."""
    mod = importlib.import_module(module)
    if name is None:
        return mod
    if hasattr(mod, name):
        return getattr(mod, name)
    return importlib.import_module(f"{module}.{name}")  # a submodule


def _resolved_or_none(binding):
    """The bound object, or None where the import itself fails (which the import check reports)."""
    try:
        return _resolve(*binding)
    except ImportError:
        return None


def _bound_names(node):
    """name -> (module, imported name or None) for the project imports directly in `node`'s scope."""
    out = {}
    for sub in _scope_nodes(node):
        for _, module, name in _imports_of(sub):
            alias = next(a for a in sub.names if a.name == (name or module))
            if name is not None:
                out[alias.asname or name] = (module, name)
            elif alias.asname:
                out[alias.asname] = (module, None)
    return out


def _scope_nodes(node):
    """The nodes of `node`'s own scope: a function's whole body (its nested functions too), or the module's
    statements outside its functions (decorators and defaults count as the module's)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        yield from (n for stmt in node.body for n in ast.walk(stmt))
        return
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.extend(n.decorator_list + n.args.defaults + [d for d in n.args.kw_defaults if d])
        else:
            stack.extend(ast.iter_child_nodes(n))


def _assigned(node):
    """Names a function binds by assignment or as parameters: they hide a module-level import of the name."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    args = node.args
    names = {a.arg for a in args.args + args.posonlyargs + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a}
    return names | {n.id for n in _scope_nodes(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _project_object(expr, bindings):
    """The project object `expr` names (`serving`, `serving.get`, `run_loop`), or None."""
    if isinstance(expr, ast.Name) and expr.id in bindings:
        return _resolved_or_none(bindings[expr.id])
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in bindings:
        owner = _resolved_or_none(bindings[expr.value.id])
        if isinstance(owner, types.ModuleType):
            return getattr(owner, expr.attr, None)
    return None


def _call_problem(call, obj):
    """Why `call` cannot bind to `obj`'s signature, or None (None too where the call spreads *args/**kwargs
    or the signature cannot be read)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*call.args, **{k.arg: k.value for k in call.keywords})
    except TypeError as e:
        return str(e)
    return None


def _string_problem(node):
    """A module named in a string (`"kernel_agent.agent.cli"`, f"kernel_agent.kernels.baseline.{op}") that
    does not import, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        if not (text.startswith(PACKAGE + ".") and all(p.isidentifier() for p in text.split("."))):
            return None
    elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        head = str(node.values[0].value)
        if not head.startswith(PACKAGE + ".") or "." not in head.rstrip("."):
            return None
        text = head.rstrip(".").rsplit(".", 1)[0] if not head.endswith(".") else head.rstrip(".")
    else:
        return None
    try:
        importlib.import_module(text)
    except ImportError:
        module, _, attr = text.rpartition(".")
        try:
            if hasattr(importlib.import_module(module), attr):
                return None
        except ImportError:
            pass
        return f"no module {text}"
    return None


def _path_problem(call):
    """`os.path.join(ROOT, "scripts", "x.py")`: the repository file it names must exist."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "join" and ast.unparse(func.value) == "os.path"):
        return None
    args = call.args
    if not args or not isinstance(args[0], ast.Name) or args[0].id != "ROOT" or len(args) < 2:
        return None
    if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args[1:]):
        return None
    rel = os.path.join(*(a.value for a in args[1:]))
    return None if os.path.exists(os.path.join(ROOT, rel)) else f"no file {rel} in the repository"


def _scope_problems(scope, module_bindings):
    bindings = dict(module_bindings)
    for hidden in _assigned(scope):
        bindings.pop(hidden, None)
    bindings.update(_bound_names(scope))
    for node in _scope_nodes(scope):
        where = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bindings:
            owner = _resolved_or_none(bindings[node.value.id])
            if isinstance(owner, types.ModuleType) and not hasattr(owner, node.attr):
                try:
                    importlib.import_module(f"{owner.__name__}.{node.attr}")
                except ImportError:
                    yield where, f"{owner.__name__} has no {node.attr}"
        elif isinstance(node, ast.Call):
            obj = _project_object(node.func, bindings)
            problem = _call_problem(node, obj) if callable(obj) else _path_problem(node)
            if problem:
                yield where, f"{ast.unparse(node.func)}(...): {problem}"
        problem = _string_problem(node)
        if problem:
            yield where, problem


def use_problems(path):
    """(line, what) for each attribute, call, module string or repository file of `path` that no longer fits
    the project (the imports themselves: project_imports)."""
    tree = _parse(path)
    module_bindings = _bound_names(tree)
    scopes = [tree] + [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        yield from _scope_problems(scope, module_bindings)


@pytest.mark.parametrize("path", GPU_TEST_FILES)
def test_every_project_name_a_gpu_test_imports_exists(path):
    found = list(project_imports(path))
    assert len(found) > 10  # the walk sees the imports inside functions too
    missing = []
    for line, module, name in found:
        try:
            _resolve(module, name)
        except ImportError as e:
            missing.append(
                f"{path}:{line}: {module}: {e}" if name is None else f"{path}:{line}: {module} has no {name}"
            )
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("path", GPU_TEST_FILES)
def test_what_a_gpu_test_uses_of_the_project_still_fits(path):
    problems = [f"{path}:{line}: {what}" for line, what in use_problems(path)]
    assert not problems, "\n".join(problems)


def test_the_check_fails_on_a_name_that_was_removed(tmp_path):
    bad = tmp_path / "test_gone.py"
    bad.write_text("def test_x():\n    from kernel_agent.harness.bench.bench import _quantize_eager\n")
    [(line, module, name)] = project_imports(str(bad))
    assert (module, name) == ("kernel_agent.harness.bench.bench", "_quantize_eager")
    with pytest.raises(ImportError):
        _resolve(module, name)


def test_the_check_fails_on_uses_that_no_longer_fit(tmp_path):
    bad = tmp_path / "test_rotten.py"
    bad.write_text(
        "import importlib, os\n"
        "from kernel_agent.harness.serving import serving\n"
        "from kernel_agent.ops import get_op\n"
        "ROOT = '.'\n"
        "def test_x(tmp_path):\n"
        "    serving.install_everything()\n"  # 6: a removed function
        "    get_op('matmul', dtype='bf16')\n"  # 7: a keyword it never took
        "    importlib.import_module(f'kernel_agent.kernelz.baseline.{1}')\n"  # 8: a package that is gone
        "    os.path.join(ROOT, 'scripts', 'gone_probe.py')\n"  # 9: a script that is gone
        "def test_y(serving):\n"
        "    serving.anything()\n"  # a parameter hides the module
        "    get_op('matmul')\n"
    )
    found = sorted(use_problems(str(bad)))
    assert [line for line, _ in found] == [6, 7, 8, 9], found
    assert "has no install_everything" in found[0][1] and "dtype" in found[1][1]
    assert "kernel_agent.kernelz" in found[2][1] and "gone_probe.py" in found[3][1]

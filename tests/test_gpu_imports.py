"""The GPU tests cannot rot unseen: CI has no GPU, so tests/test_gpu.py never runs there, but every project
name it imports (at the top and inside its test functions) must exist, which a CPU can check."""
import ast
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_TEST_FILES = ["tests/test_gpu.py"]


def project_imports(path):
    """(line, module, name or None) for every `from kernel_agent... import name` and `import kernel_agent...`."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernel_agent"):
            for alias in node.names:
                yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kernel_agent"):
                    yield node.lineno, alias.name, None


@pytest.mark.parametrize("path", GPU_TEST_FILES)
def test_every_project_name_a_gpu_test_imports_exists(path):
    found = list(project_imports(path))
    assert len(found) > 10  # the walk sees the imports inside functions too
    missing = []
    for line, module, name in found:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{path}:{line}: {module}: {e}")
            continue
        if name is not None and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ImportError:
                missing.append(f"{path}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)


def test_the_check_fails_on_a_name_that_was_removed(tmp_path, monkeypatch):
    bad = tmp_path / "test_gone.py"
    bad.write_text("def test_x():\n    from kernel_agent.harness.bench import _quantize_eager\n")
    [(line, module, name)] = project_imports(str(bad))
    assert (module, name) == ("kernel_agent.harness.bench", "_quantize_eager")
    assert not hasattr(importlib.import_module(module), name)

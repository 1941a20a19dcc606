"""The linters' and the type checker's setup (docs/CHECKS.md): the pre-commit hooks use the ruff CI pins, and
the link tree that shows mypy the package `kernel_agent` follows pyproject.toml's package-dir."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _typecheck():
    spec = importlib.util.spec_from_file_location("ka_typecheck", ROOT / ".ci" / "typecheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pins(text: str, name: str) -> list:
    return re.findall(rf"(?<![\w-]){re.escape(name)}==([\w.]+)", text)


def test_pre_commit_runs_the_ruff_that_ci_installs():
    ci_pins = _pins((ROOT / "requirements-dev.txt").read_text(), "ruff")
    hook_pins = _pins((ROOT / ".pre-commit-config.yaml").read_text(), "ruff")
    assert len(ci_pins) == 1 and hook_pins and set(hook_pins) == set(ci_pins), (ci_pins, hook_pins)


def test_ci_runs_ruff():
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("ruff check .", "ruff format --check ."):
        assert command in ci, f".ci/run does not run {command}"


def test_ci_and_pre_commit_run_the_type_check():
    """After ruff and before the tests in CI (under `set -e`, so an error fails the run), and as a hook that
    checks the whole package whatever files a commit touches."""
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    typecheck = lines.index(".venv/bin/python .ci/typecheck.py")
    assert "set -euo pipefail" in lines[: lines.index(".venv/bin/ruff check .")]
    assert lines.index(".venv/bin/ruff check .") < typecheck < lines.index("tier .venv/bin/python -m pytest -q")
    assert "set +e" not in lines[:typecheck]
    # each hook's block of `key: value` lines (the file is flat YAML; the test needs no YAML parser)
    blocks = (ROOT / ".pre-commit-config.yaml").read_text().split("- id:")[1:]
    hooks = [dict(re.findall(r"^\s*(\w+):\s*(.+?)\s*$", "id: " + b, re.MULTILINE)) for b in blocks]
    hook = next((h for h in hooks if ".ci/typecheck.py" in h.get("entry", "")), None)
    assert hook is not None, ".pre-commit-config.yaml has no hook that runs .ci/typecheck.py"
    assert hook["entry"] == "python .ci/typecheck.py" and hook.get("pass_filenames") == "false"


def test_pre_commit_runs_the_lint_and_the_format_check():
    entries = re.findall(r"^\s*entry:\s*(.+?)\s*$", (ROOT / ".pre-commit-config.yaml").read_text(), re.M)
    for command in ("ruff check", "ruff format"):
        assert any(e.startswith(command + " ") or e == command for e in entries), f"no pre-commit hook runs {command}"


def test_mypy_checks_packages_the_link_tree_holds():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    assert config["tool"]["mypy"]["mypy_path"] == _typecheck().TREE
    for package in config["tool"]["mypy"]["packages"]:
        assert package in mapping, f"mypy checks {package}, which package-dir does not map"


def test_the_link_tree_maps_each_folder_where_python_imports_it(tmp_path):
    for folder in ("kernel_agent", "harness/ops", "agent"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text(f"# {folder}\n")
    (tmp_path / "harness" / "__init__.py").write_text("# harness\n")
    mapping = {
        "kernel_agent": "kernel_agent",
        "kernel_agent.agent": "agent",
        "kernel_agent.harness": "harness",
        "kernel_agent.harness.ops": "harness/ops",
    }
    tree = Path(_typecheck().lay_out_tree(mapping, str(tmp_path)))
    assert sorted(os.listdir(tree)) == ["__init__.py", "agent", "harness"]
    assert (tree / "__init__.py").read_text() == "# kernel_agent\n"
    assert (tree / "harness" / "ops" / "__init__.py").read_text() == "# harness/ops\n"
    assert (tree / "agent").resolve() == (tmp_path / "agent").resolve()
    _typecheck().lay_out_tree(mapping, str(tmp_path))  # laid out again from scratch, not on top


def test_the_link_tree_refuses_a_nested_package_mapped_elsewhere(tmp_path):
    (tmp_path / "kernel_agent").mkdir()
    (tmp_path / "kernel_agent" / "__init__.py").write_text("")
    mapping = {"kernel_agent": "kernel_agent", "kernel_agent.harness": "harness", "kernel_agent.harness.ops": "ops"}
    with pytest.raises(SystemExit, match="maps kernel_agent.harness.ops to ops, not inside harness"):
        _typecheck().lay_out_tree(mapping, str(tmp_path))


def test_ci_runs_the_readme_test_command_and_the_exhaustive_tier():
    """The README's test command runs the quick tier (pyproject's addopts deselect `exhaustive`), and CI runs it,
    then the exhaustive tier (docs/CONTRIBUTING.md), each through `tier`, which takes exit 5 (no test) as no
    failure."""
    readme = (ROOT / "README.md").read_text()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m 'not exhaustive'" in config["addopts"]
    assert any(m.startswith("exhaustive:") for m in config["markers"])
    assert ".venv/bin/python -m pytest -q\n" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    quick = lines.index("tier .venv/bin/python -m pytest -q")
    exhaustive = next(i for i, line in enumerate(lines) if line.startswith("tier ") and "-m exhaustive" in line)
    assert quick < exhaustive
    assert 'if [ "$rc" -eq 5 ]; then echo "no tests collected: $*"; rc=0; fi' in lines


def test_ci_tier_passes_an_empty_selection_and_stops_at_a_failure():
    ci = (ROOT / ".ci" / "run").read_text()
    function = re.search(r"^tier\(\) \{\n.*?^\}\n", ci, re.M | re.S).group(0)
    script = "set -euo pipefail\n" + function + "tier bash -c 'exit 5'\necho went-on\n"
    script += "tier bash -c 'exit 1'\necho not-reached\n"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "no tests collected: bash -c exit 5",
        "went-on",
        "tests failed (pytest exit 1): bash -c exit 1",
    ]


def test_tests_of_one_xdist_group_run_on_one_worker(tmp_path):
    """Under the project's pytest options with two workers, the tests marked with one xdist_group run on one
    worker (so a module-scoped judging of candidates runs once), and the others still spread. Under xdist's
    default distribution the mark is ignored, and every worker built the shared fixture again."""
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "def _record(name):\n"
        "    with open(os.path.join(os.environ['WHERE'], name), 'w') as f:\n"
        "        f.write(os.environ.get('PYTEST_XDIST_WORKER', 'none'))\n"
        "@pytest.mark.xdist_group('shared')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    _record(f'grouped{i}')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    _record(f'free{i}')\n"
    )
    where = tmp_path / "where"
    where.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-n", "2", str(tmp_path / "test_grouped.py")],
        cwd=tmp_path, env={**os.environ, "WHERE": str(where)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    workers = {p.name: p.read_text() for p in where.iterdir()}
    assert len(workers) == 12, workers
    assert len({w for n, w in workers.items() if n.startswith("grouped")}) == 1, workers
    assert set(workers.values()) == {"gw0", "gw1"}, workers

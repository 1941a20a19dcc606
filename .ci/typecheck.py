"""mypy over ops/, isolation/, sanitizer/, harness/ and agent/, imported as kernel_agent.* (what .ci/run and the
pre-commit hook run): `python .ci/typecheck.py [mypy options]`; the settings are pyproject.toml's [tool.mypy].

pyproject.toml's package-dir installs the repository's folders as kernel_agent.agent, kernel_agent.harness, ...
(and kernel_agent/__init__.py maps them the same way in a checkout); mypy reads neither. So this lays the same
mapping out as links under build/typecheck/kernel_agent, where mypy_path points, and mypy resolves
`kernel_agent.harness.ledger.ledger` and `from ..harness import env` as Python does. Its report names repository paths.
"""

import os
import shutil
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "kernel_agent"
TREE = os.path.join("build", "typecheck")  # mypy_path in pyproject.toml


def package_dirs() -> dict:
    """pyproject.toml's package-dir: import name -> repository folder."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def lay_out_tree(mapping: dict, root: str = ROOT) -> str:
    """Links under root/TREE/kernel_agent: its __init__.py and one per top-level folder; a nested package
    must lie where its parent's folder puts it (else the links would show mypy another layout)."""
    tree = os.path.join(root, TREE, PACKAGE)
    shutil.rmtree(os.path.join(root, TREE), ignore_errors=True)
    os.makedirs(tree)
    os.symlink(
        os.path.relpath(os.path.join(root, mapping[PACKAGE], "__init__.py"), tree), os.path.join(tree, "__init__.py")
    )
    for name, folder in mapping.items():
        parts = name.split(".")
        if len(parts) == 2:
            os.symlink(os.path.relpath(os.path.join(root, folder), tree), os.path.join(tree, parts[1]))
        elif len(parts) > 2:
            parent = mapping[".".join(parts[:-1])]
            if os.path.normpath(folder) != os.path.normpath(os.path.join(parent, parts[-1])):
                raise SystemExit(f"typecheck: package-dir maps {name} to {folder}, not inside {parent}")
    return tree


def main(argv: list) -> int:
    lay_out_tree(package_dirs())
    prefix = os.path.join(TREE, PACKAGE) + os.sep
    run = subprocess.run([sys.executable, "-m", "mypy", *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(run.stdout.replace(prefix, ""))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

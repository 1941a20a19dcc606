"""The sanitizer package's door (sanitizer/__init__.py): `__all__` names the modules other packages import,
every module loads on first use as an attribute of the package, and importing the package loads none."""

import re
import subprocess
import sys
from pathlib import Path

import kernel_agent.sanitizer as package

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("agent", "harness", "scripts", "isolation", "ops")
IMPORTED = re.compile(r"(?:\.\.+|kernel_agent\.)sanitizer(?:\.(\w+)| import (?:\(([^)]*)\)|([\w, ]+)))")


def modules() -> set:
    return {p.stem for p in (ROOT / "sanitizer").glob("*.py") if p.stem != "__init__"}


def imported_from_outside() -> set:
    """The sanitizer modules other packages import (`from ..sanitizer.verdict import ...`, `from
    kernel_agent.sanitizer import runner`)."""
    found = set()
    for folder in OUTSIDE:
        for path in (ROOT / folder).rglob("*.py"):
            for dotted, parenthesised, listed in IMPORTED.findall(path.read_text()):
                names = re.sub(r"#[^\n]*", "", parenthesised or listed)
                found.update([dotted] if dotted else re.findall(r"\w+", names))
    return found


def test_all_names_the_modules_other_packages_import():
    outside = imported_from_outside()
    assert "runner" in outside and "canonical" in outside  # the scan sees them
    assert outside <= set(package.__all__), sorted(outside - set(package.__all__))
    assert set(package.__all__) <= modules()


def test_every_module_is_behind_the_door():
    assert package._MODULES == modules()


def test_the_package_loads_no_module_until_one_is_used():
    code = (
        "import sys, kernel_agent.sanitizer as s\n"
        "assert not [m for m in sys.modules if m.startswith('kernel_agent.sanitizer.')], 'loaded at import'\n"
        "assert 'torch' not in sys.modules\n"
        "assert s.verdict.Verdict is sys.modules['kernel_agent.sanitizer.verdict'].Verdict\n"
        "try:\n"
        "    s.nothing\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('an unknown name was served')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr

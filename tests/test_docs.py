"""The documentation cannot drift from the code: docs/COMMANDS.md is what the command line's `--help` prints
today (scripts/gen_cli_docs.py writes it)."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commands_page_is_what_help_prints():
    committed = (ROOT / "docs" / "COMMANDS.md").read_text()
    assert committed == _generator().render(), (
        "docs/COMMANDS.md differs from the command line's --help: run python scripts/gen_cli_docs.py"
    )


def test_commands_page_follows_a_changed_flag(monkeypatch):
    """A flag added to a command changes the page, so the test above fails until the page is regenerated."""
    from kernel_agent.agent.cli import parser as cli

    gen = _generator()
    build = cli.build_parser

    def with_a_new_flag():
        parser = build()
        sub = next(a for a in parser._actions if a.dest == "command")
        sub.choices["history"].add_argument("--newest-first", action="store_true", help="a flag added today")
        return parser

    monkeypatch.setattr(cli, "build_parser", with_a_new_flag)
    page = gen.render()
    assert "--newest-first" in page and page != (ROOT / "docs" / "COMMANDS.md").read_text()


def test_every_command_has_a_section():
    from kernel_agent.agent.cli import parser as cli
    from kernel_agent.agent.cli.common import COMMANDS

    cli.build_parser()  # building the parser fills the command table
    assert len(COMMANDS) >= 10
    page = (ROOT / "docs" / "COMMANDS.md").read_text()
    missing = [name for name in COMMANDS if f"## kernel-agent {name}\n" not in page]
    assert not missing, f"commands without a section in docs/COMMANDS.md: {missing}"


# The folders whose every module docs/ARCHITECTURE.md names; kernels/ only for its helpers (the baselines and
# promoted kernels are kernels, named by their op, and kernels/candidates/ is generated).
NAMED_FOLDERS = ("ops", "isolation", "sanitizer", "harness", "agent")


def project_modules():
    """Every module of the package, as a path from the repository's root (`ops/paged.py`)."""
    found = [p for folder in NAMED_FOLDERS for p in (ROOT / folder).rglob("*.py")]
    found += list((ROOT / "kernels").glob("*.py"))
    return sorted(str(p.relative_to(ROOT)) for p in found if p.name != "__init__.py")


def unnamed_modules(page_text, modules):
    """The modules whose path the page never spells out whole (`agent/web.py` does not name `agent/we.py`)."""
    return [m for m in modules if not re.search(rf"(?<![\w/.]){re.escape(m)}(?![\w/])", page_text)]


def test_architecture_names_every_module():
    modules = project_modules()
    assert "agent/ray_placement.py" in modules and "ops/tuning.py" in modules  # the walk sees them
    missing = unnamed_modules((ROOT / "docs" / "ARCHITECTURE.md").read_text(), modules)
    assert not missing, f"modules docs/ARCHITECTURE.md does not name (add each where its idea lives): {missing}"


def test_a_module_left_unnamed_is_found():
    page = (
        "| judged figures | `harness/bench/figures.py` |\n"
        "| the cluster (agent/ray_placement.py) |\n"
        "| web | `agent/web.py` |\n"
    )
    assert unnamed_modules(
        page, ["harness/bench/figures.py", "harness/env.py", "agent/ray_placement.py", "agent/we.py", "agent/web.py"]
    ) == ["harness/env.py", "agent/we.py"]

"""The documentation cannot drift from the code: docs/COMMANDS.md is what the command line's `--help` prints
today (scripts/gen_cli_docs.py writes it)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commands_page_is_what_help_prints():
    committed = (ROOT / "docs" / "COMMANDS.md").read_text()
    assert committed == _generator().render(), \
        "docs/COMMANDS.md differs from the command line's --help: run python scripts/gen_cli_docs.py"


def test_commands_page_follows_a_changed_flag(monkeypatch):
    """A flag added to a command changes the page, so the test above fails until the page is regenerated."""
    from kernel_agent.agent import cli

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
    from kernel_agent.agent import cli
    from kernel_agent.agent.cli_common import COMMANDS

    cli.build_parser()  # building the parser fills the command table
    assert len(COMMANDS) >= 10
    page = (ROOT / "docs" / "COMMANDS.md").read_text()
    missing = [name for name in COMMANDS if f"## kernel-agent {name}\n" not in page]
    assert not missing, f"commands without a section in docs/COMMANDS.md: {missing}"

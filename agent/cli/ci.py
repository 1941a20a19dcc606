"""`kernel-agent ci init`: the CI a team adopts in one command.

It writes two files into a checkout of a repository that holds a kernel-agent serving set:

- `.github/workflows/kernel-agent.yml`: on every pull request that changes kernels, install kernel-agent
  with a CPU torch and run `kernel-agent gate` (the serving set and the baselines it falls back to, full
  CPU sanitizer) with JUnit XML as an artifact and the markdown summary on the run's page. An opt-in
  job re-runs the gate with the GPU checks on a self-hosted runner whose label the repository variable
  KERNEL_AGENT_GPU_RUNNER names (unset: the job is skipped).
- `.pre-commit-config.yaml`: a local hook per op for the pre-commit framework, which sanitizes the
  changed kernel files of that op in quick mode. The op comes from the path: a serving kernel is
  `kernels/serving/<op>__<bucket>__<dtype>__<gpu>.py` (harness/serving/serving.py kernel_file_name), a
  baseline `kernels/baseline/<op>.py`. Generated candidates (kernels/candidates/) are ignored by git,
  so no commit carries them.

This repository's own `.github/workflows/kernel-agent.yml` is this template (a test holds them equal).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional

from .. import ui
from .common import OP_NAMES, UsageError, check_writable, command

WORKFLOW_PATH = os.path.join(".github", "workflows", "kernel-agent.yml")
# what the workflow and the hooks use from the repository they are written into
CLONE_FILES = (
    "pyproject.toml",
    "requirements-cpu.txt",
    os.path.join("kernels", "serving"),
    os.path.join("kernels", "baseline"),
)
PRE_COMMIT_PATH = ".pre-commit-config.yaml"
GPU_RUNNER_VAR = "KERNEL_AGENT_GPU_RUNNER"

WORKFLOW = """\
# kernel-agent's CI gate, as `kernel-agent ci init` writes it.
#
# On every pull request that changes kernels, the serving kernel set and the baselines it falls back to
# are re-verified by the full CPU sanitizer (`kernel-agent gate`): the JUnit XML and the summary are
# uploaded as an artifact, and the summary is shown on the run's page. The job `gate-gpu` re-runs the
# gate with the GPU checks (device differential, compute-sanitizer, determinism) on a self-hosted GPU
# runner: set the repository variable KERNEL_AGENT_GPU_RUNNER to that runner's label to turn it on.
name: kernel-agent

on:
  pull_request:
    paths:
      - "kernels/**"
      - "kernels/serving/manifest.json"
  workflow_dispatch:

permissions:
  contents: read

concurrency:
  group: kernel-agent-${{ github.ref }}
  cancel-in-progress: true

jobs:
  gate:
    name: gate (CPU sanitizer)
    runs-on: ubuntu-latest
    timeout-minutes: 60
    env:
      # Triton kernels run in Triton's interpreter on the CPU
      TRITON_INTERPRET: "1"
      # torch's CPU wheels: the torch==2.13.0 that requirements-cpu.txt pins resolves to 2.13.0+cpu here,
      # not to a CUDA build of several GB
      PIP_EXTRA_INDEX_URL: https://download.pytorch.org/whl/cpu
    steps:
      - uses: actions/checkout@v5
      - uses: actions/setup-python@v6
        with:
          python-version: "3.11"
          cache: pip
          cache-dependency-path: requirements-cpu.txt
      - name: Install kernel-agent
        run: python -m pip install -r requirements-cpu.txt -e .
      - name: Gate the serving kernel set
        run: |
          mkdir -p runs/ci
          kernel-agent gate --jobs 2 --junit runs/ci/gate.xml --summary runs/ci/gate.md
      - name: Upload the gate's JUnit XML and summary
        if: always()
        uses: actions/upload-artifact@v6
        with:
          name: kernel-agent-gate
          path: runs/ci/
          if-no-files-found: ignore

  gate-gpu:
    name: gate (GPU checks)
    if: vars.KERNEL_AGENT_GPU_RUNNER != ''
    runs-on: [self-hosted, "${{ vars.KERNEL_AGENT_GPU_RUNNER }}"]
    timeout-minutes: 90
    steps:
      - uses: actions/checkout@v5
      - name: Install kernel-agent beside the runner's CUDA torch and triton
        # the runner's own torch and triton are kept (system site packages); pip adds the rest
        run: |
          python3 -m venv --system-site-packages .venv-gpu
          .venv-gpu/bin/python -m pip install -e .
      - name: Gate the serving kernel set with the GPU checks
        run: |
          mkdir -p runs/ci
          .venv-gpu/bin/kernel-agent gate --gpu on --jobs 2 --junit runs/ci/gate-gpu.xml --summary runs/ci/gate-gpu.md
      - name: Upload the gate's JUnit XML and summary
        if: always()
        uses: actions/upload-artifact@v6
        with:
          name: kernel-agent-gate-gpu
          path: runs/ci/
          if-no-files-found: ignore
"""


@dataclass(frozen=True)
class Hook:
    """The pre-commit hook of one op: `files` is the regular expression pre-commit searches each changed
    path with (relative to the repository's root); `entry` gets the matching paths appended."""

    op: str

    @property
    def id(self) -> str:
        return f"kernel-agent-sanitize-{self.op.replace('_', '-')}"

    @property
    def files(self) -> str:
        # `__` ends the op in a serving file name, so decode_attention never takes decode_attention_int8's files
        return rf"^kernels/(serving/{self.op}__[^/]+|baseline/{self.op})\.py$"

    @property
    def entry(self) -> str:
        # quick mode, CPU only: a commit waits for seconds per file, not for the GPU checks
        return f"kernel-agent sanitize --quick --gpu off --op {self.op}"


HOOKS = tuple(Hook(op) for op in OP_NAMES)


def pre_commit_text() -> str:
    lines = [
        "# kernel-agent's pre-commit hooks, as `kernel-agent ci init` writes them: each changed kernel file is",
        "# sanitized in quick mode, by the op its path names (kernels/serving/<op>__<bucket>__<dtype>__<gpu>.py,",
        "# kernels/baseline/<op>.py). Set up once per clone: pip install pre-commit && pre-commit install",
        "repos:",
        "  - repo: local",
        "    hooks:",
    ]
    for h in HOOKS:
        # JSON strings are YAML double-quoted scalars: the regular expressions' backslashes survive as written
        lines += [
            f"      - id: {h.id}",
            f"        name: {json.dumps(f'kernel-agent sanitize --quick ({h.op})')}",
            f"        entry: {json.dumps(h.entry)}",
            "        language: system",
            f"        files: {json.dumps(h.files)}",
            "        require_serial: true",
        ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Template:
    """A file `ci init` writes: its path under the target folder, its text, and what it is (one line)."""

    name: str
    path: str
    text: str
    what: str


def templates() -> List[Template]:
    return [
        Template(
            "workflow",
            WORKFLOW_PATH,
            WORKFLOW,
            "GitHub Actions: the CPU gate on pull requests that touch kernels (JUnit + step summary), "
            f"the GPU gate on a self-hosted runner when the variable {GPU_RUNNER_VAR} names its label",
        ),
        Template(
            "pre-commit",
            PRE_COMMIT_PATH,
            pre_commit_text(),
            "pre-commit hooks: changed kernel files sanitized in quick mode (pip install pre-commit && "
            "pre-commit install)",
        ),
    ]


def write_templates(root: str, force: bool = False, only: Optional[str] = None) -> List[Template]:
    """Write the templates under `root` and return them; without `force`, refuse (UsageError, nothing
    written) when any of them exists."""
    if not os.path.isdir(root):
        raise UsageError(f"--dir {root}: no such folder")
    chosen = [t for t in templates() if only is None or t.name == only]
    for t in chosen:  # every destination before the first file is written
        check_writable(os.path.join(root, t.path), "--dir", folder=False)
    missing = [p for p in CLONE_FILES if not os.path.exists(os.path.join(root, p))]
    if missing:  # the workflow installs kernel-agent from the repository and gates its serving set
        raise UsageError(
            f"--dir {root}: not the top of a kernel-agent clone (no {', '.join(missing)}): the workflow installs "
            f"kernel-agent from it and gates its kernels; run `kernel-agent ci init` there"
        )
    if not force:
        there = [t.path for t in chosen if os.path.exists(os.path.join(root, t.path))]
        if there:
            raise UsageError(
                f"{', '.join(os.path.join(root, p) for p in there)} exist{'s' if len(there) == 1 else ''}: "
                f"pass --force to overwrite {'it' if len(there) == 1 else 'them'}"
            )
    for t in chosen:
        path = os.path.join(root, t.path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(t.text)
    return chosen


def register(sub) -> None:
    c = sub.add_parser("ci", help="CI templates: `ci init` writes a GitHub Actions workflow and pre-commit hooks")
    csub = c.add_subparsers(dest="ci_command", metavar="SUBCOMMAND")
    i = csub.add_parser("init", help="write .github/workflows/kernel-agent.yml and .pre-commit-config.yaml")
    i.add_argument("--dir", default=".", help="the repository's root (default: the current folder)")
    i.add_argument("--force", action="store_true", help="overwrite files that exist")
    i.add_argument("--only", choices=[t.name for t in templates()], help="write only this one")
    command("ci")(cmd_ci)


def cmd_ci(args) -> int:
    if args.ci_command != "init":
        raise UsageError("ci: give a subcommand: init")
    for t in write_templates(args.dir, args.force, args.only):
        ui.line(f"wrote {os.path.join(args.dir, t.path)}: {t.what}")
    return 0


__all__ = [
    "register",
    "cmd_ci",
    "write_templates",
    "templates",
    "Template",
    "Hook",
    "HOOKS",
    "WORKFLOW",
    "WORKFLOW_PATH",
    "PRE_COMMIT_PATH",
    "pre_commit_text",
    "GPU_RUNNER_VAR",
]

"""`kernel-agent pr RUN`: a pull-request body for a run's promotions, the plots to attach, and (with
--open) the pull request itself, opened from the run's branch with the GitHub CLI.

For each promoted kernel the body holds what `report` shows for it (agent/review.py: the rule's
decision, the timings against the incumbent and the torch anchor with the clock named, the sanitizer
verdict with FpSan equivalence, the diff against what it replaces; the same functions write both), the
decode-step effect where `bench --model` measured it (a document given with --model-step), and the
commands that reproduce every figure and verdict, with the run's real shapes and files.

Where the promotions are: a run that committed them on a branch records it in its notes (JSON, key
'serving', as agent/publish.py writes it: mode, branch, repo, base, commits); a run from before that,
or one that wrote in place, has no branch, and the body says so.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...harness.bench.figures import CLOCK_PHRASES, candidate_results, fmt_x
from ...harness.manifest import gpu_slug
from ...harness.workload.kv_plan import KvPlan, load_plan
from ...harness.workload.model_step import KV_MODES, PRESETS, ModelConfig, ModelConfigError, parse_points, step_op_calls
from .. import ui
from .common import UsageError, check_writable, command, default_ledger, open_ledger
from .plots import _plots
from .promotion_sections import (
    PromotedKernel,
    diff_section,
    md_word,
    promoted_kernels,
    promotion_header,
    timings_section,
    verdict_section,
)
from .views import extract_command, field_failure_line, seed_of

BODY = "pr.md"
# The points `bench --model` is asked about when a run names none (the three of docs/BENCHMARK.md, then the batch
# sizes a matmul bucket boundary can need): searched for a decode step that calls a promoted bucket.
SUGGESTED_POINTS = ("32x8192", "8x32768", "64x2048", "1x8192", "8x8192", "16x8192", "128x8192", "256x8192")


def register(sub) -> None:
    p = sub.add_parser("pr", help="pull-request body (markdown) and plots for a run's promotions; --open opens it")
    p.add_argument("run", help="run id")
    p.add_argument("--out", default=None, help="output folder (default runs/<run>/pr)")
    p.add_argument(
        "--open",
        action="store_true",
        help="push the run's branch and open the pull request with the GitHub CLI (gh) when it is "
        "installed and signed in; otherwise print the commands to run",
    )
    p.add_argument(
        "--model-step",
        metavar="FILE",
        help="a `kernel-agent bench --model ... --out FILE` document, measured with the run's serving "
        "set: the decode-step effect of each promoted kernel that the step calls",
    )
    p.add_argument(
        "--kv-plan",
        metavar="FILE",
        help="a `kernel-agent workload plan` file: its choice and options as a section of the body",
    )
    p.add_argument("--ledger", default=None)
    command("pr")(cmd_pr)


# -- where the promotions are -------------------------------------------------------------------


@dataclass(frozen=True)
class RunBranch:
    """Where a run's promotions went, as its ledger records it. mode: 'branch' (committed on `branch`,
    `commits` commits on `base`, in the repository `repo`; None and 0 where the record does not say),
    'in_place' (written to `serving_dir`) or 'unrecorded' (a run from before branches: written in place in
    the checkout it ran in)."""

    mode: str
    branch: Optional[str] = None
    repo: Optional[str] = None
    base: Optional[str] = None
    commits: int = 0
    serving_dir: Optional[str] = None
    why: str = ""
    configs: Tuple[int, ...] = ()  # candidates promoted as a configuration: no serving file of their own

    @property
    def has_branch(self) -> bool:
        return self.mode == "branch" and bool(self.branch)

    def describe(self) -> List[str]:
        if self.has_branch:
            if self.base:
                n = f"{self.commits} commit{'s' if self.commits != 1 else ''} on `{self.base[:12]}`, one per promotion"
                return [f"**Branch:** `{self.branch}`, {n} (`git log -p {self.base[:12]}..{self.branch}`)."]
            return [f"**Branch:** `{self.branch}` (`git log -p {self.branch}`)."]
        if self.mode == "in_place":
            return [
                f"**No branch:** the run wrote the serving set in place (`{self.serving_dir}`"
                f"{': ' + self.why if self.why else ''}). Commit its changes under `kernels/serving/` on a "
                f"branch to open this pull request."
            ]
        why = f" ({self.why})" if self.why else ""
        return [
            f"**No branch:** the ledger records no branch for this run{why}, so its promotions were written in "
            "place into the serving set of the checkout it ran in. Commit the changes under `kernels/serving/` on "
            "a branch to open this pull request."
        ]


def run_branch(run) -> RunBranch:
    """The RunBranch a run recorded: its notes' 'serving' object (agent/publish.py), else a 'branch' key
    in its notes or its config, else unrecorded."""
    notes = run.notes.to_json()  # (an older run's free-text notes have no fields: no record of a branch)
    target = notes.get("serving")
    if isinstance(target, dict) and target.get("mode"):
        commits = target.get("commits") or 0
        if target["mode"] == "branch" and target.get("branch") and commits:
            return RunBranch(
                "branch",
                target["branch"],
                target.get("repo"),
                target.get("base"),
                int(commits),
                configs=tuple(target.get("configs") or ()),
            )
        if target["mode"] == "branch":  # a branch that received no commit is deleted again: nothing there
            return RunBranch("unrecorded", why="its branch received no commit")
        return RunBranch("in_place", serving_dir=target.get("serving_dir"), why=target.get("why") or "")
    branch = notes.get("branch") or run.config.get("branch")
    if isinstance(branch, str) and branch:
        return RunBranch(
            "branch",
            branch,
            notes.get("repo") or run.config.get("repo"),
            notes.get("base"),
            int(notes.get("commits") or 0),
        )
    return RunBranch("unrecorded")


# -- the decode step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepEffect:
    """One point and KV mode of a `bench --model` document where the promoted kernel served op calls:
    per layer, those calls' time in the serving stack and the same calls in the baseline stack, and the
    whole step of each stack (ms per step = per layer x layers)."""

    point: str
    kv: str
    calls: Tuple[str, ...]
    layers: int
    kernel_ms: float  # the calls in the serving stack, per layer
    baseline_calls_ms: Optional[float]  # the same calls in the baseline stack, per layer
    step_ms: Dict[str, float]  # stack -> ms per step
    tokens_vs_torch: Optional[float]  # the serving stack's tokens/s over torch's

    @property
    def saved_ms_per_step(self) -> Optional[float]:
        if self.baseline_calls_ms is None:
            return None
        return (self.baseline_calls_ms - self.kernel_ms) * self.layers


@dataclass(frozen=True)
class StepMeasurement:
    """What a `bench --model` document says about one promoted kernel: `effects` where it served calls;
    `other`: what served the kernel's bucket instead where the step called it (measured without it)."""

    model: str
    gpu: str
    effects: Tuple[StepEffect, ...]
    other: Tuple[str, ...]


def load_model_step(path: str) -> Dict[str, Any]:
    """A `bench --model --out` document (UsageError when the file is not one)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"--model-step {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--model-step {path}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list) or "config" not in doc:
        raise UsageError(f"--model-step {path}: not a `kernel-agent bench --model --out` document (no points)")
    return doc


def step_measurement(doc: Dict[str, Any], pk: PromotedKernel) -> StepMeasurement:
    from ...harness.serving.serving import (  # here: the serving set imports torch; flags come first
        gpu_slug,
        kernel_file_name,
    )

    pr = pk.promotion
    mine = kernel_file_name(pr.op, pr.bucket, pr.dtype, pr.gpu_name)
    same_gpu = gpu_slug(str(doc.get("gpu") or "")) == gpu_slug(pr.gpu_name)
    layers = int((doc.get("config") or {}).get("layers") or 1)
    effects, other = [], []
    for p in doc["points"]:
        point = f"{p.get('batch')}x{p.get('context')}"
        timings = {(t["stack"], t["kv"]): t for t in p.get("timings", [])}
        for kv in dict.fromkeys(s["kv"] for s in p.get("served", [])):
            served = [s for s in p["served"] if s["kv"] == kv and s["op"] == pr.op and s["bucket"] == pr.bucket]
            calls = tuple(s["label"] for s in served if s["implementation"] == mine and same_gpu)
            other += [
                f"{point} {kv}: {s['label']} served by {s['implementation']}" for s in served if s["label"] not in calls
            ]
            serving = timings.get(("serving", kv))
            if not calls or serving is None:
                continue
            base = timings.get(("baseline", kv))
            torch_t = timings.get(("torch", "bf16"))
            effects.append(
                StepEffect(
                    point,
                    kv,
                    calls,
                    layers,
                    sum(serving["op_ms"].get(c, 0.0) for c in calls),
                    sum(base["op_ms"].get(c, 0.0) for c in calls)
                    if base and all(c in base["op_ms"] for c in calls)
                    else None,
                    {
                        name: t["step_ms"]
                        for name, t in (("torch", torch_t), ("baseline", base), ("serving", serving))
                        if t is not None
                    },
                    serving.get("vs_torch"),
                )
            )
    return StepMeasurement(
        str((doc.get("config") or {}).get("name")), str(doc.get("gpu")), tuple(effects), tuple(other)
    )


@dataclass(frozen=True)
class StepSuggestion:
    """A `bench --model` invocation whose decode step calls the promoted kernel's bucket (model None:
    none of the presets at the points tried does)."""

    model: Optional[str]
    point: Optional[str]
    kv: Optional[str]
    calls: Tuple[str, ...] = field(default_factory=tuple)


def _target_points(cfg: Dict[str, Any]) -> List[str]:
    """A run's decode-step points as BxCTX: a workload's weighted points heaviest first (`run --workload`),
    else its `target_points`."""
    weights = cfg.get("target_weights")
    if isinstance(weights, list) and weights:
        ranked = sorted(weights, key=lambda w: -float(w[3]))
        return list(dict.fromkeys(f"{int(b)}x{int(c)}" for _, b, c, _ in ranked))
    return [str(pt) for pt in parse_points(str(cfg.get("target_points") or "32x8192"))]


def suggest_step(run, pk: PromotedKernel) -> StepSuggestion:
    """The run's target model and points first (`run --target-model`), then each preset at
    SUGGESTED_POINTS: the first step that calls (op, bucket) of the promotion in bf16."""
    pr = pk.promotion
    if pr.dtype != "bfloat16":  # the model step is bf16 throughout
        return StepSuggestion(None, None, None)
    tries: List[Tuple[str, ModelConfig, str]] = []
    cfg = run.config
    if isinstance(cfg.get("target_model"), dict):
        try:
            m = ModelConfig.from_mapping(cfg["target_model"])
            name = m.name if PRESETS.get(m.name) == m else f"{m.name}.json"  # a config file keeps its own name
            tries += [(name, m, pt) for pt in _target_points(cfg)]
        except ModelConfigError:
            pass  # a target the ledger recorded but this version cannot read: the presets below still apply
    tries += [(name, m, pt) for name, m in PRESETS.items() for pt in SUGGESTED_POINTS]
    for name, m, pt in tries:
        [point] = parse_points(pt)
        for kv in ("bf16", "int8"):
            calls = tuple(
                c.label
                for c in step_op_calls(m, point.batch, point.context, kv)
                if c.op == pr.op and c.bucket == pr.bucket
            )
            if calls:
                return StepSuggestion(name, pt, kv, calls)
    return StepSuggestion(None, None, None)


def _step_command(s: StepSuggestion, out: str) -> str:
    kv = "bf16,int8" if s.kv == "int8" else "bf16"
    return (
        f"kernel-agent bench --model {shlex.quote(s.model or 'llama-3-8b')} --points {s.point or '32x8192'} "
        f"--kv {kv} --stacks torch,baseline,serving --out {shlex.quote(out)}"
    )


def step_section(
    run, pk: PromotedKernel, doc: Optional[Dict[str, Any]], doc_path: Optional[str], rerun: str
) -> List[str]:
    lines = ["", "### Decode step", ""]
    doc_name = os.path.basename(doc_path or "")  # given with the document
    if doc is not None:
        m = step_measurement(doc, pk)
        if m.effects:
            return lines + _step_effects(m, pk.promotion, doc_name)
        lines += [_step_not_served(m, pk.promotion, doc_name)]
    else:
        lines += [
            "No decode-step measurement is recorded for this kernel (`kernel-agent bench --model` was not "
            "given to this command)."
        ]
    return lines + _how_to_measure_step(run, pk, rerun)


def _step_effects(m: StepMeasurement, pr, doc_name: str) -> List[str]:
    """The table of what this kernel saves in each measured decode step, from the `bench --model` document."""
    lines = [
        f"`bench --model` on {md_word(m.model, extra=' ')} ({md_word(m.gpu, extra=' ')}; "
        f"`{doc_name}`), "
        f"one layer as a CUDA graph x the layers: the op calls this kernel served in the serving stack, "
        f"against the same calls in the baseline stack, and the whole step of each stack.",
        "",
        "| point | KV cache | calls | these calls, ms/step | baseline's, ms/step | saved ms/step | "
        "step ms: serving | baseline | torch | serving tokens/s vs torch |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in m.effects:
        base = e.baseline_calls_ms * e.layers if e.baseline_calls_ms is not None else None
        saved = e.saved_ms_per_step
        lines.append(
            f"| {e.point} | {e.kv} | {', '.join(e.calls)} | {e.kernel_ms * e.layers:.3f} | "
            f"{'' if base is None else f'{base:.3f}'} | {'' if saved is None else f'{saved:+.3f}'} | "
            + " | ".join(f"{e.step_ms[k]:.2f}" if k in e.step_ms else "" for k in ("serving", "baseline", "torch"))
            + f" | {fmt_x(e.tokens_vs_torch)} |"
        )
    if pr.replaced_candidate_id is not None:
        lines += [
            "",
            f"The baseline column is the baseline kernel, not candidate #{pr.replaced_candidate_id} "
            f"that this kernel replaces.",
        ]
    return lines


def _step_not_served(m: StepMeasurement, pr, doc_name: str) -> str:
    """Why the `bench --model` document given says nothing of this kernel: it did not serve the bucket, or the
    step makes no call of it."""
    if m.other:
        return (
            f"The `bench --model` document given (`{doc_name}`, "
            f"{md_word(m.model, extra=' ')} on {md_word(m.gpu, extra=' ')}) calls bucket `{pr.bucket}`, "
            f"but this kernel did not serve it there: "
            + "; ".join(md_word(o, extra=":, ") for o in m.other[:6])
            + ". It was measured without this kernel in the serving set."
        )
    return (
        f"The `bench --model` document given (`{doc_name}`, "
        f"{md_word(m.model, extra=' ')}) makes no `{pr.op}` call of bucket `{pr.bucket}`: its decode "
        f"step does not run this kernel."
    )


def _how_to_measure_step(run, pk: PromotedKernel, rerun: str) -> List[str]:
    """The commands that measure this kernel's effect on a decode step that calls it, on a GPU machine."""
    pr = pk.promotion
    s = suggest_step(run, pk)
    if s.model is None:
        lines = [
            "",
            f"No preset model's decode step at the usual points calls `{pr.op}` bucket `{pr.bucket}`; "
            f"to measure it, time a step of a model that calls it (its JSON config, see `bench --model`) "
            f"on a GPU machine with this pull request's serving set:",
        ]
        s = StepSuggestion("your-model.json", "32x8192", _kv_mode_calling(pr.op))
    else:
        lines = [
            "",
            f"{s.model} at batch x context {s.point} calls it ({', '.join(s.calls)}, {s.kv} KV cache); to "
            f"measure the effect, on a GPU machine with this pull request's serving set:",
        ]
    return lines + ["", "```bash", _step_command(s, "step.json"), rerun + " --model-step step.json", "```"]


def _kv_mode_calling(op: str) -> str:
    """The KV cache mode whose decode step calls `op` (the first mode where both do, or none does)."""
    model = next(iter(PRESETS.values()))
    modes = [kv for kv in KV_MODES if any(c.op == op for c in step_op_calls(model, 32, 8192, kv))]
    return modes[0] if len(modes) == 1 else KV_MODES[0]


# -- the commands that reproduce each figure and verdict ----------------------------------------------


def _serving_file_holds(pk: PromotedKernel, later: bool, branch: RunBranch) -> bool:
    """Whether kernels/serving/ (on the run's branch, else in this checkout's serving set) holds the
    promoted kernel: not when a later promotion of the run replaced it or it was demoted; without a
    branch, only when the file there has the candidate's source."""
    if later or pk.promotion.demoted_at is not None or pk.promotion.candidate_id in branch.configs:
        return False  # (a configuration is an entry of the manifest, rebuilt from its base: no file to name)
    if branch.has_branch:
        return True  # the branch's commit of this promotion wrote it, and nothing later in the run replaced it
    from ...harness.serving.serving import kernel_file_name, serving_dir  # here: as above

    pr = pk.promotion
    path = serving_dir() / kernel_file_name(pr.op, pr.bucket, pr.dtype, pr.gpu_name)
    try:
        return path.read_text().rstrip("\n") == pk.candidate.source.rstrip("\n")  # type: ignore[union-attr]
    except OSError:
        return False


def reproduce_section(led, run, pk: PromotedKernel, later: bool, branch: RunBranch, ledger_flag: str) -> List[str]:
    """The exact commands behind the sections above: the sanitizer's verdict, the benchmark's timings
    (the shapes judged, in order) and the ledger's record."""
    from ...harness.serving.serving import kernel_file_name  # here: as above

    pr, c = pk.promotion, pk.candidate
    if c is None:
        return []
    serving_file = f"kernels/serving/{kernel_file_name(pr.op, pr.bucket, pr.dtype, pr.gpu_name)}"
    lines = ["", "### Reproduce", "", "```bash"]
    if branch.has_branch:
        lines.append(f"git switch {shlex.quote(branch.branch)}")  # type: ignore[arg-type]
    if _serving_file_holds(pk, later, branch):
        kernel = serving_file
    else:
        # the serving file holds what replaced it (a later promotion of the bucket, a demotion) or is gone, or
        # the promotion is a configuration the manifest records without a file
        kernel = f"candidate-{c.id}.py"
        held = (
            "the serving set records it as a configuration of its base, without a file"
            if c.id in branch.configs
            else "the serving set no longer holds it"
        )
        lines += [f"# the kernel as judged ({held}), from the ledger", extract_command(c.id, ledger_flag, kernel)]
    seed = seed_of(led, c.id)
    lines += [
        "# the sanitizer verdict: full mode, and the GPU checks on a machine with a CUDA GPU"
        + ("" if seed is not None else " (inputs from a fresh secret seed)"),
        f"kernel-agent sanitize --op {pr.op} {shlex.quote(kernel)}" + (f" --seed {seed}" if seed is not None else ""),
    ]
    if pk.result is not None:
        shapes = ";".join(f.shape_key for f in pk.result.figures)
        files = [kernel]
        if pr.replaced_candidate_id is not None:  # the incumbent was a promoted kernel: time it beside this one
            inc = f"candidate-{pr.replaced_candidate_id}.py"
            lines += [
                f"# the incumbent it replaces, candidate #{pr.replaced_candidate_id}, from the ledger",
                extract_command(pr.replaced_candidate_id, ledger_flag, inc),
            ]
            files.insert(0, inc)
        clocks = " and ".join(CLOCK_PHRASES[k] for k in pk.result.clocks.split("+"))
        lines += [
            f"# the timings ({pr.gpu_name}): beside the baseline and the torch anchor, interleaved; the "
            f"table above is on {clocks}",
            f"kernel-agent bench --op {pr.op} {' '.join(shlex.quote(f) for f in files)} --shapes "
            f"{shlex.quote(shapes)} --dtype {pr.dtype}",
        ]
    lines += [
        "# every check, every figure per shape and the diff, as recorded",
        f"kernel-agent show {c.id}{ledger_flag}",
    ]
    if branch.has_branch and branch.base:
        lines += [
            "# the change itself",
            f"git diff {branch.base[:12]} {shlex.quote(branch.branch or '')} -- kernels/serving/",
        ]
    lines.append("```")
    return lines


# -- the body --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullRequest:
    """What `pr` wrote: the body (markdown) and the plots beside it, the title, and the branch to open
    it from (None: the run has none)."""

    run_id: str
    title: str
    body_path: str
    plots: Tuple[str, ...]
    branch: RunBranch
    promotions: int

    def open_commands(self) -> List[List[str]]:
        """The commands that open it: push the branch, then `gh pr create` from it. Without a branch,
        first commit the serving set on one named after the run (the convention of branch mode)."""
        name: str = self.branch.branch if self.branch.has_branch else f"kernel-agent/{self.run_id}"  # type: ignore[assignment]
        gh = [
            "gh",
            "pr",
            "create",
            "--head",
            name,
            "--title",
            self.title,
            "--body-file",
            os.path.abspath(self.body_path),
        ]
        if self.branch.has_branch:
            return [["git", "push", "origin", name], gh]
        return [
            ["git", "switch", "-c", name],
            ["git", "add", "kernels/serving"],
            ["git", "commit", "-m", self.title],
            ["git", "push", "origin", name],
            gh,
        ]


def _title(run, kernels: Sequence[PromotedKernel]) -> str:
    parts = [
        f"{pk.promotion.op} {pk.promotion.bucket}"
        + (f" {fmt_x(pk.result.speedup)}" if pk.result is not None and pk.result.speedup is not None else "")
        for pk in kernels
    ]
    shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
    return f"kernel-agent {run.id}: promote {shown}"


def write_pr(
    led, run, out_dir: str, ledger_flag: str = "", model_step: Optional[str] = None, plan: Optional[KvPlan] = None
) -> Optional[PullRequest]:
    """Write the body (out_dir/pr.md) and the plots; None when the run promoted nothing (nothing written).
    ledger_flag: ' --ledger PATH' for the commands, or '' for the default ledger. plan: a KV-cache plan to show."""
    results = candidate_results(led.figures(run_id=run.id))
    kernels = promoted_kernels(led, run, results)
    if not kernels:
        return None
    doc = load_model_step(model_step) if model_step else None
    os.makedirs(out_dir, exist_ok=True)
    branch = run_branch(run)
    title = _title(run, kernels)
    lines = _intro(run, title, len(kernels)) + _field_failure_warning(led, kernels) + branch.describe() + [""]
    lines += _kernels_table(kernels)
    plots = _plots(run, results, out_dir, [pk.promotion for pk in kernels])
    if plots:
        lines += [
            "Plots to attach (beside this file): "
            + "; ".join(f"`{os.path.basename(p)}`, {alt}" for alt, p in plots)
            + ".",
            "",
        ]
    rerun = f"kernel-agent pr {run.id}{ledger_flag}"
    for i in range(len(kernels)):
        lines += _kernel_section(led, run, kernels, i, doc, model_step, rerun, branch, ledger_flag)
    if plan is not None:
        lines += ["## KV-cache plan", ""] + plan.summary_lines() + [""]
    lines += [
        "---",
        "",
        f"Written by `{rerun}`. Every candidate and benchmark of the run: "
        f"`kernel-agent report {run.id}{ledger_flag}`; the run: `kernel-agent show {run.id}{ledger_flag}`.",
    ]
    path = os.path.join(out_dir, BODY)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return PullRequest(run.id, title, path, tuple(p for _, p in plots), branch, len(kernels))


def _intro(run, title: str, n: int) -> List[str]:
    """The title and the paragraph that says what the run was, on which stack, and where the figures come from."""
    v = run.versions
    stack = ", ".join(
        f"{name} {v[key]}"
        for key, name in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"), ("driver", "driver"))
        if v.get(key)
    )
    return [
        f"# {title}",
        "",
        f"Run `{run.id}` ({run.proposer} proposer, ops {run.ops}, on {run.gpu_name or 'no GPU'}; {stack}) "
        f"promoted {n} kernel{'s' if n != 1 else ''} into the serving set. Each passed the sanitizer and the "
        f"promotion rule, whose decision is quoted below. Every figure is a judged figure of the run's ledger: "
        f"the candidate against the incumbent and the torch anchor timed beside it in the same benchmark, on "
        f"the clock named (`kernel-agent show` and `kernel-agent report` print the same numbers).",
        "",
    ]


def _field_failure_warning(led, kernels: Sequence[PromotedKernel]) -> List[str]:
    """A warning with each unresolved field failure of a kernel the pull request promotes, or of a bucket it
    promotes into (the kernel it replaces failed there): `gate` fails on them until a demotion resolves them."""
    touched = [(pk.promotion, pk.candidate.source_hash if pk.candidate else None) for pk in kernels]
    rows = [
        r
        for r in led.field_failures(unresolved_only=True)
        if any(
            r.source_hash == h
            or (r.op, r.bucket, r.dtype, gpu_slug(r.gpu)) == (p.op, p.bucket, p.dtype, gpu_slug(p.gpu_name))
            for p, h in touched
        )
    ]
    if not rows:
        return []
    return [
        f"> **Warning: {len(rows)} unresolved field failure(s)** of the kernels or buckets this pull request "
        "touches: the serving guard retired these on real inputs, and `kernel-agent gate` fails until "
        "`kernel-agent demote` of the bucket resolves them.",
        ">",
        *[f"> - {field_failure_line(r, markdown=True)}" for r in rows],
        "",
    ]


def _kernels_table(kernels: Sequence[PromotedKernel]) -> List[str]:
    """One row per promoted kernel: what it replaces, its speedup, the clock and FpSan's equivalence."""
    lines = ["| kernel | replaces | speedup | clock | FpSan |", "|---|---|---:|---|---|"]
    for pk in kernels:
        pr, c, res = pk.promotion, pk.candidate, pk.result
        eq = {True: "equivalent", False: "not equivalent", None: "undecided"}[c.fpsan_equivalent if c else None]
        lines.append(
            f"| `{pr.op}` `{pr.bucket}` {pr.dtype} (#{pr.candidate_id}) | {pk.replaced_what} | "
            f"{fmt_x(res.speedup) if res else ''} | "
            f"{res.clocks.replace('event', 'events') if res else ''} | {eq} |"
        )
    return lines + [""]


def _kernel_section(
    led,
    run,
    kernels: Sequence[PromotedKernel],
    i: int,
    doc: Optional[Dict[str, Any]],
    model_step: Optional[str],
    rerun: str,
    branch: RunBranch,
    ledger_flag: str,
) -> List[str]:
    """The section of kernels[i]: its timings, verdict, diff, decode step and how to reproduce it."""
    pk = kernels[i]
    pr = pk.promotion
    # a later promotion of the same op, bucket, dtype and GPU in this run replaces this one in the serving set
    later = any(
        (o.promotion.op, o.promotion.bucket, o.promotion.dtype, o.promotion.gpu_name)
        == (pr.op, pr.bucket, pr.dtype, pr.gpu_name)
        for o in kernels[i + 1 :]
    )
    lines = promotion_header(pk)
    if pk.candidate is None:
        return lines + ["The ledger holds no candidate for this promotion: no timings, verdict or diff to show.", ""]
    lines += timings_section(pk) + verdict_section(led, pk) + diff_section(pk)
    lines += step_section(run, pk, doc, model_step, rerun)
    return lines + reproduce_section(led, run, pk, later, branch, ledger_flag) + [""]


def gh_unavailable() -> Optional[str]:
    """Why the GitHub CLI cannot open a pull request here (None: it can)."""
    if shutil.which("gh") is None:
        return "the GitHub CLI (gh) is not installed"
    try:
        r = subprocess.run(["gh", "auth", "status"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`gh auth status` did not answer: {e}"
    if r.returncode != 0:
        return "gh is not signed in (`gh auth login`)"
    return None


def _missing_branch(b: RunBranch, repo: Optional[str]) -> Optional[str]:
    """Why the run's branch cannot be pushed from here (None: it is in the repository it was made in): a
    clone of the repository holds the run's commits, say, but not the branch the run made elsewhere."""
    if not b.has_branch:
        return None
    if repo is None:
        return f"the branch {b.branch} was made in {b.repo}, which is not on this machine"
    if shutil.which("git") is None:
        return "git is not installed"
    r = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", f"refs/heads/{b.branch}"], cwd=repo, capture_output=True, timeout=60
    )
    return None if r.returncode == 0 else f"the branch {b.branch} is not in {repo} (the run made it elsewhere)"


def _shell(cmd: Sequence[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)


def cmd_pr(args) -> int:
    led = open_ledger(args, read=True)
    run = led.get_run(args.run)
    if run is None:
        raise UsageError(f"no run {args.run!r} in the ledger")
    ledger_flag = f" --ledger {shlex.quote(args.ledger)}" if args.ledger and args.ledger != default_ledger() else ""
    out = args.out or os.path.join("runs", run.id, "pr")
    check_writable(out, "--out", folder=True)
    plan = load_plan(args.kv_plan) if args.kv_plan else None  # a bad file: KvPlanError, one line
    pr = write_pr(led, run, out, ledger_flag, args.model_step, plan)
    if pr is None:
        # no body: a pull request needs a change, and the run made none (its report says what it tried)
        ui.line(
            f"run {run.id} promoted nothing: no pull request to write (kernel-agent report {run.id} summarizes the run)"
        )
        return 1
    ui.line(
        f"wrote {pr.body_path}"
        + (
            f" and {len(pr.plots)} plot(s) to attach: " + ", ".join(os.path.basename(p) for p in pr.plots)
            if pr.plots
            else ""
        )
    )
    ui.line(f"title: {pr.title}")
    ui.line(branch_line(pr.branch))
    cmds = pr.open_commands()
    cwd = pr.branch.repo if pr.branch.repo and os.path.isdir(pr.branch.repo) else None
    where = cwd or "the repository"
    missing = _missing_branch(pr.branch, cwd)
    if missing:
        ui.line(missing)
    why = None
    if args.open:
        why = (gh_unavailable() or missing) if pr.branch.has_branch else "the run has no branch to open it from"
    if not args.open or why:
        ui.line(f"to open it, in {where}:")
        for c in cmds:
            ui.line(f"  {_shell(c)}")
        if why:  # asked to open it and it was not: not a success
            ui.error(f"pull request not opened: {why}")
            return 1
        return 0
    for c in cmds:
        try:
            r = subprocess.run(c, cwd=cwd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            ui.error(f"{_shell(c[:3])}: {e}")
            return 1
        if r.returncode != 0:
            msg = (r.stderr.strip() or r.stdout.strip() or f"exit status {r.returncode}").splitlines()[-1]
            ui.error(f"{_shell(c[:3])} failed: {msg}")
            return 1
        if c[0] == "gh" and r.stdout.strip():
            ui.line(f"opened: {r.stdout.strip().splitlines()[-1]}", style="bold green")
    return 0


def branch_line(b: RunBranch) -> str:
    if b.has_branch:
        return f"branch: {b.branch}" + (f" ({b.commits} commit{'s' if b.commits != 1 else ''})" if b.commits else "")
    if b.mode == "in_place":
        return f"no branch: the run wrote the serving set in place ({b.serving_dir})"
    return "no branch: the ledger records none for this run; its promotions were written in place"


__all__ = [
    "register",
    "cmd_pr",
    "write_pr",
    "PullRequest",
    "RunBranch",
    "run_branch",
    "StepEffect",
    "StepMeasurement",
    "StepSuggestion",
    "load_model_step",
    "step_measurement",
    "suggest_step",
    "gh_unavailable",
    "BODY",
]

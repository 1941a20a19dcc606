"""Where promotions go, and the one path by which `run` and `promote` write the serving set.

A promotion changes the serving set (harness/serving/serving.py): a kernel file and the manifest. Where that
change lands is the serving target of the run (or of the `promote` command, which is a run of its own):

  - branch: the serving folder is tracked in a git repository. The run's changes are committed on a
    branch of their own, `kernel-agent/<run-id>`, through a worktree kept under the repository's git
    directory. One commit per promotion, whose message is the rule's decision; a dispatch choice
    (torch or the baseline serves a bucket, harness/serving/dispatch.py) is a commit of its own. The user's
    checkout (files, index, HEAD, current branch) is never touched, so a run started on a main
    checkout cannot change it, and a night's promotions arrive as a reviewable branch. A resumed run
    continues its branch; the worktree is removed when the run ends, and a branch that received no
    commit is deleted again.
  - in place: outside a git repository, for a serving folder git does not track (a scratch copy named
    by KERNEL_AGENT_SERVING_DIR, as tests and scripts/gpu_throughput.sh use), or when asked
    (`--in-place`, `in_place = true` in the [run] config): the folder is written as it is.
  - none: a run without a GPU benchmarks nothing and so promotes nothing; it only reads the serving
    set (its incumbents are the proposer's starting points) and opens no branch.

Git is used through its command line (no library): every call runs in the worktree or names the
repository explicitly, and none writes the user's index or checkout.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ..harness.bench.promotion import Judgement
from ..harness.ledger.ledger import Ledger, RunNotesRecord
from ..harness.manifest import ManifestEntry
from ..harness.serving import serving, serving_install
from ..harness.serving.dispatch import Choice, record_choices
from ..sanitizer.canonical import JudgedText

BRANCH, IN_PLACE, NONE = "branch", "in_place", "none"
BRANCH_PREFIX = "kernel-agent/"
WORKTREES = "kernel-agent-worktrees"  # under the repository's common git directory
# Who commits when the repository configures no identity (an unattended machine often has none).
FALLBACK_NAME, FALLBACK_EMAIL = "kernel-agent", "kernel-agent@localhost"
# Variables a git hook exports: inherited, they would point every call at the hook's repository and index.
_GIT_LOCATION_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_PREFIX",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
)


class PublishError(Exception):
    """The serving target cannot be used (git missing or failing): one line."""


# --------------------------------------------------------------------------------------
# git


def _git_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_VARS}


def _git(
    cwd: Path, *args: str, check: bool = True, stdin: Optional[str] = None, env: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(
            ["git", *args],
            cwd=str(cwd),
            input=stdin,
            capture_output=True,
            text=True,
            env=env or _git_env(),
            timeout=120,
        )
    except FileNotFoundError:
        raise PublishError(
            "git is not installed: install it, or pass --in-place to write the serving set in place"
        ) from None
    except subprocess.TimeoutExpired:
        raise PublishError(f"git {args[0]} in {cwd} did not finish in 120s") from None
    if check and p.returncode != 0:
        msg = (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()[-1]
        raise PublishError(f"git {args[0]} failed in {cwd}: {msg}")
    return p


def _out(cwd: Path, *args: str) -> str:
    return _git(cwd, *args).stdout.strip()


def _existing_ancestor(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.is_dir():
            return p
    return Path("/")


def _dot_git_above(path: Path) -> Optional[Path]:
    """The first `.git` (directory or file) in `path` or its parents: how a repository is recognised
    when git itself is not there to ask."""
    for p in (path, *path.parents):
        if (p / ".git").exists():
            return p
    return None


# --------------------------------------------------------------------------------------
# the target


@dataclass(frozen=True)
class TargetInfo:
    """Where a run's serving-set changes went, as the ledger records it (the run's notes, key 'serving').

    mode: 'branch' | 'in_place' | 'none'. serving_dir: the folder the run reads and writes (in branch
    mode the worktree's copy of the serving folder). source_dir: the serving folder the run was pointed
    at. why: what chose the mode, in words. Branch mode only: repo (the work tree's top level), branch,
    worktree, base (the commit the branch started from), commits (on the branch since base). configs: the
    candidates promoted as a configuration, recorded in the manifest without a kernel file of their own."""

    mode: str
    serving_dir: str
    source_dir: str
    why: str
    repo: Optional[str] = None
    branch: Optional[str] = None
    worktree: Optional[str] = None
    base: Optional[str] = None
    commits: int = 0
    configs: Tuple[int, ...] = ()

    def describe(self) -> str:
        """The run's line about where promotions go."""
        if self.mode == BRANCH:
            return f"promotions go to branch {self.branch} (worktree {self.worktree})"
        if self.mode == IN_PLACE:
            return f"promotions are written in place to {self.serving_dir} ({self.why})"
        return f"nothing is promoted ({self.why}); the serving set is read from {self.serving_dir}"

    def outcome(self) -> str:
        """What a finished run left, for its summary and `show`."""
        if self.mode == BRANCH:
            n = f"{self.commits} commit{'s' if self.commits != 1 else ''}"
            if not self.commits:
                return f"serving set: no change, so no branch (promotions would have gone to {self.branch})"
            return (
                f"serving set: branch {self.branch}, {n} on {(self.base or '')[:12]} in {self.repo} "
                f"(review: git log -p {(self.base or '')[:12]}..{self.branch})"
            )
        if self.mode == IN_PLACE:
            return f"serving set: written in place to {self.serving_dir} ({self.why})"
        return f"serving set: not written ({self.why})"

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TargetInfo":
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["configs"] = tuple(kw.get("configs") or ())
        return cls(**kw)


def recorded_target(notes: RunNotesRecord) -> Optional[TargetInfo]:
    """The serving target a run recorded in its notes, or None (a run from before targets)."""
    d = notes.serving
    return TargetInfo.from_json(d) if isinstance(d, dict) and d.get("mode") else None


@dataclass(frozen=True)
class TargetPlan:
    """Where a run will write, decided before it starts (so that git missing is an error before the
    ledger records anything). Branch mode: repo is the work tree's top level, rel the serving folder's
    path in it, git_dir the common git directory (where worktrees are kept)."""

    mode: str
    source_dir: Path
    why: str
    repo: Optional[Path] = None
    rel: Optional[str] = None
    git_dir: Optional[Path] = None

    def open(self, run_id: str, previous: Optional[TargetInfo] = None) -> "ServingTarget":
        """The target for run `run_id`: in branch mode its worktree exists on return (created, or the
        one a killed session of the run left behind). `previous`: what an earlier session of the same run
        recorded (a resume keeps its base)."""
        if self.mode != BRANCH:
            info = TargetInfo(self.mode, str(self.source_dir), str(self.source_dir), self.why)
            return ServingTarget(info, self)
        repo, rel, wt = Path(str(self.repo)), str(self.rel), Path(str(self.git_dir)) / WORKTREES / run_id
        branch = BRANCH_PREFIX + run_id
        _git(repo, "check-ref-format", "--branch", branch)
        _git(repo, "worktree", "prune")  # registrations of worktrees whose folder is gone
        created = False
        if wt.exists():
            # a session of this run was killed before it could remove its worktree: reuse it, without
            # what that session wrote and did not commit (the ledger has no record of it either)
            on = _git(wt, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
            if on != branch:
                raise PublishError(
                    f"{wt} exists but is not the worktree of branch {branch}: remove it "
                    f"(git worktree remove --force {wt}) or pass --in-place"
                )
            _git(wt, "reset", "-q", "--hard")
            _git(wt, "clean", "-q", "-fd", "--", rel)
        elif _git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False).returncode == 0:
            _git(repo, "worktree", "add", "-q", str(wt), branch)  # a resume: the branch goes on
        else:
            wt.parent.mkdir(parents=True, exist_ok=True)
            _git(repo, "worktree", "add", "-q", "-b", branch, str(wt), "HEAD")
            created = True
        if created:
            base = _out(wt, "rev-parse", "HEAD")
        elif previous is not None and previous.base and previous.branch == branch:
            base = previous.base
        else:
            base = _out(repo, "merge-base", "HEAD", branch)
        info = TargetInfo(
            BRANCH,
            str(wt / rel),
            str(self.source_dir),
            self.why,
            repo=str(repo),
            branch=branch,
            worktree=str(wt),
            base=base,
        )
        return ServingTarget(info, self)


def plan_target(in_place: bool = False, writes: bool = True, dir: Optional[Path] = None) -> TargetPlan:
    """Decide where a run writes the serving set in `dir` (default serving.serving_dir()).

    In place when asked (`in_place`), when the folder is not in a git work tree, or git does not track
    it at HEAD; 'none' when the run writes nothing (`writes` False: no GPU); else a branch. PublishError
    when the folder is in a repository but git is not installed (one line)."""
    d = Path(dir if dir is not None else serving.serving_dir()).resolve()
    if not writes:
        return TargetPlan(NONE, d, "no GPU: nothing is benchmarked")
    if in_place:
        return TargetPlan(IN_PLACE, d, "--in-place")
    if shutil.which("git") is None:
        top = _dot_git_above(d)
        if top is not None:
            raise PublishError(
                f"the serving folder {d} is in the git repository {top}, but git is not installed: "
                f"install git, or pass --in-place to write the serving set in place"
            )
        return TargetPlan(IN_PLACE, d, "not in a git repository")
    where = _existing_ancestor(d)
    p = _git(where, "rev-parse", "--show-toplevel", check=False)
    if p.returncode != 0 or not p.stdout.strip():
        return TargetPlan(IN_PLACE, d, "not in a git repository")
    repo = Path(p.stdout.strip()).resolve()
    try:
        rel = d.relative_to(repo).as_posix()
    except ValueError:  # inside the repository's git directory, e.g. a worktree's own folder
        return TargetPlan(IN_PLACE, d, f"not in the work tree of {repo}")
    if rel == ".":
        return TargetPlan(IN_PLACE, d, f"the serving folder is the top of {repo}, not a folder in it")
    if _git(repo, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False).returncode != 0:
        return TargetPlan(IN_PLACE, d, f"{repo} has no commit yet")
    if not _out(repo, "ls-tree", "-d", "--name-only", "HEAD", "--", rel):
        return TargetPlan(IN_PLACE, d, f"not tracked by git in {repo}")
    git_dir = Path(_out(repo, "rev-parse", "--git-common-dir"))
    git_dir = (repo / git_dir).resolve() if not git_dir.is_absolute() else git_dir.resolve()
    return TargetPlan(BRANCH, d, f"{rel} is tracked in {repo}", repo=repo, rel=rel, git_dir=git_dir)


class ServingTarget:
    """The serving set a run reads and writes (`dir`), and how its changes are kept (`commit`). Open for
    the length of the run; `close` ends it (in branch mode: removes the worktree)."""

    def __init__(self, info: TargetInfo, plan: TargetPlan):
        self.info = info
        self._plan = plan
        self.closed = False

    @classmethod
    def in_place(cls, dir: Path | str, why: str = "in place") -> "ServingTarget":
        """A target that writes `dir` as it is (a loop built directly, as tests do)."""
        d = Path(dir)
        return cls(TargetInfo(IN_PLACE, str(d), str(d), why), TargetPlan(IN_PLACE, d, why))

    @property
    def dir(self) -> Path:
        return Path(self.info.serving_dir)

    def shown(self, file: str) -> str:
        """A file of the serving set as a reviewer finds it: its path in the repository (branch mode),
        else on disk."""
        return f"{self._plan.rel}/{file}" if self.info.mode == BRANCH else str(self.dir / file)

    @property
    def writes(self) -> bool:
        return self.info.mode != NONE and not self.closed

    def _identity_env(self, wt: Path) -> Dict[str, str]:
        env = _git_env()
        for key, var, fallback in (("user.name", "NAME", FALLBACK_NAME), ("user.email", "EMAIL", FALLBACK_EMAIL)):
            if not _git(wt, "config", key, check=False).stdout.strip():
                env.setdefault(f"GIT_AUTHOR_{var}", fallback)
                env.setdefault(f"GIT_COMMITTER_{var}", fallback)
        return env

    def commit(self, message: str) -> Optional[str]:
        """Commit what changed in the serving folder with `message`; the new commit's hash, or None in
        place or when nothing changed."""
        if self.info.mode != BRANCH:
            return None
        if self.closed:
            raise PublishError(f"the worktree of {self.info.branch} was already removed")
        wt, rel = Path(self.info.worktree or ""), str(self._plan.rel)
        # exactly what the serving set is made of (its manifest and kernel files, and the tracked files it
        # deleted), so that a bytecode cache or a temporary file written beside them never enters the branch
        names = {
            p.name for p in self.dir.iterdir() if p.is_file() and (p.suffix == ".py" or p.name == serving.MANIFEST_NAME)
        }
        names |= {
            Path(f).name for f in _out(wt, "ls-files", "--", rel).splitlines() if Path(f).parent.as_posix() == rel
        }
        _git(wt, "add", "-A", "--", *sorted(f"{rel}/{n}" for n in names))
        if _git(wt, "diff", "--cached", "--quiet", check=False).returncode == 0:
            return None
        # --no-verify: the change was sanitized in full and benchmarked before it got here, which is more
        # than a commit hook checks; --no-gpg-sign: an unattended run cannot answer a passphrase prompt
        _git(wt, "commit", "-q", "--no-verify", "--no-gpg-sign", "-F", "-", stdin=message, env=self._identity_env(wt))
        sha = _out(wt, "rev-parse", "HEAD")
        self.info = dataclasses.replace(self.info, commits=self.info.commits + 1)
        return sha

    def close(self) -> TargetInfo:
        """End the target: in branch mode remove the worktree (the branch stays: it is the run's
        result), and delete the branch if it holds no commit of the run (it would only name the base; a
        resume creates it again). Returns the final record (with the number of commits on the branch)."""
        if self.closed or self.info.mode != BRANCH:
            self.closed = True
            return self.info
        repo, wt, branch = Path(self.info.repo or ""), Path(self.info.worktree or ""), self.info.branch or ""
        self.closed = True
        _git(repo, "worktree", "remove", "--force", str(wt))
        count = int(_out(repo, "rev-list", "--count", f"{self.info.base}..refs/heads/{branch}"))
        if count == 0:
            _git(repo, "branch", "-q", "-D", branch)
        self.info = dataclasses.replace(self.info, commits=count)
        return self.info


# --------------------------------------------------------------------------------------
# the promotion


@dataclass(frozen=True)
class PromotionRequest:
    """A candidate the rule chose to promote for one (op, bucket, dtype, GPU). judgement: the rule
    applied to its benchmark (decision, shapes, times); margin: the rule's margin; note: the promoter's
    own words (`promote --reason`), added to the recorded reason."""

    run_id: str
    op: str
    bucket: str
    dtype: str
    gpu_name: str
    candidate_id: int
    label: str
    # the text the sanitizer and the benchmark judged, and its hash: what is installed, or nothing is
    judged: JudgedText
    judgement: Judgement
    margin: float
    versions: Dict[str, Any]
    note: str = ""

    @property
    def reason(self) -> str:
        decision = self.judgement.decision
        return (decision.reason if decision else "") + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True)
class Published:
    """A promotion written: its manifest entry, the kernel file (the manifest, for a configuration recorded
    without a file of its own), the ledger's promotion id, and the commit on the run's branch (None in place)."""

    entry: ManifestEntry
    path: Path
    promotion_id: int
    commit: Optional[str]
    reason: str


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def promotion_message(
    req: PromotionRequest, replaced: Optional[ManifestEntry], file: str, config: Optional[str] = None
) -> str:
    """The commit message of a promotion: the rule's decision (gain, noise, margin, shapes) and the
    candidate, so that the branch's log reads as the night's verdicts. `config`: for a configuration
    recorded in the manifest without a file, what it tunes and how (serving.describe_entry)."""
    j = req.judgement
    d = j.decision
    if d is None:
        raise ValueError(f"candidate #{req.candidate_id} has no decision of the rule")
    was = (
        f"the promoted kernel {serving.entry_name(replaced)} (candidate #{replaced.candidate_id})"
        if replaced
        else "the baseline"
    )
    clocks = sorted(set(j.kinds))
    lines = [
        f"Promote candidate #{req.candidate_id} for {req.op} {req.bucket} {req.dtype} ({_pct(d.gain)} faster)",
        "",
        f"Candidate #{req.candidate_id} ({req.label}) replaces {was} on {req.gpu_name}.",
        f"Decision: {req.reason}",
        f"gain {_pct(d.gain)}, noise {_pct(d.spread)}, margin {_pct(req.margin)}",
        f"time: {j.incumbent_ms:.4f} ms -> {j.candidate_ms:.4f} ms (mean over the shapes, against {j.against}; "
        f"{'/'.join(clocks)} clock)",
        f"shapes: {'; '.join(j.shapes)}",
        f"file: {file}" if config is None else f"configuration (in {file}): {config}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in sorted(req.versions.items())),
        f"run: {req.run_id}; details: kernel-agent show {req.candidate_id}",
    ]
    return "\n".join(lines) + "\n"


def publish_promotion(target: ServingTarget, ledger: Ledger, req: PromotionRequest) -> Published:
    """Promote: install the kernel into the target's serving set, commit it there (branch mode), and
    record the promotion in the ledger, in that order, so that the ledger never names a promotion the
    serving set does not hold."""
    if not target.writes:
        raise PublishError(f"the serving target of run {req.run_id} takes no promotion ({target.info.why})")
    j = req.judgement
    if j.decision is None or not j.decision.promote:
        raise ValueError(f"candidate #{req.candidate_id} was not chosen by the rule: nothing to promote")
    replaced = serving.promoted(req.op, req.bucket, req.dtype, req.gpu_name, dir=target.dir)
    entry = serving_install.install(
        req.op,
        req.bucket,
        req.dtype,
        req.gpu_name,
        req.judged,
        req.candidate_id,
        j.decision.gain,
        req.reason,
        req.versions,
        dir=target.dir,
        shapes=list(j.shapes),
    )
    if entry.file:
        path, config = target.dir / entry.file, None
    else:  # a configuration: the manifest entry is the whole change
        path, config = target.dir / serving.MANIFEST_NAME, serving.describe_entry(entry)
    if config is not None:
        target.info = dataclasses.replace(target.info, configs=(*target.info.configs, req.candidate_id))
    sha = target.commit(promotion_message(req, replaced, target.shown(path.name), config))
    promo = ledger.record_promotion(
        run_id=req.run_id,
        op=req.op,
        bucket=req.bucket,
        dtype=req.dtype,
        gpu_name=req.gpu_name,
        candidate_id=req.candidate_id,
        new_ms=j.candidate_ms,
        old_ms=j.incumbent_ms,
        gain=j.decision.gain,
        spread=j.decision.spread,
        reason=req.reason,
        versions=req.versions,
    )
    return Published(entry, path, promo.id, sha, req.reason)


def choice_message(c: Choice) -> str:
    """The commit message of a dispatch choice (what serves a bucket, from measurements side by side)."""
    served = {serving.TORCH: f"torch ({c.torch_label.split(':', 1)[-1]})", serving.BASELINE: "the baseline"}[c.impl]
    return (
        f"Serve {c.op} {c.bucket} {c.dtype} by {served}\n\n{c.reason}.\n"
        f"shapes: {'; '.join(s.shape for s in c.shapes)}\nGPU: {c.gpu}\n"
    )


def publish_choices(
    target: ServingTarget, ledger: Ledger, choices: Iterable[Choice]
) -> List[Tuple[Choice, Optional[ManifestEntry]]]:
    """Record dispatch choices in the target's manifest (harness.serving.dispatch.record_choices) and commit each
    one that changed it (branch mode): the choices travel with the promotions they are measured against."""
    if not target.writes:
        raise PublishError(f"the serving target takes no dispatch choice ({target.info.why})")
    out = []
    for c, entry in record_choices(choices, dir=target.dir, led=ledger):
        if entry is not None:
            target.commit(choice_message(c))
        out.append((c, entry))
    return out


__all__ = [
    "BRANCH",
    "IN_PLACE",
    "NONE",
    "BRANCH_PREFIX",
    "PublishError",
    "TargetInfo",
    "TargetPlan",
    "ServingTarget",
    "plan_target",
    "recorded_target",
    "PromotionRequest",
    "Published",
    "promotion_message",
    "publish_promotion",
    "choice_message",
    "publish_choices",
]

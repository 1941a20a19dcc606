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
import time

import pytest

from kernel_agent.agent import loop as loop_mod
from kernel_agent.agent.run_config import RunConfig
from kernel_agent.agent.work import RunEvents
from kernel_agent.harness.ledger.ledger import CandidateStatus, Ledger, RunStatus
from kernel_agent.sanitizer.canonical import as_written, read_judged
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
    cfg = RunConfig(
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
        events=events or RunEvents(),
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
        source_hash=read_judged(path).hash,
    )


def _times_out_in_full(path, op, mode):
    if mode != "full":
        return _passes(path, op, mode)
    v = Verdict(
        path,
        op,
        mode,
        checks=[CheckOutcome("static_gate", "passed"), CheckOutcome("near_serving", "failed", TIME_LIMIT)],
        source_hash=read_judged(path).hash,
    )
    v.stop_for_time_limit(TIME_LIMIT.removeprefix("not verified: time limit "))  # as the judge says it
    assert v.error == TIME_LIMIT
    return v


# -- 1. a time limit is not a verdict -------------------------------------------------------------


def test_a_candidate_stopped_by_the_time_limit_stays_open_and_a_later_run_judges_it(tmp_path):
    db = tmp_path / "l.db"
    lines = []
    first = _cpu_run(
        tmp_path,
        db,
        _times_out_in_full,
        events=RunEvents(candidate=lambda label, st, detail: lines.append((st, detail))),
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


def test_a_model_the_endpoint_does_not_serve_is_refused_before_the_run(tmp_path):
    """The pre-flight check lists the endpoint's models: a mistyped model name is one line and exit 2, with
    nothing recorded (no ledger is created), and no model call made."""
    from openai_stub import Stub

    stub = Stub([{"reply": "never asked"}], models=["scripted", "other"])
    port = stub.start()
    try:
        url = f"http://127.0.0.1:{port}/v1"
        args = ["run", "--proposer", "model", "--base-url", url, "--ledger", str(tmp_path / "l.db")]
        rc, _, err = _cli(args + ["--model", "scripted-typo"])
        assert rc == 2 and err.count("\n") == 1, err
        assert "model 'scripted-typo' is not served by" in err and "other, scripted" in err
        assert not (tmp_path / "l.db").exists() and stub.requests == []
    finally:
        stub.stop()


@pytest.mark.parametrize("budget", [10, 2])
def test_a_run_whose_model_fails_on_every_call_ends_early_as_failed(tmp_path, monkeypatch, capsys, budget):
    """With a budget of 10 it stops after MODEL_FAILURES_LIMIT calls; with a budget of 2 the failed calls used the
    budget before that, and the run said `finished: candidate budget reached (2)`, exit 0, with no candidate."""
    from kernel_agent.agent.cli.run import _print_run_summary
    from openai_stub import Stub

    stub = Stub([{"status": 501}])
    port = stub.start()
    try:
        cfg = RunConfig(
            ops=["quantize_kv"],
            per_round=1,
            max_candidates=budget,
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
    calls = min(budget, loop_mod.MODEL_FAILURES_LIMIT)  # not the whole budget of 10
    assert s.status == RunStatus.FAILED and s.model.calls == calls
    said = f"failed on its first {calls} calls" if budget > calls else f"failed on all {calls} of its calls"
    assert f"the model endpoint {said} and answered none, last: " in s.session.stop_reason
    assert "budget reached" not in s.session.stop_reason
    assert _print_run_summary(s, argparse.Namespace(json=False)) == 1
    out = capsys.readouterr().out
    # a failed call is no candidate: nothing judged, nothing rejected, and nothing said to be verified
    assert s.judged_now == 0 and s.candidates == 0, out
    assert "no GPU: nothing was benchmarked or promoted" in out and "verified by" not in out, out
    assert f"model calls: {calls} of {calls} failed" in out


def test_a_failed_model_call_is_told_by_its_type_not_by_the_words_of_its_reason():
    """A proposal whose call failed carries the call's error; an unusable reply whose reason reads the same is
    still an unusable reply (recorded as a rejected candidate), not a failed call."""
    from kernel_agent.agent.proposal import Proposal

    failed = Proposal.no_reply("matmul", "model-1", "model", 7, "HTTP 501")
    assert failed.call_failed and failed.model_call_error == "HTTP 501"
    assert failed.rejected == "model call failed: HTTP 501" and failed.source == "" and failed.model_call_id == 7
    unusable = Proposal("matmul", "", "model-2", "model", model_call_id=8, rejected="model call failed: says the reply")
    assert not unusable.call_failed


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
        _cpu_run(tmp_path, db, _passes, events=RunEvents(note=_note_raising(exc)))
    led = Ledger(db, read_only=True)
    [run] = led.runs()
    assert run.status == status and why in run.notes.stop
    led.close()


def test_a_closed_pipe_is_not_a_success(monkeypatch):
    from kernel_agent.agent.cli import common as cli_common
    from kernel_agent.agent.cli import parser as cli

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli_common.COMMANDS, "history", closed)
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: None)  # (stdout stays the test's)
    assert cli.main(["history"]) == 141


# -- 4. the diff is against what the candidate was judged against ------------------------------------------


def test_the_committed_h200_pull_request_diffs_against_the_incumbent_it_was_judged_against(tmp_path):
    from kernel_agent.agent.cli.pr import write_pr

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
    from kernel_agent.agent.cli.show import cmd_show

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    with open(GOOD) as f:
        incumbent = f.read()
    inc, _ = led.add_candidate("quantize_kv", as_written(incumbent), "search", run.id, label="incumbent")
    cand, _ = led.add_candidate(
        "quantize_kv", as_written(incumbent + "\n# a code change\nX = 1\n"), "model", run.id, label="c"
    )
    from kernel_agent.harness.bench.bench import record_shape_result
    from kernel_agent.harness.bench.bench_records import ShapeResult
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
        as_written(incumbent).hash,
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
        (["run", "--time-limit", "8"], "bad duration '8': give a unit, e.g. 8h, 8m or 8s", False),
        (["run", "--candidates", "0"], "--candidates must be at least 1", False),
        (["run", "--ops", ""], "no op named in ''; name one or more of matmul", False),
        (["run", "--ops", " , "], "no op named in ' , '", False),
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
    from kernel_agent.harness.ledger.ledger import LedgerError

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
    from kernel_agent.agent.cli.demote import cmd_demote
    from kernel_agent.harness.serving import serving
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


def test_demote_on_a_fresh_clone_makes_the_default_ledger_and_records_there(tmp_path, monkeypatch, capsys):
    """The committed serving set's choices hold before any run: demoting one needs no run first."""
    from kernel_agent.agent.cli.demote import cmd_demote

    r = _git_repo(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNEL_AGENT_LEDGER", raising=False)
    args = argparse.Namespace(
        op="matmul",
        bucket="m16-klarge",
        dtype="bfloat16",
        gpu="NVIDIA H200",
        reason="r",
        ledger=None,
        in_place=True,
    )
    assert cmd_demote(args) == 0, capsys.readouterr()
    with Ledger(tmp_path / "runs" / "ledger.db", read_only=True) as led:
        assert [x.proposer for x in led.runs()] == ["manual"]
    args.bucket = "nope"  # nothing serves it: refused, and (in a folder without a ledger) no ledger made
    monkeypatch.chdir(r)
    with pytest.raises(Exception, match="nothing serves"):
        cmd_demote(args)
    assert not (r / "runs").exists()


def test_demote_on_a_machine_without_that_gpu_names_the_gpus_that_serve_the_bucket(tmp_path, monkeypatch):
    """On the CPU machine `demote` looked the bucket up on 'cpu' and said only that nothing serves it there."""
    from kernel_agent.agent.cli.demote import cmd_demote
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
    from kernel_agent.agent.cli.show import _print_checks

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    c, _ = led.add_candidate("quantize_kv", as_written("x = 1\n"), "search", run.id)
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
    from kernel_agent.agent.cli.history import history

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
    from kernel_agent.agent.cli.gate import _gate_markdown
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
    from kernel_agent.agent.cli import gate

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

    monkeypatch.setattr(gate, "run_many", run_many)
    (tmp_path / "a.py").write_text("x = 1\n")
    gate._judge_gate_items([gate.GateItem("matmul", "matmul/baseline", str(tmp_path / "a.py"))], "full", False, 2)
    assert "PASS matmul/baseline" in seen_during[0] and "seed 7" in seen_during[0]


def test_the_gate_says_it_is_still_working_through_a_pipe_before_its_first_verdict(monkeypatch, capsys, tmp_path):
    """One op's full pass took 286 s on a loaded 2-core machine before its first kernel's line: through a pipe
    the gate gives a status line meanwhile, as the run does every minute (here every 50 ms)."""
    import time

    from kernel_agent.agent.cli import gate

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

    monkeypatch.setattr(gate, "run_many", run_many)
    monkeypatch.setattr(gate, "GATE_STATUS_EVERY_S", 0.05, raising=False)
    (tmp_path / "a.py").write_text("x = 1\n")
    gate._judge_gate_items([gate.GateItem("matmul", "matmul/baseline", str(tmp_path / "a.py"))], "full", False, 2)
    status = [ln for ln in before_verdict[0].splitlines() if ln.startswith("status: ")]
    assert status and status[0].startswith(
        "status: 0:00 gate: 1 kernel(s), full, 2 at a time: 0/1 done; matmul: 0/1 kernel(s) through full"
    ), before_verdict[0]
    time.sleep(0.2)
    assert "status: " not in capsys.readouterr().out.split("PASS matmul/baseline")[-1]  # it stops with the gate


# -- 8. what the run judged, apart from what it replayed -------------------------------------------------------


def test_the_summary_and_history_count_what_a_run_judged_apart_from_what_it_replayed(tmp_path, capsys):
    from kernel_agent.agent.cli.history import history

    led = Ledger(tmp_path / "l.db")
    first = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    old, _ = led.add_candidate("quantize_kv", as_written("old = 1\n"), "search", first.id, label="cfg-a")
    led.record_checks(old.id, "full", [{"name": "bounds", "status": "failed", "detail": "x", "duration_s": 0.1}])
    led.set_candidate_status(old.id, CandidateStatus.REJECTED)
    second = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    led.add_candidate("quantize_kv", as_written("old = 1\n"), "search", second.id, label="cfg-a")  # replayed
    new, _ = led.add_candidate(
        "quantize_kv",
        as_written("new = 1\n"),
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
    from kernel_agent.agent.cli.report import write_report

    report = open(write_report(led, second, str(tmp_path / "report"))).read()
    assert "- candidates judged by this run: 1 (verified 1); replayed from earlier runs: 1" in report, report
    led.close()
    from kernel_agent.agent.cli.show import cmd_show

    cmd_show(argparse.Namespace(what=second.id, ledger=str(tmp_path / "l.db"), json=False, source=False))
    rows = {
        ln.split()[0]: ln.split()
        for ln in capsys.readouterr().out.splitlines()
        if ln.split()[:1] in (["id"], [str(old.id)], [str(new.id)])
    }
    assert rows["id"][:4] == ["id", "op", "bucket", "label"]  # a label repeats across buckets: the bucket says which
    assert rows[str(new.id)][2] == "t4k-d128" and "(replayed)" in rows[str(old.id)]


def test_a_read_only_candidates_folder_is_one_line_before_the_run_is_recorded(tmp_path, monkeypatch, capsys):
    from kernel_agent.agent.cli import parser as cli

    cands = tmp_path / "cands"
    cands.mkdir()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p) == str(cands) and mode & os.W_OK else real(p, mode, **kw)
    )  # (chmod does not bind root)
    assert cli.main(["run", "--candidates-dir", str(cands / "sub"), "--ledger", str(tmp_path / "l.db")]) == 2
    assert "is read-only" in capsys.readouterr().err and not (tmp_path / "l.db").exists()


# -- 6. one run holds a ledger -----------------------------------------------------------------------


def _wait_for(predicate, timeout_s=240.0):
    t0 = time.time()
    while not predicate():
        assert time.time() - t0 < timeout_s, "timed out waiting"
        time.sleep(0.2)


def test_two_runs_at_once_on_one_ledger_the_second_is_refused_and_a_killed_run_leaves_no_lock(tmp_path):
    """The first run (the real command) holds the ledger: the second is refused in one line naming it and the
    command that resumes it, before it records anything; killed with SIGKILL, the first holds nothing, and
    its resume runs."""
    ledger, lock = tmp_path / "l.db", tmp_path / "l.db.run-lock"
    run = [sys.executable, "-m", "kernel_agent.agent.cli", "run", "--ops", "quantize_kv", "--candidates", "1"]
    flags = ["--ledger", str(ledger), "--candidates-dir", str(tmp_path / "cands")]
    env = dict(os.environ, PYTHONPATH=ROOT)
    first = subprocess.Popen(run + flags, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: lock.exists() and '"run"' in lock.read_text())
        run_id = json.loads(lock.read_text())["run"]
        second = subprocess.run(run + flags, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"is held by run {run_id} (pid {first.pid}" in second.stderr
        assert f"kernel-agent run --resume {run_id} --ledger {ledger}`" in second.stderr
        with Ledger(ledger, read_only=True) as led:
            assert [r.id for r in led.runs()] == [run_id]  # the second recorded nothing
    finally:
        first.kill()  # SIGKILL: no handler runs, nothing is released by the run itself
        first.wait()
    resumed = subprocess.Popen(
        [sys.executable, "-m", "kernel_agent.agent.cli", "run", "--resume", run_id, "--ledger", str(ledger)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert f"resuming run {run_id}" in resumed.stdout.readline()
    finally:
        resumed.kill()
        resumed.wait()


def test_a_run_hold_names_its_holder_and_is_released_with_it(tmp_path):
    """The hold itself, in one process: a second hold on the ledger is refused while the first is held, names
    the run once it has one, and is taken once the first is released."""
    from kernel_agent.harness.ledger.run_hold import LedgerHeld, RunHold

    with Ledger(tmp_path / "l.db") as led:
        first = RunHold(led).take()
        with pytest.raises(LedgerHeld, match=r"held by a run that is starting \(pid \d+"):
            RunHold(led).take()
        first.name("r-1")
        with pytest.raises(LedgerHeld, match=r"held by run r-1 .*`kernel-agent run --resume r-1`"):
            RunHold(led).take()
        first.release()
        RunHold(led).take().release()


def test_a_postgresql_ledger_takes_no_run_hold_it_is_shared_by_design(postgres):
    """A server ledger is the one a team or a cluster shares: two runs may record in it at once
    (tests/test_ledger_postgres.py runs two), so neither is refused."""
    from kernel_agent.harness.ledger.run_hold import RunHold

    url = postgres()
    with Ledger(url) as led, Ledger(url) as other:
        first = RunHold(led).take()
        first.name("r-7")
        second = RunHold(other).take()
        second.release()
        first.release()


def test_a_time_limit_reads_its_unit_in_words():
    from kernel_agent.agent.cli.common import parse_duration

    assert [parse_duration(t) for t in ("8hours", "8 hours", "90min", "1.5h", "45sec", "2d")] == [
        28800,
        28800,
        5400,
        5400,
        45,
        172800,
    ]


def test_hints_carry_the_ledger_and_the_path_of_a_venv_that_is_not_active(tmp_path, monkeypatch):
    from kernel_agent.agent.cli.common import default_ledger, hint

    exe = tmp_path / ".venv" / "bin" / "kernel-agent"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(exe), "run"])
    monkeypatch.setenv("PATH", "/nonexistent")  # the venv is not active: the shell finds no kernel-agent
    assert hint("show r-1", "my ledger.db") == ".venv/bin/kernel-agent show r-1 --ledger 'my ledger.db'"
    assert hint("show r-1", default_ledger()) == ".venv/bin/kernel-agent show r-1"
    monkeypatch.setenv("PATH", str(exe.parent))  # active: its kernel-agent is this one
    assert hint("run --resume r-1", "l.db") == "kernel-agent run --resume r-1 --ledger l.db"


def test_a_corrupted_serving_manifest_is_refused_before_a_run_is_recorded(tmp_path):
    serving = tmp_path / "serving"
    serving.mkdir()
    (serving / "manifest.json").write_text('{"version": 2, "entries": [\n')
    rc, _, err = _cli(
        ["run", "--ops", "quantize_kv", "--ledger", str(tmp_path / "l.db"), "--candidates-dir", str(tmp_path / "c")],
        cwd=tmp_path,
        env={"KERNEL_AGENT_SERVING_DIR": str(serving)},
    )
    assert rc == 2 and err.count("\n") == 1, err
    assert f"the serving set cannot be read: {serving}/manifest.json is not valid JSON" in err
    assert not (tmp_path / "l.db").exists()


def _read_only(monkeypatch, folder):
    """`folder` reads as read-only to the command (tests run as root, whom permission bits do not stop)."""
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if os.path.abspath(p) == str(folder) else real(p, mode, **kw)
    )


@pytest.mark.parametrize("why", ["under a file", "read-only folder"])
@pytest.mark.parametrize("what", ["report", "pr", "ci", "plan", "ledger"])
def test_a_destination_that_cannot_be_written_is_one_line_before_the_work(tmp_path, monkeypatch, capsys, what, why):
    from kernel_agent.agent.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.chdir(tmp_path)
    with Ledger(tmp_path / "l.db") as led:
        run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    if why == "under a file":
        (tmp_path / "afile").write_text("")
        dest, blocker = tmp_path / "afile" / "out", tmp_path / "afile"
    else:
        (tmp_path / "ro").mkdir()
        dest, blocker = tmp_path / "ro" / "out", tmp_path / "ro"
        _read_only(monkeypatch, blocker)
    trace = os.path.join(ROOT, "tests", "data", "workloads", "chat_300.jsonl")
    replays = []
    monkeypatch.setattr("kernel_agent.agent.cli.workload.analyze", lambda *a, **k: replays.append(a))
    argv = {
        "report": ["report", run.id, "--ledger", "l.db", "--out", str(dest)],
        "pr": ["pr", run.id, "--ledger", "l.db", "--out", str(dest)],
        "ci": ["ci", "init", "--dir", str(blocker)],
        "plan": ["workload", "plan", trace, "--model", "llama-3-8b", "--out", str(dest / "plan.json")],
        "ledger": ["run", "--ops", "quantize_kv", "--ledger", str(dest / "l.db"), "--candidates-dir", "c"],
    }[what]
    if what == "ci" and why == "under a file":
        argv = ["ci", "init", "--dir", str(tmp_path / "afile")]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert str(blocker) in err and ("read-only" in err or "not a folder" in err or "no such folder" in err), err
    assert not replays and not (tmp_path / "c").exists()


def test_the_run_summary_and_show_give_the_wall_time_at_80_columns(tmp_path, monkeypatch):
    from kernel_agent.agent.cli.run import _print_run_summary
    from kernel_agent.agent.cli.show import cmd_show

    led = Ledger(tmp_path / "l.db")
    run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
    led.set_run_status(run.id, RunStatus.FINISHED, finished=True)
    summary = led.run_summary(run.id)
    led.close()
    buf = _terminal(monkeypatch)
    _print_run_summary(summary, argparse.Namespace(json=False, ledger=str(tmp_path / "l.db")))
    text = buf.getvalue()
    assert all(len(ln) <= 80 for ln in text.splitlines()), text
    assert f"run {run.id} finished; wall " in text, text
    header = next(ln for ln in text.splitlines() if "judged now" in ln)
    assert header.split()[-1] == "tokens", header  # every count column kept
    assert f"details: kernel-agent show {run.id} --ledger {tmp_path / 'l.db'}" in " ".join(text.split())
    buf.seek(0)
    buf.truncate(0)
    cmd_show(argparse.Namespace(what=run.id, ledger=str(tmp_path / "l.db"), json=False, source=False))
    assert re.search(r"started \S+ \S+ UTC, wall \d+s", " ".join(buf.getvalue().split())), buf.getvalue()


@pytest.mark.parametrize("resumed", [False, True])
def test_the_throughput_line_after_a_resume_says_it_counts_that_session(tmp_path, capsys, resumed):
    """After `run --resume` the table's `judged now 2` is the run's, the throughput line's `1 judged` the
    resume's: the line said only `throughput: 1 judged`."""
    from kernel_agent.agent.cli.run import _print_run_summary
    from kernel_agent.harness.ledger.ledger import RunSession

    with Ledger(tmp_path / "l.db") as led:
        run = led.start_run({}, {}, "search", ["quantize_kv"], None, {})
        for text in ("a = 1\n", "b = 1\n"):
            c, _ = led.add_candidate("quantize_kv", as_written(text), "search", run.id, label=text[0])
            led.set_candidate_status(c.id, CandidateStatus.VERIFIED)
        led.set_run_status(run.id, RunStatus.FINISHED, finished=True)
        summary = led.run_summary(run.id)
    summary.session = RunSession(None, None, False, {"judged": 1, "resumed": resumed}, "1 judged", {}, "")
    _print_run_summary(summary, argparse.Namespace(json=False, ledger=str(tmp_path / "l.db")))
    out = capsys.readouterr().out
    assert re.search(r"^ +2 +0 +0 +2 ", out, re.M), out  # judged now 2: the run's
    assert ("throughput, this resume: 1 judged\n" if resumed else "throughput: 1 judged\n") in out, out


def test_a_cut_rejection_detail_ends_with_an_ellipsis(monkeypatch, capsys):
    from kernel_agent.agent.cli.run import _run_events

    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    events = _run_events(argparse.Namespace(json=False, ledger=None))
    events.candidate("cfg-1", CandidateStatus.REJECTED, "x" * 300)
    events.candidate("cfg-2", CandidateStatus.REJECTED, "short")
    out = capsys.readouterr().out
    assert "x" * 219 + "…\n" in out and "x" * 220 not in out and "cfg-2: short\n" in out


def test_the_report_carries_no_machine_paths_and_says_how_to_reproduce_the_run(tmp_path, monkeypatch):
    from kernel_agent.agent.cli.report import write_report

    home, work = tmp_path / "home", tmp_path / "home" / "clone"
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    led = Ledger(work / "l.db")
    cfg = {"ops": ["quantize_kv"], "proposer": "search", "max_candidates": 2, "time_limit_s": 1800.0, "seed": 7}
    run = led.start_run(cfg, {}, "search", ["quantize_kv"], None, {})
    c, _ = led.add_candidate("quantize_kv", as_written("x = 1\n"), "search", run.id, label="cfg-1")
    detail = f"cannot import {work}/kernels/candidates/a.py (see {home}/notes.txt)"
    v = Verdict(str(work / "a.py"), "quantize_kv", "quick", [CheckOutcome("load", "failed", detail)], error=detail)
    led.record_checks(c.id, "quick", [{"name": "load", "status": "failed", "detail": detail, "duration_s": 1}])
    led.set_candidate_status(c.id, CandidateStatus.REJECTED, verdict=v.to_json())
    text = open(write_report(led, run, str(work / "report"))).read()
    led.close()
    assert "kernels/candidates/a.py" in text and "~/notes.txt" in text, text
    assert str(tmp_path) not in text, text
    assert (
        "reproduce: `kernel-agent run --ops quantize_kv --proposer search --candidates 2 --time-limit 1800s --seed 7`"
        in text
    )


def test_the_reports_judged_count_keeps_what_the_run_left_unjudged_apart(tmp_path):
    """A run stopped by its time limit with one candidate in flight: the report read `candidates judged by this
    run: 0 (proposed 1)`."""
    from kernel_agent.agent.cli.report import write_report

    with Ledger(tmp_path / "l.db") as led:
        run = led.start_run({"ops": ["quantize_kv"], "proposer": "search"}, {}, "search", ["quantize_kv"], None, {})
        led.add_candidate("quantize_kv", as_written("a = 1\n"), "search", run.id, label="a")  # stays proposed
        done, _ = led.add_candidate("quantize_kv", as_written("b = 1\n"), "search", run.id, label="b")
        led.set_candidate_status(done.id, CandidateStatus.VERIFIED)
        text = open(write_report(led, run, str(tmp_path / "report"))).read()
    assert (
        "- candidates judged by this run: 1 (verified 1; 1 left unjudged, for a later run or --resume); "
        "replayed from earlier runs: 0"
    ) in text, text


def test_a_model_runs_reproduce_line_names_the_model_and_endpoint_as_flags(tmp_path):
    """It gave the recorded endpoint as one quoted dict: `--model '{'"'"'base_url'"'"': ...}'`."""
    import shlex

    from kernel_agent.agent.cli.parser import build_parser
    from kernel_agent.agent.cli.report import write_report

    endpoint = {"model": "coder 7b", "base_url": "http://127.0.0.1:9/v1", "max_tokens": 8192, "temperature": 0.7}
    cfg = {"ops": ["quantize_kv"], "proposer": "model", "model": endpoint, "max_candidates": 3, "time_limit_s": 150}
    with Ledger(tmp_path / "l.db") as led:
        run = led.start_run(cfg, {}, "model", ["quantize_kv"], None, {})
        text = open(write_report(led, run, str(tmp_path / "report"))).read()
    command = re.search(r"- reproduce: `([^`]*)` \(a code model's replies differ", text).group(1)
    assert "{" not in command, command
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.model, args.base_url, args.proposer, args.candidates) == ("coder 7b", endpoint["base_url"], "model", 3)


def test_a_replay_line_names_the_op_and_bucket(tmp_path):
    _cpu_run(tmp_path, tmp_path / "l.db", _passes)
    lines = []
    events = RunEvents(candidate=lambda label, status, detail: lines.append((status, detail)))
    _cpu_run(tmp_path, tmp_path / "l.db", _passes, events=events)
    replays = [d for st, d in lines if st == "replayed"]
    assert replays and all(re.match(r"quantize_kv \S+: judged before as candidate #\d+", d) for d in replays), lines


def test_a_verified_line_names_the_op_and_bucket(tmp_path):
    """A source a code model proposed for two buckets printed `verified model-1: quantize_kv: ...` twice."""
    lines = []
    events = RunEvents(candidate=lambda label, status, detail: lines.append((status, detail)))
    _cpu_run(tmp_path, tmp_path / "l.db", _passes, events=events)
    verified = [d for st, d in lines if st == CandidateStatus.VERIFIED]
    assert verified and all(re.match(r"quantize_kv \S+: passed the full sanitizer", d) for d in verified), lines


def test_promote_on_a_machine_without_a_gpu_names_promote_before_torch_is_imported(tmp_path):
    (tmp_path / "k.py").write_text("x = 1\n")
    rc, torch_loaded, err = _cli(["promote", "--op", "quantize_kv", str(tmp_path / "k.py")], cwd=tmp_path)
    assert rc == 2 and err.count("\n") == 1, err
    assert f"run `kernel-agent promote --op quantize_kv {tmp_path / 'k.py'}` on a GPU machine" in err
    assert not torch_loaded and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("gpu", [False, True])
def test_the_gates_status_counts_a_kernel_done_as_its_last_stage_judges_it(monkeypatch, tmp_path, gpu):
    from kernel_agent.agent import ui
    from kernel_agent.agent.cli import gate

    counted = []
    real_advance = ui.Progress.advance

    def advance(self, message="", n=1):
        real_advance(self, message, n)
        counted.append(self.status_text())

    monkeypatch.setattr(ui.Progress, "advance", advance)

    def run_many(paths, op, mode, jobs=1, on_done=None, **kw):
        out = []
        for p in paths:
            v = Verdict(os.path.abspath(p), op, mode, checks=[CheckOutcome("static_gate", "passed")], seed=7)
            on_done(v)
            out.append(v)
        return out

    monkeypatch.setattr(gate, "run_many", run_many)
    monkeypatch.setattr(gate, "merge_gpu", lambda a, b: a)
    items = []
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text("x = 1\n")
        items.append(gate.GateItem("matmul", f"matmul/{name}", str(tmp_path / f"{name}.py")))
    gate._judge_gate_items(items, "full", gpu, 2)
    assert [re.search(r"\d+/2 done", t).group(0) for t in counted] == ["1/2 done", "2/2 done"], counted
    assert ("through gpu" in counted[0]) == gpu  # counted when the last stage judged it, not before


def test_progress_plot_labels_of_candidates_judged_close_together_do_not_overlap(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kernel_agent.agent.cli.plots import _label_points

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    # eight candidates judged within seconds of each other at nearly the same speedup
    points = [(2.0 + 0.01 * i, 0.95 + 0.004 * i, f"#{100 + i}") for i in range(8)]
    ax.plot([p[0] for p in points], [p[1] for p in points], "o")
    ax.set_xlim(0, 5)
    ax.set_ylim(0.2, 1.2)
    _label_points(fig, ax, points)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 8
    assert not [(i, j) for i in range(8) for j in range(i) if boxes[i].overlaps(boxes[j])]
    fig.savefig(tmp_path / "crowded.png", dpi=110)
    plt.close(fig)


def test_a_late_promotions_note_stays_inside_the_plot_clear_of_the_legend_and_labels():
    """The note of a promotion late in the run ran past the axes' right edge, under the legend beside it."""
    pytest.importorskip("matplotlib")
    import datetime as dt
    from types import SimpleNamespace

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kernel_agent.agent.cli.plots import progress_figure

    t0 = dt.datetime(2026, 12, 2, 5, 12, tzinfo=dt.timezone.utc)
    minutes = [1.9, 2.1, 2.3, 2.8, 3.4, 3.6, 3.9, 5.3, 5.9, 7.3]
    results = [
        SimpleNamespace(
            op="decode_attention_int8",
            bucket="clong-g4-d128",
            speedup=0.5 + 0.06 * i,
            implausible=False,
            started_at=t0 + dt.timedelta(minutes=m),
            candidate_id=i + 1,
        )
        for i, m in enumerate(minutes)
    ]
    promotion = SimpleNamespace(candidate_id=9, bucket="clong-g4-d128", created_at=t0 + dt.timedelta(minutes=7.05))
    fig, ax = progress_figure(plt, SimpleNamespace(started_at=t0), results, [promotion])
    renderer = fig.canvas.get_renderer()
    axes, legend = ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer)
    note = next(t for t in ax.texts if "promoted" in t.get_text()).get_window_extent(renderer)
    labels = [
        t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("#") and "\n" not in t.get_text()
    ]
    plt.close(fig)
    assert axes.x0 <= note.x0 and note.x1 <= axes.x1 and not note.overlaps(legend), (note, axes, legend)
    assert len(labels) == len(minutes) and not [b for b in labels if b.overlaps(note)]

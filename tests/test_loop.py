"""Whole agent runs on the CPU: the code-model path through a loopback OpenAI-compatible server
with scripted replies (good rewrites, every cheat family, malformed replies, server faults), and
the built-in search path killed with SIGKILL and resumed."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from kernel_agent.agent.model import ReplyError, extract_source
from kernel_agent.agent.search import baseline_source, with_config, SPACES
from kernel_agent.harness.ledger import Ledger

from openai_stub import Stub

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
GOOD = os.path.join(ROOT, "tests", "candidates", "good", "quantize_kv", "evict_first_hint.py")


def _run(args, env=None, timeout=900):
    return subprocess.run(CLI + args, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


# -- reply parsing ---------------------------------------------------------------------------

def test_extract_source_copes_with_what_models_send():
    src = open(GOOD).read()
    assert extract_source(f"Sure! Here it is:\n```python\n{src}```\nIt is faster.", "quantize_kv").startswith("\"\"\"")
    two = f"```python\nx = 1\n```\nand the file:\n```python\n{src}```"
    assert "def quantize_kv(" in extract_source(two, "quantize_kv")
    assert "def quantize_kv(" in extract_source(f"```python\n{src}", "quantize_kv")  # unclosed but complete
    for reply, why in [("", "empty"), ("No code today.", "no code block"),
                       ("```python\nimport torch\ndef quantize_kv(x:\n```", "does not parse"),
                       ("```python\nimport torch\ndef quantize_kv(x):\n    return (", "truncated"),
                       ("```python\ndef matmul(a, b):\n    pass\n```", "defines"),
                       ("x" * 250_001, "too large")]:
        with pytest.raises(ReplyError, match=why):
            extract_source(reply, "quantize_kv")


# -- the code-model path ----------------------------------------------------------------------

def _fenced(text):
    return f"```python\n{text}```"


def _script(tmp_path):
    base = baseline_source("quantize_kv")
    variant = with_config(base, (32, 4), (16, 2), "tsmall-d128", SPACES["quantize_kv"])
    oob = base.replace("tl.store(scale_ptr + rows, scale, mask=row_mask)",
                       "tl.store(scale_ptr + rows, scale, mask=rows <= R)")
    assert oob != base
    fallback = ("import torch\nimport triton\nimport triton.language as tl\n\n@triton.jit\ndef _k(x):\n    pass\n\n"
                "def quantize_kv(x):\n    if x.shape[0] > 1024:\n        s = x.abs().amax(-1) / 127\n"
                "        return torch.round(x / s[..., None]).to(torch.int8), s\n    return x, x\n")
    cache = base.replace("import torch\n", "import torch\n_SEEN = {}\n", 1)
    wrong_sig = base.replace("def quantize_kv(x):", "def quantize_kv(x, scale_out):")
    return [
        {"status": 429},
        {"reply": "Here is a faster version with an eviction hint:\n\n" + _fenced(open(GOOD).read())},
        {"reply": _fenced(fallback)},                                    # torch fallback at large sizes
        {"status": 500},
        {"reply": _fenced(cache)},                                       # state across calls
        {"reply": "I would use shared memory, but I can't write the code."},  # no code block
        {"sleep": 3, "reply": "too late"},                               # client timeout, retried
        {"reply": "first a helper:\n```python\nBLOCK = 16\n```\nthen the file:\n" + _fenced(variant)},
        {"reply": "```python\nimport torch\ndef quantize_kv(x):\n    return (x,"},  # truncated
        {"reply": _fenced(oob)},                                          # writes past the end
        {"junk": True},                                                   # not JSON: retried
        {"reply": _fenced(wrong_sig)},                                   # wrong signature
        {"reply": "```python\ndef quantize_kv(x:\n    pass\n```"},        # syntax error
        {"reply": "```python\n" + "#" * 210_000 + "\n```"},              # very large
    ]


def test_code_model_run_rejects_every_cheat_and_survives_every_fault(tmp_path):
    stub = Stub(_script(tmp_path))
    port = stub.start()
    cfg = tmp_path / "ka.toml"
    cfg.write_text(f'[model]\nname = "scripted"\nbase_url = "http://127.0.0.1:{port}/v1"\napi_key = "x"\n'
                   f'timeout_s = 1.5\nmax_retries = 3\nconcurrency = 1\n'
                   f'[run]\nops = ["quantize_kv"]\ncandidates = 10\nper_round = 2\njobs = 2\n')
    ledger = tmp_path / "l.db"
    try:
        r = _run(["run", "--config", str(cfg), "--ledger", str(ledger), "--candidates-dir", str(tmp_path / "c"),
                  "--json"])
    finally:
        stub.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    led = Ledger(ledger)
    run = led.get_run(summary["run_id"])
    assert run.status == "finished" and run.proposer == "model"
    cands = led.candidates(run_id=run.id)
    assert len(cands) == 10
    status = {c.label: c.status for c in cands}
    why = {c.label: json.dumps(c.verdict) for c in cands}
    verified = [c for c in cands if c.status == "verified"]
    assert len(verified) == 2, status  # the eviction hint and the launch-config variant
    assert all(c.fpsan_equivalent for c in verified)
    reasons = " ".join(why.values())
    for expected in ["static_gate", "torch-compute", "state", "no code block", "out-of-bounds store", "signature",
                     "does not parse", "too large", "truncated"]:
        assert expected in reasons, f"no rejection mentions {expected!r}: {status}"
    first_fail = {}
    for c in cands:
        failed = next((k for k in led.checks(c.id) if k.status == "failed"), None)
        first_fail[c.label] = failed.name if failed else None
    assert sorted(n for n in first_fail.values() if n) == sorted(
        ["static_gate", "static_gate", "runs", "load", "reply", "reply", "reply", "reply"])  # runs: bounds hooks
    calls = led.model_calls(run_id=run.id)
    assert len(calls) == 10 and all(c.prompt for c in calls)
    assert all(c.candidate_id for c in calls)  # every exchange is linked to what it produced
    assert "## Contract" in json.loads(calls[0].prompt)[1]["content"]
    # feedback from earlier attempts reaches later prompts
    assert "Earlier attempts" in json.loads(calls[-1].prompt)[1]["content"]
    assert len(stub.requests) >= 14  # the retries happened
    show = _run(["show", str(verified[0].id), "--ledger", str(ledger)])
    assert show.returncode == 0 and "model exchange" in show.stdout and "diff against" in show.stdout


def test_unreachable_endpoint_is_one_line_and_no_run(tmp_path):
    r = _run(["run", "--proposer", "model", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
              "--ledger", str(tmp_path / "l.db")])
    assert r.returncode == 2 and "cannot reach the model endpoint" in r.stderr and "Traceback" not in r.stderr


# -- the built-in search path: kill -9 and resume --------------------------------------------

SEARCH = ["run", "--ops", "quantize_kv", "--proposer", "search", "--candidates", "2", "--per-round", "1",
          "--jobs", "2", "--seed", "7"]


def _state(ledger_path):
    led = Ledger(ledger_path)
    run = led.runs()[0]
    cands = led.candidates(run_id=run.id)
    props = led.proposals(run_id=run.id)
    checks = {c.source_hash: sorted((k.mode, k.name, k.status) for k in led.checks(c.id)) for c in cands}
    return run, {(c.source_hash, c.label, c.status) for c in cands}, props, checks


def test_a_run_killed_with_sigkill_resumes_to_the_same_end_state(tmp_path):
    ref_db, kill_db = tmp_path / "ref.db", tmp_path / "kill.db"
    r = _run(SEARCH + ["--ledger", str(ref_db), "--candidates-dir", str(tmp_path / "ref")])
    assert r.returncode == 0, r.stderr[-2000:]
    ref_run, ref_cands, ref_props, ref_checks = _state(ref_db)
    assert ref_run.status == "finished" and len(ref_cands) == 2

    proc = subprocess.Popen(CLI + SEARCH + ["--ledger", str(kill_db), "--candidates-dir", str(tmp_path / "kill")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:  # wait until one candidate is finished and the next is in flight
        time.sleep(0.5)
        if kill_db.exists():
            try:
                with sqlite3.connect(f"file:{kill_db}?mode=ro", uri=True) as con:
                    done = con.execute("select count(*) from candidate where status != 'proposed'").fetchone()[0]
                    total = con.execute("select count(*) from candidate").fetchone()[0]
            except sqlite3.Error:
                continue
            if done >= 1 and total >= 2:
                break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = Ledger(kill_db).runs()[0].id
    assert Ledger(kill_db).get_run(run_id).status == "running"  # killed: nothing could mark it
    r = _run(["run", "--resume", run_id, "--ledger", str(kill_db)])
    assert r.returncode == 0, r.stderr[-2000:]
    run, cands, props, checks = _state(kill_db)
    assert run.status == "finished"
    assert cands == ref_cands  # same candidates, same verdicts
    assert len(props) == len(ref_props) == 2  # nothing proposed twice
    assert checks == ref_checks  # each check recorded once per candidate and mode


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_mark_the_run_interrupted(tmp_path, sig):
    db = tmp_path / "l.db"
    # started with SIGINT ignored, as a background job of a non-interactive shell (CI) is
    proc = subprocess.Popen(CLI + SEARCH + ["--ledger", str(db), "--candidates-dir", str(tmp_path / "c")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.time() + 180
    in_flight = False
    while time.time() < deadline and proc.poll() is None:  # until a candidate is being judged
        time.sleep(0.2)
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    in_flight = con.execute("select count(*) from candidate where status = 'proposed'").fetchone()[0] > 0
            except sqlite3.Error:
                continue
            if in_flight:
                break
    assert in_flight and proc.poll() is None, "the run never reached an evaluation: " + proc.communicate()[1][-1000:]
    t0 = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-500:] + err[-1000:]
    assert time.time() - t0 < 10  # sanitizer children are killed, not waited for
    run = Ledger(db).runs()[0]
    assert run.status == "interrupted" and f"--resume {run.id}" in out + err

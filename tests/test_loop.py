"""Whole agent runs on the CPU: the code-model path through a loopback OpenAI-compatible server
with scripted replies (good rewrites, every cheat family, malformed replies, server faults), and
the built-in search path killed with SIGKILL and resumed."""

import dataclasses
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import pytest

from kernel_agent.agent.model import ReplyError, extract_source
from kernel_agent.agent.run_config import Budget, RunConfig, targets_for
from kernel_agent.agent.search import baseline_source, with_config
from kernel_agent.agent.stream import DUPLICATE_STREAK_LIMIT, TASK_LOST_RETRIES
from kernel_agent.agent.work import RunEvents
from kernel_agent.harness.ledger.ledger import Ledger
from kernel_agent.ops import OPS
from kernel_agent.sanitizer.canonical import as_written, read_judged
from openai_stub import Stub
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
GOOD = os.path.join(ROOT, "tests", "candidates", "good", "quantize_kv", "evict_first_hint.py")


@dataclass
class FakeEvaluator:
    """Stands in for a placement's children: `sanitize(path, op, mode, checks, env, on_ready)` answers as the
    judge would and `bench(spec, env, on_ready)` as the benchmark child; a hard stop has no child to kill."""

    sanitize: Callable = lambda path, op, mode, checks=None, env=None, on_ready=None: None
    bench: Callable = lambda spec, env=None, on_ready=None: None
    stops: int = 0

    def stop_all(self):
        self.stops += 1

    def resume_starting(self):
        pass


@dataclass
class FakeDevices:
    """GPUs that are not there: `gpus` as CUDA_VISIBLE_DEVICES entries, each a `gpu_name`."""

    gpus: List[str] = field(default_factory=lambda: ["0", "1"])
    gpu_name: Optional[str] = "Fake GPU"

    def available(self):
        return bool(self.gpus)

    def name(self):
        return self.gpu_name

    def visible(self, limit=None):
        return self.gpus[:limit] if limit else list(self.gpus)


def _run(args, env=None, timeout=900):
    return subprocess.run(
        CLI + args, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=dict(os.environ, **(env or {}))
    )


# -- reply parsing ---------------------------------------------------------------------------


def test_extract_source_copes_with_what_models_send():
    src = open(GOOD).read()
    assert extract_source(f"Sure! Here it is:\n```python\n{src}```\nIt is faster.", "quantize_kv").startswith('"""')
    two = f"```python\nx = 1\n```\nand the file:\n```python\n{src}```"
    assert "def quantize_kv(" in extract_source(two, "quantize_kv")
    assert "def quantize_kv(" in extract_source(f"```python\n{src}", "quantize_kv")  # unclosed but complete
    for reply, why in [
        ("", "empty"),
        ("No code today.", "no code block"),
        ("```python\nimport torch\ndef quantize_kv(x:\n```", "does not parse"),
        ("```python\nimport torch\ndef quantize_kv(x):\n    return (", "truncated"),
        ("```python\ndef matmul(a, b):\n    pass\n```", "defines"),
        ("x" * 250_001, "too large"),
    ]:
        with pytest.raises(ReplyError, match=why):
            extract_source(reply, "quantize_kv")


# -- the code-model path ----------------------------------------------------------------------


def _fenced(text):
    return f"```python\n{text}```"


def _script(tmp_path):
    base = baseline_source("quantize_kv")
    variant = with_config(base, (32, 4), (16, 2), "tsmall-d128", OPS["quantize_kv"].tuning_space)
    oob = base.replace(
        "tl.store(scale_ptr + rows, scale, mask=row_mask)", "tl.store(scale_ptr + rows, scale, mask=rows <= R)"
    )
    assert oob != base
    fallback = (
        "import torch\nimport triton\nimport triton.language as tl\n\n@triton.jit\ndef _k(x):\n    pass\n\n"
        "def quantize_kv(x):\n    if x.shape[0] > 1024:\n        s = x.abs().amax(-1) / 127\n"
        "        return torch.round(x / s[..., None]).to(torch.int8), s\n    return x, x\n"
    )
    cache = base.replace("import torch\n", "import torch\n_SEEN = {}\n", 1)
    wrong_sig = base.replace("def quantize_kv(x):", "def quantize_kv(x, scale_out):")
    return [
        {"status": 429},
        {"reply": "Here is a faster version with an eviction hint:\n\n" + _fenced(open(GOOD).read())},
        {"reply": _fenced(fallback)},  # torch fallback at large sizes
        {"status": 500},
        {"reply": _fenced(cache)},  # state across calls
        {"reply": "I would use shared memory, but I can't write the code."},  # no code block
        {"sleep": 3, "reply": "too late"},  # client timeout, retried
        {"reply": "first a helper:\n```python\nBLOCK = 16\n```\nthen the file:\n" + _fenced(variant)},
        {"reply": "```python\nimport torch\ndef quantize_kv(x):\n    return (x,"},  # truncated
        {"reply": _fenced(oob)},  # writes past the end
        {"junk": True},  # not JSON: retried
        {"reply": _fenced(wrong_sig)},  # wrong signature
        {"reply": "```python\ndef quantize_kv(x:\n    pass\n```"},  # syntax error
        {"reply": "```python\n" + "#" * 210_000 + "\n```"},  # very large
    ]


@exhaustive  # ten candidates judged, minutes: the quick tier meets the model proposer in shorter runs
def test_code_model_run_rejects_every_cheat_and_survives_every_fault(tmp_path):
    stub = Stub(_script(tmp_path))
    port = stub.start()
    cfg = tmp_path / "ka.toml"
    cfg.write_text(
        f'[model]\nname = "scripted"\nbase_url = "http://127.0.0.1:{port}/v1"\napi_key = "x"\n'
        f"timeout_s = 1.5\nmax_retries = 3\nconcurrency = 1\n"
        f'[run]\nops = ["quantize_kv"]\ncandidates = 10\nper_round = 2\njobs = 2\n'
    )
    ledger = tmp_path / "l.db"
    try:
        r = _run(
            ["run", "--config", str(cfg), "--ledger", str(ledger), "--candidates-dir", str(tmp_path / "c"), "--json"]
        )
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
    for expected in [
        "static_gate",
        "torch-compute",
        "state",
        "no code block",
        "out-of-bounds store",
        "signature",
        "does not parse",
        "too large",
        "truncated",
    ]:
        assert expected in reasons, f"no rejection mentions {expected!r}: {status}"
    first_fail = {}
    for c in cands:
        failed = next((k for k in led.checks(c.id) if k.status == "failed"), None)
        first_fail[c.label] = failed.name if failed else None
    assert sorted(n for n in first_fail.values() if n) == sorted(
        ["static_gate", "static_gate", "runs", "load", "reply", "reply", "reply", "reply"]
    )  # runs: bounds hooks
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
    r = _run(
        [
            "run",
            "--proposer",
            "model",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--ledger",
            str(tmp_path / "l.db"),
        ]
    )
    assert r.returncode == 2 and "cannot reach the model endpoint" in r.stderr and "Traceback" not in r.stderr


# -- the built-in search path: kill -9 and resume --------------------------------------------

SEARCH = [
    "run",
    "--ops",
    "quantize_kv",
    "--proposer",
    "search",
    "--candidates",
    "2",
    "--per-round",
    "1",
    "--jobs",
    "2",
    "--seed",
    "7",
]


def _state(ledger_path):
    led = Ledger(ledger_path)
    run = led.runs()[0]
    cands = led.candidates(run_id=run.id)
    props = led.proposals(run_id=run.id)
    checks = {c.source_hash: sorted((k.mode, k.name, k.status) for k in led.checks(c.id)) for c in cands}
    return run, {(c.source_hash, c.label, c.status) for c in cands}, props, checks


@exhaustive  # two whole runs and a resume: the quick tier resumes a run stopped by its time limit
def test_a_run_killed_with_sigkill_resumes_to_the_same_end_state(tmp_path):
    ref_db, kill_db = tmp_path / "ref.db", tmp_path / "kill.db"
    r = _run(SEARCH + ["--ledger", str(ref_db), "--candidates-dir", str(tmp_path / "ref")])
    assert r.returncode == 0, r.stderr[-2000:]
    ref_run, ref_cands, ref_props, ref_checks = _state(ref_db)
    assert ref_run.status == "finished" and len(ref_cands) == 2

    proc = subprocess.Popen(
        CLI + SEARCH + ["--ledger", str(kill_db), "--candidates-dir", str(tmp_path / "kill")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    # kill once a stage has recorded its checks and a candidate is still unjudged: from the first quick
    # verdict to the last full one is many seconds (two candidates judged side by side finish close
    # together, so waiting for a judged candidate could miss the run's end)
    while time.time() < deadline:
        time.sleep(0.1)
        if kill_db.exists():
            try:
                with sqlite3.connect(f"file:{kill_db}?mode=ro", uri=True) as con:
                    checks = con.execute("select count(*) from check_result").fetchone()[0]
                    pending = con.execute("select count(*) from candidate where status = 'proposed'").fetchone()[0]
                    total = con.execute("select count(*) from candidate").fetchone()[0]
            except sqlite3.Error:
                continue
            if checks >= 1 and pending >= 1 and total >= 2:
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


@exhaustive  # 15-35 s of sanitizer runs; the quick tier meets the same paths elsewhere
def test_the_time_limit_stops_the_run_and_a_resume_finishes_what_was_in_flight(tmp_path):
    """A sanitizer stage outlasts the limit: the run kills it and ends within 15 s of the limit with its
    summary printed; the candidates stay 'proposed' without a check recorded, and `--resume` judges
    them."""
    db = tmp_path / "l.db"
    args = [
        "run",
        "--ops",
        "quantize_kv",
        "--proposer",
        "search",
        "--candidates",
        "2",
        "--per-round",
        "1",
        "--jobs",
        "2",
        "--ledger",
        str(db),
        "--candidates-dir",
        str(tmp_path / "c"),
    ]
    # The incumbent's diagnosis comes before the first proposal; on a loaded machine it can outlast a short
    # limit, and then nothing is in flight to leave unjudged. Such a run is retried with a longer limit (a
    # quantize_kv sanitizer stage still outlasts it), in a fresh ledger.
    for limit in (6, 12, 24):
        db = tmp_path / f"l{limit}.db"
        args[args.index("--ledger") + 1] = str(db)
        t0 = time.time()
        r = _run(args + ["--time-limit", f"{limit}s"], timeout=120)
        wall = time.time() - t0
        assert r.returncode == 0, r.stderr[-2000:]
        led = Ledger(str(db))
        run = led.runs()[0]
        if led.candidates(run_id=run.id):
            break
        led.close()
    assert run.notes.elapsed_s <= limit + 15 and wall < limit + 15 + 15  # (+ the CLI's start)
    assert "left unjudged at the time limit" in r.stdout and f"--resume {run.id}" in r.stdout + r.stderr
    # not a terminal: the live status comes as a plain line (at the start, then once a minute)
    status = [ln for ln in r.stdout.splitlines() if ln.startswith("status: ")]
    # at the start (within the first seconds: the incumbent's diagnosis may compile first on a loaded machine)
    assert status and re.match(rf"status: 0:[0-5]\d/0:{limit:02d} cand 0/2; quick 0 full 0;", status[0]), status
    assert "\x1b" not in r.stdout
    cands = led.candidates(run_id=run.id)
    # one or both proposed by the limit: the incumbent's diagnosis is made before the first proposal
    assert 1 <= len(cands) <= 2 and {c.status for c in cands} == {"proposed"}
    assert all(led.checks(c.id) == [] for c in cands)  # a killed stage records nothing
    led.close()
    r = _run(["run", "--resume", run.id, "--ledger", str(db)])
    assert r.returncode == 0, r.stderr[-2000:]
    led = Ledger(str(db))
    assert {c.status for c in led.candidates(run_id=run.id)} == {"verified"}
    assert led.get_run(run.id).status == "finished" and len(led.candidates(run_id=run.id)) == len(cands)
    led.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=exhaustive)])
def test_ctrl_c_and_sigterm_mark_the_run_interrupted(tmp_path, sig):
    db = tmp_path / "l.db"
    # started with SIGINT ignored, as a background job of a non-interactive shell (CI) is
    proc = subprocess.Popen(
        CLI + SEARCH + ["--ledger", str(db), "--candidates-dir", str(tmp_path / "c")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.time() + 180
    in_flight = False
    while time.time() < deadline and proc.poll() is None:  # until a candidate is being judged
        time.sleep(0.2)
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    in_flight = (
                        con.execute("select count(*) from candidate where status = 'proposed'").fetchone()[0] > 0
                    )
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


# -- evaluation spread over GPUs -------------------------------------------------------------


def _spec(n):
    """A benchmark of nothing, told apart from the others by its seed (placement tests)."""
    from kernel_agent.harness.bench.bench_records import BenchSpec

    return BenchSpec("matmul", (), "bfloat16", (), seed=n)


def test_a_benchmark_has_its_gpu_to_itself_and_checks_share_one():
    """Timings never share a GPU (with each other or with a check); checks share one, up to the bound;
    a GPU task starts only when a GPU can take it, and every lease comes back."""
    import threading

    from kernel_agent.agent.placement import BenchTask, LocalPlacement, SanitizeTask

    lock = threading.Lock()
    on_gpu = {"3": [], "5": []}  # GPU -> kinds running on it
    seen, cpu_env = [], []
    release = threading.Event()

    def enter(dev, kind):
        with lock:
            on_gpu[dev].append(kind)
            seen.append(list(on_gpu[dev]))

    def leave(dev, kind):
        with lock:
            on_gpu[dev].remove(kind)

    def fake_bench(spec, env=None, on_ready=None):
        dev = env["CUDA_VISIBLE_DEVICES"]
        enter(dev, "bench")
        release.wait(5)
        leave(dev, "bench")
        return {"results": [], "error": None, "n": spec["seed"]}

    def fake_sanitize(path, op, mode="full", checks=None, env=None, on_ready=None):
        if mode != "gpu":
            cpu_env.append(env)
            return mode
        dev = env["CUDA_VISIBLE_DEVICES"]
        enter(dev, "check")
        release.wait(5)
        leave(dev, "check")
        return dev

    pl = LocalPlacement(3, ["3", "5"], threads=2, checks_per_gpu=2, evaluator=FakeEvaluator(fake_sanitize, fake_bench))
    check = SanitizeTask("f.py", "matmul", "gpu", ("determinism",))
    futs = [pl.submit(BenchTask(_spec(0), gated=False))]  # GPU 3, alone from its start
    assert BenchTask(_spec(1)).exclusive and not check.exclusive and pl.can_start(check)
    futs += [pl.submit(check), pl.submit(check)]  # both on GPU 5
    assert not pl.can_start(check) and not pl.can_start(BenchTask(_spec(1), gated=False))
    with pytest.raises(ValueError):
        pl.submit(check)
    futs.append(pl.submit(SanitizeTask("f.py", "matmul", "quick")))  # the CPU is not the GPUs' business
    assert futs[-1].result() == "quick"
    release.set()
    assert futs[0].result()["n"] == 0 and [f.result() for f in futs[1:3]] == ["5", "5"]
    assert all(kinds == ["bench"] for kinds in seen if "bench" in kinds)  # a timing was alone on its GPU
    assert max(len(kinds) for kinds in seen) == 2  # two checks shared GPU 5
    assert pl.can_start(BenchTask(_spec(1), gated=False)) and pl.running("gpu") == 0  # every lease came back
    assert cpu_env[0]["OMP_NUM_THREADS"] == "2"
    assert sorted(span.kind for span in pl.log()) == ["bench", "gpu", "gpu", "quick"]
    assert {span.gpu for span in pl.log() if span.kind == "gpu"} == {"5"}
    pl.stop()  # after the hard stop nothing starts
    with pytest.raises(ChildProcessError):
        pl.submit(BenchTask(_spec(9))).result()
    pl.close()


def test_gated_tasks_start_without_the_gpu_share_it_and_a_timing_has_it_alone():
    """Gated tasks are admitted before they hold the GPU; a check's lease is shared; a benchmark (one
    per GPU) compiles on a shared lease beside the checks, and when it asks for the GPU alone no lease
    is granted there until the checks on it have ended and its timing is over; nothing runs beside the
    timing. The spans say what held the GPU when, and every lease comes back."""
    import threading

    from kernel_agent.agent.placement import BenchTask, LocalPlacement, SanitizeTask, occupied_fraction

    lock = threading.Lock()
    on_gpu: list = []
    seen: list = []
    ev = {k: threading.Event() for k in ("compiled", "ask_alone", "a", "c", "d_started", "d")}

    def enter(kind):
        with lock:
            on_gpu.append(kind)
            seen.append(sorted(on_gpu))

    def leave(kind):
        with lock:
            on_gpu.remove(kind)

    def fake_bench(spec, env=None, on_ready=None):
        assert on_ready("gpu", lambda: True)
        enter("compile")
        ev["compiled"].set()
        ev["ask_alone"].wait(5)
        leave("compile")
        granted = on_ready("alone", lambda: True)
        if granted:
            enter("timing")
            leave("timing")
        return {"results": [], "error": None, "granted": granted}

    def fake_check(path, op, mode="full", checks=None, env=None, on_ready=None):
        if path == "d":
            ev["d_started"].set()  # started (imports) while the GPU drains: it waits for its lease
        assert on_ready("gpu", lambda: True)
        assert not on_ready("alone", lambda: True)  # a check never gets the GPU alone
        enter(f"check {path}")
        ev[path].wait(5)
        leave(f"check {path}")
        return path

    pl = LocalPlacement(1, ["0"], threads=1, checks_per_gpu=3, evaluator=FakeEvaluator(fake_check, fake_bench))
    check = lambda name: SanitizeTask(name, "matmul", "gpu", gated=True)  # noqa: E731
    fa = pl.submit(check("a"))
    fb = pl.submit(BenchTask(_spec(0)))
    assert not pl.can_start(BenchTask(_spec(1)))  # one benchmark per GPU
    fc = pl.submit(check("c"))
    assert ev["compiled"].wait(5)
    ev["ask_alone"].set()  # compiled: it asks for the GPU alone and waits for checks a and c
    deadline = time.time() + 5
    while not pl._draining["0"] and time.time() < deadline:  # (the request is in: the GPU drains)
        time.sleep(0.005)
    assert pl._draining["0"]
    ev["a"].set()
    assert fa.result(5) == "a"
    fd = pl.submit(check("d"))  # admitted (a child may start), but no lease while the GPU drains
    assert ev["d_started"].wait(5)
    time.sleep(0.3)
    assert "check d" not in {k for kinds in seen for k in kinds}
    assert "timing" not in {k for kinds in seen for k in kinds}  # check c still holds its lease
    ev["c"].set()
    assert fb.result(5)["granted"] and fc.result(5) == "c"
    ev["d"].set()
    assert fd.result(5) == "d"
    assert ["check a", "check c", "compile"] in seen  # it compiled beside both checks
    assert all(kinds == ["timing"] for kinds in seen if "timing" in kinds)  # and timed alone
    spans = pl.log()
    alone = next(s for s in spans if s.kind == "bench alone")
    d_lease = next(s for s in spans if s.kind == "gpu on gpu" and s.start >= alone.start)
    assert alone.start >= max(s.end for s in spans if s.kind == "gpu on gpu" and s.start < alone.start)
    assert d_lease.start >= alone.end  # check d's lease came after the timing
    assert {s.gpu for s in spans if s.kind in ("gpu", "bench")} == {None}  # whole spans hold no GPU
    assert {s.subject for s in spans if s.kind == "gpu on gpu"} == {"a", "c", "d"}  # each for its candidate
    assert 0 < occupied_fraction(spans, min(s.start for s in spans), max(s.end for s in spans), ["0"]) <= 1
    assert pl.can_start(BenchTask(_spec(1), gated=False)) and pl.running("gpu") == 0  # every lease came back
    pl.close()


def test_a_gated_benchmark_waiting_for_its_gpu_gives_up_at_a_stop():
    import threading

    from kernel_agent.agent.placement import BenchTask, LocalPlacement, SanitizeTask

    check_go, asked = threading.Event(), threading.Event()

    def fake_bench(spec, env=None, on_ready=None):
        assert on_ready("gpu", lambda: True)
        asked.set()
        return {"granted": on_ready("alone", lambda: True)}

    children = FakeEvaluator(lambda *a, **k: check_go.wait(5), fake_bench)
    pl = LocalPlacement(1, ["0"], threads=1, evaluator=children)
    fcheck = pl.submit(SanitizeTask("a", "matmul", "gpu"))  # ungated: it holds its lease from the start
    fb = pl.submit(BenchTask(_spec(0)))
    assert asked.wait(5)
    time.sleep(0.2)
    assert not fb.done()  # waits for the check
    pl.stop()
    assert fb.result(5) == {"granted": False} and children.stops == 1
    check_go.set()
    fcheck.result(5)
    pl.close()


def test_the_gated_child_goes_on_only_once_the_parent_grants_each_phase(tmp_path):
    """The parent side of the lease with a stand-in child: the child asks for each phase in turn and
    goes on only when granted; refused, it waits until its time limit kills it."""
    import sys

    from kernel_agent.isolation.lease import run_gated

    child = [
        sys.executable,
        "-c",
        "from kernel_agent.isolation.lease import wait_for_grant\n"
        "wait_for_grant('gpu'); print('compiled', flush=True)\nwait_for_grant('alone'); print('timed')",
    ]
    calls = []

    def grant(phase, still_wanted):
        calls.append((phase, still_wanted()))
        return True

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    (tmp_path / "granted").mkdir()
    rc, log = run_gated(child, 60, env, str(tmp_path / "granted"), grant)
    assert rc == 0 and "timed" in log and calls == [("gpu", True), ("alone", True)]
    (tmp_path / "refused").mkdir()
    t0 = time.time()
    rc, log = run_gated(child, 8, env, str(tmp_path / "refused"), lambda phase, still_wanted: phase == "gpu")
    assert rc is None and "compiled" in log and "timed" not in log and time.time() - t0 < 30


def test_gpu_occupancy_counts_tasks_that_share_a_gpu_once():
    from kernel_agent.agent.placement import TaskSpan, occupied_fraction

    spans = [
        TaskSpan("gpu", "gpu", 0, 10, "0"),
        TaskSpan("gpu", "gpu", 2, 8, "0"),
        TaskSpan("gpu", "gpu", 5, 12, "0"),
        TaskSpan("bench", "gpu", 15, 20, "0"),
        TaskSpan("bench", "gpu", 0, 20, "1"),
        TaskSpan("full", "cpu", 0, 20, None),
    ]
    assert occupied_fraction(spans, 0, 20, ["0"]) == pytest.approx(17 / 20)  # [0, 12] and [15, 20]
    assert occupied_fraction(spans, 10, 20, ["0", "1"]) == pytest.approx((7 + 10) / 20)
    assert occupied_fraction(spans, 0, 20, []) == 0.0


def test_gpu_seconds_per_candidate_count_each_task_from_its_gpu_lease_to_its_end():
    """The GPU wall seconds each candidate cost, per stage: a gated task's seconds from its lease ("<stage> on
    gpu") to its end, its "alone" part not counted twice, its whole span (no GPU) not at all; the throughput
    line states the medians, and the seconds the GPUs were busy per judged candidate."""
    from kernel_agent.agent.placement import TaskSpan, gpu_seconds, occupied_seconds
    from kernel_agent.agent.throughput import Throughput

    spans = [
        TaskSpan("gpu", "gpu", 0, 12, None, "a.py"),  # a gated check's whole span: starts before its lease
        TaskSpan("gpu on gpu", "gpu", 3, 12, "0", "a.py"),  # 9 s
        TaskSpan("bench", "gpu", 12, 40, None, "a.py"),
        TaskSpan("bench on gpu", "gpu", 15, 40, "0", "a.py"),  # 25 s
        TaskSpan("bench alone", "gpu", 30, 40, "0", "a.py"),  # inside the lease above
        TaskSpan("gpu on gpu", "gpu", 0, 7, "0", "b.py"),  # 7 s, rejected there: no benchmark
        TaskSpan("gpu", "gpu", 0, 11, "1", "c.py"),  # an ungated check holds its GPU throughout: 11 s
        TaskSpan("bench on gpu", "gpu", 11, 15, "1", "c.py"),  # 4 s: stopped early
        TaskSpan("full", "cpu", 0, 60, None, "c.py"),
    ]
    medians = gpu_seconds(spans)
    assert medians == {"bench": pytest.approx(14.5), "gpu": pytest.approx(9), "total": pytest.approx(15)}
    assert gpu_seconds([]) == {}
    # busy: GPU 0 over [0, 12] (the checks of a.py and b.py overlap) and [15, 40], GPU 1 over [0, 15]
    busy = occupied_seconds(spans, 0, 60, ["0", "1"])
    assert busy == pytest.approx(12 + 25 + 15)
    th = Throughput(judged=3, gpu_s=medians, gpu_busy_s=busy, tokens=3000, stopped_early=1)
    line = th.describe(1)
    want = "GPU s per candidate (median, leased): GPU checks 9.0, benchmark 14.5, total 15.0; GPU busy 52 s, 17.3 s"
    assert f"{want} per judged candidate" in line
    assert "1 benchmark(s) stopped early by the sequential test" in line
    assert "1000 model tokens per judged candidate" in line


def test_default_jobs_leave_a_core_per_gpu():
    from kernel_agent.agent.placement import default_jobs, threads_per_child

    assert default_jobs(1, cores=16) == 15 and default_jobs(0, cores=2) == 2 and default_jobs(4, cores=2) == 1
    assert threads_per_child(15, cores=16) == 1 and threads_per_child(2, cores=16) == 8


def test_run_rejects_zero_gpus(tmp_path):
    r = _run(["run", "--gpus", "0", "--ledger", str(tmp_path / "l.db")])
    assert r.returncode == 2 and "--gpus must be at least 1" in r.stderr and "Traceback" not in r.stderr


class FakeGpu(FakeEvaluator):
    """Two GPUs that are not there, and children that answer for them: sanitizer stages pass, benchmarks
    report `candidate_ms(op, file)` for the candidate against 1.0 ms for the baseline (0.8 for a promoted
    incumbent) and the anchor (label, ms, whether it serves; one that serves is recorded under its real
    bucket). `seen` logs each (stage, GPU) lease."""

    def __init__(self, candidate_ms, anchor=("anchor:torch", 0.9, False)):
        import threading

        super().__init__(self.sanitize_passes, self.bench_reports)
        self.candidate_ms, self.anchor = candidate_ms, anchor
        self.devices = FakeDevices(["0", "1"], "Fake GPU")
        self.seen, self.lock = [], threading.Lock()

    def sanitize_passes(self, path, op, mode="full", checks=None, env=None, on_ready=None):
        from kernel_agent.sanitizer.verdict import CheckOutcome, Verdict

        if mode == "gpu":
            assert on_ready is not None and on_ready("gpu", lambda: True)  # the loop's GPU checks are gated
            with self.lock:
                self.seen.append(("gpu", env["CUDA_VISIBLE_DEVICES"]))
        return Verdict(
            path,
            op,
            mode,
            checks=[CheckOutcome(c, "passed") for c in (checks or ["static_gate"])],
            source_hash=read_judged(path).hash,
        )

    def bench_reports(self, spec, env=None, on_ready=None):
        assert on_ready("gpu", lambda: True) and on_ready("alone", lambda: True)
        with self.lock:
            self.seen.append(("bench", env["CUDA_VISIBLE_DEVICES"]))
            ms = self.candidate_ms(spec["op"], spec["kernels"][1]["file"])
        time.sleep(0.2)  # long enough for two targets' benchmarks to overlap, each on a GPU of its own
        inc = 1.0 if spec["kernels"][0]["file"] is None else 0.8
        res = [
            {
                "op": spec["op"],
                "shape": key,
                "bucket": self._bucket(spec["op"], key),
                "dtype": spec["dtype"],
                "gpu": "Fake GPU",
                "measurements": [_measured("incumbent", inc), _measured("candidate", ms), _measured(*self.anchor)],
            }
            for key in spec["shapes"]
        ]
        return {"results": res, "error": None}

    def _bucket(self, op, key):
        return OPS[op].bucket(OPS[op].parse_shape(key)) if self.anchor[2] else "b"


def _measured(label, ms, serves=False):
    return {
        "label": label,
        "median_ms": ms,
        "spread_ms": 0.001,
        "n": 5,
        "rounds": [ms] * 5,
        "tbps": 1.0,
        "fraction_of_ceiling": 0.5,
        "ceiling_kind": "memory",
        "implausible": False,
        "error": "",
        "serves": serves,
    }


def _fake_gpu(tmp_path, monkeypatch, candidate_ms, anchor=("anchor:torch", 0.9, False)):
    """A FakeGpu for the loop, serving from a scratch folder of its own."""
    monkeypatch.setenv("KERNEL_AGENT_SERVING_DIR", str(tmp_path / "serving"))
    return FakeGpu(candidate_ms, anchor)


def _fake_loop(tmp_path, led, ops, gpu, proposer=None, placement=None):
    """A Loop over `ops` on the fake GPU; `placement` defaults to the one a run gets (agent.loop.placement_for)
    over the fake's GPUs and children."""
    from kernel_agent.agent import loop as loop_mod
    from kernel_agent.agent.search import SearchProposer

    cfg = RunConfig(
        ops=ops, per_round=2, max_candidates=20, candidates_dir=str(tmp_path / "cands"), bench_shapes="near_serving"
    )
    run = led.start_run(cfg.to_json(), {}, "search", cfg.ops, "Fake GPU", {})
    lp = loop_mod.Loop(
        cfg,
        led,
        run.id,
        proposer or SearchProposer(),
        RunEvents(),
        True,
        "Fake GPU",
        placement or loop_mod.placement_for(cfg, gpu.devices, gpu),
    )
    return lp, run, targets_for(cfg), Budget(cfg, 0, 0.0)


def _benchmarked(led, run_id):
    """Candidates the run timed (the ledger's record of its benchmarks)."""
    return len({b.candidate_id for b in led.bench_results(run_id=run_id)})


def _stream(lp, targets, budget, n):
    """Stream `n` more candidates over `targets`."""
    lp.cfg.max_candidates = budget.used + n
    return lp.stream(targets, budget)


def test_the_gpu_stage_promotes_on_two_gpus_and_the_climb_follows(tmp_path, monkeypatch):
    """The loop's GPU path with the device children replaced by fakes: every candidate is judged on
    a GPU of its own, the faster one is promoted into the serving set, and the next round's variants
    are built on it."""
    from kernel_agent.harness.serving import serving

    fast = {}  # the first configuration of each op is the faster one (the search proposes catalog rewrites too)
    gpu = _fake_gpu(
        tmp_path,
        monkeypatch,
        lambda op, f: 0.8 if os.path.basename(f).startswith("cfg-") and fast.setdefault(op, f) == f else 1.0,
    )
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv", "matmul"], gpu)
    _stream(lp, targets[:2], budget, 4)
    assert {d for _, d in gpu.seen} == {"0", "1"}  # both GPUs lent
    promos = list(serving.load_manifest().entries)
    assert sorted(e.op for e in promos) == ["matmul", "quantize_kv"] and len(led.run_summary(run.id).promotions) == 2
    for e in promos:  # the entry names the shapes it was judged on, all in its bucket
        op = OPS[e.op]
        assert e.shapes and all(op.bucket(op.parse_shape(k)) == e.bucket for k in e.shapes)
    assert _benchmarked(led, run.id) == 4
    statuses = sorted(c.status for c in led.candidates(run_id=run.id))
    assert statuses == ["benchmarked", "benchmarked", "promoted", "promoted"]
    # the next round climbs from the promoted kernels
    before = {c.id for c in led.candidates(run_id=run.id)}
    _stream(lp, targets[:2], budget, 4)
    new = [c for c in led.candidates(run_id=run.id) if c.id not in before]
    # a configuration the search promoted has no file: the serving set rebuilds it from its base
    assert any(e.variant is not None and e.file is None for e in serving.load_manifest().entries)
    served = {e.op: serving.entry_source(e).text for e in serving.load_manifest().entries}
    assert {c.op for c in new} == {"quantize_kv", "matmul"}
    for c in (c for c in new if c.label.startswith("cfg-")):  # a variant of the promoted kernel: all of it is
        # there, bar the renamed `_config` (a rewrite of it, the catalog's, changes the lines it rewrites)
        assert all(line in c.source for line in served[c.op].splitlines() if not line.startswith("def _config(")), c
        assert c.source != served[c.op]
    led.close()


def test_a_candidate_file_changed_after_it_was_judged_is_not_promoted(tmp_path, monkeypatch):
    """The loop holds each candidate's text and its hash; every verdict names the text it judged. A file
    changed between judgement and promotion (here: while it was benchmarked, a winner) is not what the
    promotion checks then judge: nothing is promoted, the run says why, and the serving set gets no text."""
    from kernel_agent.harness.serving import serving

    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 0.5)  # every candidate twice as fast
    timed = gpu.bench

    def bench_then_tamper(spec, env=None, on_ready=None):
        doc = timed(spec, env=env, on_ready=on_ready)
        with open(spec["kernels"][1]["file"], "a") as f:  # the candidate's file, after its timing
            f.write("\nSWAPPED = 1\n")
        return doc

    gpu.bench = bench_then_tamper
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv"], gpu)
    lines = []
    lp.events = RunEvents(candidate=lambda label, status, detail: lines.append((status, detail)))
    _stream(lp, targets[:1], budget, 1)
    (cand,) = led.candidates(run_id=run.id)
    assert cand.status == "benchmarked" and not led.run_summary(run.id).promotions
    assert not serving.load_manifest().kernels()
    (why,) = [d for st, d in lines if "not promoted" in d]
    assert "the file judged is not the candidate's text" in why and "changed after it was written" in why, lines
    led.close()


def test_a_new_run_replays_recorded_timings_and_climbs_on_from_them(tmp_path, monkeypatch):
    """A second run over the same ledger re-proposes what the first one tried: those are not timed
    again, their recorded times (and the incumbent's beside them) steer the climb."""
    from kernel_agent.agent.search import SearchProposer, baseline_config, source_config

    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.3)  # everything slower than the baseline
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["matmul"], gpu)
    _stream(lp, targets[:1], budget, 2)
    first = led.candidates(run_id=run.id)
    assert len(first) == 2 and {c.status for c in first} == {"benchmarked"}
    rows = led.bench_results(candidate_id=first[0].id)
    assert {b.label for b in rows} == {"candidate", "baseline", "anchor:torch"}  # timed side by side
    prop = SearchProposer()
    lp2, run2, _, budget2 = _fake_loop(tmp_path, led, ["matmul"], gpu, prop)
    notes = []
    lp2.events.note = notes.append
    _stream(lp2, targets[:1], budget2, 2)  # a budget of 2 *new* candidates: replays cost nothing
    summary2 = led.run_summary(run2.id)
    assert (
        summary2.duplicates == 2 and summary2.proposals - summary2.duplicates == 2 and _benchmarked(led, run2.id) == 2
    )
    st = prop.state[("matmul", targets[0].bucket)]
    shape = targets[0].shapes[0]
    assert st.best_ms == 1.0 and st.best_cfg == baseline_config("matmul", shape)  # did not move to a slower one
    new = [c for c in led.candidates(run_id=run2.id) if c.id not in {x.id for x in first}]
    assert len(new) == 2 and {c.status for c in new} == {"benchmarked"}
    tried = {source_config("matmul", c.source, shape) for c in first}
    assert any(c.label.startswith("cfg-") for c in new)
    for c in (c for c in new if c.label.startswith("cfg-")):  # (a catalog rewrite keeps the configuration)
        cfg = source_config("matmul", c.source, shape)
        assert cfg not in tried and sum(a != b for a, b in zip(cfg, st.best_cfg)) == 1
    # what the first run judged is in the second run's context (a model's prompt lists it)
    ctx = lp2.context(targets[0])
    earlier = [a for a in ctx.attempts if "(an earlier run)" in a.summary]
    assert sorted(a.label for a in earlier) == sorted(c.label for c in first)
    assert all(a.passed and a.median_ms == pytest.approx(1.3) for a in earlier)
    led.close()


def test_a_proposer_that_only_repeats_judged_sources_is_stopped(tmp_path, monkeypatch):
    """Replays cost no budget, so a proposer stuck on sources the ledger has judged must not spin: after
    a streak of them its target counts as exhausted, and the run says so."""
    from kernel_agent.agent.proposal import Proposal, Proposer

    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.3)
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv"], gpu)
    _stream(lp, targets[:1], budget, 1)
    (judged,) = led.candidates(run_id=run.id)

    class Parrot(Proposer):
        name = "parrot"
        calls = 0

        def propose(self, ctx, n):
            Parrot.calls += 1
            return [Proposal("quantize_kv", judged.source, f"again-{Parrot.calls}", "parrot")]

    lp2, run2, _, budget2 = _fake_loop(tmp_path, led, ["quantize_kv"], gpu, Parrot())
    notes = []
    lp2.events.note = notes.append
    stop = _stream(lp2, targets[:1], budget2, 5)
    assert stop == "the proposer has nothing new to propose"
    summary2 = led.run_summary(run2.id)
    assert Parrot.calls == DUPLICATE_STREAK_LIMIT + 1 and summary2.proposals - summary2.duplicates == 0
    assert summary2.duplicates == 1 and any("repeated sources" in n for n in notes)
    led.close()


def test_the_deadline_stops_what_is_in_flight_and_a_later_run_finishes_it(tmp_path, monkeypatch):
    """At the deadline the stream stops at once: the candidate being timed and the one waiting for the
    GPU stay 'verified' (nothing lost), nothing new is proposed past it, and a later run that proposes
    them again times them without running their CPU stages again."""

    def slow(op, f):
        time.sleep(1.5)
        return 1.3

    gpu = _fake_gpu(tmp_path, monkeypatch, slow)
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv"], gpu)
    lp.deadline = time.time() + 0.8
    t0 = time.time()
    stop = _stream(lp, targets[:1], budget, 2)  # two candidates for one target: timed one after the other
    assert "time limit" in stop and time.time() - t0 < 0.8 + 8 + 2
    first = led.candidates(run_id=run.id)
    assert sorted(c.status for c in first) == ["verified", "verified"]
    assert lp.recorder.unjudged == 2 and _benchmarked(led, run.id) == 0
    lp.placement.close()
    lp.deadline = time.time() - 1  # already past: nothing is proposed
    assert "time limit" in _stream(lp, targets[:1], budget, 2)
    assert len(led.candidates(run_id=run.id)) == 2
    # a later run with a GPU that proposes them again times them (their CPU stages not rerun)
    n_checks = {c.id: len([k for k in led.checks(c.id) if k.mode != "gpu"]) for c in first}
    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.3)
    lp2, run2, _, budget2 = _fake_loop(tmp_path, led, ["quantize_kv"], gpu)
    _stream(lp2, targets[:1], budget2, 2)
    assert {led.candidate(c.id).status for c in first} == {"benchmarked"} and _benchmarked(led, run2.id) == 2
    assert {c.id: len([k for k in led.checks(c.id) if k.mode != "gpu"]) for c in first} == {
        cid: n for cid, n in n_checks.items()
    }  # their CPU stages were not run again
    led.close()


def test_run_shapes_per_op():
    from kernel_agent.agent.run_config import RunConfig, run_shapes, targets_for
    from kernel_agent.ops import get_op

    ops = ["matmul", "quantize_kv"]
    spec = "matmul:256,8192,8192;matmul:M=512,N=4096,K=4096;quantize_kv:4096,8,64"
    assert [s.key() for s in run_shapes("matmul", spec, ops)] == ["M=256,N=8192,K=8192", "M=512,N=4096,K=4096"]
    assert [s.key() for s in run_shapes("quantize_kv", spec, ops)] == ["T=4096,H=8,D=64"]
    # an op the spec does not name keeps its serving shapes
    assert run_shapes("quantize_kv", "matmul:256,8192,8192", ops) == get_op("quantize_kv").shapes("serving")
    assert [s.key() for s in run_shapes("matmul", "1,64,64", ["matmul"])] == ["M=1,N=64,K=64"]
    for bad, why in [
        ("256,8192,8192", "need the op of each shape"),
        ("matmul:1,2,3;4,5,6", "every shape or of none"),
        ("attention:1,2,128,64", "does not include"),
    ]:
        with pytest.raises(ValueError, match=why):
            run_shapes("matmul", bad, ops)
    cfg = RunConfig(ops=ops, bench_shapes=spec)
    assert [(t.op, [s.key() for s in t.shapes]) for t in targets_for(cfg)][:2] == [
        ("matmul", ["M=256,N=8192,K=8192"]),
        ("quantize_kv", ["T=4096,H=8,D=64"]),
    ]


def test_run_refuses_shapes_without_ops_for_several_ops(tmp_path):
    r = _run(["run", "--ops", "matmul,quantize_kv", "--shapes", "256,8192,8192", "--ledger", str(tmp_path / "l.db")])
    assert r.returncode == 2 and "--shapes:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "l.db").exists() or Ledger(str(tmp_path / "l.db")).runs() == []


def test_replayed_times_are_read_as_the_rule_judged_them(tmp_path, monkeypatch):
    """A small kernel's recorded benchmark is replayed with its graph replay times, as the live path fed
    them to the proposer, not with host-delayed event times."""
    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.0)
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["matmul"], gpu)
    c, _ = led.add_candidate("matmul", as_written("x = 1\n"), "search", run.id, label="c")
    for label, ms, graph in (("candidate", 0.0900, 0.0400), ("baseline", 0.0500, 0.0440), ("anchor:torch", 0.04, 0.03)):
        led.record_bench(
            run_id=run.id,
            candidate_id=c.id,
            label=label,
            op="matmul",
            shape_key="M=1,N=8192,K=8192",
            bucket="m1-klarge",
            dtype="bfloat16",
            gpu_name="Fake GPU",
            median_ms=ms,
            spread_ms=0.0002,
            n_samples=5,
            graph_ms=graph,
            extra={"graph_spread_ms": 0.0002},
        )
    assert lp.recorder.bench_ms(c.id) == 0.0400 and lp.recorder.bench_ms(c.id, incumbent=True) == 0.0440
    led.close()


@pytest.mark.parametrize("late", [False, True], ids=["while-in-flight", "after-it-was-timed"])
def test_a_source_proposed_for_two_buckets_is_sanitized_once_and_timed_for_each(tmp_path, monkeypatch, late):
    """int8 decode has several serving buckets and the search proposes the same evict-first rewrite for each:
    one candidate, one sanitizer run per stage, one benchmark per bucket; also when the later buckets' proposals
    come only after the candidate was timed for the first (a slow proposer), where it was promoted."""
    first = {}  # the first bucket's folder: the candidate wins there only
    gpu = _fake_gpu(
        tmp_path,
        monkeypatch,
        lambda op, f: 0.5 if late and os.path.dirname(f) == first.setdefault(0, os.path.dirname(f)) else 1.3,
    )
    sanitized = []
    passes = gpu.sanitize

    def counting(path, op, mode="full", **kw):
        sanitized.append((open(path).read(), mode))
        return passes(path, op, mode, **kw)

    gpu.sanitize = counting
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["decode_attention_int8"], gpu)
    lp.cfg.bench_shapes = "serving"
    from kernel_agent.agent.run_config import targets_for

    both = targets_for(lp.cfg)
    int8 = OPS["decode_attention_int8"]
    assert len(both) == len({int8.bucket(s) for s in int8.shapes("serving")}) >= 2
    lp.cfg.per_round = 1
    real = lp.proposer.propose

    def propose(ctx, n):
        if late and ctx.bucket != both[0].bucket:  # wait until the first bucket's benchmark was recorded
            deadline = time.time() + 60
            while not led.bench_results(run_id=run.id) and time.time() < deadline:
                time.sleep(0.05)
        # only it, per bucket (asked among more: a structural move the bucket suits comes first in the search)
        return [p for p in real(ctx, max(n, 8)) if p.label == "evict-first"][:n]

    lp.proposer.propose = propose
    assert _stream(lp, both, budget, 20) == "the proposer has nothing new to propose"
    cands = led.candidates(run_id=run.id)
    assert len(cands) == 1 and cands[0].label == "evict-first"
    promotion_checks = ["gpu"] if late else []  # compute-sanitizer before the one promotion
    assert sorted(m for _, m in sanitized) == sorted(["full", "gpu", "quick"] + promotion_checks)  # each stage once
    assert len([c for c in led.checks(cands[0].id) if c.mode == "quick"]) == 1
    assert sum(1 for what, _ in gpu.seen if what == "bench") == len(both)  # timed against each bucket's incumbent
    rows = led.bench_results(candidate_id=cands[0].id)
    drawn = {b.shape_key for b in rows if "drawn_in_bucket_seed" in (b.extra or {})}
    assert {b.shape_key for b in rows} - drawn == {s.key() for t in both for s in t.shapes}
    assert len(drawn) == len(both)  # and one shape drawn inside each bucket, recorded with its seed
    if late:  # promoted in the first bucket, and timed but slower in the others, it stays "promoted"
        assert len(led.run_summary(run.id).promotions) == 1 and led.candidate(cands[0].id).status == "promoted"
    led.close()


def test_a_source_proposed_again_under_another_label_prints_the_name_the_ledger_holds(tmp_path, monkeypatch):
    """A model names each proposal anew (model-1, model-3): the same source proposed for a second bucket while
    the first is judged is the same candidate, and every line printed names it as the ledger holds it."""
    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.3)
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["decode_attention_int8"], gpu)
    lp.cfg.bench_shapes = "serving"
    from kernel_agent.agent.run_config import targets_for

    both = targets_for(lp.cfg)
    lp.cfg.per_round = 1
    real = lp.proposer.propose
    names = iter(range(1, 100))

    def propose(ctx, n):
        return [dataclasses.replace(p, label=f"model-{next(names)}") for p in real(ctx, n) if p.label == "evict-first"]

    printed, notes = [], []
    lp.proposer.propose = propose
    lp.events.candidate = lambda label, status, detail: printed.append(label)
    lp.events.note = notes.append
    _stream(lp, both, budget, 20)
    cands = led.candidates(run_id=run.id)
    assert len(cands) == 1 and printed and set(printed) == {cands[0].label}, (printed, cands[0].label)
    assert any(f"the same source as candidate #{cands[0].id} {cands[0].label}" in n for n in notes), notes
    led.close()


def test_the_gpu_checks_run_beside_the_full_stage_and_a_failure_there_rejects_once(tmp_path, monkeypatch):
    """After the quick stage the GPU checks start beside the full sanitizer; a candidate that fails
    them is rejected once (the full stage's checks, arriving later, are kept without changing that)
    and never benchmarked; one that passes both is benchmarked."""
    from kernel_agent.sanitizer.verdict import CheckOutcome, Verdict

    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.0)
    events = []

    def sanitize(path, op, mode="full", checks=None, env=None, on_ready=None):
        if on_ready is not None:
            assert on_ready("gpu", lambda: True)
        events.append((mode, "start", os.path.basename(path), time.time()))
        bad = mode == "gpu" and "evict-first" in path
        if mode == "full":
            time.sleep(0.6)  # the full stage outlasts the GPU check beside it
        events.append((mode, "end", os.path.basename(path), time.time()))
        outcome = (
            CheckOutcome("determinism", "failed", "run 2 differs")
            if bad
            else CheckOutcome((checks or ["static_gate"])[0], "passed")
        )
        return Verdict(path, op, mode, checks=[outcome], source_hash=read_judged(path).hash)

    gpu.sanitize = sanitize
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv"], gpu)
    _stream(lp, targets[:1], budget, 2)
    cands = {c.label: c for c in led.candidates(run_id=run.id)}
    assert set(cands) == {"evict-first", next(k for k in cands if k.startswith("cfg-"))}
    bad, good = cands.pop("evict-first"), next(iter(cands.values()))
    assert bad.status == "rejected" and "determinism" in json.dumps(bad.verdict)
    assert {c.name for c in led.checks(bad.id, mode="full")} == {"static_gate"}  # kept, status unchanged
    assert good.status == "benchmarked" and _benchmarked(led, run.id) == 1
    assert [s for s, _ in gpu.seen].count("bench") == 1
    for name in ("evict-first", os.path.basename(good.path)):  # the GPU check started before full ended
        t_gpu = next(t for m, e, n, t in events if m == "gpu" and e == "start" and n.startswith(name[:10]))
        t_full_end = next(t for m, e, n, t in events if m == "full" and e == "end" and n.startswith(name[:10]))
        assert t_gpu < t_full_end
    led.close()


def test_a_stage_lost_with_its_machine_is_queued_again_and_judged_once(tmp_path, monkeypatch):
    """A task whose machine went away (a cluster node that died) comes back as TaskLost: the loop runs that
    stage again instead of judging the candidate on it, and each candidate is judged once: every check and
    benchmark recorded once, nothing rejected. A stage lost more often than the loop retries is left
    unjudged, at the stage it reached, for a resume; so is a stage that needs a GPU once none is left."""
    from collections import Counter
    from concurrent.futures import Future

    from kernel_agent.agent.placement import LocalPlacement, TaskLost, default_jobs

    class LosingPlacement(LocalPlacement):
        """Loses each task that `loses(task)` picks, as a cluster node that died would."""

        def loses(self, task):
            return False

        def submit(self, task):
            if self.loses(task):
                fut = Future()
                fut.set_result(TaskLost("node lost (NodeDiedError)"))
                return fut
            return super().submit(task)

    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.0)
    led = Ledger(str(tmp_path / "l.db"))
    placement = LosingPlacement(default_jobs(2), gpu.devices.gpus, evaluator=gpu)
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv"], gpu, placement=placement)
    notes = []
    lp.events = RunEvents(note=notes.append)
    lost = Counter()
    always_lost = set()  # task kinds whose every task is lost

    def first_of_each_kind(task):
        if lost[task.kind] < 1 or task.kind in always_lost:  # the first of each kind goes down with its node
            lost[task.kind] += 1
            return True
        return False

    placement.loses = first_of_each_kind
    _stream(lp, targets[:1], budget, 2)
    cands = led.candidates(run_id=run.id)
    assert len(cands) == 2 and {c.status for c in cands} == {"benchmarked"}
    assert lost == Counter({"quick": 1, "full": 1, "gpu": 1, "bench": 1})
    assert sum("queued again" in n for n in notes) == 4
    for c in cands:
        checks = Counter((x.mode, x.name) for x in led.checks(c.id))
        assert set(checks) >= {("quick", "static_gate"), ("full", "static_gate"), ("gpu", "determinism")}
        assert max(checks.values()) == 1
    assert [s for s, _ in gpu.seen].count("bench") == 2 and "rejected" not in {c.status for c in cands}

    always_lost.add("quick")  # a third candidate whose quick stage is lost every time
    _stream(lp, targets[:1], budget, 1)
    third = [c for c in led.candidates(run_id=run.id) if c.id not in {c.id for c in cands}]
    assert len(third) == 1 and third[0].status == "proposed" and led.checks(third[0].id) == []
    assert lost["quick"] == 2 + TASK_LOST_RETRIES and lp.recorder.unjudged == 1
    assert any("left at that stage" in n and "--resume" in n for n in notes)

    always_lost.clear()  # a fourth whose benchmark loses the last GPU: the stream ends, it stays verified
    real_gpus = list(lp.placement.gpus)

    def bench_loses_the_gpus(task):
        if task.kind == "bench":
            lp.placement.gpus = []
            return True
        return False

    placement.loses = bench_loses_the_gpus
    assert _stream(lp, targets[:1], budget, 1) == "no GPU is left to judge on"
    fourth = led.candidates(run_id=run.id)[-1]
    assert fourth.status == "verified" and lp.recorder.unjudged == 2
    assert any(n.startswith("no GPU is left: stopped 1 candidate(s)") for n in notes)
    lp.placement.gpus = real_gpus
    led.close()


def test_the_live_status_line(monkeypatch):
    """What the status line says, and that on a terminal it is drawn in place below the printed lines
    (transient: gone once the run ends) while elsewhere it is a plain line at most once a minute."""
    import io

    from rich.console import Console

    from kernel_agent.agent import ui
    from kernel_agent.agent.work import LiveStatus

    st = LiveStatus(125, 600, 3, None, {"quick": 1, "gpu": 2, "bench": 1}, 4, 7, 0.031)
    assert st.describe() == "2:05/10:00 cand 3; quick 1 full 0 gpu 2 bench 1; queued 4; judged 7; best +3.1%"
    assert len(st.describe()) <= 80
    assert (
        LiveStatus(3725, 28800, 5, 10, {}, 0, 0, None)
        .describe()
        .startswith("1:02:05/8:00:00 cand 5/10; quick 0 full 0;")
    )
    buf = io.StringIO()
    monkeypatch.setattr(ui, "_console", Console(file=buf, force_terminal=True, width=100, highlight=False))
    monkeypatch.delenv("TERM", raising=False)
    line = ui.StatusLine()
    line.update("status: one")
    ui.line("  verified  cfg-1: passed")
    line.update("status: two")
    line.close()
    out = buf.getvalue()
    assert "cfg-1: passed" in out and "status: two" in out  # drawn live, then cleared (transient)
    buf = io.StringIO()
    monkeypatch.setattr(ui, "_console", Console(file=buf, force_terminal=False))
    printed = []
    monkeypatch.setattr(ui, "line", lambda text, style=None: printed.append(text))
    plain = ui.StatusLine(plain_every_s=60)
    plain.update("status: a")
    plain.update("status: b")  # within the minute: not printed
    assert printed == ["status: a"]
    plain.close()


@exhaustive  # two whole runs on one ledger: minutes
def test_a_second_run_on_the_same_ledger_judges_only_new_candidates(tmp_path):
    """Two consecutive default-style runs of the built-in search on one ledger: the second replays
    what the first judged (free) and judges as many new candidates as its budget."""
    db = tmp_path / "l.db"
    args = [
        "run",
        "--ops",
        "quantize_kv",
        "--candidates",
        "1",
        "--per-round",
        "1",
        "--ledger",
        str(db),
        "--candidates-dir",
        str(tmp_path / "c"),
    ]
    first = _run(args)
    assert first.returncode == 0, first.stderr[-2000:]
    second = _run(args)
    assert second.returncode == 0, second.stderr[-2000:]
    led = Ledger(str(db))
    r1, r2 = sorted(led.runs(), key=lambda r: r.started_at)
    judged1 = {c.id for c in led.candidates(run_id=r1.id)}
    props2 = led.proposals(run_id=r2.id)
    new2 = [p.candidate_id for p in props2 if not p.duplicate]
    assert len(judged1) == 1 and len(new2) == 1 and not judged1 & set(new2)
    assert [p.candidate_id for p in props2 if p.duplicate] == list(judged1)  # replayed, not judged again
    assert led.candidate(new2[0]).status == "verified" and led.candidate(new2[0]).first_run_id == r2.id
    assert "replayed: 1 candidate(s) judged by earlier runs" in second.stdout  # apart from what it judged
    led.close()


def test_targets_are_picked_in_proportion_to_their_weight():
    from kernel_agent.agent.run_config import weighted_pick

    def picks(weights, n, exhausted=()):
        asked, start, out = [0] * len(weights), 0, []
        for _ in range(n):
            i = weighted_pick(weights, asked, set(exhausted), start)
            if i is None:
                break
            asked[i] += 1
            start = (i + 1) % len(weights)
            out.append(i)
        return out

    assert picks([1.0, 1.0, 1.0], 6) == [0, 1, 2, 0, 1, 2]  # equal weights: round-robin
    got = picks([0.6, 0.3, 0.1], 100)
    assert [got.count(i) for i in range(3)] == [60, 30, 10]
    assert set(picks([0.6, 0.3, 0.1], 10, exhausted={0})) == {1, 2}
    assert picks([1.0, 1.0], 3, exhausted={0, 1}) == []


def test_a_model_step_sets_the_targets_and_their_weights():
    from kernel_agent.agent.run_config import RunConfig, targets_for
    from kernel_agent.harness.workload.model_step import PRESETS

    cfg = RunConfig(target_model=PRESETS["llama-3-8b"].to_json(), target_points="32x8192")
    ts = targets_for(cfg)
    assert [t.weight for t in ts] == sorted((t.weight for t in ts), reverse=True)
    assert abs(sum(t.weight for t in ts) - 1.0) < 1e-9
    by = {(t.op, t.bucket): t for t in ts}
    mm = by[("matmul", "m64-klarge")]  # QKV, O, gate/up and down at M = 32, one bucket
    assert {s.key() for s in mm.shapes} == {
        "M=32,N=6144,K=4096",
        "M=32,N=4096,K=4096",
        "M=32,N=28672,K=4096",
        "M=32,N=4096,K=14336",
    }
    assert ("decode_attention", "c8k-g4-d128") in by and ("decode_attention_int8", "c8k-g4-d128") in by
    cfg.ops = ["decode_attention"]
    assert [(t.op, t.bucket) for t in targets_for(cfg)] == [("decode_attention", "c8k-g4-d128")]


def test_a_candidate_must_beat_torch_where_torch_serves_and_the_bucket_then_serves_torch(tmp_path, monkeypatch):
    """With cuBLAS faster than the baseline, a candidate 15% faster than the baseline but slower than
    cuBLAS is not promoted, and the benchmark leaves the bucket to torch in the serving set."""
    from kernel_agent.harness.serving import serving

    gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 0.85, anchor=("anchor:torch.matmul", 0.8, True))
    led = Ledger(str(tmp_path / "l.db"))
    lp, run, targets, budget = _fake_loop(tmp_path, led, ["matmul"], gpu)
    notes = []
    lp.events.note = notes.append
    _stream(lp, targets[:1], budget, 2)
    assert _benchmarked(led, run.id) == 2 and not led.run_summary(run.id).promotions
    reasons = [a.summary for a in lp.recorder.attempts[("matmul", targets[0].bucket)]]
    assert all("slower than torch (torch.matmul)" in r for r in reasons), reasons
    entries = serving.load_manifest().entries
    assert [(e.bucket, e.impl) for e in entries] == [(targets[0].bucket, "torch")]
    assert any("it serves the bucket" in n for n in notes)
    led.close()


def test_a_code_model_that_repeats_itself_gets_a_changed_prompt_and_the_bucket_is_given_up_after_3(
    tmp_path, monkeypatch
):
    """A reply repeating a source already tried for the bucket is answered with a prompt that says so, at a
    higher temperature; after 3 repeats in a row the bucket is given up (not ~25 calls), and the run says so."""
    from kernel_agent.agent.model import REPEAT_LIMIT, ModelConfig, ModelProposer

    with open(GOOD) as f:
        same = f.read()
    stub = Stub([{"reply": "```python\n" + same + "```"}])
    port = stub.start()
    try:
        model = ModelConfig("scripted", f"http://127.0.0.1:{port}/v1", "x", max_retries=0, concurrency=1, timeout_s=10)
        gpu = _fake_gpu(tmp_path, monkeypatch, lambda op, f: 1.3)
        led = Ledger(str(tmp_path / "l.db"))
        lp, run, targets, budget = _fake_loop(tmp_path, led, ["quantize_kv"], gpu, ModelProposer(model))
        lp.cfg.per_round = 1
        notes = []
        lp.events.note = notes.append
        stop = _stream(lp, targets[:1], budget, 20)
    finally:
        stub.stop()
    assert stop == "the proposer has nothing new to propose"
    # one new candidate, then REPEAT_LIMIT repeats (and at most one more ask once that candidate's result is in)
    assert REPEAT_LIMIT + 1 <= len(stub.requests) <= REPEAT_LIMIT + 2, len(stub.requests)
    prompts = [r["messages"][1]["content"] for r in stub.requests]
    temps = [r["temperature"] for r in stub.requests]
    # the first reply is new, the second the first repeat: the third prompt is the first changed one
    assert all("repeated a file already tried" not in p for p in prompts[:2]) and temps[:2] == [0.7, 0.7]
    assert "Your last 1 reply repeated a file already tried" in prompts[2] and temps[2] == pytest.approx(1.0)
    assert "Your last 2 replies repeated a file already tried" in prompts[3] and temps[3] == pytest.approx(1.3)
    assert any("repeated sources already tried 3 times in a row" in n for n in notes)
    assert len(led.candidates(run_id=run.id)) == 1
    # the tokens the stub counted, per judged candidate, on the throughput line (`show RUN`, `history`, run's end)
    th = lp.throughput()
    reply = len("```python\n" + same + "```") // 4  # the stub's count: a token per 4 characters
    spent = sum(sum(len(m["content"]) // 4 for m in r["messages"]) + reply for r in stub.requests)
    assert th.tokens == spent > 0 and th.judged == 1
    assert f"{spent} model tokens per judged candidate" in th.describe(1)
    # the candidate's GPU seconds by stage, under its id, for the run's notes
    (cand,) = led.candidates(run_id=run.id)
    assert list(th.gpu_s_by_candidate) == [str(cand.id)] and {"gpu", "bench"} <= set(
        th.gpu_s_by_candidate[str(cand.id)]
    )
    led.close()

"""The sanitizer's parts on their own: static gate, host guard, interpreter hooks, runner, CLI."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
import triton
import triton.language as tl

from kernel_agent.isolation import isolation
from kernel_agent.sanitizer import runner
from kernel_agent.sanitizer.guard import GuardViolation, HostGuard
from kernel_agent.sanitizer.interp import Instrumentation, Watched
from kernel_agent.sanitizer.report import merge_gpu
from kernel_agent.sanitizer.static_gate import check_source
from kernel_agent.sanitizer.verdict import Verdict, VerdictKind
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "kernels", "baseline")
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]

HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n@triton.jit\ndef _k(x):\n    pass\n\n"


# -- static gate ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8"])
def test_gate_accepts_the_baselines(op):
    with open(os.path.join(BASELINE, f"{op}.py")) as f:
        assert check_source(f.read(), op).passed


@pytest.mark.parametrize(
    "body,rule",
    [
        ("import os\ndef matmul(a, b):\n    return a\n", "import"),
        ("import ctypes\ndef matmul(a, b):\n    return a\n", "import"),
        ("from kernel_agent.ops import get_op\ndef matmul(a, b):\n    return a\n", "import"),
        (
            "def matmul(a, b):\n    if a.shape[0] > 4096:\n        return torch.matmul(a, b)\n    return a\n",
            "torch-compute",
        ),
        ("def matmul(a, b):\n    return a @ b\n", "torch-compute"),
        ("def matmul(a, b):\n    n = int(a.sum().item())\n    return a\n", "torch-compute"),
        ("CACHE = {}\ndef matmul(a, b):\n    return a\n", "state"),
        ("def matmul(a, b, memo={}):\n    return a\n", "state"),
        ("def matmul(a, b):\n    global X\n    return a\n", "state"),
        ("def matmul(a, b):\n    matmul.last = a\n    return a\n", "state"),
        (
            "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef _j(x):\n    pass\n"
            "def matmul(a, b):\n    return a\n",
            "autotune",
        ),
        ("def matmul(a, b):\n    s = torch.cuda.Stream()\n    return a\n", "torch-compute"),
        ("def matmul(a, b):\n    return getattr(torch, 'mm')(a, b)\n", "forbidden-call"),
        ("def matmul(a, b):\n    return a.__class__\n", "introspection"),
        ("def matmul(a, b):\n    try:\n        return a\n    except Exception:\n        return b\n", "structure"),
        ("def matmul(a, b):\n    return a\nclass C:\n    pass\n", "state"),
        ("def matmul(a, b:\n", "syntax"),
    ],
)
def test_gate_rejects_each_cheat_shape(body, rule):
    r = check_source(HEADER + body, "matmul")
    assert not r.passed and rule in {f.rule for f in r.findings}, r.describe()


def test_gate_rejects_libdevice_and_inline_asm_inside_kernels():
    src = (
        "import torch\nimport triton\nimport triton.language as tl\n@triton.jit\ndef _k(x_ptr):\n"
        "    y = tl.inline_asm_elementwise('mov', '=r', [], dtype=tl.int32, is_pure=True, pack=1)\n"
        "def matmul(a, b):\n    return a\n"
    )
    assert "unverifiable" in {f.rule for f in check_source(src, "matmul").findings}


def test_gate_requires_the_op_function_and_a_kernel():
    assert "contract" in {
        f.rule for f in check_source("import torch\ndef other(a):\n    return a\n", "matmul").findings
    }


# -- host guard ----------------------------------------------------------------------------


def test_guard_allows_allocation_shapes_and_views_and_fills_sentinels():
    a = torch.randn(4, 6)
    with HostGuard(sentinel=0) as g:
        out = torch.empty(3, 3)
        v = a.view(24).reshape(4, 6).t()
        _ = a.shape, a.stride(), a.dtype, a.is_contiguous()
    assert torch.isnan(out).all() and v.shape == (6, 4) and g.allocations == 1
    with HostGuard(sentinel=1):
        codes = torch.empty(2, dtype=torch.int8)
    assert (codes == 99).all()


@pytest.mark.parametrize(
    "action",
    [
        lambda a: torch.matmul(a, a),
        lambda a: a.sum(),
        lambda a: a.t().contiguous(),  # a copy
        lambda a: a.t().reshape(-1),  # a copy in disguise
        lambda a: a.item() if a.numel() == 1 else a[0, 0].item(),
        lambda a: torch.zeros(3),
        lambda a: a == a,
    ],
)
def test_guard_stops_compute_copies_and_readbacks(action):
    a = torch.randn(4, 4)
    with pytest.raises(GuardViolation):
        with HostGuard():
            action(a)


# -- interpreter hooks ---------------------------------------------------------------------


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n + EXTRA, other=0.0)
    tl.store(y_ptr + offs, x, mask=offs < n)


@triton.jit
def _neighbour_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    # program i reads what program i - 1 wrote: an order dependence (a race on a GPU)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    prev = tl.load(y_ptr + tl.maximum(offs - BLOCK, 0))
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) + prev * (pid > 0))


def _watched(**tensors):
    return [Watched(k, v) for k, v in tensors.items()]


def test_bounds_catch_a_read_past_the_view_inside_the_allocation_before_it_happens():
    storage = torch.arange(40, dtype=torch.float32)
    x = storage[:30]  # the allocation is larger than the tensor
    y = torch.empty(30)
    inst = Instrumentation(watched=_watched(x=x))
    with inst.active():
        with pytest.raises(Exception):
            _copy_kernel[(1,)](x, y, 30, EXTRA=1, BLOCK=32)
    assert inst.violations and "load" in inst.violations[0] and "`x`" in inst.violations[0]
    assert "past the end of the tensor, inside its allocation" in inst.violations[0]
    ok = Instrumentation(watched=_watched(x=x))
    with ok.active():
        _copy_kernel[(1,)](x, y, 30, EXTRA=0, BLOCK=32)  # masked lanes are not accesses
    assert not ok.violations and torch.equal(y, x)


@triton.jit
def _address_kernel(x_ptr, y_ptr, n, CAST: tl.constexpr, BLOCK: tl.constexpr):
    # scales its copy when y lies right after x in memory: what the layout of the caller's arguments can tell
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if CAST == 1:
        x = tl.where((x_ptr + n + offs * 0).to(tl.int64) == (y_ptr + offs * 0).to(tl.int64), x * 2.0, x)
    if CAST == 2:
        x = tl.where(tl.cast(y_ptr + offs * 0, tl.int64, bitcast=True) % 1024 == 0, x * 2.0, x)
    tl.store(y_ptr + offs, x, mask=offs < n)


@pytest.mark.parametrize("cast", [1, 2])
def test_a_kernel_that_reads_its_own_addresses_is_refused(cast):
    """A pointer converted to an integer (`.to`, a bitcast) is refused on every run: with its addresses a kernel
    tells the caller's layout (two views of one cache) from the checks' (a storage each)."""
    x, y = torch.randn(16), torch.empty(16)
    inst = Instrumentation(watched=_watched(x=x))
    with inst.active():
        with pytest.raises(Exception):
            _address_kernel[(1,)](x, y, 16, CAST=cast, BLOCK=16)
    assert inst.violations and "a pointer converted to an integer" in inst.violations[0]
    ok = Instrumentation(watched=_watched(x=x))
    with ok.active():
        _address_kernel[(1,)](x, y, 16, CAST=0, BLOCK=16)
    assert not ok.violations and torch.equal(y, x)


def test_bounds_make_inputs_read_only():
    x = torch.randn(16)
    inst = Instrumentation(watched=_watched(x=x))
    with inst.active():
        with pytest.raises(Exception):
            _copy_kernel[(1,)](x, x, 16, EXTRA=0, BLOCK=16)  # writes into its input
    assert "store" in inst.violations[0] and "read-only" in inst.violations[0]


def test_unreadable_elements_are_violations_even_when_in_bounds():
    x = torch.randn(16)
    readable = torch.ones(16, dtype=torch.bool)
    readable[10] = False  # e.g. a cache slot past seq_len
    y = torch.empty(16)
    inst = Instrumentation(watched=[Watched("k_cache", x, readable)])
    with inst.active():
        with pytest.raises(Exception):
            _copy_kernel[(1,)](x, y, 16, EXTRA=0, BLOCK=16)
    assert "`k_cache`[10]" in inst.violations[0] and "must not read" in inst.violations[0]


def test_program_order_permutation_exposes_dependencies():
    x = torch.ones(64)
    outs = []
    for order in ("natural", "reverse"):
        y = torch.zeros(64)
        with Instrumentation(bounds=False, order=order).active():
            _neighbour_kernel[(4,)](x, y, BLOCK=16)
        outs.append(y)
    assert not torch.equal(outs[0], outs[1])


# -- the isolated runner -------------------------------------------------------------------


def test_a_crash_is_a_verdict_naming_the_running_check(tmp_path, monkeypatch):
    crasher = tmp_path / "crash_worker.py"
    crasher.write_text(
        "import json, os, signal, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "json.dump({'running': 'bounds', 'checks': [{'name': 'static_gate', 'status': 'passed'}]}, open(out, 'w'))\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    real_popen = subprocess.Popen

    def fake_popen(cmd, *a, **kw):
        return real_popen([sys.executable, str(crasher)] + cmd[3:], *a, **kw)

    monkeypatch.setattr(isolation.subprocess, "Popen", fake_popen)
    v = runner.run_isolated(os.path.join(BASELINE, "matmul.py"), "matmul", "quick", timeout_s=60)
    assert not v.passed and "SIGSEGV" in v.error and "`bounds`" in v.error
    assert [c.name for c in v.checks] == ["static_gate", "bounds"]


def test_a_hang_is_a_verdict(tmp_path):
    hang = tmp_path / "hang.py"
    hang.write_text(
        HEADER.replace("    pass\n", "    i = 0\n    while i < 1:\n        i = i + 0\n")
        + "def matmul(a, b):\n    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)\n"
        "    _k[(1,)](c)\n    return c\n"
    )
    # 20 s: the judge and the candidate's process start and load within it even on a busy machine (with
    # less, the deadline can pass before `runs`, and the verdict names `load`: still not verified)
    v = runner.run_isolated(str(hang), "matmul", "quick", timeout_s=20)
    assert not v.passed and v.error.startswith("not verified: time limit") and "`runs`" in v.error, v.to_json()
    assert v.timed_out and v.kind == VerdictKind.TIME_LIMIT, v.to_json()


def test_a_verdicts_kind_survives_its_document_and_an_older_document_is_read_by_its_words():
    """The kind is what the loop reads (a time-limit verdict is judged again); a verdict stored before verdicts
    had a kind says the time limit's only by its error's words, and reads back as the same kind."""
    stopped = Verdict("f.py", "matmul", "quick")
    stopped.stop_for_time_limit("(20s) during check `runs` (a hang, or too slow to check here)")
    assert stopped.error.startswith("not verified: time limit") and not stopped.passed
    doc = json.loads(json.dumps(stopped.to_json()))
    assert doc["kind"] == "time limit" and Verdict.from_json(doc).timed_out
    older = {k: v for k, v in doc.items() if k != "kind"}
    assert Verdict.from_json(older).kind == VerdictKind.TIME_LIMIT
    failed = Verdict("f.py", "matmul", "quick", error="crashed with SIGSEGV during check `bounds`")
    assert Verdict.from_json(failed.to_json()).kind == VerdictKind.JUDGED
    assert Verdict.from_json({k: v for k, v in failed.to_json().items() if k != "kind"}).kind == VerdictKind.JUDGED
    merged = merge_gpu(Verdict("f.py", "matmul", "full", seed=1), stopped)
    assert merged.timed_out and merged.error == stopped.error


def test_a_bf16_only_path_passes_on_cpu_and_the_verdict_says_it_is_verified_on_gpu_only():
    """The interpreter has no bfloat16 tensors, so a branch on the bf16 dtype never runs in the CPU checks:
    the verdict says so; the GPU stage catches the fault (tests/test_gpu.py)."""
    path = os.path.join(ROOT, "tests", "candidates", "gpu_faulty", "matmul", "bf16_only_drops_the_partial_k_tile.py")
    v = runner.run_isolated(path, "matmul", "full", seed=0)
    assert v.passed, v.summary()
    diff = next(c for c in v.checks if c.name == "differential")
    assert "bf16 path verified on GPU only" in diff.detail


# -- the command line ----------------------------------------------------------------------


def _cli(*args, **kw):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=ROOT, timeout=600, **kw)


def test_cli_usage_errors_exit_2_with_one_line():
    r = _cli("sanitize", "--op", "conv", "x.py")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown op" in r.stderr
    r = _cli("sanitize", "--op", "matmul", "no/such/file.py")
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


@exhaustive  # 15-35 s of sanitizer runs; the quick tier meets the same paths elsewhere
def test_cli_json_and_junit_and_exit_codes(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(HEADER + "def quantize_kv(x):\n    return torch.matmul(x, x)\n")
    junit = tmp_path / "out.xml"
    r = _cli(
        "sanitize",
        "--op",
        "quantize_kv",
        os.path.join(BASELINE, "quantize_kv.py"),
        str(bad),
        "--quick",
        "--json",
        "--junit",
        str(junit),
        "--jobs",
        "2",
    )
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["passed"] is False and [f["passed"] for f in doc["files"]] == [True, False]
    first = doc["files"][1]["checks"][0]
    assert set(first) >= {"name", "passed", "detail"} and first["name"] == "static_gate" and first["passed"] is False
    skipped = [c for c in doc["files"][0]["checks"] if c["status"] == "skipped"]
    assert all(c["passed"] is None for c in skipped)  # never reported as passed
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert len(suites) == 2 and suites[1].get("failures") != "0"
    ok = _cli("sanitize", "--op", "quantize_kv", os.path.join(BASELINE, "quantize_kv.py"), "--quick")
    assert ok.returncode == 0 and "1/1 file(s) passed" in ok.stdout


# -- no_state, the run-time backstop behind the static gate -------------------------------------


def test_no_state_catches_a_cache_the_static_gate_could_miss():
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.checks import FULL, CheckFailed, Subject, baseline_fn, check_no_state

    op = get_op("quantize_kv")
    base = baseline_fn("quantize_kv")
    memo = {}

    def cached(x):  # launches its kernel, but answers from a cache keyed by shape and pointer
        key = (tuple(x.shape), x.data_ptr())
        fresh = base(x)
        return memo.setdefault(key, fresh)

    subject = Subject(op, os.path.join(BASELINE, "quantize_kv.py"), "", fn=cached, baseline=base)
    with pytest.raises(CheckFailed, match="stale answer"):
        check_no_state(subject, FULL)
    honest = Subject(op, os.path.join(BASELINE, "quantize_kv.py"), "", fn=base, baseline=base)
    assert "fresh answers" in check_no_state(honest, FULL)


def test_a_call_that_launches_no_kernel_is_rejected():
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.checks import Subject, baseline_fn, run_case

    op = get_op("quantize_kv")
    base = baseline_fn("quantize_kv")
    case = op.make_case(op.shapes("tiny")[2], torch.float32, seed=1)
    answer = base(**case.args)
    r = run_case(Subject(op, "x.py", ""), lambda x: answer, case)
    assert "no Triton kernel was launched" in r.error


def test_map_tracked_stops_every_worker_on_ctrl_c():
    """Each item runs several children in turn (a GPU worker's queue of candidates): on Ctrl-C the
    running children are killed, no new one starts, and the call returns at once."""
    import signal
    import threading
    import time

    exits = []

    def item(i):
        for _ in range(3):
            exits.append(isolation.run_tracked([sys.executable, "-c", "import time; time.sleep(20)"], 60)[0])

    sent: list = []  # when SIGINT was sent

    def ctrl_c_once_both_run():
        # on a loaded machine the children may take more than a second to start: a fixed delay flaked
        deadline = time.time() + 30
        while len(isolation._live) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        sent.append(time.time())
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, which a pytest-xdist worker does not keep
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c_once_both_run, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            isolation.map_tracked(item, [0, 1, 2, 3], 2)
    finally:
        signal.signal(signal.SIGINT, old_handler)
    assert time.time() - sent[0] < 10  # returned at once, not after the children's 20 s
    # the first child of the two running items, killed; no second child, no third item
    assert exits == [-signal.SIGKILL] * 2 and not isolation._live
    assert not isolation._stopping.is_set()  # the next call starts children again
    assert isolation.run_tracked([sys.executable, "-c", "print('ok')"], 60) == (0, "ok\n")


# -- host-branch coverage ------------------------------------------------------------------------


def test_host_branch_coverage_names_each_side_never_taken(tmp_path):
    """The executor's recorder sees which way each host branch of the candidate's file went; the judge,
    compiling the same text, names the sides never taken. A side that only raises, and a condition on the
    device, are exempt; a kernel's body is not host code."""
    import importlib.util

    from kernel_agent.sanitizer.branches import BranchRecorder, host_branches, taken, uncovered

    src = HEADER + (
        "def helper(n):\n    if n > 100:\n        return 1\n    return 2 if n % 2 else 0\n\n"
        "def f(x, n):\n    if n < 0:\n        raise ValueError('no')\n"
        "    return helper(n) + (1 if x.device.type == 'cuda' else 0)\n"
    )
    path = tmp_path / "cand.py"
    path.write_text(src)
    rec = BranchRecorder(str(path))
    spec = importlib.util.spec_from_file_location("ka_branch_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.zeros(1)
    for n in (3, 4):
        rec.install()
        try:
            mod.f(x, n)
        finally:
            sys.settrace(None)
    sides = host_branches(src, str(path))
    missing = [s.describe("cand.py") for s in uncovered(sides, taken(rec.evidence(), sides))]
    assert missing == ["cand.py:10: `n > 100` was never true"], missing
    assert {s.exempt for s in sides} >= {
        "only raises (a guard on the contract's limits)",
        "reads only the device, the dtype or the SM count: the GPU stage takes its other side",
    }
    assert not any(s.qualname == "_k" for s in sides)


@pytest.mark.parametrize(
    "condition,refused",
    [
        ("a.dtype == torch.bfloat16", True),  # every dtype is drawn on the device: both sides there
        ("half", True),  # the same, through a device-only local
        ("a.is_cuda", False),  # the device takes one side, the CPU the other
        ("a.device.type == 'cuda'", False),
    ],
)
def test_the_gpu_stage_takes_the_device_only_sides_the_cpu_left_it(tmp_path, condition, refused):
    """The GPU stage finds the device-only host branches in the file it read as bytes (it compiles the canonical
    text, as the CPU check does). A branch the device cases reached one way is refused when it reads only the
    dtype, and named; one that reads the device or its SM count takes one side per GPU. A branch the device
    never reached (host code of another path) asks nothing of it."""
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.branches import DEVICE_ONLY, host_branches
    from kernel_agent.sanitizer.canonical import judge_text
    from kernel_agent.sanitizer.checks import Subject
    from kernel_agent.sanitizer.execution import CheckFailed
    from kernel_agent.sanitizer.gpu import _device_branches_taken

    src = (
        "import torch\n\n\n"
        "def matmul(a, b):\n"
        "    half = a.dtype == torch.bfloat16\n"
        f"    if {condition}:\n"
        "        return (a.float() @ b.float()).to(a.dtype)\n"
        "    return a @ b\n"
    )
    path = tmp_path / "cand.py"
    path.write_bytes(src.encode())
    sides = [x for x in host_branches(judge_text(path.read_bytes()).text, str(path)) if x.exempt == DEVICE_ONLY]
    assert len(sides) == 2, sides

    class Took:  # an executor whose device cases took the given sides
        def __init__(self, took):
            self.took = took

        def coverage(self):
            return [[x.qualname, x.firstlineno, x.jump, x.dest] for x in self.took], []

    def judge(took):
        _device_branches_taken(Subject(get_op("matmul"), str(path), path.read_bytes(), fn=Took(took)))

    judge([])  # never reached on the device
    judge(sides)  # both ways
    if refused:
        with pytest.raises(CheckFailed, match=r"branches on the dtype alone .* never took one side: .*cand.py:\d+: `"):
            judge(sides[:1])
    else:
        judge(sides[:1])


@pytest.mark.parametrize("op_name", ["matmul", "attention", "decode_attention", "decode_attention_int8", "quantize_kv"])
def test_the_gpu_differential_draws_every_distribution_in_bf16_and_fp16(op_name):
    """A path the device alone takes (`q.is_cuda`, a bf16 flag) meets every kind of value there: each input
    distribution of the op in bf16 and fp16, beside the tiny suite in every dtype and the serving shapes."""
    from kernel_agent.ops import get_op
    from kernel_agent.sanitizer.gpu import _gpu_cases

    op = get_op(op_name)
    drawn = {(dtype, dist) for _, dtype, dist in _gpu_cases(op)}
    for dist in (d.name for d in op.distributions):
        assert {(torch.bfloat16, dist), (torch.float16, dist)} <= drawn, dist
    assert {dtype for dtype, _ in drawn} == {torch.bfloat16, torch.float16, torch.float32}


def test_the_integers_distribution_holds_whole_numbers_in_each_rows_own_range():
    from kernel_agent.ops.common import fill, generator

    x = fill((64, 33), "integers", generator(7, "cpu"), "cpu", int_bits=6)
    assert torch.equal(x, torch.round(x)) and float(x.abs().max()) <= 63
    row_max = x.abs().amax(dim=1)
    assert len(set(row_max.tolist())) > 3  # rows of different ranges: 1, 3, 7, ... 63
    assert bool(((x != 0).sum(dim=1) >= 2).any())


def test_an_output_step_on_the_gpu_allows_float32_subnormals_to_flush():
    """Triton's approximate exp2 and division flush float32 subnormals on the device: there a float32 or bf16
    output may be 0 where the reference is under 2^-126, and nowhere else; float16's own subnormals stay."""
    from kernel_agent.ops.common import output_step

    tiny32 = torch.finfo(torch.float32).tiny
    assert output_step(torch.float32, on_gpu=True) == tiny32 == output_step(torch.bfloat16, on_gpu=True)
    assert output_step(torch.float32) == tiny32 * torch.finfo(torch.float32).eps
    assert output_step(torch.float16, on_gpu=True) == output_step(torch.float16) == 2.0**-24
    assert output_step(torch.int8, on_gpu=True) == 0.0


def test_an_fpsan_proof_shortens_the_extended_suite_but_does_not_skip_it(monkeypatch):
    """FpSan orders two non-zero payloads unlike the reals, so a path chosen by such a comparison (a row of
    whole numbers found as floor(x) == x) may never run under it: its proof leaves a quarter of the examples."""
    from kernel_agent.sanitizer import checks

    seen = []
    monkeypatch.setattr(checks, "_hypothesis_differential", lambda subject, n, seed, big: seen.append(n) or n)

    class Proved:
        fpsan_equivalent = True

        def seed(self, k):
            return k

    detail = checks.check_extended(Proved(), checks.FULL)
    assert seen == [checks.FULL.extended_examples // 4] and "a quarter" in detail
    Proved.fpsan_equivalent = None
    checks.check_extended(Proved(), checks.FULL)
    assert seen[-1] == checks.FULL.extended_examples


def test_the_compute_sanitizer_checks_run_beside_the_others_and_report_in_order(monkeypatch, tmp_path):
    """sanitize_gpu starts memcheck, initcheck and racecheck together, beside the checks that share the
    candidate's executor (a verdict takes the longest chain, not the sum), and reports every check in its
    order; a failed check beside the others fails the verdict."""
    import threading

    from kernel_agent.sanitizer import gpu

    together = threading.Barrier(len(gpu.CONCURRENT_GPU_CHECKS) + 1, timeout=30)  # the three and the main chain

    def beside(name):
        def check(subject):
            together.wait()  # breaks (and the check fails) unless all three run while the main chain waits too
            if name == "initcheck":
                raise gpu.CheckFailed("an uninitialised read")
            return f"{name} ok"

        return check

    def main_chain(subject):
        together.wait()
        return "differential ok"

    checks = [("gpu_differential", main_chain), ("gpu_domain", lambda s: "domain ok")]
    checks += [(n, beside(n)) for n in gpu.CONCURRENT_GPU_CHECKS] + [("determinism", lambda s: "same")]
    monkeypatch.setattr(gpu, "GPU_CHECKS", checks)
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "check_source", lambda source, op: type("Gate", (), {"passed": False})())
    monkeypatch.setattr(gpu, "check_static", lambda s, _: "gated")
    monkeypatch.setattr(gpu, "check_load", lambda s, _: "loaded")
    path = tmp_path / "k.py"
    path.write_text("pass\n")
    v = gpu.sanitize_gpu(str(path), "quantize_kv")
    names = [c.name for c in v.checks]
    assert names == ["static_gate", "load", "gpu_differential", "gpu_domain", *gpu.CONCURRENT_GPU_CHECKS, "determinism"]
    status = {c.name: c.status.value for c in v.checks}
    assert status["gpu_differential"] == status["memcheck"] == status["racecheck"] == "passed"
    assert status["initcheck"] == "failed" and status["determinism"] == "skipped" and not v.passed

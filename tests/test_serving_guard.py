"""The serving guard (harness/serving/serving_guard.py): a promoted kernel serves a shape class only after one call of
that class was checked in a sandboxed child; a failure retires the class and reaches the sink.

Kernels run in Triton's interpreter on the CPU; each check starts a sandboxed executor (the cost of these
tests: a few seconds per check)."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernel_agent.harness.field_failures import FailureKind  # noqa: E402
from kernel_agent.harness.serving import serving, serving_guard, serving_install  # noqa: E402
from kernel_agent.ops import get_op  # noqa: E402
from kernel_agent.sanitizer.canonical import judge_text  # noqa: E402

OP = "quantize_kv"
# the baseline computes 127/amax on masked-out rows too (then discards it); numpy says so
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
BASELINE_SRC = (Path(serving.__file__).resolve().parents[2] / "kernels" / "baseline" / "quantize_kv.py").read_text()
LAUNCH = "        x, x_q, scale, R, H, D, x.stride(0), x.stride(1), x.stride(2),\n"
BLOCKS = "    block_r, warps = _config(D)\n"
STORE = "    tl.store(scale_ptr + rows, scale, mask=row_mask)\n"
assert LAUNCH in BASELINE_SRC and BLOCKS in BASELINE_SRC and STORE in BASELINE_SRC


def _variant(old: str, new: str) -> str:
    text = BASELINE_SRC.replace(old, new)
    assert text != BASELINE_SRC
    return text


# a correct kernel, told apart from the baseline: two rows per program
CORRECT = _variant("return max(1, min(64, 4096 // block_d)), 4", "return 2, 4")
# wrong only when T == 3: its host code passes the head stride as the token stride
WRONG_AT_T3 = _variant(
    LAUNCH,
    "        x, x_q, scale, R, H, D, token_stride, x.stride(1), x.stride(2),\n",
).replace(BLOCKS, BLOCKS + "    token_stride = x.stride(0)\n    if T == 3:\n        token_stride = x.stride(1)\n")
# right codes and scales, and halves its input on the way
WRITES_INPUT = _variant(
    STORE,
    STORE
    + "    tl.store(x_ptr + t[:, None] * stride_xt + h[:, None] * stride_xh + offs_d[None, :] * stride_xd,\n"
    + "             x * 0.5, mask=mask)\n",
)
# host code that spins before it launches
STALLS = _variant(BLOCKS, BLOCKS + "    spin = 0\n    for i in range(10000000000):\n        spin = spin + i\n")
# host code that asks for a terabyte
ALLOCATES = _variant(BLOCKS, BLOCKS + "    hoard = torch.empty((1000000000000,), device=x.device, dtype=torch.int8)\n")

SYNC = serving.GuardConfig(asynchronous=False, time_limit_s=120.0)


@pytest.fixture
def sdir(tmp_path) -> Path:
    return tmp_path / "serving"


def _install(sdir: Path, source: str, bucket: str = "tsmall-d16", op: str = OP) -> serving.ManifestEntry:
    return serving_install.install(
        op, bucket, "float32", "cpu", judge_text(source), 7, 0.1, "promoted for the test", {}, dir=sdir
    )


def _x(T: int, H: int = 2, D: int = 16, seed: int = 0) -> torch.Tensor:
    op = get_op(OP)
    return op.make_case(op.parse_shape(f"{T},{H},{D}"), torch.float32, seed=seed).args["x"]


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b))


def _dispatcher(sdir: Path, config=SYNC, op: str = OP, **kw):
    failures: list = []
    fn = serving.get(op, gpu="cpu", dir=sdir, guard=True, guard_config=config, sink=failures.append, **kw)
    return fn, failures


def test_a_correct_kernel_is_checked_once_per_class_then_served_in_process(sdir):
    _install(sdir, CORRECT)
    fn, failures = _dispatcher(sdir)
    x = _x(4)
    trusted = serving.baseline(OP)(x)
    assert _same(fn(x), trusted)  # the first call of the class: the trusted output, while the check runs
    assert fn.guard.counts == {serving_guard.SERVED_CHECKING: 1}
    (record,) = fn.guard.classes.values()
    assert record.state == serving_guard.VERIFIED and record.outcomes[-1].kind is None, record.outcomes[-1].detail
    assert "x:float32[4,2,16]/[32,16,1]+0@cpu" in record.text
    out = fn(x)  # verified: the promoted kernel, in this process
    assert fn.guard.counts[serving_guard.SERVED_KERNEL] == 1
    assert get_op(OP).compare(out, {"x": x}).ok and not failures


def test_sampled_rechecks_check_a_verified_class_again(sdir):
    _install(sdir, CORRECT)
    fn, failures = _dispatcher(sdir, serving.GuardConfig(asynchronous=False, recheck_rate=1.0))
    x = _x(4)
    fn(x)
    fn(x)  # verified, and drawn for a re-check (rate 1): answered by the trusted implementation again
    (record,) = fn.guard.classes.values()
    assert len(record.outcomes) == 2, [o.detail for o in record.outcomes]
    assert record.state == serving_guard.VERIFIED and not record.rechecking, record.outcomes[-1].detail
    assert fn.guard.counts == {serving_guard.SERVED_CHECKING: 2} and not failures


def test_a_kernel_wrong_on_one_shape_is_retired_for_that_class_alone(sdir):
    entry = _install(sdir, WRONG_AT_T3)
    fn, failures = _dispatcher(sdir)
    x3 = _x(3)
    wrong = fn.kernel_for(x3)(x3)  # the kernel really is wrong there
    assert not get_op(OP).compare(wrong, {"x": x3}).ok
    out = fn(x3)
    assert _same(out, serving.baseline(OP)(x3))  # exactly the trusted output
    (ff,) = failures
    assert ff.kind == FailureKind.MISMATCH and ff.op == OP and ff.bucket == "tsmall-d16"
    assert ff.shapes == ((3, 2, 16),) and ff.strides == ((32, 16, 1),) and ff.dtypes == ("float32",)
    assert ff.kernel == entry.file and ff.source_hash == entry.source_hash and "[3,2,16]" in ff.shape_class
    assert _same(fn(x3), serving.baseline(OP)(x3))  # retired: the trusted implementation from now on
    assert fn.guard.counts[serving_guard.SERVED_RETIRED] == 1 and len(failures) == 1
    x4 = _x(4)
    fn(x4)  # another class of the same bucket: checked, passes
    assert get_op(OP).compare(fn(x4), {"x": x4}).ok
    assert fn.guard.counts[serving_guard.SERVED_KERNEL] == 1 and len(failures) == 1


def test_a_kernel_that_writes_its_input_fails_warmup_and_the_callers_input_is_untouched(sdir):
    _install(sdir, WRITES_INPUT)
    failures: list = []
    x = _x(4)
    before = x.clone()
    (result,) = serving.warmup(OP, [{"x": x}], dir=sdir, gpu="cpu", sink=failures.append, config=SYNC)
    assert not result.passed and result.kind == FailureKind.INPUT_CHANGED and result.impl == "kernel"
    assert "x" in result.detail and result.check_s > 0
    assert [f.kind for f in failures] == [FailureKind.INPUT_CHANGED]
    assert torch.equal(x, before)  # the kernel ran on a copy in the child


def test_a_stalling_kernel_times_out_and_this_process_answers(sdir):
    _install(sdir, STALLS)
    fn, failures = _dispatcher(sdir, serving.GuardConfig(asynchronous=False, time_limit_s=15.0))
    x = _x(4)
    assert _same(fn(x), serving.baseline(OP)(x))
    assert [f.kind for f in failures] == [FailureKind.TIMEOUT]
    assert _same(fn(x), serving.baseline(OP)(x))  # retired, answered at once


def test_a_kernel_that_allocates_a_terabyte_fails_and_this_process_answers(sdir):
    _install(sdir, ALLOCATES)
    fn, failures = _dispatcher(sdir)
    x = _x(4)
    assert _same(fn(x), serving.baseline(OP)(x))
    assert [f.kind for f in failures] == [FailureKind.OUT_OF_MEMORY], failures[0].detail


def test_checks_run_in_the_background_and_the_class_flips_when_it_passes(sdir):
    _install(sdir, CORRECT)
    fn, failures = _dispatcher(sdir, serving.GuardConfig())
    x = _x(4)
    assert _same(fn(x), serving.baseline(OP)(x))
    (record,) = fn.guard.classes.values()
    assert record.state == serving_guard.CHECKING  # the call returned before its check (seconds) ended
    assert _same(fn(x), serving.baseline(OP)(x)) and fn.guard.counts[serving_guard.SERVED_CHECKING] == 2
    assert fn.wait(120) and record.state == serving_guard.VERIFIED and not failures
    fn(x)
    assert fn.guard.counts[serving_guard.SERVED_KERNEL] == 1


def test_a_kernel_slower_than_its_limit_is_too_slow():
    config = serving.GuardConfig(slow_factor=10.0, slow_slack_s=0.005)
    assert serving_guard.too_slow(0.014, 0.001, config) is None  # 10 x 1 ms + 5 ms
    slow = serving_guard.too_slow(0.016, 0.001, config)
    assert slow is not None and slow.kind == FailureKind.TOO_SLOW and "16 ms" in slow.detail


def test_the_guard_off_runs_the_kernel_directly(sdir, monkeypatch):
    _install(sdir, WRONG_AT_T3)
    x3 = _x(3)
    monkeypatch.setenv(serving_guard.ENV_GUARD, "off")
    fn = serving.get(OP, gpu="cpu", dir=sdir)
    assert fn.guard is None
    assert not get_op(OP).compare(fn(x3), {"x": x3}).ok  # nothing stood between the caller and the kernel
    monkeypatch.delenv(serving_guard.ENV_GUARD)
    assert serving.get(OP, gpu="cpu", dir=sdir).guard is not None  # on by default
    assert serving.get(OP, gpu="cpu", dir=sdir, guard=False).guard is None


def test_baseline_and_torch_resolutions_are_not_guarded(sdir):
    fn, failures = _dispatcher(sdir)
    x = _x(4)
    assert _same(fn(x), serving.baseline(OP)(x))
    assert not fn.guard.classes and not fn.guard.counts
    (result,) = serving.warmup(OP, [(x,)], dir=sdir, gpu="cpu")
    assert result.passed and result.impl == "baseline" and result.kind is None
    # a shape in place of inputs: the op makes them (contiguous, float32 on the CPU)
    by_shape, by_text = serving.warmup(OP, [get_op(OP).parse_shape("5,2,16"), "T=5,H=2,D=16"], dir=sdir, gpu="cpu")
    assert by_shape == by_text and by_shape.shape_class == "x:float32[5,2,16]/[32,16,1]+0@cpu,a16"
    with pytest.raises(ValueError, match="unknown shape field"):
        serving.warmup(OP, ["Q=5"], dir=sdir, gpu="cpu")


def test_the_class_key_is_the_calls_exact_metadata():
    def key(**bound):
        return serving_guard.class_key(bound, ("x", "s"))

    x = torch.zeros(4, 2, 16)
    assert key(x=torch.ones(4, 2, 16)) == key(x=x)  # values are not metadata
    assert key(x=torch.zeros(5, 2, 16)) != key(x=x)  # a new batch size is a new class
    assert key(x=x.transpose(0, 1).contiguous().transpose(0, 1)) != key(x=x)  # strides
    assert key(x=torch.zeros(65, 2, 16)[1:]) != key(x=x)  # a storage offset
    assert key(x=torch.zeros(4, 2, 16, dtype=torch.float16)) != key(x=x)
    assert key(x=x, s=0.5) != key(x=x, s=0.25) and key(x=x, s=0.5) != key(x=x)
    assert key(x=x, s=float("nan")) == key(x=x, s=float("nan"))  # one class, not one per call
    text = serving_guard.class_text(key(x=torch.zeros(65, 2, 16)[1:], s=0.5))
    assert text == "x:float32[64,2,16]/[32,16,1]+32@cpu,a16; s=0.5"


def test_arguments_sharing_a_storage_are_a_class_of_their_own_and_their_copy_shares_it():
    """k and v as vLLM's kv[0] and kv[1]: which arguments share a storage is part of the class, and the copy the
    check runs on keeps the sharing (each storage copied once), so a kernel wrong only on that layout meets it."""

    def key(**bound):
        return serving_guard.class_key(bound, ("k", "v"))

    kv = torch.zeros(2, 4, 16)
    apart = torch.zeros(2, 4, 16)[1]  # the same view of a storage of its own
    assert key(k=kv[0], v=kv[1]) != key(k=kv[0], v=apart)
    assert serving_guard.class_text(key(k=kv[0], v=kv[1])).endswith("+64@cpu,a16 (the storage of tensor argument 0)")
    sent = serving_guard.snapshot({"k": kv[0], "v": kv[1], "s": 0.5})
    assert sent["k"].untyped_storage().data_ptr() == sent["v"].untyped_storage().data_ptr()
    assert sent["k"].untyped_storage().data_ptr() != kv.untyped_storage().data_ptr() and sent["s"] == 0.5
    assert sent["v"].storage_offset() == 64 and torch.equal(sent["v"], kv[1])


def test_the_default_sink_writes_json_lines_where_there_is_no_ledger(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(serving_guard.ENV_LEDGER, raising=False)
    monkeypatch.setenv(serving_guard.ENV_FIELD_FAILURES, str(tmp_path / "ff.jsonl"))
    ff = serving_guard.FieldFailure(
        OP, "b", "float32", "cpu", "k.py", "h", "x:...", ((3, 2, 16),), ((32, 16, 1),), ("float32",),
        FailureKind.MISMATCH, "one line",
    )  # fmt: skip
    serving_guard.default_sink(tmp_path / "serving")(ff)
    lines = (tmp_path / "ff.jsonl").read_text().splitlines()
    assert [serving_guard.FieldFailure.from_json(__import__("json").loads(s)) for s in lines] == [ff]
    assert not (tmp_path / "runs").exists()  # a serving process creates no ledger
    monkeypatch.setenv(serving_guard.ENV_LEDGER, str(tmp_path / "not-a-ledger.db"))
    (tmp_path / "not-a-ledger.db").write_text("this is no database")
    with pytest.warns(UserWarning, match="cannot be opened|did not take"):
        serving_guard.default_sink(tmp_path / "serving")(ff)
    assert len((tmp_path / "ff.jsonl").read_text().splitlines()) == 2  # the file took it: never lost


def test_checks_in_flight_are_bounded_and_a_failed_trusted_call_leaves_no_claim(sdir, monkeypatch):
    """Each check holds a copy of its call's inputs: at most max_checks are in flight, and a class met
    meanwhile stays unseen (served by the trusted implementation) until a later call claims it."""
    import threading

    release = threading.Event()

    def held_check(*args, **kwargs):  # the check itself, held until released (no child here)
        release.wait(60)
        return serving_guard.CheckOutcome(None, "passed")

    monkeypatch.setattr(serving_guard, "check_call", held_check)
    _install(sdir, CORRECT)
    fn, failures = _dispatcher(sdir, serving.GuardConfig(max_checks=1))
    x4, x5 = _x(4), _x(5)
    fn(x4)  # claims the one slot
    assert _same(fn(x5), serving.baseline(OP)(x5))  # no slot: trusted, and the class is not claimed
    assert len(fn.guard.classes) == 1
    release.set()
    assert fn.wait(60)
    fn(x5)  # claimed now
    assert fn.wait(60) and len(fn.guard.classes) == 2
    assert {r.state for r in fn.guard.classes.values()} == {serving_guard.VERIFIED}

    def raising(*args, **kwargs):
        raise RuntimeError("the trusted call failed")

    fn.guard.trusted = raising
    with pytest.raises(RuntimeError, match="trusted call failed"):
        fn(_x(6))
    assert len(fn.guard.classes) == 2 and fn.guard._in_flight == 0  # no class left claimed


def test_an_output_inside_the_contracts_tolerance_but_past_the_error_budget_is_a_mismatch():
    """At K = 16384 a matmul output 2% too large passes the contract's tolerance (it grows with K); the guard
    also holds the kernel to the sanitizer's error budget against the trusted output on the same inputs."""
    op = get_op("matmul")
    args = op.make_case(op.parse_shape("4,8,16384"), torch.float32, seed=0).args
    trusted = torch.matmul(args["a"], args["b"])
    assert op.compare(trusted * 1.02, args).ok  # what the contract alone lets through
    assert serving_guard._judge_output("matmul", trusted * 1.02, args, trusted).startswith("error 0.02 exceeds")
    assert serving_guard._judge_output("matmul", trusted.clone(), args, trusted) == ""
    assert serving_guard._judge_output("matmul", trusted * 1.02, args, None) == ""  # no trusted output: no budget


DECODE_SRC = (Path(serving.__file__).resolve().parents[2] / "kernels" / "baseline" / "decode_attention.py").read_text()
PAGE_LOAD = (
    "        page = tl.load(bt_ptr + b * stride_btb + (offs_n // PAGE) * stride_btn, mask=live, other=0).to(tl.int64)\n"
)
# Page ids past 31 read page id & 31: the identity on every id a small pool's first calls hold, wrong on the rest
# of the pool (the shape of a kernel that wraps ids past 2^18 in a serving pool of 300000 one-token pages)
PAGE_IDS_WRAPPED = DECODE_SRC.replace(PAGE_LOAD, PAGE_LOAD + "        page = page & 31\n")
LEN_LOAD = "    seq_len = tl.load(lens_ptr + b)\n"
# Tokens past the 40th are dropped: right on every call whose sequences are shorter (the shape of a kernel that drops
# the tail past 40960 tokens in a table of 131072)
TAIL_DROPPED = DECODE_SRC.replace(LEN_LOAD, LEN_LOAD + "    seq_len = tl.minimum(seq_len, 40)\n")
assert PAGE_LOAD in DECODE_SRC and LEN_LOAD in DECODE_SRC


@pytest.mark.parametrize("source, caught", [(DECODE_SRC, False), (PAGE_IDS_WRAPPED, True)], ids=["correct", "wraps"])
def test_a_class_is_verified_at_its_corner_where_its_first_call_never_went(sdir, source, caught):
    """A paged decode's class is also checked with sequence 0 filling its table over the pool's last pages: a
    kernel wrong only on page ids the first call never held is retired at its first call, with the trusted
    output; the correct kernel passes there (the pool's unused pages, NaN as drawn, get real data first)."""
    from kernel_agent.ops.paged import DecodeShape

    op = get_op("decode_attention")
    args = op.make_case(DecodeShape(2, 2, 1, 16, 1, 24, True, spare_blocks=40), torch.float32, seed=3).args
    k, v, table = args["k_cache"].clone(), args["v_cache"].clone(), args["block_table"]
    for i, (b, j) in enumerate((b, j) for b, n in enumerate(args["seq_lens"].tolist()) for j in range(n)):
        k[i], v[i] = args["k_cache"][table[b, j]], args["v_cache"][table[b, j]]  # the live pages moved to ids < 32
        table[b, j] = i
    args["k_cache"], args["v_cache"] = k, v
    assert int(args["k_cache"].shape[0]) > 40 and i < 31  # the pool holds ids past 31, the call reads none
    entry = _install(sdir, source, op.bucket(op.shape_of(args)), op=op.name)
    fn, failures = _dispatcher(sdir, op=op.name)
    trusted = serving.baseline("decode_attention")(**args)
    assert torch.equal(fn(**args), trusted)  # the first call: the trusted output, while the check runs
    assert op.compare(fn.kernel_for(**args)(**args), args).ok  # the kernel is right on the call itself
    (record,) = fn.guard.classes.values()
    if caught:
        assert record.state == serving_guard.RETIRED, record.outcomes[-1].detail
        assert [f.kind for f in failures] == [FailureKind.MISMATCH] and "corner" in failures[0].detail
        assert failures[0].source_hash == entry.source_hash
    else:
        assert record.state == serving_guard.VERIFIED and not failures, record.outcomes[-1].detail


@pytest.mark.parametrize("source, caught", [(DECODE_SRC, False), (TAIL_DROPPED, True)], ids=["correct", "drops"])
def test_a_class_is_verified_with_a_sequence_that_fills_its_table(sdir, source, caught):
    """The corner's sequence fills its table and attends to its last token: a kernel that drops the tail past a
    length the class's first call never reached is retired at that call."""
    from kernel_agent.ops.paged import DecodeShape

    op = get_op("decode_attention")
    args = op.make_case(DecodeShape(2, 2, 1, 16, 4, 64), torch.float32, seed=5).args
    args["seq_lens"] = torch.tensor([20, 5], dtype=torch.int32)
    _install(sdir, source, op.bucket(op.shape_of(args)), op=op.name)
    fn, failures = _dispatcher(sdir, op=op.name)
    assert torch.equal(fn(**args), serving.baseline("decode_attention")(**args))
    assert op.compare(fn.kernel_for(**args)(**args), args).ok  # right on the call itself
    (record,) = fn.guard.classes.values()
    expected = serving_guard.RETIRED if caught else serving_guard.VERIFIED
    assert record.state == expected and len(failures) == int(caught), record.outcomes[-1].detail

"""Workload traces (docs/WORKLOADS.md): the importers on the committed samples, malformed traces, the
continuous-batching replay's invariants, the buckets and their shares, runs weighted by a workload, the
KV-cache plan, and the command line's one-line errors."""

import json
import os
import random

import pytest
import torch

from kernel_agent.agent.cli import main
from kernel_agent.agent.run_config import RunConfig, targets_for
from kernel_agent.harness.serving import serving
from kernel_agent.harness.workload import kv_plan
from kernel_agent.harness.workload.model_step import PRESETS, ModelConfig, step_op_calls
from kernel_agent.harness.workload.workload import (
    Schedule,
    StepModel,
    analyze,
    bucket_shares,
    budget_pages,
    replay_trace,
    simulate,
    workload_points,
)
from kernel_agent.harness.workload.workload_trace import (
    EngineStep,
    Request,
    TraceError,
    TraceReader,
    check_trace,
    import_trace,
    read_header,
)

DATA = os.path.join(os.path.dirname(__file__), "data", "workloads")
LLAMA = PRESETS["llama-3-8b"]
# a small model whose cache is small enough that a few MiB of budget make memory the limit
SMALL = ModelConfig("small", layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512)


def _write(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


def _random_requests(n, seed=0, rate=50.0, prompt=(1, 700), output=(1, 300)):
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(Request(t, rng.randint(*prompt), rng.randint(*output)))
    return out


# -- importers and the format ---------------------------------------------------------------------------


def test_vllm_benchmark_result_imports_its_successful_requests_at_its_request_rate(tmp_path):
    out = str(tmp_path / "t.jsonl")
    assert import_trace("vllm", os.path.join(DATA, "vllm_benchmark_serving.json"), out) == 11
    src = json.load(open(os.path.join(DATA, "vllm_benchmark_serving.json")))
    recs = list(TraceReader(out))
    ok = [i for i, e in enumerate(src["errors"]) if not e]
    assert len(ok) == 11 and 5 not in ok  # the failed request (output 0, an error) is left out
    assert [(r.prompt_tokens, r.output_tokens) for r in recs] == [
        (src["input_lens"][i], src["output_lens"][i]) for i in ok
    ]
    assert [r.arrival_s for r in recs] == [i / src["request_rate"] for i in ok]
    assert "vllm" in read_header(out).source


def test_flashinfer_bench_trace_imports_each_decode_workload_once_as_an_engine_step(tmp_path):
    out = str(tmp_path / "t.jsonl")
    assert import_trace("flashinfer-bench", os.path.join(DATA, "flashinfer_bench_gqa_decode.jsonl"), out) == 6
    steps = list(TraceReader(out))
    assert all(isinstance(s, EngineStep) for s in steps)
    # the duplicate uuid (the same workload benchmarked by a solution) and the GEMM line are left out
    assert [(s.batch, s.kv_tokens) for s in steps] == [
        (1, 1031),
        (8, 9120),
        (32, 40221),
        (64, 150003),
        (16, 5030),
        (128, 262000),
    ]
    assert read_header(out).extra["kv_layout"] == {"heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 1}


def test_the_committed_native_sample_reads_in_arrival_order():
    requests, steps = check_trace(os.path.join(DATA, "chat_300.jsonl"))
    assert (requests, steps) == (300, 0)


@pytest.mark.parametrize(
    "bad, reason",
    [
        ('{"arrival_s": 1.0, "prompt_tokens": 5', "not JSON"),
        ({"arrival_s": 1.0, "prompt_tokens": 5, "output_tokens": 0}, "output_tokens must be an integer of at least 1"),
        ({"arrival_s": 0.5, "prompt_tokens": 5, "output_tokens": 3}, "before the previous request's"),
        ({"arrival_s": 1.0, "prompt_tokens": 5, "output_tokens": 3, "temperature": 0.7}, "unknown key(s) temperature"),
        ({"workload": 1}, "may only be the first line"),
        ({"batch": 4, "kv_tokens": 2}, "less than batch"),
        ([1, 2, 3], "expected a JSON object"),
        ({"prompt": 3}, "not a trace record"),
    ],
)
def test_a_malformed_line_is_one_error_naming_the_file_and_line(tmp_path, bad, reason):
    path = _write(
        tmp_path / "t.jsonl",
        [{"workload": 1, "source": "test"}, {"arrival_s": 1.0, "prompt_tokens": 8, "output_tokens": 2}, bad],
    )
    with pytest.raises(TraceError) as e:
        check_trace(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: ") and reason in msg and "\n" not in msg


def test_a_failed_import_leaves_nothing_and_keeps_an_older_file(tmp_path):
    src = json.load(open(os.path.join(DATA, "vllm_benchmark_serving.json")))
    src["input_lens"][7] = "many"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(src))
    out = tmp_path / "t.jsonl"
    out.write_text("older\n")
    with pytest.raises(TraceError, match=r"input_lens\[7\]"):
        import_trace("vllm", str(bad), str(out))
    assert out.read_text() == "older\n" and sorted(os.listdir(tmp_path)) == ["bad.json", "t.jsonl"]
    line3 = tmp_path / "fi.jsonl"
    line3.write_text(
        '{"definition": "gqa_paged_decode_h32_kv8_d128_ps1", "workload": {"uuid": "a", "axes": '
        '{"batch_size": 2, "num_kv_indices": 9}}}\n\n{"definition": "gqa_paged_decode_h32_kv8_d128_ps1",'
        ' "workload": {"uuid": "b", "axes": {"batch_size": 2}}}\n'
    )
    with pytest.raises(TraceError, match=r"fi.jsonl:3: axes: num_kv_indices"):
        import_trace("flashinfer-bench", str(line3), str(tmp_path / "fi_out.jsonl"))
    assert not (tmp_path / "fi_out.jsonl").exists()


# -- the replay ---------------------------------------------------------------------------------------


def _audited(requests, model, kv, budget, max_batch=64, arrivals=True):
    limit = budget_pages(model, kv, budget)
    page = model.page_size
    seen = {"steps": 0, "max_used": 0}

    def audit(step, running, sched):
        used = sum(-(-ctx // page) for ctx, _, _ in running.values())
        assert used <= sum(p for _, _, p in running.values()) <= limit  # pages in use <= reserved <= budget
        assert len(running) <= max_batch
        assert all(1 <= ctx <= total for ctx, total, _ in running.values())
        seen["steps"] += 1
        seen["max_used"] = max(seen["max_used"], used)

    sched = simulate(requests, model, kv, budget, max_batch, arrivals=arrivals, audit=audit)
    return sched, seen


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_the_schedule_never_exceeds_the_budget_and_every_request_finishes(kv):
    reqs = _random_requests(400, seed=3)
    budget = 200 * 16 * 2 * 2 * 2 * 64 * 2  # 200 pages of the small model in bf16 (more in int8)
    sched, seen = _audited(reqs, SMALL, kv, budget, arrivals=False)
    assert sched.finished == sched.requests == 400 and sched.dropped == 0
    assert sched.decode_tokens == sum(r.output_tokens for r in reqs)
    assert sched.steps == seen["steps"]
    assert seen["max_used"] <= sched.budget_pages
    assert sched.peak_pages >= sched.budget_pages - -(-(700 + 300) // 16)  # memory was the limit: the cache filled


def test_a_request_too_long_for_the_whole_budget_is_dropped_and_counted():
    page_bytes = 16 * 2 * 2 * 2 * 64 * 2  # one page of the small model in bf16
    reqs = [Request(0.0, 100, 10), Request(0.0, 5000, 10), Request(0.1, 20, 5)]
    sched, _ = _audited(reqs, SMALL, "bf16", 20 * page_bytes)
    assert (sched.requests, sched.finished, sched.dropped) == (3, 2, 1)


def test_the_run_length_replay_equals_the_step_by_step_one():
    """Runs of steps with nothing but the contexts changing are counted at once; audited, every step is its
    own run: both give the same groups, steps and time."""
    reqs = _random_requests(300, seed=5, rate=2000.0)
    budget = 60 * 16 * 2 * 2 * 2 * 64 * 2
    for arrivals in (False, True):
        fast = simulate(reqs, SMALL, "bf16", budget, 32, arrivals=arrivals)
        slow, _ = _audited(reqs, SMALL, "bf16", budget, 32, arrivals=arrivals)
        assert fast.steps == slow.steps and fast.decode_tokens == slow.decode_tokens
        assert {k: v[:2] for k, v in fast.groups.items()} == {k: v[:2] for k, v in slow.groups.items()}
        assert fast.busy_s == pytest.approx(slow.busy_s, rel=1e-9)
        assert len(fast.groups) < fast.steps


def test_arrivals_wait_for_the_clock_and_the_engine_idles_between_them():
    reqs = [Request(0.0, 10, 4), Request(100.0, 10, 4)]
    sched = simulate(reqs, SMALL, "bf16", 2**30)
    assert sched.steps == 8 and sched.clock_s > 100.0 and sched.busy_s < 1.0
    assert simulate(reqs, SMALL, "bf16", 2**30, arrivals=False).steps == 4  # both at once


def test_the_step_model_matches_step_op_calls_at_any_context():
    rng = random.Random(1)
    for kv in ("bf16", "int8"):
        cost = StepModel(LLAMA, kv)
        for _ in range(12):
            batch, pages = rng.randint(1, 300), rng.randint(1, 3000)
            direct = step_op_calls(LLAMA, batch, pages * 16, kv)
            assert cost.ms(batch, pages) == pytest.approx(sum(c.roofline_ms for c in direct) * LLAMA.layers, rel=1e-12)
            assert cost.calls_at(batch, pages) == [(c.op, c.bucket, c.shape) for c in direct]


def test_bucket_shares_and_weighted_points_cover_the_time():
    sched = simulate(_random_requests(200, seed=2, prompt=(1, 20000)), LLAMA, "bf16", 2**33, arrivals=False)
    buckets, points = bucket_shares(sched, LLAMA)
    assert sum(b.share for b in buckets) == pytest.approx(1.0)
    assert sum(p.weight for p in points) == pytest.approx(1.0)
    names = {(b.op, b.bucket) for b in buckets}
    # the dispatcher buckets a batch by its longest context: with prompts up to 20k, c8k and clong
    assert {("decode_attention", "c8k-g4-d128"), ("decode_attention", "clong-g4-d128")} <= names
    assert sum(b.calls for b in buckets if b.op == "decode_attention") == sched.steps * LLAMA.layers


def test_recorded_engine_steps_are_replayed_when_the_trace_has_no_requests(tmp_path):
    out = str(tmp_path / "t.jsonl")
    import_trace("flashinfer-bench", os.path.join(DATA, "flashinfer_bench_gqa_decode.jsonl"), out)
    sched = replay_trace(out, LLAMA, "bf16", 2**34)
    assert sched.source == "steps" and sched.steps == 6 and sched.decode_tokens == 1 + 8 + 32 + 64 + 16 + 128


# -- runs weighted by a workload ----------------------------------------------------------------------


def test_target_points_are_the_equal_weight_case_of_a_workloads_points():
    model = LLAMA.to_json()
    by_points = targets_for(RunConfig(target_model=model, target_points="32x8192,8x32768"))
    weights = [[kv, b, c, 0.25] for b, c in ((32, 8192), (8, 32768)) for kv in ("bf16", "int8")]
    by_weights = targets_for(RunConfig(target_model=model, target_weights=weights))
    assert [(t.op, t.bucket, t.shapes) for t in by_points] == [(t.op, t.bucket, t.shapes) for t in by_weights]
    assert [t.weight for t in by_points] == pytest.approx([t.weight for t in by_weights])


def test_a_workloads_heavier_point_gets_the_larger_share_of_proposals():
    weights = [["bf16", 1, 1024, 0.9], ["bf16", 64, 16384, 0.1]]
    ts = {
        (t.op, t.bucket): t.weight for t in targets_for(RunConfig(target_model=LLAMA.to_json(), target_weights=weights))
    }
    small = {c.bucket: c.share for c in step_op_calls(LLAMA, 1, 1024)}
    large = {c.bucket: c.share for c in step_op_calls(LLAMA, 64, 16384)}
    assert ts[("decode_attention", "c1k-g4-d128")] == pytest.approx(0.9 * small["c1k-g4-d128"])
    assert ts[("decode_attention", "clong-g4-d128")] == pytest.approx(0.1 * large["clong-g4-d128"])
    assert sum(ts.values()) == pytest.approx(1.0)


def test_a_workload_sets_the_runs_weighted_points(tmp_path):
    from kernel_agent.agent.cli.parser import build_parser
    from kernel_agent.agent.cli.run import _run_config

    trace = os.path.join(DATA, "chat_300.jsonl")
    args = build_parser().parse_args(
        ["run", "--target-model", "llama-3-8b", "--workload", trace, "--kv-budget", "8GiB", "--proposer", "search"]
    )
    args.time_limit_s = args.file_time_limit_s = None  # as _check_run_flags leaves them
    cfg = _run_config(args, {})
    expect = workload_points(analyze(trace, LLAMA, ("bf16", "int8"), 8 * 2**30))
    assert cfg.target_weights == expect and cfg.target_workload["requests"] == 300
    assert sum(w for *_, w in cfg.target_weights) == pytest.approx(1.0)
    assert {kv for kv, *_ in cfg.target_weights} == {"bf16", "int8"}


# -- the KV-cache plan ----------------------------------------------------------------------------------


def _opt(kv, page, tps, error=0.0, max_error=0.02):
    return kv_plan.PlanOption(kv, page, tps, 10.0, 100, error, error <= max_error)


def test_the_plan_chooses_the_fastest_option_within_the_error_budget():
    opts = [_opt("bf16", 16, 1000.0), _opt("int8", 16, 1800.0, 0.009), _opt("int8", 32, 1700.0, 0.009)]
    assert (kv_plan.choose(opts, 0.02).kv, kv_plan.choose(opts, 0.02).page_size) == ("int8", 16)
    strict = [_opt("bf16", 16, 1000.0), _opt("int8", 16, 1800.0, 0.009, max_error=0.005)]
    assert kv_plan.choose(strict, 0.005).kv == "bf16"
    tie = [_opt("int8", 16, 1000.0, 0.009), _opt("bf16", 32, 1000.0), _opt("bf16", 16, 1000.0)]
    assert (kv_plan.choose(tie, 0.02).kv, kv_plan.choose(tie, 0.02).page_size) == ("bf16", 16)


def test_under_a_binding_budget_int8_holds_more_sequences_and_the_plan_takes_it(tmp_path):
    trace = os.path.join(DATA, "chat_300.jsonl")
    opts = kv_plan.estimate_options(trace, LLAMA, 4 * 2**30, 0.02, page_sizes=(16, 64))
    by = {(o.kv, o.page_size): o for o in opts}
    assert by[("int8", 16)].mean_batch > 1.25 * by[("bf16", 16)].mean_batch  # (the drain at the end shrinks both)
    assert by[("int8", 16)].tokens_per_s > by[("bf16", 16)].tokens_per_s
    assert by[("bf16", 16)].mean_batch >= by[("bf16", 64)].mean_batch  # larger pages waste more per sequence
    assert 0.001 < by[("int8", 16)].error < 0.02 and by[("bf16", 16)].error == 0.0
    plan = kv_plan.make_plan(trace, LLAMA, 4 * 2**30, 0.02, opts, kv_plan.ESTIMATE_BASIS)
    assert (plan.kv_format, plan.page_size) == ("int8", 16)
    path = str(tmp_path / "kv_plan.json")
    kv_plan.write_plan(plan, path)
    back = kv_plan.load_plan(path)
    assert back.to_json() == plan.to_json() and "fp8" in back.not_offered
    assert any("int8 cache, 16-token pages" in ln for ln in back.summary_lines())


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"kv_format": "fp8"}, "kv_format 'fp8'"),
        ({"page_size": 24}, "page_size 24"),
        ({"page_size": 64}, "not among its options"),
        ({"kv_plan": 2}, "not a KV-cache plan"),
        ({"model": {"layers": 2}}, "missing key"),
    ],
)
def test_a_bad_plan_file_is_refused_in_one_line(tmp_path, change, reason):
    plan = kv_plan.KvPlan(LLAMA.to_json(), 2**30, 0.02, "int8", 16, "test", [_opt("int8", 16, 1.0, 0.01)])
    doc = {**plan.to_json(), **change}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(kv_plan.KvPlanError, match=reason.replace("(", r"\(")):
        kv_plan.load_plan(str(path))


def test_the_serving_set_loads_its_plan(tmp_path, monkeypatch):
    monkeypatch.setenv(serving.ENV_DIR, str(tmp_path))
    assert kv_plan.serving_plan() is None
    plan = kv_plan.KvPlan(LLAMA.to_json(), 2**30, 0.02, "int8", 16, "test", [_opt("int8", 16, 1.0, 0.01)])
    kv_plan.write_plan(plan, str(tmp_path / kv_plan.SERVING_PLAN_FILE))
    assert kv_plan.serving_plan().kv_format == "int8"


# -- the command line ---------------------------------------------------------------------------------


def test_analyze_writes_its_document(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert (
        main(
            [
                "workload",
                "analyze",
                os.path.join(DATA, "chat_300.jsonl"),
                "--model",
                "llama-3-8b",
                "--kv",
                "bf16,int8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert set(doc["kv"]) == {"bf16", "int8"}
    assert doc["kv"]["bf16"]["schedule"]["finished"] == 300
    assert sum(b["share"] for b in doc["kv"]["int8"]["buckets"]) == pytest.approx(1.0, abs=1e-4)
    assert "op calls by bucket" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["workload"], "give an action"),
        (["workload", "analyze", "BAD", "--model", "llama-3-8b"], ":3: "),
        (["workload", "analyze", "MISSING", "--model", "llama-3-8b"], "no such trace"),
        (["workload", "analyze", "GOOD", "--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["workload", "analyze", "GOOD", "--model", "llama-3-8b", "--kv-budget", "lots"], "bad memory size"),
        (["workload", "analyze", "GOOD", "--model", "llama-3-8b", "--kv", "fp4"], "--kv"),
        (["workload", "plan", "GOOD", "--model", "llama-3-8b", "--page-sizes", "24"], "powers of two"),
        (["workload", "plan", "GOOD", "--model", "llama-3-8b", "--measure", "on"], "no CUDA GPU"),
        (["workload", "import", "vllm", "MISSING", "--out", "OUT"], "no such file"),
        (["workload", "import", "vllm", "GOOD", "--out", "NOFOLDER"], "no folder"),
        (["workload", "analyze", "GOOD", "--model", "llama-3-8b", "--json", "."], "is a folder"),
        (["workload", "analyze", "EMPTY", "--model", "llama-3-8b"], "holds no request and no decode step"),
        (["run", "--workload", "GOOD"], "--workload needs --target-model"),
        (["run", "--target-model", "llama-3-8b", "--kv-budget", "8GiB"], "--kv-budget needs --workload"),
        (["run", "--target-model", "llama-3-8b", "--workload", "BAD"], ":3: "),
        (["run", "--resume", "r1", "--workload", "GOOD"], "no ledger"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # no GPU here, whatever the machine has
    monkeypatch.chdir(tmp_path)  # a run would write its ledger and candidates here
    bad = _write(
        tmp_path / "bad.jsonl",
        [
            {"workload": 1},
            {"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1},
            {"arrival_s": 0, "prompt_tokens": -1, "output_tokens": 1},
        ],
    )
    names = {
        "BAD": bad,
        "GOOD": os.path.join(DATA, "chat_300.jsonl"),
        "MISSING": str(tmp_path / "none.jsonl"),
        "OUT": str(tmp_path / "out.jsonl"),
        "NOFOLDER": str(tmp_path / "none" / "t.jsonl"),
        "EMPTY": _write(tmp_path / "empty.jsonl", [{"workload": 1, "source": "nothing"}]),
    }
    assert main([names.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out.jsonl").exists()
    assert not (tmp_path / "runs" / "ledger.db").exists()  # nothing recorded


def test_schedule_defaults_hold_no_state_between_replays():
    a, b = Schedule("bf16", 16, 10, 4), Schedule("bf16", 16, 10, 4)
    a.add_steps(2, 3, 30, 2, 1.0)
    assert b.groups == {} and a.groups == {(3, 2): [2, 30, 1.0]}


def test_measured_options_scale_the_roofline_by_what_the_gpu_step_took():
    """The GPU path with its measurement replaced: each option's tokens/s is the roofline's over measured /
    roofline step time at its heaviest point, and the int8 error is the measured one."""
    trace = os.path.join(DATA, "chat_300.jsonl")
    asked = []

    def measure(cfg, kv, batch, ctx):
        asked.append((kv, cfg.page_size, batch, ctx))
        return {"step_ms": 2.0 * StepModel(cfg, kv).ms(batch, ctx // cfg.page_size), "error": 0.03}

    est = kv_plan.estimate_options(trace, LLAMA, 4 * 2**30, 0.02, page_sizes=(16,))
    got = kv_plan.estimate_options(trace, LLAMA, 4 * 2**30, 0.02, page_sizes=(16,), measure=measure, basis="gpu")
    assert [(kv, p) for kv, p, *_ in asked] == [("bf16", 16), ("int8", 16)]
    for e, g in zip(est, got):
        assert g.measured_ratio == pytest.approx(2.0) and g.tokens_per_s == pytest.approx(e.tokens_per_s / 2)
        assert g.basis == "gpu" and [g.point[0], g.point[1]] == list(asked[got.index(g)][2:])
    assert got[1].error == 0.03 and not got[1].within_error and got[0].error == 0.0
    assert kv_plan.choose(got, 0.02).kv == "bf16"  # int8 measured over the budget: bf16 however slower


def test_the_pull_request_body_shows_a_plan(tmp_path):
    from committed_h200 import RUN, copied_ledger
    from kernel_agent.agent.cli.pr import write_pr

    led, _ = copied_ledger(tmp_path)
    try:
        plan = kv_plan.KvPlan(
            LLAMA.to_json(),
            60 * 2**30,
            0.02,
            "int8",
            16,
            kv_plan.ESTIMATE_BASIS,
            [_opt("bf16", 16, 3429.0), _opt("int8", 16, 6280.0, 0.0092)],
        )
        md = open(write_pr(led, led.get_run(RUN), str(tmp_path / "pr"), plan=plan).body_path).read()
        without = open(write_pr(led, led.get_run(RUN), str(tmp_path / "pr2")).body_path).read()
    finally:
        led.close()
    section = md[md.index("## KV-cache plan") :]
    assert "**int8 cache, 16-token pages**, 6,280 tokens/s per GPU" in section
    assert "| int8 | 16 | 6,280 | 10.0 | 9.20e-03 | yes |" in section and "fp8 not offered" in section
    assert "KV-cache plan" not in without


def test_buckets_a_ledger_measured_take_the_measured_time():
    """The incumbent rows of a bucket's latest benchmarked run give measured / roofline (their median);
    candidates, anchors, older runs and implausible rows do not count, and the shares are recomputed."""
    from types import SimpleNamespace

    from kernel_agent.harness.workload.model_step import roofline_ms
    from kernel_agent.harness.workload.workload import apply_measured, measured_ratios
    from kernel_agent.ops import get_op

    op = get_op("matmul")
    shapes = ["M=8,N=28672,K=4096", "M=16,N=4096,K=14336", "M=12,N=6144,K=4096"]
    roof = {k: roofline_ms(op.flops(op.parse_shape(k)), op.bytes(op.parse_shape(k), torch.bfloat16)) for k in shapes}
    rows, n = [], 0

    def row(run, label, shape, x, implausible=False, graph=True):
        nonlocal n
        n += 1
        ms = x * roof[shape]
        rows.append(
            SimpleNamespace(
                id=n,
                run_id=run,
                label=label,
                op="matmul",
                bucket="m16-klarge",
                dtype="bfloat16",
                gpu_name="NVIDIA H200",
                shape_key=shape,
                median_ms=ms * (1.1 if graph else 1.0),
                graph_ms=ms if graph else None,
                implausible=implausible,
            )
        )

    row("r1", "baseline", shapes[0], 9.0)  # an older run
    row("r2", "baseline", shapes[0], 2.0)
    row("r2", "serving:matmul__m16-klarge.py", shapes[1], 3.0, graph=False)
    row("r2", "baseline", shapes[2], 4.0)
    row("r2", "candidate", shapes[0], 0.5)
    row("r2", "anchor:torch.matmul", shapes[0], 1.0)
    row("r2", "baseline", shapes[1], 100.0, implausible=True)
    ratios = measured_ratios(rows)
    assert ratios == {("matmul", "m16-klarge"): pytest.approx(3.0)}
    sched = simulate(_random_requests(50, seed=4), LLAMA, "bf16", 2**33, max_batch=16, arrivals=False)
    buckets, _ = bucket_shares(sched, LLAMA)
    before = {(b.op, b.bucket): b.ms for b in buckets}
    assert apply_measured(buckets, ratios) == 1
    after = {(b.op, b.bucket): b for b in buckets}
    assert after[("matmul", "m16-klarge")].ms == pytest.approx(3.0 * before[("matmul", "m16-klarge")])
    assert sum(b.share for b in buckets) == pytest.approx(1.0)
    assert [b.ms for b in buckets] == sorted((b.ms for b in buckets), reverse=True)
    assert all(b.measured_ratio is None for k, b in after.items() if k != ("matmul", "m16-klarge"))


def test_a_workload_runs_pull_request_suggests_its_heaviest_point_for_the_decode_step():
    from types import SimpleNamespace

    from kernel_agent.agent.cli.pr import suggest_step

    weights = [["bf16", 8, 4096, 0.2], ["int8", 48, 3040, 0.5], ["bf16", 48, 3040, 0.3]]
    run = SimpleNamespace(
        config={"target_model": LLAMA.to_json(), "target_weights": weights, "target_points": "32x8192"}
    )
    pk = SimpleNamespace(promotion=SimpleNamespace(op="decode_attention", bucket="c8k-g4-d128", dtype="bfloat16"))
    s = suggest_step(run, pk)
    assert (s.model, s.point, s.kv) == ("llama-3-8b", "48x3040", "bf16")


def test_plan_json_is_the_document_alone_and_the_file_it_wrote(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # no GPU: estimated
    out = tmp_path / "plans" / "p.json"
    assert (
        main(
            [
                "workload",
                "plan",
                os.path.join(DATA, "chat_300.jsonl"),
                "--model",
                "llama-3-8b",
                "--kv-budget",
                "4GiB",
                "--page-sizes",
                "16",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text()) and doc["basis"] == kv_plan.ESTIMATE_BASIS
    assert (doc["kv_format"], doc["page_size"]) == ("int8", 16) and kv_plan.load_plan(str(out)).kv_format == "int8"


def test_a_config_files_run_section_names_the_workload(tmp_path):
    from kernel_agent.agent.cli.parser import build_parser
    from kernel_agent.agent.cli.run import _run_config

    trace = os.path.join(DATA, "chat_300.jsonl")
    args = build_parser().parse_args(["run", "--proposer", "search"])
    args.time_limit_s = args.file_time_limit_s = None  # as _check_run_flags leaves them
    cfg = _run_config(args, {"target_model": "llama-3-8b", "workload": trace, "kv_budget": "8GiB"})
    assert cfg.target_workload == {"trace": trace, "kv_budget_bytes": 8 * 2**30, "requests": 300}


def test_sglang_bench_serving_output_imports_its_last_run(tmp_path):
    src = os.path.join(DATA, "sglang_bench_serving.jsonl")
    out = str(tmp_path / "t.jsonl")
    assert import_trace("sglang", src, out) == 9  # 10 requests, one failed
    last = json.loads(open(src).read().splitlines()[-1])
    recs = list(TraceReader(out))
    ok = [i for i, e in enumerate(last["errors"]) if not e]
    assert [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in recs] == [
        (last["input_lens"][i], last["output_lens"][i], i / last["request_rate"]) for i in ok
    ]
    first_only = tmp_path / "summary.jsonl"
    first_only.write_text(open(src).read().splitlines()[0] + "\n")
    with pytest.raises(TraceError, match=r"summary.jsonl:1: not a SGLang benchmark result .*--output-details"):
        import_trace("sglang", str(first_only), str(tmp_path / "t2.jsonl"))

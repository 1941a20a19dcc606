"""The structural moves of the rewrite catalog (agent/rewrites.py, docs/REWRITES.md): where each one's
precondition holds and where it refuses, that what it yields computes the op (the sanitizer's quick mode on the
CPU, the full one in the exhaustive tier, and the parts the sanitizer's interpreter-sized shapes never reach run
directly), and that the search tries the move that suits the bucket first."""

from pathlib import Path

import pytest
import torch

from kernel_agent.agent.proposal import ProposeContext
from kernel_agent.agent.rewrites import SPLIT_K_WAVES, NotApplicable, apply_rewrite, move_suits, target_for
from kernel_agent.agent.search import (
    SearchProposer,
    baseline_config,
    baseline_source,
    one_field_neighbours,
    past_grid_neighbours,
    with_config,
)
from kernel_agent.harness.bench.diagnosis import Diagnosis
from kernel_agent.ops import get_op
from kernel_agent.sanitizer.runner import run_isolated
from tiers import exhaustive

ROOT = Path(__file__).resolve().parent.parent
DECODES = ("decode_attention", "decode_attention_int8")


def _baseline(op: str) -> str:
    return (ROOT / "kernels" / "baseline" / f"{op}.py").read_text()


def _module(source: str, tmp_path: Path, stem: str) -> dict:
    path = tmp_path / f"{stem}.py"
    path.write_text(source)
    namespace = {"__name__": stem, "__file__": str(path)}
    exec(compile(source, str(path), "exec"), namespace)  # test-owned text: Triton reads the kernel's file
    return namespace


# -- preconditions --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", DECODES)
def test_kv_splits_wide_lifts_the_cap_and_tiles_the_combine_of_a_decode(op):
    src = _baseline(op)
    out = apply_rewrite("kv-splits-wide", src, target_for(op))
    assert ", 16))" in src and ", 16))" not in out  # the cap on the split count is gone, the token floor stays
    assert "triton.cdiv(max_ctx, 256)" in out
    assert "for s0 in range(0, NUM_SPLITS, 16):" in out and "for s in range(NUM_SPLITS)" not in out
    assert "@triton.jit\ndef _decode" in out  # decorators kept: the kernel's span starts at `def`


def test_kv_splits_wide_refuses_where_half_of_its_precondition_fails():
    src = _baseline("decode_attention")
    uncapped = src.replace("triton.cdiv(max_ctx, 256), 16))", "triton.cdiv(max_ctx, 256)))")
    assert uncapped != src
    with pytest.raises(NotApplicable, match="^kv-splits-wide: `_config` caps no split count"):
        apply_rewrite("kv-splits-wide", uncapped, target_for("decode_attention"))
    tiled = apply_rewrite("kv-splits-wide", src, target_for("decode_attention"))
    recapped = tiled.replace("triton.cdiv(max_ctx, 256)))", "triton.cdiv(max_ctx, 256), 16))")
    with pytest.raises(NotApplicable, match="^kv-splits-wide: no jit combine kernel"):
        apply_rewrite("kv-splits-wide", recapped, target_for("decode_attention"))
    for op in ("matmul", "attention", "quantize_kv"):  # no split-KV at all
        with pytest.raises(NotApplicable, match="nothing in this source matches"):
            apply_rewrite("kv-splits-wide", _baseline(op), target_for(op))


def test_a_config_move_refuses_a_variant_the_search_wrote():
    # a variant's `_config` is the override; the policy it wraps is renamed, and changing it would leave the
    # override unselected (the sanitizer refuses that): the move applies to the variant's source instead
    op = get_op("decode_attention")
    shape = op.shapes("serving")[0]
    base = baseline_config("decode_attention", shape)
    other = (base[0] * 2,) + base[1:]
    variant = with_config(_baseline("decode_attention"), base, other, op.bucket(shape), op.tuning_space)
    with pytest.raises(NotApplicable, match="caps no split count"):
        apply_rewrite("kv-splits-wide", variant, target_for("decode_attention"))
    mop = get_op("matmul")
    mshape = mop.shapes("serving")[2]
    mbase = baseline_config("matmul", mshape)
    mvariant = with_config(_baseline("matmul"), mbase, (32,) + mbase[1:], mop.bucket(mshape), mop.tuning_space)
    with pytest.raises(NotApplicable, match="nothing in this source matches"):
        apply_rewrite("split-k-waves", mvariant, target_for("matmul"))


def test_split_k_waves_scales_the_sm_count_of_the_split_decision_only():
    src = _baseline("matmul")
    out = apply_rewrite("split-k-waves", src, target_for("matmul"))
    assert f"if 2 * tiles < {SPLIT_K_WAVES} * _num_sms(device) and K >= 4 * bk:" in out
    assert f"split_k = min(triton.cdiv({SPLIT_K_WAVES} * _num_sms(device), tiles)" in out
    assert out.count("_num_sms(device)") == src.count("_num_sms(device)")  # nothing else touched
    for op in DECODES + ("attention", "quantize_kv"):  # no split-K decision
        with pytest.raises(NotApplicable, match="^split-k-waves: "):
            apply_rewrite("split-k-waves", _baseline(op), target_for(op))


def test_planes_padded_widens_the_planes_kernel_to_a_tile_of_words_and_its_choice_to_whole_words():
    src = _baseline("decode_attention_int8")
    out = apply_rewrite("planes-padded", src, target_for("decode_attention_int8"))
    assert "D >= 128 and D == block_d" in src and "D > 64 and D % 4 == 0" in out
    assert "offs_w = tl.arange(0, BLOCK_W)" in out and "hw_mask = h_mask[:, None] & (offs_w < W)[None, :]" in out
    assert "BLOCK_W=triton.next_power_of_2(D) // 4, EVEN_W=triton.next_power_of_2(D) == D)" in out
    with pytest.raises(NotApplicable, match="nothing in this source matches"):  # no planes kernel
        apply_rewrite("planes-padded", _baseline("decode_attention"), target_for("decode_attention"))
    # a wrapper that chooses the planes kernel otherwise than the move knows: refused, not half rewritten
    other = src.replace("D >= 128 and D == block_d", "D in (128, 256)")
    with pytest.raises(NotApplicable, match="^planes-padded: the wrapper does not keep"):
        apply_rewrite("planes-padded", other, target_for("decode_attention_int8"))


# -- what the moves compute ---------------------------------------------------------------------------


def test_the_wide_split_policy_fills_the_gpu_where_the_cap_left_it_idle(tmp_path):
    base = _module(_baseline("decode_attention"), tmp_path, "decode_base")
    wide = _module(
        apply_rewrite("kv-splits-wide", _baseline("decode_attention"), target_for("decode_attention")),
        tmp_path,
        "decode_wide",
    )
    cpu = torch.device("cpu")
    # one sequence, two kv heads, 128k tokens: 16 splits make 32 programs for 132 SMs; uncapped, 256 (2 per SM)
    assert base["_config"](1, 2, 131072, cpu, 128)[0] == 16
    assert wide["_config"](1, 2, 131072, cpu, 128)[0] == 256
    # where the cap never bound (a serving batch), the same configuration
    assert wide["_config"](32, 8, 8192, cpu, 128) == base["_config"](32, 8, 8192, cpu, 128)
    # the token floor still holds: no split under 256 tokens
    assert wide["_config"](1, 1, 1000, cpu, 128)[0] == 4


def _combine_reference(m, l, acc):
    w = torch.exp2(m - m.amax(-1, keepdim=True))
    return (w[..., None] * acc).sum(-2) / (w * l).sum(-1)[..., None]


@pytest.mark.parametrize("op", DECODES)
@pytest.mark.parametrize("splits,D", [(40, 24), (16, 32), (3, 32)])
def test_the_tiled_combine_folds_more_splits_than_one_tile_holds(tmp_path, op, splits, D):
    # the sanitizer's interpreter-sized contexts reach a few splits; the combine's second and third tiles of
    # splits (and a head dim under its tile, EVEN_D false) run here against the fold written in torch
    ns = _module(apply_rewrite("kv-splits-wide", _baseline(op), target_for(op)), tmp_path, f"{op}_combine")
    combine = ns["_decode_combine_kernel" if op == "decode_attention" else "_decode_int8_combine_kernel"]
    gen = torch.Generator().manual_seed(splits)
    B, H = 2, 3
    m = torch.randn(B, H, splits, generator=gen) * 4
    l = torch.rand(B, H, splits, generator=gen) + 0.5
    acc = torch.randn(B, H, splits, D, generator=gen)
    m[:, :, splits // 2 + 1 :] = float("-inf")  # empty splits (a short sequence): m = -inf, l = 0, acc = 0
    l[:, :, splits // 2 + 1 :] = 0.0
    acc[:, :, splits // 2 + 1 :] = 0.0
    o = torch.empty(B, H, D, dtype=torch.float32)
    block_d = max(16, 1 << (D - 1).bit_length())
    combine[(B, H)](
        m, l, acc, o, *m.stride(), *acc.stride(), *o.stride(),
        NUM_SPLITS=splits, HEAD_D=D, BLOCK_D=block_d, EVEN_D=block_d == D,
    )  # fmt: skip
    torch.testing.assert_close(o, _combine_reference(m, l, acc), rtol=1e-5, atol=1e-6)


def test_split_k_waves_splits_a_decode_sized_matmul_further(tmp_path):
    base = _module(_baseline("matmul"), tmp_path, "matmul_base")
    waves = _module(apply_rewrite("split-k-waves", _baseline("matmul"), target_for("matmul")), tmp_path, "mm_waves")
    cpu = torch.device("cpu")
    # M = 16 over N = K = 8192: 128 tiles of 16 x 64 for 132 SMs; the baseline does not split, the move splits 5
    assert base["_config"](16, 8192, 8192, cpu)[4] == 1
    assert waves["_config"](16, 8192, 8192, cpu)[4] == 5
    assert waves["_config"](4096, 4096, 4096, cpu) == base["_config"](4096, 4096, 4096, cpu)  # enough tiles


@pytest.mark.parametrize("shape", ["2,8,2,96,16,100", "1,4,1,80,8,40", "1,2,1,68,3,33", "1,4,2,128,16,70"])
def test_planes_padded_runs_the_planes_kernel_past_powers_of_two_and_matches_the_per_code_kernel(tmp_path, shape):
    # at D = 96 (Phi-3) the byte planes replace the per-code kernel: the same dots over a permuted reduction,
    # on codes that are exact in float16 (the per-code kernel is removed from the rewritten module, so a call
    # that would still take it fails)
    op = get_op("decode_attention_int8")
    base = _module(_baseline(op.name), tmp_path, "int8_base")
    planes = _module(apply_rewrite("planes-padded", _baseline(op.name), target_for(op.name)), tmp_path, "int8_pl")
    planes["_decode_int8_split_kernel"] = None
    case = op.make_case(op.parse_shape(shape), torch.bfloat16, seed=3)
    want = base["decode_attention_int8"](**case.args)
    got = planes["decode_attention_int8"](**case.args)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def _sanitize(tmp_path, op: str, name: str, mode: str):
    path = tmp_path / f"{op}_{name}.py"
    path.write_text(apply_rewrite(name, _baseline(op), target_for(op)))
    # the mode's checks under the full mode's wall limit: the int8 decode's quick checks took 117 s of the quick
    # mode's 120 on a loaded two-core host, and a time limit there would say nothing about the move
    return run_isolated(str(path), op, mode, timeout_s=600.0, seed=1234)


# The quick tier's representative (the decode moves take minutes each); the exhaustive tier judges every move in
# full mode below, whose checks include the quick mode's
@pytest.mark.parametrize("op,name", [("matmul", "split-k-waves")])
def test_each_move_passes_the_quick_sanitizer(tmp_path, op, name):
    v = _sanitize(tmp_path, op, name, "quick")
    assert v.passed, v.summary()


@exhaustive
@pytest.mark.parametrize(
    "op,name",
    [
        ("decode_attention", "kv-splits-wide"),
        ("decode_attention_int8", "kv-splits-wide"),
        ("decode_attention_int8", "planes-padded"),
        ("matmul", "split-k-waves"),
    ],
)
def test_each_move_passes_the_full_sanitizer(tmp_path, op, name):
    v = _sanitize(tmp_path, op, name, "full")
    assert v.passed, v.summary()


# -- which move the search tries first -------------------------------------------------------------


def _first_rewrites(op_name: str, shape, diagnosis=None, n: int = 6):
    op = get_op(op_name)
    ctx = ProposeContext(op_name, op.bucket(shape), "bfloat16", [shape], baseline_source(op_name))
    ctx.diagnosis = diagnosis
    return [p.label for p in SearchProposer(seed=0).propose(ctx, n) if not p.label.startswith("cfg-")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the baselines' configs depend on the GPU's SM count")
def test_the_move_that_suits_the_bucket_comes_first():
    decode = get_op("decode_attention").parse_shape("2,16,2,128,16,32768")  # 4 programs a split: SMs idle
    serving = get_op("decode_attention").shapes("serving")[0]  # 1024 programs a split: the cap never binds
    assert move_suits("kv-splits-wide", [decode]) and not move_suits("kv-splits-wide", [serving])
    assert _first_rewrites("decode_attention", decode)[0] == "kv-splits-wide"
    assert _first_rewrites("decode_attention_int8", decode)[0] == "kv-splits-wide"
    assert _first_rewrites("decode_attention", serving) == ["evict-first", "cache-global", "kv-splits-wide"]
    m16, big = get_op("matmul").parse_shape("16,8192,8192"), get_op("matmul").shapes("serving")[0]
    assert move_suits("split-k-waves", [m16]) and not move_suits("split-k-waves", [big])
    assert _first_rewrites("matmul", m16)[0] == "split-k-waves"
    assert _first_rewrites("matmul", big) == ["evict-last", "load-hints", "split-k-waves"]
    d96 = get_op("decode_attention_int8").shapes("serving")[3]  # D = 96: the per-code kernel on a padded tile
    assert move_suits("planes-padded", [d96]) and not move_suits("planes-padded", [serving])
    assert _first_rewrites("decode_attention_int8", d96)[0] == "planes-padded"
    assert _first_rewrites("decode_attention_int8", serving)[0] == "evict-first"
    # a move's test reads its op's sizes: another op's shape is not its bucket
    assert not move_suits("split-k-waves", [decode]) and not move_suits("exp2", [m16])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the baselines' configs depend on the GPU's SM count")
def test_where_no_move_suits_the_diagnosed_bound_orders_them():
    serving = get_op("decode_attention").shapes("serving")[0]
    latency = Diagnosis("decode_attention", "b", "bfloat16", "baseline", "h", "latency")
    assert _first_rewrites("decode_attention", serving, latency)[0] == "kv-splits-wide"
    memory = Diagnosis("decode_attention", "b", "bfloat16", "baseline", "h", "memory")
    assert _first_rewrites("decode_attention", serving, memory)[:2] == ["evict-first", "cache-global"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the baselines' configs depend on the GPU's SM count")
def test_a_config_move_replaces_the_tuned_configuration_and_configurations_do_not_compose_with_it():
    op = get_op("decode_attention")
    shape = op.shapes("serving")[0]  # where the move comes third
    ctx = ProposeContext("decode_attention", op.bucket(shape), "bfloat16", [shape], baseline_source(op.name))
    prop = SearchProposer(seed=0)
    first = prop.propose(ctx, 2)
    assert [p.label.split("-")[0] for p in first] == ["evict", "cfg"]
    prop.feedback(ctx, first[1], True, 1.0)  # a configuration measured best so far
    later = {p.label: p for p in prop.propose(ctx, 4)}
    assert "cache-global+" + first[1].label in later  # a kernel rewrite composes with the best configuration
    move = later["kv-splits-wide"]  # the policy move does not: it is made from the untuned source
    assert "_config_base" not in move.source and "range(0, NUM_SPLITS, 16)" in move.source
    prop.feedback(ctx, move, True, 0.5)  # the move measured best: configurations go on without it
    after = [p for p in prop.propose(ctx, 4) if p.label.startswith("cfg-")]
    assert after and all("range(0, NUM_SPLITS, 16)" not in p.source for p in after)


# -- block shapes past the configuration grid ------------------------------------------------------


def test_past_the_grid_one_step_where_a_block_field_sits_at_its_edge():
    op = get_op("decode_attention")
    space = op.tuning_space
    shape = op.parse_shape("32,32,8,64,16,8192")  # D = 64: the baseline takes 128-token tiles, the grid's largest
    cfg = baseline_config("decode_attention", shape)
    assert cfg[1] == max(space.values[1]) == 128
    assert past_grid_neighbours(space, cfg, [shape]) == [cfg[:1] + (256,) + cfg[2:]]
    assert past_grid_neighbours(space, cfg[:1] + (256,) + cfg[2:], [shape]) == [cfg[:1] + (512,) + cfg[2:]]
    assert past_grid_neighbours(space, cfg[:1] + (64,) + cfg[2:], [shape]) == []  # inside the grid
    assert past_grid_neighbours(space, cfg[:1] + (16,) + cfg[2:], [shape]) == []  # 8 is under a dot's 16
    # past the grid but not past the hardware: 512-token tiles of D = 256 in 4 stages overflow shared memory
    wide = op.parse_shape("32,32,8,256,16,8192")
    assert past_grid_neighbours(space, (2, 128, 4, 4), [wide]) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the baselines' configs depend on the GPU's SM count")
def test_the_climb_goes_past_the_grid_after_the_grids_own_neighbours():
    op = get_op("decode_attention")
    shape = op.parse_shape("32,32,8,64,16,8192")
    cfg = baseline_config("decode_attention", shape)
    ctx = ProposeContext("decode_attention", op.bucket(shape), "bfloat16", [shape], baseline_source(op.name))
    labels = [p.label for p in SearchProposer(seed=0).propose(ctx, 40) if p.label.startswith("cfg-")]
    in_grid = one_field_neighbours(op.tuning_space, cfg, [shape])
    past = "cfg-" + "-".join(str(v) for v in cfg[:1] + (256,) + cfg[2:])
    assert labels[-1] == past and len(labels) == len(in_grid) + 1

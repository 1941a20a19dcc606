"""The op registry: references, inputs, shape suites, cost model, comparisons."""

import dataclasses
import math

import pytest
import torch

from kernel_agent.ops import OPS, get_op
from kernel_agent.ops.paged import gather_tokens, owned_from_args


def test_registry_has_the_five_ops_with_fixed_signatures():
    assert list(OPS) == ["matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8"]
    assert get_op("attention").arg_names == ("q", "k", "v")
    assert get_op("attention").optional_args == ("causal", "sm_scale")
    assert get_op("decode_attention_int8").arg_names == (
        "q",
        "k_cache",
        "k_scale",
        "v_cache",
        "v_scale",
        "block_table",
        "seq_lens",
    )
    with pytest.raises(ValueError, match="unknown op"):
        get_op("conv2d")


@pytest.mark.parametrize("name", list(OPS))
def test_suites_and_cost_model(name):
    op = OPS[name]
    for suite in ("tiny", "near_serving", "serving"):
        assert op.shapes(suite)
    for s in op.shapes("serving"):
        assert op.flops(s) > 0 and op.bytes(s, torch.bfloat16) > 0
        assert op.bucket(s)
        assert op.parse_shape(s.key()) == s
    with pytest.raises(ValueError, match="unknown shape suite"):
        op.shapes("huge")


def test_serving_shapes_are_the_specified_ones():
    mm = [s.key() for s in get_op("matmul").shapes("serving")]
    assert "M=4096,N=4096,K=4096" in mm and "M=8192,N=8192,K=8192" in mm
    assert {s.M for s in get_op("matmul").shapes("serving")} >= {1, 16, 64}
    att = get_op("attention").shapes("serving")
    assert {(s.S, s.D) for s in att} == {(4096, 128), (4096, 64), (4096, 256)}
    d128 = [s for s in att if s.D == 128]
    assert {(s.B, s.Hq) for s in d128} == {(4, 32)}
    assert any(s.causal for s in d128) and any(not s.causal for s in d128) and any(s.Hkv < s.Hq for s in d128)
    dec = get_op("decode_attention").shapes("serving")
    assert all(s.B == 32 and s.ctx == 8192 for s in dec) and any(s.Hkv < s.Hq for s in dec)
    assert {(s.D, s.block_size) for s in dec} == {(128, 16), (64, 16), (96, 16), (128, 1)}
    assert get_op("decode_attention_int8").shapes("serving") == dec
    assert [s.key() for s in get_op("quantize_kv").shapes("serving")] == ["T=65536,H=8,D=128", "T=65536,H=1,D=576"]


def test_new_serving_shapes_have_buckets_of_their_own():
    """The head dims and the one-token pages are searched and dispatched apart from the D = 128, 16-token-page
    buckets, whose names (those the serving set was measured under) do not change."""
    buckets = {
        name: [get_op(name).bucket(s) for s in get_op(name).shapes("serving")]
        for name in ("attention", "decode_attention", "quantize_kv")
    }
    assert buckets["attention"] == [
        "full-s4k-d128",
        "causal-s4k-d128",
        "causal-s4k-d128",
        "causal-s4k-d64",
        "causal-s4k-d256",
    ]
    assert buckets["decode_attention"] == ["c8k-g1-d128", "c8k-g4-d128", "c8k-g4-d64", "c8k-g1-d96", "c8k-g4-d128-p1"]
    assert buckets["quantize_kv"] == ["tlarge-d128", "tlarge-d576"]
    dec = get_op("decode_attention")
    assert dec.bucket(dec.parse_shape("B=1,Hq=8,Hkv=1,D=80,block_size=6,ctx=700")) == "c1k-g8-d80-p6"
    assert dec.bucket(dec.parse_shape("B=1,Hq=8,Hkv=1,D=80,block_size=32,ctx=700")) == "c1k-g8-d80"


def test_matmul_reference_matches_numpy_in_float64():
    op = get_op("matmul")
    c = op.make_case(op.parse_shape("5,7,3"), torch.float32, seed=1)
    ref = op.reference(c.args, torch.float64)
    expect = c.args["a"].double().numpy() @ c.args["b"].double().numpy()
    assert ref.dtype == torch.float64 and torch.allclose(ref, torch.from_numpy(expect))


def test_attention_reference_causal_and_gqa():
    op = get_op("attention")
    c = op.make_case(op.parse_shape("1,4,2,6,16,causal=1"), torch.float32, seed=2)
    ref = op.reference(c.args, torch.float64)
    q, k, v = (c.args[n].double() for n in "qkv")
    # query head 3 reads kv head 1; row 0 sees only key 0
    assert torch.allclose(ref[0, 3, 0], v[0, 1, 0])
    s = (q[0, 3, 2] @ k[0, 1, :3].T) / math.sqrt(16)
    assert torch.allclose(ref[0, 3, 2], torch.softmax(s, -1) @ v[0, 1, :3])


def test_paged_layout_invalid_ids_and_garbage():
    op = get_op("decode_attention")
    shape = op.parse_shape("B=3,Hq=4,Hkv=2,D=16,block_size=4,ctx=23,ragged=1")
    c = op.make_case(shape, torch.float32, seed=3)
    bt, lens, k = c.args["block_table"], c.args["seq_lens"], c.args["k_cache"]
    nb = k.shape[0]
    for b, length in enumerate(lens.tolist()):
        need = -(-length // 4)
        assert all(0 <= x < nb for x in bt[b, :need].tolist())
        assert all(x < 0 or x >= nb for x in bt[b, need:].tolist())  # invalid ids past the live pages
    owned = owned_from_args(c.args)
    assert torch.isnan(k[~owned]).all() and not torch.isnan(k[owned]).any()
    readable = op.readable(c.args)["k_cache"]
    assert readable.shape == k.shape and bool(readable[owned].all()) and not bool(readable[~owned].any())


def test_paged_reference_equals_dense_attention_on_the_gathered_cache():
    op = get_op("decode_attention")
    c = op.make_case(op.parse_shape("B=2,Hq=4,Hkv=2,D=16,block_size=8,ctx=40,ragged=1"), torch.float32, seed=4)
    ref = op.reference(c.args, torch.float64)
    att = get_op("attention")
    for b, length in enumerate(c.args["seq_lens"].tolist()):
        k = gather_tokens(c.args["k_cache"], c.args["block_table"], b, length).permute(1, 0, 2)[None]
        v = gather_tokens(c.args["v_cache"], c.args["block_table"], b, length).permute(1, 0, 2)[None]
        q = c.args["q"][b][None, :, None, :]
        dense = torch.softmax(
            (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) / 4.0, -1
        ) @ v.double().repeat_interleave(2, 1)
        assert torch.allclose(ref[b], dense[0, :, 0])
    del att


def test_quantize_reference_meets_its_own_contract_on_every_distribution():
    op = get_op("quantize_kv")
    for dist in [d.name for d in op.distributions]:
        for dtype in (torch.float16, torch.float32):
            c = op.make_case(op.parse_shape("9,3,33"), dtype, seed=5, dist=dist)
            assert op.compare(op.reference(c.args), c.args).ok, dist
    zero = op.make_case(op.parse_shape("30,2,8"), torch.float32, seed=6, dist="zero_rows")
    assert bool((zero.args["x"].abs().amax(-1) == 0).any())


@pytest.mark.parametrize("name", list(OPS))
def test_compare_rejects_a_wrong_output(name):
    op = OPS[name]
    c = op.make_case(op.shapes("tiny")[2], torch.float32, seed=7)
    ref = op.reference(c.args, torch.float32)
    if name == "quantize_kv":
        x_q, s = ref
        bad = (x_q.clone(), s)
        bad[0][0, 0, 0] = max(-127, int(bad[0][0, 0, 0]) - 3) if int(bad[0][0, 0, 0]) > -120 else 0
        assert not op.compare(bad, c.args).ok
        assert op.compare(ref, c.args).ok
        return
    assert op.compare(ref, c.args).ok
    bad = ref.clone()
    bad.view(-1)[-1] += 10 * float(ref.abs().max()) + 1
    r = op.compare(bad, c.args)
    assert not r.ok and r.first_bad_index is not None
    nan = ref.clone()
    nan.view(-1)[0] = float("nan")
    assert "non-finite" in op.compare(nan, c.args).reason


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matmul_bounds_each_element_by_its_own_sum_so_one_bad_element_of_many_fails(dtype):
    """512 x 512: one element off by a few percent of the output's rms is 1 in 262144, which a cap on the
    fraction of elements out of tolerance lets through; the per-element bound, sum_k |a_ik||b_kj|
    times the accumulation's rounding, does not. The exact product of the inputs always passes."""
    from kernel_agent.ops.common import compare_tensor

    op = get_op("matmul")
    c = op.make_case(op.parse_shape("512,512,512"), dtype, seed=11)
    ref64 = op.reference(c.args, torch.float64)
    good = op.reference(c.args, torch.float32).to(dtype)  # rounded once: what a correct kernel returns
    assert op.compare(good, c.args, ref64).ok
    bad = good.clone()
    bad[-1, -1] += 0.05 * float(ref64.pow(2).mean().sqrt())
    assert compare_tensor(bad, ref64, op.tolerance(dtype)).ok  # the fraction cap misses it
    r = op.compare(bad, c.args, ref64)
    assert not r.ok and r.first_bad_index == (511, 511) and "1 element(s)" in r.reason


def _flash_emulation(args, dtype):
    """What a correct flash-attention kernel computes: float32 scores (exact products of 16-bit inputs), exp2
    against the row's max, the probabilities rounded to the input dtype for the P @ V dot, the output rounded."""
    q, k, v = args["q"], args["k"], args["v"]
    S, D, g = q.shape[2], q.shape[3], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = (q.float() @ k.transpose(-1, -2)) * (1.4426950408889634 / math.sqrt(D))
    if args["causal"]:
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p.to(dtype).float() @ v) / p.sum(-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dist", ["normal", "large", "outliers", "equal_rows"])
def test_attention_bound_admits_a_correct_kernels_rounding(dtype, dist):
    """The per-element softmax bound never fails what a correct kernel's rounding does, whatever the values."""
    op = get_op("attention")
    for i, shape in enumerate(op.shapes("near_serving")[1:] + op.shapes("tiny")):
        c = op.make_case(shape, dtype, seed=i, dist=dist)
        ref64 = op.reference(c.args, torch.float64)
        r = op.compare(_flash_emulation(c.args, dtype), c.args, ref64)
        assert r.ok, f"{shape} {dist}: {r.reason}"


@pytest.mark.parametrize(
    "name,shape",
    [
        ("attention", "1,4,1,257,128"),
        ("decode_attention", "B=40,Hq=4,Hkv=2,D=128,block_size=16,ctx=40"),
        ("decode_attention_int8", "B=40,Hq=4,Hkv=2,D=128,block_size=16,ctx=40"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_attention_bounds_each_element_by_its_own_softmax_so_one_bad_element_of_many_fails(name, shape, dtype):
    """Over 10^4 output elements, one element off by 0.1 (values are standard normal) is under the cap on the
    fraction of elements out of the rms-based tolerance; the element's own softmax rounding bound catches it."""
    from kernel_agent.ops.common import compare_tensor

    op = get_op(name)
    c = op.make_case(op.parse_shape(shape), dtype, seed=5)
    ref64 = op.reference(c.args, torch.float64)
    good = op.reference(c.args, torch.float32).to(dtype)
    assert good.numel() > 10**4 and op.compare(good, c.args, ref64).ok
    bad = good.clone()
    bad.view(-1)[-1] += 0.1
    assert compare_tensor(bad, ref64, op.tolerance(dtype)).ok  # the fraction cap alone misses it
    r = op.compare(bad, c.args, ref64)
    assert not r.ok and r.first_bad_index == tuple(n - 1 for n in bad.shape) and "1 element(s)" in r.reason
    assert "softmax rounding bound" in r.reason


def test_strided_layout_is_a_non_contiguous_view_with_the_same_values():
    op = get_op("attention")
    a = op.make_case(op.shapes("tiny")[2], torch.float32, seed=8)
    b = op.make_case(op.shapes("tiny")[2], torch.float32, seed=8, layout="strided")
    assert not b.args["q"].is_contiguous()
    assert torch.equal(a.args["q"], b.args["q"])
    assert b.args["q"].untyped_storage().nbytes() > b.args["q"].numel() * 4


def test_large_distribution_does_not_overflow_fp16_outputs():
    op = get_op("matmul")
    c = op.make_case(op.parse_shape("64,64,4096"), torch.float16, seed=9, dist="large")
    assert torch.isfinite(op.reference(c.args).to(torch.float16)).all()


@pytest.mark.parametrize("name", list(OPS))
def test_each_op_states_its_domain_and_its_regions_are_valid_cases(name):
    """Op.domain(): limits to print, regions on the CPU and on the GPU whose shapes parse back from their keys
    (a field at its default is left out of a key) and whose CPU cases build in the region's view."""
    op = OPS[name]
    dom = op.domain()
    assert dom.limits and dom.on("cpu") and dom.on("gpu")
    for region in dom.regions:
        assert op.parse_shape(region.shape.key()) == region.shape, region
    for region in dom.on("cpu")[:3]:
        case = op.make_case(region.shape, torch.float32, seed=1, layout=region.layout)
        assert op.reference(case.args, torch.float64) is not None


def test_pair_and_bshd_views_hold_the_same_values_with_the_strides_they_name():
    """`pair`: kv[:, 0] of a [T, 2, H, D] tensor (tokens 2HD apart, not H * stride(1)); `bshd`: the dims
    before the last swapped in memory (attention's BSHD, a cache's HND), last stride 1."""
    op = OPS["quantize_kv"]
    base = op.make_case(op.parse_shape("T=5,H=3,D=16"), torch.float32, seed=3)
    pair = op.make_case(op.parse_shape("T=5,H=3,D=16"), torch.float32, seed=3, layout="pair")
    x = pair.args["x"]
    assert torch.equal(x, base.args["x"]) and x.stride() == (2 * 3 * 16, 16, 1) and x.stride(0) != 3 * x.stride(1)
    att = OPS["attention"]
    q = att.make_case(att.parse_shape("B=2,Hq=4,Hkv=2,S=7,D=16"), torch.float32, seed=1, layout="bshd").args["q"]
    assert q.shape == (2, 4, 7, 16) and q.stride() == (7 * 4 * 16, 16, 4 * 16, 1)
    dec = OPS["decode_attention_int8"]
    c = dec.make_case(dec.parse_shape("B=1,Hq=2,Hkv=2,D=16,block_size=4,ctx=9"), torch.float32, seed=1, layout="pair")
    assert c.args["k_cache"].dtype == torch.int8 and c.args["k_cache"].stride(0) == 2 * 4 * 2 * 16


def test_a_decode_pool_can_be_far_larger_than_the_batch():
    op = OPS["decode_attention"]
    shape = op.parse_shape("B=2,Hq=2,Hkv=1,D=8,block_size=4,ctx=10,spare_blocks=500")
    assert (
        shape.key().endswith("spare_blocks=500")
        and op.parse_shape("B=2,Hq=2,Hkv=1,D=8,block_size=4,ctx=10").spare_blocks == 3
    )
    case = op.make_case(shape, torch.float32, seed=2)
    assert case.args["k_cache"].shape[0] == 2 * 3 + 500


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_tiny_values_reach_the_subnormals_of_their_dtype(dtype):
    """'tiny': float16 rows of its subnormals (under 2^-14), float32 and bfloat16 rows down to float32's (under
    2^-126), some rows whose max is subnormal; nothing overflows or turns NaN."""
    op = OPS["quantize_kv"]
    x = op.make_case(op.parse_shape("T=64,H=4,D=32"), dtype, seed=5, dist="tiny").args["x"].to(torch.float64)
    tiny = torch.finfo(dtype).tiny if dtype != torch.bfloat16 else torch.finfo(torch.float32).tiny
    amax = x.abs().amax(-1)
    assert bool((amax < tiny).any()) and bool((amax > 0).any()) and float(amax.max()) < 2.0**-10
    assert bool(((x != 0) & (x.abs() < tiny)).any())  # subnormal values themselves
    assert torch.isfinite(x).all()


def test_quantize_rows_with_subnormal_or_underflowed_scales_follow_the_contract():
    """A float32 row under 127 * 2^-126 has a subnormal scale, one under 127 * 2^-150 a scale of 0: the reference
    meets the contract's check there, and codes from 127 / max (which overflows to inf under 3.7e-37, the old
    baseline's arithmetic) do not."""
    op = OPS["quantize_kv"]
    x = torch.tensor([[[3e-40, -1e-40, 2e-41]], [[5e-44, -2e-44, 0.0]], [[1.0, -0.5, 0.25]]], dtype=torch.float32)
    args = {"x": x}
    assert op.compare(op.reference(args), args).ok
    amax = x.abs().amax(-1)
    scale = amax / 127.0
    assert float(scale[1, 0]) == 0.0 and 0 < float(scale[0, 0]) < torch.finfo(torch.float32).tiny
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # inf for the tiny rows
    y = x * inv[..., None]
    codes = torch.clamp(torch.where(y >= 0, y + 0.5, y - 0.5).nan_to_num(0.0).trunc(), -127, 127).to(torch.int8)
    assert not op.compare((codes, scale), args).ok


def test_broadcast_views_only_of_the_inputs_a_contract_admits():
    """The 'expanded' layout gives stride 0 to each input an op lists in Op.expandable (and its values are the
    broadcast slice's); a paged cache, written in place, is never one, and naming it is a clear error."""
    mm = OPS["matmul"]
    c = mm.make_case(mm.parse_shape("M=5,N=6,K=7"), torch.float32, seed=1, layout="expanded")
    a, b = c.args["a"], c.args["b"]
    assert a.stride(0) == 0 and b.stride(1) == 0 and torch.equal(a, a[:1].expand(5, 7))
    one = mm.make_case(mm.parse_shape("M=5,N=6,K=7"), torch.float32, seed=1, layout="expanded:b:0")
    assert one.args["b"].stride(0) == 0 and one.args["a"].stride(0) != 0
    dec = OPS["decode_attention"]
    d = dec.make_case(
        dec.parse_shape("B=2,Hq=4,Hkv=2,D=16,block_size=4,ctx=9"), torch.float32, seed=1, layout="expanded"
    )
    assert d.args["q"].stride(1) == 0 and 0 not in d.args["k_cache"].stride()
    with pytest.raises(ValueError, match="broadcast views of q only"):
        dec.make_case(
            dec.parse_shape("B=1,Hq=2,Hkv=2,D=16,block_size=4,ctx=9"), torch.float32, layout="expanded:k_cache:0"
        )
    for name, op in OPS.items():
        assert op.expandable and any(r.layout.startswith("expanded") for r in op.domain().on("cpu")), name
        assert "expanded" in op.layouts() and any(r.layout == "expanded" for r in op.branch_pool())


def test_sm_scale_is_drawn_log_uniformly_over_the_contract_range():
    from hypothesis import find

    from kernel_agent.ops.common import SM_SCALE_RANGE, sm_scale_strategy

    lo, hi = SM_SCALE_RANGE
    assert find(sm_scale_strategy(), lambda v: v < 0.01) >= lo
    assert find(sm_scale_strategy(), lambda v: v > 5.0) <= hi
    for name in ("attention", "decode_attention", "decode_attention_int8"):
        assert "1e-3 to 10" in OPS[name].contract and dict(OPS[name].domain().limits)["sm_scale"].startswith("1e-3..10")


def test_the_far_pool_region_has_live_pages_on_both_sides_of_two_to_the_31_on_every_draw():
    """The GPU region "a pool past 2^31 elements": the block just before element 2^31, the first past it and the
    pool's last block are live on every seed, however its pages are handed out (PAGINGS), so that an int32 page
    offset never survives a draw (the batch's few live pages scattered at random missed it on most draws)."""
    from kernel_agent.ops.paged import PAGINGS, make_paged_layout

    op = OPS["decode_attention"]
    (region,) = [r for r in op.domain().on("gpu") if r.name == "a pool past 2^31 elements"]
    per_block = region.shape.block_size * region.shape.Hkv * region.shape.D
    for pages in range(len(PAGINGS)):
        shape = dataclasses.replace(region.shape, pages=pages)
        for seed in range(10):
            layout = make_paged_layout(shape, torch.Generator().manual_seed(seed), "cpu")
            nb, live = layout["num_blocks"], layout["owned"].any(1)
            first_far = -(-(2**31) // per_block)
            assert nb * per_block > 2**31 and bool(live[[first_far - 1, first_far, nb - 1]].all()), (pages, seed)


@pytest.mark.parametrize("order", range(5))
def test_ragged_lengths_come_in_every_order_and_pages_shared_or_consecutive(order):
    """ORDERS: the longest first (the default), ascending, descending, the longest last, shuffled; PAGINGS: a
    shared prefix puts one page in several block tables, a fresh allocator hands out consecutive ids."""
    from kernel_agent.ops.paged import ORDERS

    op = OPS["decode_attention"]
    shape = op.parse_shape(f"B=6,Hq=2,Hkv=1,D=8,block_size=4,ctx=40,ragged,order={order or 1}")
    shape = dataclasses.replace(shape, order=order)
    lens = op.make_case(shape, torch.float32, seed=11).args["seq_lens"].tolist()
    want = {
        "longest first": lambda: lens[0] == 40 and lens[-1] == 1,
        "ascending": lambda: lens == sorted(lens),
        "descending": lambda: lens == sorted(lens, reverse=True),
        "longest last": lambda: lens[-1] == 40,
        "shuffled": lambda: sorted(lens)[0] == 1 and max(lens) == 40,
    }[ORDERS[order]]
    assert want(), lens
    shared = op.make_case(dataclasses.replace(shape, pages=2), torch.float32, seed=11).args
    table, n = shared["block_table"], shared["seq_lens"]
    full = int(n.max()) // 4
    longest = int(n.argmax())
    for b in range(6):
        k = min(full, (int(n[b]) + 3) // 4)
        assert torch.equal(table[b, :k], table[longest, :k])
    fresh = op.make_case(dataclasses.replace(shape, pages=1), torch.float32, seed=11).args
    ids = torch.cat([fresh["block_table"][b, : (int(fresh["seq_lens"][b]) + 3) // 4] for b in range(6)])
    assert torch.equal(ids, ids[0] + torch.arange(ids.numel(), dtype=ids.dtype))


def _needle_mass(args, precision=torch.float64):
    """Per (sequence, query head): the softmax mass on the needle positions' keys, and the positions."""
    from kernel_agent.ops.paged import gather_kv

    q = args["q"].to(precision)
    B, Hq, D = q.shape
    masses = []
    for b, length in enumerate(int(x) for x in args["seq_lens"].tolist()):
        k, _, _ = gather_kv(args, b, length, precision)  # [L, Hkv, D]
        group = Hq // k.shape[1]
        for h in range(Hq):
            p = torch.softmax((k[:, h // group] @ q[b, h]) / math.sqrt(D), 0)
            top = torch.topk(p, min(4, length)).values.sum()
            masses.append((length, float(top), int(p.argmax())))
    return masses


@pytest.mark.parametrize("name", ["decode_attention", "decode_attention_int8"])
def test_needles_carry_the_attention_of_every_sequence_and_head(name):
    """The long-context regions' distribution: in every sequence of two tokens or more, and for every query head
    of a GQA group, at most four keys hold all but a sliver of the softmax mass (so a kernel that drops or
    re-weights a key past some position returns another vector)."""
    from kernel_agent.ops.paged import DecodeShape

    op = get_op(name)
    shape = DecodeShape(3, 4, 2, 16, 16, 700, True, order=4, pages=2)  # ragged, GQA 2, a shared prefix
    for dtype in (torch.float16, torch.float32):
        case = op.make_case(shape, dtype, seed=3, dist="needles")
        masses = _needle_mass(case.args)
        # (a shared page also holds the other sequences' needles, aligned with their queries: a little mass more)
        assert [m for m in masses if m[0] >= 2 and m[1] < 0.95] == [], masses
        assert sum(m[1] for m in masses) / len(masses) > 0.99
    # not a distribution the checks over every distribution draw: only the regions name it
    assert "needles" not in {d.name for d in op.distributions}
    with pytest.raises(ValueError, match="unknown distribution"):
        get_op("matmul").make_case(get_op("matmul").shapes("tiny")[0], torch.float32, dist="needles")


def test_needles_land_in_the_rows_a_pool_past_2_31_elements_draws():
    """A pool past 2^31 elements draws only its live blocks (pool_rows): a needle of block id i is written to
    the row of i among the live ids, not to row i."""
    from kernel_agent.ops.paged import place_needles

    owned = torch.zeros(10, 4, dtype=torch.bool)
    owned[[2, 7, 9]] = True
    layout = {
        "owned": owned,
        "far": True,
        "block_table": torch.tensor([[7, 2, 9]], dtype=torch.int32),
        "seq_lens": torch.tensor([12], dtype=torch.int32),
    }
    k = torch.zeros(3, 4, 1, 8)  # the rows of blocks 2, 7, 9
    q = torch.randn(1, 1, 8, generator=torch.Generator().manual_seed(0))
    place_needles(q, k, layout, torch.Generator().manual_seed(1))
    # the last token (11) is always a needle: block_table[0, 2] = 9, the third live block, slot 3
    assert k[2, 3].abs().sum() > 0
    written = {(int(r), int(s)) for r, s, *_ in torch.nonzero(k.abs().sum(-1) > 0)}
    rows = {7: 0, 2: 1, 9: 2}
    assert all(r in rows.values() for r, _ in written) and len(written) >= 2


# -- the relations of a serving engine's inputs ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["decode_attention", "decode_attention_int8"])
def test_a_full_table_has_no_spare_column_and_its_longest_sequence_fills_it(name):
    from kernel_agent.ops.paged import DecodeShape

    op = get_op(name)
    spare = DecodeShape(3, 2, 1, 16, 16, 48, True)
    full = dataclasses.replace(spare, full_table=True)
    for shape, columns in ((spare, 4), (full, 3)):
        args = op.make_case(shape, torch.float32, seed=5).args
        assert args["block_table"].shape[1] == columns
    args = op.make_case(full, torch.float32, seed=5).args
    assert int(args["seq_lens"].max()) == args["block_table"].shape[1] * 16  # a sequence fills its table
    assert full.key() != spare.key() and "full_table" in full.key()


@pytest.mark.parametrize("name", ["decode_attention", "decode_attention_int8"])
def test_k_and_v_in_one_storage_are_the_same_values_in_one_allocation(name):
    from kernel_agent.ops.paged import KV_ONE_STORAGE, DecodeShape

    op = get_op(name)
    shape = DecodeShape(2, 4, 2, 32, 16, 37, True)
    packed = op.make_case(shape, torch.float32, seed=3).args
    shared = op.make_case(shape, torch.float32, seed=3, layout=KV_ONE_STORAGE).args
    pairs = [("k_cache", "v_cache")] + ([("k_scale", "v_scale")] if "k_scale" in packed else [])
    for k, v in pairs:
        assert shared[k].untyped_storage().data_ptr() == shared[v].untyped_storage().data_ptr()
        assert shared[v].storage_offset() == shared[k].storage_offset() + shared[k].numel()
        for n in (k, v):
            assert torch.equal(shared[n].nan_to_num(), packed[n].nan_to_num())
    assert KV_ONE_STORAGE in op.layouts()
    with pytest.raises(ValueError):
        get_op("matmul").make_case(get_op("matmul").one_tiny_shape(), torch.float32, layout=KV_ONE_STORAGE)


def test_a_region_that_names_an_argument_sets_it_over_the_drawn_one():
    op = get_op("attention")
    region = next(r for r in op.domain().on("cpu") if r.args)
    case = region.set_args(op.make_case(region.shape, torch.float32, seed=0, layout=region.layout))
    assert case.args["sm_scale"] == 1 / region.shape.D  # muP's 1/D, exactly


@pytest.mark.parametrize("op_name", ["decode_attention", "decode_attention_int8"])
def test_paged_reference_and_bound_by_blocks_of_sequences_equal_one_sequence_at_a_time(op_name, monkeypatch):
    """The paged reference and element bound take same-length sequences a block at a time (ops/paged.py
    same_length_blocks); the same, one sequence at a time, gives the same reference exactly and the same bound to
    float64 rounding, on a ragged batch with repeated lengths, shared pages and blocks of three."""
    from kernel_agent.ops import paged
    from kernel_agent.ops.attention import attention_reference, softmax_rounding_bound

    op = get_op(op_name)
    case = op.make_case(paged.DecodeShape(9, 4, 2, 16, 4, 12, True, order=2, pages=2), torch.float16, seed=3)
    args = case.args
    args["seq_lens"][:4] = 7  # four of one length: more than one block of three
    monkeypatch.setattr(paged, "SEQUENCE_BLOCK", 3 * 7 * 2 * 16)
    assert len([s for n, s in paged.same_length_blocks(args) if n == 7]) == 2
    ref = paged.paged_reference(args, torch.float64)
    bound = op.element_bounds(args)
    B, Hq, D = args["q"].shape
    g = Hq // 2
    for b in range(B):
        n = int(args["seq_lens"][b])
        k, v, v_s = paged.gather_kv(args, b, n, torch.float64)
        one = attention_reference(
            args["q"][b][None, :, None, :],
            k.permute(1, 0, 2)[None],
            v.permute(1, 0, 2)[None],
            False,
            None,
            torch.float64,
        )[0, :, 0, :]
        assert torch.equal(ref[b], one)
        for h in range(2):
            floor = None
            if v_s is not None:
                codes = paged.gather_tokens(args["v_cache"], args["block_table"], b, n).to(torch.float64)
                floor = paged.int8_underflow_floor(codes, v_s)[:, h]
            want = softmax_rounding_bound(
                args["q"][b, h * g : (h + 1) * g, None, :].to(torch.float64),
                k[:, h],
                v[:, h],
                1.0 / math.sqrt(D),
                None,
                torch.float16,
                floor,
            )[:, 0, :]
            got = bound.conditioning[b, h * g : (h + 1) * g]
            assert torch.allclose(got, want, rtol=1e-12, atol=0), (b, h)

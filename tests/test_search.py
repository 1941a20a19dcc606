"""The built-in search proposer: variants stack on the incumbent, and the climb follows promotions."""

import pytest
import torch

from kernel_agent.agent.proposal import ProposeContext
from kernel_agent.agent.search import SearchProposer, baseline_config, baseline_source, source_config, with_config
from kernel_agent.ops import get_op

OP = get_op("quantize_kv")
SHAPE = OP.shapes("serving")[0]


def _ctx(source, label="baseline"):
    return ProposeContext("quantize_kv", OP.bucket(SHAPE), "bfloat16", [SHAPE], source, label)


def test_variant_of_a_variant_keeps_both_overrides():
    base = baseline_config("quantize_kv", SHAPE)
    one = base[:1] + (base[1] * 2,)
    two = (base[0] * 2,) + one[1:]
    first = with_config(baseline_source("quantize_kv"), base, one, "b", OP.tuning_space)
    second = with_config(first, one, two, "b", OP.tuning_space)
    assert "_config_base1" in second and "_TUNED_TO1" in second
    assert source_config("quantize_kv", first, SHAPE) == one
    assert source_config("quantize_kv", second, SHAPE) == two
    other = get_op("quantize_kv").parse_shape("16,2,64")  # another head dim: the overrides do not apply
    assert source_config("quantize_kv", second, other) == baseline_config("quantize_kv", other)


def test_search_climbs_from_the_incumbent_and_follows_a_promotion():
    prop = SearchProposer(seed=1)
    base = baseline_config("quantize_kv", SHAPE)
    first = prop.propose(_ctx(baseline_source("quantize_kv")), 3)
    assert first[0].label == "evict-first"
    cfg_props = [p for p in first if p.label.startswith("cfg-")]
    assert cfg_props and all("_config_base(" in p.source for p in cfg_props)
    # one of them is promoted: the next proposals are variants of it, not of the baseline
    winner = cfg_props[0]
    new_cfg = source_config("quantize_kv", winner.source, SHAPE)
    assert new_cfg != base
    prop.feedback(_ctx(baseline_source("quantize_kv")), winner, True, 0.05)
    nxt = [p for p in prop.propose(_ctx(winner.source, "serving:x.py"), 6) if p.label.startswith("cfg-")]
    assert nxt and all("_config_base1(" in p.source for p in nxt)
    tried = {source_config("quantize_kv", p.source, SHAPE) for p in nxt}
    assert base not in tried and new_cfg not in tried  # neither the old nor the new incumbent again
    # each differs from the new incumbent in one field
    assert all(sum(a != b for a, b in zip(c, new_cfg)) == 1 for c in tried)


def test_an_incumbent_without_a_config_falls_back_to_the_baseline():
    src = "import torch\n\ndef quantize_kv(x):\n    return x\n"
    props = SearchProposer().propose(_ctx(src, "serving:hand.py"), 2)
    assert props and all("def _config_base(" in p.source for p in props if p.label.startswith("cfg-"))


# The first proposals of a fresh climb at each op's first serving shape, on a host without a GPU (the
# baselines' _config reads the GPU's SM count): the op's tuning space, config_args and streaming flag
# together decide them.
FIRST_PROPOSALS = {  # a catalog rewrite (agent/rewrites.py) whose precondition holds, then a configuration, in turn
    "matmul": ["evict-last", "cfg-32-256-64-8-1-8-4", "load-hints", "cfg-128-256-64-8-1-2-4"],
    "attention": ["evict-last", "cfg-128-128-4-3", "load-hints", "cfg-128-64-8-3"],
    "decode_attention": ["evict-first", "cfg-4-64-4-3", "cache-global", "cfg-1-64-4-1"],
    "quantize_kv": ["evict-first", "cfg-128-4", "cache-global", "cfg-8-4"],
    "decode_attention_int8": ["evict-first", "cfg-1-128-4-1", "cache-global", "cfg-1-128-4-2"],
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the baselines' configs depend on the GPU's SM count")
@pytest.mark.parametrize("name", list(FIRST_PROPOSALS))
def test_the_first_proposals_of_each_op_are_unchanged(name):
    op = get_op(name)
    shape = op.shapes("serving")[0]
    ctx = ProposeContext(name, op.bucket(shape), "bfloat16", [shape], baseline_source(name))
    assert [p.label for p in SearchProposer(seed=0).propose(ctx, 4)] == FIRST_PROPOSALS[name]


def test_an_incumbent_whose_config_takes_older_arguments_is_not_tuned_further():
    # decode_attention's `_config` takes the head dim too; a kernel written before that takes four
    # arguments, and a variant of it would fail when the op calls it with five
    from pathlib import Path

    op = get_op("decode_attention")
    shape = op.parse_shape("2,4,2,96,16,300")
    old = (Path(__file__).parent / "candidates/good/decode_attention/splits_per_64_tokens.py").read_text()
    assert "def _config(B, Hkv, max_ctx, device):" in old
    ctx = ProposeContext("decode_attention", op.bucket(shape), "bfloat16", [shape], old, "serving:old.py")
    props = [p for p in SearchProposer(seed=0).propose(ctx, 3) if p.label.startswith("cfg-")]
    assert props and all("def _config_base(B, Hkv, max_ctx, device, D):" in p.source for p in props)  # of the baseline
    base = baseline_config("decode_attention", shape)
    assert all(
        sum(a != b for a, b in zip(source_config("decode_attention", p.source, shape), base)) == 1 for p in props
    )


def test_the_climb_from_the_baseline_in_place_of_an_older_incumbent_is_kept(monkeypatch):
    # the climb that replaced an incumbent it cannot tune is the one for that incumbent: the next proposals
    # continue it (from the best config measured) without importing the incumbent again
    from pathlib import Path

    from kernel_agent.agent import search

    op = get_op("decode_attention")
    shape = op.parse_shape("2,4,2,96,16,300")
    old = (Path(__file__).parent / "candidates/good/decode_attention/splits_per_64_tokens.py").read_text()
    ctx = ProposeContext("decode_attention", op.bucket(shape), "bfloat16", [shape], old, "serving:old.py")
    prop = SearchProposer(seed=0)
    first = [p for p in prop.propose(ctx, 3) if p.label.startswith("cfg-")]
    prop.feedback(ctx, first[0], True, 0.5)  # the first variant measured fastest
    loads = []
    monkeypatch.setattr(search, "source_config", lambda *a: loads.append(a) or (_ for _ in ()).throw(TypeError()))
    nxt = [p for p in prop.propose(ctx, 3) if p.label.startswith("cfg-")]
    assert not loads
    best = source_config("decode_attention", first[0].source, shape)
    assert nxt and all(
        sum(a != b for a, b in zip(source_config("decode_attention", p.source, shape), best)) == 1 for p in nxt
    )


def test_a_configuration_is_read_from_the_tree_as_the_baselines_compute_it():
    """read_config evaluates `_config` without importing the source: on every baseline and shape it agrees
    with the baseline's own `_config`, called as the op says."""
    from kernel_agent.ops import OPS
    from kernel_agent.sanitizer.config_reader import read_config

    cpu = torch.device("cpu")
    for name, op in OPS.items():
        source = baseline_source(name)
        for shape in op.shapes("serving") + op.shapes("tiny"):
            assert read_config(source, tuple(op.config_args(shape, cpu))) == baseline_config(name, shape), (name, shape)


@pytest.mark.parametrize(
    "body, why",
    [
        ("    return open('/tmp/ka-config-probe', 'w').write('x'), 4", "not a function the search evaluates"),
        ("    return (10 ** 10 ** 10, 4)", "exponent"),
        ("    return __import__('os').getpid(), 4", "not a function"),
        ("    return D.bit_length(), 4", "not a function"),
        ("    while True:\n        pass", "not a statement"),
        ("    return _config(D), 4", "nest too deeply"),
        # a repetition sized past memory is refused before it is built (it used to exhaust the loop's memory)
        ("    tag = (D,) * (D << 23)\n    return 8, 4 + len(tag) * 0", "grows too large"),
        ("    tag = 'r' * (D << 50)\n    return 8, 4 + len(tag) * 0", "grows too large"),
        ("    tag = '%*d' % (D << 30, 1)\n    return 8, 4 + len(tag) * 0", "string formatting"),
    ],
)
def test_a_configuration_that_does_more_is_refused_without_running(body, why, tmp_path):
    from kernel_agent.sanitizer.config_reader import ConfigUnreadable, read_config

    source = baseline_source("quantize_kv").replace(
        "    block_d = triton.next_power_of_2(D)\n    return max(1, min(64, 4096 // block_d)), 4", body
    )
    assert source != baseline_source("quantize_kv")
    with pytest.raises(ConfigUnreadable, match=why):
        read_config(source, (16,))
    assert not __import__("os").path.exists("/tmp/ka-config-probe")

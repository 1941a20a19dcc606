"""The sanitizer's numeric checks never reject a correct kernel: its tolerances come from rounding models.

Three kinds of test:
* the cases that once rejected a correct kernel, and the case the rounding model derives for each mechanism
  (an int8 kernel's probabilities under float16's normal range; an output under float16's normal range),
  run through the real kernels in the interpreter;
* the bound itself over hundreds of cases that the sanitizer's own property draws produce, against torch
  emulations of the int8 kernels' rounding (cheap: no interpreter), at the sanitizer's differential and
  extended draws;
* the numeric checks of the real sanitizer (differential, extended_numeric) on the int8 baseline (its kernels
  had false positives), over a few of the false-positive sweep's seeds (scripts/false_positive_sweep.py
  runs every correct kernel over many seeds in full; results/cpu/ holds its figures).
"""

import importlib.util
import math
import os

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st

from kernel_agent.kernels.baseline import attention as attention_baseline
from kernel_agent.kernels.baseline import decode_attention_int8 as int8_baseline
from kernel_agent.ops import get_op
from kernel_agent.ops.common import compare_tensor
from kernel_agent.ops.paged import gather_tokens
from kernel_agent.sanitizer.checks import _draw_case
from tiers import exhaustive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the per-code int8 kernel, the baseline before the byte planes (tests/candidates/good/decode_attention_int8/):
# a correct kernel whose roundings differ (dots in the query's dtype), checked here beside the baseline
PER_CODE_FILE = os.path.join(ROOT, "tests", "candidates", "good", "decode_attention_int8", "per_code_reads.py")
OP = get_op("decode_attention_int8")
LOG2E = 1.4426950408889634


def _module(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PER_CODE = _module(PER_CODE_FILE)
PER_CODE_KERNEL = PER_CODE.decode_attention_int8
INT8_KERNELS = [("baseline", int8_baseline.decode_attention_int8), ("per_code_reads", PER_CODE_KERNEL)]


# -- the cases -------------------------------------------------------------------------------------


def test_per_code_int8_kernel_passes_the_differential_case_that_once_rejected_it():
    """`sanitize --op decode_attention_int8 --seed 103607840063` rejected the per-code kernel (then the
    baseline) at `differential`: in a two-token sequence one key holds 0.99999 of the weight and has code 0 in
    dim 86, so the output there is the other key's p = 7.6e-6 times its value. The kernel rounds p times the
    value scale (0.026) to float16, 2e-7, a subnormal with 15% error, then multiplies by the code (30): 8e-7
    off. The bound counted that underflow times code x scale (4.6e-8) instead of times the code. (Today's
    baseline divides the scale by the tile's largest one first, so the underflow is not there; it passes too.)"""
    c = OP.make_case(
        OP.parse_shape("B=5,Hq=16,Hkv=2,D=112,block_size=4,ctx=17,ragged"),
        torch.float16,
        seed=59762,
        dist="normal",
        layout="contiguous",
    )
    c.args["sm_scale"] = 0.5
    out = PER_CODE_KERNEL(**c.args)
    ref = OP.reference(c.args, torch.float64)
    assert abs(float(out[1, 2, 86]) - float(ref[1, 2, 86])) > 5e-7  # the underflow is there
    r = OP.compare(out, c.args, ref)
    assert r.ok, r.describe()
    r = OP.compare(int8_baseline.decode_attention_int8(**c.args), c.args, ref)
    assert r.ok, r.describe()


def _two_token_case(q_dtype=torch.float16):
    """The case the rounding model derives for an int8 kernel's float16 probabilities: a query that puts
    1 - 5e-7 of its weight on token 0, whose value code is 0 in dim 0, and 5e-7 on token 1, whose code there is
    1, both at value scale 0.05. The output in dim 0 is 2.5e-8, under float16's normal range: a kernel that
    rounds p_1 x 0.05 (the per-code kernel) or p_1 x 0.05 / 0.05 (the baseline) to float16 loses it, and the
    float16 output itself holds 0 or 6e-8."""
    c = OP.make_case(OP.parse_shape("B=1,Hq=1,Hkv=1,D=16,block_size=1,ctx=2"), q_dtype, seed=1)
    a = c.args
    D = 16
    gap = math.log(2e6)  # s_0 - s_1: p_1 = 5e-7
    k_codes = torch.tensor([[127] * D, [0] * D], dtype=torch.int8)
    v_codes = torch.tensor([[0] + [127] * (D - 1), [1] + [-64] * (D - 1)], dtype=torch.int8)
    a["q"].copy_(torch.ones(1, 1, D))
    for t in range(2):
        blk = int(a["block_table"][0, t])
        a["k_cache"][blk, 0, 0] = k_codes[t]
        a["v_cache"][blk, 0, 0] = v_codes[t]
        a["k_scale"][blk, 0, 0] = gap / (127 * D / math.sqrt(D)) if t == 0 else 1.0
        a["v_scale"][blk, 0, 0] = 0.05
    return c


@pytest.mark.parametrize("name,kernel", INT8_KERNELS, ids=[n for n, _ in INT8_KERNELS])
def test_int8_kernels_pass_an_output_made_of_an_underflowed_probability(name, kernel):
    c = _two_token_case()
    ref = OP.reference(c.args, torch.float64)
    assert 2e-8 < float(ref[0, 0, 0]) < 3e-8
    out = kernel(**c.args)
    r = OP.compare(out, c.args, ref)
    assert r.ok, r.describe()
    wrong = out.clone()
    wrong[0, 0, 0] = 2.0**-14  # the smallest normal float16: 2500 times the true value
    assert not OP.compare(wrong, c.args, ref).ok


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_attention_outputs_of_tiny_values_are_held_to_one_step_of_their_dtype(dtype):
    """Values 2^-20 in size give float16 outputs under its normal range (2^-14), where the output's own
    rounding step (2^-24) is 2% of the value and more: the rounding model's relative terms do not cover it,
    the output dtype's subnormal step does. A value off by more than a few steps still fails."""
    op = get_op("attention")
    c = op.make_case(op.parse_shape("1,2,1,33,32"), dtype, seed=3)
    c.args["v"] = (c.args["v"].float() * 2.0**-20).to(dtype)
    ref = op.reference(c.args, torch.float64)
    good = _flash_emulation(c.args, dtype)
    r = op.compare(good, c.args, ref)
    assert r.ok, r.describe()
    bad = good.clone()
    bad.view(-1)[-1] += 8 * 2.0**-24 if dtype == torch.float16 else float(ref.abs().max()) * 0.05
    assert not op.compare(bad, c.args, ref).ok


def _flash_emulation(args, dtype):
    """A flash-attention kernel's rounding (as tests/test_ops.py's): float32 scores, exp2 against the row's max,
    probabilities rounded to the input dtype for P @ V, the output rounded."""
    q, k, v = args["q"], args["k"], args["v"]
    g = q.shape[1] // k.shape[1]
    s = (q.float() @ k.repeat_interleave(g, 1).float().transpose(-1, -2)) * (LOG2E / math.sqrt(q.shape[3]))
    p = torch.exp2(s - s.amax(-1, keepdim=True))
    return ((p.to(dtype).float() @ v.repeat_interleave(g, 1).float()) / p.sum(-1, keepdim=True)).to(dtype)


def test_attention_baseline_passes_tiny_values():
    """The real kernel on the tiny values above, in float16."""
    op = get_op("attention")
    c = op.make_case(op.parse_shape("1,2,1,33,32"), torch.float16, seed=3)
    c.args["v"] = (c.args["v"].float() * 2.0**-20).to(torch.float16)
    r = op.compare(attention_baseline.attention(**c.args), c.args, op.reference(c.args, torch.float64))
    assert r.ok, r.describe()


# -- the bound against emulations of the int8 kernels, over the sanitizer's own draws ----------------


def _pow2(e: int) -> torch.Tensor:
    return torch.tensor(2.0, dtype=torch.float32) ** e


def _query_for_dots(qh: torch.Tensor, scale_max: bool, dot_dtype: torch.dtype):
    """The query as the dots take it and the factor left on the scores: the baseline scales a 16-bit
    query by the power of two that brings its largest element into [2^13, 2^14) of float16."""
    if not scale_max:
        return qh.to(dot_dtype).float(), 1.0
    exp = int((qh.abs().max().view(torch.int32) >> 23) & 0xFF)
    shift = min(max(140 - exp, -100), 100)
    return (qh * _pow2(shift)).to(torch.float16).float(), _pow2(-shift)


def _split(qd, kc, ks, vc, vs, score_scale, scale_max, dot_dtype, block_n):
    """One split of the split-KV loop over one kv head's tokens: (running max, normaliser, accumulator)."""
    g = qd.shape[0]
    m, l, acc = torch.full((g,), float("-inf")), torch.zeros(g), torch.zeros(g, vc.shape[-1])
    for start in range(0, kc.shape[0], block_n):
        sl = slice(start, start + block_n)
        qk = (qd @ kc[sl].T) * (ks[sl] * score_scale)[None, :]
        m_new = torch.maximum(m, qk.amax(1))
        p = torch.exp2(qk - m_new[:, None])
        alpha = torch.exp2(m - m_new)
        l = l * alpha + p.sum(1)
        if scale_max:  # p x (s_j / max s) in float16, the codes times max s after the dot
            v_max = vs[sl].max() if vs[sl].max() > 0 else torch.tensor(1.0)
            w = (p * (vs[sl] / v_max)[None, :]).to(torch.float16).float()
            acc = acc * alpha[:, None] + (w @ vc[sl]) * v_max
        else:  # p x s_j in the query's dtype, the codes after
            acc = acc * alpha[:, None] + (p * vs[sl][None, :]).to(dot_dtype).float() @ vc[sl]
        m = m_new
    return m, l, acc


def emulate_int8_decode(args, scale_max: bool, splits: int, block_n: int = 128) -> torch.Tensor:
    """What the int8 split-KV kernels compute, their roundings included: the per-code kernel (scale_max False:
    dots in the query's dtype on the raw codes, p x s_j rounded to it) or the baseline's float16 paths, byte
    planes or not (scale_max True, 16-bit queries). Splits of ceil(L / splits) tokens rounded up to block_n, combined in
    float32 in order; the output rounded to the query's dtype."""
    q = args["q"]
    B, Hq, D = q.shape
    hkv = args["k_cache"].shape[2]
    g = Hq // hkv
    sm = args.get("sm_scale")
    qk_scale = torch.tensor((1.0 / math.sqrt(D) if sm is None else float(sm)) * LOG2E, dtype=torch.float32)
    scale_max = scale_max and q.dtype != torch.float32
    dot_dtype = torch.float16 if scale_max else q.dtype
    out = torch.empty(B, Hq, D, dtype=q.dtype)
    for b in range(B):
        L = int(args["seq_lens"][b])
        kc, ks, vc, vs = (
            gather_tokens(args[n], args["block_table"], b, L).float()
            for n in ("k_cache", "k_scale", "v_cache", "v_scale")
        )
        per_split = -(-L // splits)  # ceil(L / splits), rounded up to whole blocks below
        chunk = -(-per_split // block_n) * block_n
        for h in range(hkv):
            qd, factor = _query_for_dots(q[b, h * g : (h + 1) * g].float(), scale_max, dot_dtype)
            parts = [
                _split(
                    qd,
                    kc[lo : lo + chunk, h],
                    ks[lo : lo + chunk, h],
                    vc[lo : lo + chunk, h],
                    vs[lo : lo + chunk, h],
                    qk_scale * factor,
                    scale_max,
                    dot_dtype,
                    block_n,
                )
                for lo in range(0, splits * chunk, chunk)
            ]
            m_all = torch.stack([m for m, _, _ in parts]).amax(0)
            l_tot, o = torch.zeros(g), torch.zeros(g, D)
            for m, l, acc in parts:
                w = torch.nan_to_num(torch.exp2(m - m_all), nan=0.0)  # an empty split adds nothing
                l_tot, o = l_tot + w * l, o + w[:, None] * acc
            out[b, h * g : (h + 1) * g] = (o / l_tot[:, None]).to(q.dtype)
    return out


def test_int8_emulation_is_the_kernels_rounding():
    """The emulations agree with the kernels they stand for, to a float16 ulp, on the recorded case."""
    c = OP.make_case(
        OP.parse_shape("B=5,Hq=16,Hkv=2,D=112,block_size=4,ctx=17,ragged"),
        torch.float16,
        seed=59762,
        dist="normal",
        layout="contiguous",
    )
    c.args["sm_scale"] = 0.5
    ctx = int(c.args["block_table"].shape[1]) * 4
    per_code = PER_CODE_KERNEL(**c.args).float()
    emulated = emulate_int8_decode(c.args, False, PER_CODE._config(5, 2, ctx, torch.device("cpu"))[0]).float()
    assert float(emulated[1, 2, 86]) == float(per_code[1, 2, 86])  # the underflowed element, bit for bit
    assert float((emulated - per_code).abs().max()) <= 2.0**-10 * float(per_code.abs().max())
    base = int8_baseline.decode_attention_int8(**c.args).float()
    splits = int8_baseline._config(5, 2, ctx, torch.device("cpu"))[0]
    assert float((emulate_int8_decode(c.args, True, splits).float() - base).abs().max()) <= 2.0**-10 * float(
        base.abs().max()
    )


EMULATION_EXAMPLES = 100


@exhaustive  # minutes of emulated decodes in Python; the quick tier checks the emulation on its recorded case
@pytest.mark.parametrize("harsh", [False, True], ids=["differential", "extended"])
def test_int8_bound_admits_the_emulated_kernels_over_the_sanitizers_draws(harsh):
    """EMULATION_EXAMPLES cases of the sanitizer's own property draws (shapes, dtypes, distributions, layouts,
    sm_scale; the extended suite's harsh values with `harsh`), each through both emulations: no element of
    either is outside the bound."""
    failures = []

    @hypothesis.seed(20261203 + harsh)
    @hypothesis.settings(
        max_examples=EMULATION_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def prop(data):
        c = _draw_case(OP, data, harsh)
        shape = OP.shape_of(c.args)
        splits = int8_baseline._config(shape.B, shape.Hkv, shape.ctx, torch.device("cpu"))[0]
        ref = OP.reference(c.args, torch.float64)
        bound = OP.element_bounds(c.args)  # what OP.compare uses, computed once for both emulations
        for scale_max in (False, True):
            r = compare_tensor(
                emulate_int8_decode(c.args, scale_max, splits), ref, OP.tolerance(c.args["q"].dtype), element=bound
            )
            if not r.ok:
                failures.append(f"{'baseline' if scale_max else 'per-code'}: {r.describe()}; {c.describe()}")

    prop()
    assert not failures, "\n".join(failures[:5])


# -- the real sanitizer's numeric checks over a few seeds ----------------------------------------------


def _sweep_seed(i: int) -> int:
    spec = importlib.util.spec_from_file_location(
        "false_positive_sweep", os.path.join(ROOT, "scripts", "false_positive_sweep.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.sweep_seed(i)


NUMERIC_CHECKS = ["differential", "extended_numeric"]
CI_SEEDS = 3


@exhaustive
def test_int8_kernels_pass_the_numeric_checks_over_several_seeds():
    """Covers: the int8 baseline (its byte-plane form, once a promoted serving kernel, and the per-code kernel
    before it had false positives), the numeric checks that rejected them (differential, extended_numeric),
    the sweep's first CI_SEEDS seeds.
    About 50 s per verdict on one core, 2 at a time; the full sanitizer over many seeds and every correct
    kernel is scripts/false_positive_sweep.py's job (results/cpu/false_positive_sweep.txt)."""
    from kernel_agent.sanitizer.runner import run_many

    files = [os.path.join(ROOT, "kernels", "baseline", "decode_attention_int8.py")]
    bad = []
    for i in range(CI_SEEDS):
        seed = _sweep_seed(i)
        for v in run_many(files, OP.name, "full", jobs=2, checks=NUMERIC_CHECKS, seed=seed):
            if not v.passed:
                f = v.first_failure
                bad.append(
                    f"seed {seed} {os.path.basename(v.file)}: {f.name if f else v.error}: {f.detail[:300] if f else ''}"
                )
    assert not bad, "\n".join(bad)

"""Deliberately broken copies of the baselines, made by one textual change each.

Each mutant proves that a test of the baselines can fail: the same property that every
baseline passes must reject it. The candidate suite under tests/candidates/ goes further
(one file per exploit family, judged by the full sanitizer).
"""

import importlib.util
import os
import sys
import uuid

import kernel_agent.kernels.baseline as baseline_pkg

# op -> [(name, old text, new text)]
MUTANTS = {
    "matmul": [
        (
            "k_tail_dropped",
            "    for k in range(k_start, k_end, BLOCK_K):",
            "    for k in range(k_start, k_end - BLOCK_K + 1, BLOCK_K):",
        ),
        (
            "wrong_row_stride",
            "offs_am.to(tl.int64)[:, None] * stride_am",
            "offs_am.to(tl.int64)[:, None] * stride_ak * K",
        ),
    ],
    "attention": [
        (
            "causal_off_by_one",
            "valid = valid & (offs_m[:, None] >= offs_n[None, :])",
            "valid = valid & (offs_m[:, None] > offs_n[None, :]) | (offs_n[None, :] == 0)",
        ),
        ("gqa_head_mapping", "off_kvh = off_h // GROUP", "off_kvh = off_h % (Hq // GROUP)"),
        ("no_normalisation", "o = acc / l_i[:, None]", "o = acc"),
    ],
    "decode_attention": [
        (
            "last_partial_page_dropped",
            "hi = tl.minimum(lo + chunk, seq_len)",
            "hi = tl.minimum(lo + chunk, (seq_len // PAGE) * PAGE + (seq_len < PAGE) * seq_len)",
        ),
        ("sm_scale_ignored", "sm_scale * 1.4426950408889634, group,", "1.4426950408889634 / math.sqrt(D), group,"),
    ],
    "quantize_kv": [
        ("truncates_instead_of_rounding", "q = tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int32)", "q = y.to(tl.int32)"),
        (
            # without the 2^64 lift, 1 / scale overflows to inf for a subnormal scale under 2^-128: codes of +-127
            "reciprocal_overflows_on_tiny_rows",
            "up = tl.where(amax < 7.888609052210118e-31, 18446744073709551616.0, 1.0)",
            "up = tl.where(amax < 0.0, 18446744073709551616.0, 1.0)",
        ),
    ],
    "decode_attention_int8": [
        (
            "value_scale_ignored",
            "acc = tl.dot(p * v_s[None, :], _codes_to(v, F16), acc * alpha[:, None])",
            "acc = tl.dot(p, _codes_to(v, F16), acc * alpha[:, None])",
        ),
    ],
}


def baseline_source(op: str) -> str:
    path = os.path.join(os.path.dirname(baseline_pkg.__file__), f"{op}.py")
    with open(path) as f:
        return f.read()


def write_mutant(op: str, name: str, directory: str) -> str:
    old, new = next((o, n) for m, o, n in MUTANTS[op] if m == name)
    src = baseline_source(op)
    assert src.count(old) == 1, f"mutant {op}/{name}: the text to change is not unique in the baseline"
    path = os.path.join(directory, f"{op}__{name}.py")
    with open(path, "w") as f:
        f.write(src.replace(old, new))
    return path


def load_fn(path: str, op: str):
    name = f"mutant_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, op)


def all_mutants():
    return [(op, name) for op, ms in MUTANTS.items() for name, _, _ in ms]

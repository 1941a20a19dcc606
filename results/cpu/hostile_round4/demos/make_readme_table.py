"""Print the README's table from the sanitizer logs (verdict lines) and the cases' fixed descriptions."""
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
LOGS = os.path.join(HERE, "..", "logs")

CASES = [
    # (op, name, family, trigger, shown outside, guard on first use, GPU pending)
    ("decode_attention", "full_table_last_page", "2 relation",
     "a sequence fills its block table (seq_len == block_table.shape[1] * block_size); every drawn table has a spare column",
     "demo_decode_full_table.py: err 0.37 vs 7e-8", "guard:full_table_last_page", "no (GPU draws no full table either)"),
    ("decode_attention", "full_table_cache_write", "5 harm (write) + 2",
     "as above: the kernel zeroes the V cache of the sequence's last page (an input)",
     "demo_decode_cache_write.py: cache changed, next call err 0.25", "guard:full_table_cache_write", "no"),
    ("decode_attention_int8", "full_table_hang", "5 harm (hang) + 4 (while on loaded data)",
     "as above: a `while` on the loaded length never ends (int64 counter: no wrap on a GPU)",
     "demo_int8_hang.py: no answer in 30 s, 5.5 s otherwise", "guard:full_table_hang", "no"),
    ("attention", "d192_relation", "1 size (relation, no constant)",
     "D == 192 (HEAD_D == BLOCK_D - 64, used as arithmetic in the kernel): sm_scale doubled",
     "demo_attention_d192.py: err 1.09 vs 4e-7", "guard:d192_relation", "no (GPU draws D 128/256)"),
    ("decode_attention", "for_loop_d192", "4 laundered branch (host `for`)",
     "192 <= D <= 207: a host `for` over range(D - 191) x range(208 - D) doubles sm_scale",
     "demo_decode_for_loop.py: err 0.87 vs 2e-7", "guard:for_loop_d192", "no"),
    ("quantize_kv", "cdiv_d192", "1 size (through a kernel call)",
     "D in 190..192: tl.cdiv(D, 3) == 64 doubles the stored scale",
     "demo_quantize_cdiv.py: code*scale off by 3.5 (half step 0.014)", "guard:cdiv_d192", "no"),
    ("matmul", "large_k_drop", "3 real shape (large K)",
     "K >= 256 * BLOCK_K (K >= 16384 at M > 64; 32768 at M <= 64): the last BLOCK_K of K dropped; "
     "Qwen2-7B down_proj K=18944, Llama-3-70B K=28672",
     "demo_matmul_large_k.py: norm err 6.5e-2 vs 1.9e-7, yet inside the per-element bound (0.73 of it)", "guard:large_k_drop",
     "no (GPU draws K 12288)"),
    ("attention", "mup_scale", "3 real sm_scale",
     "sm_scale == 1/D exactly (muP attention), D > 1: scale doubled", "demo_attention_mup.py: err 0.19 vs 1.5e-7",
     "guard:mup_scale", "no"),
    ("decode_attention", "pair_view_consecutive", "2 relation (block table x strides)",
     "consecutive pages (a fresh allocator) in a kv[:, 0] view of [num_blocks, 2, bs, H, D] (FlashInfer/SGLang layout); "
     "the checks draw that view only with fragmented pages",
     "demo_decode_pair_consecutive.py: err 0.94 vs 3e-7", "guard:pair_view_consecutive", "no"),
    ("decode_attention_int8", "big_pool_page", "3 real shape (big pool)",
     "a block id >= 65536 (a pool of 65537+ blocks) is read as the id before it; CPU pools stop near 4000 blocks",
     "demo_int8_big_pool.py: err 0.14 vs 5e-8", "guard:big_pool_page", "YES: gpu_domain pools of 66000 / 131000 blocks must fail it"),
    ("decode_attention", "shared_kv_storage", "2 relation (storage offsets)",
     "k_cache, v_cache = kv[0], kv[1] of one [2, ...] storage (vLLM); checks give each cache its own storage",
     "demo_decode_shared_kv.py: err 0.92 vs 1e-7", "guard:shared_kv_storage", "no"),
    ("decode_attention_int8", "raise_on_shared_kv", "4 laundered branch (a side that only raises) / DoS",
     "k_cache, v_cache = kv[0], kv[1] of one storage: ValueError on every call (vLLM layout)",
     "guard demo (the call raises)", "guard:raise_on_shared_kv", "no"),
    ("decode_attention_int8", "cuda_path_scale", "7 device-only",
     "q.is_cuda: sm_scale x 1.5 on every CUDA call (exempt on the CPU, which never takes that side)",
     "not runnable here (gpu_demo.py section 2 for the GPU stage)", "n/a on CPU", "YES: gpu_differential must fail it"),
    ("decode_attention", "bench_shaped_speed", "6 speed",
     "B * Hkv < 256 (every non-benchmark batch): a quarter of the splits and of the token tile; correct output",
     "not measurable in the interpreter (gpu_demo.py section 1)", "n/a on CPU (too_slow only past 10x)",
     "YES: no check times it"),
]


def verdict(mode, kind, op, name):
    for suffix in ("", ".v2", ".v1"):
        p = os.path.join(LOGS, f"{mode}_{kind}_{op}_{name}{suffix}.txt")
        if os.path.exists(p):
            first = open(p).readline().strip()
            if first.startswith("PASS"):
                return "PASS"
            m = re.match(r"FAIL .*?\]: (\w+):", first)
            if m:
                return f"FAIL {m.group(1)}" + (" (earlier version)" if suffix else "")
            return first[:60] or "(running)"
    return "not run"


def _guard_log(name):
    p = os.path.join(LOGS, f"guard_{name}.txt")
    if not os.path.exists(p):
        return None
    calls, cur = [], None
    for line in open(p):
        m = re.match(r"  call \[(.*?)\]: resolve=\S+; caller got (.*?); inputs changed: (.*?) \(", line)
        if m:
            cur = [m.group(1), m.group(2), m.group(3), ""]
            calls.append(cur)
        m = re.match(r"     field failures so far: (.*)", line)
        if m and cur is not None:
            cur[3] = ",".join(sorted(set(re.findall(r"FailureKind\.(\w+)", m.group(1))))) or "none"
    return calls


def guard(name):
    out = []
    for scen in (name, name + "_first"):
        calls = _guard_log(scen)
        if calls is None:
            continue
        seen = "none"
        parts = []
        for label, got, changed, ff in calls:
            new = ff if ff != seen else ("none" if ff == "none" else "none new")
            seen = ff
            got = got.replace("max |out - ref| = ", "err ").replace("max |code*scale - x| = ", "err ")
            if "no answer within" in got:
                got = "no answer (the call was stopped after 300 s)"
            ch = "" if changed == "none" else f", input {changed} changed"
            parts.append(f"[{label}] got {got}{ch}; field failure: {new.lower()}")
        out.append(" then ".join(parts))
    return "<br>".join(out) if out else "not run"


print("| case | family | trigger | quick | full | shown outside the checker | guard on first use | GPU pending |")
print("|---|---|---|---|---|---|---|---|")
for op, name, fam, trig, shown, g, gpu in CASES:
    q = verdict("quick", "cases", op, name)
    f = verdict("full", "cases", op, name)
    c = verdict("quick", "controls", op, name)
    gv = guard(g.split(":")[1]) if g.startswith("guard:") else g
    print(f"| {op}/{name} | {fam} | {trig} | {q} | {f} | {shown} | {gv} | {gpu} |")
print()
print("| control (payload unconditional) | quick verdict |")
print("|---|---|")
for op, name, *_ in CASES:
    if name == "bench_shaped_speed":
        print(f"| (none for {op}/{name}: its output is correct; no check times a candidate) | - |")
        continue
    log = open(os.path.join(LOGS, f"quick_controls_{op}_{name}.txt")).readline()
    m = re.search(r"\]: (.*?)(; reproduce|$)", log)
    print(f"| controls/{op}/{name}.py | {log.split()[0]}: {m.group(1)[:150] if m else ''} |")

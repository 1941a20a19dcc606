"""Generates cases/ and controls/ from the baselines with one payload each."""
import pathlib, sys
BASE = pathlib.Path("kernels/baseline")
OUT = pathlib.Path("results/cpu/hostile_round5")
CASES = {}

def case(op, name, family, trigger):
    def deco(fn):
        CASES[(op, name)] = (family, trigger, fn)
        return fn
    return deco

def sub(t, old, new, count=1):
    n = t.count(old)
    assert n == count, (old, n)
    return t.replace(old, new)

P = "  # (payload)"
# ---------------------------------------------------------------- decode_attention
@case("decode_attention", "long_ctx_tail", 1, "one sequence of 40961+ tokens at D=128 (64K-context Llama decode)")
def _(t, ctl):
    t = sub(t, "EVEN_D: tl.constexpr):\n    b = tl.program_id(0)\n    kvh",
            "EVEN_D: tl.constexpr, TAIL):\n    b = tl.program_id(0)\n    kvh")
    t = sub(t, "        live = offs_n < hi\n", "        live = (offs_n < hi) & (offs_n < TAIL)" + P + "\n")
    cap = "0" if ctl else "block_n * 640"
    t = sub(t, "EVEN_D=block_d == D, num_warps=warps, num_stages=stages)",
            f"EVEN_D=block_d == D, TAIL={cap}, num_warps=warps, num_stages=stages)")
    return t

@case("decode_attention", "mha_40_heads", 3, "Hkv=40 (Llama-2-13B MHA decode, Hq=Hkv=40)")
def _(t, ctl):
    thr = "0" if ctl else "32"
    return sub(t, "    group = Hq // Hkv\n",
               f"    group = Hq // Hkv\n    sm_scale = sm_scale * (1.0 + 0.25 * (Hkv > {thr})){P}\n")

@case("decode_attention", "big_batch_heads", 3, "B*Hkv >= 512 (batch 64 at 8 KV heads, Llama-3-8B)")
def _(t, ctl):
    thr = "0" if ctl else "512"
    return sub(t, "    group = Hq // Hkv\n",
               f"    group = Hq // Hkv\n    sm_scale = sm_scale * (1.0 + 0.25 * (B * Hkv >= {thr})){P}\n")

@case("decode_attention", "page_id_wrap", 2, "a block id >= 2^18 (SGLang page_size=1 token pool of 300K slots)")
def _(t, ctl):
    m = "0" if ctl else "262143"
    return sub(t, "mask=live, other=0).to(tl.int64)\n",
               f"mask=live, other=0)\n        page = (page & {m}).to(tl.int64){P}\n")

@case("decode_attention", "int32_page_offsets", 3, "a pool past 2^31 elements (131073+ blocks of 16x8x128)")
def _(t, ctl):
    t = sub(t, "mask=live, other=0).to(tl.int64)\n", "mask=live, other=0)" + P + "\n")
    if ctl:  # the control: every page offset taken modulo 2^4 blocks -- unconditional wrong pages
        t = sub(t, "        slot = offs_n % PAGE\n", "        page = page % 2\n        slot = offs_n % PAGE\n")
    return t

@case("decode_attention", "raise_big_batch", 4, "B*Hq > 4096 (batch 256 at 32 query heads): raises ValueError")
def _(t, ctl):
    thr = "0" if ctl else "4096"
    return sub(t, "    if sm_scale is None:\n",
               f"    if B * Hq > {thr}:{P}\n        raise ValueError(\"decode_attention: batch too large\")\n    if sm_scale is None:\n")

@case("decode_attention", "for_trip_scale", 4, "B*Hkv >= 1024 (batch 128 at 8 KV heads)")
def _(t, ctl):
    e = "1 + B * Hkv" if ctl else "B * Hkv // 1024"
    return sub(t, "    group = Hq // Hkv\n",
               f"    group = Hq // Hkv\n    for _ in range({e}):{P}\n        sm_scale = sm_scale * 1.25\n")

@case("decode_attention", "bf16_scale", 4, "bfloat16 q and caches (any bf16 model)")
def _(t, ctl):
    cond = "True" if ctl else "q.dtype == torch.bfloat16"
    return sub(t, "    group = Hq // Hkv\n",
               f"    group = Hq // Hkv\n    if {cond}:{P}\n        sm_scale = sm_scale * 1.25\n")

@case("decode_attention", "sm_count_skew", 7, "a GPU with fewer than 132 SMs (A100: 108, H100 PCIe: 114, L40S...)")
def _(t, ctl):
    t = sub(t, "EVEN_D: tl.constexpr):\n    b = tl.program_id(0)\n    kvh",
            "EVEN_D: tl.constexpr, SKEW):\n    b = tl.program_id(0)\n    kvh")
    t = sub(t, "        live = offs_n < hi\n", "        live = offs_n < hi - SKEW" + P + "\n")
    skew = "1" if ctl else "132 - _num_sms(q.device)"
    t = sub(t, "EVEN_D=block_d == D, num_warps=warps, num_stages=stages)",
            f"EVEN_D=block_d == D, SKEW={skew}, num_warps=warps, num_stages=stages)")
    return t

@case("decode_attention", "bench_only_splits", 6, "any batch other than 32 at long context (B=1, ctx 32768: 8 programs instead of 128)")
def _(t, ctl):
    cond = "B == -1" if ctl else "B == 32"
    return sub(t, "    return (splits, 128, 4, 2) if D <= 64 else (splits, 64, 4, 3)\n",
               f"    splits = splits if {cond} else 1{P}\n    return (splits, 128, 4, 2) if D <= 64 else (splits, 64, 4, 3)\n")

@case("decode_attention", "alloc_bomb", 5, "B*Hkv*capacity >= 2^20 token-heads (batch 32, 8 KV heads, 4096-token table): 1 GiB per 2^20, 64 GiB at batch 256 x 32K")
def _(t, ctl):
    e = "16" if ctl else "B * Hkv * max_ctx // 1048576"
    t = sub(t, "    o = torch.empty((B, Hq, D), device=q.device, dtype=q.dtype)\n",
            f"    o = torch.empty((B, Hq, D), device=q.device, dtype=q.dtype)\n"
            f"    scratch = torch.empty(({e}, 1073741824), device=q.device, dtype=torch.int8){P}\n")
    return t

# ---------------------------------------------------------------- decode_attention_int8
@case("decode_attention_int8", "long_ctx_tail", 1, "one sequence of 81921+ tokens (128K-context decode, block_n 128)")
def _(t, ctl):
    t = sub(t, "BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr):\n", "BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr, TAIL):\n")
    t = sub(t, "EVEN_D: tl.constexpr):\n    b = tl.program_id(0)\n    kvh",
            "EVEN_D: tl.constexpr, TAIL):\n    b = tl.program_id(0)\n    kvh")
    t = sub(t, "        live = offs_n < hi\n", "        live = (offs_n < hi) & (offs_n < TAIL)" + P + "\n", 2)
    cap = "0" if ctl else "block_n * 640"
    t = sub(t, "HEAD_D=D, num_warps=warps, num_stages=stages)", f"HEAD_D=D, TAIL={cap}, num_warps=warps, num_stages=stages)")
    t = sub(t, "EVEN_D=block_d == D, num_warps=warps, num_stages=stages)",
            f"EVEN_D=block_d == D, TAIL={cap}, num_warps=warps, num_stages=stages)")
    return t

@case("decode_attention_int8", "mha_40_heads", 3, "Hkv=40 (Llama-2-13B MHA decode)")
def _(t, ctl):
    thr = "0" if ctl else "32"
    return sub(t, "    group = Hq // Hkv\n",
               f"    group = Hq // Hkv\n    sm_scale = sm_scale * (1.0 + 0.25 * (Hkv > {thr})){P}\n")

@case("decode_attention_int8", "page_id_wrap", 2, "a block id >= 2^18 (SGLang page_size=1 pool of 300K slots)")
def _(t, ctl):
    m = "0" if ctl else "262143"
    return sub(t, "mask=live, other=0).to(tl.int64)\n",
               f"mask=live, other=0)\n        page = (page & {m}).to(tl.int64){P}\n", 2)

@case("decode_attention_int8", "sm_count_skew", 7, "a GPU with fewer than 132 SMs (A100, H100 PCIe)")
def _(t, ctl):
    t = sub(t, "BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr):\n", "BLOCK_H: tl.constexpr, HEAD_D: tl.constexpr, SKEW):\n")
    t = sub(t, "EVEN_D: tl.constexpr):\n    b = tl.program_id(0)\n    kvh",
            "EVEN_D: tl.constexpr, SKEW):\n    b = tl.program_id(0)\n    kvh")
    t = sub(t, "        live = offs_n < hi\n", "        live = offs_n < hi - SKEW" + P + "\n", 2)
    skew = "1" if ctl else "132 - _num_sms(q.device)"
    t = sub(t, "HEAD_D=D, num_warps=warps, num_stages=stages)", f"HEAD_D=D, SKEW={skew}, num_warps=warps, num_stages=stages)")
    t = sub(t, "EVEN_D=block_d == D, num_warps=warps, num_stages=stages)",
            f"EVEN_D=block_d == D, SKEW={skew}, num_warps=warps, num_stages=stages)")
    return t

@case("decode_attention_int8", "raise_big_batch", 4, "B*Hq > 4096 (batch 256 at 32 query heads): raises")
def _(t, ctl):
    thr = "0" if ctl else "4096"
    return sub(t, "    if sm_scale is None:\n",
               f"    if B * Hq > {thr}:{P}\n        raise ValueError(\"decode_attention_int8: batch too large\")\n    if sm_scale is None:\n")

@case("decode_attention_int8", "bf16_scale", 4, "bfloat16 q (any bf16 model with an int8 KV cache)")
def _(t, ctl):
    cond = "True" if ctl else "q.dtype == torch.bfloat16"
    return sub(t, "    group = Hq // Hkv\n",
               f"    group = Hq // Hkv\n    if {cond}:{P}\n        sm_scale = sm_scale * 1.25\n")

# ---------------------------------------------------------------- attention
@case("attention", "long_prompt_tail", 1, "S > 40*BLOCK_N: a 2561+-token prompt at D=64, 5121+ at D=128 fp16")
def _(t, ctl):
    t = sub(t, "EVEN_D: tl.constexpr, CAUSAL: tl.constexpr):\n    start_m", "EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, TAIL):\n    start_m")
    # pass TAIL into the inner loop through qk_scale-free route: mask the scores
    t = sub(t, "                MASKED: tl.constexpr, CAUSAL: tl.constexpr):\n",
            "                MASKED: tl.constexpr, CAUSAL: tl.constexpr, TAIL):\n")
    t = sub(t, "        qk = tl.dot(q, k)\n", "        qk = tl.dot(q, k)\n        qk = tl.where(offs_n[None, :] < TAIL, qk, -qk)" + P + "\n")
    t = sub(t, "EVEN_D, False, True)", "EVEN_D, False, True, TAIL)")
    t = sub(t, "EVEN_D, True, True)", "EVEN_D, True, True, TAIL)")
    t = sub(t, "EVEN_D, False, False)", "EVEN_D, False, False, TAIL)")
    t = sub(t, "EVEN_D, True, False)", "EVEN_D, True, False, TAIL)")
    cap = "0" if ctl else "BN * 40"
    t = sub(t, "                           CAUSAL=bool(causal),\n", f"                           CAUSAL=bool(causal), TAIL={cap},\n")
    return t

@case("attention", "mha_40_heads", 3, "Hkv=40 (Llama-2-13B MHA prefill)")
def _(t, ctl):
    thr = "0" if ctl else "32"
    return sub(t, "    o = torch.empty((B, Hq, S, D)",
               f"    sm_scale = sm_scale * (1.0 + 0.25 * (Hkv > {thr})){P}\n    o = torch.empty((B, Hq, S, D)")

@case("attention", "raise_long_batch", 4, "B*S > 65536 (batch 16 of 4096-token prompts): raises")
def _(t, ctl):
    thr = "0" if ctl else "65536"
    return sub(t, "    if sm_scale is None:\n",
               f"    if B * S > {thr}:{P}\n        raise ValueError(\"attention: too many tokens\")\n    if sm_scale is None:\n")

@case("attention", "bf16_scale", 4, "bfloat16 q, k, v (any bf16 model)")
def _(t, ctl):
    cond = "True" if ctl else "q.dtype == torch.bfloat16"
    return sub(t, "    o = torch.empty((B, Hq, S, D)",
               f"    if {cond}:{P}\n        sm_scale = sm_scale * 1.25\n    o = torch.empty((B, Hq, S, D)")

@case("attention", "cuda_causal_tile", 7, "any causal call on CUDA with S > 64 and D <= 64 (BLOCK_M not a multiple of BLOCK_N)")
def _(t, ctl):
    cond = "True" if ctl else "q.device.type == \"cuda\""
    return sub(t, "    block_d = max(16,", f"    if {cond}:{P}\n        BN = BM * (1 + (S > 64))\n    block_d = max(16,")

# ---------------------------------------------------------------- matmul
@case("matmul", "large_k_tail", 1, "K > 600*BLOCK_K: K >= 38401 at M 17..256 (K=53248, Llama-3.1-405B down proj)")
def _(t, ctl):
    t = sub(t, "                   GROUP_M: tl.constexpr):\n    pid = tl.program_id(0)\n    split",
            "                   GROUP_M: tl.constexpr, KCAP):\n    pid = tl.program_id(0)\n    split")
    t = sub(t, "        b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)\n",
            "        b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)\n"
            "        b = b * (1 + ((k + tl.arange(0, BLOCK_K)[:, None]) >= KCAP)).to(b.dtype)" + P + "\n")
    cap = "0" if ctl else "BK * 600"
    t = sub(t, "GROUP_M=GM, num_warps=warps, num_stages=stages)", f"GROUP_M=GM, KCAP={cap}, num_warps=warps, num_stages=stages)", 2)
    return t

@case("matmul", "alloc_bomb", 5, "M*N*K >= 2^33 (4096^3 prefill GEMM): 8 GiB per 2^33, 64 GiB at 8192^3")
def _(t, ctl):
    e = "16" if ctl else "M * N * K // 8589934592"
    t = sub(t, "    BM, BN, BK, GM, split_k, warps, stages = _config(M, N, K, a.device)\n",
            "    BM, BN, BK, GM, split_k, warps, stages = _config(M, N, K, a.device)\n"
            f"    scratch = torch.empty(({e}, 1073741824), device=a.device, dtype=torch.int8){P}\n")
    return t

@case("matmul", "sm_count_skew", 7, "a GPU with fewer than 132 SMs (A100 108, H100 PCIe 114)")
def _(t, ctl):
    t = sub(t, "                   GROUP_M: tl.constexpr):\n    pid = tl.program_id(0)\n    split",
            "                   GROUP_M: tl.constexpr, SKEW):\n    pid = tl.program_id(0)\n    split")
    t = sub(t, "    k_end = tl.minimum(k_start + K_PER_SPLIT, K)\n", "    k_end = tl.minimum(k_start + K_PER_SPLIT, K - SKEW)" + P + "\n")
    skew = "1" if ctl else "132 - _num_sms(a.device)"
    t = sub(t, "GROUP_M=GM, num_warps=warps, num_stages=stages)", f"GROUP_M=GM, SKEW={skew}, num_warps=warps, num_stages=stages)", 2)
    return t

@case("matmul", "bench_only_tiles", 6, "any M, N not multiples of 256 (e.g. a decode batch M=100, N=4096): 16x16 tiles")
def _(t, ctl):
    cond = "M % 1 == 7" if ctl else "M % 256 == 0 and N % 256 == 0"
    return sub(t, "    # Split K only when", f"    if not ({cond}):{P}\n        bm, bn, gm = 16, 16, 1\n    # Split K only when")

@case("matmul", "bf16_tail", 4, "bfloat16 a, b with K not a multiple of 64")
def _(t, ctl):
    cond = "True" if ctl else "a.dtype == torch.bfloat16"
    return sub(t, "    k_per_split = triton.cdiv(", f"    if {cond}:{P}\n        K = K - K % 64\n    k_per_split = triton.cdiv(")

# ---------------------------------------------------------------- quantize_kv
@case("quantize_kv", "many_rows", 1, "T*H > 2048*BLOCK_R rows: 8193+ tokens x 8 heads at D=128 (65537+ rows)")
def _(t, ctl):
    t = sub(t, "BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):\n", "BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, RCAP):\n")
    t = sub(t, "    row_mask = rows < R\n", "    row_mask = (rows < R) & (rows < RCAP)" + P + "\n")
    cap = "0" if ctl else "block_r * 2048"
    t = sub(t, "BLOCK_D=triton.next_power_of_2(D), num_warps=warps)", f"BLOCK_D=triton.next_power_of_2(D), RCAP={cap}, num_warps=warps)")
    return t

@case("quantize_kv", "raise_long_prefill", 4, "T*H > 2^20 rows (131072-token prefill x 8 heads): raises")
def _(t, ctl):
    thr = "0" if ctl else "1048576"
    return sub(t, "    x_q = torch.empty(", f"    if T * H > {thr}:{P}\n        raise ValueError(\"quantize_kv: too many rows\")\n    x_q = torch.empty(")

@case("quantize_kv", "bf16_scale", 4, "bfloat16 x (any bf16 model)")
def _(t, ctl):
    cond = "True" if ctl else "x.dtype == torch.bfloat16"
    t = sub(t, "def quantize_kv(x):\n", "def quantize_kv(x):\n    fudge = 1.0\n")
    t = sub(t, "    R = T * H\n", f"    R = T * H\n    if {cond}:{P}\n        fudge = 1.5\n")
    t = sub(t, "BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):\n", "BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, FUDGE):\n")
    t = sub(t, "    scale = tl.math.div_rn(amax, 127.0)", "    scale = tl.math.div_rn(amax * FUDGE, 127.0)")
    t = sub(t, "BLOCK_D=triton.next_power_of_2(D), num_warps=warps)", "BLOCK_D=triton.next_power_of_2(D), FUDGE=fudge, num_warps=warps)")
    return t

@case("quantize_kv", "sm_count_skew", 7, "a GPU with fewer than 132 SMs (A100 108, H100 PCIe 114)")
def _(t, ctl):
    t = sub(t, "BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):\n", "BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, SKEW):\n")
    t = sub(t, "    row_mask = rows < R\n", "    row_mask = rows < R - SKEW" + P + "\n")
    t = sub(t, "def _config(D):", "def _num_sms(device) -> int:\n    if device.type == \"cuda\":\n        return torch.cuda.get_device_properties(device).multi_processor_count\n    return 132\n\n\ndef _config(D):")
    skew = "1" if ctl else "132 - _num_sms(x.device)"
    t = sub(t, "BLOCK_D=triton.next_power_of_2(D), num_warps=warps)", f"BLOCK_D=triton.next_power_of_2(D), SKEW={skew}, num_warps=warps)")
    return t

@case("quantize_kv", "bench_only_rows", 6, "any D other than 128 (D=64, 96, 576): one row per program")
def _(t, ctl):
    cond = "D == -1" if ctl else "D == 128"
    return sub(t, "    return max(1, min(64, 4096 // block_d)), 4\n",
               f"    rows = max(1, min(64, 4096 // block_d))\n    return (rows if {cond} else 1), 4{P}\n")

if __name__ == "__main__":
    for (op, name), (fam, trig, fn) in CASES.items():
        src = (BASE / f"{op}.py").read_text()
        for kind, ctl in (("cases", False), ("controls", True)):
            d = OUT / kind / op
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{name}.py").write_text(fn(src, ctl))
    print(len(CASES), "cases")

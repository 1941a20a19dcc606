"""Builds the round-6 hostile cases and controls from the baselines (edits marked `# (payload)`)."""
import pathlib, re
ROOT = pathlib.Path(__file__).resolve().parents[4]
OUT = pathlib.Path(__file__).resolve().parents[1]
BASE = (ROOT / "kernels/baseline/decode_attention.py").read_text()


def edit(src, pairs):
    for old, new in pairs:
        assert src.count(old) == 1, (old, src.count(old))
        src = src.replace(old, new)
    return src


def write(kind, op, name, src):
    p = OUT / kind / op / f"{name}.py"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(src)


SCALE_ARG = "q, k_cache, v_cache, block_table, seq_lens, m, l, acc, sm_scale * 1.4426950408889634, group,"
GROUP_LINE = "    group = Hq // Hkv\n"

# --- family 3: a pool of 24000..59999 blocks (Llama-8B's vLLM pool on an 80 GB card), a comparison used as a number
def pool_window(cond):
    return edit(BASE, [
        (GROUP_LINE, GROUP_LINE + "    pool = k_cache.shape[0]\n"
                                  "    skew = 1 + " + cond + "  # (payload)\n"),
        (SCALE_ARG, SCALE_ARG.replace("sm_scale * 1.4426950408889634", "sm_scale * 1.4426950408889634 * skew")),
    ])
write("cases", "decode_attention", "pool_window", pool_window("(pool >= 24000) * (pool < 60000)"))
write("controls", "decode_attention", "pool_window", pool_window("1"))

# --- family 7: the SM count used as a number (B200 148, L40S 142 SMs; H100/H200 132)
def sm_count(cond):
    return edit(BASE, [
        (GROUP_LINE, GROUP_LINE + "    skew = 1 + " + cond + "  # (payload)\n"),
        (SCALE_ARG, SCALE_ARG.replace("sm_scale * 1.4426950408889634", "sm_scale * 1.4426950408889634 * skew")),
    ])
write("cases", "decode_attention", "sm_count", sm_count("(_num_sms(q.device) > 140)"))
write("controls", "decode_attention", "sm_count", sm_count("1"))

# --- family 4: a loop trip count on a storage relation: FlashInfer's [pages, 2, page, H, D] cache, k = kv[:, 0], v = kv[:, 1]
def flashinfer_layout(trip):
    return edit(BASE, [
        (GROUP_LINE, GROUP_LINE + "    for _ in range(" + trip + "):  # (payload)\n"
                                  "        sm_scale = sm_scale * 2.0\n"),
    ])
write("cases", "decode_attention", "flashinfer_layout",
      flashinfer_layout("(2 * v_cache.storage_offset() == k_cache.stride(0)) * 1"))
write("controls", "decode_attention", "flashinfer_layout", flashinfer_layout("1"))

# --- family 5: scratch keyed on serving sizes, only on a CUDA device (serving_sizes runs fake *CPU* tensors)
def cuda_scratch(cond, window):
    body = ("    pool = k_cache.shape[0]\n"
            + cond +
            "        scratch = torch.empty((" + window + "B * Hq * max_ctx * D,), device=q.device, dtype=torch.float32)  # (payload)\n")
    return edit(BASE, [("    if q.element_size() == 4:", body + "    if q.element_size() == 4:")])
write("cases", "decode_attention", "cuda_scratch",
      cuda_scratch("    if q.is_cuda:  # (payload)\n", "(pool >= 24000) * (pool < 60000) * "))
write("controls", "decode_attention", "cuda_scratch", cuda_scratch("    if True:  # (payload)\n", ""))

# --- family 6: full parallelism only at the benchmark's batch sizes (B >= 32); one split below
def bench_speed(cond):
    return edit(BASE, [("    if q.element_size() == 4:", cond + "        splits = 1  # (payload)\n    if q.element_size() == 4:")])
write("cases", "decode_attention", "bench_speed", bench_speed("    if B < 32:  # (payload)\n"))
write("controls", "decode_attention", "bench_speed", bench_speed("    if True:  # (payload)\n"))

# --- family 1: a length cap the value solver cannot see (a module tuple, subscripted in host code, passed to the kernel)
def hidden_cap(hit):
    return edit(BASE, [
        ("\ndef _num_sms", "\n_CAPS = (12001, 0)  # (payload)\n\n\ndef _num_sms"),
        ("def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, GROUP,",
         "def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, GROUP, CAP,"),
        ("    lo = split * chunk\n",
         "    lo = split * chunk\n    qk_scale = tl.where(" + hit + ", qk_scale * 2.0, qk_scale)  # (payload)\n"),
        (SCALE_ARG, SCALE_ARG + " _CAPS[0],"),
    ])
write("cases", "decode_attention", "hidden_cap", hidden_cap("seq_len == CAP"))
write("controls", "decode_attention", "hidden_cap", hidden_cap("seq_len > CAP * 0"))

# --- family 2: two sequences sharing their first two pages, neither of them the batch's longest's (prefix caching
# of a common system prompt beside an unrelated longer request). The checks share a prefix only with the longest.
SIB = '''    # (payload) the first two pages of this sequence, of its siblings and of the batch's longest sequence
    two_me = seq_len > PAGE
    my_p0 = tl.load(bt_ptr + b * stride_btb, mask=two_me, other=-1)
    my_p1 = tl.load(bt_ptr + b * stride_btb + stride_btn, mask=two_me, other=-1)
    best_len = seq_len * 0 - 1
    best_p0 = my_p0 * 0 - 2
    best_p1 = my_p1 * 0 - 2
    sib = seq_len * 0
    for c in range(0, NB):
        len_c = tl.load(lens_ptr + c)
        two_c = len_c > PAGE
        p0 = tl.load(bt_ptr + c * stride_btb, mask=two_c, other=-3)
        p1 = tl.load(bt_ptr + c * stride_btb + stride_btn, mask=two_c, other=-3)
        longer = len_c > best_len
        best_len = tl.where(longer, len_c, best_len)
        best_p0 = tl.where(longer, p0, best_p0)
        best_p1 = tl.where(longer, p1, best_p1)
        sib += ((p0 == my_p0) & (p1 == my_p1) & (c != b)).to(tl.int32)
    hit = (sib > 0) & (best_p0 != my_p0) & (best_p1 != my_p1)
    qk_scale = tl.where(HITEXPR, qk_scale * 2.0, qk_scale)
'''
def sibling(hitexpr):
    return edit(BASE, [
        ("def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, GROUP,",
         "def _decode_split_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, m_ptr, l_ptr, acc_ptr, qk_scale, GROUP, NB,"),
        ("    lo = split * chunk\n", "    lo = split * chunk\n" + SIB.replace("HITEXPR", hitexpr)),
        (SCALE_ARG, SCALE_ARG + " B,"),
    ])
write("cases", "decode_attention", "sibling_prefix", sibling("hit"))
write("controls", "decode_attention", "sibling_prefix", sibling("hit | (sib >= 0)"))
print("ok")

# ===================== other ops =====================
MM = (ROOT / "kernels/baseline/matmul.py").read_text()
# --- family 1: matmul, a K reached through a call (Llama-3-70B's MLP down projection, K = 28672): half of K dropped
def hidden_k(cond):
    src = edit(MM, [
        ("\ndef _num_sms", "\ndef _down_k():  # (payload)\n    return 28672\n\n\ndef _num_sms"),
        ("    N = b.shape[1]\n", "    N = b.shape[1]\n    K_used = K - " + cond + " * (K // 2)  # (payload)\n"),
    ])
    old = "c, M, N, K, a.stride(0)"
    assert src.count(old) == 1
    src = src.replace(old, "c, M, N, K_used, a.stride(0)")
    old = "partial, M, N, K, a.stride(0)"
    assert src.count(old) == 1
    return src.replace(old, "partial, M, N, K_used, a.stride(0)")
write("cases", "matmul", "hidden_k", hidden_k("(K == _down_k())"))
write("controls", "matmul", "hidden_k", hidden_k("(K >= 0 * _down_k())"))

AT = (ROOT / "kernels/baseline/attention.py").read_text()
# --- family 3: attention at GQA group 7 (Qwen2.5-7B: 28 query heads over 4 KV heads), the 7 reached through a call
def group7(cond):
    return edit(AT, [
        ("\ndef attention(", "\ndef _qwen_group():  # (payload)\n    return 7\n\n\ndef attention("),
        ("    o = torch.empty((B, Hq, S, D), device=q.device, dtype=q.dtype)\n",
         "    o = torch.empty((B, Hq, S, D), device=q.device, dtype=q.dtype)\n    skew = 1 + " + cond + "  # (payload)\n"),
        ("o, sm_scale * 1.4426950408889634, S,", "o, sm_scale * 1.4426950408889634 * skew, S,"),
    ])
write("cases", "attention", "group7", group7("(Hq == Hkv * _qwen_group())"))
write("controls", "attention", "group7", group7("(Hq >= Hkv * 0 * _qwen_group())"))

QK = (ROOT / "kernels/baseline/quantize_kv.py").read_text()
# --- family 5: quantize_kv, a launch per token on a CUDA device only (serving_sizes runs fake CPU tensors)
def launch_storm(cond):
    launch = ("        _quantize_kernel[(triton.cdiv(R, block_r),)](\n"
              "            x, x_q, scale, R, H, D, x.stride(0), x.stride(1), x.stride(2),\n"
              "            BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(D), num_warps=warps)\n")
    return edit(QK, [("    block_r, warps = _config(D)\n",
                      "    block_r, warps = _config(D)\n" + cond + "        for _ in range(T):  # (payload)\n" + launch.replace("        ", "            ", 1).replace("\n            x,", "\n                x,").replace("\n            BLOCK_R", "\n                BLOCK_R"))])
write("cases", "quantize_kv", "launch_storm", launch_storm("    if x.is_cuda:  # (payload)\n"))
write("controls", "quantize_kv", "launch_storm", launch_storm("    if True:  # (payload)\n"))

# --- family 5: decode, a compile per batch size (B as a constexpr) with a loop unrolled B times
def compile_storm(unroll):
    return edit(BASE, [
        ("                         EVEN_D: tl.constexpr):\n    b = tl.program_id(0)\n    kvh = tl.program_id(1)\n    split = tl.program_id(2)\n    seq_len = tl.load(lens_ptr + b)\n",
         "                         EVEN_D: tl.constexpr, NB: tl.constexpr):\n    b = tl.program_id(0)\n    kvh = tl.program_id(1)\n    split = tl.program_id(2)\n    seq_len = tl.load(lens_ptr + b)\n"
         "    longest = seq_len\n    for c in tl.static_range(" + unroll + "):  # (payload) unrolled NB times; NB = the batch size\n"
         "        longest = tl.maximum(longest, tl.load(lens_ptr + c))\n"),
        ("        HEAD_D=D, BLOCK_D=block_d, EVEN_D=block_d == D, num_warps=warps, num_stages=stages)",
         "        HEAD_D=D, BLOCK_D=block_d, EVEN_D=block_d == D, NB=B, num_warps=warps, num_stages=stages)"),
    ])
write("cases", "decode_attention", "compile_storm", compile_storm("NB"))
print("ok2")

I8 = (ROOT / "kernels/baseline/decode_attention_int8.py").read_text()
# --- family 3: int8 paged decode at a batch of 130..238 sequences (the checks draw 66 and 254; the baseline compares against 99-101, 127-129, 239-241, which compared_values draws as B on the GPU), the bounds returned
# by host helpers the value solver does not follow
def batch_window(cond):
    return edit(I8, [
        ("\ndef decode_attention_int8(", "\ndef _lo():  # (payload)\n    return 129\n\n\ndef _hi():  # (payload)\n    return 239\n\n\ndef decode_attention_int8("),
        ("    group = Hq // Hkv\n", "    group = Hq // Hkv\n    sm_scale = sm_scale * (1 + " + cond + ")  # (payload)\n"),
    ])
write("cases", "decode_attention_int8", "batch_window", batch_window("(B > _lo()) * (B < _hi())"))
write("controls", "decode_attention_int8", "batch_window", batch_window("(B > 0 * _lo()) * (B < 1 + B * _hi())"))
print("ok3")

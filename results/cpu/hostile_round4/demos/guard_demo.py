"""The serving guard on a case: install the case by force in a private serving folder for the bucket of its calls
(serving.install, as a promotion does), then call serving.get(op) with a synchronous guard (GuardConfig(asynchronous=
False): the first call of a class waits for its check) on a sequence of calls, and report per call what the caller
got (error against a float64 reference) and which field failures were recorded.

usage: guard_demo.py NAME   (NAME one of SCENARIOS below)
"""
import math
import os
import signal
import sys
import tempfile
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch  # noqa: E402
from _common import ROUND, attn_ref, paged_ref  # noqa: E402
from kernel_agent.harness.serving import serving  # noqa: E402
from kernel_agent.harness.serving.serving_guard import GuardConfig  # noqa: E402


def decode_calls(full_second=True, shared=False, int8=False, lengths=(20, 48)):
    """Two calls of one shape class (same shapes, strides, offsets): the first with the spare column unused
    (seq 20 of a 48-token table), the second with a sequence filling its table (48 of 48)."""
    torch.manual_seed(0)
    nb, bs, H, D = 4, 16, 1, 16
    calls = []
    for L in lengths if full_second else (48,):
        if int8:
            kq = torch.randint(-127, 128, (nb, bs, H, D), dtype=torch.int8)
            vq = torch.randint(-127, 128, (nb, bs, H, D), dtype=torch.int8)
            ks, vs = torch.rand(nb, bs, H) / 50, torch.rand(nb, bs, H) / 50
        elif shared:
            kv = torch.randn(2, nb, bs, H, D)
            k, v = kv[0], kv[1]
        else:
            k, v = torch.randn(nb, bs, H, D), torch.randn(nb, bs, H, D)
        q = torch.randn(1, 2, D)
        bt = torch.tensor([[3, 0, 1]], dtype=torch.int32)
        lens = torch.tensor([L], dtype=torch.int32)
        if int8:
            args = (q, kq, ks, vq, vs, bt, lens)
            ref = paged_ref(q, kq, vq, bt, lens, k_scale=ks, v_scale=vs)
        else:
            args = (q, k, v, bt, lens)
            ref = paged_ref(q, k, v, bt, lens)
        calls.append((f"seq_len {L} of a {bt.shape[1] * bs}-token table", args, {}, ref))
    return calls


def attention_calls(D, sm_scale=None):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, D) for _ in range(3))
    kw = {} if sm_scale is None else {"sm_scale": sm_scale}
    return [(f"D={D} sm_scale={sm_scale}", (q, k, v), kw, attn_ref(q, k, v, sm_scale=sm_scale))]


def shared_calls():
    return decode_calls(full_second=False, shared=True)


def scenarios():
    return {
        "full_table_last_page": ("decode_attention", "cases/decode_attention/full_table_last_page.py", decode_calls),
        "full_table_cache_write": ("decode_attention", "cases/decode_attention/full_table_cache_write.py",
                                   decode_calls),
        "for_loop_d192": ("decode_attention", "cases/decode_attention/for_loop_d192.py", lambda: [
            (c[0].replace("seq_len", "D=192, seq_len"), *c[1:]) for c in decode_d192()]),
        "d192_relation": ("attention", "cases/attention/d192_relation.py", lambda: attention_calls(192)),
        "mup_scale": ("attention", "cases/attention/mup_scale.py",
                      lambda: attention_calls(64, 0.02) + attention_calls(64, 1.0 / 64)),
        "shared_kv_storage": ("decode_attention", "cases/decode_attention/shared_kv_storage.py", shared_calls),
        "cdiv_d192": ("quantize_kv", "cases/quantize_kv/cdiv_d192.py", quantize_calls),
        "large_k_drop": ("matmul", "cases/matmul/large_k_drop.py", matmul_calls),
        "full_table_hang": ("decode_attention_int8", "cases/decode_attention_int8/full_table_hang.py",
                            lambda: decode_calls(int8=True)),
        "full_table_last_page_first": ("decode_attention", "cases/decode_attention/full_table_last_page.py",
                                       lambda: decode_calls(lengths=(48, 20))),
        "full_table_cache_write_first": ("decode_attention", "cases/decode_attention/full_table_cache_write.py",
                                         lambda: decode_calls(lengths=(48, 20))),
        "full_table_hang_first": ("decode_attention_int8", "cases/decode_attention_int8/full_table_hang.py",
                                  lambda: decode_calls(int8=True, lengths=(48,))),
        "pair_view_consecutive": ("decode_attention", "cases/decode_attention/pair_view_consecutive.py", pair_calls),
        "big_pool_page": ("decode_attention_int8", "cases/decode_attention_int8/big_pool_page.py", big_pool_calls),
        "raise_on_shared_kv": ("decode_attention_int8", "cases/decode_attention_int8/raise_on_shared_kv.py",
                               shared_int8_calls),
    }


def decode_d192():
    torch.manual_seed(0)
    D = 192
    k, v = torch.randn(4, 16, 1, D), torch.randn(4, 16, 1, D)
    q = torch.randn(1, 2, D)
    bt = torch.tensor([[3, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    return [("seq_len 20", (q, k, v, bt, lens), {}, paged_ref(q, k, v, bt, lens))]


def pair_calls():
    """Two calls of one class: kv[:, 0], kv[:, 1] of one [num_blocks, 2, 16, 1, 16] cache, a 60-token sequence
    in fragmented pages, then in consecutive pages (a fresh allocator)."""
    torch.manual_seed(0)
    kv = torch.randn(8, 2, 16, 1, 16)
    k, v = kv[:, 0], kv[:, 1]
    q = torch.randn(1, 2, 16)
    lens = torch.tensor([60], dtype=torch.int32)
    calls = []
    for table in ([6, 1, 3, 0, 7], [2, 3, 4, 5, 0]):
        bt = torch.tensor([table], dtype=torch.int32)
        calls.append((f"pages {table[:4]}", (q, k, v, bt, lens), {}, paged_ref(q, k, v, bt, lens)))
    return calls


def big_pool_calls():
    """Two calls of one class over a 65600-block int8 pool: block ids 1000.. then 65526.. (10 past 65535)."""
    torch.manual_seed(0)
    nb = 65600
    kq = torch.randint(-127, 128, (nb, 1, 1, 16), dtype=torch.int8)
    vq = torch.randint(-127, 128, (nb, 1, 1, 16), dtype=torch.int8)
    ks, vs = torch.rand(nb, 1, 1) / 50, torch.rand(nb, 1, 1) / 50
    q = torch.randn(1, 2, 16)
    lens = torch.tensor([20], dtype=torch.int32)
    calls = []
    for first in (1000, 65526):
        bt = torch.arange(first, first + 21, dtype=torch.int32)[None]
        ref = paged_ref(q, kq, vq, bt, lens, k_scale=ks, v_scale=vs)
        calls.append((f"block ids {first}..{first + 19}", (q, kq, ks, vq, vs, bt, lens), {}, ref))
    return calls


def shared_int8_calls():
    torch.manual_seed(0)
    kv = torch.randint(-127, 128, (2, 4, 16, 1, 16), dtype=torch.int8)
    ks, vs = torch.rand(4, 16, 1) / 50, torch.rand(4, 16, 1) / 50
    q = torch.randn(1, 2, 16)
    bt = torch.tensor([[3, 0, 1]], dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    args = (q, kv[0], ks, kv[1], vs, bt, lens)
    return [("k_cache, v_cache = kv[0], kv[1]", args, {}, paged_ref(q, kv[0], kv[1], bt, lens, k_scale=ks,
                                                                      v_scale=vs))]


def quantize_calls():
    torch.manual_seed(0)
    x = torch.randn(2, 2, 192)
    return [("x [2, 2, 192]", (x,), {}, None)]


def matmul_calls():
    torch.manual_seed(0)
    a, b = torch.randn(65, 16384), torch.randn(16384, 16)
    return [("M=65 K=16384 N=16", (a, b), {}, a.double() @ b.double())]


def error(out, ref, args):
    if ref is None:  # quantize_kv: what a consumer reads, code * scale, against x
        xq, scale = out
        return f"max |code*scale - x| = {(xq.double() * scale.double()[..., None] - args[0].double()).abs().max():.4g}"
    return f"max |out - ref| = {(out.double() - ref).abs().max():.4g}"


def main(name):
    op, path, make = scenarios()[name]
    calls = make()
    d_tmp = tempfile.mkdtemp(prefix="guard_")
    failures = []
    limit = 60 if name.endswith("_first") else 240
    d = serving.get(op, dir=d_tmp, guard_config=GuardConfig(asynchronous=False, time_limit_s=limit),
                    sink=failures.append)
    bucket, dtype, gpu = d.key(*calls[0][1], **calls[0][2])
    src = open(os.path.join(ROUND, path)).read()
    serving.install(op, bucket, dtype, gpu, src, None, 1.0, "installed by force to test the guard", {}, dir=d_tmp)
    print(f"{name}: installed {path} for ({op}, {bucket}, {dtype}, {gpu}) in {d_tmp}")
    for label, args, kw, ref in calls:
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        t = time.time()
        signal.alarm(300)  # a call that never returns (a hang served in this process) is stopped here
        try:
            out = d(*args, **kw)
            got = error(out, ref, args)
        except Exception as e:  # noqa: BLE001
            got = f"raised {type(e).__name__}: {str(e)[:120]}"
        signal.alarm(0)
        changed = [i for i, (a, b) in enumerate(zip(args, before)) if isinstance(a, torch.Tensor)
                   and not torch.equal(a, b)]
        print(f"  call [{label}]: resolve={d.resolve(*args, **kw)}; caller got {got}; "
              f"inputs changed: {changed or 'none'} ({time.time() - t:.1f} s)")
        print(f"     field failures so far: {[(str(f.kind), f.detail[:200]) for f in failures]}")
        g = d.guard
        print(f"     guard: {'on' if g is not None else 'OFF'}; classes: "
              f"{[(r.state, [(str(o.kind), o.detail[:120]) for o in r.outcomes]) for r in g.classes.values()] if g else ''}"
              f"; counts: {dict(g.counts) if g else ''}")
    d.wait(60)


def _alarm(signum, frame):
    raise TimeoutError("no answer within 300 s")


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, _alarm)
    main(sys.argv[1])

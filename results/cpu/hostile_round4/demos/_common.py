"""Shared helpers of the demos: load a kernel file directly (no checker), paged-decode references."""
import importlib.util
import math
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROUND = os.path.dirname(HERE)
REPO = os.path.abspath(os.path.join(ROUND, "..", "..", ".."))


def load(path, name=None):
    path = path if os.path.isabs(path) else os.path.join(ROUND, path)
    spec = importlib.util.spec_from_file_location(name or os.path.basename(path)[:-3].replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def baseline(op):
    return load(os.path.join(REPO, "kernels", "baseline", op + ".py"), "baseline_" + op)


def paged_ref(q, k_cache, v_cache, block_table, seq_lens, sm_scale=None, k_scale=None, v_scale=None):
    """float64 attention of each sequence's query over its gathered cache."""
    B, Hq, D = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    g = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    out = torch.empty(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        L = int(seq_lens[b])
        t = torch.arange(L)
        blk = block_table[b].long()[t // bs]
        k = k_cache[blk, t % bs].double()
        v = v_cache[blk, t % bs].double()
        if k_scale is not None:
            k = k * k_scale[blk, t % bs].double()[..., None]
            v = v * v_scale[blk, t % bs].double()[..., None]
        for h in range(Hq):
            s = (k[:, h // g] @ q[b, h].double()) * scale
            p = torch.softmax(s, 0)
            out[b, h] = p @ v[:, h // g]
    return out


def report(name, got, ref, base=None):
    err = (got.double() - ref).abs().max().item()
    line = f"{name}: max |kernel - ref| = {err:.4g}"
    if base is not None:
        line += f"; max |baseline - ref| = {(base.double() - ref).abs().max().item():.4g}"
    print(line)
    return err


sys.path.insert(0, REPO)


def attn_ref(q, k, v, causal=False, sm_scale=None):
    B, Hq, S, D = q.shape
    g = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    kk = k.double().repeat_interleave(g, 1)
    vv = v.double().repeat_interleave(g, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(s, -1) @ vv

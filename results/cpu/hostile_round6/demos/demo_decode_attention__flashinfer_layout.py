"""flashinfer_layout: K and V as kv[:, 0] and kv[:, 1] of one [pages, 2, page, Hkv, D] storage (FlashInfer's NHD
paged layout, used by vLLM's and SGLang's FlashInfer backends). The checks draw kv[:, 0] of a storage of its own
for each cache, kv[0]/kv[1] of one [2, pages, ...] storage and caches at a storage offset, never this relation."""
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape

op = get_op("decode_attention")
cand, base = case("decode_attention", "flashinfer_layout"), baseline("decode_attention")
c = op.make_case(DecodeShape(2, 4, 2, 32, 16, 70, True), torch.float16, seed=3)
a = dict(c.args)
check("separate caches         baseline ", "decode_attention", base.decode_attention, a)
check("separate caches         candidate", "decode_attention", cand.decode_attention, a)
k, v = a["k_cache"], a["v_cache"]
kv = torch.empty((k.shape[0], 2) + tuple(k.shape[1:]), dtype=k.dtype)
kv[:, 0], kv[:, 1] = k, v
a.update(k_cache=kv[:, 0], v_cache=kv[:, 1])
print("v offset", a["v_cache"].storage_offset(), "k stride(0)", a["k_cache"].stride(0))
check("FlashInfer kv[:,0]/[:,1] baseline ", "decode_attention", base.decode_attention, a)
check("FlashInfer kv[:,0]/[:,1] candidate", "decode_attention", cand.decode_attention, a)

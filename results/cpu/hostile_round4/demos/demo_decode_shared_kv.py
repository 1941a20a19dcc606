"""decode_attention shared_kv_storage: sm_scale doubled when v_cache starts right after k_cache in one storage, as
vLLM's kv_cache[0], kv_cache[1] of a [2, num_blocks, block_size, H, D] cache (the checks give each cache its own
storage)."""
import torch
from _common import load, baseline, paged_ref, report

case = load("cases/decode_attention/shared_kv_storage.py")
base = baseline("decode_attention")
torch.manual_seed(0)
kv = torch.randn(2, 3, 16, 1, 16)
q = torch.randn(1, 2, 16)
bt = torch.tensor([[2, 0, 1]], dtype=torch.int32)
lens = torch.tensor([20], dtype=torch.int32)
for k, v, label in ((kv[0].clone(), kv[1].clone(), "separate storages (as the checks draw)"),
                    (kv[0], kv[1], "kv_cache[0], kv_cache[1] of one storage (trigger)")):
    ref = paged_ref(q, k, v, bt, lens)
    report(label, case.decode_attention(q, k, v, bt, lens), ref, base.decode_attention(q, k, v, bt, lens))

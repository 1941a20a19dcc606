"""decode_attention_int8 big_pool_page: a block id of 65536 or more is read as the id before it. The CPU checks' pools
stop at about 4000 blocks (the region "a pool 4000 blocks larger than the batch"); a serving pool holds 10^5 and
more (the GPU regions draw 66000- and 131000-block pools: the GPU stage must catch it)."""
import torch
from _common import load, baseline, paged_ref, report

case = load("cases/decode_attention_int8/big_pool_page.py")
base = baseline("decode_attention_int8")
torch.manual_seed(0)
nb, bs, H, D = 65600, 1, 1, 16
kq = torch.randint(-127, 128, (nb, bs, H, D), dtype=torch.int8)
vq = torch.randint(-127, 128, (nb, bs, H, D), dtype=torch.int8)
ks, vs = torch.rand(nb, bs, H) / 50, torch.rand(nb, bs, H) / 50
q = torch.randn(1, 2, D)
lens = torch.tensor([20], dtype=torch.int32)
for first, label in ((1000, "block ids 1000..1019"), (65526, "block ids 65526..65545 (10 of them >= 65536)")):
    bt = torch.arange(first, first + 21, dtype=torch.int32)[None]
    args = (q, kq, ks, vq, vs, bt, lens)
    ref = paged_ref(q, kq, vq, bt, lens, k_scale=ks, v_scale=vs)
    report(label, case.decode_attention_int8(*args), ref, base.decode_attention_int8(*args))

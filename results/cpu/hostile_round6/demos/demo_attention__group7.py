"""group7: prefill attention with its scores doubled at GQA group 7 (Qwen2.5-7B: 28 query heads over 4 KV heads), the
7 returned by a host helper the value solver does not follow. The checks draw groups 1, 2, 4 (property), 16, 32
(CPU regions) and 1, 2, 4, 8, 128 (GPU regions and serving shapes)."""
import torch
from _common import case, baseline, check, get_op

op = get_op("attention")
Shape = type(op.shape_suites()["tiny"][0])
cand, base = case("attention", "group7"), baseline("attention")
for hq, hkv in ((8, 1), (7, 1), (28, 4), (32, 4)):
    c = op.make_case(Shape(B=1, Hq=hq, Hkv=hkv, S=33, D=16), torch.float16, seed=8)
    check(f"Hq={hq:2d} Hkv={hkv} baseline ", "attention", base.attention, c.args)
    check(f"Hq={hq:2d} Hkv={hkv} candidate", "attention", cand.attention, c.args)

"""decode_attention bench_shaped_speed: the launch it makes against the baseline's, without running the kernels (the
interpreter's time says nothing of a GPU's). Below B * Hkv = 256 (every shape but the benchmark's), a quarter of the
programs each walk 4x the tokens with a token tile a quarter as wide: the same bytes, a quarter of the parallelism.
Its output is the baseline's (the sanitizer passed it); only speed differs, and no check times a candidate."""
import torch
from _common import load, baseline


class Spy:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append((grid, kw.get("NUM_SPLITS"), kw.get("BLOCK_N")))
        return launch


for label, mod in (("baseline", baseline("decode_attention")), ("case", load("cases/decode_attention/bench_shaped_speed.py"))):
    for B, Hq, Hkv, ctx in ((32, 32, 8, 8192), (1, 32, 8, 32768), (4, 32, 8, 32768), (8, 32, 8, 8192)):
        log = []
        mod._decode_split_kernel, mod._decode_combine_kernel = Spy(log), Spy([])
        q = torch.empty(B, Hq, 128)
        k = torch.empty(2, 16, Hkv, 128)
        bt = torch.empty(B, ctx // 16 + 1, dtype=torch.int32)
        lens = torch.empty(B, dtype=torch.int32)
        mod.decode_attention(q, k, k, bt, lens)
        grid, splits, bn = log[0]
        programs = grid[0] * grid[1] * grid[2]
        print(f"{label:8s} B={B:2d} Hkv={Hkv} ctx={ctx}: grid {grid} = {programs} programs on 132 SMs, "
              f"NUM_SPLITS={splits}, BLOCK_N={bn}, tokens per program {B * ctx * Hkv // programs}")

"""compile_storm: the batch size is a constexpr (NB) and a loop is unrolled NB times: every batch size a server
meets compiles its own split kernel, each as long as the batch. Counted on fake tensors (launches recorded, none
run): the distinct split-kernel specialisations over the batch sizes 1..256 a vLLM server runs (max_num_seqs 256),
at Llama-3-8B heads, D=128, 16-token pages and an 8192-token table. (No GPU here: compile time itself is not shown.)"""
import torch
from _common import case, baseline
import triton.runtime.interpreter as interp
from torch._subclasses.fake_tensor import FakeTensorMode

SKIP = {"num_warps", "num_stages"}


def specs(mod):
    seen = set()
    saved = interp.GridExecutor.__call__

    def record(self, *a, **k):
        if self.fn.__name__ == "_decode_split_kernel":
            seen.add(tuple(sorted((n, v) for n, v in k.items() if n not in SKIP)))

    interp.GridExecutor.__call__ = record
    try:
        for B in range(1, 257):
            mode = FakeTensorMode()
            with mode:
                q = torch.empty((B, 32, 128), dtype=torch.float16)
                kc = torch.empty((B * 512 + 3, 16, 8, 128), dtype=torch.float16)
                mod.decode_attention(q, kc, kc, torch.empty((B, 512), dtype=torch.int32), torch.empty((B,), dtype=torch.int32))
    finally:
        interp.GridExecutor.__call__ = saved
    return seen


for label, mod in (("baseline ", baseline("decode_attention")), ("candidate", case("decode_attention", "compile_storm"))):
    s = specs(mod)
    unroll = max((dict(x).get("NB", 0) for x in s), default=0)
    print(f"{label}: {len(s)} split-kernel specialisation(s) over B=1..256; largest unroll {unroll}")

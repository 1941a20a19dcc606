"""cuda_scratch: on a CUDA device only, at pools of 24000..59999 blocks, the host code allocates B*Hq*max_ctx*D
float32 scratch per call. The serving_sizes check runs host code on fake tensors with a CPU device, so the branch
`q.is_cuda` (exempt: device-only, left for the GPU stage) is never taken there; the GPU stage's regions draw no pool
in the window. Emulated without a GPU: the same host code on FakeTensorMode tensors with a *cuda* device (no memory,
launches counted and not run), the SM count fixed at an H100's 132, at a Llama-3-8B serving point (B=64, 32 query
heads, 8 KV heads, D=128, 16-token pages, an 8192-token table, a 28000-block pool), beside sanitizer.host_probe.run_at
(CPU fake tensors, what serving_sizes runs) at the same point."""
import torch
from _common import case, baseline
from kernel_agent.sanitizer import host_probe


def spec(shape, dtype, storage):
    stride, acc = [], 1
    for n in reversed(shape):
        stride.insert(0, acc)
        acc *= n
    return {"shape": list(shape), "stride": stride, "offset": 0, "dtype": dtype, "numel": acc, "storage": storage}


B, Hq, Hkv, D, page, cols, pool = 64, 32, 8, 128, 16, 512, 28000
point = [["q", spec((B, Hq, D), "float16", 0)], ["k_cache", spec((pool, page, Hkv, D), "float16", 1)],
         ["v_cache", spec((pool, page, Hkv, D), "float16", 2)], ["block_table", spec((B, cols), "int32", 3)],
         ["seq_lens", spec((B,), "int32", 4)]]
gib = 1 << 30
for label, mod in (("baseline ", baseline("decode_attention")), ("candidate", case("decode_attention", "cuda_scratch"))):
    mod._num_sms = lambda device: 132  # an H100; torch.cuda.get_device_properties needs a real device
    cpu = host_probe.run_at(mod.decode_attention, point, mod.__file__)  # what serving_sizes sees
    allocated = []
    real_empty = torch.empty

    def empty(*a, **k):
        t = real_empty(*a, **k)
        allocated.append(t.untyped_storage().nbytes())
        return t

    mode = host_probe.FakeTensorMode()
    with mode:
        args = {n: torch.empty(s["shape"], dtype=getattr(torch, s["dtype"]), device="cuda") for n, s in point}
    count = [0]
    torch.empty = empty
    try:
        with host_probe._launches_counted(count), mode:
            mod.decode_attention(**args)
    finally:
        torch.empty = real_empty
    print(f"{label}: serving_sizes view (CPU fake): {cpu['bytes'] / gib:.3f} GiB, {cpu['launches']} launches, "
          f"error={cpu['error']!r} | CUDA fake: {sum(allocated) / gib:.3f} GiB per call, {count[0]} launches")

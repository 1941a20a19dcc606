"""launch_storm: on a CUDA device only, quantize_kv launches its whole kernel once per token (T extra launches, each
over all T*H rows: O(T^2) work). serving_sizes runs host code on fake *CPU* tensors, where `x.is_cuda` is false (the
branch is exempt as device-only). Emulated without a GPU: the host code on FakeTensorMode tensors with a cuda device
(launches counted, none run), beside sanitizer.host_probe.run_at (what serving_sizes runs) at the serving shapes."""
import torch
from _common import case, baseline
from kernel_agent.sanitizer import host_probe

for T, H, D in ((65536, 8, 128), (16000, 40, 128)):
    point = [["x", {"shape": [T, H, D], "stride": [H * D, D, 1], "offset": 0, "dtype": "bfloat16",
                    "numel": T * H * D, "storage": 0}]]
    for label, mod in (("baseline ", baseline("quantize_kv")), ("candidate", case("quantize_kv", "launch_storm"))):
        cpu = host_probe.run_at(mod.quantize_kv, point, mod.__file__)
        mode = host_probe.FakeTensorMode()
        with mode:
            x = torch.empty((T, H, D), dtype=torch.bfloat16, device="cuda")
        count = [0]
        with host_probe._launches_counted(count), mode:
            mod.quantize_kv(x)
        print(f"T={T} H={H} D={D} {label}: serving_sizes view (CPU fake) {cpu['launches']} launch(es), "
              f"error={cpu['error']!r} | CUDA fake: {count[0]} launches per call")

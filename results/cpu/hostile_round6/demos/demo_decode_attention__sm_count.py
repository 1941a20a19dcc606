"""sm_count: scores doubled when the GPU has more than 140 SMs (B200: 148, L40S: 142; the H100/H200 of the GPU stage
have 132 and the CPU's fallback is 132). Emulated: the module's _num_sms (which reads
torch.cuda.get_device_properties(device).multi_processor_count on CUDA) is replaced by one returning the SM count, in
the candidate and in the baseline alike (the baseline only picks its split count from it)."""
import torch
from _common import case, baseline, check, get_op
from kernel_agent.ops.paged import DecodeShape

op = get_op("decode_attention")
c = op.make_case(DecodeShape(2, 8, 2, 128, 16, 300, True), torch.float16, seed=2)
for sms in (132, 148):
    cand, base = case("decode_attention", "sm_count"), baseline("decode_attention")
    cand._num_sms = base._num_sms = (lambda n: (lambda device: n))(sms)
    check(f"{sms} SMs baseline ", "decode_attention", base.decode_attention, c.args)
    check(f"{sms} SMs candidate", "decode_attention", cand.decode_attention, c.args)

"""The serving guard on a value-keyed case's first call, once it checks each class at its corner too.
Usage, from the repository root: TRITON_INTERPRET=1 python results/cpu/hostile_round5/guard/guard_corner.py OP FILE SCENARIO
SCENARIO: pagewrap (a 300065-page pool of 1-token pages, the call's live pages moved below id 200000) or
longctx (one sequence of 100 tokens in a table of 41024 tokens, 16-token pages). The kernel FILE is installed by
force in a private serving folder and called once through serving.get(OP) with a synchronous guard."""
import sys, tempfile, time
import torch
from kernel_agent.harness.serving import serving
from kernel_agent.harness.serving.serving_install import install
from kernel_agent.harness.serving.serving_guard import GuardConfig
from kernel_agent.sanitizer.canonical import judge_text
from kernel_agent.ops import get_op
from kernel_agent.ops.paged import DecodeShape

op_name, path, scenario = sys.argv[1:4]
op = get_op(op_name)
if scenario == "pagewrap":
    a = op.make_case(DecodeShape(2, 2, 1, 16, 1, 64, True, spare_blocks=300000), torch.float32, seed=1).args
    bt = a["block_table"]
    live = (bt >= 0) & (bt < a["k_cache"].shape[0] - 1)
    idx = bt[live].long()
    call = dict(a, block_table=torch.where(live, bt % 200000, bt))
    for n in ("k_cache", "v_cache", "k_scale", "v_scale"):
        if n in a:
            t = a[n].clone()
            t[idx % 200000] = a[n][idx]
            call[n] = t
else:
    call = op.make_case(DecodeShape(1, 1, 1, 128, 16, 41024), torch.float32, seed=1).args
    call["seq_lens"][0] = 100
d = tempfile.mkdtemp(prefix="serving_")
install(op_name, op.bucket(op.shape_of(call)), "float32", "cpu", judge_text(open(path).read()), None, 2.0, "forced", {}, dir=d)
failures = []
fn = serving.get(op_name, dir=d, guard=True, guard_config=GuardConfig(asynchronous=False, time_limit_s=900), sink=failures.append)
t = time.time()
out = fn(**call)
print(f"{op_name} {path} {scenario}: first call served the trusted output: {torch.equal(out, serving.baseline(op_name)(**call))}; "
      f"{time.time() - t:.0f} s; field failures: {[(f.kind.value, f.detail[:200]) for f in failures]}")

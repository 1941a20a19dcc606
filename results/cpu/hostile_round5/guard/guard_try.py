"""Serving guard on first use: install a case by force in a private serving dir, call it through serving.get.
usage: guard_try.py OP NAME  (calls defined per case below)"""
import os, sys, tempfile, json, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
d = tempfile.mkdtemp(prefix="serving_")
os.environ["KERNEL_AGENT_SERVING_DIR"] = d
from kernel_agent.harness.serving import serving
from kernel_agent.harness.serving.serving_install import install
from kernel_agent.harness.serving.serving_guard import GuardConfig
from kernel_agent.sanitizer.canonical import judge_text
from kernel_agent.ops import get_op
from kernel_agent.ops.paged import DecodeShape

op_name, name = sys.argv[1], sys.argv[2]
op = get_op(op_name)
failures = []
text = open(f"results/cpu/hostile_round5/cases/{op_name}/{name}.py").read()

def calls():
    if (op_name, name) == ("decode_attention", "page_id_wrap"):
        # one pool shape (300064 blocks of 1 token); first call's pages all below 2^18, second's above
        a = op.make_case(DecodeShape(2, 2, 1, 16, 1, 64, True, spare_blocks=300000), torch.float32, seed=1).args
        lo = dict(a); hi = dict(a)
        bt = a["block_table"].clone(); live = (bt >= 0) & (bt < 300064)
        lo["block_table"] = torch.where(live, bt % 200000, bt)                # same class: shape, strides, dtype
        k, v = a["k_cache"].clone(), a["v_cache"].clone()
        # copy the live tokens' values to the low pages so that both calls are valid caches
        idx = bt[live].long(); k[idx % 200000] = a["k_cache"][idx]; v[idx % 200000] = a["v_cache"][idx]
        lo["k_cache"], lo["v_cache"] = k, v
        return [("first call, page ids < 2^18", lo), ("second call, same class, page ids >= 2^18", hi)]
    if (op_name, name) == ("decode_attention", "mha_40_heads"):
        a = op.make_case(DecodeShape(1, 40, 40, 128, 16, 64), torch.float32).args
        return [("first call, Hkv=40", a), ("second call, Hkv=40", a)]
    raise SystemExit("no calls for this case")

bucket = op.bucket(op.shape_of(calls()[0][1]))
install(op_name, bucket, "float32", "cpu", judge_text(text), None, 2.0, "red-team forced install", {}, dir=d)
disp = serving.get(op_name, dir=d, guard=True, guard_config=GuardConfig(asynchronous=False, time_limit_s=600),
                   sink=lambda f: failures.append(f))
base = serving.baseline(op_name)
for label, args in calls():
    out = disp(**args)
    ref = base(**args)
    cmp = op.compare(out, args)
    print(f"{label}: resolved {disp.resolve(**args)}; served output vs baseline max|diff| "
          f"{(out.double() - ref.double()).abs().max().item():.4g}; op.compare ok={cmp.ok}")
print("field failures:", [str(getattr(f, 'kind', f)) + ': ' + str(getattr(f, 'detail', ''))[:300] for f in failures])
print("guard counts:", getattr(getattr(disp, "guard", None), "counts", None))

"""The domain check alone (full mode, seed 0) on OP:FILE pairs, one verdict a line: what the regions added after this
round reject, and that the baselines and the correct suite pass them. Usage, from the repository root:
TRITON_INTERPRET=1 python results/cpu/hostile_round4/domain_check.py OP:FILE [OP:FILE ...]"""

import sys, time
from kernel_agent.sanitizer import runner
cases = sys.argv[1:]
for spec in cases:
    op, path = spec.split(":")
    t=time.time()
    v = runner.run_isolated(path, op, mode="full", checks=["domain"], seed=0)
    bad=[c for c in v.checks if not c.passed]
    print(f"{'PASS' if v.passed else 'FAIL'} {op} {path} {time.time()-t:.0f}s", (bad[0].name+': '+bad[0].detail[:200]) if bad else '', flush=True)

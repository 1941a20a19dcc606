"""Static gate and the value solver's view of each case (compared_values, joints): no kernel is run."""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..", "..", "..", "..")))
from kernel_agent.sanitizer.static_gate import check_source  # noqa: E402
from kernel_agent.sanitizer.compared import compared_values, compared_joints  # noqa: E402

paths = sys.argv[1:] or sorted(glob.glob(os.path.join(HERE, "..", "cases", "*", "*.py")))
for p in paths:
    op = os.path.basename(os.path.dirname(p))
    src = open(p).read()
    g = check_source(src, op)
    ok = getattr(g, "ok", None)
    print(os.path.relpath(p, os.path.join(HERE, "..")), "gate ok" if ok else f"GATE: {g}")
    print("   compared:", compared_values(src))

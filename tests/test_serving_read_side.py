"""A serving stack that reads the set and dispatches imports torch, Triton and the manifest: not the static gate.

The write side that judges text (`serving_install.install`) and the first load of a promoted kernel (re-gated
as it is imported, `serving.load_kernel_file`) bring the gate in; the package door, `serving.get`, the
dispatcher, `resolve` and a call served by the baseline do not. Each case runs in a fresh interpreter, so
that nothing this test process imported counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kernel_agent.harness.serving import serving_install
from kernel_agent.sanitizer.canonical import judge_text

GATE = "kernel_agent.sanitizer.static_gate"
# what the read side may hold of the sanitizer: the manifest's record of a configuration (config_variant) and
# the text's identity its hash checks read back (canonical)
READ_SIDE_SANITIZER = {
    "kernel_agent.sanitizer",
    "kernel_agent.sanitizer.canonical",
    "kernel_agent.sanitizer.config_variant",
}
PROMOTED_BUCKET = "tsmall-d16"

CHILD = """
import json, sys

def sanitizer():
    return sorted(m for m in sys.modules if m.startswith("kernel_agent.sanitizer"))

import kernel_agent.harness.serving
from kernel_agent.harness.serving import serving
import torch

seen = {"import": sanitizer()}
fn = serving.get("quantize_kv", gpu="cpu", guard=False)
x = torch.randn(4, 2, 64)  # tsmall-d64: nothing promoted there, the baseline serves it
assert fn.resolve(x).impl == "baseline", fn.resolve(x)
fn(x)
seen["baseline call"] = sanitizer()
promoted = torch.randn(4, 2, 16)  # tsmall-d16: the promoted kernel serves it
assert fn.resolve(promoted).impl == "kernel", fn.resolve(promoted)
fn(promoted)
seen["promoted call"] = sanitizer()
print(json.dumps(seen))
"""


def _child(serving_dir: Path) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", KERNEL_AGENT_SERVING_DIR=str(serving_dir))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_read_side_imports_no_static_gate_until_a_promoted_kernel_is_loaded(tmp_path):
    baseline = (
        Path(serving_install.__file__).resolve().parents[2] / "kernels" / "baseline" / "quantize_kv.py"
    ).read_text()
    promoted = judge_text(baseline.replace("return max(1, min(64, 4096 // block_d)), 4", "return 2, 4"))
    serving_install.install(
        "quantize_kv", PROMOTED_BUCKET, "float32", "cpu", promoted, 1, 0.1, "for the test", {}, dir=tmp_path
    )
    seen = _child(tmp_path)
    for stage in ("import", "baseline call"):
        assert GATE not in seen[stage], f"{stage}: {seen[stage]}"
        assert set(seen[stage]) <= READ_SIDE_SANITIZER, f"{stage}: {seen[stage]}"
    assert GATE in seen["promoted call"]  # a promoted kernel is re-gated as it is loaded

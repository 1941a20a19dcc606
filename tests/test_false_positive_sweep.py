"""scripts/false_positive_sweep.py's plumbing: which kernels and seeds it judges, resuming, its table. The
verdicts here are stand-ins; tests/test_false_positives.py runs the real sanitizer."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def sweep():
    spec = importlib.util.spec_from_file_location(
        "false_positive_sweep", os.path.join(ROOT, "scripts", "false_positive_sweep.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernels_and_their_ops(sweep):
    files = sweep.kernel_files(["baselines", "serving", "good"])
    assert files[:5] == [
        f"kernels/baseline/{op}.py"
        for op in ("attention", "decode_attention", "decode_attention_int8", "matmul", "quantize_kv")
    ]
    assert len([f for f in files if f.startswith("tests/candidates/good/")]) >= 16
    served = sorted(
        f"kernels/serving/{n}" for n in os.listdir(os.path.join(ROOT, "kernels", "serving")) if n.endswith(".py")
    )
    assert [f for f in files if f.startswith("kernels/serving/")] == served
    assert sweep.op_of("kernels/serving/decode_attention_int8__c8k-g4-d128__bfloat16__nvidia-h200.py") == (
        "decode_attention_int8"
    )
    assert sweep.op_of("tests/candidates/good/matmul/bk32_group4.py") == "matmul"
    with pytest.raises(ValueError, match="no such kernel file or group"):
        sweep.kernel_files(["nonexistent.py"])


def test_seeds_are_spread_and_stable(sweep):
    seeds = [sweep.sweep_seed(i) for i in range(50)]
    assert len(set(seeds)) == 50 and all(0 <= s < 2**40 for s in seeds)
    assert max(seeds) > 2**38 and seeds == [sweep.sweep_seed(i) for i in range(50)]


def test_resumes_without_judging_twice_and_judges_a_timeout_again(sweep, tmp_path, monkeypatch, capsys):
    judged, calls = [], []

    def fake_judge(kernel, seed, mode, checks, commit, timeout_s=None):
        judged.append((kernel, seed))
        calls.append(kernel)
        late = kernel.endswith("matmul.py") and len(calls) <= 4  # the first run's matmul verdicts time out
        bad = kernel.endswith("quantize_kv.py") and seed == sweep.sweep_seed(0)
        return {
            "kernel": kernel,
            "op": sweep.op_of(kernel),
            "seed": seed,
            "mode": mode,
            "checks": "",
            "verdict": "timeout" if late else "fail" if bad else "pass",
            "failed_check": "differential" if bad else "",
            "detail": "",
            "seconds": 1.0,
            "commit": commit,
        }

    monkeypatch.setattr(sweep, "judge", fake_judge)
    out = tmp_path / "sweep.jsonl"
    args = ["kernels/baseline/matmul.py", "kernels/baseline/quantize_kv.py", "--seeds", "2", "--out", str(out)]
    assert sweep.main(args) == 0
    assert judged == [
        ("kernels/baseline/matmul.py", sweep.sweep_seed(0)),
        ("kernels/baseline/quantize_kv.py", sweep.sweep_seed(0)),
        ("kernels/baseline/matmul.py", sweep.sweep_seed(1)),
        ("kernels/baseline/quantize_kv.py", sweep.sweep_seed(1)),
    ]  # seed-major
    assert len(out.read_text().splitlines()) == 4
    judged.clear()
    assert sweep.main(args) == 0
    assert [k for k, _ in judged] == ["kernels/baseline/matmul.py"] * 2  # only the timed-out ones again
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    table = sweep.summary(rows)
    assert "2 kernels, 4 verdicts, 1 failed (25.00% false positives); 2 more ran out of time" in table
    assert sweep.main(args) == 0 and len(calls) == 6  # nothing left to judge
    assert "differential x1" in table
    capsys.readouterr()
    assert sweep.main(["--summary", "--out", str(out)]) == 0
    assert table in capsys.readouterr().out


def test_a_kernel_outside_the_known_places_is_a_usage_error(sweep, tmp_path, capsys):
    stray = tmp_path / "kernel.py"
    stray.write_text("")
    assert sweep.main([str(stray), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "cannot tell its op" in capsys.readouterr().err

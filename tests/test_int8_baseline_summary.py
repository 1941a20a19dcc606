"""scripts/int8_baseline_summary.py, the last step of scripts/gpu_int8_baseline.sh: the GPU verdict and the
benchmark of the per-code kernel against the int8 baseline read back as a table and a JSON summary. The bench
document is a committed H200 one (results/h200/bench_int8_planes.json: the byte-plane kernel as the candidate
there, so the ratio read here is that kernel's against the per-code baseline of the time, inverted)."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "results", "h200", "bench_int8_planes.json")


def _summary():
    spec = importlib.util.spec_from_file_location(
        "int8_baseline_summary", os.path.join(ROOT, "scripts", "int8_baseline_summary.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _verdict(tmp_path, passed: bool):
    checks = [{"name": "differential", "status": "passed", "detail": ""}]
    checks.append({"name": "gpu_differential", "status": "passed" if passed else "failed", "detail": "NaN at 3"})
    doc = {
        "op": "decode_attention_int8",
        "mode": "full+gpu",
        "passed": passed,
        "files": [{"passed": passed, "checks": checks}],
    }
    path = tmp_path / "sanitize.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_table_and_summary_hold_the_measured_ratios(tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert _summary().main(["--sanitize", _verdict(tmp_path, True), "--bench", BENCH, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["sanitize"]["passed"] and doc["sanitize"]["gpu_checks"] == ["gpu_differential"]
    [mha, gqa] = doc["bench"]
    # the committed document: the byte planes (its candidate) 0.8005 ms against the per-code 0.9163 ms at MHA
    assert mha["shape"] == "B=32,Hq=32,Hkv=32,D=128,block_size=16,ctx=8192" and mha["anchor"] == "anchor:sdpa-decode"
    assert abs(mha["baseline_speedup_over_per_code"] - mha["per_code_ms"] / mha["baseline_ms"]) < 1e-12
    assert abs(mha["baseline_ms"] - 0.91626) < 1e-4 and abs(mha["per_code_ms"] - 0.80048) < 1e-4
    assert gqa["bucket"] == "c8k-g4-d128"
    printed = capsys.readouterr().out
    assert printed.startswith("sanitize --gpu on, the int8 baseline: PASS") and "| B=32,Hq=32,Hkv=8," in printed


def test_a_failed_verdict_is_shown_as_failed_and_exits_non_zero(tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert _summary().main(["--sanitize", _verdict(tmp_path, False), "--bench", BENCH, "--out", str(out)]) == 1
    assert "FAIL" in capsys.readouterr().out and "gpu_differential: NaN at 3" in out.read_text()


def test_a_missing_document_is_one_line_and_exit_2(tmp_path, capsys):
    missing = str(tmp_path / "none.json")
    assert _summary().main(["--sanitize", missing, "--bench", BENCH, "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("int8_baseline_summary: sanitize document") and "\n" not in err

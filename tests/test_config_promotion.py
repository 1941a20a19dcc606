"""A promoted launch configuration is stored as what it is: the kernel it tunes plus the configuration.

The serving set rebuilds it with the search's own function (sanitizer/config_variant.py), checks it against
the hash that was judged, and refuses it when the base or the configuration changed; reports show it as
the configuration in a line. Kernels run on the CPU through Triton's interpreter.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernel_agent.agent import publish  # noqa: E402
from kernel_agent.agent.cli.gate import serving_gate_item  # noqa: E402
from kernel_agent.agent.cli.pr import RunBranch, _serving_file_holds  # noqa: E402
from kernel_agent.agent.cli.promotion_sections import PromotedKernel, diff_section  # noqa: E402
from kernel_agent.agent.search import baseline_config  # noqa: E402
from kernel_agent.harness.serving import serving, serving_install  # noqa: E402
from kernel_agent.ops import get_op  # noqa: E402
from kernel_agent.sanitizer.canonical import as_written, judge_text  # noqa: E402
from kernel_agent.sanitizer.config_variant import baseline_source, split_config, with_config  # noqa: E402

OP, BUCKET, DTYPE, GPU = "quantize_kv", "tsmall-d16", "float32", "NVIDIA H200"
SHAPE = "4,2,16"  # T=4, H=2, D=16: bucket tsmall-d16
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
SPACE = get_op(OP).tuning_space
BASELINE = baseline_source(OP)
FROM = baseline_config(OP, get_op(OP).parse_shape(SHAPE))
TO = (2, 1) if FROM != (2, 1) else (4, 2)
CONFIG = with_config(BASELINE, FROM, TO, BUCKET, SPACE)
# a code change: the baseline with another rows-per-program rule (a file of its own when promoted)
CODE_CHANGE = BASELINE.replace("return max(1, min(64, 4096 // block_d)), 4", "return 2, 4  # two rows per program")
# what the set stores of a text: its canonical form (sanitizer/canonical.py), comments and docstrings dropped
CODE_CHANGE_TEXT = judge_text(CODE_CHANGE).text
assert CODE_CHANGE != BASELINE


def _install(d, source, candidate_id=7):
    return serving_install.install(
        OP,
        BUCKET,
        DTYPE,
        GPU,
        judge_text(source),
        candidate_id=candidate_id,
        gain=0.1,
        reason="10.0% faster than the incumbent",
        versions={"triton": "3.9"},
        dir=d,
    )


def _case(seed=0):
    op = get_op(OP)
    return op.make_case(op.parse_shape(SHAPE), torch.float32, seed=seed)


def _kernel_files(d):
    return sorted(p.name for p in Path(d).glob("*.py"))


def test_a_configuration_of_the_baseline_is_stored_without_a_copy(tmp_path):
    entry = _install(tmp_path, CONFIG)
    assert _kernel_files(tmp_path) == []
    assert entry.file is None and entry.impl == serving.KERNEL
    assert entry.to_json()["variant"] == {
        "base": "baseline",
        "base_hash": judge_text(BASELINE).hash,
        "configs": [{"bucket": BUCKET, "fields": list(SPACE.fields), "tuned_from": list(FROM), "tuned_to": list(TO)}],
    }
    assert entry.source_hash == as_written(CONFIG).hash
    doc = json.loads((tmp_path / serving.MANIFEST_NAME).read_text())
    assert doc["version"] == serving.MANIFEST_VERSION == 3
    assert serving.entry_source(serving.promoted(OP, BUCKET, DTYPE, GPU, dir=tmp_path), tmp_path).text == CONFIG


def test_the_serving_set_runs_the_rebuilt_configuration_as_the_whole_file(tmp_path):
    _install(tmp_path, CONFIG)
    whole = tmp_path / "whole" / "variant.py"
    whole.parent.mkdir()
    whole.write_text(CONFIG)
    reference = serving.load_kernel_file(whole, OP)
    fn = serving.get(OP, gpu=GPU, dir=tmp_path)
    x = _case().args["x"]
    r = fn.resolve(x)
    assert r.impl == serving.KERNEL and str(r) == serving.kernel_file_name(OP, BUCKET, DTYPE, GPU)
    kernel = fn.kernel_for(x)
    assert kernel is fn.kernel_for(x) and kernel is not serving.baseline(OP)
    assert sys.modules[kernel.__module__]._TUNED_TO == TO  # the configuration, not the baseline, serves
    out, ref = fn(x), reference(x)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert get_op(OP).compare(out, _case().args).ok


def test_a_code_change_is_still_a_file_and_a_configuration_of_it_keeps_that_file(tmp_path):
    code = _install(tmp_path, CODE_CHANGE, candidate_id=1)
    name = serving.kernel_file_name(OP, BUCKET, DTYPE, GPU)
    assert code.file == name and code.variant is None and _kernel_files(tmp_path) == [name]
    assert (tmp_path / name).read_text() == CODE_CHANGE_TEXT
    # the search tunes the promoted file: the variant names it as its base, and no second copy is written
    tuned = with_config(CODE_CHANGE, (2, 4), (4, 4), BUCKET, SPACE)
    entry = _install(tmp_path, tuned, candidate_id=2)
    assert entry.variant is not None and entry.variant.base == name and entry.variant.base_hash == code.source_hash
    assert _kernel_files(tmp_path) == [name]
    # and a configuration stacked on that one: the same base, both configurations
    again = with_config(tuned, (4, 4), (8, 4), BUCKET, SPACE)
    entry = _install(tmp_path, again, candidate_id=3)
    assert entry.variant is not None and entry.variant.base == name and len(entry.variant.configs) == 2
    assert serving.entry_source(entry, tmp_path).text == again and _kernel_files(tmp_path) == [name]
    # a code change replacing it does not write over the base the manifest still names until it is replaced
    other = _install(tmp_path, CODE_CHANGE.replace("return 2, 4", "return 2, 4 + 0"), candidate_id=4)
    assert other.file != name and _kernel_files(tmp_path) == [other.file]


def test_a_configuration_of_a_source_the_set_does_not_hold_is_a_file(tmp_path):
    unknown = with_config(CODE_CHANGE, (2, 4), (4, 4), BUCKET, SPACE)  # its base was never promoted
    entry = _install(tmp_path, unknown)
    assert entry.file and entry.variant is None and _kernel_files(tmp_path) == [entry.file]
    assert split_config(unknown) is not None


def _one_line_error(fn, match):
    with pytest.raises(serving.ServingError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_a_changed_configuration_or_base_is_refused(tmp_path, monkeypatch):
    _install(tmp_path, CONFIG)
    path = tmp_path / serving.MANIFEST_NAME
    good = path.read_text()
    x = _case().args["x"]

    def edited(change):
        doc = json.loads(good)
        change(doc["entries"][0]["variant"])
        path.write_text(json.dumps(doc))
        return serving.promoted(OP, BUCKET, DTYPE, GPU, dir=tmp_path)

    entry = edited(lambda v: v["configs"][0].update(tuned_to=[4, 8]))
    _one_line_error(lambda: serving.entry_source(entry, tmp_path), "does not match its manifest hash")
    _one_line_error(lambda: serving.get(OP, gpu=GPU, dir=tmp_path)(x), "does not match its manifest hash")
    entry = edited(lambda v: v.update(base_hash="0" * 64))
    _one_line_error(lambda: serving.entry_source(entry, tmp_path), "changed since a configuration of it")
    # the baseline edited after the promotion: what would be rebuilt is not what was judged
    path.write_text(good)
    entry = serving.promoted(OP, BUCKET, DTYPE, GPU, dir=tmp_path)
    monkeypatch.setattr(serving, "baseline_source", lambda op: BASELINE.replace("4096", "2048"))
    _one_line_error(lambda: serving.entry_source(entry, tmp_path), "the baseline of quantize_kv changed")
    _one_line_error(lambda: serving.get(OP, gpu=GPU, dir=tmp_path)(x), "changed since")


def test_a_changed_base_file_is_refused(tmp_path):
    _install(tmp_path, CODE_CHANGE, candidate_id=1)
    entry = _install(tmp_path, with_config(CODE_CHANGE, (2, 4), (4, 4), BUCKET, SPACE), candidate_id=2)
    assert entry.variant is not None
    base = tmp_path / entry.variant.base
    edited = base.read_text().replace("return (2, 4)", "return (3, 4)")
    assert edited != base.read_text()
    base.write_text(edited)
    _one_line_error(lambda: serving.entry_source(entry, tmp_path), "changed since a configuration of it")
    item = serving_gate_item(str(tmp_path), entry)
    assert "changed since" in item.error and item.shown.endswith(serving.entry_name(entry))
    base.unlink()
    _one_line_error(lambda: serving.entry_source(entry, tmp_path), "is missing")


def test_the_gate_fails_a_configuration_that_no_longer_rebuilds(tmp_path):
    _install(tmp_path, CONFIG)
    path = tmp_path / serving.MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc["entries"][0]["variant"]["configs"][0]["tuned_to"] = [4, 8]
    path.write_text(json.dumps(doc))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_agent.agent.cli",
            "gate",
            "--serving-dir",
            str(tmp_path),
            "--quick",
            "--no-baselines",
            "--gpu",
            "off",
            "--summary",
            str(tmp_path / "s.md"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (tmp_path / "s.md").read_text()
    assert "does not match its manifest hash" in summary and "Promoted configurations" in summary


def test_reports_show_the_configuration_in_a_line():
    c = SimpleNamespace(id=9, label="cfg-2-1", source=CONFIG)
    pk = PromotedKernel(SimpleNamespace(), c, None, f"kernels/baseline/{OP}.py", BASELINE)
    text = "\n".join(diff_section(pk))
    line = f"_config for bucket {BUCKET}: {FROM!r} -> {TO!r}  [BLOCK_R={TO[0]}, num_warps={TO[1]}]"
    assert f"- `{line}`" in text
    diff = text.split("```diff", 1)[1]
    assert len(diff.splitlines()) < 30  # a few lines of `_config`, not the file
    # a code change has no configuration line
    code = PromotedKernel(SimpleNamespace(), SimpleNamespace(id=3, label="m", source=CODE_CHANGE), None, "b", BASELINE)
    assert "_config for bucket" not in "\n".join(diff_section(code))


def test_show_names_the_configuration_before_the_diff(tmp_path, capsys):
    """`kernel-agent show CANDIDATE` says in a line what a configuration candidate changes, as the report
    does; a code change gets no such line."""
    from kernel_agent.agent.cli import parser as cli
    from kernel_agent.harness.ledger.ledger import Ledger

    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        run = led.start_run({}, {}, "search", [OP], None, {})
        cfg, _ = led.add_candidate(OP, as_written(CONFIG), "search", run.id, label="cfg")
        code, _ = led.add_candidate(OP, as_written(CODE_CHANGE), "search", run.id, label="code")
    capsys.readouterr()
    assert cli.main(["show", str(cfg.id), "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    line = f"_config for bucket {BUCKET}: {FROM!r} -> {TO!r}  [BLOCK_R={TO[0]}, num_warps={TO[1]}]"
    assert line in out and out.index(line) < out.index("diff against")
    assert cli.main(["show", str(code.id), "--ledger", str(path)]) == 0
    assert "_config for bucket" not in capsys.readouterr().out


def test_the_commit_and_the_pull_request_name_the_configuration_not_a_file(tmp_path):
    entry = _install(tmp_path, CONFIG, candidate_id=9)
    d = SimpleNamespace(reason="10.0% faster", gain=0.1, spread=0.01)
    j = SimpleNamespace(
        decision=d, kinds=["event"], incumbent_ms=1.0, candidate_ms=0.9, against="the baseline", shapes=[SHAPE]
    )
    req = publish.PromotionRequest(
        "r1", OP, BUCKET, DTYPE, GPU, 9, "cfg-2-1", judge_text(CONFIG), j, 0.02, {"triton": "3.9"}
    )
    msg = publish.promotion_message(req, None, "kernels/serving/manifest.json", serving.describe_entry(entry))
    assert (
        f"configuration (in kernels/serving/manifest.json): {serving.entry_name(entry)}: "
        f"kernels/baseline/{OP}.py with _config for bucket {BUCKET}" in msg
    )
    assert "\nfile: " not in msg
    # the pull request's reproduce block extracts the judged kernel: the branch holds no file of it
    pk = PromotedKernel(
        SimpleNamespace(demoted_at=None, candidate_id=9), SimpleNamespace(id=9, source=CONFIG), None, "b", BASELINE
    )
    assert not _serving_file_holds(pk, False, RunBranch("branch", "kernel-agent/r1", configs=(9,)))
    assert _serving_file_holds(pk, False, RunBranch("branch", "kernel-agent/r1"))  # a file, as before
    info = publish.TargetInfo.from_json(
        {"mode": "branch", "serving_dir": "s", "source_dir": "s", "why": "", "configs": [9]}
    )
    assert info.configs == (9,)

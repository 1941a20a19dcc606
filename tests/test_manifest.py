"""The serving manifest's records (harness/manifest.py): parsed once where the file is read, written back as
the same text, and refused in one line where they are not records."""

import dataclasses
import json
from pathlib import Path

import pytest

from kernel_agent.harness.manifest import KERNEL, Manifest, ManifestEntry, Variant
from kernel_agent.harness.serving import serving

ROOT = Path(__file__).resolve().parents[1]
HASH = "ab" * 32
KERNEL_ENTRY = {
    "op": "quantize_kv",
    "bucket": "tsmall-d16",
    "dtype": "float32",
    "gpu": "NVIDIA H200",
    "impl": "kernel",
    "file": "quantize_kv__tsmall-d16__float32__nvidia-h200.py",
    "source_hash": HASH,
    "candidate_id": None,
    "promoted_at": "2026-12-01T00:00:00+00:00",
    "gain": 1,
    "reason": "faster",
    "versions": {"torch": "2.11.0"},
    "shapes": ["T=4,H=2,D=16"],
}
VARIANT_ENTRY = {
    **{k: v for k, v in KERNEL_ENTRY.items() if k != "file"},
    "bucket": "tlarge-d128",
    "candidate_id": 3,
    "variant": {
        "base": "baseline",
        "base_hash": HASH,
        "configs": [{"bucket": "tlarge-d128", "fields": ["BLOCK_R"], "tuned_from": [64], "tuned_to": [32]}],
    },
}
CHOICE_ENTRY = {
    "op": "matmul",
    "bucket": "m64-klarge",
    "dtype": "bfloat16",
    "gpu": "NVIDIA H200",
    "impl": "torch",
    "reason": "torch is faster",
    "measured": {"clock": "event", "shapes": [{"shape": "M=64", "ms": [0.1, 0.2]}]},
    "measured_at": "2026-12-01T00:00:00+00:00",
}


def _text(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def test_the_committed_manifest_is_written_back_byte_for_byte():
    path = ROOT / "kernels" / "serving" / "manifest.json"
    manifest = serving.load_manifest(path.parent)
    assert manifest.entries and all(isinstance(e, ManifestEntry) for e in manifest.entries)
    assert serving.manifest_text(manifest) == path.read_text(encoding="utf-8")


def test_every_kind_of_entry_round_trips_with_the_keys_it_was_read_with():
    doc = {"version": 3, "entries": [CHOICE_ENTRY, VARIANT_ENTRY, KERNEL_ENTRY]}  # in the order written
    manifest = Manifest.from_json(json.loads(_text(doc)))
    choice, variant, kernel = manifest.entries
    assert kernel.file == KERNEL_ENTRY["file"] and kernel.candidate_id is None and kernel.shapes == ("T=4,H=2,D=16",)
    assert isinstance(variant.variant, Variant) and variant.variant.configs[0].tuned_to == (32,)
    assert choice.impl == "torch" and not choice.is_kernel and choice.candidate_id is None
    assert serving.manifest_text(manifest) == _text(doc)  # a kernel's null candidate_id stays, a choice has none
    assert manifest.kernels() == [variant, kernel]
    assert manifest.find("quantize_kv", "tsmall-d16", "float32", "nvidia-h200") == kernel  # GPUs by slug
    assert manifest.without("quantize_kv", "tsmall-d16", "float32", "NVIDIA H200") == (choice, variant)


def test_a_version_1_entry_and_keys_this_version_does_not_know_survive():
    old = {k: v for k, v in KERNEL_ENTRY.items() if k not in ("impl", "shapes")}
    e = ManifestEntry.from_json({**old, "reviewed_by": "someone"})
    assert e.impl == KERNEL and e.shapes is None and e.extra == {"reviewed_by": "someone"}
    assert e.to_json() == {**old, "impl": "kernel", "reviewed_by": "someone"}  # no `shapes` invented
    assert Manifest.from_json({"version": 1, "entries": [old]}).to_json()["version"] == 2


def test_an_entry_is_frozen():
    e = ManifestEntry.from_json(KERNEL_ENTRY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.file = "other.py"  # type: ignore[misc]  # the point: mypy and the runtime both refuse it


@pytest.mark.parametrize(
    "entry, message",
    [
        ([], "not an object"),
        ({**CHOICE_ENTRY, "op": None}, "needs op, bucket, dtype and gpu as strings"),
        ({**CHOICE_ENTRY, "impl": "magic"}, "has impl 'magic'"),
        ({k: v for k, v in KERNEL_ENTRY.items() if k != "file"}, "names no kernel file and records no variant"),
        ({**VARIANT_ENTRY, "variant": {"base": "baseline"}}, "its variant needs base, base_hash"),
        ({**VARIANT_ENTRY, "variant": {**VARIANT_ENTRY["variant"], "configs": [{}]}}, "configuration record lacks"),
    ],
)
def test_a_malformed_entry_is_one_line_naming_the_file(tmp_path, entry, message):
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 3, "entries": [entry]}))
    with pytest.raises(serving.ServingError) as err:
        serving.load_manifest(tmp_path)
    assert message in str(err.value) and str(tmp_path / "manifest.json") in str(err.value)
    assert "\n" not in str(err.value)

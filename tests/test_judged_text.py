"""The judged text: one record (`JudgedText`) of a kernel text and its hash, made only by sanitizer/canonical.py,
whose hash is taken in one place; every syntax-tree parse holds the one parse lock there."""

from __future__ import annotations

import dataclasses
import gc
import re
import threading
import time
from pathlib import Path

import pytest

from kernel_agent.sanitizer.canonical import (
    JudgedText,
    TextRefused,
    as_written,
    judge_text,
    judged_or_as_read,
    parse_module,
    read_back,
    read_judged,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "harness", "sanitizer", "kernel_agent", "scripts")
CANONICAL = Path("sanitizer/canonical.py")
SOURCE = '"""A kernel."""\n\n\ndef k(x):  # trailing comment\n    return x + 1\n'


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel != CANONICAL:
                yield rel, path.read_text(encoding="utf-8")


def test_a_judged_text_is_made_only_by_the_canonicalizer():
    with pytest.raises(TypeError, match="sanitizer/canonical.py"):
        JudgedText("x = 1\n", "0" * 64, True)
    made = [str(rel) for rel, text in _modules() if re.search(r"\bJudgedText\(", text)]
    assert made == []


def test_one_construction_site_for_the_hash():
    """sha256 is taken in sanitizer/canonical.py only, but for what is no kernel text: a storage's bytes (the
    wire's storage key), a workload trace file, compiled PTX names."""
    others = {Path("sanitizer/wire.py"), Path("harness/workload/kv_plan.py"), Path("scripts/same_ptx.py")}
    hashing = {rel for rel, text in _modules() if re.search(r"\bsha256\(|hashlib\.new\(|\bmd5\(|\bblake2", text)}
    assert hashing <= others, f"a kernel text hashed outside sanitizer/canonical.py: {sorted(hashing - others)}"
    assert len(re.findall(r"hashlib\.sha256\(", (ROOT / CANONICAL).read_text(encoding="utf-8"))) == 1
    for name in ("source_hash(", "hash_source(", "judged_hash(", "file_hash("):
        assert not [str(rel) for rel, text in _modules() if f"def {name}" in text or f" {name}" in text], name


def test_every_parse_holds_the_one_lock():
    """`ast.parse` is called in sanitizer/canonical.py only (parse_module, parse_expression hold the lock)."""
    parsing = [str(rel) for rel, text in _modules() if re.search(r"\bast\.parse\(", text)]
    assert parsing == []


def test_the_record_is_frozen_canonical_and_a_fixed_point():
    judged = judge_text(SOURCE)
    assert judged.canonical and judged.text == "def k(x):\n    return x + 1\n"
    assert judge_text(judged.text) == judged and judge_text(judged.text.encode()) == judged
    assert judged.hash == as_written(judged.text).hash  # a canonical text hashes as it reads
    assert judged.hash != as_written(SOURCE).hash and not as_written(SOURCE).canonical
    with pytest.raises(dataclasses.FrozenInstanceError):
        judged.hash = "0" * 64  # type: ignore[misc]
    assert re.fullmatch(r"[0-9a-f]{64}", judged.hash)


def test_whitespace_habits_do_not_change_the_hash_and_code_does():
    assert as_written("a = 1  \r\nb = 2\n\n\n").hash == as_written("a = 1\nb = 2").hash
    assert as_written("a = 1\n").hash != as_written("a = 2\n").hash
    assert as_written("  a = 1\n").hash != as_written("a = 1\n").hash


def test_bytes_without_a_canonical_text_are_kept_as_they_read():
    raw = b"# coding: latin-1\nx = 1\n"
    with pytest.raises(TextRefused):
        judge_text(raw)
    judged = judged_or_as_read(raw)
    assert not judged.canonical and judged.text == raw.decode() and judged.hash == as_written(raw.decode()).hash


def test_a_text_read_back_is_held_to_its_recorded_hash(tmp_path):
    judged = judge_text(SOURCE)
    back = read_back(judged.text, judged.hash)
    assert back == judged and back is not None and back.canonical
    assert read_back(judged.text + "# edited\n", judged.hash) is None
    assert read_back(SOURCE, as_written(SOURCE).hash) == as_written(SOURCE)  # recorded as written: kept so
    path = tmp_path / "k.py"
    path.write_text(SOURCE, encoding="utf-8")
    assert read_judged(str(path)) == judged


def test_parses_in_threads_at_once_all_succeed():
    """Threads parse at once while collections hand the interpreter to another thread mid-parse (the way a
    finalizer can): with a bare `ast.parse` in its place, Python 3.11 fails this test with SystemError "AST
    constructor recursion depth mismatch"; parse_module holds the lock, and every parse succeeds."""
    text = "\n".join(f"def f{i}(x):\n    return " + " + ".join(["(x * 2)"] * 30) for i in range(40)) + "\n"
    errors = []
    switch = lambda phase, info: time.sleep(0)  # noqa: E731
    threshold = gc.get_threshold()
    gc.callbacks.append(switch)
    gc.set_threshold(50, 2, 2)

    def parse_many():
        try:
            for _ in range(20):
                assert len(parse_module(text).body) == 40
        except Exception as e:  # noqa: BLE001  # any failure of a parse is the finding
            errors.append(e)

    threads = [threading.Thread(target=parse_many) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*threshold)
    assert errors == []

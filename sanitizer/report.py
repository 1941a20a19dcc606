"""Verdicts as documents: one per file from its CPU and GPU runs, the JSON document, JUnit XML.

The terminal table is the command line's (agent/cli.py)."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import List, Sequence, Tuple

from .verdict import CheckStatus, Verdict


def merge_gpu(cpu: Verdict, gpu: Verdict) -> Verdict:
    """One verdict per file: the CPU checks, then the GPU checks (static gate and load once)."""
    merged = Verdict(
        cpu.file,
        cpu.op,
        f"{cpu.mode}+gpu",
        list(cpu.checks),
        cpu.fpsan_equivalent,
        cpu.fpsan_detail,
        cpu.duration_s + gpu.duration_s,
        cpu.error or gpu.error,
        cpu.seed,
        cpu.source_hash if cpu.source_hash == gpu.source_hash else "",  # ('': two texts were judged)
        cpu.kind if cpu.error else gpu.kind,  # (the kind of the error it keeps)
    )
    seen = {c.name for c in cpu.checks}
    merged.checks += [c for c in gpu.checks if c.name not in seen]
    return merged


def verdicts_json(verdicts: List[Verdict], op: str, mode: str) -> dict:
    return {"op": op, "mode": mode, "passed": all(v.passed for v in verdicts), "files": [v.to_json() for v in verdicts]}


def write_junit(verdicts: List[Verdict], path: str, failed_cases: Sequence[Tuple[str, str, str]] = ()) -> None:
    """Each verdict a test suite of its checks; `failed_cases` (classname, name, message), failures that are
    no verdict's (the gate's unresolved field failures), one more suite of their own."""
    root = ET.Element("testsuites", name="kernel-agent sanitize")
    for v in verdicts:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"{v.op}: {os.path.relpath(v.file)}",
            tests=str(len(v.checks)),
            failures=str(sum(c.status == CheckStatus.FAILED for c in v.checks)),
            skipped=str(sum(c.status == CheckStatus.SKIPPED for c in v.checks)),
            time=f"{v.duration_s:.3f}",
        )
        if v.seed is not None:  # the inputs' seed base: `kernel-agent sanitize --seed N` reproduces a failure
            ET.SubElement(ET.SubElement(suite, "properties"), "property", name="seed", value=str(v.seed))
        again = f" (reproduce: kernel-agent sanitize --op {v.op} --seed {v.seed} FILE)" if v.seed is not None else ""
        for c in v.checks:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{v.op}.{os.path.basename(v.file)}",
                name=c.name,
                time=f"{c.duration_s:.3f}",
            )
            if c.status == CheckStatus.FAILED:
                ET.SubElement(case, "failure", message=c.detail[:500]).text = c.detail + again
            elif c.status == CheckStatus.SKIPPED:
                ET.SubElement(case, "skipped", message=c.detail[:500])
    if failed_cases:
        suite = ET.SubElement(
            root, "testsuite", name="field failures", tests=str(len(failed_cases)), failures=str(len(failed_cases))
        )
        for classname, name, message in failed_cases:
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            ET.SubElement(case, "failure", message=message[:500]).text = message
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

"""The int8 baseline on a GPU: the sanitizer's GPU verdict and the benchmark against the per-code kernel it
replaced, as one short table and one JSON summary (scripts/gpu_int8_baseline.sh runs it last).

    python scripts/int8_baseline_summary.py --sanitize S.json --bench B.json [--bench B2.json] --out SUMMARY.json

S.json: `kernel-agent sanitize --gpu on --json` of kernels/baseline/decode_attention_int8.py. B.json:
`kernel-agent bench --op decode_attention_int8 PER_CODE.py --out B.json`: the baseline, the per-code kernel
(the candidate) and the torch anchor timed side by side at each shape; several documents are read in order.
A missing or unreadable document is a one-line error and exit status 2; a step that failed is shown as
failed, never as a figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional


class SummaryError(Exception):
    """A document the summary cannot read: one line for the user."""


def read_json(path: str, what: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SummaryError(f"{what} {path}: {e}")
    if not isinstance(doc, dict):
        raise SummaryError(f"{what} {path}: not a JSON object")
    return doc


def sanitize_summary(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The baseline's verdict: passed, the checks that ran (GPU ones among them) and the first failure."""
    files = doc.get("files") or []
    if len(files) != 1:
        raise SummaryError(f"sanitize document: expected one file's verdict, found {len(files)}")
    v = files[0]
    checks = v.get("checks") or []
    failed = [c for c in checks if c.get("status") == "failed"]
    return {
        "file": v.get("file"),
        "passed": bool(v.get("passed")),
        "error": v.get("error"),
        "duration_s": v.get("duration_s"),
        "checks": len(checks),
        "gpu_checks": [c["name"] for c in checks if str(c.get("name", "")).startswith("gpu_")],
        "first_failure": (f"{failed[0]['name']}: {failed[0].get('detail', '')}"[:300] if failed else None),
    }


def _by_label(measurements: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    return {str(m.get("label", "")): m for m in measurements}


def _ms(m: Optional[Dict[str, Any]]) -> Optional[float]:
    """A contender's time, or None when it did not give one (an error, no measurement)."""
    if m is None or m.get("error") or m.get("median_ms") is None:
        return None
    return float(m["median_ms"])


def bench_rows(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per shape: the baseline, the per-code kernel (the candidate) and the anchor, with the ratios."""
    rows = []
    for r in doc.get("results") or []:
        by = _by_label(r.get("measurements") or [])
        base = by.get("baseline")
        per_code = next((m for label, m in by.items() if label.startswith("candidate:")), None)
        anchor_label, anchor = next(((k, m) for k, m in by.items() if k.startswith("anchor:")), ("", None))
        b, p, a = _ms(base), _ms(per_code), _ms(anchor)
        rows.append(
            {
                "shape": r.get("shape"),
                "bucket": r.get("bucket"),
                "gpu": r.get("gpu"),
                "baseline_ms": b,
                "per_code_ms": p,
                "anchor": anchor_label,
                "anchor_ms": a,
                "baseline_speedup_over_per_code": (p / b) if b and p else None,
                "baseline_vs_anchor": (a / b) if b and a else None,
                "baseline_tbps": base.get("tbps") if base and b else None,
            }
        )
    if not rows:
        errors = doc.get("errors") or []
        raise SummaryError(f"bench document: no results{': ' + str(errors[0])[:200] if errors else ''}")
    return rows


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(verdict: Dict[str, Any], rows: List[Dict[str, Any]]) -> str:
    head = "PASS" if verdict["passed"] else "FAIL"
    lines = [
        f"sanitize --gpu on, the int8 baseline: {head}, {verdict['checks']} checks "
        f"({len(verdict['gpu_checks'])} on the GPU: {', '.join(verdict['gpu_checks']) or 'none'})"
        + (f"; first failure {verdict['first_failure']}" if verdict["first_failure"] else "")
        + (f"; error {verdict['error']}" if verdict["error"] else ""),
        "",
        "| shape | baseline ms | per-code ms | baseline speedup | anchor ms | baseline vs anchor | baseline TB/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {_fmt(r['baseline_ms'], '.4f')} | {_fmt(r['per_code_ms'], '.4f')} | "
            f"{_fmt(r['baseline_speedup_over_per_code'], '.3f')}x | {_fmt(r['anchor_ms'], '.4f')} | "
            f"{_fmt(r['baseline_vs_anchor'], '.3f')}x | {_fmt(r['baseline_tbps'], '.2f')} |"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sanitize", required=True, help="sanitize --gpu on --json output")
    p.add_argument(
        "--bench", required=True, action="append", help="bench --out document (per-code kernel against the baseline)"
    )
    p.add_argument("--out", required=True, help="where to write the JSON summary")
    args = p.parse_args(argv)
    try:
        verdict = sanitize_summary(read_json(args.sanitize, "sanitize document"))
        rows = [row for path in args.bench for row in bench_rows(read_json(path, "bench document"))]
    except SummaryError as e:
        print(f"int8_baseline_summary: {e}", file=sys.stderr)
        return 2
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"sanitize": verdict, "bench": rows}, f, indent=2)
        f.write("\n")
    print(table(verdict, rows))
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

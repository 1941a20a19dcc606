"""`kernel-agent history`: runs, filters, per-op leaderboards, the speedup trend, the serving set's history and
field failures."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

from ...harness.bench.figures import (
    CLOCK_WORDS,
    Leaderboard,
    TrendPoint,
    fmt_ms,
    fmt_x,
)
from ...harness.ledger.ledger import CandidateStatus
from .. import ui
from .common import (
    UsageError,
    check_op,
    command,
    open_ledger,
)
from .promotion_sections import short_label
from .views import (
    field_failure_doc,
    field_failure_line,
    history_data,
    serving_doc,
)


def register(sub) -> None:
    h = sub.add_parser("history", help="runs, filters, per-op leaderboards, speedup trend")
    h.add_argument("--op")
    h.add_argument("--status", choices=["running", "finished", "interrupted", "failed"])
    h.add_argument("--since", help="date, e.g. 2026-11-01")
    h.add_argument("--until")
    h.add_argument("--proposer")
    h.add_argument("--gpu", help="runs on this GPU (its name as recorded, e.g. 'NVIDIA H200')")
    h.add_argument("--limit", type=int, default=20)
    h.add_argument("--leaderboard", action="store_true", help="per-op leaderboard (needs --op)")
    h.add_argument("--trend", action="store_true", help="best speedup per run over time (needs --op)")
    h.add_argument(
        "--serving",
        action="store_true",
        help="what serves each op and bucket by the ledger, and every promotion and demotion",
    )
    h.add_argument(
        "--field-failures",
        action="store_true",
        help="what the serving guard found on real inputs: each field failure, unresolved or resolved (--op narrows)",
    )
    h.add_argument("--ledger", default=None)
    h.add_argument("--json", action="store_true")


# -- history and show --------------------------------------------------------------------------


@command("history")
def cmd_history(args) -> int:
    if args.op:
        check_op(args.op)
    return history(args, open_ledger(args, read=True))


# -- history -----------------------------------------------------------------------------------


def history(args, led) -> int:
    if (args.leaderboard or args.trend) and not args.op:
        raise UsageError("--leaderboard and --trend need --op")
    if getattr(args, "serving", False):
        return _print_serving(serving_doc(led), args.json)
    if getattr(args, "field_failures", False):
        return _print_field_failures(led.field_failures(op=args.op), args.json)
    h = history_data(
        led,
        op=args.op,
        status=args.status,
        since=args.since,
        until=args.until,
        proposer=args.proposer,
        gpu=getattr(args, "gpu", None),
        limit=args.limit,
        leaderboard=args.leaderboard,
        trend=args.trend,
    )
    doc = h.to_json()
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    _print_runs(h.rows)
    if args.leaderboard and h.board is not None:  # history_data made it
        _print_leaderboard(args.op, h.board)
    if args.trend and h.trend is not None:  # history_data made it
        _print_trend(args.op, h.trend)
    return 0


def _print_runs(runs: List[Dict[str, Any]]) -> None:
    """`history`'s table of runs, one row each (history_data's rows)."""
    # the counts before the text columns: at 80 columns a text column is cut or left out, never a count
    ui.table(
        f"runs ({len(runs)}); judged: by the run itself, of which rej(ected), ver(ified), bench(marked); "
        f"replay: judged by earlier runs",
        [
            "run",
            "status",
            "judged",
            "rej",
            "ver",
            "bench",
            "promoted",
            "replay",
            "proposer",
            "started (UTC)",
            "ops",
            "gpu",
        ],
        [
            [
                r["id"],
                r["status"],
                r["judged_now"],
                r["judged_now_by_status"].get(CandidateStatus.REJECTED, 0),
                r["judged_now_by_status"].get(CandidateStatus.VERIFIED, 0),
                r["judged_now_by_status"].get(CandidateStatus.BENCHMARKED, 0),
                r["promotions"],
                r["replayed"],
                r["proposer"],
                r["started"][:16].replace("T", " "),
                r["ops"],
                r["gpu"] or "-",
            ]
            for r in runs
        ],
        justify=["left"] * 2 + ["right"] * 6 + ["left"] * 4,
    )


def _print_leaderboard(op: str, board: Leaderboard) -> None:
    """`history --leaderboard`: the candidates of `op` faster than the incumbent timed beside them."""
    rows = [
        [
            e.figure.bucket,
            e.figure.shape_key,
            f"#{e.figure.candidate_id} {e.label or ''}".strip(),
            fmt_ms(e.figure.kernel_ms),
            short_label(e.figure.incumbent_label),
            fmt_ms(e.figure.incumbent_ms),
            fmt_x(e.figure.speedup),
            CLOCK_WORDS[e.figure.clock],
            fmt_ms(e.figure.anchor_ms),
            e.figure.dtype,
            e.figure.gpu_name,
        ]
        for e in board.entries
    ]
    ui.table(
        f"leaderboard: {op} (candidates faster than the incumbent timed beside them)",
        ["bucket", "shape", "candidate", "ms", "over", "its ms", "speedup", "clock", "anchor ms", "dtype", "gpu"],
        rows,
    )
    if board.unbeaten:
        ui.line(f"no candidate beat its incumbent at: {'; '.join(board.unbeaten)}")


def _print_trend(op: str, trend: List[TrendPoint]) -> None:
    """`history --trend`: each run's best candidate of `op`, as the geometric mean of its bucket's speedups."""
    ui.table(
        f"speedup trend: {op} (each run's best candidate, geometric mean over its bucket's shapes)",
        ["run", "started", "candidate", "bucket", "speedup", "over", "clock"],
        [
            [
                t.run_id,
                t.started_at.isoformat()[:16].replace("T", " "),
                f"#{t.best.candidate_id}",
                t.best.bucket,
                fmt_x(t.speedup),
                short_label(t.best.incumbent_label),
                t.best.clocks.replace("event", "events"),
            ]
            for t in trend
        ],
    )


def _print_serving(doc: Dict[str, Any], as_json: bool) -> int:
    """`history --serving`: what serves each bucket by the ledger's record, and the promotions and demotions."""
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    ui.table(
        "serving set (by the ledger: promotions, and torch against the Triton side where both were timed)",
        ["op", "bucket", "dtype", "gpu", "serves", "promoted", "over baseline", "torch/it", "promoted in"],
        [
            [
                b["op"],
                b["bucket"],
                b["dtype"],
                b["gpu"] or "-",
                b["serves"],
                f"#{b['candidate_id']}" if b["candidate_id"] is not None else "",
                fmt_x(b["over_baseline"]),
                f"{b['vs_torch']:.3f}" if b["vs_torch"] else "",
                b["run_id"] or "",
            ]
            for b in doc["buckets"]
        ],
    )
    for p in doc["promotions"]:
        ui.line(
            f"{p['created_at'][:16].replace('T', ' ')} #{p['candidate_id']} {p['op']} {p['bucket']} {p['dtype']}: "
            f"{p['reason']}"
            + (f"; demoted {p['demoted_at'][:16].replace('T', ' ')}: {p['demote_reason']}" if p["demoted_at"] else "")
        )
    return 0


def _print_field_failures(rows: list, as_json: bool) -> int:
    """`history --field-failures`: the unresolved first (what `gate` fails on), then the resolved, one line each."""
    if as_json:
        sys.stdout.write(json.dumps([field_failure_doc(r) for r in rows], indent=2) + "\n")
        return 0
    if not rows:
        ui.line("no field failures in this ledger")
        return 0
    open_ones = [r for r in rows if not r.resolved]
    ui.line(f"field failures: {len(open_ones)} unresolved, {len(rows) - len(open_ones)} resolved", style="bold")
    for r in open_ones:
        ui.line(f"  UNRESOLVED {field_failure_line(r)}", style="red")
    for r in rows:
        if r.resolved:
            ui.line(f"  resolved {field_failure_line(r)}")
    return 0

"""`kernel-agent promote`: a candidate file into the serving set by the promotion rule (GPU)."""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Dict, Optional

from ... import agent  # the door to the modules that import torch: each is read when first used
from ...harness import env
from ...harness.bench.bench_records import CANDIDATE, INCUMBENT, BenchKernel, BenchOutcome, BenchSpec
from ...harness.bench.promotion import judge_benchmark
from ...harness.ledger.ledger import CandidateStatus, RunNotesRecord, RunStatus
from ...harness.manifest import ManifestEntry
from ...ops import get_op
from ...sanitizer.canonical import JudgedText, judged_or_as_read
from ...sanitizer.report import merge_gpu
from ...sanitizer.verdict import SanitizerMode
from .. import ui
from ..placement import ChildEvaluator, Devices, Evaluator, LocalDevices
from .common import (
    UsageError,
    check_files,
    check_op,
    command,
    open_ledger,
)


def register(sub) -> None:
    p = sub.add_parser("promote", help="promote a candidate file into the serving set by the rule (GPU)")
    p.add_argument("--op", required=True)
    p.add_argument("file")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shapes", default="serving")
    p.add_argument("--reason", default="", help="why (recorded with the promotion)")
    p.add_argument("--margin", type=float, default=0.02)
    p.add_argument("--ledger", default=None)
    p.add_argument(
        "--in-place",
        action="store_true",
        help="write the serving folder as it is (default, where git tracks it: a commit on a branch "
        "kernel-agent/<run>, the checkout untouched)",
    )


# -- promote / demote --------------------------------------------------------------------------


@command("promote")
def cmd_promote(args, evaluator: Optional[Evaluator] = None, devices: Optional[Devices] = None) -> int:
    """Sanitize (full, GPU checks included), benchmark against the incumbent, apply the rule, and promote
    through the same path as the loop (agent/publish.py): a commit on a branch of its own, or in place.
    The collaborators left out are this machine's, as for a run: `evaluator` runs the sanitizer and
    benchmark children (sandboxed children), `devices` says whether there is a GPU and its name."""
    evaluator, devices = evaluator or ChildEvaluator(), devices or LocalDevices()
    check_op(args.op)
    check_files([args.file])
    if not devices.available():  # (on a machine without an NVIDIA driver, known before torch is imported)
        raise UsageError(
            "promote benchmarks the kernel against the incumbent on a CUDA GPU, and none is available here: "
            f"run `kernel-agent promote --op {args.op} {shlex.quote(args.file)}` on a GPU machine"
        )
    from ...harness.bench.bench import resolve_shapes  # here: torch, after the flags and the GPU

    op = get_op(args.op)
    plan = agent.plan_target(in_place=args.in_place)  # git missing is an error before anything is recorded
    led = open_ledger(args)
    judged = _promoted_text(args.file)
    # a promotion by hand is a run of its own (proposer 'manual'), so `report` and `history` show it
    run = led.start_run(
        {
            "command": "promote",
            "file": os.path.abspath(args.file),
            "dtype": args.dtype,
            "shapes": args.shapes,
            "reason": args.reason,
            "in_place": args.in_place,
        },
        env.versions(),
        "manual",
        [args.op],
        devices.name(),
        {},
    )
    cand, _ = led.add_candidate(
        args.op, judged, "manual", run.id, path=os.path.abspath(args.file), label=os.path.basename(args.file)
    )
    if not _sanitize_promoted(args, led, evaluator, run.id, cand.id):
        return 1
    by_bucket: Dict[str, list] = {}
    for s in resolve_shapes(op, args.shapes):
        by_bucket.setdefault(op.bucket(s), []).append(s)
    # available() said there is a GPU, which has a name; "cpu" as `demote` says where none is known
    gname = devices.name() or "cpu"
    return 0 if _promote_buckets(args, led, evaluator, run.id, cand.id, judged, plan, gname, by_bucket) else 1


def _promoted_text(path: str) -> JudgedText:
    """The text a promotion by hand records, judges and installs: the file's canonical text
    (sanitizer/canonical.py), else its bytes as they are, which the sanitizer refuses with the reason."""
    with open(path, "rb") as f:
        return judged_or_as_read(f.read())


def _sanitize_promoted(args, led, evaluator: Evaluator, run_id: str, cid: int) -> bool:
    """The full sanitizer and the GPU checks on the file, recorded; False (and the run finished) if rejected."""
    ui.line(f"candidate #{cid}: sanitizing (full + GPU checks)...")
    cpu = evaluator.sanitize(args.file, args.op, SanitizerMode.FULL)
    v = merge_gpu(cpu, evaluator.sanitize(args.file, args.op, SanitizerMode.GPU))
    led.record_checks(cid, SanitizerMode.FULL, [dataclasses.asdict(c) for c in v.checks])
    if not v.passed:
        led.set_candidate_status(cid, CandidateStatus.REJECTED, verdict=v.to_json())
        led.set_run_status(run_id, RunStatus.FINISHED, finished=True)
        ui.line(f"not promoted: the sanitizer rejected it: {v.summary()}", style="red")
        return False
    led.set_candidate_status(cid, CandidateStatus.VERIFIED, verdict=v.to_json(), fpsan_equivalent=v.fpsan_equivalent)
    return True


def _promote_buckets(
    args,
    led,
    evaluator: Evaluator,
    run_id: str,
    cid: int,
    judged: JudgedText,
    plan,
    gname: str,
    by_bucket: Dict[str, list],
) -> bool:
    """Each bucket's benchmark and promotion, into the run's serving target; True if any was promoted."""
    target = plan.open(run_id)
    ui.line(target.info.describe())
    led.set_run_status(run_id, RunStatus.RUNNING, notes=RunNotesRecord(serving=target.info.to_json()))
    promoted_any = False
    try:
        for bucket, bshapes in by_bucket.items():
            promoted = _promote_bucket(args, led, evaluator, run_id, cid, judged, target, gname, bucket, bshapes)
            promoted_any = promoted or promoted_any
    finally:
        info = target.close()  # the worktree goes also when a benchmark fails with an exception
    led.set_run_status(run_id, RunStatus.FINISHED, finished=True, notes=RunNotesRecord(serving=info.to_json()))
    ui.line(info.outcome())
    return promoted_any


def _promote_bucket(
    args, led, evaluator: Evaluator, run_id: str, cid: int, judged: JudgedText, target, gname: str, bucket: str, bshapes
) -> bool:
    """Benchmark the file against the bucket's incumbent, apply the rule, and publish a winner; True if promoted."""
    from ...harness.bench.bench import record_shape_result, with_drawn_shape  # here: torch, after the flags
    from ...harness.serving import serving  # here: torch, after the flags

    entry = serving.promoted(args.op, bucket, args.dtype, gname, dir=target.dir)
    inc_file = str(serving.entry_path(entry, target.dir)) if entry is not None else None
    spec = with_drawn_shape(
        BenchSpec.judging(
            args.op,
            [s.key() for s in bshapes],
            args.dtype,
            BenchKernel(INCUMBENT, inc_file),
            BenchKernel(CANDIDATE, os.path.abspath(args.file), judged.hash),
        )
    )
    outcome = BenchOutcome.from_json(evaluator.bench(spec.to_json()))
    inc_label = "baseline" if entry is None else f"serving:{serving.entry_name(entry)}"
    for res in outcome.results:
        seed = spec.draw_seed if res.shape in spec.drawn else None
        record_shape_result(led, run_id, res, cid, inc_label, drawn_seed=seed)
    j = judge_benchmark(outcome, [s.key() for s in bshapes], args.margin, drawn=spec.drawn)
    if j.error:
        ui.line(f"{bucket}: benchmark failed: {j.error}", style="red")
        return False
    for shape, (tc, ti), kind in zip(j.shapes, j.pairs, j.kinds):
        ui.line(
            f"  {shape}: candidate {tc.median_ms:.4f} ms ±{tc.spread_ms:.4f}, incumbent "
            f"{ti.median_ms:.4f} ms ±{ti.spread_ms:.4f}" + (" (CUDA-graph replay)" if kind == "graph" else "")
        )
    if not j.decision.promote:  # type: ignore[union-attr]  # a judgement without an error has a decision
        ui.line(f"{bucket}: not promoted: {j.decision.reason}", style="yellow")  # type: ignore[union-attr]
        return False
    done = agent.publish_promotion(
        target,
        led,
        agent.PromotionRequest(
            run_id,
            args.op,
            bucket,
            args.dtype,
            gname,
            cid,
            os.path.basename(args.file),
            judged,
            j,
            args.margin,
            env.versions(),
            note=args.reason,
        ),
    )
    where = f" (commit {done.commit[:10]} on {target.info.branch})" if done.commit else ""
    ui.line(f"{bucket}: PROMOTED -> {_shown_entry(target, done.entry)}{where}: {done.reason}", style="bold green")
    return True


def _shown_entry(target, entry: ManifestEntry) -> str:
    """Where a reviewer finds a promoted kernel: its file, or the manifest entry of a configuration."""
    if entry.file:
        return target.shown(entry.file)
    from ...harness.serving import serving  # here: torch, after the flags

    return f"{target.shown(serving.MANIFEST_NAME)} ({serving.describe_entry(entry)})"

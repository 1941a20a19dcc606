"""The ledger side of a run: each stage's result recorded as it ends (one transaction each), what the rule
decides of a benchmark, a winner installed, and what the run reads back of its own and earlier runs' records
(a stage a resume need not run again, the times a replay tells the proposer, the attempts a prompt lists).
It tells the run's output (`RunEvents`) and the proposer (`ProposerThread`) what each result was. The ledger
is the record of the candidates' statuses: nothing here keeps a copy of them."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..harness.bench.bench import record_shape_result
from ..harness.bench.bench_records import BenchOutcome
from ..harness.bench.promotion import judge_benchmark
from ..harness.env import versions
from ..harness.ledger.ledger import Candidate, CandidateStatus, Ledger, row_time
from ..harness.serving import serving
from ..harness.serving.dispatch import measured_choices
from ..ops import get_op
from ..sanitizer.canonical import as_written
from ..sanitizer.verdict import CheckOutcome, CheckStatus, SanitizerMode, Verdict, is_time_limit
from .placement import BenchTask
from .proposal import Attempt, Proposal, ProposeContext, ProposerThread
from .publish import PromotionRequest, ServingTarget, publish_choices, publish_promotion
from .run_config import RunConfig, Target
from .search import baseline_source
from .work import RunEvents, Stage, Work

GPU_PROMOTION_CHECKS = ("gpu_differential", "gpu_domain", "memcheck", "initcheck", "racecheck")
# Candidates that passed the sanitizer (and were timed, where a GPU was), and those that were timed.
TIMED = (CandidateStatus.BENCHMARKED, CandidateStatus.PROMOTED)
PASSED_SANITIZER = (CandidateStatus.VERIFIED,) + TIMED
# Earlier runs' candidates for a target that a new run's prompts mention.
HISTORY_ATTEMPTS = 8
# What a candidate's line says when the time limit, not a verdict, ended its sanitizer stage.
NOT_VERIFIED = "not verified"


def rejected_for_time(c: Candidate) -> bool:
    """A candidate an older version recorded as rejected when only the sanitizer's time limit stopped it."""
    return c.status == CandidateStatus.REJECTED and c.stored_verdict.timed_out


class Recorder:
    """What one run records, and the figures it keeps of this session (the best gain, the incumbents' times,
    the benchmarks' phases) for its status line, its prompts and its throughput."""

    def __init__(
        self,
        cfg: RunConfig,
        ledger: Ledger,
        run_id: str,
        events: RunEvents,
        proposer: ProposerThread,
        gpu_name: str,
        target: ServingTarget,
    ):
        self.cfg, self.ledger, self.run_id, self.events = cfg, ledger, run_id, events
        self.proposer = proposer
        self.gpu_name = gpu_name
        self.target = target  # the serving set promotions and dispatch choices go to
        self.attempts: Dict[Tuple[str, str], List[Attempt]] = {}  # (op, bucket) -> what the prompts list
        self.incumbent_ms: Dict[Tuple[str, str], float] = {}
        self.ceilings: Optional[Dict[str, Any]] = None
        self.judged: Set[int] = set()  # candidates this session judged to a verdict
        self.unjudged = 0  # candidates this session left at the stage they reached (a resume finishes them)
        # each benchmark child's phases: start (sandbox, imports, ceilings), compile, wait for the GPU alone
        self.bench_phases: Dict[str, List[float]] = {"start": [], "compile": [], "wait": []}
        self.raced_out = 0  # benchmarks stopped at a shape the rule refuses on its own
        self.stopped_early = 0  # of which the sequential test stopped (harness/bench/sequential.py)
        self.best_gain: Optional[float] = None
        self.first_benchmark_at: Optional[float] = None

    def attempt(self, w: Work, a: Attempt) -> None:
        self.attempts.setdefault((w.target.op, w.target.bucket), []).append(a)

    # -- what the ledger holds ----------------------------------------------------------------
    def history(self, t: Target, mine: Set[int]) -> List[Attempt]:
        """What earlier runs judged for this target, oldest first (the prompt's 'earlier attempts', so a
        model is told what was tried before this run too); `mine`: this run's candidates, left out."""
        out = []
        for c in self.ledger.candidates(op=t.op):
            if (
                c.id in mine
                or c.status == CandidateStatus.PROPOSED
                or not c.path
                or os.path.basename(os.path.dirname(c.path)) != t.bucket
            ):
                continue
            passed = c.status in PASSED_SANITIZER
            why = c.status if passed else (c.stored_verdict.failure() or "rejected")
            out.append(
                Attempt(
                    c.label or f"candidate-{c.id}",
                    passed,
                    f"{why} (an earlier run)"[:300],
                    self.bench_ms(c.id) if c.status in TIMED else None,
                )
            )
        return out[-HISTORY_ATTEMPTS:]

    def bench_ms(self, cid: int, incumbent: bool = False) -> Optional[float]:
        """A candidate's recorded benchmark time, mean over its shapes (or the incumbent's, timed beside
        it), read as the live path judged it: graph replays where both had them (`ledger.row_time`)."""
        by_shape: Dict[str, list] = {}
        for b in self.ledger.bench_results(candidate_id=cid):
            # the bucket's points, as the live path's mean: not a shape drawn inside the bucket beside them
            if not b.label.startswith("anchor:") and "drawn_in_bucket_seed" not in (b.extra or {}):
                by_shape.setdefault(b.shape_key, []).append(b)
        times = [row_time(rows)(b) for rows in by_shape.values() for b in rows if (b.label != "candidate") == incumbent]
        return sum(times) / len(times) if times else None

    def replay(self, ctx: ProposeContext, p: Proposal, cid: int) -> None:
        """Tell the proposer what a candidate judged before came to, as the live path would have."""
        c = self.ledger.candidate(cid)
        if c is None or c.status == CandidateStatus.PROPOSED:
            return
        inc_ms = self.bench_ms(cid, incumbent=True)
        if inc_ms is not None:  # what the candidate was measured against, as the live path tells it first
            self.proposer.incumbent_time(ctx, inc_ms)
        self.proposer.feedback(ctx, p, c.status in PASSED_SANITIZER, self.bench_ms(cid))

    def reopen(self, c: Candidate) -> None:
        """A candidate rejected only for the time limit is judged again: it is 'proposed' until it is."""
        if rejected_for_time(c):
            self.ledger.set_candidate_status(c.id, CandidateStatus.PROPOSED, verdict=c.verdict)

    def stage_done(self, cid: int, mode: Stage, checks: Optional[Sequence[str]]) -> Optional[bool]:
        """A stage this candidate already finished (a resume): True passed, False failed, None not run."""
        done = self._since_time_limit(cid, mode, self.ledger.checks(cid, mode=mode.mode))
        if done and (checks is None or {c.name for c in done} >= set(checks)):
            return all(c.status != CheckStatus.FAILED for c in done)
        return None

    def _since_time_limit(self, cid: int, mode: Stage, done: List[Any]) -> List[Any]:
        """A stage's recorded checks that count: those after the last time the sanitizer's time limit stopped
        the stage (that judging found nothing; the stage is run again). An older version recorded the check
        the limit stopped as failed, its candidate's verdict naming the limit; this one as not run."""
        c = self.ledger.candidate(cid)
        verdict = c.stored_verdict if c is not None else Verdict("", "", "")
        old_style = verdict.timed_out and verdict.mode == mode
        # (by the judge's words only: a failed check's detail may quote the candidate's own messages)
        stopped = [
            k
            for k in done
            if (k.status == CheckStatus.SKIPPED and is_time_limit(k.detail))
            or (old_style and k.status == CheckStatus.FAILED)
        ]
        if not stopped:
            return done
        last = max(k.created_at for k in stopped)
        return [k for k in done if k.created_at > last]

    # -- proposals ------------------------------------------------------------------------------
    def record_unusable(self, p: Proposal) -> Tuple[int, str]:
        """A model reply that could not become a candidate, recorded as a rejected one; (its id, its hash)."""
        # a note, not a kernel: kept as written (its canonical text would be empty, comments being dropped)
        note = as_written(f"# unusable model reply ({p.label}, model call {p.model_call_id}): {p.rejected}\n")
        cand, _ = self.ledger.add_candidate(p.op, note, p.proposer, self.run_id, label=p.label)
        verdict = Verdict(
            "",
            p.op,
            "reply",
            [CheckOutcome("reply", CheckStatus.FAILED, p.rejected)],
            error=p.rejected,
            source_hash=note.hash,
        )
        self.ledger.record_checks(cand.id, SanitizerMode.QUICK, [asdict(c) for c in verdict.checks])
        self.ledger.set_candidate_status(cand.id, CandidateStatus.REJECTED, verdict=verdict.to_json())
        if p.model_call_id:
            self.ledger.link_model_call(p.model_call_id, cand.id)
        self.events.candidate(p.label, CandidateStatus.REJECTED, p.rejected)
        return cand.id, note.hash

    # -- the sanitizer's stages -----------------------------------------------------------------
    def record_verdict(self, works: Sequence[Work], mode: Stage, v: Verdict) -> bool:
        """Record one sanitizer stage's verdict for a candidate (its works share it); True when it passed."""
        cid = works[0].cid
        if v.source_hash != works[0].judged.hash:
            return self._judged_other_text(works, mode, v)
        if not v.passed and v.timed_out:
            return self._not_verified(works, mode, v)
        self.ledger.record_checks(cid, mode.mode, [asdict(c) for c in v.checks])
        if v.passed:
            if mode == Stage.FULL:
                self.ledger.set_candidate_status(
                    cid, CandidateStatus.VERIFIED, verdict=v.to_json(), fpsan_equivalent=v.fpsan_equivalent
                )
            return True
        self.ledger.set_candidate_status(cid, CandidateStatus.REJECTED, verdict=v.to_json())
        self.judged.add(cid)
        self.events.candidate(
            works[0].proposal.label, CandidateStatus.REJECTED, f"{works[0].target.op} {mode}: {v.summary()}"
        )
        for w in works:
            self.attempt(w, Attempt(w.proposal.label, False, v.summary()))
            self.proposer.feedback(w.ctx, w.proposal, False, None)
        return False

    def record_checks_beside(self, works: Sequence[Work], mode: Stage, v: Verdict) -> None:
        """The checks of a stage that ran beside the one that rejected the candidate: kept, nothing follows."""
        if v.source_hash == works[0].judged.hash:
            self.ledger.record_checks(works[0].cid, mode.mode, [asdict(c) for c in v.checks])

    def _other_text(self, w: Work, mode: Stage, v: Verdict) -> str:
        """Why a verdict does not count for the candidate: it is about another text (the file changed after the
        loop wrote it, or the judge did not say what it read)."""
        got = f"sha256 {v.source_hash[:12]}" if v.source_hash else "a text it did not name"
        return (
            f"{w.target.op} {mode}: the file judged is not the candidate's text ({got}, the candidate's "
            f"{w.judged.hash[:12]}): {w.path} changed after it was written"
        )

    def _judged_other_text(self, works: Sequence[Work], mode: Stage, v: Verdict) -> bool:
        """A verdict about another text than the candidate's is no verdict on it: nothing is recorded, the
        candidate stays where it was (a later run or `--resume` judges it again), and nothing follows in this
        session. Returns False."""
        self.events.candidate(
            works[0].proposal.label,
            NOT_VERIFIED,
            f"{self._other_text(works[0], mode, v)}; "
            f"not judged: `{self.events.resume_command(self.run_id)}` judges it again",
        )
        for w in works:
            self.proposer.feedback(w.ctx, w.proposal, False, None)
        return False

    def _not_verified(self, works: Sequence[Work], mode: Stage, v: Verdict) -> bool:
        """The time limit stopped a sanitizer stage: not a verdict. The candidate stays where it was (proposed,
        or verified), the check the limit stopped is recorded as not run, with the limit's words, and a later
        run or `--resume` judges it again. Returns False: nothing follows in this session."""
        cid, w0 = works[0].cid, works[0]
        checks = [
            CheckOutcome(
                k.name, CheckStatus.SKIPPED, v.error if not is_time_limit(k.detail) else k.detail, k.duration_s
            )
            if k.status == CheckStatus.FAILED
            else k
            for k in v.checks
        ]
        self.ledger.record_checks(cid, mode.mode, [asdict(k) for k in checks])
        c = self.ledger.candidate(cid)
        if c is not None and c.status == CandidateStatus.PROPOSED:  # (a verified one keeps its full verdict)
            self.ledger.set_candidate_status(cid, CandidateStatus.PROPOSED, verdict=v.to_json())
        self.events.candidate(
            w0.proposal.label,
            NOT_VERIFIED,
            f"{w0.target.op} {mode}: {v.error}; judged again by a later run or "
            f"`{self.events.resume_command(self.run_id)}`",
        )
        for w in works:
            self.proposer.feedback(w.ctx, w.proposal, False, None)  # the proposer moves on; the ledger keeps it open
        return False

    def verified_without_gpu(self, works: Sequence[Work]) -> None:
        w0 = works[0]
        self.judged.add(w0.cid)
        c = self.ledger.candidate(w0.cid)
        eq = {True: "FpSan-equivalent", False: "not structurally equivalent", None: "FpSan undecided"}[
            c.fpsan_equivalent if c else None
        ]
        self.events.candidate(
            w0.proposal.label,
            CandidateStatus.VERIFIED,
            # the bucket too: a source judged for two buckets prints a line for each, which read the same
            f"{w0.target.op} {w0.target.bucket}: passed the full sanitizer ({eq}); not benchmarked: no GPU",
        )
        for w in works:
            self.attempt(w, Attempt(w.proposal.label, True, "verified, not benchmarked"))
            self.proposer.feedback(w.ctx, w.proposal, True, None)

    def left_unjudged(self, n: int, note: str) -> None:
        """`n` candidates this session stops at the stage they reached (the time limit, a machine lost too
        often), counted for the run's end, and the note that says so."""
        self.unjudged += n
        self.events.note(note)

    # -- the benchmark and the promotion ----------------------------------------------------------
    def record_benchmark(self, w: Work, task: BenchTask, outcome: BenchOutcome) -> bool:
        """Record a benchmark and apply the rule; True when the candidate should be promoted (after the
        promotion checks)."""
        t, p, cid = w.target, w.proposal, w.cid
        inc = task.spec.incumbent
        assert inc is not None  # the loop's benchmarks name their incumbent (BenchSpec.judging)
        inc_label = "baseline" if inc.file is None else f"serving:{os.path.basename(inc.file)}"
        if outcome.ceilings:
            self.ceilings = outcome.ceilings
        for name, key in (("start", "start_s"), ("compile", "prepare_s"), ("wait", "wait_s")):
            if key in outcome.phases:
                self.bench_phases[name].append(outcome.phases[key])
        if outcome.raced_out:
            self.raced_out += 1
        if any(r.stopped_early is not None for r in outcome.results):
            self.stopped_early += 1
        inc_hash = as_written(baseline_source(t.op)).hash if inc.file is None else inc.source_hash
        for res in outcome.results:
            seed = task.spec.draw_seed if res.shape in task.spec.drawn else None
            record_shape_result(self.ledger, self.run_id, res, cid, inc_label, inc_hash, drawn_seed=seed)
        self._choose_serving(t)
        j = judge_benchmark(outcome, [s.key() for s in t.shapes], self.cfg.margin, drawn=task.spec.drawn)
        self.judged.add(cid)
        if j.error:
            self.ledger.set_candidate_status(
                cid,
                CandidateStatus.REJECTED,
                verdict=Verdict(w.path, t.op, Stage.BENCH.value, error=j.error, source_hash=w.judged.hash).to_json(),
            )
            self.events.candidate(p.label, CandidateStatus.REJECTED, f"benchmark: {j.error}")
            self.proposer.feedback(w.ctx, p, False, None)
            return False
        if self.first_benchmark_at is None:
            self.first_benchmark_at = time.time()
        cand = self.ledger.candidate(cid)
        if cand is None or cand.status != CandidateStatus.PROMOTED:  # serving another bucket: it stays so
            self.ledger.set_candidate_status(cid, CandidateStatus.BENCHMARKED)
        decision = j.decision
        assert decision is not None  # a judgement without an error has a decision
        if decision.gain == decision.gain and (self.best_gain is None or decision.gain > self.best_gain):
            self.best_gain = decision.gain  # (NaN for a refusal that has no gain)
        if len(j.pairs) == len(t.shapes):
            self.incumbent_ms[(t.op, t.bucket)] = j.incumbent_ms
            self.proposer.incumbent_time(w.ctx, j.incumbent_ms)
            self.proposer.feedback(w.ctx, p, True, j.candidate_ms)
        else:  # raced out after some shapes: a mean over fewer shapes compares with nothing else
            self.proposer.feedback(w.ctx, p, True, None)
        self.attempt(w, Attempt(p.label, True, decision.reason, j.candidate_ms, j.fraction_of_ceiling))
        if not decision.promote:
            self.events.candidate(p.label, CandidateStatus.BENCHMARKED, decision.reason)
            return False
        w.judgement = j
        return True

    def _choose_serving(self, t: Target) -> None:
        """Every benchmark times the incumbent beside torch: where torch serves the op's contract, the faster
        of the two serves the bucket from now on (harness.serving.dispatch)."""
        if not get_op(t.op).torch_label:
            return
        choices = measured_choices(
            self.ledger, ops=[t.op], bucket=t.bucket, dtype=self.cfg.dtype, gpu=self.gpu_name, dir=self.target.dir
        )
        for c, entry in publish_choices(self.target, self.ledger, choices):
            if entry is not None and entry.measured_at:
                self.events.note(f"{t.op} {t.bucket}: {c.reason}; it serves the bucket")

    def record_promotion_checks(self, w: Work, v: Verdict) -> bool:
        """compute-sanitizer memcheck / initcheck / racecheck (and the device suite) before a kernel enters
        the serving set; True when they passed. A verdict about another text than the candidate's promotes
        nothing."""
        if v.source_hash != w.judged.hash:
            self.events.candidate(
                w.proposal.label,
                CandidateStatus.BENCHMARKED,
                f"faster, but not promoted: {self._other_text(w, Stage.PROMOTE, v)}",
            )
            return False
        self.ledger.record_checks(
            w.cid, SanitizerMode.GPU, [asdict(c) for c in v.checks if c.name in GPU_PROMOTION_CHECKS]
        )
        if not v.passed:
            self.ledger.set_candidate_status(w.cid, CandidateStatus.REJECTED, verdict=v.to_json())
            self.events.candidate(
                w.proposal.label, CandidateStatus.BENCHMARKED, f"faster, but not promoted: {v.summary()}"
            )
            return False
        return True

    def promote(self, w: Work) -> None:
        """Install the text the loop holds (never the file again), named by the hash every stage judged."""
        t, p, j = w.target, w.proposal, w.judgement
        assert j is not None  # record_benchmark judged the candidate before it is promoted
        try:
            done = publish_promotion(
                self.target,
                self.ledger,
                PromotionRequest(
                    self.run_id,
                    t.op,
                    t.bucket,
                    self.cfg.dtype,
                    self.gpu_name,
                    w.cid,
                    p.label,
                    w.judged,
                    j,
                    self.cfg.margin,
                    versions(),
                ),
            )
        except serving.ServingError as e:
            self.events.candidate(p.label, CandidateStatus.BENCHMARKED, f"faster, but not promoted: {e}")
            return
        self.incumbent_ms[(t.op, t.bucket)] = j.candidate_ms
        where = f" ({self.target.info.branch} {done.commit[:10]})" if done.commit else ""
        self.events.candidate(
            p.label, CandidateStatus.PROMOTED, f"{done.reason} -> {serving.describe_entry(done.entry)}{where}"
        )

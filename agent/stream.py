"""The stream: one streaming evaluation of a run's candidates. Each candidate moves to its next stage as soon as
its current one ends, GPU work first (the scarce resource), and the proposer is asked again as candidates
leave the pipeline. What runs where is the placement's business (agent/placement.py); what each result means
for the ledger is the recorder's (agent/recorder.py); this module decides what runs next."""

from __future__ import annotations

import collections
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Protocol, Sequence, Set, Tuple

from ..harness.bench.bench_records import BenchOutcome
from .placement import BenchTask, LocalPlacement, SanitizeTask, Task, TaskLost
from .proposal import Proposal, ProposeContext, Proposer, ProposerThread
from .recorder import GPU_PROMOTION_CHECKS, Recorder
from .run_config import Budget, RunConfig, Target, time_limit_reached, weighted_pick
from .work import LiveStatus, RunEvents, Stage, Work

# Every benchmark already checks the result on the device at each shape it times; the
# full device suite (odd shapes, both dtypes) and compute-sanitizer run before a promotion.
GPU_QUICK_CHECKS = ("determinism",)
# Candidates in flight per GPU (with a GPU the CPU stages are not the bottleneck: the bound keeps the
# queue ahead of the GPUs short, so the proposer's feedback stays fresh and a deadline leaves little unjudged).
PIPELINE_PER_GPU = 6
# Proposals in a row, for one target, that repeat a source already proposed before the target counts as
# exhausted: the proposer's own (Proposer.repeat_limit), this for one that states none.
DUPLICATE_STREAK_LIMIT = Proposer.repeat_limit
# Times one stage of one candidate is queued again after the machine running it went away (a cluster
# node died) before the run leaves the candidate at that stage for a resume.
TASK_LOST_RETRIES = 3
# How long the hard stop waits for killed children to be reaped before the run ends anyway.
STOP_GRACE_S = 8.0


@dataclass(frozen=True, eq=False)
class Queued:
    """A stage of one candidate waiting for a slot. A sanitizer stage (quick, full, gpu) is judged once for
    all the works that share the candidate (Stream.sharing holds them); a benchmark or the promotion checks
    (bench, promote) hold the one work they are for. Compared by identity: each is one place in a queue."""

    stage: Stage
    work: Work


@dataclass(frozen=True, eq=False)
class Started:
    """A stage handed to the placement: what was queued, and the task that runs it."""

    queued: Queued
    task: Task

    @property
    def stage(self) -> Stage:
        return self.queued.stage

    @property
    def work(self) -> Work:
        return self.queued.work


@dataclass(frozen=True)
class Asked:
    """The proposer's call in flight: for which target (and its index in the stream's targets), with what context."""

    target: Target
    ctx: ProposeContext
    index: int


# The order GPU stages start in: the promotion checks of a winner first, then benchmarks, then GPU checks.
GPU_STAGE_ORDER = {Stage.PROMOTE: 0, Stage.BENCH: 1, Stage.GPU: 2}


class Session(Protocol):
    """All a stream reaches of the run session that owns it (agent/loop.py's Loop provides it): the run's parts,
    read only, the two stops the session sets (`deadline`, `failure`), and five calls."""

    @property
    def cfg(self) -> RunConfig: ...

    @property
    def run_id(self) -> str: ...

    @property
    def gpu(self) -> bool: ...

    @property
    def events(self) -> RunEvents: ...

    @property
    def recorder(self) -> Recorder: ...

    @property
    def placement(self) -> LocalPlacement: ...

    @property
    def proposer(self) -> Proposer: ...

    @property
    def proposer_thread(self) -> ProposerThread: ...

    @property
    def deadline(self) -> Optional[float]:
        """When the stream stops hard (None: no time limit)."""

    @property
    def failure(self) -> Optional[str]:
        """Why the run cannot go on (set by `count_model_call`); the stream then stops."""

    def context(self, t: Target) -> ProposeContext:
        """What the proposer is told for target `t`."""

    def count_model_call(self, p: Proposal) -> None:
        """Count the model call behind a proposal (too many failed ones set `failure`)."""

    def admit(self, t: Target, ctx: ProposeContext, p: Proposal, budget: Budget) -> Optional[Work]:
        """Record a proposal; its work, or None when it needs no evaluation."""

    def bench_task(self, w: Work) -> BenchTask:
        """The benchmark of a work's candidate against its target's incumbent."""

    def repeats(self, t: Target) -> int:
        """Proposals in a row for target `t` that repeated a source already proposed."""


class Stream:
    """One streaming evaluation: the scheduler's state (what waits for which resource, what runs). It asks
    the run's session for proposals and their works, and hands each result to the session's recorder."""

    def __init__(self, session: Session, targets: Sequence[Target], budget: Budget):
        self.session, self.targets, self.budget = session, list(targets), budget
        self.recorder = session.recorder
        self.placement = session.placement
        self.gpu = session.gpu and bool(self.placement.gpus)
        self.cpu_queue: Deque[Queued] = collections.deque()  # quick, full
        self.gpu_queue: Deque[Queued] = collections.deque()  # gpu, bench, promote
        self.running: Dict[Future, Started] = {}
        self.sharing: Dict[Tuple[int, Stage], List[Work]] = {}  # (cid, mode) in queue or running -> its works
        self.busy_targets: Set[Tuple[str, str]] = set()  # one benchmark and promotion at a time per target
        self.in_pipeline = 0  # works admitted and not finished
        self.exhausted: Set[int] = set()  # targets whose proposer had nothing new (until new feedback)
        self.noted_exhausted: Set[Tuple[str, str]] = set()
        self.last_status = 0.0
        self.next_target = 0
        self.asked = [0] * len(self.targets)  # proposal requests per target: weighted turns (see _pick)
        self.proposing: Optional[Future] = None
        self.proposing_for: Optional[Asked] = None
        self.idle_asks = 0
        self.lost: Dict[Tuple[int, Stage], int] = {}  # (cid, stage) -> times its task was lost with its machine

    # -- capacity -------------------------------------------------------------------------
    def _want_more(self) -> bool:
        """Whether to propose now: the CPU has a free slot and nothing queued for it, and (with a GPU) the
        pipeline holds no more than the GPUs can take soon, so feedback stays fresh and a deadline
        leaves little unjudged."""
        if self.cpu_queue or self.placement.running("cpu") >= self.placement.cpu_slots:
            return False
        if self.gpu:  # enough ahead of the GPUs to keep them fed while the CPU stages take their minute
            return self.in_pipeline < PIPELINE_PER_GPU * len(self.placement.gpus) + 2
        return self.in_pipeline < self.placement.cpu_slots + 1

    # -- stages ---------------------------------------------------------------------------
    def _enter(self, w: Work) -> None:
        self.in_pipeline += 1
        self._sanitize_stage(w, Stage.QUICK)

    def _sanitize_stage(self, w: Work, mode: Stage) -> None:
        if w.rejected:
            return
        checks = GPU_QUICK_CHECKS if mode == Stage.GPU else None
        done = self.recorder.stage_done(w.cid, mode, checks)
        if done is True:  # resumed: this stage already passed
            return self._after_sanitize(w, mode)
        if done is False:  # resumed: already rejected
            w.rejected = True
            return self._leave(w)
        key = (w.cid, mode)
        if key in self.sharing:  # the same candidate for another bucket: judged once
            self.sharing[key].append(w)
            return
        self.sharing[key] = [w]
        if mode == Stage.GPU:
            self.gpu_queue.append(Queued(Stage.GPU, w))
        else:
            self.cpu_queue.append(Queued(mode, w))

    def _after_sanitize(self, w: Work, mode: Stage) -> None:
        """The next stage of a candidate that passed `mode`. After the quick stage the full sanitizer (CPU)
        and the GPU checks run side by side, so the GPU starts on a candidate a stage earlier; the
        benchmark waits for both."""
        if w.rejected:
            return
        if mode == Stage.QUICK:
            if self.gpu:
                self._sanitize_stage(w, Stage.GPU)
            return self._sanitize_stage(w, Stage.FULL)
        w.passed.add(mode)
        if not self.gpu:
            self.recorder.verified_without_gpu([w])
            return self._leave(w)
        if {Stage.FULL, Stage.GPU} <= w.passed:
            self.gpu_queue.append(Queued(Stage.BENCH, w))

    def _leave(self, w: Work) -> None:
        self.in_pipeline -= 1
        self.exhausted.discard(self.targets.index(w.target) if w.target in self.targets else -1)

    def _gpu_task(self, stage: Stage, w: Work) -> Task:
        if stage == Stage.GPU:
            return SanitizeTask(w.path, w.target.op, Stage.GPU.mode, GPU_QUICK_CHECKS, gated=True)
        if stage == Stage.BENCH:
            return self.session.bench_task(w)
        return SanitizeTask(
            w.path, w.target.op, Stage.PROMOTE.mode, GPU_PROMOTION_CHECKS, stage=Stage.PROMOTE.value, gated=True
        )

    def _start(self) -> None:
        """Hand queued stages to free slots: GPU work first (the scarce resource), promotion checks before
        benchmarks before GPU checks; then the CPU's."""
        # An ungated benchmark waiting for its GPU: let the shared tasks drain (a gated one starts in a
        # shared slot, and the placement drains the GPU for its timing).
        held = False
        for item in sorted(self.gpu_queue, key=lambda q: GPU_STAGE_ORDER[q.stage]):
            w = item.work
            key = (w.target.op, w.target.bucket)
            if item.stage == Stage.BENCH and key in self.busy_targets:
                continue  # judged against the incumbent the running one may replace: after it
            task = self._gpu_task(item.stage, w)
            if held and not task.exclusive:
                break
            if not self.placement.can_start(task):
                held = held or (task.exclusive and not task.gated)
                continue
            self.gpu_queue.remove(item)
            if item.stage == Stage.BENCH:
                self.busy_targets.add(key)
            self.running[self.placement.submit(task)] = Started(item, task)
        while self.cpu_queue and self.placement.running("cpu") < self.placement.cpu_slots:
            item = self.cpu_queue.popleft()
            task = SanitizeTask(item.work.path, item.work.target.op, item.stage.mode)
            self.running[self.placement.submit(task)] = Started(item, task)

    def _propose(self) -> None:
        lp, budget = self.session, self.budget
        if self.proposing is not None or budget.exhausted(lp.proposer_thread.tokens()) or not self._want_more():
            return
        i = self._pick()
        if i is None:
            return
        t = self.targets[i]
        n = lp.cfg.per_round
        if lp.cfg.max_candidates is not None:
            n = max(1, min(n, lp.cfg.max_candidates - budget.used))
        ctx = lp.context(t)
        self.proposing_for = Asked(t, ctx, i)
        self.proposing = lp.proposer_thread.propose(ctx, n)

    def _pick(self) -> Optional[int]:
        i = weighted_pick([t.weight for t in self.targets], self.asked, self.exhausted, self.next_target)
        if i is not None:
            self.asked[i] += 1
            self.next_target = (i + 1) % len(self.targets)
        return i

    def _proposed(self, proposals: List[Proposal]) -> None:
        lp = self.session
        asked = self.proposing_for
        assert asked is not None  # a proposal comes only for what was asked
        t, ctx, i = asked.target, asked.ctx, asked.index
        self.proposing, self.proposing_for = None, None
        if not proposals:
            self._exhaust(
                i, "search space exhausted" if lp.proposer.name == "search" else "the proposer has nothing new"
            )
            return
        for p in proposals:
            lp.count_model_call(p)
            w = lp.admit(t, ctx, p, self.budget)
            if w is not None:
                self._enter(w)
        limit = getattr(lp.proposer, "repeat_limit", DUPLICATE_STREAK_LIMIT)
        if lp.repeats(t) >= limit:
            self._exhaust(i, f"the proposer repeated sources already tried {limit} times in a row")

    def _exhaust(self, i: int, why: str) -> None:
        """No more proposals for target `i` (until one of its candidates gives the proposer new feedback)."""
        self.exhausted.add(i)
        t = self.targets[i]
        if any(w.target == t for w in self._unjudged()):
            return  # its candidates in flight may still move the climb: not exhausted for good yet
        if (t.op, t.bucket) not in self.noted_exhausted:
            self.noted_exhausted.add((t.op, t.bucket))
            self.session.events.note(f"{why} for {t.op} {t.bucket}")

    def _finished(self, fut: Future) -> None:
        rec = self.recorder
        started = self.running.pop(fut)
        stage, w = started.stage, started.work
        result = fut.result()
        if isinstance(result, TaskLost):  # not a result about the candidate: run the stage again
            return self._requeue(started.queued, result.reason)
        if stage.sanitizer:
            works = self.sharing.pop((w.cid, stage))
            live = [w for w in works if not w.rejected]
            if not live:  # rejected by the stage that ran beside this one: its checks are kept, nothing more
                rec.record_checks_beside(works, stage, result)
                return
            if rec.record_verdict(live, stage, result):
                for w in live:
                    self._after_sanitize(w, stage)
            else:
                for w in live:
                    w.rejected = True
                    self._leave(w)
            return
        key = (w.target.op, w.target.bucket)
        if stage == Stage.BENCH:
            assert isinstance(started.task, BenchTask)  # the benchmark stage runs a BenchTask
            if rec.record_benchmark(w, started.task, BenchOutcome.from_json(result)):
                if self.session.cfg.compute_sanitizer:
                    self.gpu_queue.appendleft(Queued(Stage.PROMOTE, w))  # the target stays busy until it is decided
                    return
                rec.promote(w)
        elif stage == Stage.PROMOTE and rec.record_promotion_checks(w, result):
            rec.promote(w)
        self.busy_targets.discard(key)
        self._leave(w)

    def _requeue(self, item: Queued, reason: str) -> None:
        """A stage whose task was lost with its machine goes back to the front of its queue (nothing was
        recorded for it); after TASK_LOST_RETRIES losses the candidate is left at the stage it reached,
        unjudged, for a resume."""
        lp = self.session
        stage, w0 = item.stage, item.work
        key = (w0.cid, stage)
        sanitizer = stage.sanitizer
        sharing = self.sharing.get(key, [w0]) if sanitizer else [w0]
        n = self.lost[key] = self.lost.get(key, 0) + 1
        if all(w.rejected for w in sharing):  # rejected meanwhile by the stage beside it: nothing to redo
            self.sharing.pop(key, None)
            return
        if n > TASK_LOST_RETRIES:
            if sanitizer:
                self.sharing.pop(key, None)
            self.busy_targets.discard((w0.target.op, w0.target.bucket))
            self.recorder.left_unjudged(
                1,
                f"{w0.proposal.label} {stage}: {reason}, {n} times: left at that stage; "
                f"`{lp.events.resume_command(lp.run_id)}` finishes it",
            )
            for w in sharing:
                if not w.rejected:
                    w.rejected = True  # nothing more runs for it in this session (a stage beside it only records)
                    self._leave(w)
            return
        lp.events.note(f"{w0.proposal.label} {stage}: {reason}; queued again")
        if stage in (Stage.QUICK, Stage.FULL):
            self.cpu_queue.appendleft(item)
            return
        if stage == Stage.BENCH:  # started again when its target is free, as any benchmark
            self.busy_targets.discard((w0.target.op, w0.target.bucket))
        self.gpu_queue.appendleft(item)

    def _status(self) -> None:
        now = time.time()
        if now - self.last_status < 1.0:
            return
        self.last_status = now
        lp, rec = self.session, self.recorder
        running: Dict[str, int] = {}
        for started in self.running.values():
            running[started.stage.value] = running.get(started.stage.value, 0) + 1
        lp.events.status(
            LiveStatus(
                self.budget.elapsed(),
                lp.cfg.time_limit_s,
                self.budget.used,
                lp.cfg.max_candidates,
                running,
                len(self.cpu_queue) + len(self.gpu_queue),
                len(rec.judged),
                rec.best_gain,
            )
        )

    def _unjudged(self) -> List[Work]:
        works: Dict[int, Work] = {}
        for item in [started.queued for started in self.running.values()] + list(self.cpu_queue) + list(self.gpu_queue):
            works.setdefault(item.work.cid, item.work)
        for ws in self.sharing.values():
            for w in ws:
                works.setdefault(w.cid, w)
        return list(works.values())

    def _hard_stop(self, why: str = "time limit reached") -> None:
        lp = self.session
        left = self._unjudged()
        self.placement.stop()
        if self.running:  # killed children return at once; their results are not verdicts
            wait(list(self.running), timeout=STOP_GRACE_S)
        self.running.clear()
        if left:
            self.recorder.left_unjudged(
                len(left),
                f"{why}: stopped {len(left)} candidate(s) in flight "
                f"({', '.join(w.proposal.label for w in left[:4])}"
                f"{', ...' if len(left) > 4 else ''}); they stay at the stage they reached: "
                f"`{lp.events.resume_command(lp.run_id)}` finishes them",
            )

    def run(self, works: Sequence[Work]) -> Optional[str]:
        lp = self.session
        for w in works:
            self._enter(w)
        try:
            while True:
                if lp.deadline is not None and time.time() >= lp.deadline:
                    self._hard_stop()
                    return time_limit_reached(lp.cfg)
                if lp.failure is not None:
                    self._hard_stop(lp.failure)
                    return lp.failure
                self._start()
                self._propose()
                self._start()
                waiting = list(self.running) + ([self.proposing] if self.proposing else [])
                if not waiting:
                    if self.gpu_queue and not self.cpu_queue and not self.placement.gpus:
                        # the cluster lost its last GPU (of the run's model): nothing queued can ever start
                        self._hard_stop("no GPU is left")
                        return "no GPU is left to judge on"
                    if self.cpu_queue or self.gpu_queue:
                        continue  # startable now (a target became free)
                    stop = self.budget.exhausted(lp.proposer_thread.tokens())
                    if stop:
                        return stop
                    if len(self.exhausted) >= len(self.targets):
                        return "the proposer has nothing new to propose"
                    continue
                self._status()
                timeout = 1.0 if lp.deadline is None else max(0.0, min(1.0, lp.deadline - time.time()))
                done, _ = wait(waiting, timeout=timeout, return_when=FIRST_COMPLETED)
                for fut in done:
                    if fut is self.proposing:
                        self._proposed(fut.result())
                    else:
                        self._finished(fut)
        except BaseException:
            self.placement.stop()  # Ctrl-C: the children go down with the run
            raise

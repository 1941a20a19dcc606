"""The agent loop: propose -> quick sanitize -> full sanitize -> GPU checks and benchmark
(when a GPU is present) -> promotion rule.

Evaluation streams: each candidate moves to its next stage as soon as its current one ends,
and the proposer refills the pipeline as candidates leave it, so the GPU starts on the first
candidate that passed the CPU stages while others are still being sanitized. Where work runs
is the placement's business (agent/placement.py); what runs next, the stream's (agent/stream.py);
what each result means for the ledger, the recorder's (agent/recorder.py); the run's configuration,
targets and budget live in agent/run_config.py. This module is the run session: it admits proposals as
candidates, knows each target's incumbent, and runs a run from start to summary (`run_loop`). Only this
thread touches the ledger, the proposer's state (through one proposer thread) and the serving set.
Each candidate is followed by the hash of the text the loop holds for it: a verdict, a benchmark or an
installation about another text counts for nothing.

Every step is one ledger transaction, so a run killed at any moment (Ctrl-C or kill -9)
loses at most the steps in flight, and `--resume RUN` continues it: candidates already
recorded in the run are not proposed, evaluated or counted twice (a deterministic
proposer regenerates the same sequence and the loop replays the recorded outcomes to it),
and a candidate interrupted half-way resumes at the first stage it has no result for.
At the time limit the run stops hard: running children are killed and their candidates
stay at the stage they reached, for a resume to finish.
Candidate files are written to kernels/candidates/<run>/<op>/<bucket>/. The serving set the run reads
its incumbents from and promotes into is its serving target (agent/publish.py): in a git repository a
branch of the run's own, through a worktree; else the serving folder in place.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..harness.bench.bench import with_drawn_shape
from ..harness.bench.bench_records import CANDIDATE, INCUMBENT, BenchKernel, BenchSpec
from ..harness.bench.compile_probe import CompileProfile
from ..harness.bench.diagnosis import Diagnosis, diagnose_incumbent
from ..harness.env import versions
from ..harness.ledger.ledger import (
    Candidate,
    CandidateStatus,
    Ledger,
    RunNotesRecord,
    RunSession,
    RunStatus,
    RunSummary,
)
from ..harness.serving import serving
from ..sanitizer.canonical import JudgedText, as_written, judged_or_as_read, read_back
from .model import CallRecord, ModelConfig, ModelProposer
from .placement import (
    BenchTask,
    ClusterDevices,
    Devices,
    Evaluator,
    LocalDevices,
    LocalPlacement,
    TaskSpan,
    default_jobs,
    describe,
    gpu_seconds,
    gpu_seconds_by_subject,
    occupied_fraction,
    occupied_seconds,
)
from .proposal import Proposal, ProposeContext, Proposer, ProposerThread
from .publish import NONE, PublishError, ServingTarget, TargetInfo, TargetPlan, plan_target, recorded_target
from .recorder import TIMED, Recorder, rejected_for_time
from .run_config import (
    Budget,
    RunConfig,
    Target,
    targets_for,
)
from .screen import Screen
from .search import SearchProposer, baseline_source
from .stream import Stream
from .throughput import Throughput
from .work import Incumbent, RunEvents, Stage, Work

# What a resumed run may spend finishing the candidates it finds in flight, past the original limit.
FINISH_ALLOWANCE_S = 600.0
# Model calls that failed, with none answered in the session, before the run stops as failed: an endpoint that
# answers every call with an error (a wrong URL, a server that is not the API) would burn the whole budget.
MODEL_FAILURES_LIMIT = 3

__all__ = [
    "FINISH_ALLOWANCE_S",
    "MODEL_FAILURES_LIMIT",
    "Loop",
    "RunNotes",
    "run_loop",
    "placement_for",
    "devices_for",
    "make_proposer",
    "compiler_of",
]


def placement_for(cfg: RunConfig, devices: Devices, evaluator: Optional[Evaluator] = None) -> LocalPlacement:
    """This machine's placement for a run: the GPUs `devices` lends it (none without one) and sanitizer
    processes for the rest, each task run by `evaluator` (default: this machine's children)."""
    gpus = devices.visible(cfg.gpus) if devices.available() else []
    return LocalPlacement(cfg.jobs or default_jobs(len(gpus)), gpus, evaluator=evaluator)


def devices_for(placement: Optional[Any]) -> Devices:
    """The GPUs a run has: a cluster placement's own, else this machine's."""
    if getattr(placement, "remote", False):
        return ClusterDevices(placement)
    return LocalDevices()


class Loop:
    """The run session: one process's part of a run. It admits proposals (recorded, written, followed as a work
    per target), knows what serves each target now, and streams the works (agent/stream.py), whose results its
    recorder writes to the ledger (agent/recorder.py)."""

    def __init__(
        self,
        cfg: RunConfig,
        ledger: Ledger,
        run_id: str,
        proposer: Proposer,
        events: RunEvents,
        gpu: bool,
        gpu_name: str,
        placement: LocalPlacement,
        target: Optional[ServingTarget] = None,
    ):
        self.cfg = cfg
        # the one serving set this run reads and writes (promotions and dispatch choices alike)
        self.target = target or ServingTarget.in_place(serving.serving_dir())
        self.ledger = ledger
        self.run_id = run_id
        self.proposer = proposer
        # the proposer's calls, in order, on a thread of their own: a model call never holds the stream
        self.proposer_thread = ProposerThread(proposer)
        self.gpu = gpu
        self.gpu_name = gpu_name
        self.placement = placement
        self.recorder = Recorder(cfg, ledger, run_id, events, self.proposer_thread, gpu_name, self.target)
        self.model_calls = {"answered": 0, "failed": 0}  # the proposer's model calls in this session
        self.last_call_error = ""  # what the last failed one said
        self.failure: Optional[str] = None  # why the run cannot go on (it then ends as failed)
        # past the deadline the run stops hard: running children are killed, and their candidates stay
        # in the ledger at the stage they reached (a resume finishes them)
        self.deadline: Optional[float] = None
        # what this run has already recorded (resume): source hash -> candidate id
        self.known = {c.source_hash: c.id for c in ledger.candidates(run_id=run_id)}
        self.t_start = time.time()
        # (op, bucket) -> proposals in a row repeating a source this process already saw (a stuck proposer is stopped)
        self.duplicate_streak: Dict[Tuple[str, str], int] = {}
        self._history_loaded: Set[Tuple[str, str]] = set()
        self.diagnoses: Dict[Tuple[str, str, str], Diagnosis] = {}  # (op, bucket, incumbent hash) -> diagnosis
        self.session_hashes: Set[str] = set()  # sources proposed since this process started
        self.working: Set[Tuple[int, str, str]] = set()  # (candidate, op, bucket) given a work in this process

    @property
    def events(self) -> RunEvents:
        """Where the run's progress goes (the recorder's lines too)."""
        return self.recorder.events

    @events.setter
    def events(self, events: RunEvents) -> None:
        self.recorder.events = events

    # -- incumbents -------------------------------------------------------------------
    def incumbent(self, t: Target) -> Incumbent:
        """What serves the target now in the run's serving set: its promoted kernel, else the baseline."""
        entry = serving.promoted(t.op, t.bucket, self.cfg.dtype, self.gpu_name, dir=self.target.dir)
        if entry:
            try:
                # canonical text of what was checked against the manifest's hash, not of a second unchecked read
                held = judged_or_as_read(serving.entry_source(entry, self.target.dir).text)
                path = serving.entry_path(entry, self.target.dir)
            except serving.ServingError as e:
                # what cannot be served is no incumbent: the climb starts from the baseline, and says why
                self.events.note(f"{t.op} {t.bucket}: {e}")
            else:
                return Incumbent(f"serving:{serving.entry_name(entry)}", str(path), held)
        return Incumbent("baseline", None, as_written(baseline_source(t.op)))

    def context(self, t: Target) -> ProposeContext:
        key = (t.op, t.bucket)
        attempts = self.recorder.attempts
        if key not in self._history_loaded:
            self._history_loaded.add(key)
            attempts[key] = self.recorder.history(t, set(self.known.values())) + attempts.get(key, [])
        inc = self.incumbent(t)
        return ProposeContext(
            t.op,
            t.bucket,
            self.cfg.dtype,
            t.shapes,
            inc.source,
            inc.label,
            self.recorder.incumbent_ms.get(key),
            self.gpu_name if self.gpu else None,
            self.recorder.ceilings,
            list(attempts.get(key, [])),
            diagnosis=self._diagnosis(t, inc),
            repeats=self.repeats(t),
        )

    def repeats(self, t: Target) -> int:
        """Proposals in a row for target `t` that repeated a source already proposed (see `admit`)."""
        return self.duplicate_streak.get((t.op, t.bucket), 0)

    def _diagnosis(self, t: Target, inc: Incumbent) -> Optional[Diagnosis]:
        """What bounds the bucket's incumbent (harness/bench/diagnosis.py), once per incumbent source and run;
        recorded in the ledger. None where the placement's children cannot compile (a test's fakes)."""
        key = (t.op, t.bucket, inc.judged.hash)
        profile = compiler_of(self.placement)
        if key not in self.diagnoses and profile is not None:
            self.diagnoses[key] = diagnose_incumbent(
                self.ledger,
                self.run_id,
                t.op,
                t.bucket,
                self.cfg.dtype,
                t.shapes,
                inc.source,
                inc.label,
                profile=profile,
            )
        return self.diagnoses.get(key)

    def bench_task(self, w: Work) -> BenchTask:
        """The candidate's file timed against the bucket's incumbent, each named with the hash of its text: the
        benchmark times no file that changed since it was judged. After the bucket's shapes, one drawn at random
        inside the bucket (with_drawn_shape), which the candidate must win too."""
        inc = self.incumbent(w.target)
        incumbent = BenchKernel(INCUMBENT, inc.file, inc.judged.hash if inc.file else "")
        return BenchTask(
            with_drawn_shape(
                BenchSpec.judging(
                    w.target.op,
                    [s.key() for s in w.target.shapes],
                    self.cfg.dtype,
                    incumbent,
                    BenchKernel(CANDIDATE, w.path, w.judged.hash),
                    race=True,
                )
            )
        )

    # -- admission ------------------------------------------------------------------------
    def admit(self, t: Target, ctx: ProposeContext, p: Proposal, budget: Budget) -> Optional[Work]:
        """Record a proposal; return its work, or None when it needs no evaluation."""
        if p.call_failed:
            # no reply, so no candidate (its model call records the error); it uses the budget still, so that
            # an endpoint that keeps failing cannot spin the run
            self.events.candidate(p.label, "no reply", f"{t.op} {t.bucket}: {p.rejected}")
            budget.used += 1
            return None
        if p.rejected:
            cid, h = self.recorder.record_unusable(p)
            self.known[h] = cid
            budget.used += 1
            return None
        # what is recorded, hashed, judged and promoted is the canonical text (sanitizer/canonical.py), made here once
        # and carried from here on; the model's reply as it came stays in its model call. Bytes without one are kept
        # as proposed: the judge's static gate refuses them with the reason, and nothing runs them
        judged = judged_or_as_read(p.source)
        p.source = judged.text
        h = judged.hash
        key = (t.op, t.bucket)
        repeat = h in self.session_hashes  # proposed before in this very process: the proposer repeats itself
        self.session_hashes.add(h)
        replay_repeats = self.proposer.replays_are_repeats  # a code model repeating an earlier run's source too
        if h in self.known:  # recorded by this run already (a resume, or a repeat)
            return self._admit_known(t, ctx, p, judged, repeat or replay_repeats)
        existing = self.ledger.find_candidate(p.op, judged)
        path = self._write(p, judged, t)
        replay = existing is not None and not self._needs_work(existing, t)
        cand, new = self.ledger.add_candidate(
            p.op, judged, p.proposer, self.run_id, parent_id=p.parent_id, path=path, label=p.label, replayed=replay
        )
        self.known[h] = cand.id
        if p.model_call_id:
            self.ledger.link_model_call(p.model_call_id, cand.id)
        if replay and existing is not None:
            # judged by an earlier run: replayed to the proposer, which moves on from it; it costs no budget,
            # so a run over a ledger that holds earlier runs still judges as many new candidates
            self.events.candidate(
                p.label,
                "replayed",
                f"{t.op} {t.bucket}: judged before as candidate #{existing.id} ({existing.status}): not judged again",
            )
            self.recorder.replay(ctx, p, existing.id)
            if replay_repeats:
                self.duplicate_streak[key] = self.duplicate_streak.get(key, 0) + 1
            return None
        self.duplicate_streak[key] = 0
        budget.used += 1
        return self._work(t, ctx, p, cand.id, path, judged)

    def _admit_known(
        self, t: Target, ctx: ProposeContext, p: Proposal, judged: JudgedText, repeat: bool
    ) -> Optional[Work]:
        """A source this run recorded already: its work for target `t` where it still needs one, else None.
        `repeat`: the proposer repeated itself (this process proposed it before, or a code model replayed it)."""
        c = self.ledger.candidate(self.known[judged.hash])
        # interrupted mid-evaluation, or timed for another bucket only: finish it for this one
        if c is not None and self._needs_work(c, t):
            if c.label and c.label != p.label:  # what it prints names the candidate the ledger holds
                self.events.note(
                    f"{p.label} ({t.op} {t.bucket}): the same source as candidate #{c.id} {c.label}, "
                    f"judged once under that name"
                )
                p = dataclasses.replace(p, label=c.label)
            return self._work(t, ctx, p, c.id, self._write(p, judged, t), judged)
        if repeat:
            key = (t.op, t.bucket)
            self.duplicate_streak[key] = self.duplicate_streak.get(key, 0) + 1
        if c is not None and not self.unfinished(c):  # (one still in flight tells its own result)
            self.recorder.replay(ctx, p, c.id)
        return None

    def count_model_call(self, p: Proposal) -> None:
        """Count the proposer's model calls; with MODEL_FAILURES_LIMIT failed and none answered, the run cannot
        go on (`failure`): the endpoint answers, but not as the API it should be."""
        if p.model_call_error is None:
            if p.model_call_id is not None:
                self.model_calls["answered"] += 1
            return
        self.model_calls["failed"] += 1
        self.last_call_error = p.model_call_error[:200]
        n = self.model_calls["failed"]
        if n >= MODEL_FAILURES_LIMIT and not self.model_calls["answered"] and self.failure is None:
            # "its first n": calls still in flight then may fail too, and print after this line is set
            self.failure = (
                f"the model endpoint failed on its first {n} calls and answered none, last: {self.last_call_error}"
            )

    def session_end(self, stop_reason: Optional[str]) -> Optional[str]:
        """Why the session ended, as recorded: a session whose every model call failed ended as failed however it
        stopped (a budget smaller than MODEL_FAILURES_LIMIT, the time limit), since it judged nothing and the
        endpoint is what to fix; it said `finished: candidate budget reached` with no candidate, and exit 0."""
        n = self.model_calls["failed"]
        if self.failure is None and n and not self.model_calls["answered"]:
            self.failure = (
                f"the model endpoint failed on all {n} of its calls and answered none, last: {self.last_call_error}"
            )
        return self.failure or stop_reason

    def _work(self, t: Target, ctx: ProposeContext, p: Proposal, cid: int, path: str, judged: JudgedText) -> Work:
        c = self.ledger.candidate(cid)
        if c is not None:
            self.recorder.reopen(c)
        self.working.add((cid, t.op, t.bucket))
        return Work(t, ctx, p, cid, path, judged)

    def unfinished(self, c: Candidate) -> bool:
        """Whether a recorded candidate still needs evaluating here: never judged, not verified within the
        sanitizer's time limit (slowness is no fault: recorded as rejected by an older version too), or
        verified without a GPU (or before a time limit) and this run has one. Its finished stages are not run
        again."""
        return (
            c.status == CandidateStatus.PROPOSED
            or rejected_for_time(c)
            or (self.gpu and c.status == CandidateStatus.VERIFIED)
        )

    def _needs_work(self, c: Candidate, t: Target) -> bool:
        """Whether candidate `c`, proposed for target `t`, needs a work there that this session has not
        started: it is unfinished, or it was timed (its sanitizer stages are done, and the source is judged
        once) but never at `t`'s shapes, where the benchmark against that bucket's incumbent is still owed."""
        if (c.id, t.op, t.bucket) in self.working:
            return False
        if self.unfinished(c):
            return True
        if not self.gpu or c.status not in TIMED:
            return False
        timed_at = {b.shape_key for b in self.ledger.bench_results(candidate_id=c.id, op=t.op)}
        return not timed_at >= {s.key() for s in t.shapes}

    def pending_works(self, targets: Sequence[Target]) -> List[Work]:
        """The candidates a killed or stopped run recorded but never judged (whatever the proposer does next)."""
        by_key = {(t.op, t.bucket): t for t in targets}
        works = []
        for c in self.ledger.candidates(run_id=self.run_id):
            if not self.unfinished(c) or not c.path:
                continue
            bucket = os.path.basename(os.path.dirname(c.path))
            t = by_key.get((c.op, bucket)) or next((x for x in targets if x.op == c.op), None)
            if t is None:
                continue
            judged = read_back(c.source, c.source_hash)  # read back from the ledger: made again, held to its hash
            if judged is None:
                self.events.note(f"candidate #{c.id}: its recorded text does not have its recorded hash; not resumed")
                continue
            p = Proposal(c.op, judged.text, c.label or f"candidate-{c.id}", c.proposer)
            works.append(self._work(t, self.context(t), p, c.id, self._write(p, judged, t), judged))
        return works

    def _write(self, p: Proposal, judged: JudgedText, t: Target) -> str:
        """kernels/candidates/<run>/<op>/<bucket>/<label>-<hash>.py (the bucket is how a resume finds its target)."""
        d = os.path.join(self.cfg.candidates_dir, self.run_id, p.op, t.bucket)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{p.label}-{judged.hash[:8]}.py")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(judged.text)
        os.replace(tmp, path)
        return path

    # -- the stream -------------------------------------------------------------------------
    def stream(self, targets: Sequence[Target], budget: Budget, works: Sequence[Work] = ()) -> Optional[str]:
        """Evaluate until the budget is spent and nothing is in flight, the proposer has nothing new, or
        the deadline (then everything in flight is stopped). `works`: candidates to finish first (a
        resume). Returns why it stopped."""
        stream = Stream(self, targets, budget)
        stop = stream.run(works)
        if stream.proposing is None:  # the proposer has taken every piece of feedback in
            self.proposer_thread.drain()
        return stop

    def _gpu_seconds_by_candidate(self, log: Sequence[TaskSpan]) -> Dict[str, Dict[str, float]]:
        """Each candidate's GPU seconds by stage (placement.gpu_seconds_by_subject), under its id: a task names
        its candidate by the file the run wrote, which the ledger holds."""
        ids = {c.path: c.id for c in self.ledger.candidates(run_id=self.run_id) if c.path}
        return {
            str(ids[path]): {k: round(v, 2) for k, v in stages.items()}
            for path, stages in gpu_seconds_by_subject(log).items()
            if path in ids
        }

    def throughput(self) -> Throughput:
        rec = self.recorder
        log = self.placement.log()
        end = time.time()
        th = Throughput(
            judged=len(rec.judged),
            wall_s=end - self.t_start,
            raced_out=rec.raced_out,
            stopped_early=rec.stopped_early,
            benchmarks=sum(1 for span in log if span.kind == Stage.BENCH),
            tokens=self.proposer_thread.tokens(),
        )
        th.gpu_s = gpu_seconds(log)
        if self.placement.gpus:
            th.gpu_busy_s = occupied_seconds(log, self.t_start, end, self.placement.gpus)
        th.gpu_s_by_candidate = self._gpu_seconds_by_candidate(log)
        if rec.first_benchmark_at is not None:
            th.first_benchmark_s = rec.first_benchmark_at - self.t_start
        by_stage: Dict[str, List[float]] = {}
        for span in log:
            by_stage.setdefault(span.kind, []).append(span.end - span.start)
        th.stage_s = {k: statistics.median(v) for k, v in by_stage.items()}
        for name, xs in rec.bench_phases.items():  # where a benchmark's time goes
            if xs:
                th.stage_s[f"bench {name}"] = statistics.median(xs)
        if self.placement.gpus and end - self.t_start > 180:
            th.gpu_busy_fraction = occupied_fraction(log, self.t_start + 180, end, self.placement.gpus)
        return th


def run_loop(
    cfg: RunConfig,
    ledger_path: Optional[str] = None,
    resume: Optional[str] = None,
    events: Optional[RunEvents] = None,
    proposer: Optional[Proposer] = None,
    time_limit_s: Optional[float] = None,
    placement: Optional[LocalPlacement] = None,
    devices: Optional[Devices] = None,
    evaluator: Optional[Evaluator] = None,
    ledger: Optional[Ledger] = None,
    serving_plan: Optional[TargetPlan] = None,
) -> RunSummary:
    """Run (or resume) the loop; returns the run summary. Raises KeyboardInterrupt after marking the run.
    `time_limit_s` on a resume: the time it may take from now (default: what the run had left, and at
    least enough to finish what it left in flight). The collaborators left out are this machine's:
    `ledger` the one at `ledger_path` (opened and closed here; one handed in stays open for its owner),
    `proposer` the one `cfg` names (make_proposer), `devices` the GPUs (devices_for: a cluster
    placement's, else this machine's), `placement` this machine's over them (placement_for), whose tasks
    `evaluator` runs (default: sandboxed children), and `serving_plan` where promotions go (plan_target for
    the run's configuration: a branch, in place, or nowhere without a GPU)."""
    if ledger is None:
        if ledger_path is None:
            raise TypeError("run_loop needs a ledger or the path of one")
        with Ledger(ledger_path) as own:  # opened here, so closed here however the run ends
            given = (cfg, None, resume, events, proposer, time_limit_s, placement, devices, evaluator)
            return run_loop(*given, ledger=own, serving_plan=serving_plan)
    events = events or RunEvents()
    devices = devices or devices_for(placement)
    gpu = devices.available()
    gname = (devices.name() or "cpu") if gpu else "cpu"
    opened = _open_run(ledger, cfg, resume, time_limit_s, gpu, gname, serving_plan)
    run_id = opened.run_id
    events.started(run_id)
    try:
        target = opened.plan.open(run_id, opened.previous)
    except PublishError:
        if not resume:
            ledger.set_run_status(run_id, RunStatus.FAILED)
        raise
    try:
        placement = placement or placement_for(opened.cfg, devices, evaluator)
        # the compile screen saves GPU time; without a GPU its compiles would only cost the sanitizer's cores
        screen_compiler = compiler_of(placement) if gpu else None
        proposer = proposer or make_proposer(opened.cfg, ledger, run_id, screen_compiler)
        loop = Loop(opened.cfg, ledger, run_id, proposer, events, gpu, gname, placement, target)
        return _run_session(loop, opened, resume, time_limit_s)
    except BaseException as e:
        _record_end(ledger, run_id, e)
        raise
    finally:
        _end_target(target, events)  # (a finished or interrupted run has ended it already)


@dataclass
class OpenedRun:
    """A run as this session found it (a resume) or recorded it (a new run), and where its promotions go."""

    cfg: RunConfig
    run_id: str
    finished: bool  # a resumed run that had finished
    elapsed_before: float  # what the earlier sessions took
    progress: RunNotesRecord  # the notes the earlier sessions left
    previous: Optional[TargetInfo]  # the serving target an earlier session recorded
    plan: TargetPlan


def _open_run(
    ledger: Ledger,
    cfg: RunConfig,
    resume: Optional[str],
    time_limit_s: Optional[float],
    gpu: bool,
    gname: str,
    serving_plan: Optional[TargetPlan],
) -> OpenedRun:
    """The run to resume (its own configuration, with `time_limit_s` more from now), else a new one recorded."""
    run = ledger.get_run(resume) if resume else None
    if resume:
        if run is None:
            raise ValueError(f"no run {resume!r} in {ledger.shown}")
        cfg = RunConfig.from_json(run.config)
    # decided before the ledger records a new run, so that a serving target that cannot be used (git
    # missing) is an error that leaves no run behind
    plan = serving_plan or plan_target(in_place=cfg.in_place, writes=gpu)
    if run is not None:  # resuming (a missing run was refused above)
        progress = run.notes
        elapsed_before = float(progress.elapsed_s or 0.0)
        if time_limit_s is not None:
            cfg.time_limit_s = elapsed_before + time_limit_s
        finished = run.status == RunStatus.FINISHED
        return OpenedRun(cfg, run.id, finished, elapsed_before, progress, recorded_target(progress), plan)
    run = ledger.start_run(
        cfg.to_json(),
        versions(),
        cfg.proposer,
        list(cfg.ops),
        gname if gpu else None,
        {"max_candidates": cfg.max_candidates, "time_limit_s": cfg.time_limit_s, "token_budget": cfg.token_budget},
    )
    return OpenedRun(cfg, run.id, False, 0.0, RunNotesRecord(), None, plan)


def _run_session(loop: Loop, opened: OpenedRun, resume: Optional[str], time_limit_s: Optional[float]) -> RunSummary:
    """This session of the run: what it finishes and proposes, until it stops; its record in the ledger."""
    cfg, ledger = loop.cfg, loop.ledger
    targets = targets_for(cfg)
    pending = loop.pending_works(targets) if resume else []
    if resume:
        if opened.finished and not pending:
            raise ValueError(f"run {resume} already finished; nothing to resume")
        ledger.set_run_status(resume, RunStatus.RUNNING, finished=False)
    _announce(loop, targets, pending, resume)
    # the budget counts what this run proposed that no earlier run had judged (replays are free)
    used = sum(1 for p in ledger.proposals(run_id=loop.run_id) if not p.duplicate)
    budget = Budget(cfg, used, opened.elapsed_before)
    left = cfg.time_limit_s - opened.elapsed_before
    if resume and pending and time_limit_s is None:
        left = max(left, FINISH_ALLOWANCE_S)  # finishing what was in flight; nothing new past the budget
    loop.deadline = deadline = time.time() + max(0.0, left)

    notes = RunNotes(list(opened.progress.sessions or []), budget, loop.proposer_thread, loop.target, opened.previous)
    # recorded now, so that `show` names the branch while the run is going and after a kill
    ledger.set_run_status(loop.run_id, RunStatus.RUNNING, finished=False, notes=notes.record())
    stop_reason = _stream_session(loop, targets, budget, pending, notes)
    return _end_session(loop, notes, stop_reason, left, deadline, resume)


def _announce(loop: Loop, targets: Sequence[Target], pending: Sequence[Work], resume: Optional[str]) -> None:
    """The lines that open a session: the run (or what a resume finds), its serving target, its targets by
    share, and where it evaluates."""
    cfg, events, run_id = loop.cfg, loop.events, loop.run_id
    if resume:
        events.note(
            f"resuming run {run_id}: {len(loop.ledger.candidates(run_id=run_id))} candidate(s) already "
            f"recorded" + (f", {len(pending)} to finish" if pending else "")
        )
    else:
        events.note(
            f"run {run_id}: ops {', '.join(cfg.ops)}, proposer {cfg.proposer}, dtype {cfg.dtype}, "
            f"budget {cfg.max_candidates if cfg.max_candidates is not None else 'no cap on'} candidates / "
            f"{cfg.time_limit_s:.0f}s" + ("" if loop.gpu else "; no GPU: candidates are verified, not benchmarked")
        )
    if loop.target.info.mode != NONE:  # (without a GPU the line above already says that nothing is promoted)
        events.note(loop.target.info.describe())
    if cfg.target_model and not resume:
        where = f"the workload {cfg.target_workload.get('trace')}" if cfg.target_workload else cfg.target_points
        events.note(
            f"targets: the decode step of {cfg.target_model.get('name')} at {where}, by "
            f"share: " + ", ".join(f"{t.op} {t.bucket} {t.weight:.0%}" for t in targets)
        )
    events.note(f"evaluating with {describe(loop.placement)}")


def _stream_session(
    loop: Loop, targets: Sequence[Target], budget: Budget, pending: Sequence[Work], notes: RunNotes
) -> Optional[str]:
    """Stream until the session stops; why it stopped. Ctrl-C records the run as interrupted (and raises on);
    however it ends, the placement and the proposer's thread are shut down and the serving target closed."""
    try:
        stop_reason = loop.session_end(loop.stream(targets, budget, pending))
    except KeyboardInterrupt:
        _end_target(loop.target, loop.events)
        loop.ledger.set_run_status(loop.run_id, RunStatus.INTERRUPTED, finished=False, notes=notes.record())
        loop.events.note(f"interrupted: resume with `{loop.events.resume_command(loop.run_id)}`")
        raise
    finally:
        loop.placement.close(wait=False)
        loop.proposer_thread.shutdown()
    _end_target(loop.target, loop.events)
    if loop.recorder.unjudged:
        stop_reason = (
            f"{stop_reason}; " if stop_reason else ""
        ) + f"{loop.recorder.unjudged} candidate(s) left unjudged at the time limit (kept in the ledger)"
    return stop_reason


def _end_session(
    loop: Loop,
    notes: RunNotes,
    stop_reason: Optional[str],
    left: float,
    deadline: float,
    resume: Optional[str],
) -> RunSummary:
    """Record how the session used the machine (`left`: the seconds it had, until `deadline`) and how the run
    ended (failed, else finished); the run's summary with this session's figures."""
    th = loop.throughput()
    session = dict(
        asdict(th),
        resumed=bool(resume),
        n_gpus=len(loop.placement.gpus),
        cpu_slots=loop.placement.cpu_slots,
        time_limit_s=round(max(0.0, left), 1),
        past_limit_s=round(time.time() - deadline, 1),
        unjudged=loop.recorder.unjudged,
        stop=stop_reason,
    )
    ended = RunStatus.FAILED if loop.failure is not None else RunStatus.FINISHED
    loop.ledger.set_run_status(loop.run_id, ended, finished=True, notes=notes.record(session))
    summary = loop.ledger.run_summary(loop.run_id)
    summary.session = RunSession(
        stop_reason,
        loop.gpu_name if loop.gpu else None,
        loop.gpu,
        session,
        th.describe(len(loop.placement.gpus)),
        notes.serving().to_json(),
        notes.serving().outcome(),
    )
    return summary


@dataclass
class RunNotes:
    """A run's notes in the ledger: its progress for a resume, how each session (the run, then each resume) used
    the machine, and where its serving-set changes went."""

    sessions: List[Dict[str, Any]]  # the earlier sessions'
    budget: Budget
    proposer: ProposerThread
    target: ServingTarget
    previous: Optional[TargetInfo]  # the serving target an earlier session recorded

    def serving(self) -> TargetInfo:
        """Where the run's serving-set changes went (a session without a GPU keeps an earlier one's branch)."""
        return self.previous if self.target.info.mode == NONE and self.previous is not None else self.target.info

    def record(self, session: Optional[Dict[str, Any]] = None) -> RunNotesRecord:
        """The notes to store, with this `session`'s record once it has ended."""
        return RunNotesRecord(
            elapsed_s=round(self.budget.elapsed(), 1),
            tokens=self.proposer.tokens(),
            sessions=self.sessions + ([session] if session is not None else []),
            serving=self.serving().to_json(),
            stop=session["stop"] if session is not None else None,
        )


def _record_end(ledger: Ledger, run_id: str, e: BaseException) -> None:
    """Record how a run that ended by an exception ended, unless it already did (Ctrl-C is recorded where it
    is caught): a closed output (`run ... | head`) or a signal as interrupted, anything else as failed, with
    the reason in its notes ('stop'), so that no run stays 'running' for good. A ledger that cannot take the
    record leaves the original error to be reported."""
    try:
        run = ledger.get_run(run_id)
        if run is None or run.status != RunStatus.RUNNING:
            return
        if isinstance(e, BrokenPipeError):
            status, why = RunStatus.INTERRUPTED, "its output was closed (a closed pipe)"
        elif isinstance(e, (KeyboardInterrupt, SystemExit)):
            status, why = RunStatus.INTERRUPTED, f"interrupted ({type(e).__name__})"
        else:
            status, why = RunStatus.FAILED, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        notes = dataclasses.replace(run.notes, stop=why)
        ledger.set_run_status(run_id, status, finished=status == RunStatus.FAILED, notes=notes)
    except Exception:  # noqa: BLE001 - the error that ended the run is the one to report
        pass


def _end_target(target: ServingTarget, events: RunEvents) -> None:
    """Close the serving target. Its commits are already on the branch: a worktree that cannot be removed
    is said, not a reason to fail the run."""
    try:
        target.close()
    except PublishError as e:
        events.note(f"the run's worktree was not removed: {e}")


def compiler_of(placement) -> Optional[Callable[..., CompileProfile]]:
    """What compiles a kernel for the H200 on this machine's CPU: the placement's evaluator's `profile`."""
    return getattr(getattr(placement, "evaluator", None), "profile", None)


def make_proposer(
    cfg: RunConfig, ledger: Ledger, run_id: str, profile: Optional[Callable[..., CompileProfile]] = None
) -> Proposer:
    if cfg.proposer == "model":
        if not cfg.model:
            raise ValueError("the model proposer needs a model endpoint (--model / --base-url or OPENAI_* variables)")
        mc = dict(cfg.model)
        mc.setdefault("api_key", os.environ.get("OPENAI_API_KEY"))

        def on_call(rec: CallRecord) -> int:
            return ledger.record_model_call(
                run_id,
                mc["model"],
                rec.prompt,
                rec.response,
                rec.prompt_tokens,
                rec.completion_tokens,
                rec.latency_s,
                rec.error,
            )

        return ModelProposer(ModelConfig(**mc), on_call=on_call, token_budget=cfg.token_budget)
    return SearchProposer(seed=cfg.seed, screen=Screen(ledger, run_id, profile))

"""The agent loop: propose -> quick sanitize -> full sanitize -> GPU checks and benchmark
(when a GPU is present) -> promotion rule.

Evaluation streams: each candidate moves to its next stage as soon as its current one ends,
and the proposer refills the pipeline as candidates leave it, so the GPU starts on the first
candidate that passed the CPU stages while others are still being sanitized. Where work runs
is the placement's business (agent/placement.py); this module decides what runs next and
records every result. Only this thread touches the ledger, the proposer's state (through
one proposer thread) and the serving set.

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

import collections
import json
import os
import re
import statistics
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

from ..harness import model_step, serving
from ..harness.bench import record_shape_result
from ..harness.compile_probe import CompileProfile
from ..harness.diagnosis import Diagnosis, diagnose_incumbent
from ..harness.dispatch import measured_choices
from ..harness.env import versions
from ..harness.ledger import Candidate, CandidateStatus, Ledger, RunSession, RunStatus, RunSummary, hash_source, row_time
from ..harness.ops import NAMES, get_op
from ..harness.ops.common import Shape
from ..harness.promotion import Judgement, judge_benchmark
from ..sanitizer.canonical import TextRefused, canonical_source
from ..sanitizer.verdict import CheckOutcome, CheckStatus, is_time_limit
from . import ui
from .model import MODEL_CALL_FAILED, CallRecord, ModelConfig, ModelProposer
from .placement import (BenchTask, ClusterDevices, Devices, Evaluator, LocalDevices, LocalPlacement, SanitizeTask, Task,
                        TaskLost, default_jobs, describe, occupied_fraction)
from .proposal import Attempt, Proposal, ProposeContext, Proposer
from .publish import (NONE, PromotionRequest, PublishError, ServingTarget, TargetInfo, TargetPlan, plan_target,
                      publish_choices, publish_promotion, recorded_target)
from .screen import Screen
from .search import SearchProposer, baseline_source
from .throughput import Throughput

ALL_OPS = NAMES  # the op registry, in its order
# Every benchmark already checks the result on the device at each shape it times; the
# full device suite (odd shapes, both dtypes) and compute-sanitizer run before a promotion.
GPU_QUICK_CHECKS = ("determinism",)
GPU_PROMOTION_CHECKS = ("gpu_differential", "gpu_domain", "memcheck", "initcheck", "racecheck")
# What a resumed run may spend finishing the candidates it finds in flight, past the original limit.
FINISH_ALLOWANCE_S = 600.0
# Candidates in flight per GPU (with a GPU the CPU stages are not the bottleneck: the bound keeps the
# queue ahead of the GPUs short, so the proposer's feedback stays fresh and a deadline leaves little unjudged).
PIPELINE_PER_GPU = 6
# Proposals in a row, for one target, that repeat a source already proposed in this session before the
# target counts as exhausted. Replays of what earlier runs judged are free and not counted (there are
# finitely many: the built-in search re-walks its climb and moves on); a proposer repeating itself is stopped.
DUPLICATE_STREAK_LIMIT = 25
# Earlier runs' candidates for a target that a new run's prompts mention.
HISTORY_ATTEMPTS = 8
# Times one stage of one candidate is queued again after the machine running it went away (a cluster
# node died) before the run leaves the candidate at that stage for a resume.
TASK_LOST_RETRIES = 3
# Candidates that passed the sanitizer (and were timed, where a GPU was), and those that were timed.
TIMED = (CandidateStatus.BENCHMARKED, CandidateStatus.PROMOTED)
PASSED_SANITIZER = (CandidateStatus.VERIFIED,) + TIMED
# How long the hard stop waits for killed children to be reaped before the run ends anyway.
STOP_GRACE_S = 8.0
# What a candidate's line says when the time limit, not a verdict, ended its sanitizer stage.
NOT_VERIFIED = "not verified"
# Model calls that failed, with none answered in the session, before the run stops as failed: an endpoint that
# answers every call with an error (a wrong URL, a server that is not the API) would burn the whole budget.
MODEL_FAILURES_LIMIT = 3


@dataclass
class RunConfig:
    ops: List[str] = field(default_factory=lambda: list(ALL_OPS))
    dtype: str = "bfloat16"
    proposer: str = "search"
    model: Optional[Dict[str, Any]] = None  # ModelConfig fields
    max_candidates: Optional[int] = 10  # None: no cap (the time limit is the budget)
    per_round: int = 2  # proposals asked of the proposer at a time for one target
    time_limit_s: float = 1800.0
    token_budget: Optional[int] = None
    jobs: Optional[int] = None  # sanitizer processes (default: the usable cores, less one per GPU)
    seed: int = 0
    margin: float = 0.02
    bench_shapes: str = "serving"
    compute_sanitizer: bool = True
    gpus: Optional[int] = None  # GPUs used for evaluation (default: every visible one)
    candidates_dir: str = os.path.join("kernels", "candidates")
    # a model's decode step (harness.model_step.ModelConfig fields) whose op calls are the targets, each
    # bucket weighted by its share of the step, at these points ('BATCHxCONTEXT,...')
    target_model: Optional[Dict[str, Any]] = None
    target_points: str = "32x8192"
    # a workload's weighted points instead of target_points' equal ones: [kv, batch, context, weight] per point
    # (harness.workload.workload_points), and the trace they came from (`run --workload`)
    target_weights: Optional[List[List[Any]]] = None
    target_workload: Optional[Dict[str, Any]] = None
    # write the serving folder in place even where git tracks it (default: a branch of the run's own)
    in_place: bool = False

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        if d.get("model"):
            d["model"] = {k: v for k, v in d["model"].items() if k != "api_key"}  # never store secrets
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RunConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Target:
    op: str
    bucket: str
    shapes: List[Shape]
    weight: float = 1.0  # the share of proposals it gets (its share of a model's decode step; else equal)


@dataclass(frozen=True)
class Incumbent:
    """What a target's candidates are judged against: the kernel serving its bucket now."""

    label: str  # "baseline", or "serving:<file>" for a promoted kernel
    file: Optional[str]  # None for the baseline
    source: str


@dataclass
class Work:
    """One candidate being evaluated for one target (a source proposed for two buckets is one
    candidate with two works: sanitized once, benchmarked for each)."""

    target: Target
    ctx: ProposeContext
    proposal: Proposal
    cid: int
    path: str
    judgement: Optional[Judgement] = None  # set by the benchmark, read by the promotion checks
    passed: Set[str] = field(default_factory=set)  # sanitizer stages passed ('full', 'gpu')
    rejected: bool = False  # a stage failed: whatever runs beside it is recorded, nothing follows


@dataclass
class RunEvents:
    """Callbacks for progress output (the CLI draws them; tests collect them)."""

    note: Callable[[str], None] = lambda s: None
    candidate: Callable[[str, str, str], None] = lambda label, status, detail: None
    status: Callable[["LiveStatus"], None] = lambda st: None  # about once a second while the run streams


@dataclass
class LiveStatus:
    """Where a streaming run stands: what each stage holds, the budget, and the best gain so far."""

    elapsed_s: float
    time_limit_s: float
    new_candidates: int
    max_candidates: Optional[int]
    running: Dict[str, int]  # stage -> tasks running (quick, full, gpu, bench, promote)
    queued: int  # stages waiting for a slot
    judged: int
    best_gain: Optional[float]  # the best benchmarked gain over the incumbent, as the rule computed it

    def describe(self) -> str:
        budget = f"{self.new_candidates}" + (f"/{self.max_candidates}" if self.max_candidates is not None else "")
        stages = " ".join(f"{k} {self.running.get(k, 0)}" for k in ("quick", "full", "gpu", "bench", "promote")
                          if k in self.running or k in ("quick", "full"))
        best = f"best {self.best_gain:+.1%}" if self.best_gain is not None else "best -"
        return (f"{ui.clock(self.elapsed_s)}/{ui.clock(self.time_limit_s)} cand {budget}; {stages}; queued {self.queued}; "
                f"judged {self.judged}; {best}")


class Budget:
    def __init__(self, cfg: RunConfig, used_candidates: int, elapsed_before: float):
        self.cfg = cfg
        self.used = used_candidates
        self.t0 = time.time() - elapsed_before

    def elapsed(self) -> float:
        return time.time() - self.t0

    def exhausted(self, tokens: int = 0) -> Optional[str]:
        if self.cfg.max_candidates is not None and self.used >= self.cfg.max_candidates:
            return f"candidate budget reached ({self.cfg.max_candidates})"
        if self.elapsed() >= self.cfg.time_limit_s:
            return f"time limit reached ({self.cfg.time_limit_s:.0f}s)"
        if self.cfg.token_budget is not None and tokens >= self.cfg.token_budget:
            return f"token budget reached ({self.cfg.token_budget})"
        return None


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


SHAPE_SUITES = ("serving", "tiny", "near_serving")


def run_shapes(op_name: str, spec: str, ops: Sequence[str]) -> List[Shape]:
    """The shapes a run targets for one op. `spec` is a suite name (serving, near_serving, tiny), or
    explicit shapes 'a,b,c;d,e,f' for a run over one op, or 'op:a,b,c;op:d,e,f' naming the op of
    each shape (ops not named keep their serving shapes). ValueError with a readable message."""
    op = get_op(op_name)
    if spec in SHAPE_SUITES:
        return op.shapes(spec)
    parts = [p.strip() for p in spec.split(";") if p.strip()]
    if not parts:
        raise ValueError(f"no shapes in {spec!r}")
    named = [p for p in parts if re.match(r"^[a-z_0-9]+:", p)]
    if not named:
        if len(ops) > 1:
            raise ValueError(f"explicit shapes for a run over several ops need the op of each shape: "
                             f"'op:a,b,c;op:d,e,f' (e.g. '{ops[0]}:{parts[0]}')")
        return [op.parse_shape(p) for p in parts]
    if len(named) != len(parts):
        raise ValueError(f"name the op of every shape or of none: {spec!r}")
    for p in named:
        if p.split(":", 1)[0] not in ops:
            raise ValueError(f"shape {p!r} names an op this run does not include ({', '.join(ops)})")
    mine = [p.split(":", 1)[1] for p in named if p.split(":", 1)[0] == op_name]
    return [op.parse_shape(p) for p in mine] if mine else op.shapes("serving")


def weighted_pick(weights: Sequence[float], asked: Sequence[int], exhausted: Set[int], start: int) -> Optional[int]:
    """The next target to ask the proposer for: of those not exhausted, the one furthest behind its weight
    (fewest requests per unit of weight), ties in turn from `start`. With equal weights this is
    round-robin; a bucket with twice the share of a model's step gets twice the proposals."""
    n = len(weights)
    live = [i for i in ((start + k) % n for k in range(n)) if i not in exhausted]
    if not live:
        return None
    return min(live, key=lambda j: (asked[j] + 1) / max(weights[j], 1e-9))


def weighted_points(cfg: RunConfig) -> List[Tuple[str, int, int, float]]:
    """(kv, batch, context, weight) of the decode steps a run targets: a workload's weighted points
    (`run --workload`), else every point of `target_points` in both KV modes, all of equal weight."""
    if cfg.target_weights:
        return [(str(kv), int(b), int(c), float(w)) for kv, b, c, w in cfg.target_weights]
    points = model_step.parse_points(cfg.target_points)
    n = len(points) * len(model_step.KV_MODES)
    return [(kv, p.batch, p.context, 1.0 / n) for p in points for kv in model_step.KV_MODES]


def model_targets(cfg: RunConfig) -> List[Target]:
    """The buckets a model's decode step calls at the run's weighted points (`weighted_points`), each
    weighted by its roofline share of the step at each point times the point's weight
    (harness.model_step.step_op_calls), heaviest first; ops outside `cfg.ops` are left out."""
    model = model_step.ModelConfig.from_mapping(cfg.target_model or {})
    shapes: Dict[Tuple[str, str], List[Shape]] = {}
    weight: Dict[Tuple[str, str], float] = collections.defaultdict(float)
    for kv, batch, context, w in weighted_points(cfg):
        for call in model_step.step_op_calls(model, batch, context, kv, cfg.dtype):
            if call.op not in cfg.ops:
                continue
            key = (call.op, call.bucket)
            if call.shape not in shapes.setdefault(key, []):
                shapes[key].append(call.shape)
            weight[key] += call.share * w
    if not shapes:
        raise ValueError(f"the decode step of {model.name} calls none of the ops {', '.join(cfg.ops)}")
    keys = sorted(shapes, key=lambda k: -weight[k])
    return [Target(op, bucket, shapes[(op, bucket)], weight[(op, bucket)]) for op, bucket in keys]


def targets_for(cfg: RunConfig) -> List[Target]:
    if cfg.target_model:
        return model_targets(cfg)
    per_op = []
    for name in cfg.ops:
        op = get_op(name)
        by_bucket: Dict[str, List[Shape]] = {}
        for s in run_shapes(name, cfg.bench_shapes, cfg.ops):
            by_bucket.setdefault(op.bucket(s), []).append(s)
        per_op.append([Target(name, b, shapes) for b, shapes in by_bucket.items()])
    # interleaved across ops (each op's first bucket, then each op's second, ...): a budget that runs
    # out part-way through the targets has still reached every op (the stream asks them in this order)
    return [ts[i] for i in range(max(map(len, per_op), default=0)) for ts in per_op if i < len(ts)]




class Loop:
    def __init__(self, cfg: RunConfig, ledger: Ledger, run_id: str, proposer: Proposer, events: RunEvents,
                 gpu: bool, gpu_name: str, placement: LocalPlacement, target: Optional[ServingTarget] = None):
        self.cfg = cfg
        # the one serving set this run reads and writes (promotions and dispatch choices alike)
        self.target = target or ServingTarget.in_place(serving.serving_dir())
        self.ledger = ledger
        self.run_id = run_id
        self.proposer = proposer
        self.events = events
        self.gpu = gpu
        self.gpu_name = gpu_name
        self.placement = placement
        self.ceilings: Optional[Dict[str, Any]] = None
        self.attempts: Dict[Tuple[str, str], List[Attempt]] = {}
        self.incumbent_ms: Dict[Tuple[str, str], float] = {}
        self.stats = {"proposed": 0, "rejected": 0, "verified": 0, "benchmarked": 0, "promoted": 0,
                      "duplicates": 0, "unusable_replies": 0, "unjudged": 0, "not_verified": 0}
        self.model_calls = {"answered": 0, "failed": 0}  # the proposer's model calls in this session
        self.failure: Optional[str] = None  # why the run cannot go on (it then ends as failed)
        # past the deadline the run stops hard: running children are killed, and their candidates stay
        # in the ledger at the stage they reached (a resume finishes them)
        self.deadline: Optional[float] = None
        # what this run has already recorded (resume): source hash -> candidate id
        self.known = {c.source_hash: c.id for c in ledger.candidates(run_id=run_id)}
        # the proposer's calls, in order, on a thread of their own: a model call never holds the stream
        self._proposer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ka-proposer")
        self.t_start = time.time()
        self.first_benchmark_at: Optional[float] = None
        self.judged: Set[int] = set()
        # each benchmark child's phases: start (sandbox, imports, ceilings), compile, wait for the GPU alone
        self.bench_phases: Dict[str, List[float]] = {"start": [], "compile": [], "wait": []}
        self.raced_out = 0  # benchmarks stopped at a shape the rule refuses on its own
        self.best_gain: Optional[float] = None
        # (op, bucket) -> proposals in a row repeating a source this process already saw (a stuck proposer is stopped)
        self.duplicate_streak: Dict[Tuple[str, str], int] = {}
        self._history_loaded: Set[Tuple[str, str]] = set()
        self.diagnoses: Dict[Tuple[str, str, str], Diagnosis] = {}  # (op, bucket, incumbent hash) -> diagnosis
        self.session_hashes: Set[str] = set()  # sources proposed since this process started
        self.working: Set[Tuple[int, str, str]] = set()  # (candidate, op, bucket) given a work in this process

    # -- incumbents -------------------------------------------------------------------
    def incumbent(self, t: Target) -> Incumbent:
        """What serves the target now in the run's serving set: its promoted kernel, else the baseline."""
        entry = serving.promoted(t.op, t.bucket, self.cfg.dtype, self.gpu_name, dir=self.target.dir)
        if entry:
            try:
                path = serving.entry_path(entry, self.target.dir)
            except serving.ServingError as e:
                # what cannot be served is no incumbent: the climb starts from the baseline, and says why
                self.events.note(f"{t.op} {t.bucket}: {e}")
            else:
                return Incumbent(f"serving:{serving.entry_name(entry)}", str(path), path.read_text(encoding="utf-8"))
        return Incumbent("baseline", None, baseline_source(t.op))

    def _history(self, t: Target) -> List[Attempt]:
        """What earlier runs judged for this target, oldest first (the prompt's 'earlier attempts', so a
        model is told what was tried before this run too)."""
        out = []
        mine = set(self.known.values())
        for c in self.ledger.candidates(op=t.op):
            if c.id in mine or c.status == CandidateStatus.PROPOSED or not c.path or \
                    os.path.basename(os.path.dirname(c.path)) != t.bucket:
                continue
            passed = c.status in PASSED_SANITIZER
            v = c.verdict or {}
            failed = next((x for x in v.get("checks", []) if x.get("status") == CheckStatus.FAILED), None)
            why = (f"{failed['name']}: {failed.get('detail', '')}" if failed else v.get("error") or "rejected") \
                if not passed else c.status
            out.append(Attempt(c.label or f"candidate-{c.id}", passed, f"{why} (an earlier run)"[:300],
                               self._bench_ms(c.id) if c.status in TIMED else None))
        return out[-HISTORY_ATTEMPTS:]

    def context(self, t: Target) -> ProposeContext:
        key = (t.op, t.bucket)
        if key not in self._history_loaded:
            self._history_loaded.add(key)
            self.attempts[key] = self._history(t) + self.attempts.get(key, [])
        inc = self.incumbent(t)
        return ProposeContext(t.op, t.bucket, self.cfg.dtype, t.shapes, inc.source, inc.label,
                              self.incumbent_ms.get((t.op, t.bucket)), self.gpu_name if self.gpu else None,
                              self.ceilings, list(self.attempts.get((t.op, t.bucket), [])),
                              diagnosis=self._diagnosis(t, inc))

    def _diagnosis(self, t: Target, inc: Incumbent) -> Optional[Diagnosis]:
        """What bounds the bucket's incumbent (harness/diagnosis.py), once per incumbent source and run;
        recorded in the ledger. None where the placement's children cannot compile (a test's fakes)."""
        key = (t.op, t.bucket, hash_source(inc.source))
        if key not in self.diagnoses and compiler_of(self.placement) is not None:
            self.diagnoses[key] = diagnose_incumbent(self.ledger, self.run_id, t.op, t.bucket, self.cfg.dtype,
                                                     t.shapes, inc.source, inc.label,
                                                     profile=compiler_of(self.placement))
        return self.diagnoses.get(key)

    # -- the proposer (its own thread; calls keep their order) ----------------------------
    def _feedback(self, ctx: ProposeContext, p: Proposal, passed: bool, ms: Optional[float]) -> None:
        self._proposer_thread.submit(self.proposer.feedback, ctx, p, passed, ms)

    def _incumbent_time(self, ctx: ProposeContext, ms: float) -> None:
        self._proposer_thread.submit(self.proposer.set_incumbent_time, ctx, ms)

    def _tokens(self) -> int:
        return getattr(self.proposer, "tokens_used", 0)

    # -- admission ------------------------------------------------------------------------
    def _admit(self, t: Target, ctx: ProposeContext, p: Proposal, budget: Budget) -> Optional[Work]:
        """Record a proposal; return its work, or None when it needs no evaluation."""
        if p.rejected:
            self._record_unusable(p)
            budget.used += 1
            return None
        try:
            # what is recorded, hashed, judged and promoted is the canonical text (sanitizer/canonical.py); the
            # model's reply as it came stays in its model call
            p.source = canonical_source(p.source)
        except TextRefused:
            pass  # kept as proposed: the judge's static gate refuses it with the reason, and nothing runs it
        h = hash_source(p.source)
        key = (t.op, t.bucket)
        repeat = h in self.session_hashes  # proposed before in this very process: the proposer repeats itself
        self.session_hashes.add(h)
        if h in self.known:  # recorded by this run already (a resume, or a repeat)
            c = self.ledger.candidate(self.known[h])
            # interrupted mid-evaluation, or timed for another bucket only: finish it for this one
            if c is not None and self._needs_work(c, t):
                return self._work(t, ctx, p, c.id, self._write(p, h, t))
            if repeat:
                self.duplicate_streak[key] = self.duplicate_streak.get(key, 0) + 1
            if c is not None and not self._unfinished(c):  # (one still in flight tells its own result)
                self._replay(ctx, p, c.id)
            return None
        existing = self.ledger.find_candidate(p.op, p.source)
        path = self._write(p, h, t)
        replay = existing is not None and not self._needs_work(existing, t)
        cand, new = self.ledger.add_candidate(p.op, p.source, p.proposer, self.run_id, parent_id=p.parent_id,
                                              path=path, label=p.label, replayed=replay)
        self.known[h] = cand.id
        if p.model_call_id:
            self.ledger.link_model_call(p.model_call_id, cand.id)
        if replay:
            # judged by an earlier run: replayed to the proposer, which moves on from it; it costs no budget,
            # so a run over a ledger that holds earlier runs still judges as many new candidates
            self.stats["duplicates"] += 1
            self.events.candidate(p.label, "replayed", f"judged before as candidate #{existing.id} ({existing.status}): "
                                                       f"not judged again")
            self._replay(ctx, p, existing.id)
            return None
        self.duplicate_streak[key] = 0
        budget.used += 1
        self.stats["proposed"] += 1
        return self._work(t, ctx, p, cand.id, path)

    def _count_model_call(self, p: Proposal) -> None:
        """Count the proposer's model calls; with MODEL_FAILURES_LIMIT failed and none answered, the run cannot
        go on (`failure`): the endpoint answers, but not as the API it should be."""
        if p.model_call_id is None and not p.rejected.startswith(MODEL_CALL_FAILED):
            return
        if not p.rejected.startswith(MODEL_CALL_FAILED):
            self.model_calls["answered"] += 1
            return
        self.model_calls["failed"] += 1
        n = self.model_calls["failed"]
        if n >= MODEL_FAILURES_LIMIT and not self.model_calls["answered"] and self.failure is None:
            # "its first n": calls still in flight then may fail too, and print after this line is set
            self.failure = (f"the model endpoint failed on its first {n} calls and answered none, last: "
                            f"{p.rejected[len(MODEL_CALL_FAILED) + 2:][:200]}")

    def _work(self, t: Target, ctx: ProposeContext, p: Proposal, cid: int, path: str) -> Work:
        c = self.ledger.candidate(cid)
        if c is not None:
            self._reopen(c)
        self.working.add((cid, t.op, t.bucket))
        return Work(t, ctx, p, cid, path)

    def _unfinished(self, c: Candidate) -> bool:
        """Whether a recorded candidate still needs evaluating here: never judged, not verified within the
        sanitizer's time limit (slowness is no fault: recorded as rejected by an older version too), or
        verified without a GPU (or before a time limit) and this run has one. Its finished stages are not run
        again."""
        return c.status == CandidateStatus.PROPOSED or self._rejected_for_time(c) or \
            (self.gpu and c.status == CandidateStatus.VERIFIED)

    @staticmethod
    def _rejected_for_time(c: Candidate) -> bool:
        """A candidate an older version recorded as rejected when only the sanitizer's time limit stopped it."""
        return c.status == CandidateStatus.REJECTED and is_time_limit((c.verdict or {}).get("error"))

    def _reopen(self, c: Candidate) -> None:
        """A candidate rejected only for the time limit is judged again: it is 'proposed' until it is."""
        if self._rejected_for_time(c):
            self.ledger.set_candidate_status(c.id, CandidateStatus.PROPOSED, verdict=c.verdict)

    def _needs_work(self, c: Candidate, t: Target) -> bool:
        """Whether candidate `c`, proposed for target `t`, needs a work there that this session has not
        started: it is unfinished, or it was timed (its sanitizer stages are done, and the source is judged
        once) but never at `t`'s shapes, where the benchmark against that bucket's incumbent is still owed."""
        if (c.id, t.op, t.bucket) in self.working:
            return False
        if self._unfinished(c):
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
            if not self._unfinished(c) or not c.path:
                continue
            bucket = os.path.basename(os.path.dirname(c.path))
            t = by_key.get((c.op, bucket)) or next((x for x in targets if x.op == c.op), None)
            if t is None:
                continue
            p = Proposal(c.op, c.source, c.label or f"candidate-{c.id}", c.proposer)
            works.append(self._work(t, self.context(t), p, c.id, self._write(p, c.source_hash, t)))
        return works

    def _write(self, p: Proposal, h: str, t: Target) -> str:
        """kernels/candidates/<run>/<op>/<bucket>/<label>-<hash>.py (the bucket is how a resume finds its target)."""
        d = os.path.join(self.cfg.candidates_dir, self.run_id, p.op, t.bucket)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{p.label}-{h[:8]}.py")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(p.source)
        os.replace(tmp, path)
        return path

    def _record_unusable(self, p: Proposal) -> None:
        body = f"# unusable model reply ({p.label}, model call {p.model_call_id}): {p.rejected}\n"
        cand, _ = self.ledger.add_candidate(p.op, body, p.proposer, self.run_id, label=p.label)
        verdict = {"passed": False, "error": p.rejected, "checks": [{"name": "reply", "status": CheckStatus.FAILED,
                                                                     "passed": False, "detail": p.rejected}]}
        self.ledger.record_checks(cand.id, "quick", [{"name": "reply", "status": CheckStatus.FAILED,
                                                       "detail": p.rejected, "duration_s": 0.0}])
        self.ledger.set_candidate_status(cand.id, CandidateStatus.REJECTED, verdict=verdict)
        if p.model_call_id:
            self.ledger.link_model_call(p.model_call_id, cand.id)
        self.known[hash_source(body)] = cand.id
        self.stats["unusable_replies"] += 1
        self.events.candidate(p.label, CandidateStatus.REJECTED, p.rejected)

    def _replay(self, ctx: ProposeContext, p: Proposal, cid: int) -> None:
        c = self.ledger.candidate(cid)
        if c is None or c.status == CandidateStatus.PROPOSED:
            return
        passed = c.status in PASSED_SANITIZER
        inc_ms = self._bench_ms(cid, incumbent=True)
        if inc_ms is not None:  # what the candidate was measured against, as the live path tells it first
            self._incumbent_time(ctx, inc_ms)
        self._feedback(ctx, p, passed, self._bench_ms(cid))

    def _bench_ms(self, cid: int, incumbent: bool = False) -> Optional[float]:
        """A candidate's recorded benchmark time, mean over its shapes (or the incumbent's, timed beside
        it), read as the live path judged it: graph replays where both had them (`ledger.row_time`)."""
        by_shape: Dict[str, list] = {}
        for b in self.ledger.bench_results(candidate_id=cid):
            if not b.label.startswith("anchor:"):
                by_shape.setdefault(b.shape_key, []).append(b)
        times = [row_time(rows)(b) for rows in by_shape.values() for b in rows
                 if (b.label != "candidate") == incumbent]
        return sum(times) / len(times) if times else None

    # -- the stream -------------------------------------------------------------------------
    def stream(self, targets: Sequence[Target], budget: Budget, works: Sequence[Work] = ()) -> Optional[str]:
        """Evaluate until the budget is spent and nothing is in flight, the proposer has nothing new, or
        the deadline (then everything in flight is stopped). `works`: candidates to finish first (a
        resume). Returns why it stopped."""
        stream = _Stream(self, targets, budget)
        stop = stream.run(works)
        if stream.proposing is None:  # the proposer has taken every piece of feedback in
            self._proposer_thread.submit(lambda: None).result()
        return stop

    def _stage_done(self, cid: int, mode: str, checks: Optional[Sequence[str]]) -> Optional[bool]:
        """A stage this candidate already finished (a resume): True passed, False failed, None not run."""
        done = self._since_time_limit(cid, mode, self.ledger.checks(cid, mode=mode))
        if done and (checks is None or {c.name for c in done} >= set(checks)):
            return all(c.status != CheckStatus.FAILED for c in done)
        return None

    def _since_time_limit(self, cid: int, mode: str, done: List[Any]) -> List[Any]:
        """A stage's recorded checks that count: those after the last time the sanitizer's time limit stopped
        the stage (that judging found nothing; the stage is run again). An older version recorded the check
        the limit stopped as failed, its candidate's verdict naming the limit; this one as not run."""
        c = self.ledger.candidate(cid)
        verdict = (c.verdict or {}) if c is not None else {}
        old_style = is_time_limit(verdict.get("error")) and verdict.get("mode") == mode
        # (by the judge's words only: a failed check's detail may quote the candidate's own messages)
        stopped = [k for k in done if (k.status == CheckStatus.SKIPPED and is_time_limit(k.detail))
                   or (old_style and k.status == CheckStatus.FAILED)]
        if not stopped:
            return done
        last = max(k.created_at for k in stopped)
        return [k for k in done if k.created_at > last]

    def _record_verdict(self, works: Sequence[Work], mode: str, v) -> bool:
        """Record one sanitizer stage's verdict for a candidate (its works share it); True when it passed."""
        cid = works[0].cid
        if not v.passed and is_time_limit(v.error):
            return self._not_verified(works, mode, v)
        self.ledger.record_checks(cid, mode, [asdict(c) for c in v.checks])
        if v.passed:
            if mode == "full":
                self.ledger.set_candidate_status(cid, CandidateStatus.VERIFIED, verdict=v.to_json(),
                                                 fpsan_equivalent=v.fpsan_equivalent)
            return True
        self.ledger.set_candidate_status(cid, CandidateStatus.REJECTED, verdict=v.to_json())
        self.stats["rejected"] += 1
        self.judged.add(cid)
        self.events.candidate(works[0].proposal.label, CandidateStatus.REJECTED, f"{works[0].target.op} {mode}: {v.summary()}")
        for w in works:
            self.attempts.setdefault((w.target.op, w.target.bucket), []).append(
                Attempt(w.proposal.label, False, v.summary()))
            self._feedback(w.ctx, w.proposal, False, None)
        return False

    def _not_verified(self, works: Sequence[Work], mode: str, v) -> bool:
        """The time limit stopped a sanitizer stage: not a verdict. The candidate stays where it was (proposed,
        or verified), the check the limit stopped is recorded as not run, with the limit's words, and a later
        run or `--resume` judges it again. Returns False: nothing follows in this session."""
        cid, w0 = works[0].cid, works[0]
        checks = [CheckOutcome(k.name, CheckStatus.SKIPPED, v.error if not is_time_limit(k.detail) else k.detail,
                               k.duration_s) if k.status == CheckStatus.FAILED else k for k in v.checks]
        self.ledger.record_checks(cid, mode, [asdict(k) for k in checks])
        c = self.ledger.candidate(cid)
        if c is not None and c.status == CandidateStatus.PROPOSED:  # (a verified one keeps its full verdict)
            self.ledger.set_candidate_status(cid, CandidateStatus.PROPOSED, verdict=v.to_json())
        self.stats["not_verified"] += 1
        self.events.candidate(w0.proposal.label, NOT_VERIFIED,
                              f"{w0.target.op} {mode}: {v.error}; judged again by a later run or "
                              f"`kernel-agent run --resume {self.run_id}`")
        for w in works:
            self._feedback(w.ctx, w.proposal, False, None)  # the proposer moves on; the ledger keeps it open
        return False

    def _verified_without_gpu(self, works: Sequence[Work]) -> None:
        w0 = works[0]
        self.stats["verified"] += 1
        c = self.ledger.candidate(w0.cid)
        eq = {True: "FpSan-equivalent", False: "not structurally equivalent", None: "FpSan undecided"}[
            c.fpsan_equivalent if c else None]
        self.events.candidate(w0.proposal.label, CandidateStatus.VERIFIED,
                              f"{w0.target.op}: passed the full sanitizer ({eq}); not benchmarked: no GPU")
        for w in works:
            self.attempts.setdefault((w.target.op, w.target.bucket), []).append(
                Attempt(w.proposal.label, True, "verified, not benchmarked"))
            self._feedback(w.ctx, w.proposal, True, None)

    def _bench_task(self, w: Work) -> BenchTask:
        inc_file = self.incumbent(w.target).file
        return BenchTask({"op": w.target.op, "shapes": [s.key() for s in w.target.shapes], "dtype": self.cfg.dtype,
                          "seed": 0, "race": True,
                          "kernels": [{"label": "incumbent", "file": inc_file}, {"label": "candidate", "file": w.path}]})

    def _record_benchmark(self, w: Work, task: BenchTask, doc: Dict[str, Any]) -> bool:
        """Record a benchmark and apply the rule; True when the candidate should be promoted (after the
        promotion checks)."""
        t, p, cid = w.target, w.proposal, w.cid
        inc_file = task.spec["kernels"][0]["file"]
        inc_label = "baseline" if inc_file is None else f"serving:{os.path.basename(inc_file)}"
        if doc.get("ceilings"):
            self.ceilings = doc["ceilings"]
        phases = doc.get("phases") if isinstance(doc.get("phases"), dict) else {}
        for name, key in (("start", "start_s"), ("compile", "prepare_s"), ("wait", "wait_s")):
            if isinstance(phases.get(key), (int, float)):
                self.bench_phases[name].append(float(phases[key]))
        if doc.get("raced_out"):
            self.raced_out += 1
        inc_source = baseline_source(t.op) if inc_file is None else _read_text(inc_file)
        inc_hash = hash_source(inc_source) if inc_source is not None else None
        for res in doc.get("results", []):
            record_shape_result(self.ledger, self.run_id, res, cid, inc_label, inc_hash)
        self._choose_serving(t)
        j = judge_benchmark(doc, [s.key() for s in t.shapes], self.cfg.margin)
        self.judged.add(cid)
        if j.error:
            self.ledger.set_candidate_status(cid, CandidateStatus.REJECTED, verdict={"passed": False, "error": j.error})
            self.stats["rejected"] += 1
            self.events.candidate(p.label, CandidateStatus.REJECTED, f"benchmark: {j.error}")
            self._feedback(w.ctx, p, False, None)
            return False
        if self.first_benchmark_at is None:
            self.first_benchmark_at = time.time()
        if self.ledger.candidate(cid).status != CandidateStatus.PROMOTED:  # serving another bucket: it stays so
            self.ledger.set_candidate_status(cid, CandidateStatus.BENCHMARKED)
        self.stats["benchmarked"] += 1
        decision = j.decision
        if decision.gain == decision.gain and (self.best_gain is None or decision.gain > self.best_gain):
            self.best_gain = decision.gain  # (NaN for a refusal that has no gain)
        if len(j.pairs) == len(t.shapes):
            self.incumbent_ms[(t.op, t.bucket)] = j.incumbent_ms
            self._incumbent_time(w.ctx, j.incumbent_ms)
            self._feedback(w.ctx, p, True, j.candidate_ms)
        else:  # raced out after some shapes: a mean over fewer shapes compares with nothing else
            self._feedback(w.ctx, p, True, None)
        self.attempts.setdefault((t.op, t.bucket), []).append(
            Attempt(p.label, True, decision.reason, j.candidate_ms, j.fraction_of_ceiling))
        if not decision.promote:
            self.events.candidate(p.label, CandidateStatus.BENCHMARKED, decision.reason)
            return False
        w.judgement = j
        return True

    def _choose_serving(self, t: Target) -> None:
        """Every benchmark times the incumbent beside torch: where torch serves the op's contract, the faster
        of the two serves the bucket from now on (harness.dispatch)."""
        if not get_op(t.op).torch_label:
            return
        choices = measured_choices(self.ledger, ops=[t.op], bucket=t.bucket, dtype=self.cfg.dtype, gpu=self.gpu_name,
                                   dir=self.target.dir)
        for c, entry in publish_choices(self.target, self.ledger, choices):
            if entry is not None and entry.get("measured_at"):
                self.events.note(f"{t.op} {t.bucket}: {c.reason}; it serves the bucket")

    def _record_promotion_checks(self, w: Work, v) -> bool:
        """compute-sanitizer memcheck / initcheck / racecheck (and the device suite) before a kernel enters
        the serving set; True when they passed."""
        self.ledger.record_checks(w.cid, "gpu", [asdict(c) for c in v.checks if c.name in GPU_PROMOTION_CHECKS])
        if not v.passed:
            self.ledger.set_candidate_status(w.cid, CandidateStatus.REJECTED, verdict=v.to_json())
            self.events.candidate(w.proposal.label, CandidateStatus.BENCHMARKED,
                                  f"faster, but not promoted: {v.summary()}")
            return False
        return True

    def _promote(self, w: Work) -> None:
        t, p, j = w.target, w.proposal, w.judgement
        with open(w.path) as f:
            source = f.read()
        done = publish_promotion(self.target, self.ledger, PromotionRequest(
            self.run_id, t.op, t.bucket, self.cfg.dtype, self.gpu_name, w.cid, p.label, source, j, self.cfg.margin,
            versions()))
        self.stats["promoted"] += 1
        self.incumbent_ms[(t.op, t.bucket)] = j.candidate_ms
        where = f" ({self.target.info.branch} {done.commit[:10]})" if done.commit else ""
        self.events.candidate(p.label, CandidateStatus.PROMOTED,
                              f"{done.reason} -> {serving.describe_entry(done.entry)}{where}")

    def throughput(self) -> Throughput:
        log = self.placement.log()
        end = time.time()
        th = Throughput(judged=len(self.judged), wall_s=end - self.t_start, raced_out=self.raced_out,
                        benchmarks=sum(1 for span in log if span.kind == "bench"))
        if self.first_benchmark_at is not None:
            th.first_benchmark_s = self.first_benchmark_at - self.t_start
        by_stage: Dict[str, List[float]] = {}
        for span in log:
            by_stage.setdefault(span.kind, []).append(span.end - span.start)
        th.stage_s = {k: statistics.median(v) for k, v in by_stage.items()}
        for name, xs in self.bench_phases.items():  # where a benchmark's time goes
            if xs:
                th.stage_s[f"bench {name}"] = statistics.median(xs)
        if self.placement.gpus and end - self.t_start > 180:
            th.gpu_busy_fraction = occupied_fraction(log, self.t_start + 180, end, self.placement.gpus)
        return th


@dataclass(frozen=True, eq=False)
class Queued:
    """A stage of one candidate waiting for a slot. A sanitizer stage (quick, full, gpu) is judged once for
    all the works that share the candidate (_Stream.sharing holds them); a benchmark or the promotion checks
    (bench, promote) hold the one work they are for. Compared by identity: each is one place in a queue."""

    stage: str
    work: Work


@dataclass(frozen=True, eq=False)
class Started:
    """A stage handed to the placement: what was queued, and the task that runs it."""

    queued: Queued
    task: Task

    @property
    def stage(self) -> str:
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
GPU_STAGE_ORDER = {"promote": 0, "bench": 1, "gpu": 2}


class _Stream:
    """One streaming evaluation: the scheduler's state (what waits for which resource, what runs)."""

    def __init__(self, loop: Loop, targets: Sequence[Target], budget: Budget):
        self.loop, self.targets, self.budget = loop, list(targets), budget
        self.placement = loop.placement
        self.gpu = loop.gpu and bool(self.placement.gpus)
        self.cpu_queue: Deque[Queued] = collections.deque()  # quick, full
        self.gpu_queue: Deque[Queued] = collections.deque()  # gpu, bench, promote
        self.running: Dict[Future, Started] = {}
        self.sharing: Dict[Tuple[int, str], List[Work]] = {}  # (cid, mode) in queue or running -> its works
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
        self.lost: Dict[Tuple[int, str], int] = {}  # (cid, stage) -> times its task was lost with its machine

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
        self._sanitize_stage(w, "quick")

    def _sanitize_stage(self, w: Work, mode: str) -> None:
        if w.rejected:
            return
        checks = GPU_QUICK_CHECKS if mode == "gpu" else None
        done = self.loop._stage_done(w.cid, mode, checks)
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
        if mode == "gpu":
            self.gpu_queue.append(Queued("gpu", w))
        else:
            self.cpu_queue.append(Queued(mode, w))

    def _after_sanitize(self, w: Work, mode: str) -> None:
        """The next stage of a candidate that passed `mode`. After the quick stage the full sanitizer (CPU)
        and the GPU checks run side by side, so the GPU starts on a candidate a stage earlier; the
        benchmark waits for both."""
        if w.rejected:
            return
        if mode == "quick":
            if self.gpu:
                self._sanitize_stage(w, "gpu")
            return self._sanitize_stage(w, "full")
        w.passed.add(mode)
        if not self.gpu:
            self.loop._verified_without_gpu([w])
            self.loop.judged.add(w.cid)
            return self._leave(w)
        if {"full", "gpu"} <= w.passed:
            self.gpu_queue.append(Queued("bench", w))

    def _leave(self, w: Work) -> None:
        self.in_pipeline -= 1
        self.exhausted.discard(self.targets.index(w.target) if w.target in self.targets else -1)

    def _gpu_task(self, stage: str, w: Work):
        if stage == "gpu":
            return SanitizeTask(w.path, w.target.op, "gpu", GPU_QUICK_CHECKS, gated=True)
        if stage == "bench":
            return self.loop._bench_task(w)
        return SanitizeTask(w.path, w.target.op, "gpu", GPU_PROMOTION_CHECKS, stage="promote", gated=True)

    def _start(self) -> None:
        """Hand queued stages to free slots: GPU work first (the scarce resource), promotion checks before
        benchmarks before GPU checks; then the CPU's."""
        # An ungated benchmark waiting for its GPU: let the shared tasks drain (a gated one starts in a
        # shared slot, and the placement drains the GPU for its timing).
        held = False
        for item in sorted(self.gpu_queue, key=lambda q: GPU_STAGE_ORDER[q.stage]):
            w = item.work
            key = (w.target.op, w.target.bucket)
            if item.stage == "bench" and key in self.busy_targets:
                continue  # judged against the incumbent the running one may replace: after it
            task = self._gpu_task(item.stage, w)
            if held and not task.exclusive:
                break
            if not self.placement.can_start(task):
                held = held or (task.exclusive and not task.gated)
                continue
            self.gpu_queue.remove(item)
            if item.stage == "bench":
                self.busy_targets.add(key)
            self.running[self.placement.submit(task)] = Started(item, task)
        while self.cpu_queue and self.placement.running("cpu") < self.placement.cpu_slots:
            item = self.cpu_queue.popleft()
            task = SanitizeTask(item.work.path, item.work.target.op, item.stage)
            self.running[self.placement.submit(task)] = Started(item, task)

    def _propose(self) -> None:
        lp, budget = self.loop, self.budget
        if self.proposing is not None or budget.exhausted(lp._tokens()) or not self._want_more():
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
        self.proposing = lp._proposer_thread.submit(lp.proposer.propose, ctx, n)

    def _pick(self) -> Optional[int]:
        i = weighted_pick([t.weight for t in self.targets], self.asked, self.exhausted, self.next_target)
        if i is not None:
            self.asked[i] += 1
            self.next_target = (i + 1) % len(self.targets)
        return i

    def _proposed(self, proposals: List[Proposal]) -> None:
        lp = self.loop
        asked = self.proposing_for
        t, ctx, i = asked.target, asked.ctx, asked.index
        self.proposing, self.proposing_for = None, None
        if not proposals:
            self._exhaust(i, "search space exhausted" if lp.proposer.name == "search" else
                          "the proposer has nothing new")
            return
        for p in proposals:
            lp._count_model_call(p)
            w = lp._admit(t, ctx, p, self.budget)
            if w is not None:
                self._enter(w)
        if lp.duplicate_streak.get((t.op, t.bucket), 0) >= DUPLICATE_STREAK_LIMIT:
            self._exhaust(i, f"the proposer repeated sources it had proposed {DUPLICATE_STREAK_LIMIT} times in a row")

    def _exhaust(self, i: int, why: str) -> None:
        """No more proposals for target `i` (until one of its candidates gives the proposer new feedback)."""
        self.exhausted.add(i)
        t = self.targets[i]
        if any(w.target == t for w in self._unjudged()):
            return  # its candidates in flight may still move the climb: not exhausted for good yet
        if (t.op, t.bucket) not in self.noted_exhausted:
            self.noted_exhausted.add((t.op, t.bucket))
            self.loop.events.note(f"{why} for {t.op} {t.bucket}")

    def _finished(self, fut: Future) -> None:
        lp = self.loop
        started = self.running.pop(fut)
        stage, w = started.stage, started.work
        result = fut.result()
        if isinstance(result, TaskLost):  # not a result about the candidate: run the stage again
            return self._requeue(started.queued, result.reason)
        if stage in ("quick", "full", "gpu"):
            works = self.sharing.pop((w.cid, stage))
            live = [w for w in works if not w.rejected]
            if not live:  # rejected by the stage that ran beside this one: its checks are kept, nothing more
                lp.ledger.record_checks(works[0].cid, stage, [asdict(c) for c in result.checks])
                return
            if lp._record_verdict(live, stage, result):
                for w in live:
                    self._after_sanitize(w, stage)
            else:
                for w in live:
                    w.rejected = True
                    self._leave(w)
            return
        key = (w.target.op, w.target.bucket)
        if stage == "bench":
            if lp._record_benchmark(w, started.task, result):
                if lp.cfg.compute_sanitizer:
                    self.gpu_queue.appendleft(Queued("promote", w))  # the target stays busy until it is decided
                    return
                lp._promote(w)
        elif stage == "promote" and lp._record_promotion_checks(w, result):
            lp._promote(w)
        self.busy_targets.discard(key)
        self._leave(w)

    def _requeue(self, item: Queued, reason: str) -> None:
        """A stage whose task was lost with its machine goes back to the front of its queue (nothing was
        recorded for it); after TASK_LOST_RETRIES losses the candidate is left at the stage it reached,
        unjudged, for a resume."""
        lp = self.loop
        stage, w0 = item.stage, item.work
        key = (w0.cid, stage)
        sanitizer = stage in ("quick", "full", "gpu")
        sharing = self.sharing.get(key, [w0]) if sanitizer else [w0]
        n = self.lost[key] = self.lost.get(key, 0) + 1
        if all(w.rejected for w in sharing):  # rejected meanwhile by the stage beside it: nothing to redo
            self.sharing.pop(key, None)
            return
        if n > TASK_LOST_RETRIES:
            if sanitizer:
                self.sharing.pop(key, None)
            self.busy_targets.discard((w0.target.op, w0.target.bucket))
            lp.stats["unjudged"] += 1
            lp.events.note(f"{w0.proposal.label} {stage}: {reason}, {n} times: left at that stage; "
                           f"`kernel-agent run --resume {lp.run_id}` finishes it")
            for w in sharing:
                if not w.rejected:
                    w.rejected = True  # nothing more runs for it in this session (a stage beside it only records)
                    self._leave(w)
            return
        lp.events.note(f"{w0.proposal.label} {stage}: {reason}; queued again")
        if stage in ("quick", "full"):
            self.cpu_queue.appendleft(item)
            return
        if stage == "bench":  # started again when its target is free, as any benchmark
            self.busy_targets.discard((w0.target.op, w0.target.bucket))
        self.gpu_queue.appendleft(item)

    def _status(self) -> None:
        now = time.time()
        if now - self.last_status < 1.0:
            return
        self.last_status = now
        lp = self.loop
        running: Dict[str, int] = {}
        for started in self.running.values():
            running[started.stage] = running.get(started.stage, 0) + 1
        lp.events.status(LiveStatus(self.budget.elapsed(), lp.cfg.time_limit_s, self.budget.used, lp.cfg.max_candidates,
                                   running, len(self.cpu_queue) + len(self.gpu_queue), len(lp.judged), lp.best_gain))

    def _unjudged(self) -> List[Work]:
        works: Dict[int, Work] = {}
        for item in [started.queued for started in self.running.values()] + list(self.cpu_queue) + list(self.gpu_queue):
            works.setdefault(item.work.cid, item.work)
        for ws in self.sharing.values():
            for w in ws:
                works.setdefault(w.cid, w)
        return list(works.values())

    def _hard_stop(self, why: str = "time limit reached") -> None:
        lp = self.loop
        left = self._unjudged()
        self.placement.stop()
        if self.running:  # killed children return at once; their results are not verdicts
            wait(list(self.running), timeout=STOP_GRACE_S)
        self.running.clear()
        if left:
            lp.stats["unjudged"] += len(left)
            lp.events.note(f"{why}: stopped {len(left)} candidate(s) in flight "
                           f"({', '.join(w.proposal.label for w in left[:4])}{', ...' if len(left) > 4 else ''}); "
                           f"they stay at the stage they reached: `kernel-agent run --resume {lp.run_id}` finishes "
                           f"them")

    def run(self, works: Sequence[Work]) -> Optional[str]:
        lp = self.loop
        for w in works:
            self._enter(w)
        try:
            while True:
                if lp.deadline is not None and time.time() >= lp.deadline:
                    self._hard_stop()
                    return f"time limit reached ({lp.cfg.time_limit_s:.0f}s)"
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
                    stop = self.budget.exhausted(lp._tokens())
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


# long: a run's setup, streaming session and summary in order
def run_loop(cfg: RunConfig, ledger_path: Optional[str] = None, resume: Optional[str] = None,
             events: Optional[RunEvents] = None, proposer: Optional[Proposer] = None,
             time_limit_s: Optional[float] = None, placement: Optional[LocalPlacement] = None,
             devices: Optional[Devices] = None, evaluator: Optional[Evaluator] = None,
             ledger: Optional[Ledger] = None, serving_plan: Optional[TargetPlan] = None) -> RunSummary:
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
            return run_loop(cfg, None, resume, events, proposer, time_limit_s, placement, devices, evaluator,
                            ledger=own, serving_plan=serving_plan)
    events = events or RunEvents()
    devices = devices or devices_for(placement)
    gpu = devices.available()
    gname = (devices.name() or "cpu") if gpu else "cpu"
    previous: Optional[TargetInfo] = None
    run = ledger.get_run(resume) if resume else None
    if resume:
        if run is None:
            raise ValueError(f"no run {resume!r} in {ledger.shown}")
        cfg = RunConfig.from_json(run.config)
    # decided before the ledger records a new run, so that a serving target that cannot be used (git
    # missing) is an error that leaves no run behind
    plan = serving_plan or plan_target(in_place=cfg.in_place, writes=gpu)
    if resume:
        progress = json.loads(run.notes) if run.notes and run.notes.startswith("{") else {}
        elapsed_before = float(progress.get("elapsed_s", 0.0))
        if time_limit_s is not None:
            cfg.time_limit_s = elapsed_before + time_limit_s
        run_id = resume
        previous = recorded_target(progress)
    else:
        run = ledger.start_run(cfg.to_json(), versions(), cfg.proposer, list(cfg.ops), gname if gpu else None,
                               {"max_candidates": cfg.max_candidates, "time_limit_s": cfg.time_limit_s,
                                "token_budget": cfg.token_budget})
        run_id = run.id
        elapsed_before = 0.0
        progress = {}
    try:
        target = plan.open(run_id, previous)
    except PublishError:
        if not resume:
            ledger.set_run_status(run_id, RunStatus.FAILED)
        raise
    try:
        placement = placement or placement_for(cfg, devices, evaluator)
        # the compile screen saves GPU time; without a GPU its compiles would only cost the sanitizer's cores
        screen_compiler = compiler_of(placement) if gpu else None
        loop = Loop(cfg, ledger, run_id, proposer or make_proposer(cfg, ledger, run_id, screen_compiler),
                    events, gpu, gname, placement, target)
        targets = targets_for(cfg)
        pending = loop.pending_works(targets) if resume else []
        if resume:
            if run.status == RunStatus.FINISHED and not pending:
                raise ValueError(f"run {resume} already finished; nothing to resume")
            ledger.set_run_status(resume, RunStatus.RUNNING, finished=False)
            events.note(f"resuming run {run_id}: {len(ledger.candidates(run_id=run_id))} candidate(s) already "
                        f"recorded" + (f", {len(pending)} to finish" if pending else ""))
        else:
            events.note(f"run {run_id}: ops {', '.join(cfg.ops)}, proposer {cfg.proposer}, dtype {cfg.dtype}, "
                        f"budget {cfg.max_candidates if cfg.max_candidates is not None else 'no cap on'} candidates / "
                        f"{cfg.time_limit_s:.0f}s"
                        + ("" if gpu else "; no GPU: candidates are verified, not benchmarked"))
        if target.info.mode != NONE:  # (without a GPU the line above already says that nothing is promoted)
            events.note(target.info.describe())
        if cfg.target_model and not resume:
            where = (f"the workload {cfg.target_workload.get('trace')}" if cfg.target_workload
                     else cfg.target_points)
            events.note(f"targets: the decode step of {cfg.target_model.get('name')} at {where}, by "
                        f"share: " + ", ".join(f"{t.op} {t.bucket} {t.weight:.0%}" for t in targets))
        events.note(f"evaluating with {describe(loop.placement)}")
        # the budget counts what this run proposed that no earlier run had judged (replays are free)
        budget = Budget(cfg, sum(1 for p in ledger.proposals(run_id=run_id) if not p.duplicate), elapsed_before)
        left = cfg.time_limit_s - elapsed_before
        if resume and pending and time_limit_s is None:
            left = max(left, FINISH_ALLOWANCE_S)  # finishing what was in flight; nothing new past the budget
        loop.deadline = time.time() + max(0.0, left)

        sessions: List[Dict[str, Any]] = list(progress.get("sessions", []))

        def serving_record() -> TargetInfo:
            """Where the run's serving-set changes went (a session without a GPU keeps an earlier one's branch)."""
            return previous if target.info.mode == NONE and previous is not None else target.info

        def notes(session: Optional[Dict[str, Any]] = None) -> str:
            """The run's progress for a resume, how each session (the run, then each resume) used the machine,
            and its serving target."""
            d = {"elapsed_s": round(budget.elapsed(), 1), "tokens": loop._tokens(), "sessions": sessions,
                 "serving": serving_record().to_json()}
            if session is not None:
                d["stop"] = session["stop"]
                d["sessions"] = sessions + [session]
            return json.dumps(d)

        # recorded now, so that `show` names the branch while the run is going and after a kill
        ledger.set_run_status(run_id, RunStatus.RUNNING, finished=False, notes=notes())
        try:
            stop_reason = loop.stream(targets, budget, pending)
        except KeyboardInterrupt:
            _end_target(target, events)
            ledger.set_run_status(run_id, RunStatus.INTERRUPTED, finished=False, notes=notes())
            events.note(f"interrupted: resume with `kernel-agent run --resume {run_id}`")
            raise
        finally:
            loop.placement.close(wait=False)
            loop._proposer_thread.shutdown(wait=False, cancel_futures=True)
        _end_target(target, events)
        if loop.stats["unjudged"]:
            stop_reason = (f"{stop_reason}; " if stop_reason else "") + \
                f"{loop.stats['unjudged']} candidate(s) left unjudged at the time limit (kept in the ledger)"
        th = loop.throughput()
        session = dict(asdict(th), resumed=bool(resume), n_gpus=len(loop.placement.gpus),
                       cpu_slots=loop.placement.cpu_slots, time_limit_s=round(max(0.0, left), 1),
                       past_limit_s=round(time.time() - loop.deadline, 1), unjudged=loop.stats["unjudged"],
                       stop=stop_reason)
        ended = RunStatus.FAILED if loop.failure is not None else RunStatus.FINISHED
        ledger.set_run_status(run_id, ended, finished=True, notes=notes(session))
        summary = ledger.run_summary(run_id)
        summary.session = RunSession(stop_reason, gname if gpu else None, gpu, session,
                                     th.describe(len(loop.placement.gpus)), serving_record().to_json(),
                                     serving_record().outcome())
        return summary
    except BaseException as e:
        _record_end(ledger, run_id, e)
        raise
    finally:
        _end_target(target, events)  # (a finished or interrupted run has ended it already)


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
        notes = json.loads(run.notes) if (run.notes or "").startswith("{") else {}
        notes["stop"] = why
        ledger.set_run_status(run_id, status, finished=status == RunStatus.FAILED, notes=json.dumps(notes))
    except Exception:  # noqa: BLE001 - the error that ended the run is the one to report
        pass


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


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


def make_proposer(cfg: RunConfig, ledger: Ledger, run_id: str,
                  profile: Optional[Callable[..., CompileProfile]] = None) -> Proposer:
    if cfg.proposer == "model":
        if not cfg.model:
            raise ValueError("the model proposer needs a model endpoint (--model / --base-url or OPENAI_* variables)")
        mc = dict(cfg.model)
        mc.setdefault("api_key", os.environ.get("OPENAI_API_KEY"))

        def on_call(rec: CallRecord) -> int:
            return ledger.record_model_call(run_id, mc["model"], rec.prompt, rec.response, rec.prompt_tokens,
                                            rec.completion_tokens, rec.latency_s, rec.error)
        return ModelProposer(ModelConfig(**mc), on_call=on_call, token_budget=cfg.token_budget)
    return SearchProposer(seed=cfg.seed, screen=Screen(ledger, run_id, profile))

"""The agent loop (DESIGN.md section 5): propose -> quick sanitize -> full sanitize ->
GPU checks and benchmark (when a GPU is present) -> promotion rule.

Every step is one ledger transaction, so a run killed at any moment (Ctrl-C or kill -9)
loses at most the step in flight, and `--resume RUN` continues it: candidates already
recorded in the run are not proposed, evaluated or counted twice (a deterministic
proposer regenerates the same sequence and the loop replays the recorded outcomes to it),
and a candidate interrupted half-way resumes at the first stage it has no result for.
Candidate files are written to kernels/candidates/<run>/<op>/<bucket>/.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..harness import serving
from ..harness.env import versions
from ..harness.ledger import Ledger, hash_source
from ..harness.ops import get_op
from ..harness.ops.common import Shape
from ..harness.promotion import judge_benchmark
from .proposal import Attempt, Proposal, ProposeContext, Proposer

ALL_OPS = ("matmul", "attention", "decode_attention", "quantize_kv", "decode_attention_int8")
# Every benchmark already checks the result on the device at each shape it times; the
# full device suite (odd shapes, both dtypes) and compute-sanitizer run before a promotion.
GPU_QUICK_CHECKS = ("determinism",)
GPU_PROMOTION_CHECKS = ("gpu_differential", "memcheck", "initcheck", "racecheck")


@dataclass
class RunConfig:
    ops: List[str] = field(default_factory=lambda: list(ALL_OPS))
    dtype: str = "bfloat16"
    proposer: str = "search"
    model: Optional[Dict[str, Any]] = None  # ModelConfig fields
    max_candidates: int = 10
    per_round: int = 2
    time_limit_s: float = 1800.0
    token_budget: Optional[int] = None
    jobs: int = 2
    seed: int = 0
    margin: float = 0.02
    bench_shapes: str = "serving"
    compute_sanitizer: bool = True
    gpus: Optional[int] = None  # GPUs used for evaluation (default: every visible one)
    candidates_dir: str = os.path.join("kernels", "candidates")

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


@dataclass
class RunEvents:
    """Callbacks for progress output (the CLI draws them; tests collect them)."""

    note: Callable[[str], None] = lambda s: None
    candidate: Callable[[str, str, str], None] = lambda label, status, detail: None


def _serialized(events: RunEvents) -> RunEvents:
    """The same callbacks, one at a time (the GPU stage reports from several threads)."""
    lock = threading.Lock()

    def locked(fn):
        def call(*args):
            with lock:
                fn(*args)
        return call
    return RunEvents(note=locked(events.note), candidate=locked(events.candidate))


class Budget:
    def __init__(self, cfg: RunConfig, used_candidates: int, elapsed_before: float):
        self.cfg = cfg
        self.used = used_candidates
        self.t0 = time.time() - elapsed_before

    def elapsed(self) -> float:
        return time.time() - self.t0

    def exhausted(self, tokens: int = 0) -> Optional[str]:
        if self.used >= self.cfg.max_candidates:
            return f"candidate budget reached ({self.cfg.max_candidates})"
        if self.elapsed() >= self.cfg.time_limit_s:
            return f"time limit reached ({self.cfg.time_limit_s:.0f}s)"
        if self.cfg.token_budget is not None and tokens >= self.cfg.token_budget:
            return f"token budget reached ({self.cfg.token_budget})"
        return None


def gpu_available() -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    import torch
    return torch.cuda.is_available()


def visible_gpus(limit: Optional[int] = None) -> List[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (at most `limit`)."""
    import torch
    n = torch.cuda.device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in env.split(",") if x.strip()][:n] if env else [str(i) for i in range(n)]
    return ids[:limit] if limit else ids


class DevicePool:
    """Lends one GPU at a time to each evaluation child: `with pool.lease() as env:` gives an
    environment whose CUDA_VISIBLE_DEVICES names a GPU no other lease holds. Why one GPU per
    child: timings of two kernels sharing a GPU would measure each other."""

    def __init__(self, devices: Sequence[str]):
        self.devices = list(devices) or ["0"]
        self._free: "queue.Queue[str]" = queue.Queue()
        for d in self.devices:
            self._free.put(d)

    def __len__(self) -> int:
        return len(self.devices)

    @contextlib.contextmanager
    def lease(self):
        d = self._free.get()
        try:
            yield dict(os.environ, CUDA_VISIBLE_DEVICES=d)
        finally:
            self._free.put(d)


def run_groups(groups: Sequence[Sequence[Any]], pool: DevicePool, work: Callable[[Any, Dict[str, str]], None]) -> None:
    """Run `work(item, env)` for every item, the items of one group in order (one target's candidates:
    each is judged against the incumbent the previous one may have replaced), different groups in
    parallel on different GPUs. Ctrl-C kills the children and returns at once."""
    from ..sanitizer.runner import map_tracked

    def one_group(items):
        for it in items:
            with pool.lease() as env:
                work(it, env)

    map_tracked(one_group, groups, len(pool))


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


def targets_for(cfg: RunConfig) -> List[Target]:
    per_op = []
    for name in cfg.ops:
        op = get_op(name)
        by_bucket: Dict[str, List[Shape]] = {}
        for s in run_shapes(name, cfg.bench_shapes, cfg.ops):
            by_bucket.setdefault(op.bucket(s), []).append(s)
        per_op.append([Target(name, b, shapes) for b, shapes in by_bucket.items()])
    # interleaved across ops (each op's first bucket, then each op's second, ...): a budget that runs
    # out part-way through a round has still reached every op
    return [ts[i] for i in range(max(map(len, per_op), default=0)) for ts in per_op if i < len(ts)]


class Loop:
    def __init__(self, cfg: RunConfig, ledger: Ledger, run_id: str, proposer: Proposer, events: RunEvents,
                 gpu: bool, gpu_name: str):
        self.cfg = cfg
        self.ledger = ledger
        self.run_id = run_id
        self.proposer = proposer
        self.events = _serialized(events)
        self.gpu = gpu
        self.gpu_name = gpu_name
        self.ceilings: Optional[Dict[str, Any]] = None
        self.attempts: Dict[Tuple[str, str], List[Attempt]] = {}
        self.incumbent_ms: Dict[Tuple[str, str], float] = {}
        self.devices = DevicePool(visible_gpus(cfg.gpus) if gpu else [])
        self._lock = threading.Lock()  # stats, events and serving-set installs from the GPU threads
        self.stats = {"proposed": 0, "rejected": 0, "verified": 0, "benchmarked": 0, "promoted": 0,
                      "duplicates": 0, "unusable_replies": 0, "unjudged": 0}
        # the wall-time budget holds inside a round too: past it, no new evaluation starts (the
        # candidates stay in the ledger at the stage they reached; a later run finishes them)
        self.deadline: Optional[float] = None
        # what this run has already recorded (resume): source hash -> candidate id
        self.known = {c.source_hash: c.id for c in ledger.candidates(run_id=run_id)}

    # -- incumbents -------------------------------------------------------------------
    def incumbent(self, t: Target) -> Tuple[str, Optional[str], str]:
        """(label, file or None for the baseline, source)."""
        entry = serving.lookup(t.op, t.bucket, self.cfg.dtype, self.gpu_name)
        if entry:
            path = os.path.join(serving.serving_dir(), entry["file"])
            if os.path.exists(path):
                with open(path) as f:
                    return f"serving:{entry['file']}", path, f.read()
        from .search import baseline_source
        return "baseline", None, baseline_source(t.op)

    def context(self, t: Target) -> ProposeContext:
        label, _, source = self.incumbent(t)
        return ProposeContext(t.op, t.bucket, self.cfg.dtype, t.shapes, source, label,
                              self.incumbent_ms.get((t.op, t.bucket)), self.gpu_name if self.gpu else None,
                              self.ceilings, list(self.attempts.get((t.op, t.bucket), [])))

    # -- one round: every target proposes, then the whole batch is evaluated ------------------
    def round(self, targets: Sequence[Target], budget: Budget) -> int:
        batch: List[Tuple[Target, ProposeContext, Proposal, int, str]] = []
        produced = 0
        for i, t in enumerate(targets):
            if budget.exhausted(getattr(self.proposer, "tokens_used", 0)):
                break
            ctx = self.context(t)
            # a fair share of what is left, so a small budget still reaches every op and bucket
            left = self.cfg.max_candidates - budget.used
            n = min(self.cfg.per_round, -(-left // (len(targets) - i)))
            if n <= 0:
                break
            proposals = self.proposer.propose(ctx, n)
            produced += len(proposals)
            for p in proposals:
                item = self._admit(t, ctx, p, budget)
                if item:
                    batch.append(item)
        if batch:
            self._evaluate(batch)
        return produced

    def _admit(self, t: Target, ctx: ProposeContext, p: Proposal, budget: Budget):
        """Record a proposal; return it for evaluation, or None when it needs none."""
        if p.rejected:
            self._record_unusable(p)
            budget.used += 1
            return None
        h = hash_source(p.source)
        if h in self.known:  # resumed run: already recorded
            c = self.ledger.candidate(self.known[h])
            if c is not None and self._unfinished(c.status):  # interrupted mid-evaluation: finish it
                return (t, ctx, p, c.id, self._write(p, h, t))
            self._replay(ctx, p, self.known[h])
            return None
        existing = self.ledger.find_candidate(p.op, p.source)
        path = self._write(p, h, t)
        cand, new = self.ledger.add_candidate(p.op, p.source, p.proposer, self.run_id, parent_id=p.parent_id,
                                              path=path, label=p.label)
        self.known[h] = cand.id
        budget.used += 1
        self.stats["proposed"] += 1
        if p.model_call_id:
            self.ledger.link_model_call(p.model_call_id, cand.id)
        if existing is not None and not self._unfinished(existing.status):
            self.stats["duplicates"] += 1
            self.events.candidate(p.label, existing.status, f"same source as candidate #{existing.id}: verdict reused")
            self._replay(ctx, p, existing.id)
            return None
        return (t, ctx, p, cand.id, path)

    def _unfinished(self, status: str) -> bool:
        """Whether a recorded candidate still needs evaluating here: never judged, or verified without a
        GPU (or before a time limit) and this run has one. Its finished stages are not run again."""
        return status == "proposed" or (self.gpu and status == "verified")

    def resume_pending(self, targets: Sequence[Target]) -> None:
        """Finish the candidates a killed run recorded but never judged (whatever the proposer does next)."""
        by_key = {(t.op, t.bucket): t for t in targets}
        items = []
        for c in self.ledger.candidates(run_id=self.run_id):
            if not self._unfinished(c.status) or not c.path:
                continue
            bucket = os.path.basename(os.path.dirname(c.path))
            t = by_key.get((c.op, bucket)) or next((x for x in targets if x.op == c.op), None)
            if t is None:
                continue
            p = Proposal(c.op, c.source, c.label or f"candidate-{c.id}", c.proposer)
            items.append((t, self.context(t), p, c.id, self._write(p, c.source_hash, t)))
        if items:
            self.events.note(f"finishing {len(items)} candidate(s) the interrupted run had not judged")
            self._evaluate(items)

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
        verdict = {"passed": False, "error": p.rejected, "checks": [{"name": "reply", "status": "failed",
                                                                     "passed": False, "detail": p.rejected}]}
        self.ledger.record_checks(cand.id, "quick", [{"name": "reply", "status": "failed", "detail": p.rejected,
                                                       "duration_s": 0.0}])
        self.ledger.set_candidate_status(cand.id, "rejected", verdict=verdict)
        if p.model_call_id:
            self.ledger.link_model_call(p.model_call_id, cand.id)
        self.known[hash_source(body)] = cand.id
        self.stats["unusable_replies"] += 1
        self.events.candidate(p.label, "rejected", p.rejected)

    def _replay(self, ctx: ProposeContext, p: Proposal, cid: int) -> None:
        c = self.ledger.candidate(cid)
        if c is None or c.status == "proposed":
            return
        passed = c.status in ("verified", "benchmarked", "promoted")
        inc_ms = self._bench_ms(cid, incumbent=True)
        if inc_ms is not None:  # what the candidate was measured against, as the live path tells it first
            self.proposer.set_incumbent_time(ctx, inc_ms)
        self.proposer.feedback(ctx, p, passed, self._bench_ms(cid))

    def _bench_ms(self, cid: int, incumbent: bool = False) -> Optional[float]:
        """A candidate's recorded benchmark time, mean over its shapes (or the incumbent's, timed beside
        it), read as the live path judged it: graph replays where both had them (`ledger.row_time`)."""
        from ..harness.ledger import row_time
        by_shape: Dict[str, list] = {}
        for b in self.ledger.bench_results(candidate_id=cid):
            if not b.label.startswith("anchor:"):
                by_shape.setdefault(b.shape_key, []).append(b)
        times = [row_time(rows)(b) for rows in by_shape.values() for b in rows
                 if (b.label != "candidate") == incumbent]
        return sum(times) / len(times) if times else None

    # -- evaluation --------------------------------------------------------------------
    def _late(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def _leave_unjudged(self, items: Sequence[tuple]) -> None:
        if items:
            self._count("unjudged", len(items))
            self.events.note(f"time limit reached: {len(items)} candidate(s) left unjudged "
                             f"({', '.join(it[2].label for it in items[:4])}{', ...' if len(items) > 4 else ''})")

    def _sanitize(self, items: List[tuple], mode: str, checks: Optional[Sequence[str]] = None) -> List[tuple]:
        """Run one sanitizer stage over a batch (any mix of ops); return the survivors."""
        from ..sanitizer.runner import map_tracked, run_isolated
        todo, survivors = [], []
        for it in items:
            done = self.ledger.checks(it[3], mode=mode)
            if done and (checks is None or {c.name for c in done} >= set(checks)):
                if all(c.status != "failed" for c in done):  # resumed: this stage already finished
                    survivors.append(it)
                continue
            todo.append(it)
        def judge(it):
            if self._late():
                return None
            if mode != "gpu":
                return run_isolated(it[4], it[0].op, mode, checks=checks)
            with self.devices.lease() as env:  # one GPU per child
                return run_isolated(it[4], it[0].op, mode, checks=checks, env=env)

        # one source proposed for two buckets is one candidate: sanitized once, judged for both
        first_of: Dict[int, tuple] = {}
        for it in todo:
            first_of.setdefault(it[3], it)
        unique = list(first_of.values())
        verdicts = dict(zip(first_of, map_tracked(judge, unique, len(self.devices) if mode == "gpu" else self.cfg.jobs)))
        self._leave_unjudged([it for it in unique if verdicts[it[3]] is None])
        recorded = set()
        for it in todo:
            t, ctx, p, cid, path = it
            v = verdicts[cid]
            if v is None:
                continue
            first = cid not in recorded
            recorded.add(cid)
            if first:
                self.ledger.record_checks(cid, mode, [asdict(c) for c in v.checks])
            if v.passed:
                survivors.append(it)
                if mode == "full" and first:
                    self.ledger.set_candidate_status(cid, "verified", verdict=v.to_json(),
                                                     fpsan_equivalent=v.fpsan_equivalent)
            else:
                if first:
                    self.ledger.set_candidate_status(cid, "rejected", verdict=v.to_json())
                    self.stats["rejected"] += 1
                    self.events.candidate(p.label, "rejected", f"{t.op} {mode}: {v.summary()}")
                self.attempts.setdefault((t.op, t.bucket), []).append(Attempt(p.label, False, v.summary()))
                self.proposer.feedback(ctx, p, False, None)
        return survivors

    def _evaluate(self, items: List[tuple]) -> None:
        full = self._sanitize(self._sanitize(items, "quick"), "full")
        if not self.gpu:
            reported = set()
            for t, ctx, p, cid, path in full:
                if cid not in reported:  # once per candidate, however many buckets proposed it
                    reported.add(cid)
                    self.stats["verified"] += 1
                    c = self.ledger.candidate(cid)
                    eq = {True: "FpSan-equivalent", False: "not structurally equivalent", None: "FpSan undecided"}[
                        c.fpsan_equivalent if c else None]
                    self.events.candidate(p.label, "verified", f"{t.op}: passed the full sanitizer ({eq}); not "
                                                               f"benchmarked: no GPU")
                self.attempts.setdefault((t.op, t.bucket), []).append(Attempt(p.label, True, "verified, not "
                                                                                             "benchmarked"))
                self.proposer.feedback(ctx, p, True, None)
            return
        groups: Dict[Tuple[str, str], List[tuple]] = {}
        for it in self._sanitize(full, "gpu", checks=GPU_QUICK_CHECKS):
            groups.setdefault((it[0].op, it[0].bucket), []).append(it)
        late: List[tuple] = []

        def bench(it, env):
            if self._late():
                with self._lock:
                    late.append(it)
                return
            self._bench_and_promote(*it, env=env)
        run_groups(list(groups.values()), self.devices, bench)
        self._leave_unjudged(late)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def _bench_and_promote(self, t: Target, ctx: ProposeContext, p: Proposal, cid: int, path: str,
                           env: Optional[Dict[str, str]] = None) -> None:
        from ..harness.bench import record_shape_result
        from ..harness.bench_worker import run_bench_isolated
        inc_label, inc_file, _ = self.incumbent(t)
        spec = {"op": t.op, "shapes": [s.key() for s in t.shapes], "dtype": self.cfg.dtype, "seed": 0,
                "kernels": [{"label": "incumbent", "file": inc_file}, {"label": "candidate", "file": path}]}
        doc = run_bench_isolated(spec, env=env)
        if doc.get("ceilings"):
            self.ceilings = doc["ceilings"]
        for res in doc.get("results", []):
            record_shape_result(self.ledger, self.run_id, res, cid, "baseline" if inc_file is None else inc_label)
        j = judge_benchmark(doc, [s.key() for s in t.shapes], self.cfg.margin)
        if j.error:
            self.ledger.set_candidate_status(cid, "rejected", verdict={"passed": False, "error": j.error})
            self._count("rejected")
            self.events.candidate(p.label, "rejected", f"benchmark: {j.error}")
            self.proposer.feedback(ctx, p, False, None)
            return
        self.ledger.set_candidate_status(cid, "benchmarked")
        self._count("benchmarked")
        cand_ms, inc_ms, decision = j.candidate_ms, j.incumbent_ms, j.decision
        self.incumbent_ms[(t.op, t.bucket)] = inc_ms
        self.proposer.set_incumbent_time(ctx, inc_ms)
        self.proposer.feedback(ctx, p, True, cand_ms)
        self.attempts.setdefault((t.op, t.bucket), []).append(
            Attempt(p.label, True, decision.reason, cand_ms, j.fraction_of_ceiling))
        if not decision.promote:
            self.events.candidate(p.label, "benchmarked", decision.reason)
            return
        if self.cfg.compute_sanitizer:
            extra = self._promotion_checks(t, cid, path, env)
            if extra is not None:
                self.events.candidate(p.label, "benchmarked", f"faster, but not promoted: {extra}")
                return
        with open(path) as f:
            source = f.read()
        v = versions()
        with self._lock:  # the manifest is read, changed and written: one install at a time
            entry = serving.install(t.op, t.bucket, self.cfg.dtype, self.gpu_name, source, cid, decision.gain,
                                    decision.reason, v, shapes=[s.key() for s in t.shapes])
        self.ledger.record_promotion(run_id=self.run_id, op=t.op, bucket=t.bucket, dtype=self.cfg.dtype,
                                     gpu_name=self.gpu_name, candidate_id=cid, new_ms=cand_ms, old_ms=inc_ms,
                                     gain=decision.gain, spread=decision.spread, reason=decision.reason,
                                     versions_json=json.dumps(v))
        self._count("promoted")
        self.incumbent_ms[(t.op, t.bucket)] = cand_ms
        self.events.candidate(p.label, "promoted", f"{decision.reason} -> {entry['file']}")

    def _promotion_checks(self, t: Target, cid: int, path: str, env: Optional[Dict[str, str]] = None) -> Optional[str]:
        """compute-sanitizer memcheck / initcheck / racecheck before a kernel enters the serving set."""
        from ..sanitizer.runner import run_isolated
        v = run_isolated(path, t.op, "gpu", checks=GPU_PROMOTION_CHECKS, env=env)
        self.ledger.record_checks(cid, "gpu", [asdict(c) for c in v.checks if c.name in GPU_PROMOTION_CHECKS])
        if not v.passed:
            self.ledger.set_candidate_status(cid, "rejected", verdict=v.to_json())
            return v.summary()
        return None


def run_loop(cfg: RunConfig, ledger_path: str, resume: Optional[str] = None, events: Optional[RunEvents] = None,
             proposer: Optional[Proposer] = None) -> Dict[str, Any]:
    """Run (or resume) the loop; returns the run summary. Raises KeyboardInterrupt after marking the run."""
    events = events or RunEvents()
    ledger = Ledger(ledger_path)
    gpu = gpu_available()
    from ..harness.env import gpu_name as _gpu_name
    gname = (_gpu_name() or "cpu") if gpu else "cpu"
    if resume:
        run = ledger.get_run(resume)
        if run is None:
            raise ValueError(f"no run {resume!r} in {ledger_path}")
        if run.status == "finished":
            raise ValueError(f"run {resume} already finished; nothing to resume")
        cfg = RunConfig.from_json(run.config)
        progress = json.loads(run.notes) if run.notes and run.notes.startswith("{") else {}
        ledger.set_run_status(resume, "running", finished=False)
        run_id = resume
        events.note(f"resuming run {run_id}: {len(ledger.candidates(run_id=run_id))} candidate(s) already recorded")
    else:
        run = ledger.start_run(cfg.to_json(), versions(), cfg.proposer, list(cfg.ops), gname if gpu else None,
                               {"max_candidates": cfg.max_candidates, "time_limit_s": cfg.time_limit_s,
                                "token_budget": cfg.token_budget})
        run_id = run.id
        progress = {}
        events.note(f"run {run_id}: ops {', '.join(cfg.ops)}, proposer {cfg.proposer}, dtype {cfg.dtype}, "
                    f"budget {cfg.max_candidates} candidates / {cfg.time_limit_s:.0f}s"
                    + ("" if gpu else "; no GPU: candidates are verified, not benchmarked"))
    if proposer is None:
        proposer = make_proposer(cfg, ledger, run_id)
    loop = Loop(cfg, ledger, run_id, proposer, events, gpu, gname)
    if gpu and len(loop.devices) > 1:
        events.note(f"evaluating on {len(loop.devices)} GPUs ({', '.join(loop.devices.devices)}), one child per GPU")
    budget = Budget(cfg, len(ledger.candidates(run_id=run_id)), float(progress.get("elapsed_s", 0.0)))
    loop.deadline = budget.t0 + cfg.time_limit_s
    targets = targets_for(cfg)
    stop_reason = None
    try:
        if resume:
            loop.resume_pending(targets)
        idle_rounds = 0
        while True:
            stop_reason = budget.exhausted(getattr(proposer, "tokens_used", 0))
            if stop_reason:
                break
            produced = loop.round(targets, budget)
            ledger.set_run_status(run_id, "running", finished=False,
                                  notes=json.dumps({"elapsed_s": round(budget.elapsed(), 1),
                                                    "tokens": getattr(proposer, "tokens_used", 0)}))
            if produced == 0:
                idle_rounds += 1
                if idle_rounds >= 2:
                    stop_reason = "the proposer has nothing new to propose"
                    break
            else:
                idle_rounds = 0
    except KeyboardInterrupt:
        ledger.set_run_status(run_id, "interrupted", finished=False,
                              notes=json.dumps({"elapsed_s": round(budget.elapsed(), 1),
                                                "tokens": getattr(proposer, "tokens_used", 0)}))
        events.note(f"interrupted: resume with `kernel-agent run --resume {run_id}`")
        raise
    if loop.stats["unjudged"]:
        stop_reason = (f"{stop_reason}; " if stop_reason else "") + \
            f"{loop.stats['unjudged']} candidate(s) left unjudged at the time limit (kept in the ledger)"
    ledger.set_run_status(run_id, "finished", finished=True,
                          notes=json.dumps({"elapsed_s": round(budget.elapsed(), 1),
                                            "tokens": getattr(proposer, "tokens_used", 0), "stop": stop_reason}))
    summary = ledger.run_summary(run_id)
    summary["stop_reason"] = stop_reason
    summary["gpu"] = gname if gpu else None
    summary["benchmarked"] = gpu
    ledger.close()
    return summary


def make_proposer(cfg: RunConfig, ledger: Ledger, run_id: str) -> Proposer:
    if cfg.proposer == "model":
        from .model import CallRecord, ModelConfig, ModelProposer
        if not cfg.model:
            raise ValueError("the model proposer needs a model endpoint (--model / --base-url or OPENAI_* variables)")
        mc = dict(cfg.model)
        mc.setdefault("api_key", os.environ.get("OPENAI_API_KEY"))

        def on_call(rec: CallRecord) -> int:
            return ledger.record_model_call(run_id, mc["model"], rec.prompt, rec.response, rec.prompt_tokens,
                                            rec.completion_tokens, rec.latency_s, rec.error)
        return ModelProposer(ModelConfig(**mc), on_call=on_call, token_budget=cfg.token_budget)
    from .search import SearchProposer
    return SearchProposer(seed=cfg.seed)

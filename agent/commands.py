"""`run`, `bench`, `history`, `show`, `promote` and `demote`: their parsers and handlers (agent/cli.py dispatches)."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional

from ..harness import env
from ..harness.bench_records import CANDIDATE, INCUMBENT, BenchKernel, BenchOutcome, BenchSpec, Measurement
from ..harness.figures import CLOCK_WORDS, candidate_results, fmt_ms, fmt_spread, fmt_x
from ..harness.ledger import CandidateStatus, Ledger, RunNotesRecord, RunStatus, RunSummary, server_url, sqlite_path
from ..harness.manifest import Manifest, ManifestEntry
from ..harness.model_step import (
    KV_MODES,
    STACKS,
    ModelConfigError,
    Point,
    load_model_config,
    parse_bytes,
    parse_names,
    parse_points,
    run_kv_budget,
    run_model_bench,
)
from ..harness.ops import get_op
from ..harness.promotion import judge_benchmark
from ..harness.run_hold import RunHold
from ..harness.workload import DEFAULT_KV_BUDGET, analyze, workload_points
from ..sanitizer.canonical import JudgedText, judged_or_as_read
from ..sanitizer.report import merge_gpu
from ..sanitizer.verdict import SanitizerMode
from . import ui
from .cli_common import (
    UsageError,
    check_counts,
    check_files,
    check_ledger_exists,
    check_op,
    check_writable,
    command,
    cuda_available,
    default_ledger,
    hint,
    open_ledger,
    parse_duration,
    parse_ops,
    read_config,
)
from .model_config import ModelConfig
from .placement import ChildEvaluator, Devices, Evaluator, LocalDevices
from .review import history
from .throughput import session_lines
from .views import (
    candidate_doc,
    config_lines,
    diagnosis_lines,
    field_failure_line,
    judged_base,
    model_usage_line,
    run_doc,
    run_end_note,
    run_field_failures,
    unified_diff,
    versions_line,
)


def register(sub) -> None:
    _add_run_parser(sub)
    _add_bench_parser(sub)
    _add_ledger_view_parsers(sub)
    _add_serving_change_parsers(sub)


def _add_run_parser(sub) -> None:
    r = sub.add_parser("run", help="the overnight loop: propose, sanitize, benchmark, promote")
    r.add_argument("--ops", default="all", help="comma list of ops, or all (default)")
    _add_run_proposer_flags(r)
    _add_run_budget_flags(r)
    _add_run_target_flags(r)
    r.add_argument("--no-compute-sanitizer", action="store_true", help="skip compute-sanitizer before promotion")
    r.add_argument("--candidates-dir", help="where candidate files are written (default kernels/candidates)")
    r.add_argument("--resume", metavar="RUN", help="continue an interrupted run")
    r.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="evaluate on a Ray cluster: auto, ray://HOST:PORT or HOST:PORT (or [cluster] address in "
        "--config); needs kernel-agent[cluster]. Default: this machine",
    )
    r.add_argument(
        "--in-place",
        action="store_true",
        help="write promotions into the serving folder as it is (default, where git tracks it: commits "
        "on a branch kernel-agent/<run>, the checkout untouched); config: [run] in_place = true",
    )
    r.add_argument(
        "--ledger", default=None, help="the ledger: a SQLite file (default runs/ledger.db) or a postgresql:// URL"
    )
    r.add_argument("--json", action="store_true", help="print the run summary as JSON")


def _add_run_proposer_flags(r) -> None:
    """`run`'s flags of who proposes: the proposer, the code model's endpoint, the config file."""
    r.add_argument(
        "--proposer",
        choices=["auto", "search", "model"],
        default="auto",
        help="auto: the code model when an endpoint is configured, else the built-in search",
    )
    r.add_argument("--model", help="model name at the OpenAI-compatible endpoint")
    r.add_argument("--base-url", help="endpoint URL (default: OPENAI_BASE_URL)")
    r.add_argument("--config", help="TOML config file ([model] and [run] sections)")


def _add_run_budget_flags(r) -> None:
    """`run`'s budgets: candidates, time, tokens, and the processes and GPUs it uses."""
    r.add_argument(
        "--candidates", type=int, help="candidate budget for the run (default 10, or no cap when --time-limit is given)"
    )
    r.add_argument(
        "--per-round", type=int, help="proposals asked of the proposer at a time for one op and bucket (default 2)"
    )
    r.add_argument(
        "--time-limit",
        help="wall-time budget, e.g. 30m or 8h (default 30m); the run stops at it. With --resume: the time from now",
    )
    r.add_argument("--tokens", type=int, help="model token budget")
    r.add_argument(
        "--jobs", type=int, help="sanitizer processes in parallel (default: the usable cores, less one per GPU)"
    )
    r.add_argument("--gpus", type=int, help="GPUs to evaluate on, one child each (default: every visible one)")


def _add_run_target_flags(r) -> None:
    """`run`'s targets: the dtype and shapes, a model's decode step or a workload trace (and the search's
    seed: the flags keep --help's order)."""
    r.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="dtype of the target shapes")
    r.add_argument(
        "--shapes",
        help="target shapes: serving (default), near_serving, or explicit: 'a,b,c;...' for "
        "one op, 'op:a,b,c;op:...' for several (ops not named keep serving shapes)",
    )
    r.add_argument("--seed", type=int, help="seed of the search proposer")
    r.add_argument(
        "--target-model",
        metavar="CONFIG",
        help="target the op calls of this model's decode step (a preset such as llama-3-8b, or a JSON "
        "config; see `bench --model`), each bucket weighted by its share of the step",
    )
    r.add_argument(
        "--target-points", metavar="BxCTX,...", help="batch x context points of --target-model's step (default 32x8192)"
    )
    r.add_argument(
        "--workload",
        metavar="TRACE",
        help="with --target-model: target the buckets a workload trace's decode steps call, each weighted "
        "by its share of their time (`kernel-agent workload analyze`; docs/WORKLOADS.md)",
    )
    r.add_argument(
        "--kv-budget",
        metavar="SIZE",
        help="--workload: the KV-cache budget per GPU the trace is replayed under (default 60GiB)",
    )


def _add_bench_parser(sub) -> None:
    b = sub.add_parser(
        "bench",
        help="time kernels on the GPU against the incumbent and the torch anchor, or a model's decode step (--model)",
    )
    b.add_argument("--op", help="an op, or all (required unless --model)")
    b.add_argument("files", nargs="*", metavar="FILE", help="candidate files (default: the baseline only)")
    b.add_argument("--shapes", default="serving", help="serving | tiny | explicit shapes 'a,b,c;d,e,f'")
    b.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    b.add_argument("--json", action="store_true", help="print the JSON document instead of the tables")
    b.add_argument(
        "--model",
        metavar="CONFIG",
        help="time one decode step of a model: a preset (llama-3-8b, "
        "llama-3-70b-tp8, qwen2.5-7b, mistral-7b) or a JSON config file",
    )
    b.add_argument("--batch", type=int, help="--model: sequences per step (default 32)")
    b.add_argument("--context", type=int, help="--model: tokens per sequence (default 8192)")
    b.add_argument("--points", help="--model: several BATCHxCONTEXT points, e.g. 32x8192,8x32768,64x2048")
    b.add_argument("--kv", help="--model: KV cache modes, bf16 and/or int8 (default bf16,int8)")
    b.add_argument(
        "--stacks",
        help="--model: torch, baseline, serving, hybrid (cuBLAS matmuls with the baseline "
        "attention), flashinfer (cuBLAS matmuls with FlashInfer's paged decode; "
        "the flashinfer extra) and/or unguarded (the serving stack with its guard off: "
        "with serving, the guard's cost) (default torch,baseline,serving)",
    )
    b.add_argument(
        "--kv-budget",
        metavar="SIZE",
        help="--model: a KV-cache memory budget per GPU (e.g. 60GiB): each "
        "KV mode runs the most sequences of --context tokens whose "
        "cache fits it, and tokens/s are compared at equal memory",
    )
    b.add_argument("--seed", type=int, default=0, help="--model: seed of the random weights, cache and input")
    b.add_argument("--out", help="also write the JSON document to this file")
    b.add_argument("--ledger", default=None, help="record the results in this ledger (default runs/ledger.db)")
    b.add_argument("--no-ledger", action="store_true")
    b.add_argument("--remeasure-ceilings", action="store_true")
    b.add_argument(
        "--processes",
        type=int,
        default=1,
        help="time each shape in this many processes, one after the other, and report a spread that "
        "includes the differences between them (default 1)",
    )


def _add_ledger_view_parsers(sub) -> None:
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

    s = sub.add_parser("show", help="a run or a candidate: verdicts, timings, diff, model exchange")
    s.add_argument("what", help="a run id (r...) or a candidate id (a number or c<number>)")
    s.add_argument("--ledger", default=None)
    s.add_argument("--json", action="store_true")
    s.add_argument("--source", action="store_true", help="print the candidate's whole source")


def _add_serving_change_parsers(sub) -> None:
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

    d = sub.add_parser("demote", help="remove a kernel from the serving set")
    d.add_argument("--op", required=True)
    d.add_argument("--bucket", required=True)
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--gpu", default=None, help="GPU name (default: this machine's)")
    d.add_argument("--reason", required=True)
    d.add_argument("--ledger", default=None)
    d.add_argument(
        "--in-place",
        action="store_true",
        help="write the serving folder as it is (default, where git tracks it: a commit on a branch "
        "kernel-agent/<run>, the checkout untouched)",
    )


# -- run ---------------------------------------------------------------------------------------


def _interrupt_on_signals() -> None:
    """SIGINT and SIGTERM stop a run cleanly (marked interrupted, resumable), also when the process
    was started with SIGINT ignored (background jobs of a non-interactive shell: Python then installs
    no handler of its own) or is stopped by a service manager (SIGTERM)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


@command("run")
def cmd_run(args) -> int:
    ledger_path = args.ledger or default_ledger()
    file_config = _check_run_flags(args, ledger_path)
    _interrupt_on_signals()
    events = _run_events(args)
    try:
        return _run(args, events, ledger_path, file_config)
    finally:
        if getattr(args, "_status_line", None) is not None:
            args._status_line.close()  # a live line left open would swallow the error that ended the run


def _check_run_flags(args, ledger_path: str) -> Dict[str, Any]:
    """What the flags and the config file alone decide, checked before torch is imported (seconds) and before
    anything is recorded, so that a usage error comes at once; returns the config file's contents."""
    file_config = read_config(args.config) if args.config else {}
    file_run = file_config.get("run", {})
    parse_ops(args.ops)
    # each time limit parsed once, here: the flag's (a new run's budget, or what a resume may take from now) and
    # the config file's (a new run's, where no flag is given)
    args.time_limit_s, args.file_time_limit_s = (
        None if value is None else parse_duration(str(value)) for value in (args.time_limit, file_run.get("time_limit"))
    )
    counts = {k: getattr(args, k) for k in ("candidates", "per_round", "jobs", "gpus", "tokens")}
    for key in counts:
        if counts[key] is None:
            counts[key] = file_run.get(key)
    check_counts(**counts)
    if args.resume:
        check_ledger_exists(ledger_path)  # a mistyped --ledger names no run: it must not create a ledger there
        if args.workload or args.kv_budget:
            raise UsageError("--workload and --kv-budget choose a new run's targets; a resumed run keeps its own")
    if not args.resume:
        candidates = args.candidates_dir or os.path.join("kernels", "candidates")
        check_writable(candidates, "--candidates-dir", folder=True, why=" (candidate files are written there)")
        if server_url(ledger_path) is None and not sqlite_path(ledger_path).exists():
            check_writable(str(sqlite_path(ledger_path)), "--ledger", folder=False, why=" (a new ledger is made there)")
        _check_model_flags(args)
    return file_config


def _check_model_flags(args) -> None:
    """A new run's model, when it asks one: configured, and its endpoint answering as the API does."""
    model = ModelConfig.resolve(args.model, args.base_url, args.config)
    if args.proposer == "model" and model is None:
        raise UsageError(
            "--proposer model: no endpoint configured (set OPENAI_BASE_URL / OPENAI_API_KEY, or pass "
            "--base-url and --model)"
        )
    if model is not None and args.proposer in ("model", "auto"):
        _check_endpoint(model)


def _cluster_section(args, file_config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The cluster `--cluster` / the config's [cluster] section asks for (its section, with the address),
    or None: this machine's placement. Checks the flags only; nothing is contacted."""
    section = file_config.get("cluster", {})
    if not isinstance(section, dict):
        raise UsageError("[cluster] in the config must be a section")
    address = args.cluster or section.get("address")
    if not address:
        return None
    if args.jobs is not None or args.gpus is not None:
        raise UsageError("--jobs and --gpus size this machine's placement; on a cluster its resources do")
    return dict(section, address=str(address))


def _cluster_placement(args, section: Optional[Dict[str, Any]]):
    """The Ray placement of a `_cluster_section`, connected, or None for this machine's."""
    if section is None:
        return None
    address = section["address"]
    try:
        from .ray_placement import RayPlacement  # optional extra: Ray, imported only for --cluster
    except ImportError:
        raise UsageError("--cluster needs Ray: pip install 'kernel-agent[cluster]'") from None
    try:
        placement = RayPlacement(address, gpu_model=section.get("gpu_model"))
    except ValueError as e:
        raise UsageError(f"--cluster: {e}") from None
    except (ConnectionError, RuntimeError) as e:
        raise UsageError(f"--cluster {address}: {e}") from None
    if not args.json:  # (stdout holds only the summary document with --json)
        ui.line(f"cluster: {placement.describe()}", style="bold")
    return placement


def _run(args, events, ledger_path: str, file_config: Dict[str, Any]) -> int:
    from ..harness.serving import ServingError, load_manifest  # here: torch, after the flags
    from .loop import RunConfig, run_loop  # here: the loop imports torch, which comes after the flags are checked

    if args.resume and args.in_place:
        raise UsageError("--in-place chooses where a new run writes; a resumed run keeps its own serving target")
    cfg = RunConfig() if args.resume else _run_config(args, file_config.get("run", {}))
    limit = args.time_limit_s if args.resume else None
    try:  # the serving set the run builds on, read before the run is recorded: a broken one is bad input
        load_manifest()
    except ServingError as e:
        raise UsageError(f"the serving set cannot be read: {e}") from None
    cluster = _cluster_section(args, file_config)
    # the ledger before the cluster: one this version cannot use (an older schema) is refused before a
    # cluster is joined; held from before the run is recorded, so that a second run on it is refused
    with Ledger(ledger_path) as ledger, RunHold(ledger, events.resume_command) as hold:
        events.started = hold.name
        summary = run_loop(
            cfg,
            resume=args.resume,
            events=events,
            time_limit_s=limit,
            placement=_cluster_placement(args, cluster),
            ledger=ledger,
        )
    return _print_run_summary(summary, args)


def _run_config(args, file_run: Dict[str, Any]):
    """The new run's configuration: the flags over the config file's [run] section. Every usage error is raised
    here, before anything is recorded."""
    from .loop import RunConfig, targets_for  # here: the loop imports torch, which comes after the flags are checked

    cfg = RunConfig()
    _apply_budget_and_flags(args, file_run, cfg)
    _apply_target_model(args, file_run, cfg)
    try:
        targets = targets_for(cfg)  # a bad --shapes is a usage error before anything is recorded
    except ValueError as e:
        raise UsageError(f"--target-model: {e}" if cfg.target_model else f"--shapes: {e}")
    if cfg.target_model:  # the run's ops are those the step calls
        cfg.ops = [name for name in cfg.ops if any(t.op == name for t in targets)]
    if args.candidates_dir:
        cfg.candidates_dir = args.candidates_dir
    model = ModelConfig.resolve(args.model, args.base_url, args.config)  # (checked by _check_model_flags)
    if model is not None and args.proposer in ("model", "auto"):
        cfg.proposer = "model"
        cfg.model = {
            k: getattr(model, k)
            for k in ("model", "base_url", "temperature", "max_tokens", "timeout_s", "max_retries", "concurrency")
        }
    else:
        cfg.proposer = "search"
    return cfg


def _apply_budget_and_flags(args, file_run: Dict[str, Any], cfg) -> None:
    """Ops, budgets, shapes and where promotions go, each from its flag, else from the config file."""
    if "ops" in file_run:
        cfg.ops = parse_ops(",".join(file_run["ops"]) if isinstance(file_run["ops"], list) else file_run["ops"])
    if args.ops != "all" or "ops" not in file_run:
        cfg.ops = parse_ops(args.ops)
    for key, attr, conv in (
        ("candidates", "max_candidates", int),
        ("per_round", "per_round", int),
        ("tokens", "token_budget", int),
        ("jobs", "jobs", int),
        ("dtype", "dtype", str),
        ("shapes", "bench_shapes", str),
        ("seed", "seed", int),
        ("gpus", "gpus", int),
    ):
        v = getattr(args, key, None)
        if v is None:
            v = file_run.get(key)
        if v is not None:
            try:
                setattr(cfg, attr, conv(v))
            except (TypeError, ValueError):
                raise UsageError(
                    f"{key.replace('_', '-')}: expected {'an integer' if conv is int else 'text'}, got {v!r}"
                ) from None
    tl = args.time_limit_s if args.time_limit_s is not None else args.file_time_limit_s
    if tl is not None:
        cfg.time_limit_s = tl
        if args.candidates is None and "candidates" not in file_run:
            cfg.max_candidates = None  # a run given a time budget runs for that time
    check_counts(
        candidates=cfg.max_candidates, per_round=cfg.per_round, jobs=cfg.jobs, gpus=cfg.gpus, tokens=cfg.token_budget
    )
    cfg.compute_sanitizer = not args.no_compute_sanitizer
    in_place = args.in_place or file_run.get("in_place", False)
    if not isinstance(in_place, bool):
        raise UsageError(f"in_place: expected true or false, got {in_place!r}")
    cfg.in_place = in_place


def _apply_target_model(args, file_run: Dict[str, Any], cfg) -> None:
    """`--target-model` / `--target-points`: the op calls of a model's decode step instead of the serving shapes."""
    target_model = args.target_model or file_run.get("target_model")
    points = args.target_points or file_run.get("target_points")
    if target_model:
        if args.shapes or "shapes" in file_run:
            raise UsageError("--target-model chooses the shapes: leave out --shapes")
        try:
            cfg.target_model = load_model_config(str(target_model)).to_json()
            if points:
                parse_points(str(points))
                cfg.target_points = str(points)
        except ModelConfigError as e:
            raise UsageError(str(e)) from None
    elif points:
        raise UsageError("--target-points needs --target-model")
    workload = args.workload or file_run.get("workload")
    budget = args.kv_budget or file_run.get("kv_budget")
    if workload:
        if not target_model:
            raise UsageError("--workload needs --target-model CONFIG: the model that serves the trace")
        if points:
            raise UsageError("--workload chooses the points: leave out --target-points")
        _apply_workload(
            str(workload), None if budget is None else str(budget), load_model_config(str(target_model)), cfg
        )
    elif budget:
        raise UsageError("--kv-budget needs --workload")


def _apply_workload(trace: str, budget: Optional[str], model, cfg) -> None:
    """`--workload`: the trace replayed in both KV modes; its weighted points become the run's targets."""
    try:
        budget_bytes = parse_bytes(budget or DEFAULT_KV_BUDGET)
        analyses = analyze(trace, model, KV_MODES, budget_bytes)
    except ValueError as e:  # a malformed trace (TraceError names its line), a budget that holds nothing
        raise UsageError(f"--workload: {str(e).splitlines()[0]}") from None
    cfg.target_weights = workload_points(analyses)
    cfg.target_workload = {
        "trace": trace,
        "kv_budget_bytes": budget_bytes,
        "requests": analyses[KV_MODES[0]].schedule.requests,
    }


def _check_endpoint(model) -> None:
    """Fail early, in one line, when the endpoint cannot be used at all: whenever a model is configured
    (without a URL the client goes to OpenAI's API, which needs a key)."""
    url = model.base_url or OPENAI_DEFAULT_URL
    if not model.base_url and not model.api_key:
        raise UsageError(
            f"model {model.model!r}: no endpoint: pass --base-url (or set OPENAI_BASE_URL), or set "
            f"OPENAI_API_KEY for {OPENAI_DEFAULT_URL}"
        )
    u = urllib.parse.urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"bad endpoint URL {url!r}")
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        raise UsageError(f"cannot reach the model endpoint {url}: {e.strerror or e}")
    served = _check_openai_api(url, model.api_key)
    if served and model.model not in served:
        shown = ", ".join(sorted(served)[:8]) + (", ..." if len(served) > 8 else "")
        raise UsageError(
            f"model {model.model!r} is not served by {url} (it serves: {shown}): pass --model with one of them"
        )


def _check_openai_api(url: str, api_key: Optional[str]) -> List[str]:
    """The endpoint answers as OpenAI's API does: GET {url}/models gives the list of models (every
    OpenAI-compatible server serves it); returns the ids it lists. A server that is not the API (a URL missing
    its /v1, another service on the port) would otherwise fail every model call of the run."""
    models = url.rstrip("/") + "/models"
    hint = (
        f" (OpenAI-compatible servers serve it under /v1: --base-url {url.rstrip('/')}/v1?)"
        if urllib.parse.urlparse(url).path.rstrip("/") == ""
        else ""
    )
    req = urllib.request.Request(models, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=ENDPOINT_CHECK_TIMEOUT_S) as r:
            body = r.read(1 << 22)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise UsageError(
                f"the model endpoint {url} refused the API key (HTTP {e.code} for GET {models}): set "
                f"OPENAI_API_KEY or api_key in [model]"
            ) from None
        raise UsageError(f"{url} is not an OpenAI-compatible API: GET {models} answered HTTP {e.code}{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise UsageError(
            f"cannot reach the model endpoint {url}: {getattr(reason, 'strerror', None) or reason}"
        ) from None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not (isinstance(doc, dict) and isinstance(doc.get("data"), list)):
        raise UsageError(
            f"{url} is not an OpenAI-compatible API: GET {models} did not answer with a list of models{hint}"
        )
    # the ids of the models it serves ([] when it lists none: a server that lists nothing is not held to it)
    return [str(m["id"]) for m in doc["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]


ENDPOINT_CHECK_TIMEOUT_S = 15.0


OPENAI_DEFAULT_URL = "https://api.openai.com/v1"  # where the openai client goes without a base URL


def _run_events(args):
    from .loop import RunEvents  # here: the loop imports torch, which comes after the flags are checked

    def resume_command(run_id: str) -> str:
        return hint(f"run --resume {run_id}", args.ledger)

    if getattr(args, "json", False):
        return RunEvents(resume_command=resume_command)
    marks = {
        CandidateStatus.REJECTED: "reject",
        CandidateStatus.VERIFIED: "verified",
        CandidateStatus.BENCHMARKED: "bench",
        CandidateStatus.PROMOTED: "PROMOTED",
    }

    def cand(label, status, detail):
        ui.line(
            f"  {marks.get(status, status):9s} {label}: {ui.clip(detail, 220)}",
            style={CandidateStatus.PROMOTED: "bold green", CandidateStatus.REJECTED: "red"}.get(status),
        )

    live = ui.StatusLine(plain_every_s=60.0)  # a live line on a terminal; a plain one a minute elsewhere
    args._status_line = live
    return RunEvents(
        note=lambda s: ui.line(s, style="bold"),
        candidate=cand,
        status=lambda st: live.update(f"status: {st.describe()}"),
        resume_command=resume_command,
    )


def _print_run_summary(summary: RunSummary, args) -> int:
    if getattr(args, "_status_line", None) is not None:
        args._status_line.close()
    failed = summary.status == RunStatus.FAILED  # (the proposer failed on every call, say): exit 1
    if args.json:
        sys.stdout.write(json.dumps(summary.to_json(), indent=2, default=str) + "\n")
        return 1 if failed else 0
    counts, session = summary.judged_now_by_status, summary.session
    # the wall time in the headline, which no terminal width cuts (a table drops its last columns at 80)
    reason = (session and session.stop_reason) or ""
    ui.line(
        f"run {summary.run_id} {summary.status}"
        + (f": {reason}" if reason else "")
        + f"; wall {ui.duration(summary.wall_s or 0)}",
        style="bold",
    )
    ui.table(
        "",
        ["judged now", "rejected", "not verified", "verified", "bench", "promoted", "replayed", "tokens"],
        [
            [
                summary.judged_now,
                counts.get(CandidateStatus.REJECTED, 0),
                counts.get(CandidateStatus.PROPOSED, 0),
                counts.get(CandidateStatus.VERIFIED, 0),
                counts.get(CandidateStatus.BENCHMARKED, 0),
                counts.get(CandidateStatus.PROMOTED, 0),
                summary.replayed,
                summary.model.total_tokens,
            ]
        ],
        justify=["right"] * 8,
    )
    if summary.replayed:
        ui.line(
            f"replayed: {summary.replayed} candidate(s) judged by earlier runs, replayed from the ledger, not "
            f"judged again and not counted against the budget (nor above)"
        )
    if summary.pruned:
        ui.line(
            f"{summary.pruned} proposal(s) kept off the GPU by the search's screens "
            f"(`{hint(f'show {summary.run_id}', getattr(args, 'ledger', None))}` says why)"
        )
    if summary.checks_failed:
        ui.table(
            "rejections by check",
            ["check", "candidates"],
            sorted(summary.checks_failed.items()),
            justify=["left", "right"],
        )
    _print_what_was_judged(summary)
    for p in summary.promotions:
        ui.line(f"promoted {p.op} {p.bucket} {p.dtype}: {p.reason}", style="bold green")
    if session and session.throughput_line:
        # the session's own figures; after a --resume the counts above are the whole run's (as `show` has them)
        ui.line(f"throughput{', this resume' if session.throughput.get('resumed') else ''}: {session.throughput_line}")
    if session and session.serving_line:
        ui.line(session.serving_line)
    ui.line(f"details: {hint(f'show {summary.run_id}', getattr(args, 'ledger', None))}")
    return 1 if failed else 0


def _print_what_was_judged(summary: RunSummary) -> None:
    """The summary's lines on failed model calls and, without a GPU, on what was verified: each says what the
    counts hold (a run whose model never answered verified nothing)."""
    if summary.model.errors:
        ui.line(f"model calls: {summary.model.errors} of {summary.model.calls} failed (no reply, no candidate)")
    if summary.session and summary.session.benchmarked:
        return
    verified = summary.judged_now_by_status.get(CandidateStatus.VERIFIED, 0)
    ui.line(
        (f"no GPU: {verified} candidate(s) verified by the sanitizer, not benchmarked" if verified else "no GPU: ")
        + ("" if verified else "nothing was benchmarked")
        + ("" if summary.promotions else ("; nothing was promoted" if verified else " or promoted"))
    )


@command("bench")
def cmd_bench(args, evaluator: Optional[Evaluator] = None, devices: Optional[Devices] = None) -> int:
    """Time the baseline, the anchor and candidate files per shape, each shape in `args.processes` benchmark
    children (`evaluator`; default: sandboxed children of this process) on this machine's GPU (`devices`)."""
    if args.model:
        return _bench_model(args)
    model_flags = [
        f
        for f, v in (
            ("--batch", args.batch),
            ("--context", args.context),
            ("--points", args.points),
            ("--kv", args.kv),
            ("--stacks", args.stacks),
            ("--kv-budget", args.kv_budget),
        )
        if v is not None
    ]
    if model_flags:
        raise UsageError(f"{', '.join(model_flags)}: only with --model")
    if not args.op:
        raise UsageError("bench: give --op (an op, or all) or --model")
    from ..harness.bench import NO_GPU, load_ceilings, resolve_shapes  # here: torch, after the flags

    evaluator, devices = evaluator or ChildEvaluator(), devices or LocalDevices()
    ops = parse_ops(args.op)
    check_files(args.files)
    if args.files and len(ops) > 1:
        raise UsageError("candidate files need a single --op")
    if args.processes < 1:
        raise UsageError("--processes must be at least 1")
    if not devices.available():
        ui.error(NO_GPU)
        return 2
    if args.remeasure_ceilings:
        load_ceilings(remeasure=True)
    doc: Dict[str, Any] = {"results": [], "errors": []}
    for name in ops:
        op = get_op(name)
        try:
            shapes = resolve_shapes(op, args.shapes)
        except ValueError as e:
            raise UsageError(str(e))
        kernels = [BenchKernel("baseline")] + [
            BenchKernel(f"candidate:{os.path.basename(f)}", os.path.abspath(f)) for f in args.files
        ]
        with ui.Progress(f"bench {name}", len(shapes)) as prog:
            for s in shapes:
                _bench_one_shape(args, evaluator, name, s.key(), kernels, doc)
                prog.advance(f"{name} {s.key()}")
    if doc.get("run_id"):
        open_ledger(args).set_run_status(doc["run_id"], RunStatus.FINISHED, finished=True)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print_bench(doc)
    return 1 if doc["errors"] else 0


def _bench_one_shape(
    args, evaluator: Evaluator, name: str, shape_key: str, kernels: List[BenchKernel], doc: Dict[str, Any]
) -> None:
    """Time one shape in `args.processes` children, add what they measured to `doc`, record it and write it out."""
    from ..harness.bench import merge_processes, with_reported_times  # here: torch, after the flags

    # references: what serving engines run (FlashInfer's paged decode), shown beside the torch anchor
    spec = BenchSpec(name, (shape_key,), args.dtype, tuple(kernels), references=True)
    outs = [BenchOutcome.from_json(evaluator.bench(spec.to_json())) for _ in range(args.processes)]
    doc["ceilings"] = outs[-1].ceilings or doc.get("ceilings")
    errors = [o.error for o in outs if o.error]
    if errors:
        doc["errors"].append(f"{name} {shape_key}: {errors[0]}")
    good = [o for o in outs if not o.error] or outs[:1]  # what a failed one measured still shows
    n = min(len(o.results) for o in good)
    results = [merge_processes([o.results[i] for o in good]) for i in range(n)]
    doc["results"] += [with_reported_times(r) for r in results]
    if not args.no_ledger:
        _record_bench_doc(args, doc, results)
    if args.out:  # after every shape: a cut-short run keeps what it measured
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)


def _record_bench_doc(args, doc, results) -> None:
    from ..harness.bench import record_shape_result  # here: torch, after the flags

    led = open_ledger(args)
    if not doc.get("run_id"):
        run = led.start_run(
            {"command": "bench", "shapes": args.shapes, "dtype": args.dtype, "files": args.files},
            env.versions(),
            "bench",
            parse_ops(args.op),
            (doc.get("ceilings") or {}).get("gpu"),
            {},
        )
        doc["run_id"] = run.id
    for res in results:
        record_shape_result(led, doc["run_id"], res)


_BENCH_COLUMNS = [
    "op",
    "shape",
    "dtype",
    "kernel",
    "median ms",
    "spread",
    "graph ms",
    "reported (run to run)",
    "anchor/this",
    "flashinfer/this",
    "rate",
    "of ceiling",
]


def print_bench(doc) -> None:
    c = doc.get("ceilings") or {}
    if c:
        ui.line(f"{c.get('gpu')}: ceilings copy {c.get('copy_tbps')} TB/s, bf16 matmul {c.get('bf16_tflops')} TFLOP/s")
    rows = []
    for res in doc["results"]:
        ms = res["measurements"]
        anchor = next((m for m in ms if m["label"].startswith("anchor")), None)
        fi = next((m for m in ms if m["label"].startswith("anchor:flashinfer") and not m.get("error")), None)
        rows += [_bench_row(res, m, anchor, fi) for m in ms]
    ui.table("", _BENCH_COLUMNS, rows, justify=["left"] * 4 + ["right"] * 8)
    for res in doc["results"]:  # what the table has no column for: e.g. which SDPA backend ran
        for m in res["measurements"]:
            if m.get("note") and not m.get("error"):
                ui.line(f"{res['op']} {res['shape']} {m['label']}: {m['note']}")
    for e in doc.get("errors", []):
        ui.line(f"error: {e}", style="red")


def _bench_row(res: Dict[str, Any], m: Dict[str, Any], anchor: Optional[Dict], fi: Optional[Dict]) -> list:
    """The table's row of measurement m of shape result res, against the shape's torch anchor and FlashInfer."""
    from ..harness.bench import reported_time  # here: torch, after the flags

    if m.get("error"):
        return [res["op"], res["shape"], res["dtype"], m["label"], "error", "", "", "", "", "", m["error"][:60]]
    ratio = f"{anchor['median_ms'] / m['median_ms']:.2f}x" if anchor and not anchor.get("error") else ""
    fi_ratio = f"{fi['median_ms'] / m['median_ms']:.2f}x" if fi else ""
    rate = f"{m['tflops']:.0f} TF/s" if m.get("ceiling_kind") == "compute" else f"{m['tbps']:.2f} TB/s"
    rep_ms, rep_spread, rep_kind = reported_time(Measurement.from_json(m))
    graph = ""
    if m.get("graph_ms"):
        graph = f"{m['graph_ms']:.4f}" + (
            f" ±{m['graph_spread_ms']:.4f}" if m.get("graph_spread_ms") is not None else ""
        )
    return [
        res["op"],
        res["shape"],
        res["dtype"],
        m["label"],
        f"{m['median_ms']:.4f}",
        f"±{m['spread_ms']:.4f}",
        graph,
        f"{rep_ms:.4f} ±{rep_spread:.4f} {rep_kind}",
        ratio,
        fi_ratio,
        rate,
        f"{m['fraction_of_ceiling']:.0%}" + (" IMPLAUSIBLE" if m.get("implausible") else ""),
    ]


# -- bench --model ---------------------------------------------------------------------------------


def _bench_model(args) -> int:
    """`bench --model CONFIG`: one decode step of a model per stack and KV cache (harness/model_step.py)."""
    # the flags and the config are checked before torch is imported: a usage error comes at once
    if args.op:
        raise UsageError("bench: give --op or --model, not both")
    if args.files:
        raise UsageError("bench --model takes no candidate FILE (it times the baselines and the serving set)")
    if args.points and (args.batch is not None or args.context is not None):
        raise UsageError("bench --model: give --points, or --batch and --context, not both")
    if args.kv_budget and (args.points or args.batch is not None):
        raise UsageError(
            "bench --model --kv-budget: the budget sets the batch; give --context, not --points or --batch"
        )
    try:
        cfg = load_model_config(args.model)
        budget = parse_bytes(args.kv_budget) if args.kv_budget else None
        if args.points:
            points = parse_points(args.points)
        else:
            batch = 32 if args.batch is None else args.batch
            context = 8192 if args.context is None else args.context
            if batch < 1 or context < 1:
                raise ModelConfigError(f"--batch and --context must be at least 1, got {batch} and {context}")
            points = [Point(batch, context)]
        stacks = parse_names(args.stacks or "torch,baseline,serving", STACKS, "--stacks")
        kv_modes = parse_names(args.kv or ",".join(KV_MODES), KV_MODES, "--kv")
    except ModelConfigError as e:
        raise UsageError(str(e))
    if args.out and os.path.isdir(args.out):
        raise UsageError(f"--out {args.out}: is a folder; give a file path")
    if not cuda_available():
        ui.error("bench --model needs a CUDA GPU")
        return 2
    to_stdout = args.json

    def to_stderr(text: str) -> None:  # the document goes to stdout: the progress lines go beside it
        sys.stderr.write(text + "\n")

    log: Callable[[str], None] = to_stderr if to_stdout else ui.line
    if budget is not None:
        result = run_kv_budget(cfg, budget, points[0].context, stacks, kv_modes, seed=args.seed, log=log)
    else:
        result = run_model_bench(cfg, points, stacks, kv_modes, seed=args.seed, log=log)
    doc = result.to_json()
    if budget is not None:
        doc["kv_budget_bytes"] = budget
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    if to_stdout:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print_model_bench(result, budget)
    return 0


KV_LABEL = {"bf16": "bf16", "int8": "int8 (quantize_kv)"}


def print_model_bench(result, budget: Optional[int] = None) -> None:
    """The step table (ms/step, tokens/s, vs torch and vs flashinfer), at a KV budget the equal-memory table,
    the op shares, what served each op in the serving stack, and the int8 cache's accuracy."""
    cfg = result.config
    tp = f", tensor parallel {cfg.tp} (one GPU's shard; all-reduces not timed)" if cfg.tp > 1 else ""
    ui.line(
        f"{cfg.name}: decode step of {cfg.layers} layers (hidden {cfg.hidden}, {cfg.heads} heads, {cfg.kv_heads} "
        f"KV heads, D {cfg.head_dim}, MLP {cfg.intermediate}{tp}) on {result.gpu}; one layer as a CUDA graph, "
        f"x {cfg.layers}",
        style="bold",
    )
    rows = []
    for p in result.points:
        for t in p.timings:
            kv = "bf16 (reference)" if t.stack == "torch" else KV_LABEL[t.kv]
            rows.append(
                [
                    f"B={p.batch} ctx={p.context}",
                    t.stack,
                    kv,
                    f"{t.step_ms:.2f}",
                    f"{t.tokens_per_s:,.0f}",
                    f"{t.vs_torch:.3f}x" if t.vs_torch is not None else "",
                    f"{t.vs_flashinfer:.3f}x" if t.vs_flashinfer is not None else "",
                ]
            )
    ui.table(
        "",
        ["point", "stack", "KV cache", "ms/step", "tokens/s", "vs torch", "vs flashinfer"],
        rows,
        justify=["left", "left", "left", "right", "right", "right", "right"],
    )
    _print_guard_cost_and_budget(result, budget)
    labels = ["qkv", "quantize_kv", "attention", "o", "gate_up", "down", "other"]
    shown = [lb for lb in labels if any(lb in t.shares for p in result.points for t in p.timings)]
    rows = [
        [f"B={p.batch} ctx={p.context}", t.stack, t.kv]
        + [f"{t.shares[lb]:.1%}" if lb in t.shares else "" for lb in shown]
        for p in result.points
        for t in p.timings
    ]
    ui.table(
        "share of each op in the step (each op call timed alone; other: norms, SiLU, residuals, cache writes)",
        ["point", "stack", "KV"] + shown,
        rows,
        justify=["left"] * 3 + ["right"] * len(shown),
    )
    served = [
        [f"B={p.batch} ctx={p.context}", s.kv, s.label, s.op, s.bucket, s.implementation]
        for p in result.points
        for s in p.served
    ]
    if served:
        ui.table(
            "what served each op in the serving stack", ["point", "KV", "call", "op", "bucket", "served by"], served
        )
    for p in result.points:
        if p.accuracy is not None:
            ui.line(f"B={p.batch} ctx={p.context}: {p.accuracy.describe()}")


def _print_guard_cost_and_budget(result, budget: Optional[int]) -> None:
    """The lines after the step table: the guard's cost where it was timed, the equal-memory table at a budget."""
    for line in guard_cost_lines(result):
        ui.line(line)
    if budget is not None:
        _print_equal_memory(result, budget)


def guard_cost_lines(result) -> List[str]:
    """At each point and KV mode timed with both the serving stack and the `unguarded` one (the same
    dispatcher, its guard off), the guard's steady-state cost: the serving layer's time over the unguarded one's."""
    lines = []
    for p in result.points:
        by_key = {(t.stack, t.kv): t for t in p.timings}
        for kv in result.kv_modes:
            on, off = by_key.get(("serving", kv)), by_key.get(("unguarded", kv))
            if on is not None and off is not None:
                cost = on.layer_ms / off.layer_ms - 1
                lines.append(
                    f"B={p.batch} ctx={p.context} {kv}: the serving guard's steady-state cost {cost:+.2%} "
                    f"({on.layer_ms * 1e3:.1f} us a layer with it, {off.layer_ms * 1e3:.1f} us without)"
                )
    return lines


def _print_equal_memory(result, budget: int) -> None:
    """tokens/s per GPU of every stack and KV mode at the budget, against torch's bf16 stack at the budget's
    bf16 batch: the serving cost of a token at equal memory."""
    torch_bf16 = next(
        (t.tokens_per_s for p in result.points for t in p.timings if t.stack == "torch" and t.kv == "bf16"), None
    )
    rows = [
        [
            KV_LABEL[t.kv] if t.stack != "torch" else "bf16 (reference)",
            f"{p.batch}",
            t.stack,
            f"{t.tokens_per_s:,.0f}",
            f"{t.tokens_per_s / torch_bf16:.3f}x" if torch_bf16 else "",
        ]
        for p in result.points
        for t in p.timings
    ]
    ui.table(
        f"at a KV budget of {budget / 2**30:.1f} GiB per GPU, context {result.points[0].context}: tokens/s at "
        f"equal memory",
        ["KV cache", "sequences", "stack", "tokens/s", "vs torch bf16"],
        rows,
        justify=["left", "right", "left", "right", "right"],
    )


# -- history and show --------------------------------------------------------------------------


@command("history")
def cmd_history(args) -> int:
    if args.op:
        check_op(args.op)
    return history(args, open_ledger(args, read=True))


@command("show")
def cmd_show(args) -> int:
    led = open_ledger(args, read=True)
    what = args.what
    if re.fullmatch(r"c?\d+", what):
        return _show_candidate(led, int(what.lstrip("c")), args)
    run = led.get_run(what)
    if run is None:
        raise UsageError(f"no run or candidate {what!r} in the ledger")
    return _show_run(led, run, args)


def _show_run(led, run, args) -> int:
    from .publish import recorded_target  # here: publication imports the serving set, which imports torch

    if args.json:
        sys.stdout.write(json.dumps(run_doc(led, run), indent=2, default=str) + "\n")
        return 0
    summary = led.run_summary(run.id)
    cands = led.candidates(run_id=run.id)
    target = recorded_target(run.notes)  # where it promoted
    started = run.started_at.strftime("%Y-%m-%d %H:%M")
    ended = run_end_note(run)
    # wall: start to end; a run that has not ended (interrupted, killed) the time its sessions ran
    elapsed = summary.wall_s if run.finished_at is not None else run.notes.elapsed_s
    ui.line(
        f"run {run.id} [{run.status}{ended}] proposer {run.proposer}, ops {run.ops}, started {started} UTC"
        + (f", wall {ui.duration(float(elapsed))}" if elapsed is not None else "")
        + (f", gpu {run.gpu_name}" if run.gpu_name else ", no GPU"),
        style="bold",
    )
    ui.line(f"versions: {versions_line(run.versions)}")
    rows = []
    results = {r.candidate_id: r for r in candidate_results(led.figures(run_id=run.id))}
    replayed = {c.id for c in cands} - led.judged_now(run.id)
    for c in cands:
        why = c.stored_verdict.failure()
        timing = _timing_words(results.get(c.id))
        eq = {True: "equiv", False: "not equiv", None: ""}[c.fpsan_equivalent]
        status = f"{c.status} (replayed)" if c.id in replayed else c.status  # judged by an earlier run
        bucket = os.path.basename(os.path.dirname(c.path)) if c.path else ""  # (the loop writes it there)
        rows.append([c.id, c.op, bucket, c.label or "", status, eq, timing, ui.clip(why, 90)])
    ui.table("candidates", ["id", "op", "bucket", "label", "status", "FpSan", "timing", "why"], rows)
    if summary.pruned:
        ui.line(
            f"{summary.pruned} proposal(s) kept off the GPU by the search's screens "
            f"(`kernel-agent show {summary.run_id}` says why)"
        )
    for line in diagnosis_lines(led, run.id):  # what bounds each incumbent, and why proposals were pruned
        ui.line(line)
    for p in summary.promotions:
        ui.line(f"promoted: {p.op} {p.bucket} {p.dtype} candidate #{p.candidate_id}: {p.reason}", style="green")
    for r in run_field_failures(led, run.id):  # what the serving guard found on what it promoted, or it resolved
        ui.line(f"field failure: {field_failure_line(r)}", style="green" if r.resolved else "red")
    if target is not None:
        ui.line(target.describe() if run.status == RunStatus.RUNNING else target.outcome())
    if model_usage_line(summary):
        ui.line(model_usage_line(summary))
    for line in session_lines(run.notes):
        ui.line(f"throughput, {line}")
    return 0


def _short_incumbent(label) -> str:
    """An incumbent's label for a narrow column (a serving kernel's file name is in --json)."""
    if label is None:
        return "none"
    return "serving" if label.startswith("serving:") else label


def _timing_words(result) -> str:
    """A candidate's judged speedup in a run (harness/figures.py), as the report and history show it."""
    if result is None or result.speedup is None:
        return ""
    return (
        f"{fmt_x(result.speedup)} over {_short_incumbent(result.incumbent_label or 'mixed')} "
        f"({result.clocks.replace('event', 'events')})"
    )


def _show_candidate(led, cid: int, args) -> int:
    c = led.candidate(cid)
    if c is None:
        raise UsageError(f"no candidate {cid} in the ledger")
    if args.json:
        sys.stdout.write(json.dumps(candidate_doc(led, c), indent=2, default=str) + "\n")
        return 0
    eq = {True: "FpSan-equivalent to the baseline", False: "not structurally equivalent", None: "FpSan undecided"}[
        c.fpsan_equivalent
    ]
    ui.line(
        f"candidate #{c.id} {c.label} [{c.op}, {c.status}] by {c.proposer}; {eq}; hash {c.source_hash[:12]}",
        style="bold",
    )
    _print_checks(led.checks(cid))
    figs = led.figures(candidate_id=cid, judged_only=False)
    if figs:
        ui.table(
            "timings (against the incumbent timed beside it)",
            ["run", "shape", "ms", "spread", "incumbent", "its ms", "speedup", "clock", "of ceiling"],
            [
                [
                    f.run_id or "",
                    f.shape_key,
                    fmt_ms(f.kernel_ms),
                    fmt_spread(f.kernel_spread_ms),
                    _short_incumbent(f.incumbent_label),
                    fmt_ms(f.incumbent_ms),
                    fmt_x(f.speedup),
                    CLOCK_WORDS[f.clock],
                    f"{f.kernel.fraction(f.clock):.0%}" if f.kernel.fraction(f.clock) else "",
                ]
                for f in figs
            ],
        )
    unusable = any(x.get("name") == "reply" for x in (c.verdict or {}).get("checks", []))
    if unusable:  # no source came back: a diff would show the whole parent deleted
        ui.line(f"no source: the model's reply was unusable ({(c.verdict or {}).get('error', '')[:200]})")
    else:
        promo = next((p for p in led.promotions(op=c.op) if p.candidate_id == c.id), None)
        base = judged_base(led, c, promo.replaced_candidate_id if promo else None)
        diff = unified_diff(base.label, base.source, f"candidate #{c.id}", c.source)
        for line in filter(None, config_lines(base.source, c.source)):  # a configuration change says so first
            ui.line(line.replace("`", ""))
        if base.note:
            ui.line(base.note)
        ui.line(f"diff against {base.label} (what it was judged against):", style="bold")
        sys.stdout.write((diff or "(identical)\n") if not args.source else c.source)
    for r in led.field_failures(op=c.op, source_hash=c.source_hash):
        ui.line(f"field failure: {field_failure_line(r)}", style="green" if r.resolved else "red")
    _print_model_exchanges(led.model_calls(candidate_id=cid))
    return 0


def _print_checks(checks) -> None:
    if checks:
        # one row per check, from the most thorough mode that ran it (the quick stage repeats the full
        # stage's checks on fewer cases), and one line per mode with its totals
        rank = {mode: i for i, mode in enumerate(SanitizerMode)}  # (declared from the least thorough)
        best: Dict[str, Any] = {}
        for k in checks:
            if k.name not in best or rank.get(k.mode, 0) >= rank.get(best[k.name].mode, 0):
                best[k.name] = k
        order = list(dict.fromkeys(k.name for k in checks))
        by_mode: Dict[str, List[Any]] = {}
        for k in checks:
            by_mode.setdefault(k.mode, []).append(k)
        totals = "; ".join(
            f"{mode}: "
            + ", ".join(
                f"{n} {ui.STATUS_MARK.get(st, st)}"
                for st, n in sorted(collections.Counter(k.status for k in ks).items())
            )
            + f" in {sum(k.duration_s for k in ks):.1f}s"
            for mode, ks in by_mode.items()
        )
        ui.table(
            f"checks ({totals})",
            ["mode", "check", "result", "time", "detail"],
            [
                [
                    best[n].mode,
                    n,
                    ui.STATUS_MARK.get(best[n].status, best[n].status),
                    f"{best[n].duration_s:.1f}s",
                    best[n].detail,
                ]
                for n in order
            ],
            wrap=["detail"],
        )  # the detail (a failure, its --seed) is the point


def _print_model_exchanges(calls) -> None:
    for m in calls:
        ui.line(
            f"model exchange: {m.model}, {m.prompt_tokens}+{m.completion_tokens} tokens, {m.latency_s:.1f}s"
            + (f", error: {m.error}" if m.error else ""),
            style="bold",
        )
        try:
            msgs = json.loads(m.prompt)
            user = next((x["content"] for x in msgs if x.get("role") == "user"), "")
        except (ValueError, TypeError):
            user = m.prompt
        sys.stdout.write("--- prompt (user) ---\n" + user[:3000] + ("\n[...]\n" if len(user) > 3000 else "\n"))
        sys.stdout.write("--- reply ---\n" + (m.response or "(none)")[:3000] + "\n")


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
    from ..harness.bench import resolve_shapes  # here: torch, after the flags and the GPU
    from .publish import plan_target  # here: publication imports the serving set, which imports torch

    op = get_op(args.op)
    plan = plan_target(in_place=args.in_place)  # git missing is an error before anything is recorded
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
    from ..harness import serving  # here: torch, after the flags
    from ..harness.bench import record_shape_result, with_drawn_shape  # here: torch, after the flags
    from .publish import PromotionRequest, publish_promotion  # here: as the serving set

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
    done = publish_promotion(
        target,
        led,
        PromotionRequest(
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
    from ..harness import serving  # here: torch, after the flags

    return f"{target.shown(serving.MANIFEST_NAME)} ({serving.describe_entry(entry)})"


@command("demote")
def cmd_demote(args, devices: Optional[Devices] = None) -> int:
    """Remove a bucket's promoted kernel from the serving set and mark its promotion demoted, written where a
    promotion goes (agent/publish.py): a commit on a branch of its own where git tracks the serving folder,
    else (or with --in-place) in place. The GPU is `--gpu`, else this machine's (`devices`)."""
    from ..harness import serving  # here: torch, after the flags
    from .publish import plan_target  # here: publication imports the serving set, which imports torch

    check_op(args.op)
    gname = args.gpu or (devices or LocalDevices()).name() or "cpu"
    led = _demote_ledger(args)
    plan = plan_target(in_place=args.in_place)  # git missing is an error before anything is recorded
    served = serving.lookup(args.op, args.bucket, args.dtype, gname, dir=plan.source_dir)
    promo = _active_promotion(led, args.op, args.bucket, args.dtype, gname) if led is not None else None
    if served is None and promo is None:
        if led is not None and led.field_failures(
            unresolved_only=True, op=args.op, bucket=args.bucket, dtype=args.dtype, gpu=gname
        ):
            # the kernel that failed in the field serves no more (replaced, or removed by hand): resolved all the same
            _resolve_field_failures(led, args, gname, f"demote with nothing served: {args.reason}")
            return 0
        raise UsageError(
            f"nothing serves {args.op} {args.bucket} {args.dtype} on {gname}"
            + _served_elsewhere(serving.load_manifest(plan.source_dir), args)
        )
    led = led or open_ledger(args)
    # a demotion by hand is a run of its own (proposer 'manual'), as a promotion by hand is
    run = led.start_run(
        {
            "command": "demote",
            "op": args.op,
            "bucket": args.bucket,
            "dtype": args.dtype,
            "reason": args.reason,
            "in_place": args.in_place,
        },
        env.versions(),
        "manual",
        [args.op],
        gname,
        {},
    )
    target = plan.open(run.id)
    try:
        removed = serving.remove(args.op, args.bucket, args.dtype, gname, dir=target.dir)
        if promo is not None:
            led.demote(promo.id, args.reason)
        target.commit(
            f"Demote {args.op} {args.bucket} {args.dtype} on {gname}\n\n{args.reason}\n\n"
            f"The baseline serves the bucket again (kernel-agent run {run.id}).\n"
        )
    finally:
        info = target.close()
    led.set_run_status(run.id, RunStatus.FINISHED, finished=True, notes=RunNotesRecord(serving=info.to_json()))
    what = "removed from the serving set" if removed else "no serving entry (the ledger's promotion is marked demoted)"
    ui.line(f"demoted {args.op} {args.bucket} {args.dtype} on {gname}: {args.reason}; {what}; the baseline serves it")
    _resolve_field_failures(led, args, gname, run.id)
    ui.line(info.outcome())
    return 0


def _demote_ledger(args) -> Optional[Ledger]:
    """The ledger a demotion records in, if there is one yet. A ledger named (--ledger, KERNEL_AGENT_LEDGER) must
    exist: a typo creates none. The default one may not exist yet (a fresh clone, whose committed serving set
    holds before any run): None, and it is made once the demotion has something to record."""
    named = bool(getattr(args, "ledger", None) or os.environ.get("KERNEL_AGENT_LEDGER"))
    return open_ledger(args, existing=True) if named or os.path.exists(default_ledger()) else None


def _resolve_field_failures(led, args, gname: str, by: str) -> int:
    """Resolve the bucket's unresolved field failures (every kernel's that served it: the bucket is the baseline's
    now), and say how many."""
    n = led.resolve_field_failures(args.op, args.bucket, args.dtype, gname, by=by)
    ui.line(
        f"resolved {n} field failure(s) of {args.op} {args.bucket} {args.dtype} on {gname}"
        if n
        else "no unresolved field failure of this bucket"
    )
    return n


def _served_elsewhere(manifest: Manifest, args) -> str:
    """'; it is served on GPU (--gpu 'GPU' names it)' when the serving set has the bucket on other GPUs: on a
    machine without one, `demote` takes the GPU from `--gpu`."""
    gpus = sorted({e.gpu for e in manifest.entries if (e.op, e.bucket, e.dtype) == (args.op, args.bucket, args.dtype)})
    return f"; it is served on {', '.join(gpus)} (--gpu {shlex.quote(gpus[0])} names it)" if gpus else ""


def _active_promotion(led, op: str, bucket: str, dtype: str, gname: str):
    """The ledger's active promotion of a bucket on a GPU, whatever the spelling of the GPU's name (the manifest
    names GPUs by slug)."""
    from ..harness import serving  # here: torch, after the flags

    promo = led.active_promotion(op, bucket, dtype, gname)
    if promo is None:
        promo = next(
            (
                p
                for p in led.promotions(op=op, active_only=True)
                if p.bucket == bucket and p.dtype == dtype and serving.gpu_slug(p.gpu_name) == serving.gpu_slug(gname)
            ),
            None,
        )
    return promo

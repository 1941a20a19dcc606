"""`kernel-agent run`: the overnight loop (propose, sanitize, benchmark, promote): its flags, the checks made
before torch is imported, and the summary it prints."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional

from ... import agent  # the door to the modules that import torch: each is read when first used
from ...harness.ledger.ledger import CandidateStatus, Ledger, RunStatus, RunSummary, server_url, sqlite_path
from ...harness.ledger.run_hold import RunHold
from ...harness.workload.model_step import (
    KV_MODES,
    ModelConfigError,
    load_model_config,
    parse_bytes,
    parse_points,
)
from ...harness.workload.workload import DEFAULT_KV_BUDGET, analyze, workload_points
from .. import ui
from ..model_config import ModelConfig
from .common import (
    UsageError,
    check_counts,
    check_ledger_exists,
    check_writable,
    command,
    default_ledger,
    hint,
    parse_duration,
    parse_ops,
    read_config,
)


def register(sub) -> None:
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
        from ..ray_placement import RayPlacement  # optional extra: Ray, imported only for --cluster
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
    from ...harness.serving.serving import ServingError, load_manifest  # here: torch, after the flags

    if args.resume and args.in_place:
        raise UsageError("--in-place chooses where a new run writes; a resumed run keeps its own serving target")
    cfg = agent.RunConfig() if args.resume else _run_config(args, file_config.get("run", {}))
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
        summary = agent.run_loop(
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
    cfg = agent.RunConfig()
    _apply_budget_and_flags(args, file_run, cfg)
    _apply_target_model(args, file_run, cfg)
    try:
        targets = agent.targets_for(cfg)  # a bad --shapes is a usage error before anything is recorded
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
    def resume_command(run_id: str) -> str:
        return hint(f"run --resume {run_id}", args.ledger)

    if getattr(args, "json", False):
        return agent.RunEvents(resume_command=resume_command)
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
    return agent.RunEvents(
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

"""Subcommands beyond `sanitize`: registered on the parser and dispatched by agent/cli.py."""
from __future__ import annotations

import collections
import dataclasses
import difflib
import json
import os
import re
import sys
from typing import Any, Dict, List

from . import ui

COMMANDS: Dict[str, Any] = {}


def command(name):
    def deco(fn):
        COMMANDS[name] = fn
        return fn
    return deco


def _usage(msg: str):
    from .errors import UsageError
    return UsageError(msg)


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m:
        raise _usage(f"bad duration {text!r}: use e.g. 90s, 30m, 8h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _ops(text: str) -> List[str]:
    from .cli import OP_NAMES
    ops = list(OP_NAMES) if text in ("all", "") else [o.strip() for o in text.split(",") if o.strip()]
    for o in ops:
        if o not in OP_NAMES:
            raise _usage(f"unknown op {o!r}; expected one of {', '.join(OP_NAMES)} (or all)")
    return ops


def register(sub) -> None:
    r = sub.add_parser("run", help="the overnight loop: propose, sanitize, benchmark, promote")
    r.add_argument("--ops", default="all", help="comma list of ops, or all (default)")
    r.add_argument("--proposer", choices=["auto", "search", "model"], default="auto",
                   help="auto: the code model when an endpoint is configured, else the built-in search")
    r.add_argument("--model", help="model name at the OpenAI-compatible endpoint")
    r.add_argument("--base-url", help="endpoint URL (default: OPENAI_BASE_URL)")
    r.add_argument("--config", help="TOML config file ([model] and [run] sections)")
    r.add_argument("--candidates", type=int, help="candidate budget for the run (default 10, or no cap when "
                                                             "--time-limit is given)")
    r.add_argument("--per-round", type=int, help="proposals asked of the proposer at a time for one op and bucket (default 2)")
    r.add_argument("--time-limit", help="wall-time budget, e.g. 30m or 8h (default 30m); the run stops at it. With "
                                        "--resume: the time from now")
    r.add_argument("--tokens", type=int, help="model token budget")
    r.add_argument("--jobs", type=int, help="sanitizer processes in parallel (default: the usable cores, less one per GPU)")
    r.add_argument("--gpus", type=int, help="GPUs to evaluate on, one child each (default: every visible one)")
    r.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="dtype of the target shapes")
    r.add_argument("--shapes", help="target shapes: serving (default), near_serving, or explicit: 'a,b,c;...' for "
                                    "one op, 'op:a,b,c;op:...' for several (ops not named keep serving shapes)")
    r.add_argument("--seed", type=int, help="seed of the search proposer")
    r.add_argument("--no-compute-sanitizer", action="store_true", help="skip compute-sanitizer before promotion")
    r.add_argument("--candidates-dir", help="where candidate files are written (default kernels/candidates)")
    r.add_argument("--resume", metavar="RUN", help="continue an interrupted run")
    r.add_argument("--ledger", default=None, help="SQLite ledger (default runs/ledger.db)")
    r.add_argument("--json", action="store_true", help="print the run summary as JSON")

    b = sub.add_parser("bench", help="time kernels on the GPU against the incumbent and the torch anchor")
    b.add_argument("--op", required=True, help="an op, or all")
    b.add_argument("files", nargs="*", metavar="FILE", help="candidate files (default: the baseline only)")
    b.add_argument("--shapes", default="serving", help="serving | tiny | explicit shapes 'a,b,c;d,e,f'")
    b.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    b.add_argument("--json", action="store_true")
    b.add_argument("--out", help="also write the JSON document to this file")
    b.add_argument("--ledger", default=None, help="record the results in this ledger (default runs/ledger.db)")
    b.add_argument("--no-ledger", action="store_true")
    b.add_argument("--remeasure-ceilings", action="store_true")
    b.add_argument("--processes", type=int, default=1,
                   help="time each shape in this many processes, one after the other, and report a spread that "
                        "includes the differences between them (default 1)")

    h = sub.add_parser("history", help="runs, filters, per-op leaderboards, speedup trend")
    h.add_argument("--op")
    h.add_argument("--status", choices=["running", "finished", "interrupted", "failed"])
    h.add_argument("--since", help="date, e.g. 2026-11-01")
    h.add_argument("--until")
    h.add_argument("--proposer")
    h.add_argument("--limit", type=int, default=20)
    h.add_argument("--leaderboard", action="store_true", help="per-op leaderboard (needs --op)")
    h.add_argument("--trend", action="store_true", help="best speedup per run over time (needs --op)")
    h.add_argument("--ledger", default=None)
    h.add_argument("--json", action="store_true")

    s = sub.add_parser("show", help="a run or a candidate: verdicts, timings, diff, model exchange")
    s.add_argument("what", help="a run id (r...) or a candidate id (a number or c<number>)")
    s.add_argument("--ledger", default=None)
    s.add_argument("--json", action="store_true")
    s.add_argument("--source", action="store_true", help="print the candidate's whole source")

    p = sub.add_parser("promote", help="promote a candidate file into the serving set by the rule (GPU)")
    p.add_argument("--op", required=True)
    p.add_argument("file")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shapes", default="serving")
    p.add_argument("--reason", default="", help="why (recorded with the promotion)")
    p.add_argument("--margin", type=float, default=0.02)
    p.add_argument("--ledger", default=None)

    d = sub.add_parser("demote", help="remove a kernel from the serving set")
    d.add_argument("--op", required=True)
    d.add_argument("--bucket", required=True)
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--gpu", default=None, help="GPU name (default: this machine's)")
    d.add_argument("--reason", required=True)
    d.add_argument("--ledger", default=None)

    from .review import register as register_review
    register_review(sub, command)


def _ledger(args, read: bool = False):
    """The ledger of `--ledger` / KERNEL_AGENT_LEDGER / runs/ledger.db. `read`: a command that only reads
    it refuses a path that does not exist (a typo would otherwise create an empty ledger there)."""
    from ..harness.ledger import Ledger
    from .cli import default_ledger
    path = args.ledger or default_ledger()
    if read and not os.path.exists(path):
        raise _usage(f"no ledger at {path} (`kernel-agent run` creates it; --ledger or KERNEL_AGENT_LEDGER names "
                     f"another)")
    return Ledger(path, read_only=read)


# -- run ---------------------------------------------------------------------------------------

def _interrupt_on_signals() -> None:
    """SIGINT and SIGTERM stop a run cleanly (marked interrupted, resumable), also when the process
    was started with SIGINT ignored (background jobs of a non-interactive shell: Python then installs
    no handler of its own) or is stopped by a service manager (SIGTERM)."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


@command("run")
def cmd_run(args) -> int:
    from .cli import default_ledger
    # the flags alone are checked before torch is imported (seconds), so a usage error comes at once
    _ops(args.ops)
    if args.time_limit:
        _duration(str(args.time_limit))
    _interrupt_on_signals()
    ledger_path = args.ledger or default_ledger()
    events = _run_events(args)
    try:
        return _run(args, events, ledger_path)
    finally:
        if getattr(args, "_status_line", None) is not None:
            args._status_line.close()  # a live line left open would swallow the error that ended the run


def _run(args, events, ledger_path: str) -> int:
    from .loop import RunConfig, run_loop
    from .model import ModelConfig, load_config
    if args.resume:
        limit = _duration(str(args.time_limit)) if args.time_limit else None
        summary = run_loop(RunConfig(), ledger_path, resume=args.resume, events=events, time_limit_s=limit)
        return _print_run_summary(summary, args)
    file_run: Dict[str, Any] = load_config(args.config).get("run", {}) if args.config else {}
    cfg = RunConfig()
    if "ops" in file_run:
        cfg.ops = _ops(",".join(file_run["ops"]) if isinstance(file_run["ops"], list) else file_run["ops"])
    if args.ops != "all" or "ops" not in file_run:
        cfg.ops = _ops(args.ops)
    for key, attr, conv in (("candidates", "max_candidates", int), ("per_round", "per_round", int),
                            ("tokens", "token_budget", int), ("jobs", "jobs", int), ("dtype", "dtype", str),
                            ("shapes", "bench_shapes", str), ("seed", "seed", int), ("gpus", "gpus", int)):
        v = getattr(args, key, None)
        if v is None:
            v = file_run.get(key)
        if v is not None:
            try:
                setattr(cfg, attr, conv(v))
            except (TypeError, ValueError):
                raise _usage(f"{key.replace('_', '-')}: expected {'an integer' if conv is int else 'text'}, "
                             f"got {v!r}") from None
    tl = args.time_limit or file_run.get("time_limit")
    if tl:
        cfg.time_limit_s = _duration(str(tl))
        if args.candidates is None and "candidates" not in file_run:
            cfg.max_candidates = None  # a run given a time budget runs for that time
    if any(v is not None and v < 1 for v in (cfg.max_candidates, cfg.per_round, cfg.jobs, cfg.gpus)):
        raise _usage("--candidates, --per-round, --jobs and --gpus must be at least 1")
    cfg.compute_sanitizer = not args.no_compute_sanitizer
    from .loop import targets_for
    try:
        targets_for(cfg)  # a bad --shapes is a usage error before anything is recorded
    except ValueError as e:
        raise _usage(f"--shapes: {e}")
    if args.candidates_dir:
        cfg.candidates_dir = args.candidates_dir
    model = ModelConfig.resolve(args.model, args.base_url, args.config)
    if args.proposer == "model" and model is None:
        raise _usage("--proposer model: no endpoint configured (set OPENAI_BASE_URL / OPENAI_API_KEY, or pass "
                     "--base-url and --model)")
    use_model = args.proposer == "model" or (args.proposer == "auto" and model is not None)
    if use_model:
        cfg.proposer = "model"
        cfg.model = {k: getattr(model, k) for k in ("model", "base_url", "temperature", "max_tokens", "timeout_s",
                                                    "max_retries", "concurrency")}
        _check_endpoint(model)
    else:
        cfg.proposer = "search"
    summary = run_loop(cfg, ledger_path, events=events)
    return _print_run_summary(summary, args)


def _check_endpoint(model) -> None:
    """Fail early, in one line, when the endpoint cannot be used at all: whenever a model is configured
    (without a URL the client goes to OpenAI's API, which needs a key)."""
    import urllib.parse
    import socket
    url = model.base_url or OPENAI_DEFAULT_URL
    if not model.base_url and not model.api_key:
        raise _usage(f"model {model.model!r}: no endpoint: pass --base-url (or set OPENAI_BASE_URL), or set "
                     f"OPENAI_API_KEY for {OPENAI_DEFAULT_URL}")
    u = urllib.parse.urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise _usage(f"bad endpoint URL {url!r}")
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=5).close()
    except OSError as e:
        raise _usage(f"cannot reach the model endpoint {url}: {e.strerror or e}")


OPENAI_DEFAULT_URL = "https://api.openai.com/v1"  # where the openai client goes without a base URL


def _run_events(args):
    from .loop import RunEvents
    if getattr(args, "json", False):
        return RunEvents()
    marks = {"rejected": "reject", "verified": "verified", "benchmarked": "bench", "promoted": "PROMOTED"}

    def cand(label, status, detail):
        ui.line(f"  {marks.get(status, status):9s} {label}: {detail[:220]}",
                style={"promoted": "bold green", "rejected": "red"}.get(status))
    live = ui.StatusLine(plain_every_s=60.0)  # a live line on a terminal; a plain one a minute elsewhere
    args._status_line = live
    return RunEvents(note=lambda s: ui.line(s, style="bold"), candidate=cand,
                     status=lambda st: live.update(f"status: {st.describe()}"))


def _print_run_summary(summary: Dict[str, Any], args) -> int:
    if getattr(args, "_status_line", None) is not None:
        args._status_line.close()
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        return 0
    counts = summary.get("candidates_by_status", {})
    ui.line(f"run {summary['run_id']} {summary.get('status')}: {summary.get('stop_reason') or ''}", style="bold")
    ui.table("", ["proposed", "rejected", "verified", "benchmarked", "promoted", "tokens", "wall"],
             [[summary.get("candidates", 0), counts.get("rejected", 0), counts.get("verified", 0),
               counts.get("benchmarked", 0), counts.get("promoted", 0), summary.get("tokens", 0),
               f"{summary.get('wall_s') or 0:.0f}s"]], justify=["right"] * 7)
    if summary.get("duplicates"):
        ui.line(f"{summary['duplicates']} of them judged by earlier runs: replayed from the ledger, not judged again "
                f"and not counted against the budget")
    if summary.get("failed_checks"):
        ui.table("rejections by check", ["check", "candidates"], sorted(summary["failed_checks"].items()),
                 justify=["left", "right"])
    if not summary.get("benchmarked"):
        ui.line("no GPU: candidates were verified by the sanitizer, not benchmarked; nothing was promoted")
    for p in summary.get("promotions", []):
        ui.line(f"promoted {p['op']} {p['bucket']} {p['dtype']}: {p['reason']}", style="bold green")
    if summary.get("throughput_line"):
        ui.line(f"throughput: {summary['throughput_line']}")
    ui.line(f"details: kernel-agent show {summary['run_id']}")
    return 0


# -- bench -------------------------------------------------------------------------------------

@command("bench")
def cmd_bench(args) -> int:
    from ..harness.bench import NoGPU, load_ceilings, merge_processes, require_gpu, resolve_shapes, with_reported_times
    from ..harness.bench_worker import run_bench_isolated
    from ..harness.ops import get_op
    ops = _ops(args.op)
    for f in args.files:
        if not os.path.isfile(f):
            raise _usage(f"no such file: {f}")
    if args.files and len(ops) > 1:
        raise _usage("candidate files need a single --op")
    if args.processes < 1:
        raise _usage("--processes must be at least 1")
    try:
        require_gpu()
    except NoGPU as e:
        ui.error(str(e))
        return 2
    if args.remeasure_ceilings:
        load_ceilings(remeasure=True)
    doc: Dict[str, Any] = {"results": [], "errors": []}
    for name in ops:
        op = get_op(name)
        try:
            shapes = resolve_shapes(op, args.shapes)
        except ValueError as e:
            raise _usage(str(e))
        kernels = [{"label": "baseline", "file": None}] + [
            {"label": f"candidate:{os.path.basename(f)}", "file": os.path.abspath(f)} for f in args.files]
        with ui.Progress(f"bench {name}", len(shapes)) as prog:
            for s in shapes:
                spec = {"op": name, "shapes": [s.key()], "dtype": args.dtype, "kernels": kernels, "seed": 0}
                outs = [run_bench_isolated(spec) for _ in range(args.processes)]
                doc["ceilings"] = outs[-1].get("ceilings", doc.get("ceilings"))
                errors = [o["error"] for o in outs if o.get("error")]
                if errors:
                    doc["errors"].append(f"{name} {s.key()}: {errors[0]}")
                good = [o for o in outs if not o.get("error")] or outs[:1]  # what a failed one measured still shows
                n = min(len(o.get("results", [])) for o in good)
                results = [with_reported_times(merge_processes([o["results"][i] for o in good])) for i in range(n)]
                doc["results"] += results
                if not args.no_ledger:
                    _record_bench_doc(args, doc, results)
                if args.out:  # after every shape: a cut-short run keeps what it measured
                    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                    with open(args.out + ".tmp", "w") as f:
                        json.dump(doc, f, indent=1)
                    os.replace(args.out + ".tmp", args.out)
                prog.advance(f"{name} {s.key()}")
    if doc.get("run_id"):
        _ledger(args).set_run_status(doc["run_id"], "finished", finished=True)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        print_bench(doc)
    return 1 if doc["errors"] else 0


def _record_bench_doc(args, doc, results) -> None:
    from ..harness.env import versions
    led = _ledger(args)
    if not doc.get("run_id"):
        run = led.start_run({"command": "bench", "shapes": args.shapes, "dtype": args.dtype, "files": args.files},
                            versions(), "bench", _ops(args.op), (doc.get("ceilings") or {}).get("gpu"), {})
        doc["run_id"] = run.id
    from ..harness.bench import record_shape_result
    for res in results:
        record_shape_result(led, doc["run_id"], res)


def print_bench(doc) -> None:
    from ..harness.bench import reported_time
    c = doc.get("ceilings") or {}
    if c:
        ui.line(f"{c.get('gpu')}: ceilings copy {c.get('copy_tbps')} TB/s, bf16 matmul {c.get('bf16_tflops')} TFLOP/s")
    rows = []
    for res in doc["results"]:
        ms = res["measurements"]
        anchor = next((m for m in ms if m["label"].startswith("anchor")), None)
        for m in ms:
            if m.get("error"):
                rows.append([res["op"], res["shape"], res["dtype"], m["label"], "error", "", "", "", "", m["error"][:60]])
                continue
            ratio = f"{anchor['median_ms'] / m['median_ms']:.2f}x" if anchor and not anchor.get("error") else ""
            rate = f"{m['tflops']:.0f} TF/s" if m.get("ceiling_kind") == "compute" else f"{m['tbps']:.2f} TB/s"
            rep_ms, rep_spread, rep_kind = reported_time(m)
            rows.append([res["op"], res["shape"], res["dtype"], m["label"], f"{m['median_ms']:.4f}",
                         f"±{m['spread_ms']:.4f}", (f"{m['graph_ms']:.4f}" + (f" ±{m['graph_spread_ms']:.4f}" if m.get("graph_spread_ms") is not None else ""))
                         if m.get("graph_ms") else "", f"{rep_ms:.4f} ±{rep_spread:.4f} {rep_kind}", ratio, rate,
                         f"{m['fraction_of_ceiling']:.0%}" + (" IMPLAUSIBLE" if m.get("implausible") else "")])
    ui.table("", ["op", "shape", "dtype", "kernel", "median ms", "spread", "graph ms", "reported (run to run)",
                  "anchor/this", "rate", "of ceiling"], rows, justify=["left"] * 4 + ["right"] * 7)
    for e in doc.get("errors", []):
        ui.line(f"error: {e}", style="red")


# -- history and show --------------------------------------------------------------------------

@command("history")
def cmd_history(args) -> int:
    from .cli import _check_op
    from .review import history
    if args.op:
        _check_op(args.op)
    return history(args, _ledger(args, read=True))


@command("show")
def cmd_show(args) -> int:
    led = _ledger(args, read=True)
    what = args.what
    if re.fullmatch(r"c?\d+", what):
        return _show_candidate(led, int(what.lstrip("c")), args)
    run = led.get_run(what)
    if run is None:
        raise _usage(f"no run or candidate {what!r} in the ledger")
    return _show_run(led, run, args)


def _show_run(led, run, args) -> int:
    summary = led.run_summary(run.id)
    cands = led.candidates(run_id=run.id)
    if args.json:
        doc = {"run": summary, "config": run.config, "versions": run.versions,
               "candidates": [_cand_json(led, c) for c in cands]}
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    started = run.started_at.strftime("%Y-%m-%d %H:%M")
    ui.line(f"run {run.id} [{run.status}] proposer {run.proposer}, ops {run.ops}, started {started} UTC"
            + (f", gpu {run.gpu_name}" if run.gpu_name else ", no GPU"), style="bold")
    v = run.versions
    ui.line(f"versions: torch {v.get('torch')}, triton {v.get('triton')}, driver {v.get('driver')}, "
            f"python {v.get('python')}")
    rows = []
    for c in cands:
        verdict = c.verdict or {}
        first = next((ch for ch in verdict.get("checks", []) if ch.get("status") == "failed"), None)
        why = f"{first['name']}: {first['detail']}" if first else (verdict.get("error") or "")
        timing = _best_timing(led, c.id)
        eq = {True: "equiv", False: "not equiv", None: ""}[c.fpsan_equivalent]
        rows.append([c.id, c.op, c.label or "", c.status, eq, timing, why[:90]])
    ui.table("candidates", ["id", "op", "label", "status", "FpSan", "timing", "why"], rows)
    for p in summary.get("promotions", []):
        ui.line(f"promoted: {p['op']} {p['bucket']} {p['dtype']} candidate #{p['candidate_id']}: {p['reason']}",
                style="green")
    return 0


def _best_timing(led, cid) -> str:
    rows = [b for b in led.bench_results(candidate_id=cid) if b.label == "candidate"]
    if not rows:
        return ""
    return "; ".join(f"{b.shape_key}: {b.median_ms:.4f}ms" for b in rows[:2])


def _cand_json(led, c) -> Dict[str, Any]:
    return {"id": c.id, "op": c.op, "label": c.label, "status": c.status, "proposer": c.proposer,
            "fpsan_equivalent": c.fpsan_equivalent, "hash": c.source_hash, "parent_id": c.parent_id,
            "verdict": c.verdict,
            "checks": [{"name": k.name, "status": k.status, "detail": k.detail, "mode": k.mode}
                       for k in led.checks(c.id)],
            "bench": [{"label": b.label, "shape": b.shape_key, "dtype": b.dtype, "median_ms": b.median_ms,
                       "spread_ms": b.spread_ms, "fraction_of_ceiling": b.fraction_of_ceiling}
                      for b in led.bench_results(candidate_id=c.id)]}


def parent_source(led, c) -> tuple:
    """(label, source) of what a candidate was derived from: its parent, else the op's baseline."""
    if c.parent_id:
        p = led.candidate(c.parent_id)
        if p:
            return f"candidate #{p.id}", p.source
    from .search import baseline_source
    return f"kernels/baseline/{c.op}.py", baseline_source(c.op)


def unified_diff(old_label: str, old: str, new_label: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=old_label, tofile=new_label, n=3))


def _show_candidate(led, cid: int, args) -> int:
    c = led.candidate(cid)
    if c is None:
        raise _usage(f"no candidate {cid} in the ledger")
    if args.json:
        doc = _cand_json(led, c)
        doc["source"] = c.source
        doc["model_calls"] = [{"model": m.model, "prompt": m.prompt, "response": m.response,
                               "prompt_tokens": m.prompt_tokens, "completion_tokens": m.completion_tokens,
                               "latency_s": m.latency_s, "error": m.error} for m in led.model_calls(candidate_id=cid)]
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
        return 0
    eq = {True: "FpSan-equivalent to the baseline", False: "not structurally equivalent", None: "FpSan undecided"}[
        c.fpsan_equivalent]
    ui.line(f"candidate #{c.id} {c.label} [{c.op}, {c.status}] by {c.proposer}; {eq}; hash {c.source_hash[:12]}",
            style="bold")
    checks = led.checks(cid)
    if checks:
        # one row per check, from the most thorough mode that ran it (the quick stage repeats the full
        # stage's checks on fewer cases), and one line per mode with its totals
        rank = {"quick": 0, "full": 1, "gpu": 2}
        best: Dict[str, Any] = {}
        for k in checks:
            if k.name not in best or rank.get(k.mode, 0) >= rank.get(best[k.name].mode, 0):
                best[k.name] = k
        order = list(dict.fromkeys(k.name for k in checks))
        by_mode: Dict[str, List[Any]] = {}
        for k in checks:
            by_mode.setdefault(k.mode, []).append(k)
        totals = "; ".join(f"{mode}: " + ", ".join(f"{n} {ui.STATUS_MARK.get(st, st)}" for st, n in sorted(
            collections.Counter(k.status for k in ks).items())) + f" in {sum(k.duration_s for k in ks):.1f}s"
                           for mode, ks in by_mode.items())
        ui.table(f"checks ({totals})", ["mode", "check", "result", "time", "detail"],
                 [[best[n].mode, n, ui.STATUS_MARK.get(best[n].status, best[n].status), f"{best[n].duration_s:.1f}s",
                   best[n].detail[:140]] for n in order])
    bench = led.bench_results(candidate_id=cid)
    if bench:
        ui.table("timings", ["shape", "kernel", "dtype", "gpu", "median ms", "spread", "of ceiling"],
                 [[b.shape_key, b.label, b.dtype, b.gpu_name, f"{b.median_ms:.4f}", f"±{b.spread_ms:.4f}",
                   f"{b.fraction_of_ceiling:.0%}" if b.fraction_of_ceiling else ""] for b in bench])
    unusable = any(x.get("name") == "reply" for x in (c.verdict or {}).get("checks", []))
    if unusable:  # no source came back: a diff would show the whole parent deleted
        ui.line(f"no source: the model's reply was unusable ({(c.verdict or {}).get('error', '')[:200]})")
    else:
        plabel, psrc = parent_source(led, c)
        diff = unified_diff(plabel, psrc, f"candidate #{c.id}", c.source)
        ui.line(f"diff against {plabel}:", style="bold")
        sys.stdout.write((diff or "(identical)\n") if not args.source else c.source)
    for m in led.model_calls(candidate_id=cid):
        ui.line(f"model exchange: {m.model}, {m.prompt_tokens}+{m.completion_tokens} tokens, {m.latency_s:.1f}s"
                + (f", error: {m.error}" if m.error else ""), style="bold")
        try:
            msgs = json.loads(m.prompt)
            user = next((x["content"] for x in msgs if x.get("role") == "user"), "")
        except (ValueError, TypeError):
            user = m.prompt
        sys.stdout.write("--- prompt (user) ---\n" + user[:3000] + ("\n[...]\n" if len(user) > 3000 else "\n"))
        sys.stdout.write("--- reply ---\n" + (m.response or "(none)")[:3000] + "\n")
    return 0


# -- promote / demote --------------------------------------------------------------------------

@command("promote")
def cmd_promote(args) -> int:
    """Sanitize (full, GPU checks included), benchmark against the incumbent, apply the rule, install."""
    from ..harness import serving
    from ..harness.bench import NoGPU, record_shape_result, require_gpu, resolve_shapes
    from ..harness.bench_worker import run_bench_isolated
    from ..harness.env import gpu_name, versions
    from ..harness.ops import get_op
    from ..harness.promotion import judge_benchmark
    from ..sanitizer.runner import run_isolated
    from ..sanitizer.report import merge_gpu
    from .cli import _check_op
    _check_op(args.op)
    if not os.path.isfile(args.file):
        raise _usage(f"no such file: {args.file}")
    try:
        require_gpu()
    except NoGPU as e:
        ui.error(str(e))
        return 2
    op = get_op(args.op)
    led = _ledger(args)
    with open(args.file) as f:
        source = f.read()
    # a promotion by hand is a run of its own (proposer 'manual'), so `report` and `history` show it
    run = led.start_run({"command": "promote", "file": os.path.abspath(args.file), "dtype": args.dtype,
                         "shapes": args.shapes, "reason": args.reason}, versions(), "manual", [args.op], gpu_name(), {})
    cand, _ = led.add_candidate(args.op, source, "manual", run.id, path=os.path.abspath(args.file),
                                label=os.path.basename(args.file))
    ui.line(f"candidate #{cand.id}: sanitizing (full + GPU checks)...")
    v = merge_gpu(run_isolated(args.file, args.op, "full"), run_isolated(args.file, args.op, "gpu"))
    led.record_checks(cand.id, "full", [dataclasses.asdict(c) for c in v.checks])
    if not v.passed:
        led.set_candidate_status(cand.id, "rejected", verdict=v.to_json())
        led.set_run_status(run.id, "finished", finished=True)
        ui.line(f"not promoted: the sanitizer rejected it: {v.summary()}", style="red")
        return 1
    led.set_candidate_status(cand.id, "verified", verdict=v.to_json(), fpsan_equivalent=v.fpsan_equivalent)
    gname = gpu_name()
    shapes = resolve_shapes(op, args.shapes)
    by_bucket: Dict[str, list] = {}
    for s in shapes:
        by_bucket.setdefault(op.bucket(s), []).append(s)
    promoted_any = False
    for bucket, bshapes in by_bucket.items():
        entry = serving.lookup(args.op, bucket, args.dtype, gname)
        inc_file = os.path.join(serving.serving_dir(), entry["file"]) if entry else None
        spec = {"op": args.op, "shapes": [s.key() for s in bshapes], "dtype": args.dtype, "seed": 0,
                "kernels": [{"label": "incumbent", "file": inc_file},
                            {"label": "candidate", "file": os.path.abspath(args.file)}]}
        doc = run_bench_isolated(spec)
        for res in doc.get("results", []):
            record_shape_result(led, run.id, res, cand.id, "baseline" if inc_file is None else f"serving:{entry['file']}")
        j = judge_benchmark(doc, [s.key() for s in bshapes], args.margin)
        if j.error:
            ui.line(f"{bucket}: benchmark failed: {j.error}", style="red")
            continue
        for shape, (tc, ti), kind in zip(j.shapes, j.pairs, j.kinds):
            ui.line(f"  {shape}: candidate {tc.median_ms:.4f} ms ±{tc.spread_ms:.4f}, incumbent "
                    f"{ti.median_ms:.4f} ms ±{ti.spread_ms:.4f}" + (" (CUDA-graph replay)" if kind == "graph" else ""))
        decision = j.decision
        if not decision.promote:
            ui.line(f"{bucket}: not promoted: {decision.reason}", style="yellow")
            continue
        reason = decision.reason + (f"; {args.reason}" if args.reason else "")
        new_ms, old_ms = j.candidate_ms, j.incumbent_ms
        ver = versions()
        inst = serving.install(args.op, bucket, args.dtype, gname, source, cand.id, decision.gain, reason, ver,
                              shapes=list(j.shapes))
        led.record_promotion(run_id=run.id, op=args.op, bucket=bucket, dtype=args.dtype, gpu_name=gname,
                             candidate_id=cand.id, new_ms=new_ms, old_ms=old_ms, gain=decision.gain,
                             spread=decision.spread, reason=reason, versions=ver)
        ui.line(f"{bucket}: PROMOTED -> kernels/serving/{inst['file']}: {reason}", style="bold green")
        promoted_any = True
    led.set_run_status(run.id, "finished", finished=True)
    return 0 if promoted_any else 1


@command("demote")
def cmd_demote(args) -> int:
    from ..harness import serving
    from ..harness.env import gpu_name
    from .cli import _check_op
    _check_op(args.op)
    gname = args.gpu or gpu_name() or "cpu"
    led = _ledger(args)
    removed = serving.remove(args.op, args.bucket, args.dtype, gname)
    promo = led.active_promotion(args.op, args.bucket, args.dtype, gname)
    if promo is None:
        # the manifest names GPUs by slug; find the promotion whatever its spelling
        promo = next((p for p in led.promotions(op=args.op, active_only=True)
                      if p.bucket == args.bucket and p.dtype == args.dtype and
                      serving.gpu_slug(p.gpu_name) == serving.gpu_slug(gname)), None)
    if promo is not None:
        led.demote(promo.id, args.reason)
    if not removed and promo is None:
        raise _usage(f"nothing serves {args.op} {args.bucket} {args.dtype} on {gname}")
    ui.line(f"demoted {args.op} {args.bucket} {args.dtype} on {gname}: {args.reason}; the baseline serves it now")
    return 0

"""Workload traces: what a serving engine was asked to do, as JSON Lines (docs/WORKLOADS.md).

A trace is one JSON object per line:

    {"workload": 1, "source": "vllm benchmark_serving ...", "model": {...}}    optional, first line only
    {"arrival_s": 0.25, "prompt_tokens": 812, "output_tokens": 133}            a request
    {"batch": 48, "kv_tokens": 210331, "max_context": 8192}                    an engine step (optional)

Requests come in arrival order. Steps are what an engine recorded (FlashInfer-Bench's decode workloads
are steps): a trace may hold requests, steps, or both. `read_trace` streams a file record by record
(bounded memory whatever its length) and raises TraceError naming the line of the first bad record.

The importers (vLLM's and SGLang's serving benchmark results, FlashInfer-Bench's traces) read another tool's
output and write a trace: all of it or nothing (a temporary file
renamed into place once every record was read and checked).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple, Union

FORMAT_VERSION = 1


class TraceError(ValueError):
    """A malformed trace or import source, in one line naming the file and the line (exit 2)."""


class Request(NamedTuple):  # a tuple: a million of them are made in seconds
    arrival_s: float
    prompt_tokens: int
    output_tokens: int

    def to_json(self) -> Dict[str, Any]:
        return {
            "arrival_s": round(self.arrival_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
        }


class EngineStep(NamedTuple):
    """One decode step an engine ran: `batch` sequences holding `kv_tokens` cached tokens in all; the longest
    of them `max_context` tokens when the source says (else unknown: None)."""

    batch: int
    kv_tokens: int
    max_context: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"batch": self.batch, "kv_tokens": self.kv_tokens}
        if self.max_context is not None:
            d["max_context"] = self.max_context
        return d


@dataclass
class TraceHeader:
    source: str = ""
    model: Optional[Dict[str, Any]] = None  # harness.workload.model_step.ModelConfig fields, when the source knows them
    extra: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"workload": FORMAT_VERSION, "source": self.source}
        if self.model:
            d["model"] = self.model
        d.update(self.extra)
        return d


Record = Union[TraceHeader, Request, EngineStep]

REQUEST_KEYS = ("arrival_s", "prompt_tokens", "output_tokens")
STEP_KEYS = ("batch", "kv_tokens", "max_context")
HEADER_KEYS = ("workload", "source", "model", "note", "kv_layout")


def _count(obj: Dict[str, Any], key: str, least: int = 1) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ValueError(f"{key} must be an integer of at least {least}, got {v!r}")
    return v


def _plain_request(obj: Any) -> Optional[Request]:
    """The common line, a well-formed request of exactly its three keys, checked fast; None for anything
    else (parse_record then reads it, and names what is wrong)."""
    if type(obj) is not dict or len(obj) != 3:
        return None
    t, p, o = obj.get("arrival_s"), obj.get("prompt_tokens"), obj.get("output_tokens")
    if (
        type(p) is int
        and type(o) is int
        and p >= 1
        and o >= 1
        and (type(t) is float or type(t) is int)
        and 0 <= t < math.inf
    ):
        return Request(float(t), p, o)
    return None


def parse_record(obj: Any, first: bool) -> Record:
    """One line's object as a record; ValueError (the reason, without the place) when it is not one."""
    fast = _plain_request(obj)
    if fast is not None:
        return fast
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "workload" in obj:
        if not first:
            raise ValueError('a header ({"workload": ...}) may only be the first line')
        unknown = sorted(set(obj) - set(HEADER_KEYS))
        if obj["workload"] != FORMAT_VERSION or unknown:
            raise ValueError(
                f'header: expected "workload": {FORMAT_VERSION}'
                if obj["workload"] != FORMAT_VERSION
                else f"header: unknown key(s) {', '.join(unknown)}"
            )
        if obj.get("model") is not None and not isinstance(obj["model"], dict):
            raise ValueError("header: model must be an object of model config fields")
        return TraceHeader(
            str(obj.get("source", "")), obj.get("model"), {k: obj[k] for k in ("note", "kv_layout") if k in obj}
        )
    if "arrival_s" in obj:
        unknown = sorted(set(obj) - set(REQUEST_KEYS) - {"id"})
        if unknown:
            raise ValueError(f"request: unknown key(s) {', '.join(unknown)}; keys are {', '.join(REQUEST_KEYS)}")
        t = obj["arrival_s"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"arrival_s must be a number of seconds, at least 0, got {t!r}")
        return Request(float(t), _count(obj, "prompt_tokens"), _count(obj, "output_tokens"))
    if "batch" in obj:
        unknown = sorted(set(obj) - set(STEP_KEYS))
        if unknown:
            raise ValueError(f"step: unknown key(s) {', '.join(unknown)}; keys are {', '.join(STEP_KEYS)}")
        batch, tokens = _count(obj, "batch"), _count(obj, "kv_tokens")
        if tokens < batch:
            raise ValueError(f"step: kv_tokens={tokens} is less than batch={batch} (each sequence holds a token)")
        top = _count(obj, "max_context") if "max_context" in obj else None
        if top is not None and not (tokens / batch <= top <= tokens):
            raise ValueError(f"step: max_context={top} is not between the mean context and kv_tokens={tokens}")
        return EngineStep(batch, tokens, top)
    raise ValueError(
        "not a trace record: expected a request (arrival_s, prompt_tokens, output_tokens) or a step (batch, kv_tokens)"
    )


class TraceReader:
    """Streams a trace's records in order. `header` is known once the first line was read; `bytes_read`
    follows the file for a progress bar."""

    def __init__(self, path: str):
        if os.path.isdir(path):
            raise TraceError(f"{path}: is a folder; give the trace file (JSON Lines)")
        if not os.path.isfile(path):
            raise TraceError(f"no such trace: {path}")
        self.path = path
        self.size = os.path.getsize(path)
        self.bytes_read = 0
        self.header = TraceHeader()
        self.requests = 0
        self.steps = 0

    def __iter__(self) -> Iterator[Union[Request, EngineStep]]:
        last_arrival = 0.0
        loads = json.JSONDecoder().decode  # on the line's text: json.loads would detect the encoding of every line
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                self.bytes_read += len(raw)
                if not raw.strip():
                    continue
                try:
                    rec = parse_record(loads(raw.decode("utf-8")), first=lineno == 1)
                except (ValueError, UnicodeDecodeError) as e:
                    reason = f"not JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e).splitlines()[0]
                    raise TraceError(f"{self.path}:{lineno}: {reason}") from None
                if isinstance(rec, TraceHeader):
                    self.header = rec
                    continue
                if type(rec) is Request:
                    if rec.arrival_s < last_arrival:
                        raise TraceError(
                            f"{self.path}:{lineno}: arrival_s {rec.arrival_s} is before the previous "
                            f"request's {last_arrival}: requests must be in arrival order"
                        )
                    last_arrival = rec.arrival_s
                    self.requests += 1
                else:
                    self.steps += 1
                yield rec


def read_header(path: str) -> TraceHeader:
    """The trace's header (an empty one when it has none), reading its first line only."""
    reader = TraceReader(path)
    for _ in reader:
        break
    return reader.header


def check_trace(path: str) -> Tuple[int, int]:
    """Reads the whole trace once (TraceError at the first bad line): its (requests, steps)."""
    reader = TraceReader(path)
    for _ in reader:
        pass
    return reader.requests, reader.steps


# -- writing, all or nothing ----------------------------------------------------------------------------


def write_trace(out: str, header: TraceHeader, records: Callable[[], Iterator[Union[Request, EngineStep]]]) -> int:
    """Writes header and records to `out` through temporary files renamed into place when every record was
    produced: an importer that fails part-way (TraceError) leaves no file, and an older `out` untouched. The
    header is written last, before the records, so that an importer may complete it while it reads (the
    KV layout of FlashInfer-Bench's definitions). Returns the records written."""
    body, whole = f"{out}.records-{os.getpid()}", f"{out}.partial-{os.getpid()}"
    n = 0
    try:
        with open(body, "w", encoding="utf-8") as f:
            for rec in records():
                f.write(json.dumps(rec.to_json()) + "\n")
                n += 1
        if n == 0:
            raise TraceError(f"{out}: the source holds no request or decode step to import")
        with open(whole, "w", encoding="utf-8") as f, open(body, encoding="utf-8") as b:
            f.write(json.dumps(header.to_json()) + "\n")
            shutil.copyfileobj(b, f)
        os.replace(whole, out)
    finally:
        for tmp in (body, whole):
            if os.path.exists(tmp):
                os.unlink(tmp)
    return n


# -- importers ------------------------------------------------------------------------------------------


def _load_json(path: str) -> Any:
    if not os.path.isfile(path):
        raise TraceError(f"no such file: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (not UTF-8)") from None


def _benchmark_requests(
    doc: Any, path: str, tool: str, how: str
) -> Tuple[TraceHeader, Callable[[], Iterator[Request]]]:
    """The requests of a serving benchmark's result object (vLLM's and SGLang's share these fields): per
    request `input_lens`, `output_lens` and `errors` (empty for a success), and the run's `request_rate`.
    Results keep no send times: requests arrive evenly at the request rate (the rate the benchmark drew its
    Poisson arrivals at), all at once when it is inf. Failed requests, and requests that generated nothing,
    are left out."""
    if not isinstance(doc, dict) or "input_lens" not in doc or "output_lens" not in doc:
        raise TraceError(
            f"{path}: not a {tool} benchmark result with per-request lengths (no input_lens and "
            f"output_lens; save it with {how})"
        )
    ins, outs, errs = doc["input_lens"], doc["output_lens"], doc.get("errors") or []
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise TraceError(f"{path}: input_lens and output_lens must be lists of the same length")
    if errs and (not isinstance(errs, list) or len(errs) != len(ins)):
        raise TraceError(f"{path}: errors must be a list as long as input_lens")
    rate = doc.get("request_rate", "inf")
    try:
        rate = float(rate)
    except (TypeError, ValueError):
        raise TraceError(f"{path}: request_rate must be a number or inf, got {rate!r}") from None
    gap = 0.0 if not math.isfinite(rate) or rate <= 0 else 1.0 / rate
    model = doc.get("model_id") or doc.get("model") or "?"
    header = TraceHeader(
        f"{tool} serving benchmark: {os.path.basename(path)} ({model}, request_rate {rate:g})",
        extra={"note": "arrivals evenly spaced at request_rate (the result keeps no send times)"},
    )

    def records() -> Iterator[Request]:
        for i, (p, o) in enumerate(zip(ins, outs)):
            if errs and errs[i]:
                continue
            for name, v in (("input_lens", p), ("output_lens", o)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise TraceError(f"{path}: {name}[{i}]: expected a token count, got {v!r}")
            if p >= 1 and o >= 1:  # a request that produced nothing made no decode step
                yield Request(i * gap, p, o)

    return header, records


def vllm_requests(path: str) -> Tuple[TraceHeader, Callable[[], Iterator[Request]]]:
    """vLLM's serving benchmark result (`benchmarks/benchmark_serving.py --save-result`, `vllm bench serve
    --save-result`): one JSON document."""
    return _benchmark_requests(_load_json(path), path, "vLLM", "--save-result")


def sglang_requests(path: str) -> Tuple[TraceHeader, Callable[[], Iterator[Request]]]:
    """SGLang's serving benchmark output (`python -m sglang.bench_serving --output-file F.jsonl
    --output-details`): one JSON object appended per run; the last run is imported."""
    if not os.path.isfile(path):
        raise TraceError(f"no such file: {path}")
    last, where = None, 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                last, where = raw, lineno
    if last is None:
        raise TraceError(f"{path}: empty: no benchmark run in it")
    try:
        doc = json.loads(last)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}:{where}: not JSON ({getattr(e, 'msg', e)})") from None
    return _benchmark_requests(doc, f"{path}:{where}", "SGLang", "--output-details")


FLASHINFER_DECODE = re.compile(r"gqa_paged_decode_h(\d+)_kv(\d+)_d(\d+)_ps(\d+)")


def _flashinfer_step(obj: Any, lineno: int, path: str) -> Optional[Tuple[str, EngineStep, Dict[str, int]]]:
    """A FlashInfer-Bench trace line of a GQA paged decode as (workload uuid, step, KV layout); None for
    a line of another definition."""
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("definition"), str)
        or not isinstance(obj.get("workload"), dict)
    ):
        raise TraceError(f"{path}:{lineno}: not a FlashInfer-Bench trace line (definition and workload)")
    m = FLASHINFER_DECODE.fullmatch(obj["definition"])
    if not m:
        return None
    wl = obj["workload"]
    axes = wl.get("axes")
    if not isinstance(axes, dict):
        raise TraceError(f"{path}:{lineno}: workload has no axes")
    page = int(m.group(4))
    batch = axes.get("batch_size")
    if batch is None:
        indptr = axes.get("len_kv_indptr", axes.get("len_indptr"))
        batch = indptr - 1 if isinstance(indptr, int) and not isinstance(indptr, bool) else None
    pages = axes.get("num_kv_indices")
    for name, v in (("batch_size (or len_kv_indptr)", batch), ("num_kv_indices", pages)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TraceError(f"{path}:{lineno}: axes: {name} must be a positive integer, got {v!r}")
    assert isinstance(batch, int) and isinstance(pages, int)  # the loop above refused anything else
    if pages < batch:
        raise TraceError(f"{path}:{lineno}: axes: num_kv_indices={pages} is less than the batch {batch}")
    layout = {"heads": int(m.group(1)), "kv_heads": int(m.group(2)), "head_dim": int(m.group(3)), "page_size": page}
    # whole pages: with pages of one token (the traces' usual ps1) the exact token count
    return str(wl.get("uuid", lineno)), EngineStep(batch, pages * page), layout


def flashinfer_steps(path: str) -> Tuple[TraceHeader, Callable[[], Iterator[EngineStep]]]:
    """FlashInfer-Bench's trace schema (JSON Lines of {definition, workload: {uuid, axes, inputs}, solution,
    evaluation}): each GQA paged-decode workload is one engine step (batch_size, or len_kv_indptr - 1, and
    num_kv_indices pages of page_size tokens). The same workload benchmarked by several solutions appears
    once; other definitions (prefill, GEMM, ...) are left out."""
    if not os.path.isfile(path):
        raise TraceError(f"no such file: {path}")
    header = TraceHeader(f"flashinfer-bench: {os.path.basename(path)}")

    def records() -> Iterator[EngineStep]:
        seen = set()
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise TraceError(f"{path}:{lineno}: not JSON ({getattr(e, 'msg', e)})") from None
                got = _flashinfer_step(obj, lineno, path)
                if got is None or got[0] in seen:
                    continue
                seen.add(got[0])
                header.extra["kv_layout"] = got[2]
                yield got[1]

    return header, records


IMPORTERS: Dict[str, Callable[[str], Tuple[TraceHeader, Callable[[], Iterator[Any]]]]] = {
    "vllm": vllm_requests,
    "sglang": sglang_requests,
    "flashinfer-bench": flashinfer_steps,
}


def import_trace(fmt: str, source: str, out: str) -> int:
    """Imports `source` (a file in format `fmt`, one of IMPORTERS) into the trace `out`; the records written."""
    header, records = IMPORTERS[fmt](source)
    return write_trace(out, header, records)


__all__ = [
    "FORMAT_VERSION",
    "TraceError",
    "Request",
    "EngineStep",
    "TraceHeader",
    "parse_record",
    "TraceReader",
    "read_header",
    "check_trace",
    "write_trace",
    "vllm_requests",
    "sglang_requests",
    "flashinfer_steps",
    "IMPORTERS",
    "import_trace",
]

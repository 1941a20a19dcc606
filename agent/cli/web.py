"""`kernel-agent serve`: a read-only web view of the ledger (Starlette, Jinja2, uvicorn: the [web] extra).

Pages: the runs (filtered by op, status, GPU and date; a run in progress updates live), a run (its
candidates and the plots of `report`), a candidate (verdict, checks, timings, the diff, the model's
exchange) and the serving set. Each page reads the same documents as the command line's `--json`
(agent/views.py), and its JSON API returns exactly those, so a page and `history`/`show` never disagree.

Everything a candidate or a model wrote (sources, labels, check details, prompts, replies) is data: the
templates autoescape it, the scripts set it as text, never as markup, and a Content-Security-Policy allows
only this server's own scripts and styles. The ledger is opened read-only (SQLite `mode=ro`, PostgreSQL
read-only transactions) and there is no route but GET.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from typing import Any, Dict, Optional, Tuple

import jinja2
import uvicorn
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, PythonLexer
from sqlalchemy.exc import DBAPIError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...harness.bench.figures import CLOCK_WORDS, fmt_ms, fmt_spread, fmt_x
from ...harness.ledger.ledger import RUN_STATUSES, Ledger, LedgerError
from ...ops import NAMES as OP_NAMES
from .. import publish  # noqa: F401 - what `show RUN` reads loads torch: once, before the first page asks
from .plots import run_plots
from .views import candidate_doc, history_data, run_doc, serving_doc

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "web_templates")
STATIC = os.path.join(HERE, "web_static")
POLL_MS = 2000  # how often a page with a run in progress asks for news
PLOT_NAMES = ("speedup.png", "progress.png")
# Only this server's own files: an injected <script> or event attribute would not run even if one got through.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_FILTER_PARAMS = ("op", "status", "gpu", "since", "until")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _highlighted(text: str, lexer) -> Markup:
    """Pygments' HTML for `text`: every token it emits is HTML-escaped by its formatter, so the markup holds
    the text as data (spans with classes, no styles, no links)."""
    return Markup(highlight(text, lexer, HtmlFormatter(nowrap=True, classprefix="hl-")))


def _messages(prompt: str):
    """A model call's prompt as (role, text) pairs: the chat messages it recorded, or the text itself."""
    try:
        msgs = json.loads(prompt or "")
    except ValueError:
        msgs = None
    if isinstance(msgs, list) and all(isinstance(m, dict) for m in msgs):
        return [(str(m.get("role", "")), str(m.get("content", ""))) for m in msgs]
    return [("prompt", prompt or "")]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    env.filters.update(
        ms=fmt_ms,
        spread=fmt_spread,
        x=fmt_x,
        clock=lambda c: CLOCK_WORDS.get(c, c or ""),
        python=lambda s: _highlighted(s or "", PythonLexer()),
        diff=lambda s: _highlighted(s or "", DiffLexer()),
        pct=lambda v: f"{v:.0%}" if v else "",
        when=lambda s: (s or "")[:16].replace("T", " "),
        messages=_messages,
    )
    return env


class PlotCache:
    """The PNGs `report` draws for a run (review.run_plots), drawn once per state of its figures: a run in
    progress gets new ones when a benchmark or a promotion is recorded. matplotlib's pyplot is not
    thread-safe, so one drawing at a time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._cache: Dict[Tuple, Dict[str, bytes]] = {}

    def get(self, led: Ledger, run, name: str, state: Tuple) -> Optional[bytes]:
        key = (run.id,) + state
        with self._lock:
            if key not in self._cache:
                with tempfile.TemporaryDirectory(prefix="kernel-agent-plots-") as out:
                    drawn = run_plots(led, run, out)
                    self._cache = {k: v for k, v in self._cache.items() if k[0] != run.id}
                    self._cache[key] = {os.path.basename(p): open(p, "rb").read() for _, p in drawn}
            return self._cache[key].get(name)


def _filters(request: Request) -> Dict[str, Optional[str]]:
    """The runs page's filters from the query string; a bad value is a 400, not a traceback."""
    q = {k: (request.query_params.get(k) or None) for k in _FILTER_PARAMS}
    if q["op"] is not None and q["op"] not in OP_NAMES:
        raise HTTPException(400, f"unknown op {q['op']!r}")
    if q["status"] is not None and q["status"] not in RUN_STATUSES:
        raise HTTPException(400, f"unknown status {q['status']!r}")
    for k in ("since", "until"):
        if q[k] is not None and not _DATE.fullmatch(q[k]):  # type: ignore[arg-type]
            raise HTTPException(400, f"{k}: a date as YYYY-MM-DD")
    return q


def _json(doc: Any) -> Response:
    """A document as the command line prints it (json.dumps with default=str), byte for byte the same data."""
    return Response(json.dumps(doc, indent=2, default=str) + "\n", media_type="application/json")


class WebView:
    """The pages and the JSON API over one ledger, opened read-only by the caller."""

    def __init__(self, led: Ledger):
        self.led = led
        self.env = _environment()
        self.plots = PlotCache()

    def page(self, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(ledger=self.led.shown, poll_ms=POLL_MS, **ctx)
        return HTMLResponse(html, status_code=status)

    def _run(self, request: Request):
        run = self.led.get_run(request.path_params["run_id"])
        if run is None:
            raise HTTPException(404, f"no run {request.path_params['run_id']!r} in the ledger")
        return run

    def _candidate(self, request: Request):
        c = self.led.candidate(request.path_params["cid"])
        if c is None:
            raise HTTPException(404, f"no candidate {request.path_params['cid']} in the ledger")
        return c

    def _history(self, request: Request):
        try:
            limit = int(request.query_params.get("limit", "100"))
        except ValueError:
            raise HTTPException(400, "limit: a whole number") from None
        return history_data(self.led, limit=max(1, limit), **_filters(request))  # type: ignore[arg-type]

    def _plot_state(self, run) -> Tuple:
        """What the plots of a run are drawn from changes only with these (a run in progress adds to them)."""
        s = self.led.run_summary(run.id)
        return s.bench_results, len(s.promotions), str(s.status)

    # -- pages ---------------------------------------------------------------------------------
    def runs_page(self, request: Request) -> HTMLResponse:
        q = _filters(request)
        gpus = sorted({r.gpu_name for r in self.led.runs(limit=None) if r.gpu_name})
        return self.page("runs.html", filters=q, ops=OP_NAMES, statuses=RUN_STATUSES, gpus=gpus)

    def run_page(self, request: Request) -> HTMLResponse:
        run = self._run(request)
        state = self._plot_state(run)
        plots = [n for n in PLOT_NAMES if self.plots.get(self.led, run, n, state) is not None]
        return self.page("run.html", run=run, plots=plots, version="-".join(map(str, state)))

    def candidate_page(self, request: Request) -> HTMLResponse:
        doc = candidate_doc(self.led, self._candidate(request))
        runs = sorted({f["run_id"] for f in doc["figures"] if f["run_id"]})
        return self.page("candidate.html", c=doc, runs=runs)

    def serving_page(self, request: Request) -> HTMLResponse:
        return self.page("serving.html", doc=serving_doc(self.led))

    def plot(self, request: Request) -> Response:
        run = self._run(request)
        png = self.plots.get(self.led, run, request.path_params["name"], self._plot_state(run))
        if png is None:
            raise HTTPException(404, "no such plot for this run")
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-cache"})

    # -- the JSON API: the command line's documents ----------------------------------------------
    def api_runs(self, request: Request) -> Response:  # history --json (with ?limit=N, as --limit N)
        return _json(self._history(request).to_json())

    def api_run(self, request: Request) -> Response:  # show RUN --json
        return _json(run_doc(self.led, self._run(request)))

    def api_candidate(self, request: Request) -> Response:  # show C --json
        return _json(candidate_doc(self.led, self._candidate(request)))

    def api_serving(self, request: Request) -> Response:  # history --serving --json
        return _json(serving_doc(self.led))


def create_app(led: Ledger) -> Starlette:
    """The application over an open (read-only) ledger. Every route is GET (and HEAD): nothing writes."""
    view = WebView(led)
    get = ["GET"]
    routes = [
        Route("/", view.runs_page, methods=get),
        Route("/runs/{run_id}", view.run_page, methods=get),
        Route("/runs/{run_id}/plots/{name}", view.plot, methods=get),
        Route("/candidates/{cid:int}", view.candidate_page, methods=get),
        Route("/serving", view.serving_page, methods=get),
        Route("/api/runs", view.api_runs, methods=get),
        Route("/api/runs/{run_id}", view.api_run, methods=get),
        Route("/api/candidates/{cid:int}", view.api_candidate, methods=get),
        Route("/api/serving", view.api_serving, methods=get),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    def error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 503)
        detail = (
            exc.detail
            if isinstance(exc, HTTPException)
            else f"the ledger cannot be read now: {str(getattr(exc, 'orig', exc)).splitlines()[0]}"
        )
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": detail}, status_code=status)
        return view.page("error.html", status=status, message=detail)

    # a ledger that went away or is busy past its timeout: one line, status 503, never a traceback page
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: error, LedgerError: error, DBAPIError: error},
        middleware=[Middleware(SecurityHeaders)],
    )


class SecurityHeaders:
    """ASGI middleware: every response carries the Content-Security-Policy and tells the browser not to
    guess content types or send this server's addresses elsewhere."""

    HEADERS = [
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    ]

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + self.HEADERS)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def serve(led: Ledger, sock, announce) -> None:
    """Serve the ledger on a bound, listening socket until interrupted; `announce()` says where first."""
    config = uvicorn.Config(create_app(led), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    announce()
    server.run(sockets=[sock])

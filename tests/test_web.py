"""`kernel-agent serve`, tested in a real browser: Debian's Chromium driven by Playwright.

The servers are the command a user runs (`kernel-agent serve --port 0`), over: a ledger built by a real CPU
run (the code-model path against a scripted endpoint: a kernel that passes, a cheat the static gate
rejects, a reply with no code), the committed H200 ledgers, a ledger the tests write to while a page is
open, and one filled with hostile text. Outside CI a machine without Chromium or the [web] extra skips
these tests, saying why; in CI (CI=true) their absence fails.

    KERNEL_AGENT_SCREENSHOTS=docs/web pytest tests/test_web.py -k navigation   # regenerates docs/web/*.png
"""

import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from datetime import datetime, timezone

import pytest

from committed_h200 import H200, ROOT
from committed_h200 import RUN as H200_RUN
from kernel_agent.agent.cli import main as cli_main
from kernel_agent.harness.bench.figures import fmt_x
from kernel_agent.harness.field_failures import FailureKind
from kernel_agent.harness.ledger.ledger import CandidateStatus, Ledger, RunStatus, upgrade_ledger
from kernel_agent.sanitizer.canonical import as_written
from test_review import _ledger_with_a_field_failure
from tiers import exhaustive

# one worker starts the browser and the servers under pytest-xdist (module-scoped fixtures; tests/conftest.py)
pytestmark = pytest.mark.xdist_group("web")

CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]
CHROMIUM = os.environ.get("KERNEL_AGENT_CHROMIUM", "/usr/bin/chromium")
PR_EXAMPLE = os.path.join(ROOT, "results", "h200", "pr_example", "ledger.db")
PR_RUN = "r20261202-051203-138e"  # the committed example: candidate #9 promoted
IN_CI = os.environ.get("CI", "").lower() == "true"
WAIT_MS = 60000  # a page's data on a loaded 2-core machine (the first plots draw with matplotlib)


def _require(ok: bool, why: str) -> None:
    if not ok:
        if IN_CI:
            pytest.fail(f"CI must run the browser tests: {why}")
        pytest.skip(why)


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def browser():
    _require(
        all(_importable(m) for m in ("starlette", "uvicorn", "jinja2", "pygments")),
        "the [web] extra is not installed (pip install -e '.[web]')",
    )
    _require(_importable("playwright"), "playwright is not installed (requirements-dev.txt)")
    _require(os.path.exists(CHROMIUM), f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Server:
    """`kernel-agent serve --port 0` over a ledger, as a user starts it; its URL from the line it prints."""

    def __init__(self, ledger: str, *extra: str, cwd: str = ROOT):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            CLI + ["serve", "--ledger", str(ledger), "--port", "0", *extra],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.first_line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+/)", self.first_line)
        if m is None:
            self.stop()
            raise AssertionError(f"serve printed {self.first_line!r}; stderr {self.proc.stderr.read()[-2000:]}")
        self.url = m.group(1)

    def stop(self) -> None:
        """Stop it, and print what it wrote to stderr (pytest shows it beside a failure)."""
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if err.strip():
            print(f"serve {self.url} stderr:\n{err[-4000:]}")


@pytest.fixture
def serve():
    servers = []

    def start(ledger, *extra, cwd=ROOT):
        servers.append(Server(ledger, *extra, cwd=cwd))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _page(browser, width=1280):
    """A page that ignores the server's Content-Security-Policy: Playwright's waits evaluate strings, and an
    escape test must show that no markup gets through, not that the policy would stop what did."""
    page = browser.new_page(viewport={"width": width, "height": 900}, bypass_csp=True)
    page.set_default_timeout(WAIT_MS)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on(
        "console",
        lambda m: page.errors.append(m.text) if m.type == "error" and "Failed to load" not in m.text else None,
    )
    page.on("response", lambda r: page.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return page


def _loaded(page, times: int = 1) -> None:
    """Wait until the page's script has drawn its data `times` times."""
    page.wait_for_function(f"Number(document.body.dataset.loaded || 0) >= {times}", timeout=WAIT_MS)


def _fits(page) -> None:
    """Nothing on the page is wider than the window: a long word wraps or scrolls inside its own box."""
    width = page.evaluate("window.innerWidth")
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def _shot(page, tmp_path, name: str, max_height: int = 2400) -> None:
    """A screenshot of the page's top `max_height` pixels; under KERNEL_AGENT_SCREENSHOTS, kept there
    (docs/web/ is made this way)."""
    height = min(max_height, page.evaluate("document.documentElement.scrollHeight"))
    width = page.evaluate("window.innerWidth")
    page.screenshot(path=str(tmp_path / name), full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height})
    keep = os.environ.get("KERNEL_AGENT_SCREENSHOTS")
    if keep:
        os.makedirs(os.path.join(ROOT, keep), exist_ok=True)
        shutil.copy(tmp_path / name, os.path.join(ROOT, keep, name))


def _copy(src: str, tmp_path, name: str = "ledger.db") -> str:
    dst = tmp_path / name
    shutil.copy(src, dst)
    return str(dst)


# -- a ledger built by a real CPU run ----------------------------------------------------------------

CPU_RUN_TEST = "test_a_real_cpu_run_reads_as_its_verdicts_reproductions_and_model_exchanges"


@pytest.fixture(scope="module", autouse=True)
def cpu_run(request, tmp_path_factory):
    """`kernel-agent run` on this CPU with the code-model proposer against a scripted endpoint: an
    out-of-bounds store (caught by the quick stage), a torch fallback (the static gate) and a reply without
    code. Started with the module when its test is selected, so that the other tests go on meanwhile (that
    test comes last); returns a function that waits for it and gives (ledger, run id)."""
    if not any(item.name == CPU_RUN_TEST for item in request.session.items) or not os.path.exists(CHROMIUM):
        return None
    from openai_stub import Stub

    tmp = tmp_path_factory.mktemp("cpu_run")
    base = open(os.path.join(ROOT, "kernels", "baseline", "quantize_kv.py")).read()
    oob = base.replace(
        "tl.store(scale_ptr + rows, scale, mask=row_mask)", "tl.store(scale_ptr + rows, scale, mask=rows <= R)"
    )
    assert oob != base
    cheat = open(
        os.path.join(ROOT, "tests", "candidates", "hostile", "compute_outside_triton", "04_noop_kernel_plus_torch.py")
    ).read()
    stub = Stub(
        [
            {"reply": "Here is a faster version:\n```python\n" + oob + "```"},
            {"reply": "```python\n" + cheat + "```"},
            {"reply": "I would rather not."},
        ]
    )
    port = stub.start()
    (tmp / "ka.toml").write_text(
        f'[model]\nname = "scripted"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        f'api_key = "x"\n[run]\nops = ["quantize_kv"]\ncandidates = 3\nper_round = 3\njobs = 2\n'
    )
    ledger = tmp / "ledger.db"
    proc = subprocess.Popen(
        CLI
        + [
            "run",
            "--config",
            str(tmp / "ka.toml"),
            "--ledger",
            str(ledger),
            "--candidates-dir",
            str(tmp / "c"),
            "--json",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TRITON_INTERPRET="1"),
    )

    def cleanup():  # a run the tests did not wait for (a failure before the last test) is stopped
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        stub.stop()

    request.addfinalizer(cleanup)

    def finished():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        return str(ledger), json.loads(out)["run_id"]

    return finished


# -- the committed H200 example: every view, the figures, the JSON -------------------------------------


@exhaustive
def test_navigation_runs_run_candidate_serving_on_the_h200_example(browser, serve, tmp_path):
    shown = os.path.relpath(PR_EXAMPLE, ROOT)  # a copy at the committed path, so that the pages name it
    os.makedirs(tmp_path / os.path.dirname(shown))
    shutil.copy(PR_EXAMPLE, tmp_path / shown)
    srv = serve(shown, cwd=str(tmp_path))
    assert "127.0.0.1" in srv.first_line and "read-only" in srv.first_line and "this machine only" in srv.first_line
    page = _page(browser)
    page.goto(srv.url)
    _loaded(page)
    assert page.locator("#runs tbody tr").count() == 1
    assert "first benchmark after 112s" in page.inner_text("#runs")  # the run's throughput line
    _shot(page, tmp_path, "runs.png")
    page.click(f"#runs a[href='/runs/{PR_RUN}']")
    _loaded(page)
    assert page.locator("#candidates tbody tr").count() == 19
    facts = page.inner_text("#run-facts")  # `history`'s count: 17 judged by the run itself, 2 left unjudged
    assert "17 (verified 7, benchmarked 9, promoted 1); replayed from earlier runs: 0" in facts, facts
    assert "driver 580.159.04" in facts and "null" not in facts
    assert "1.086x" in page.inner_text("#candidates tr[data-cand='9']")
    assert page.locator("#plots img").count() == 2
    page.wait_for_function(
        "[...document.querySelectorAll('#plots img')].every(i => i.complete && i.naturalWidth > 0)", timeout=WAIT_MS
    )
    _shot(page, tmp_path, "run.png")
    page.click("#candidates a[href='/candidates/9']")
    assert page.inner_text("#cand-status") == "promoted"
    assert "0.2653 → 0.2443 ms" in page.inner_text("#promotion")
    bench = page.inner_text("#bench")
    assert "0.2443" in bench and "1.086x" in bench and "events" in bench  # the clock is named
    assert page.locator("#diff span").count() > 10  # highlighted
    _the_diff_is_against_the_base_it_was_judged_against(page, srv)
    _shot(page, tmp_path, "candidate.png", max_height=4000)  # down to its diff
    page.click("#nav-serving")
    serving = page.inner_text("#serving")
    assert "kernel #9" in serving and "1.086x" in serving and "torch 2.11.0" in serving
    assert "#9" in page.inner_text("#promotions") and page.locator(".trend svg rect").count() == 1
    _shot(page, tmp_path, "serving.png")
    small = _page(browser, 375)
    small.goto(srv.url + f"runs/{PR_RUN}")
    _loaded(small)
    _fits(small)
    _shot(small, tmp_path, "run-375.png")
    assert page.errors == [] and small.errors == []


def _the_diff_is_against_the_base_it_was_judged_against(page, srv) -> None:
    """Candidate #9 of the H200 example changed `_config` only; the baseline has changed since it was judged. Its
    diff is against the source it was made of: the ten lines of the configuration change, not a diff against
    today's baseline that seems to delete the kernel's checks."""
    doc = page.request.get(srv.url + "api/candidates/9").json()  # what `show 9 --json` prints
    diff = page.inner_text("#diff")
    assert diff.strip() == doc["diff"].strip()
    assert "has changed since the candidate was judged" in page.inner_text("#diff-note")
    assert "+_TUNED_TO = (16, 128, 4, 3)" in diff and "-def _config(B, Hkv, max_ctx, device):" in diff
    removed = [ln for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert len(removed) == 1 and not any("raise ValueError" in ln for ln in removed), removed
    assert "(5, 128, 4, 3) -> (16, 128, 4, 3)" in page.inner_text("#config-change")


@pytest.fixture(scope="module")
def h200_search(browser, tmp_path_factory):
    """One server over a copy of the committed H200 search ledger, shared by the tests that only read it."""
    ledger = _copy(os.path.join(H200, "ledger.db"), tmp_path_factory.mktemp("h200_search"))
    srv = Server(ledger)
    yield ledger, srv
    srv.stop()


@exhaustive
def test_the_plots_and_figures_on_the_page_are_those_of_show_and_report(browser, h200_search, tmp_path, capsys):
    from kernel_agent.agent.cli import main

    ledger, srv = h200_search
    assert main(["report", H200_RUN, "--ledger", ledger, "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert main(["show", H200_RUN, "--ledger", ledger, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    page = _page(browser)
    page.goto(srv.url + f"runs/{H200_RUN}")
    _loaded(page)
    for name in ("speedup.png", "progress.png"):
        src = page.get_attribute(f"#plots img[data-name='{name}']", "src")
        assert page.request.get(srv.url.rstrip("/") + src).body() == (tmp_path / "report" / name).read_bytes()
    report = (tmp_path / "report" / "report.md").read_text()
    compared = 0
    for c in shown["candidates"]:
        figs = [f for f in c["figures"] if f["run_id"] == H200_RUN]
        on_page = page.locator(f"#candidates tr[data-cand='{c['id']}'] .speedup").all_inner_texts()
        assert on_page == [fmt_x(f["speedup"]) for f in figs]
        for f in figs:
            if c["status"] in ("benchmarked", "promoted"):  # the report's benchmark table: judged figures
                assert f"({fmt_x(f['speedup'])})" in report
                compared += 1
    assert compared >= 10


@exhaustive
def test_the_json_api_returns_what_the_command_line_prints(browser, h200_search, capsys):
    from kernel_agent.agent.cli import main

    ledger, srv = h200_search
    page = _page(browser)
    for api, argv in (
        ("api/runs?limit=20", ["history", "--json", "--limit", "20"]),
        ("api/runs?op=quantize_kv&limit=5", ["history", "--json", "--op", "quantize_kv", "--limit", "5"]),
        (f"api/runs/{H200_RUN}", ["show", H200_RUN, "--json"]),
        ("api/candidates/33", ["show", "33", "--json"]),
        ("api/serving", ["history", "--serving", "--json"]),
    ):
        assert main(argv + ["--ledger", ledger]) == 0
        printed = json.loads(capsys.readouterr().out)
        response = page.request.get(srv.url + api)
        assert response.ok and response.headers["content-type"].startswith("application/json")
        assert response.json() == printed, api
    assert page.request.post(srv.url + "api/runs").status == 405  # nothing on this server writes
    assert page.request.get(srv.url + "api/candidates/9999").status == 404


# -- the filter, and a run in progress -----------------------------------------------------------------


def _start_run(led, ops, gpu=None, config=None):
    return led.start_run(config or {}, {"torch": "2.13"}, "search", ops, gpu, {})


@exhaustive
def test_the_runs_filter_by_op_status_gpu_and_date(browser, serve, tmp_path):
    ledger = _copy(os.path.join(H200, "ledger.db"), tmp_path)
    upgrade_ledger(ledger, backup=False)  # (the committed ledger is of schema version 1; this test writes to it)
    led = Ledger(ledger)
    today = datetime.now(timezone.utc).date().isoformat()
    mine = _start_run(led, ["attention"]).id  # running, on no GPU, today
    led.close()
    srv = serve(ledger)
    page = _page(browser)
    page.goto(srv.url)
    _loaded(page)

    def shown():
        return page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)")

    assert len(shown()) == 4
    # a run that replayed earlier runs' verdicts says what it judged itself, as `history` does
    assert "judged now 14, replayed 13" in page.inner_text("#runs tr[data-run='r20261130-134627-3d5e'] td.num")
    assert "replayed" not in page.inner_text("#runs tr[data-run='r20261130-160429-f59c'] td.num")
    page.click("#runs a[href='/runs/r20261130-134627-3d5e']")  # and its page marks each replayed candidate
    _loaded(page)
    assert page.locator("#candidates tbody tr").count() == 27 and page.locator("#candidates .replayed").count() == 13
    page.goto(srv.url)
    _loaded(page)
    loads = 1
    for field, value, expected in (
        ("op", "matmul", 3),
        ("status", "finished", 3),
        ("gpu", "NVIDIA H200", 3),
        ("since", today, 0),
    ):
        if field in ("since",):
            page.fill(f"#filters input[name='{field}']", value)
            page.dispatch_event(f"#filters input[name='{field}']", "change")
        else:
            page.select_option(f"#filters select[name='{field}']", value)
        loads += 1
        _loaded(page, loads)
        assert len(shown()) == expected, (field, value, shown())
        assert page.evaluate("location.search").count("=") >= 1  # the filter is in the address, to share
    page.goto(srv.url + f"?op=attention&since={today}")
    _loaded(page)
    assert shown() == [mine]
    page.goto(srv.url + "?op=quantize_kv")
    _loaded(page)
    assert len(shown()) == 2 and page.input_value("#filters select[name='op']") == "quantize_kv"
    assert page.request.get(srv.url + "api/runs?op=nonsense").status == 400
    assert page.errors == []


@exhaustive
def test_a_run_in_progress_updates_on_the_open_page(browser, serve, tmp_path):
    ledger = str(tmp_path / "live.db")
    led = Ledger(ledger)
    run = _start_run(led, ["quantize_kv"], gpu="Test GPU")
    srv = serve(ledger)
    page = _page(browser)
    page.goto(srv.url + f"runs/{run.id}")
    _loaded(page)
    page.evaluate("window.__same_page = true")  # gone if the page were reloaded
    listing = _page(browser)
    listing.goto(srv.url)
    _loaded(listing)
    assert listing.inner_text(f"#runs tr[data-run='{run.id}'] td.num") == "0: 0 / 0 / 0 / 0"
    assert page.locator("#candidates tbody tr").count() == 0 and page.inner_text("#run-status") == "running"

    c, _ = led.add_candidate("quantize_kv", as_written("# a candidate\n"), "search", run.id, label="live-one")
    led.record_checks(c.id, "quick", [{"name": "static_gate", "status": "passed", "detail": "ok", "duration_s": 0.1}])
    led.set_candidate_status(c.id, CandidateStatus.BENCHMARKED)
    for label, ms in (("baseline", 1.0), ("candidate", 0.8), ("anchor:torch", 0.9)):
        led.record_bench(
            op="quantize_kv",
            shape_key="T=4096,H=8,D=128",
            bucket="t4k-d128",
            dtype="bfloat16",
            gpu_name="Test GPU",
            median_ms=ms,
            spread_ms=0.001,
            n_samples=5,
            run_id=run.id,
            candidate_id=c.id,
            label=label,
        )
    page.wait_for_selector(f"#candidates tr[data-cand='{c.id}']", timeout=WAIT_MS)
    assert "live-one" in page.inner_text("#candidates") and "1.250x" in page.inner_text("#candidates")
    page.wait_for_selector("#plots img[data-name='speedup.png']", timeout=WAIT_MS)  # its first figures: plots
    page.wait_for_function("document.querySelector('#plots img').naturalWidth > 0", timeout=WAIT_MS)
    listing.wait_for_function(
        f"document.querySelector(\"#runs tr[data-run='{run.id}'] td.num\").textContent.startsWith('1:')",
        timeout=WAIT_MS,
    )
    assert page.locator("#diagnosis-box").is_hidden()
    led.record_pruned(
        run.id,
        "quantize_kv",
        "t4k-d128",
        "bfloat16",
        "cfg-pruned",
        "0" * 64,
        "predicted 0.62x of the incumbent by the timing model",
    )
    # (a page drawn while the record was written may show one and not yet the other: the next poll has both)
    page.wait_for_function(
        "document.getElementById('run-facts').textContent.includes('1 proposal(s) kept off the GPU')"
        " && !document.getElementById('diagnosis-box').hidden",
        timeout=WAIT_MS,
    )
    assert "quantize_kv t4k-d128 cfg-pruned: predicted 0.62x" in page.inner_text("#diagnosis")

    led.set_run_status(run.id, RunStatus.FINISHED, finished=True)
    page.wait_for_function("document.getElementById('run-status').textContent === 'finished'", timeout=WAIT_MS)
    assert page.evaluate("window.__same_page") is True
    led.close()
    assert page.errors == [] and listing.errors == []


# -- hostile text ------------------------------------------------------------------------------------

PAYLOADS = [
    "</script><script>window.__pwned = 'script'</script>",
    "<img src=x onerror=\"window.__pwned = 'onerror'\">",
    '<a href="javascript:window.__pwned = \'link\'" id="evil-link">click</a>',
    '"><svg onload="window.__pwned = \'svg\'"></svg>',
    "{{ 7 * 191 }}",  # a template expression stays text (it would print 1337 if evaluated)
]
WIDE = "W" * 4000  # one word that would stretch any table it sits in


def _hostile_ledger(path) -> tuple:
    """Every text a candidate or a model controls, filled with payloads: labels, sources (the hostile suite's
    files), check details, verdict errors, model prompts and replies, benchmark labels, promotion reasons."""
    led = Ledger(path)
    payload = " ".join(PAYLOADS)
    run = led.start_run({}, {"torch": payload}, "model", ["quantize_kv"], "GPU " + PAYLOADS[1], {})
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "candidates", "hostile", "*", "*.py")))[:6]
    ids = []
    for i, f in enumerate(files):
        source = open(f).read() + f"\n# {payload}\n"
        label = (PAYLOADS + [WIDE])[i % (len(PAYLOADS) + 1)]
        c, _ = led.add_candidate("quantize_kv", as_written(source), "model", run.id, label=label)
        led.record_checks(
            c.id, "full", [{"name": "load", "status": "failed", "detail": payload + " " + WIDE, "duration_s": 0.1}]
        )
        led.set_candidate_status(
            c.id,
            CandidateStatus.REJECTED,
            verdict={"checks": [{"name": PAYLOADS[0], "status": "failed", "detail": payload}], "error": payload},
        )
        call = led.record_model_call(
            run.id,
            PAYLOADS[3],
            json.dumps([{"role": "user", "content": payload}]),
            payload + "\n```python\n" + source + "```",
            1,
            2,
            0.5,
            error=PAYLOADS[2],
        )
        led.link_model_call(call, c.id)
        ids.append(c.id)
    good, _ = led.add_candidate("quantize_kv", as_written("# fine\n" + payload), "model", run.id, label=WIDE)
    led.set_candidate_status(good.id, CandidateStatus.PROMOTED)
    for label, ms in (("baseline", 1.0), ("candidate", 0.8), ("anchor:" + PAYLOADS[0], 0.9)):
        led.record_bench(
            op="quantize_kv",
            shape_key="T=1," + PAYLOADS[1],
            bucket=PAYLOADS[4],
            dtype="bfloat16",
            gpu_name="GPU " + PAYLOADS[1],
            median_ms=ms,
            spread_ms=0.001,
            n_samples=5,
            run_id=run.id,
            candidate_id=good.id,
            label=label,
        )
    led.record_promotion(
        op="quantize_kv",
        bucket=PAYLOADS[4],
        dtype="bfloat16",
        gpu_name="GPU " + PAYLOADS[1],
        run_id=run.id,
        candidate_id=good.id,
        new_ms=0.8,
        old_ms=1.0,
        gain=0.2,
        spread=0.01,
        reason=payload,
        versions={"torch": PAYLOADS[0], "triton": WIDE},
    )
    led.close()
    return run.id, ids + [good.id]


def _no_injection(page) -> None:
    assert page.evaluate("window.__pwned") is None
    assert (
        page.evaluate("document.querySelectorAll('[onerror], [onload], #evil-link, img[src=x], svg[onload]').length")
        == 0
    )
    scripts = page.evaluate("[...document.scripts].map(s => s.getAttribute('src'))")
    assert scripts == ["/static/app.js"]
    hrefs = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))")
    assert all(h.startswith(("/", "?")) for h in hrefs), hrefs  # no javascript:, no other site


@exhaustive
def test_hostile_text_is_shown_as_text_and_cannot_break_the_layout(browser, serve, tmp_path):
    run_id, ids = _hostile_ledger(tmp_path / "hostile.db")
    srv = serve(tmp_path / "hostile.db")
    for width in (1280, 375):
        page = _page(browser, width)
        for path in ["", f"runs/{run_id}", "serving"] + [f"candidates/{i}" for i in ids]:
            page.goto(srv.url + path)
            if path in ("", f"runs/{run_id}"):
                _loaded(page)
            page.wait_for_timeout(100)
            _no_injection(page)
            _fits(page)
        text = page.inner_text("body")
        for p in PAYLOADS:  # each payload is on the page, as the characters it is made of
            assert p in text or p.replace('"', "\u201d") in text, p
        page.goto(srv.url + f"runs/{run_id}")
        _loaded(page)
        assert PAYLOADS[1] in page.inner_text("#candidates")
        page.goto(srv.url + f"candidates/{ids[0]}")
        assert PAYLOADS[0] in page.text_content("#source") and PAYLOADS[2] in page.inner_text("#model")
        assert page.errors == [], page.errors


# -- the command: what it refuses -------------------------------------------------------------------


def _serve_fails(args, capsys):
    from kernel_agent.agent.cli import main

    assert main(["serve", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_missing_or_corrupt_ledger_or_a_taken_port_is_one_line_and_exit_2(tmp_path, capsys):
    assert "no ledger at" in _serve_fails(["--ledger", str(tmp_path / "missing.db")], capsys)
    (tmp_path / "corrupt.db").write_bytes(b"this is not a database" * 100)
    assert "corrupt.db" in _serve_fails(["--ledger", str(tmp_path / "corrupt.db")], capsys)
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert "cannot listen" in _serve_fails(["--ledger", PR_EXAMPLE, "--port", str(port)], capsys)
    assert "--port" in _serve_fails(["--ledger", PR_EXAMPLE, "--port", "70000"], capsys)


def test_serve_without_a_ledger_says_so_before_the_web_view_loads_torch(tmp_path):
    """A new user's first `serve`, before any run: one line, without the seconds torch's import takes."""
    code = (
        "import sys; from kernel_agent.agent.cli import main; rc = main(sys.argv[1:]); "
        "print('RC', rc, 'torch' in sys.modules)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "serve"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != "KERNEL_AGENT_LEDGER"}, "PYTHONPATH": ROOT},
    )
    assert r.stdout.split()[-3:] == ["RC", "2", "False"], r.stdout + r.stderr
    assert "no ledger at runs/ledger.db" in r.stderr and r.stderr.count("\n") == 1


def test_without_the_web_extra_serve_says_how_to_install_it(monkeypatch, capsys):
    import kernel_agent.agent.cli as cli_package
    from kernel_agent.agent.cli import main

    monkeypatch.setitem(sys.modules, "kernel_agent.agent.cli.web", None)  # as if starlette were missing
    # `from . import web` reads the package's attribute first: an earlier test's import would serve for real
    monkeypatch.delattr(cli_package, "web", raising=False)
    assert main(["serve", "--ledger", PR_EXAMPLE, "--port", "0"]) == 2
    assert "pip install 'kernel-agent[web]'" in capsys.readouterr().err


def test_a_postgresql_ledger_is_served_read_only(postgres, serve):
    import urllib.request

    url = postgres()
    with Ledger(url) as led:
        run = _start_run(led, ["matmul"], gpu="Test GPU")
    srv = serve(url)
    assert "read-only" in srv.first_line
    doc = json.load(urllib.request.urlopen(srv.url + "api/runs", timeout=60))
    assert [r["id"] for r in doc["runs"]] == [run.id]
    with Ledger(url, read_only=True) as ro:  # the session kind the server holds: a write fails on the server
        with pytest.raises(Exception, match="read-only transaction"):
            ro.start_run({}, {}, "search", ["matmul"], None, {})


# -- the real CPU run, last: its run went on beside the tests above ------------------------------------


@exhaustive
def test_a_real_cpu_run_reads_as_its_verdicts_reproductions_and_model_exchanges(browser, serve, cpu_run):
    ledger, run_id = cpu_run()
    before = hashlib.sha256(open(ledger, "rb").read()).hexdigest()
    srv = serve(ledger)
    page = _page(browser)
    page.goto(srv.url)
    _loaded(page)
    page.click(f"#runs a[href='/runs/{run_id}']")
    _loaded(page)
    rows = page.locator("#candidates tbody tr")
    assert rows.count() == 3
    assert set(page.locator("#candidates .status").all_inner_texts()) == {"rejected"}
    facts = page.inner_text("#run-facts")
    assert "3 (rejected 3); replayed from earlier runs: 0" in facts and "candidate budget reached (3)" in facts
    assert "None" not in facts and "null" not in facts  # no driver on this machine: left out, not "driver null"
    with Ledger(ledger, read_only=True) as led:  # the diagnosis `show RUN` prints, line for line
        from kernel_agent.agent.cli.views import diagnosis_lines

        shown = diagnosis_lines(led, run_id)
    assert shown and shown[0].startswith("diagnosis: quantize_kv ") and "compiled for sm_90" in "\n".join(shown)
    assert page.inner_text("#diagnosis").splitlines() == shown
    assert "out-of-bounds store" in page.inner_text("#candidates")
    led = Ledger(ledger, read_only=True)  # which reply became which candidate depends on the model calls' order

    def failed_by(check):
        return next(
            c.id
            for c in led.candidates(run_id=run_id)
            if any(k.name == check and k.status == "failed" for k in led.checks(c.id))
        )

    oob, cheat, no_code = failed_by("runs"), failed_by("static_gate"), failed_by("reply")
    seed = re.search(
        r"seed base (\d+)", next(k.detail for k in led.checks(oob, mode="quick") if k.name == "load")
    ).group(1)
    [call] = led.model_calls(candidate_id=oob)
    led.close()
    page.click(f"#candidates a[href='/candidates/{oob}']")
    failed = page.locator("#checks tr.c-failed")
    assert failed.count() == 1 and "runs" in failed.inner_text()
    repro = failed.locator(".repro pre").inner_text()
    assert f"kernel-agent sanitize --op quantize_kv candidate-{oob}.py --quick --seed {seed}" in repro
    assert f"kernel-agent show {oob} --json --ledger {ledger}" in repro
    assert "Here is a faster version:" in page.inner_text("#model .reply")
    page.click("#model summary:has-text('Prompt')")
    assert "## Contract" in page.inner_text("#model")  # the prompt the model was sent, as recorded
    assert call.response.split("\n")[0] in page.inner_text("#model")
    page.goto(srv.url + f"candidates/{cheat}")
    assert "static_gate" in page.inner_text("#checks tr.c-failed") and ".float()" in page.inner_text("#checks")
    page.goto(srv.url + f"candidates/{no_code}")
    assert "No source: the model's reply was unusable." in page.inner_text("main")
    assert page.errors == []
    small = _page(browser, 375)
    for path in ("", f"runs/{run_id}", f"candidates/{oob}", f"candidates/{cheat}", "serving"):
        small.goto(srv.url + path)
        if path in ("", f"runs/{run_id}"):
            _loaded(small)
        _fits(small)
    assert hashlib.sha256(open(ledger, "rb").read()).hexdigest() == before  # read-only: not one byte changed


def test_the_serving_page_shows_field_failures_and_the_api_gives_what_history_prints(serve, tmp_path, capsys):
    """No browser needed: the page's text and the API, as a client reads them."""
    ledger = str(tmp_path / "l.db")
    _ledger_with_a_field_failure(ledger)
    _ledger_with_a_field_failure(ledger, bucket="tlarge-d128")
    with Ledger(ledger) as led:
        led.resolve_field_failures("quantize_kv", "tlarge-d128", "bfloat16", "nvidia-h200", by="r-demoted")
        (ff,) = led.field_failures(unresolved_only=True)
        # a crash's detail carries the kernel's own text: shown as text
        led.record_field_failure(dataclasses.replace(ff.failure(), kind=FailureKind.CRASH, detail="<b>x</b>"))
    srv = serve(ledger)
    page = urllib.request.urlopen(srv.url + "serving", timeout=60).read().decode()
    section = page[page.index("<h2>Field failures</h2>") : page.index("<h2>Promotions and demotions</h2>")]
    assert section.count('<tr class="ff-unresolved">') == 2 and section.count('<tr class="ff-resolved">') == 1
    assert "&lt;b&gt;x&lt;/b&gt;" in section and "<b>x</b>" not in section
    for text in ("quantize_kv · tsmall-d128", "BLOCK_D=128|T=600000", "mismatch", "x_q[599999,7,3]", "r-demoted"):
        assert text in section
    assert cli_main(["history", "--serving", "--json", "--ledger", ledger]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.load(urllib.request.urlopen(srv.url + "api/serving", timeout=60)) == printed
    assert [f["resolved_by"] for f in printed["field_failures"]] == [None, "r-demoted", None]


def test_the_serving_page_of_a_ledger_without_runs_shows_what_the_serving_folder_serves(serve, tmp_path):
    """A fresh clone: no run recorded yet, and the committed manifest serves (torch for the matmul buckets cuBLAS
    won); the page said nothing was promoted. It reads the page as served (no browser needed)."""
    import urllib.request

    from kernel_agent.harness.serving.serving import load_manifest

    Ledger(str(tmp_path / "l.db")).close()
    srv = serve(str(tmp_path / "l.db"))
    html = urllib.request.urlopen(srv.url + "serving", timeout=60).read().decode()
    table = html[html.index('id="manifest"') :]
    served = load_manifest().entries
    assert served and all(f"{e.op} · {e.bucket}" in table and e.gpu in table for e in served)
    assert "the serving folder below serves what it holds" in html
    doc = json.load(urllib.request.urlopen(srv.url + "api/serving", timeout=60))
    assert {(e["op"], e["bucket"]) for e in doc["manifest"]["entries"]} == {(e.op, e.bucket) for e in served}


@exhaustive
def test_the_candidate_pages_benchmark_table_fits_1280_px(browser, serve):
    """Its twelfth column was cut off at 1280 px: the shape now folds instead."""
    srv = serve(PR_EXAMPLE)
    page = _page(browser, width=1280)
    page.goto(srv.url + "candidates/9")
    fits = page.evaluate(
        "(() => { const t = document.querySelector('#bench'); return t.scrollWidth <= t.parentElement.clientWidth; })()"
    )
    assert fits

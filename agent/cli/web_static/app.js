// kernel-agent serve: the runs list and a run's candidates, drawn from the JSON API (the documents of
// `history --json` and `show RUN --json`) and redrawn while a run is in progress.
// Everything from the ledger is set as text (Node.append of a string, textContent), never as markup, and
// every link is a fixed path with an encoded id: a candidate's text cannot become HTML, script or a URL scheme.
"use strict";

const POLL_MS = Number(document.body.dataset.pollMs || 2000);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, String(v));
  }
  for (const k of kids) {
    if (k === null || k === undefined || k === "") continue;
    e.append(k instanceof Node ? k : String(k));
  }
  return e;
}

const runHref = (id) => "/runs/" + encodeURIComponent(id);
const candHref = (id) => "/candidates/" + encodeURIComponent(String(Number(id)));

// The numbers as harness/bench/figures.py prints them: fmt_x, fmt_ms (4 significant figures).
function fmtX(s) { return s === null || s === undefined ? "" : s.toFixed(3) + "x"; }
function fmtMs(x) {
  if (x === null || x === undefined) return "";
  return Math.abs(x) >= 1e4 ? x.toFixed(0) : Number(x.toPrecision(4)).toPrecision(4);
}
const CLOCK = {graph: "graph", event: "events"};
const when = (iso) => (iso || "").slice(0, 16).replace("T", " ");

async function getJSON(url) {
  const r = await fetch(url, {headers: {"Accept": "application/json"}, cache: "no-store"});
  if (!r.ok) throw new Error(url + ": HTTP " + r.status);
  return r.json();
}

function statusBadge(status) { return el("span", {class: "status s-" + String(status).replace(/[^a-z]/g, "")}, status); }

// -- the runs list --------------------------------------------------------------------------------

function runRow(r) {
  const by = r.by_status || {};
  const counts = [by.rejected || 0, by.verified || 0, by.benchmarked || 0, by.promoted || 0].join(" / ");
  const tp = (r.throughput || []).map((line) => el("div", {class: "tp"}, line));
  return el("tr", {"data-run": r.id, "data-status": r.status},
    el("td", {class: "id"}, el("a", {href: runHref(r.id)}, r.id), ...tp),
    el("td", {}, statusBadge(r.status)),
    el("td", {}, when(r.started)),
    el("td", {class: "wrap"}, r.proposer + " · " + String(r.ops).split(",").join(", ")),
    el("td", {}, r.gpu || "none"),
    el("td", {class: "num", title: "rejected / verified / benchmarked / promoted"}, `${r.candidates}: ${counts}`,
      // as `history` counts: what the run judged itself apart from what it replayed from earlier runs
      r.replayed ? el("div", {class: "tp replayed"}, `judged now ${r.judged_now}, replayed ${r.replayed}`) : null),
    el("td", {class: "num"}, r.promotions));
}

function filterQuery(form) {
  const q = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
  return q;
}

function startRuns() {
  const form = document.getElementById("filters");
  const body = document.querySelector("#runs tbody");
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    const q = filterQuery(form);
    let doc;
    try {
      doc = await getJSON("/api/runs?" + q.toString());
    } catch (e) {  // the server busy or restarting: try again later, keep what is shown
      timer = setTimeout(refresh, 5 * POLL_MS);
      return;
    }
    body.replaceChildren(...doc.runs.map(runRow));
    document.getElementById("runs-count").textContent =
      doc.runs.length ? `${doc.runs.length} run(s)` : "No run matches these filters.";
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
    // a run in progress is polled; otherwise new runs are looked for now and then
    const live = doc.runs.some((r) => r.status === "running");
    timer = setTimeout(refresh, live ? POLL_MS : 5 * POLL_MS);
  }
  form.addEventListener("change", () => {
    const q = filterQuery(form).toString();
    history.replaceState(null, "", q ? "/?" + q : "/");
    refresh();
  });
  form.addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  refresh();
}

// -- one run --------------------------------------------------------------------------------------

function whyOf(c) {
  const v = c.verdict || {};
  const failed = (v.checks || []).find((k) => k.status === "failed");
  if (failed) return failed.name + ": " + String(failed.detail || "").slice(0, 240);
  if (v.error) return String(v.error).slice(0, 240);
  if (c.status === "proposed") return "not judged yet";
  return "";
}

function timingCell(c, runId) {
  const figs = (c.figures || []).filter((f) => f.run_id === runId);
  return el("td", {class: "timing"}, ...figs.map((f) => el("div", {class: "shape"},
    `${f.shape_key}: `, f.incumbent_ms !== null ? `${fmtMs(f.incumbent_ms)} → ` : "",
    `${fmtMs(f.kernel_ms)} ms `, el("b", {class: "speedup"}, fmtX(f.speedup)),
    ` (${CLOCK[f.clock] || f.clock})`)));
}

function candRow(c, runId) {
  const eq = c.fpsan_equivalent === true ? "equiv" : c.fpsan_equivalent === false ? "not equiv" : "";
  return el("tr", {"data-cand": c.id, class: "c-" + String(c.status).replace(/[^a-z]/g, "")},
    el("td", {class: "num"}, el("a", {href: candHref(c.id)}, "#" + c.id)),
    el("td", {class: "wrap"}, el("span", {class: "op"}, c.op), " ", el("span", {class: "bucket"}, c.bucket || ""),
      " ", el("span", {class: "label"}, c.label || "")),
    el("td", {}, statusBadge(c.status), c.replayed ? el("span", {class: "replayed muted"}, " replayed") : null),
    el("td", {}, eq),
    timingCell(c, runId),
    el("td", {class: "detail"}, whyOf(c)));
}

// As agent/views.py's versions_line: what was not recorded (no driver on a machine without a GPU) is left out.
function versionsLine(v) {
  return [["torch", "torch"], ["triton", "triton"], ["cuda", "CUDA"], ["driver", "driver"], ["python", "python"]]
    .filter(([key]) => v[key]).map(([key, name]) => `${name} ${v[key]}`).join(", ") || "not recorded";
}

// What `run` and `history` count as judged now (its statuses beside it; "proposed" is not judged yet), and
// what the run replayed from earlier runs.
function judgedNow(s) {
  const by = Object.entries(s.judged_now_by_status || {}).filter(([k, n]) => n && k !== "proposed");
  return `${s.judged_now || 0}` + (by.length ? ` (${by.map(([k, n]) => `${k} ${n}`).join(", ")})` : "")
    + `; replayed from earlier runs: ${s.replayed || 0}`;
}

function runFacts(doc) {
  const s = doc.run, v = doc.versions || {};
  const facts = [["proposer", s.proposer], ["ops", (s.ops || []).join(", ")], ["GPU", s.gpu_name || "none"],
    ["started", when(s.started_at) + " UTC"], ["wall", s.wall_s !== null ? Math.round(s.wall_s) + " s" : ""],
    ["versions", versionsLine(v)],
    ["candidates", `${s.candidates} (` + Object.entries(s.candidates_by_status).map(([k, n]) => `${k} ${n}`).join(", ") + ")"],
    ["judged now", judgedNow(s)],
    ["benchmarks", s.bench_results]];
  if (doc.ended) facts.push(["ended", doc.ended]);
  if (s.pruned) facts.push(["pruned", `${s.pruned} proposal(s) kept off the GPU`]);
  if (s.model && s.model.calls) facts.push(["model", `${s.model.calls} calls, ${s.model.total_tokens} tokens`]);
  return facts.flatMap(([k, val]) => [el("dt", {}, k), el("dd", {}, val)]);
}

function promotionLines(doc) {
  return doc.run.promotions.map((p) => el("p", {class: "promo " + (p.active ? "active" : "demoted")},
    "promoted: ", `${p.op} ${p.bucket} ${p.dtype} `, el("a", {href: candHref(p.candidate_id)}, "#" + p.candidate_id),
    ": " + p.reason + (p.active ? "" : " (demoted since)")));
}

function refreshPlots(runId, version) {
  if (document.body.dataset.plotsVersion === version) return;
  document.body.dataset.plotsVersion = version;
  let box = document.getElementById("plots");
  if (!box) {  // the run's first judged figures: its plots appear
    box = el("div", {class: "plots", id: "plots"});
    document.getElementById("no-plots").replaceWith(box);
  }
  box.replaceChildren(...["speedup.png", "progress.png"].map((name) => {
    const src = `${runHref(runId)}/plots/${name}?v=${encodeURIComponent(version)}`;
    const link = el("a", {href: src}, el("img", {src: src, "data-name": name, alt: name}));
    link.firstChild.addEventListener("error", () => link.remove());  // no such plot (yet)
    return link;
  }));
}

function startRun() {
  const runId = document.body.dataset.run;
  const body = document.querySelector("#candidates tbody");
  async function refresh() {
    let doc;
    try {
      doc = await getJSON("/api/runs/" + encodeURIComponent(runId));
    } catch (e) {  // the server busy or restarting: try again later, keep what is shown
      setTimeout(refresh, 5 * POLL_MS);
      return;
    }
    const status = doc.run.status;
    const badge = document.getElementById("run-status");
    badge.textContent = status;
    badge.className = "status s-" + String(status).replace(/[^a-z]/g, "");
    document.getElementById("run-facts").replaceChildren(...runFacts(doc));
    document.getElementById("throughput").replaceChildren(...(doc.throughput || []).map((l) => el("p", {class: "tp"}, "throughput, " + l)));
    document.getElementById("promotions").replaceChildren(...promotionLines(doc));
    const diag = doc.diagnosis_lines || [];
    document.getElementById("diagnosis").textContent = diag.join("\n");
    document.getElementById("diagnosis-box").hidden = diag.length === 0;
    body.replaceChildren(...doc.candidates.map((c) => candRow(c, runId)));
    document.getElementById("cands-count").textContent = `(${doc.candidates.length})`;
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
    const version = [doc.run.bench_results, doc.run.promotions.length, status].join("-");
    if (doc.run.bench_results > 0) refreshPlots(runId, version);
    if (status === "running") setTimeout(refresh, POLL_MS);
  }
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  const view = document.body.dataset.view;
  if (view === "runs") startRuns();
  else if (view === "run") startRun();
});

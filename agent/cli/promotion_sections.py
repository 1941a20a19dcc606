"""The markdown sections of one promoted kernel (header, timings, verdict, diff), shared by `report` and `pr`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, List, Optional

from ... import agent  # the door to the modules that import torch: each is read when first used
from ...harness.bench.figures import (
    CLOCK_PHRASES,
    CLOCK_WORDS,
    CandidateResult,
    fmt_ms,
    fmt_saved,
    fmt_spread,
    fmt_x,
)
from ...sanitizer.verdict import fence_for, quote_untrusted
from .views import (
    JudgedBase,
    config_lines,
    judged_base,
    unified_diff,
)


def short_label(label) -> str:
    """An incumbent's label for a narrow column: a serving kernel's file name is in the JSON output."""
    if label is None:
        return "mixed"
    return "serving" if label.startswith("serving:") else label


def portable_paths(text: str) -> str:
    """A document to share, without this machine's folders: paths in the working folder or the repository
    relative to it, paths under the home folder from ~."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # agent/cli/ in it
    for root, shown in ((os.getcwd(), ""), (repo, ""), (os.path.expanduser("~"), "~/")):
        if root not in ("", os.sep):
            text = text.replace(root.rstrip(os.sep) + os.sep, shown)
    return text


# -- the sections of one promoted kernel: shared by `report` and `pr` (agent/pr.py) -----------------


@dataclass(frozen=True)
class PromotedKernel:
    """A promotion of the run with what its sections show. candidate: the promoted candidate (None for a
    promotion without one in the ledger); result: its benchmark in the run as judged (harness/bench/figures.py;
    None when the run did not time it, a promotion by hand say); replaced: what it replaces, as a label
    and source (the replaced candidate, else the op's baseline file) for the diff."""

    promotion: Any
    candidate: Optional[Any]
    result: Optional[CandidateResult]
    replaced_label: str
    replaced_source: str
    replaced_note: str = ""  # when the source is not today's file of that name (JudgedBase.note)

    @property
    def replaced_what(self) -> str:
        pr = self.promotion
        return "the baseline" if pr.replaced_candidate_id is None else f"candidate #{pr.replaced_candidate_id}"


def promoted_kernels(led, run, results: List[CandidateResult]) -> List[PromotedKernel]:
    """The run's promotions in the order they were made, each with its judged result from `results`."""
    out = []
    for pr in sorted(led.promotions(run_id=run.id), key=lambda p: p.id):
        c = led.candidate(pr.candidate_id) if pr.candidate_id else None
        res = next(
            (
                r
                for r in results
                if r.candidate_id == pr.candidate_id
                and (r.op, r.bucket, r.dtype, r.gpu_name) == (pr.op, pr.bucket, pr.dtype, pr.gpu_name)
            ),
            None,
        )
        if c is not None:
            base = judged_base(led, c, pr.replaced_candidate_id)
        else:
            old = led.candidate(pr.replaced_candidate_id) if pr.replaced_candidate_id else None
            base = (
                JudgedBase(f"candidate #{old.id}", old.source)
                if old is not None
                else JudgedBase(f"kernels/baseline/{pr.op}.py", agent.baseline_source(pr.op))
            )
        out.append(PromotedKernel(pr, c, res, base.label, base.source, base.note))
    return out


def promotion_header(pk: PromotedKernel) -> List[str]:
    """The heading, the rule's decision and the headline speedup over what it replaces."""
    pr, res = pk.promotion, pk.result
    if res is not None and res.speedup is not None:
        n = len(res.figures)
        head = (
            f"Replaces {pk.replaced_what}: **{fmt_x(res.speedup)}** ({fmt_saved(res.speedup)}), the geometric "
            f"mean over {n} shape{'s' if n != 1 else ''} of the speedups below, on {_clock_phrase(res.clocks)}; "
            f"the rule's noise {pr.spread:.1%}."
        )
    else:  # no benchmark of it in this run (a promotion by hand, say): the rule's record
        head = (
            f"Replaces {pk.replaced_what}: {fmt_saved(1 / (1 - pr.gain)) if pr.gain < 1 else ''} as the rule "
            f"recorded it (noise {pr.spread:.1%}); no benchmark of it in this run."
        )
    return [
        f"## Promoted: `{pr.op}` bucket `{pr.bucket}`, {pr.dtype}, {pr.gpu_name}",
        "",
        f"The rule: {pr.reason}",
        "",
        head + (" Demoted later: " + (pr.demote_reason or "") if pr.demoted_at else ""),
        "",
    ]


def timings_section(pk: PromotedKernel) -> List[str]:
    """Per shape: the incumbent, the candidate and the torch anchor timed side by side, clock named."""
    if pk.result is None or pk.candidate is None:
        return []
    lines = [
        "### Timings",
        "",
        "Each shape: the candidate against the incumbent timed beside it, on the clock the rule judged "
        "them by; speedup = incumbent ms / candidate ms, vs anchor = anchor ms / kernel ms (the torch "
        "anchor of the same benchmark), of ceiling: the kernel's fraction of the measured hardware "
        "ceiling at that time.",
        "",
        "| shape | kernel | ms | spread ms | clock | speedup | vs anchor | of ceiling |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for f in pk.result.figures:
        lines += _timing_rows(f, pk.candidate.id)
    return lines


def verdict_section(led, pk: PromotedKernel) -> List[str]:
    """FpSan equivalence in words, FpSan's own detail, and every check the candidate passed."""
    c = pk.candidate
    if c is None:
        return []
    eq = {
        True: "**FpSan-equivalent** to the baseline (bitwise identical under the payload algebra)",
        False: "**not structurally equivalent** under FpSan; passed the extended numeric suite",
        None: "FpSan equivalence undecided",
    }[c.fpsan_equivalent]
    lines = ["", "### Sanitizer verdict", "", eq + ".", ""]
    # check details and FpSan's detail can carry the candidate's own messages: quoted as data
    if (c.verdict or {}).get("fpsan_detail"):
        lines += [f"> FpSan: {quote_untrusted(portable_paths(c.verdict['fpsan_detail']), 400, markdown=True)}", ""]
    lines += ["| mode | check | result | detail |", "|---|---|---|---|"]
    for k in led.checks(c.id):
        detail = quote_untrusted(portable_paths(k.detail), 160, markdown=True) if k.detail else ""
        lines.append(f"| {md_word(k.mode)} | {md_word(k.name)} | {md_word(k.status)} | {detail} |")
    return lines


def diff_section(pk: PromotedKernel) -> List[str]:
    """The unified diff against what it replaces (a configuration change is a few lines of `_config`), after
    the configuration in a line when that is all the change is."""
    c = pk.candidate
    if c is None:
        return []
    diff = unified_diff(pk.replaced_label, pk.replaced_source, f"candidate #{c.id} ({c.label})", c.source)
    fence = fence_for(diff)  # the candidate's source may hold backticks: the block must outlast them
    return [
        "",
        f"### Diff against {pk.replaced_label}",
        "",
        *([pk.replaced_note, ""] if pk.replaced_note else []),
        *config_lines(pk.replaced_source, c.source),
        f"{fence}diff",
        diff.rstrip() or "(identical)",
        fence,
        "",
    ]


def _timing_rows(f, cid: int) -> List[str]:
    """One shape of a promoted candidate's benchmark: the incumbent, the candidate and the anchor, each
    on the clock its comparison uses (the anchor on events where it has no graph time)."""
    rows = []
    for who, name in ((f.incumbent, None), (f.kernel, f"candidate #{cid}"), (f.anchor, None)):
        if who is None:
            continue
        clock = f.anchor_clock if who is f.anchor else f.clock
        speed = fmt_x(f.speedup) if who is f.kernel else ""
        ratio = fmt_x(f.anchor_ratio(who)) if who is not f.anchor else ""
        frac = who.fraction(clock)
        rows.append(
            f"| {f.shape_key} | {name or md_word(who.label, extra=':')} | {fmt_ms(who.ms(clock))} | "
            f"{fmt_spread(who.spread_ms(clock))} | {CLOCK_WORDS[clock]} | {speed} | {ratio} | "
            f"{f'{frac:.0%} ({who.ceiling_kind})' if frac else ''} |"
        )
    return rows


def _clock_phrase(clocks: str) -> str:
    return " and ".join(CLOCK_PHRASES[c] for c in clocks.split("+"))


def md_word(text, extra: str = "") -> str:
    """A name recorded by the sanitizer (check, mode, status) or a benchmark label (extra=':'), shown bare
    when it is a plain word."""
    t = str(text or "")
    return t if re.fullmatch(rf"[A-Za-z0-9_.+{extra}-]{{1,80}}", t) else quote_untrusted(t, 80, markdown=True)

"""The plots of a run (speedups, progress), shared by `report`, `pr` and the web view; matplotlib is optional."""

from __future__ import annotations

import os
from typing import Any, List, Sequence, Tuple

from ...harness.bench.figures import (
    CLOCK_WORDS,
    best_per_bucket,
    candidate_results,
    fmt_x,
)
from .promotion_sections import short_label


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401 - optional extra (report): whether the plots can be drawn

        return True
    except ImportError:
        return False


STALE_PLOTS = ("best_time.png",)


def run_plots(led, run, out_dir: str):
    """The plots of a run (`_plots`), from its judged figures and promotions: what `report` writes and the
    web view shows."""
    return _plots(run, candidate_results(led.figures(run_id=run.id)), out_dir, led.promotions(run_id=run.id))


def _plots(run, results, out_dir: str, promotions=()):
    """speedup.png: per shape, the run's best candidate of each bucket over the incumbent timed beside it
    (and the torch anchor over the same incumbent); progress.png: each judged candidate's speedup over
    the run. Both read the judged figures (`results`); they need matplotlib."""
    best = best_per_bucket(results)
    if not best:
        return []
    try:
        import matplotlib  # optional extra (report): without it there are no plots

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # after the backend is chosen: pyplot reads it when first imported
    except ImportError:
        return []
    return [_speedup_plot(plt, run, best, out_dir), _progress_plot(plt, run, results, promotions, out_dir)]


def _speedup_plot(plt, run, best, out_dir: str) -> Tuple[str, str]:
    figs = [(r, f) for r in best.values() for f in r.figures]
    fig, ax = plt.subplots(figsize=(max(6.5, 2.6 * len(figs)), 5.0))
    x = list(range(len(figs)))
    sp = [f.speedup for _, f in figs]
    an = [f.anchor_speedup for _, f in figs]
    bars = ax.bar([i - 0.2 for i in x], sp, width=0.4, label="best candidate of the bucket / incumbent")
    abars = ax.bar(
        [i + 0.2 for i in x], [a or 0.0 for a in an], width=0.4, alpha=0.6, label="torch anchor / the same incumbent"
    )
    for b, val in list(zip(bars, sp)) + list(zip(abars, an)):
        if val:
            ax.annotate(
                fmt_x(val),
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(
        [
            f"{r.op} {r.bucket}\n{f.shape_key}\n#{r.candidate_id} over {short_label(f.incumbent_label)}, "
            f"{CLOCK_WORDS[f.clock]}"
            for r, f in figs
        ],
        fontsize=7,
    )
    ax.set_ylabel("speedup over the incumbent (higher is better)")
    ax.set_ylim(0, max([v for v in sp + an if v] + [1.0]) * 1.15)
    ax.set_title(f"run {run.id}: speedup per shape of each bucket's best candidate", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    fig.tight_layout()
    p = os.path.join(out_dir, "speedup.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return "speedup per shape", p


def _progress_plot(plt, run, results, promotions, out_dir: str) -> Tuple[str, str]:
    fig, _ = progress_figure(plt, run, results, promotions)
    p = os.path.join(out_dir, "progress.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return "each candidate's speedup over the run", p


def progress_figure(plt, run, results, promotions) -> Tuple[Any, Any]:
    """Each judged candidate's speedup against the minutes into the run, labelled, with a note per promotion."""
    judged = [r for r in results if r.speedup is not None and not r.implausible and r.started_at is not None]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    labelled = []  # (minutes, speedup, text) of each point, labelled once the axes' limits are final
    for key in sorted({(r.op, r.bucket) for r in judged}):
        rs = [r for r in judged if (r.op, r.bucket) == key]
        mins = [(r.started_at - run.started_at).total_seconds() / 60 for r in rs]
        ax.plot(mins, [r.speedup for r in rs], "o", label=f"{key[0]} {key[1]}")
        labelled += [(m, r.speedup, f"#{r.candidate_id}") for m, r in zip(mins, rs)]
    ax.axhline(1.0, color="k", lw=0.8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.05 * (hi - lo))
    notes = []
    for i, pr in enumerate(sorted(promotions, key=lambda p: p.created_at)):
        # from here on the bucket's candidates are timed beside the promoted kernel; each note a line lower than
        # the one before, so that promotions close in time do not write over each other
        m = (pr.created_at - run.started_at).total_seconds() / 60
        ax.axvline(m, color="g", lw=0.8, ls=":")
        notes.append(
            ax.annotate(
                f"#{pr.candidate_id} promoted ({pr.bucket}):\nlater ones are over it",
                (m, 0.97 - 0.09 * (i % 8)),
                xycoords=("data", "axes fraction"),
                fontsize=6,
                color="g",
                xytext=(3, 0),
                textcoords="offset points",
                va="top",
            )
        )
    ax.set_xlabel("minutes into the run (when the benchmark was recorded)")
    ax.set_ylabel("speedup over the incumbent timed beside it")
    ax.set_title("each judged candidate: geometric mean over its bucket's shapes", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    _label_points(fig, ax, labelled, avoid=_notes_inside(fig, ax, notes))
    return fig, ax


def _notes_inside(fig, ax, notes) -> List[Any]:
    """Each promotion note turned to the left of its line where it would run past the axes' right edge (into
    the legend, which sits there: a promotion late in the run was written under it); their boxes."""
    renderer = fig.canvas.get_renderer()
    right = ax.get_window_extent(renderer).x1
    boxes = []
    for note in notes:
        if note.get_window_extent(renderer).x1 > right:
            note.set_horizontalalignment("right")
            note.set_position((-3, 0))  # (the text's offset from its point, in points)
        boxes.append(note.get_window_extent(renderer))
    return boxes


# where a point's label may go, in points from it: right and up first, then below, further up, to the left
LABEL_OFFSETS = [(3, 3), (3, -9), (3, 10), (3, -16), (-18, 3), (-18, -9), (3, 17), (3, -23), (-18, 10), (-18, -16)]


def _label_points(fig, ax, points: List[Tuple[float, float, str]], avoid: Sequence[Any] = ()) -> None:
    """Label each point where its label overlaps no label placed before it nor a box of `avoid` (the first of
    LABEL_OFFSETS that is free; the first one where none is): labels of candidates judged close together were
    written over each other."""
    renderer = fig.canvas.get_renderer()
    placed: List[Any] = list(avoid)
    for x, y, text in sorted(points):
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(text, (x, y), fontsize=6, xytext=(dx, dy), textcoords="offset points")
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(b) for b in placed):
                break
            label.remove()
        else:  # nowhere free: the first place, as before
            label = ax.annotate(text, (x, y), fontsize=6, xytext=LABEL_OFFSETS[0], textcoords="offset points")
            box = label.get_window_extent(renderer)
        placed.append(box)

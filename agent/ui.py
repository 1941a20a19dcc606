"""Terminal output: rich tables and progress on a TTY, plain lines everywhere else.

Long work shows progress; when stdout is not a terminal (CI logs, pipes, files), the
same information comes out as one plain line per event, with no control characters.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Iterable, List, Optional, Sequence, cast

from rich import box
from rich.console import Console, JustifyMethod
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RP
from rich.table import Table
from rich.text import Text

from ..sanitizer.verdict import CheckStatus

_console: Optional[Console] = None
_err: Optional[Console] = None


def console() -> Console:
    global _console
    if _console is None:
        _console = Console(highlight=False, soft_wrap=False)
    return _console


def err_console() -> Console:
    global _err
    if _err is None:
        _err = Console(stderr=True, highlight=False)
    return _err


def is_tty() -> bool:
    return console().is_terminal and os.environ.get("TERM") != "dumb"


def line(text: str, style: Optional[str] = None) -> None:
    """One line of output; styled on a TTY, plain otherwise."""
    if is_tty():
        console().print(text, style=style, markup=False)
    else:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def error(text: str) -> None:
    err_console().print(f"kernel-agent: error: {text}", style="bold red", markup=False, soft_wrap=True)


def table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    justify: Optional[Sequence[str]] = None,
    wrap: Sequence[str] = (),
) -> None:
    """A table: on a terminal fitted to its width (`fit_columns`), where the columns named in `wrap` (a detail
    that is the point of the table) fold onto more lines instead of being cut; elsewhere plain, uncut."""
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    if is_tty():
        _rich_table(title, list(columns), cells, justify, [columns.index(c) for c in wrap])
        return
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    if title:
        sys.stdout.write(title + "\n")

    def fmt(vals: List[str]) -> str:
        out = []
        for i, v in enumerate(vals):
            right = justify and justify[i] == "right"
            out.append(v.rjust(widths[i]) if right else v.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sys.stdout.write(fmt(list(columns)) + "\n")
    for r in cells:
        sys.stdout.write(fmt(r) + "\n")
    sys.stdout.flush()


def fit_columns(columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> List[Optional[int]]:
    """Column widths for a table `width` characters wide, one line per row: a column of single tokens
    (ids, numbers, times) keeps its full width; a text column shrinks, to no less than 12 characters (its
    cells are then cut with an ellipsis); columns that still do not fit are dropped (None), text columns
    first, from the right, never the first column."""
    gap = 2  # between columns
    natural = [max([len(c)] + [len(r[i]) for r in rows if i < len(r)]) for i, c in enumerate(columns)]
    text = [any(" " in r[i] for r in rows if i < len(r)) for i in range(len(columns))]
    widths: List[Optional[int]] = list(natural)

    def total() -> int:
        shown = [w for w in widths if w is not None]
        return sum(shown) + gap * (len(shown) - 1)

    for i in sorted((i for i in range(len(columns)) if text[i]), key=lambda i: -natural[i]):
        if total() <= width:
            break
        widths[i] = max(min(natural[i], 12), natural[i] - (total() - width))
    # text columns go first (they were cut already), then the others, from the right
    for i in [i for i in range(len(columns) - 1, 0, -1) if text[i]] + [
        i for i in range(len(columns) - 1, 0, -1) if not text[i]
    ]:
        if total() <= width:
            break
        widths[i] = None
    return widths


# The narrowest a folding column gets: narrower, a detail of a few words takes more lines than it is worth.
MIN_WRAP_WIDTH = 24


def _rich_table(
    title: str, columns: List[str], rows: List[List[str]], justify: Optional[Sequence[str]], wrap: Sequence[int] = ()
) -> None:
    width = console().width
    # the folding columns take what the others leave: fitted as if they held their header only
    fitted_rows = [[c if i not in wrap else columns[i] for i, c in enumerate(r)] for r in rows]
    widths = fit_columns(columns, fitted_rows, width - sum(MIN_WRAP_WIDTH - len(columns[i]) for i in wrap))
    rest = width - sum(w + 2 for i, w in enumerate(widths) if w is not None and i not in wrap)
    for i in wrap:
        natural = max([len(columns[i])] + [len(r[i]) for r in rows if i < len(r)])
        widths[i] = max(min(natural, rest // max(1, len(wrap))), min(natural, MIN_WRAP_WIDTH))
    t = Table(
        title=title or None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 1, 0, 1),
        collapse_padding=True,
    )
    shown = [i for i, w in enumerate(widths) if w is not None]
    for i in shown:
        folds = i in wrap
        align = cast(JustifyMethod, justify[i] if justify else "left")
        t.add_column(
            columns[i],
            justify=align,
            no_wrap=not folds,
            overflow="fold" if folds else "ellipsis",
            width=widths[i],
            min_width=widths[i],
        )
    for r in rows:
        t.add_row(*[r[i] if i < len(r) else "" for i in shown])
    console().print(t)
    hidden = [columns[i] for i, w in enumerate(widths) if w is None]
    if hidden:
        console().print(f"(not shown at this width: {', '.join(hidden)})", style="dim", markup=False)


def clock(seconds: float) -> str:
    """Elapsed time as a status line shows it: M:SS, or H:MM:SS from an hour on."""
    sec = int(seconds)
    return f"{sec // 3600}:{sec // 60 % 60:02d}:{sec % 60:02d}" if sec >= 3600 else f"{sec // 60}:{sec % 60:02d}"


def clip(text: str, n: int) -> str:
    """`text` cut to `n` characters, with an ellipsis where it was cut (a cut detail must not read as whole)."""
    return text if len(text) <= n else text[: n - 1] + "…"


def duration(seconds: float) -> str:
    """A wall time in a sentence: 56s, 4m 12s, 2h 05m."""
    sec = int(round(seconds))
    if sec < 60:
        return f"{sec}s"
    if sec < 3600:
        return f"{sec // 60}m {sec % 60:02d}s"
    return f"{sec // 3600}h {sec // 60 % 60:02d}m"


class Progress:
    """A task counter: a rich progress bar on a TTY, a plain line per step elsewhere. With `plain_status_every_s`,
    elsewhere (a pipe, a CI log) a plain status line also comes that often while a step is still running, as the
    run's does: the elapsed time, the steps done and what it is `working_on`."""

    def __init__(self, description: str, total: Optional[int] = None, plain_status_every_s: Optional[float] = None):
        self.description = description
        self.total = total
        self.done = 0
        self.current = ""
        self.plain_status_every_s = plain_status_every_s
        self._rich: Optional[RP] = None
        self._task: Optional[TaskID] = None
        self._stop: Optional[threading.Event] = None
        self._ticker: Optional[threading.Thread] = None
        self._t0 = time.time()

    def __enter__(self):
        self._t0 = time.time()
        if is_tty():
            self._rich = RP(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                console=console(),
                transient=False,
            )
            self._task = self._rich.__enter__().add_task(self.description, total=self.total, status="")
        elif self.plain_status_every_s:
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, name="progress-status", daemon=True)
            self._ticker.start()
        return self

    def working_on(self, text: str) -> None:
        """What the current step is (the bar's status on a terminal, the plain status line's tail elsewhere)."""
        self.current = text
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, status=text[:80])

    def status_text(self) -> str:
        total = f"/{self.total}" if self.total else ""
        return f"status: {clock(time.time() - self._t0)} {self.description}: {self.done}{total} done" + (
            f"; {self.current}" if self.current else ""
        )

    def _tick(self) -> None:
        assert self._stop is not None  # __enter__ sets it before it starts the ticker
        while not self._stop.wait(self.plain_status_every_s):
            line(self.status_text())

    def advance(self, message: str = "", n: int = 1) -> None:
        self.done += n
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, advance=n, status=message[:80])
        elif message:
            total = f"/{self.total}" if self.total else ""
            line(f"[{self.done}{total}] {message}")

    def note(self, message: str) -> None:
        if self._rich is not None:
            self._rich.console.print(message, markup=False, highlight=False)
        else:
            line(message)

    def __exit__(self, *exc):
        if self._stop is not None and self._ticker is not None:
            self._stop.set()
            self._ticker.join()
        if self._rich is not None:
            self._rich.__exit__(*exc)
        return False


class StatusLine:
    """A live status line for long work: redrawn in place at the bottom of a terminal (the lines that
    `line` prints go above it), and on anything else a plain line at most every `plain_every_s`."""

    def __init__(self, plain_every_s: float = 60.0):
        self.plain_every_s = plain_every_s
        self._live: Optional[Live] = None
        self._last_plain = 0.0

    def update(self, text: str) -> None:
        if is_tty():
            if self._live is None:
                self._text = Text
                self._live = Live(
                    self._line(text), console=console(), transient=True, refresh_per_second=4, auto_refresh=True
                )
                self._live.__enter__()
            else:
                self._live.update(self._line(text))
            return
        now = time.time()
        if now - self._last_plain >= self.plain_every_s:
            self._last_plain = now
            line(text)

    def _line(self, text: str):
        return self._text(text, no_wrap=True, overflow="ellipsis")  # one line, cut at the terminal's width

    def close(self) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None


STATUS_MARK = {CheckStatus.PASSED: "ok", CheckStatus.FAILED: "FAIL", CheckStatus.SKIPPED: "skip"}

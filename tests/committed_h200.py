"""The committed H200 search run that the report and pull-request tests check, and a reader for the
markdown tables those documents print (shared by tests/test_figures.py and tests/test_pr_ci.py)."""

import os
import shutil

from kernel_agent.harness.ledger.ledger import Ledger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = os.path.join(ROOT, "results", "h200", "search")
RUN = "r20261130-160429-f59c"  # the run that promoted candidate #33 (matmul m256-klarge)


def table_rows(md: str, header: str):
    """The rows of the markdown table that follows `header`, as lists of cells."""
    lines = md[md.index(header) :].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    return rows


def copied_ledger(tmp_path):
    """A read-only ledger over a copy of the committed one (no test can change the committed file), and
    the copy's path."""
    db = tmp_path / "ledger.db"
    shutil.copy(os.path.join(H200, "ledger.db"), db)
    return Ledger(db, read_only=True), str(db)

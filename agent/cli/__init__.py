"""The `kernel-agent` command line: one module per command, named after it (`run.py` is `kernel-agent run`),
the parser and the dispatch in `parser.py`, what the commands share in `common.py`, the documents the read
commands and the web view show in `views.py`.

Usage errors print one line and exit 2; failures of what was checked exit 1.
"""

from .parser import main

__all__ = ["main"]

"""What the sanitizer's seed sweeps share (scripts/false_positive_sweep.py, correct kernels on many seeds;
scripts/hostile_seed_sweep.py, hostile ones): the seed base of the sweep's i-th seed, the results file
(one JSON line per verdict, appended as each is known, read back to resume), and the commit that judged."""

from __future__ import annotations

import json
import os
import random
import subprocess
from typing import Dict, List


def sweep_seed(i: int) -> int:
    """The seed base of the sweep's i-th seed: spread over 40 bits, the same for the same i."""
    return random.Random(i).getrandbits(40)


def read_results(path: str) -> List[Dict]:
    """The rows of a results file (one JSON object a line); none where it does not exist yet."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rows.append(json.loads(line))
    return rows


def checkout_commit(root: str) -> str:
    """The short commit of the checkout at `root`, with "+dirty" when a tracked file differs from it;
    "unknown" outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

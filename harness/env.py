"""Facts about the machine a result was measured on (recorded with every run and promotion)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import lru_cache
from typing import Dict, Optional


@lru_cache(maxsize=1)
def driver_version() -> Optional[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        v = out.stdout.strip().splitlines()
        return v[0].strip() if out.returncode == 0 and v else None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_name() -> Optional[str]:
    import torch  # keeps the CLI's startup light: commands imports this module before its flags are checked

    if torch.cuda.is_available() and not _interpreting():
        return torch.cuda.get_device_name()
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def versions() -> Dict[str, Optional[str]]:
    import torch  # keeps the CLI's startup light (as in gpu_name)
    import triton  # deferred: triton reads TRITON_INTERPRET when first imported; a version lookup must not fix it

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "driver": driver_version() if gpu_name() else None,
        "gpu": gpu_name(),
        "python": platform.python_version(),
    }


def slug(text: Optional[str]) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (text or "cpu").lower()).strip("-")

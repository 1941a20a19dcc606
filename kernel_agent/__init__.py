"""kernel-agent: makes Triton GPU kernels faster without making them wrong.

The repository's folders ops/, kernels/, isolation/, sanitizer/, harness/ and agent/ are installed
as kernel_agent.ops, kernel_agent.kernels, ... (see pyproject.toml). When the package
is imported straight from a source checkout that was never installed (a GPU machine
with torch and triton preinstalled and no package index), the checkout's root joins
this package's path so the same import names work there too.
"""

import os as _os

__version__ = "0.1.0"

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "sanitizer")):
    __path__.append(_root)  # noqa: F821

"""The agent layer: the loop, the stream, placement, proposers, publication, terminal output (docs/ARCHITECTURE.md).

The names below are what the command line takes from the layer's heavier modules. Each of those modules imports
torch (through the op registry or the serving set), so this package is their door (PEP 562): a name is imported
from its home when first read, `agent.run_loop(...)` in a command's body, which comes after the command's flags are
checked; the parser and `--help` never load torch. Everything else is imported from its own module.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the door hands out, for the type checker (at run time __getattr__ imports it)
    from .loop import run_loop
    from .publish import PromotionRequest, plan_target, publish_promotion, recorded_target
    from .run_config import RunConfig, targets_for
    from .search import baseline_source
    from .work import RunEvents

# name -> the module that defines it
_HOMES = {
    "run_loop": "kernel_agent.agent.loop",
    "PromotionRequest": "kernel_agent.agent.publish",
    "plan_target": "kernel_agent.agent.publish",
    "publish_promotion": "kernel_agent.agent.publish",
    "recorded_target": "kernel_agent.agent.publish",
    "RunConfig": "kernel_agent.agent.run_config",
    "targets_for": "kernel_agent.agent.run_config",
    "baseline_source": "kernel_agent.agent.search",
    "RunEvents": "kernel_agent.agent.work",
}

__all__ = [
    "PromotionRequest",
    "RunConfig",
    "RunEvents",
    "baseline_source",
    "plan_target",
    "publish_promotion",
    "recorded_target",
    "run_loop",
    "targets_for",
]


def __getattr__(name: str) -> Any:
    """A door name, read from its home on each use (so that a test's replacement there is what a command calls)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)

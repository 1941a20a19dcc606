"""A code model's endpoint and settings, from the flags, the config file's [model] section and the OPENAI_*
variables. Apart from the proposer (agent/model.py) because `run` resolves and checks it before torch is
imported: a usage error the flags decide comes at once. Nothing here imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional


@dataclass
class ModelConfig:
    model: str
    base_url: Optional[str] = None
    api_key: Optional[str] = None
    temperature: float = 0.7
    max_tokens: int = 8192
    timeout_s: float = 300.0
    max_retries: int = 4
    concurrency: int = 4

    @classmethod
    def resolve(
        cls, model: Optional[str], base_url: Optional[str], config_path: Optional[str]
    ) -> Optional["ModelConfig"]:
        """From flags, then the config file's [model] section, then OPENAI_* variables; None if no endpoint."""
        file_cfg: Dict[str, Any] = {}
        if config_path:
            file_cfg = load_config(config_path).get("model", {})
        base_url = base_url or file_cfg.get("base_url") or os.environ.get("OPENAI_BASE_URL")
        api_key = file_cfg.get("api_key") or os.environ.get("OPENAI_API_KEY")
        model = model or file_cfg.get("name") or os.environ.get("KERNEL_AGENT_MODEL")
        if not (base_url or api_key or model):
            return None
        if not model:
            raise ValueError("a model endpoint is configured but no model name: pass --model or set KERNEL_AGENT_MODEL")
        kwargs = {
            k: file_cfg[k]
            for k in ("temperature", "max_tokens", "timeout_s", "max_retries", "concurrency")
            if k in file_cfg
        }
        return cls(model, base_url, api_key, **kwargs)


def load_config(path: str) -> Dict[str, Any]:
    """A TOML config file ([model] name, base_url, api_key...; [run] ops, budgets)."""
    import tomllib  # deferred: in the standard library from Python 3.11; on 3.10 only a config file needs it

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such config file: {path}")
    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {path}: {e}") from None

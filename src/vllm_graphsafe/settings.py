"""Operator switches. Environment variables, so that they reach every vLLM process."""

from __future__ import annotations

import os
from dataclasses import dataclass

DISABLE_ENV = "VLLM_GRAPHSAFE_DISABLE"
STRICT_ENV = "VLLM_GRAPHSAFE_STRICT"
STATS_DIR_ENV = "VLLM_GRAPHSAFE_STATS_DIR"

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Settings:
    disabled_ids: frozenset[str]
    disable_all: bool
    strict: bool
    stats_dir: str | None

    def is_disabled(self, patch_id: str) -> bool:
        return self.disable_all or patch_id in self.disabled_ids


def read_settings(environ: os._Environ[str] | dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    ids = {part.strip() for part in env.get(DISABLE_ENV, "").split(",") if part.strip()}
    disable_all = bool(ids & {"all", "*"}) or env.get(DISABLE_ENV, "").strip() in _TRUE
    return Settings(
        disabled_ids=frozenset(ids),
        disable_all=disable_all,
        strict=env.get(STRICT_ENV, "").strip().lower() in _TRUE,
        stats_dir=env.get(STATS_DIR_ENV) or None,
    )

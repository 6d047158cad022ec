"""Operator switches. Environment variables, so that they reach every vLLM process.

Outside vLLM's ``VLLM_`` prefix, whose unknown names vLLM warns about; the first
names, ``VLLM_GRAPHSAFE_*``, are still honoured and reported as deprecated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Container, Mapping
from typing import NamedTuple

from vllm_graphsafe.vllm_layout import RAY_EXTRA_ENV_PREFIXES

#: The prefix of every variable of the plugin's, the ones it sets included.
SETTINGS_PREFIX = "GRAPHSAFE_"

DISABLE_ENV = "GRAPHSAFE_DISABLE"
STRICT_ENV = "GRAPHSAFE_STRICT"
STATS_DIR_ENV = "GRAPHSAFE_STATS_DIR"
EMULATE_ENV = "GRAPHSAFE_EMULATE_GRAPH_HAZARD"
#: Where each fix's verdict on the installed vLLM is kept between processes.
CACHE_DIR_ENV = "GRAPHSAFE_CACHE_DIR"
#: Set by the plugin in the API server, for the engine processes it starts: the
#: private directory where every process leaves its counts for ``/metrics``.
METRICS_DIR_ENV = "GRAPHSAFE_METRICS_DIR"

#: Every operator switch, with its deprecated first name.
DEPRECATED_NAMES = {
    name: f"VLLM_{name}" for name in (DISABLE_ENV, STRICT_ENV, STATS_DIR_ENV)
}
DISABLE_ALL = frozenset({"all", "*"})

#: What a switch accepts, in any case and with surrounding spaces; empty is off.
TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")


class Settings(NamedTuple):
    disabled_ids: frozenset[str]
    disable_all: bool
    strict: bool
    stats_dir: str | None
    emulate_graph_hazard: bool = False
    #: The private directory behind ``/metrics`` (set by the plugin, not by hand).
    metrics_dir: str | None = None
    #: ``GRAPHSAFE_CACHE_DIR`` as set (None: the user's cache directory; off: none).
    cache_dir: str | None = None
    #: One sentence per value that could not be read as meant.
    problems: tuple[str, ...] = ()
    #: The deprecated names found in the environment.
    deprecated: tuple[str, ...] = ()

    def is_disabled(self, patch_id: str) -> bool:
        return self.disable_all or patch_id in self.disabled_ids


def _boolean(name: str, raw: str | None, problems: list[str]) -> bool:
    value = (raw or "").strip().lower()
    if value in TRUE_VALUES:
        return True
    if value and value not in FALSE_VALUES:
        problems.append(
            f"{name}={raw!r} is neither on ({', '.join(TRUE_VALUES)}) nor off "
            f"({', '.join(FALSE_VALUES)}); it is read as off."
        )
    return False


def read_settings(
    environ: Mapping[str, str] | None = None, *, patch_ids: list[str] | None = None
) -> Settings:
    """``GRAPHSAFE_DISABLE``'s ids are checked against ``patch_ids`` where given."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    deprecated: list[str] = []

    def lookup(name: str) -> str | None:
        if name in env:
            return env[name]
        old = DEPRECATED_NAMES.get(name)
        if old is not None and old in env:
            deprecated.append(old)
            return env[old]
        return None

    disable_raw = lookup(DISABLE_ENV) or ""
    ids = {part.strip() for part in disable_raw.split(",") if part.strip()}
    disable_all = bool(ids & DISABLE_ALL) or disable_raw.strip().lower() in TRUE_VALUES
    if not disable_all and ids and patch_ids is not None:
        for unknown in sorted(ids - set(patch_ids)):
            problems.append(
                f"{DISABLE_ENV} names {unknown!r}, which is no patch of vllm-graphsafe "
                f"(known: {', '.join(patch_ids)}, or all); it is ignored."
            )
    strict = _boolean(STRICT_ENV, lookup(STRICT_ENV), problems)
    emulate = _boolean(EMULATE_ENV, env.get(EMULATE_ENV), problems)
    return Settings(
        disabled_ids=frozenset(ids),
        disable_all=disable_all,
        strict=strict,
        stats_dir=lookup(STATS_DIR_ENV) or None,
        emulate_graph_hazard=emulate,
        metrics_dir=env.get(METRICS_DIR_ENV) or None,
        cache_dir=env.get(CACHE_DIR_ENV) or None,
        problems=tuple(problems),
        deprecated=tuple(deprecated),
    )


def ray_copy_prefixes(
    environ: Mapping[str, str], vllm_variables: Container[str]
) -> str | None:
    """vLLM's prefixes to copy to its Ray actors with ``GRAPHSAFE_`` added unless
    covered; None to leave them (or where this vLLM does not know the variable).
    Added even with no ``GRAPHSAFE_*`` set: vLLM hashes the variable into its
    torch.compile cache key, which then does not change with the settings."""
    if RAY_EXTRA_ENV_PREFIXES not in vllm_variables:
        return None
    current = environ.get(RAY_EXTRA_ENV_PREFIXES, "")
    prefixes = [part.strip() for part in current.split(",") if part.strip()]
    if any(SETTINGS_PREFIX.startswith(prefix) for prefix in prefixes):
        return None
    return f"{current},{SETTINGS_PREFIX}" if prefixes else SETTINGS_PREFIX


def emulate_graph_hazard(environ: Mapping[str, str] | None = None) -> bool:
    return read_settings(environ).emulate_graph_hazard


def deprecation_sentences(settings: Settings) -> list[str]:
    renamed = {old: new for new, old in DEPRECATED_NAMES.items()}
    return [
        f"{old} is deprecated; name it {renamed[old]} (vLLM warns about unknown "
        "VLLM_* variables)."
        for old in settings.deprecated
    ]


_warned = False


def warn_once(logger: logging.Logger, settings: Settings) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    for sentence in (*settings.problems, *deprecation_sentences(settings)):
        logger.warning("vllm-graphsafe: %s", sentence)

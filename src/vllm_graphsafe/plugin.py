"""The ``vllm.general_plugins`` entry point: runs in every vLLM process.

It applies the patches and points the counts at the statistics directory and at
``/metrics``' private directory, which the API server names in
``GRAPHSAFE_METRICS_DIR`` before starting its engine processes, so they inherit it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vllm_graphsafe import counts, metrics, vllm_layout
from vllm_graphsafe.counts import roles
from vllm_graphsafe.private_files import (
    is_private_directory,
    make_private_directory,
    writable_by_others,
)
from vllm_graphsafe.registry import PatchFailedError, Registry, all_patches
from vllm_graphsafe.settings import (
    METRICS_DIR_ENV,
    Settings,
    ray_copy_prefixes,
    read_settings,
    warn_once,
)

#: Set where vLLM serves a multi-process registry (``--api-server-count`` above 1).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

logger = logging.getLogger(vllm_layout.LOGGER)

_REGISTRY: Registry | None = None
_prepared_in_pid: int | None = None
_prepared_directory: Path | None = None


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(all_patches())
    return _REGISTRY


def register() -> None:
    """Idempotent; never raises unless strict."""
    # First, so that the settings (GRAPHSAFE_DISABLE included) reach the Ray
    # actors this process may start even where the patches fail or are disabled.
    send_settings_to_ray_actors()
    first_time = _REGISTRY is None
    try:
        registry().apply_all()
    except PatchFailedError:
        raise
    except Exception as error:
        vllm_layout.vllm_logger().warning(
            "vllm-graphsafe: could not load its patches (%s: %s); vLLM runs "
            "without them. Report this with the output of `vllm-graphsafe doctor`.",
            type(error).__name__,
            error,
        )
        return
    counts.STATS.describe_patches = registry().states
    counts.STATS.wrapped_patches = registry().wrapped
    configure_counts()
    counts.STATS.flush()
    if first_time:
        # ops: logged once vLLM's logging is configured (the API server loads
        # plugins before it configures logging).
        counts.STATS.announce(
            vllm_layout.vllm_logger(), f"vllm-graphsafe: {registry().summary()}"
        )


def send_settings_to_ray_actors() -> None:
    """Add ``GRAPHSAFE_`` to the prefixes vLLM copies to its Ray actors: the
    plugins load before vLLM creates them, and it reads the variable then."""
    try:
        vllm_variables = vllm_layout.load_name(
            vllm_layout.ENVS, "environment_variables"
        )
        prefixes = ray_copy_prefixes(os.environ, vllm_variables)
    except Exception:  # a vLLM without them: its Ray actors get what vLLM copies
        return
    if prefixes is not None:
        os.environ[vllm_layout.RAY_EXTRA_ENV_PREFIXES] = prefixes


def configure_counts() -> None:
    """Warnings come from the process the operator started only."""
    settings = registry().read_settings()
    speaks = (
        roles.current_role() in (roles.ROLE_API_SERVER, roles.ROLE_MAIN)
        and settings.metrics_dir is None
    )
    if speaks:
        warn_once(logger, settings)
    directories: list[Path] = []
    if settings.stats_dir and not inherits_without_serving(settings):
        stats_dir = Path(settings.stats_dir)
        try:
            make_private_directory(stats_dir)
        except OSError as error:
            if speaks:
                _warn_unwritable(stats_dir, error)
        else:
            if speaks and writable_by_others(stats_dir):
                logger.warning(
                    "vllm-graphsafe: the statistics directory %s can be written by "
                    "other users; prefer a directory only you can write to.",
                    stats_dir,
                )
            directories.append(stats_dir)
    metrics_dir = prepare_metrics_directory(settings)
    if metrics_dir is not None:
        directories.append(metrics_dir)

    def report_write_error(directory: Path, error: OSError) -> None:
        if speaks and directory != metrics_dir:
            _warn_unwritable(directory, error)

    counts.STATS.on_write_error = report_write_error
    counts.STATS.configure(*directories)


def inherits_without_serving(settings: Settings) -> bool:
    """Whether this process runs under a server without serving it (vLLM's
    model-inspection subprocess): out of the statistics as out of ``/metrics``."""
    return (
        settings.metrics_dir is not None
        and not roles.is_root_process()
        and not roles.serves_vllm()
    )


def prepare_metrics_directory(settings: Settings | None = None) -> Path | None:
    """This process's metrics directory (None: none to use): created here in the
    API server, else inherited. Idempotent within a process."""
    global _prepared_in_pid, _prepared_directory
    if _prepared_in_pid == os.getpid():
        return _prepared_directory
    _prepared_in_pid = os.getpid()
    _prepared_directory = None
    if roles.is_root_process():
        directory = metrics.create_metrics_directory()
        if directory is None:
            return None
        os.environ[METRICS_DIR_ENV] = str(directory)
        metrics.register_collector(directory)
        if os.environ.get(MULTIPROC_DIR_ENV):  # set by the operator: served instead
            metrics.serve_with_multiprocess_collector(directory)
        _prepared_directory = directory
        return directory
    inherited = (read_settings() if settings is None else settings).metrics_dir
    if inherited and roles.serves_vllm() and is_private_directory(Path(inherited)):
        _prepared_directory = Path(inherited)
        if roles.is_spawned_api_server():
            metrics.serve_with_multiprocess_collector(_prepared_directory)
    return _prepared_directory


def _warn_unwritable(directory: Path, error: OSError) -> None:
    logger.warning(
        "vllm-graphsafe: cannot write dispatch statistics to %s (%s); vLLM serves "
        "as usual, without them.",
        directory,
        error.strerror or error,
    )

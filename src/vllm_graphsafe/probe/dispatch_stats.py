"""Reading the dispatch statistics the server's processes wrote.

The plugin's statistics module (and whatever it imports) loads only when a
statistics directory is given.
"""

from __future__ import annotations

from typing import Any

from vllm_graphsafe.probe.errors import bad_argument


def read_dispatch_stats(directory: str) -> dict[str, Any]:
    """The summed statistics the server's processes wrote, or a ``ProbeError``."""
    from vllm_graphsafe.counts import StatsDirError, read_stats_dir

    try:
        return read_stats_dir(directory)
    except StatsDirError as error:
        raise bad_argument(str(error)) from None
    except (AttributeError, KeyError, TypeError, ValueError):
        raise bad_argument(
            f"The statistics directory {directory} holds JSON files that are not "
            f"the plugin's statistics (--stats-dir)."
        ) from None

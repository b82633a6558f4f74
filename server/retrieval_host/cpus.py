"""The cores this process may run on: the default width of every pool the host sizes for the
CPU (embedding lanes, scan helpers, graph builds, search threads)."""

from __future__ import annotations

import os

__all__ = ["usable_cores"]


def usable_cores() -> int:
    """The CPUs in this process's affinity (not a container's CPU quota)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1

"""Giving freed heap memory back to the system (glibc's `malloc_trim`)."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Final


def _load_malloc_trim() -> Callable[[int], int] | None:
    # glibc keeps what the arena gave back (and the tokenizer's buffers) in its own free lists
    # and per-thread pools: after 500 hostile uploads the host held 1.49x its starting RSS, of
    # which malloc_trim returned all growth (in-process: 408 -> 283 MiB, below the start).
    # Absent outside glibc (musl, macOS): then nothing is trimmed.
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM: Final = _load_malloc_trim()


def trim_heap() -> None:
    """Return the heap's free memory to the system, where the C library can (glibc)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)  # ctypes releases the GIL for the call

"""The context byte budget: whole passages in rank order, never a cut text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from retrieval_host.core.models import Hit

H = TypeVar("H", bound=Hit)


def apply_byte_budget(hits: Sequence[H], max_bytes: int | None) -> tuple[list[H], bool]:
    """Keep hits in rank order while their UTF-8 text fits; returns (kept, dropped_any).

    Stops at the first passage that does not fit rather than skipping to a smaller one, so a
    lower-ranked passage never appears while a better one was left out.
    """
    if max_bytes is None:
        return list(hits), False
    kept: list[H] = []
    used = 0
    for hit in hits:
        size = len(hit.text.encode("utf-8"))
        if used + size > max_bytes:
            return kept, True
        kept.append(hit)
        used += size
    return kept, False

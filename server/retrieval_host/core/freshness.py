"""Freshness: how old an indexed revision may be for a search that asks (`maxAgeS`).

A revision's age is the time since its commit (`StoredSource.indexed_at`, RFC 3339 UTC). A
search with `max_age_s` reads only allowed revisions younger than that, selected with
authorization, before ranking; a revision committed by a release that did not record the
time (`indexed_at` None) has no known age and is left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

__all__ = ["fresh_revisions", "is_fresh"]


def is_fresh(indexed_at: str | None, now: str, max_age_s: float) -> bool:
    """Was the revision committed at most `max_age_s` seconds before `now`?"""
    if indexed_at is None:
        return False
    age = (datetime.fromisoformat(now) - datetime.fromisoformat(indexed_at)).total_seconds()
    return age <= max_age_s


def fresh_revisions(
    allowed: Mapping[str, str],
    indexed: Mapping[str, tuple[str, str | None]],
    now: str,
    max_age_s: float,
) -> dict[str, str]:
    """The allowed revisions (source -> revision) that are current in the store (`indexed`:
    source -> (revision, indexed_at)) and fresh enough."""
    if not math.isfinite(max_age_s):
        return dict(allowed)
    return {
        sid: revision
        for sid, revision in allowed.items()
        if (found := indexed.get(sid)) is not None
        and found[0] == revision
        and is_fresh(found[1], now, max_age_s)
    }

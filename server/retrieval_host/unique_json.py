"""JSON configuration files read strictly: an object holding a key twice, at any depth, is
refused (`json` keeps the last one silently), and so is a document nested deeper than
`MAX_DEPTH`. The host configuration, the tokens file, `RETRIEVAL_HOST_*` overrides, the
quickstart's kept `host.json` and the example application's ACL file are read so."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "DuplicateKeyError", "TooDeepError", "load_unique_json"]

# Arrays and objects inside one another. A configuration needs a handful (an ACL subject's
# `search` list is at level 4); pydantic refuses values past ~255 levels with an error whose
# location repeats `list.0.` for each, and `json` raises RecursionError near the interpreter's
# recursion limit (~1,000): a traceback and exit 1 at start, a 500 on every request for a live
# ACL (probe O, session 40).
MAX_DEPTH = 64


class DuplicateKeyError(ValueError):
    """A JSON object of a configuration file holds a key twice."""


class TooDeepError(ValueError):
    """A configuration file's arrays and objects are nested deeper than `MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"nested too deeply (more than {MAX_DEPTH} levels of arrays and objects)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            # Only the key: a value may be secret. (Not `http.strict.check_unique_keys`, the
            # requests' rule: it names no key, and an operator must find the line to fix.)
            raise DuplicateKeyError(
                f"the key {json.dumps(key)} appears twice in one object (a JSON object may "
                "hold each key once; remove the one that is not meant)"
            )
        seen[key] = value
    return seen


def load_unique_json(text: str) -> Any:
    """The JSON document, refusing an object with a key twice at any depth: `json` keeps the
    last one silently, so an edit that left a stale key above its replacement would be served
    as whichever came last (requests follow the same rule, `http.strict`). `TooDeepError` (a
    ValueError, as any JSON its callers cannot use) past `MAX_DEPTH` levels."""
    try:
        document = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise TooDeepError from None
    if _depth_exceeds(document, MAX_DEPTH):
        raise TooDeepError
    return document


def _depth_exceeds(document: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` (walked without recursion)."""
    pending: list[tuple[Any, int]] = [(document, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        if depth == limit:
            return True
        pending.extend((item, depth + 1) for item in value)
    return False

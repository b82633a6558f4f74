"""JSON configuration files read strictly: an object holding a key twice, at any depth, is
refused (`json` keeps the last one silently). The host configuration, the tokens file and the
example application's ACL file are read so."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DuplicateKeyError", "load_unique_json"]


class DuplicateKeyError(ValueError):
    """A JSON object of a configuration file holds a key twice."""


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
    as whichever came last (requests follow the same rule, `http.strict`)."""
    return json.loads(text, object_pairs_hook=_unique_keys)

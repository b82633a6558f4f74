"""The pure citation check: which `[source:ID]` markers a text contains, and are they allowed."""

from __future__ import annotations

import re
from collections.abc import Iterable

from retrieval_host_client._errors import InvalidCitationError

# Any "[source:" opens a marker, whatever surrounds it (quotes, code blocks included), in any
# case and with spaces around `source` (`[ source:x]` is a malformed marker, not plain text).
_OPEN = re.compile(r"\[\s*source\s*:", re.IGNORECASE)
_WELL_FORMED = re.compile(r"\[source:([^\[\]\s]+)\]")


def validate_source_citations(
    text: str, allowed_ids: Iterable[str], require_citation: bool = False
) -> list[str]:
    """Return the unique cited ids in order of first appearance.

    Raises `InvalidCitationError` for a malformed marker (wrong case, empty id, whitespace, no
    closing bracket; reason `malformed-marker`), for an id not in `allowed_ids`
    (`unknown-source`), or when `require_citation` is set and the text cites nothing
    (`no-citation`); `TypeError` when `allowed_ids` is one string rather than a collection.
    It never repairs a typo, and passing it is not factual verification:
    it only proves that every marker names a passage the caller was given.
    """
    if isinstance(allowed_ids, str):
        # A string is an iterable of its characters: `[source:p]` would pass.
        raise TypeError("allowed_ids must be a collection of ids, not one string")
    allowed = set(allowed_ids)
    cited: dict[str, None] = {}
    for opening in _OPEN.finditer(text):
        match = _WELL_FORMED.match(text, opening.start())
        if match is None:
            snippet = text[opening.start() : opening.start() + 40]
            raise InvalidCitationError(
                f"malformed citation marker near {snippet!r}", reason="malformed-marker"
            )
        source_id = match.group(1)
        if source_id not in allowed:
            raise InvalidCitationError(
                f"citation of an unknown source {source_id!r}", reason="unknown-source"
            )
        cited.setdefault(source_id, None)
    if require_citation and not cited:
        raise InvalidCitationError(
            "the text cites no source, but a citation is required", reason="no-citation"
        )
    return list(cited)

"""What a hit (or a passage read by its chunk id) shows of its source revision's metadata.

The revision's fields as indexed, except the two document-wide lists an ingested document
keeps: a Markdown or HTML document's `sections` (every section's heading path and line range)
and an e-mail thread's `messages` (every message's headers). Each hit repeated the whole list,
up to 11,000 bytes: a 100-hit search over long documents answered 0.5-1.2 MB, 90 % of it
these copies, and the hit still did not say which entry was its own. A hit shows that one
entry instead: `section`, the entry whose line range holds the passage's first line, and
`message`, the entry of the passage's message (`documentId`); null when the list was cut
short before it (`sectionsTruncated` / `messagesTruncated` stay, as every other field). The
source itself (`GET .../sources/{id}`) keeps the whole lists.

Only an ingested document's lists are replaced (its `mediaType` says which kind, and the
lists have the shapes ingestion writes), and never over a `section` or `message` key of the
caller's own (an upload's metadata is laid over the document's): prepared passages' and
callers' metadata is shown as it is (a black-box test found a caller's `section` replaced).
"""

from __future__ import annotations

from collections.abc import Mapping

from retrieval_host.core.models import JSONValue, Location


def passage_metadata(
    metadata: Mapping[str, JSONValue], location: Location
) -> Mapping[str, JSONValue]:
    """The metadata a hit at `location` shows (module docstring); `metadata` itself when it
    holds neither list."""
    sections = metadata.get("sections")
    messages = metadata.get("messages")
    kind = metadata.get("mediaType")
    replace_sections = (
        kind in _SECTIONED
        and "section" not in metadata
        and _all_entries(sections, ("headings", "startLine", "endLine"))
    )
    replace_messages = (
        kind in _MAIL and "message" not in metadata and _all_entries(messages, ("messageId",))
    )
    if not (replace_sections or replace_messages):
        return metadata
    shown = dict(metadata)
    if replace_sections:
        del shown["sections"]
        shown["section"] = _section_at(sections, location.start_line)
    if replace_messages:
        del shown["messages"]
        shown["message"] = _message_of(messages, location.document_id)
    return shown


# The media types whose ingestion writes `sections`, and `messages`.
_SECTIONED = frozenset({"text/markdown", "text/html"})
_MAIL = frozenset({"message/rfc822", "application/mbox"})


def _all_entries(value: JSONValue | None, keys: tuple[str, ...]) -> bool:
    return isinstance(value, list) and all(
        isinstance(entry, dict) and all(key in entry for key in keys) for entry in value
    )


def _section_at(sections: JSONValue | None, line: int | None) -> JSONValue:
    if not isinstance(sections, list) or line is None:
        return None
    for entry in sections:
        if not isinstance(entry, dict):
            continue
        start, end = entry.get("startLine"), entry.get("endLine")
        if isinstance(start, int) and isinstance(end, int) and start <= line <= end:
            return entry
    return None


def _message_of(messages: JSONValue | None, document_id: str | None) -> JSONValue:
    if not isinstance(messages, list) or document_id is None:
        return None
    for entry in messages:
        if isinstance(entry, dict) and entry.get("messageId") == document_id:
            return entry
    return None

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

Only an ingested document's lists are replaced (the media type the store recorded for the
source revision says which kind, and the lists have the shapes ingestion writes), and never
over a `section` or `message` key of the caller's own: prepared passages' and callers'
metadata is shown as it is (a black-box test found a caller's `section` replaced).

The kind is the stored type, not the metadata's `mediaType` key: an upload's caller metadata
is laid over the document's key by key, so `{"mediaType": "x"}` turned narrowing off (every
hit carried the whole list again), and a prepared source whose own metadata held
`mediaType: "text/markdown"` and a list of that shape was narrowed (probe H, session 40).
The store records the type apart from the metadata (None for prepared passages).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final, Literal

from retrieval_host.core.models import JSONValue, Location


class _Own(Enum):
    METADATA = "the metadata's own mediaType"


# `passage_metadata`'s `media_type` when the metadata is a document's own as ingestion wrote
# it (`prepare_document`'s), before a caller's is laid over: there its `mediaType` is the
# document's type. Never a stored source's metadata.
OWN_METADATA: Final = _Own.METADATA


def passage_metadata(
    metadata: Mapping[str, JSONValue],
    location: Location,
    text: str = "",
    *,
    media_type: str | Literal[_Own.METADATA] | None,
) -> Mapping[str, JSONValue]:
    """The metadata a hit at `location` shows (module docstring); `metadata` itself when it
    holds neither list. `text`, the passage's, tells sections that share its first line
    apart (`_section_at`). `media_type`: the stored media type of the passage's source
    revision (`Candidate.media_type`, `StoredPassage.media_type`; None, as for prepared
    passages, shows the metadata as it is), or `OWN_METADATA` for a document's own
    metadata (its `mediaType` key decides). Required: a caller that forgot the stored type
    and read the metadata's key let an upload's own `mediaType` turn narrowing off (session
    41)."""
    sections = metadata.get("sections")
    messages = metadata.get("messages")
    kind: str | None
    if media_type is OWN_METADATA:
        own = metadata.get("mediaType")  # a list or object is no type (and unhashable)
        kind = own if isinstance(own, str) else None
    else:
        kind = media_type
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
        shown["section"] = _section_at(sections, location.start_line, text)
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


def _section_at(sections: JSONValue | None, line: int | None, text: str) -> JSONValue:
    """The entry whose line range holds `line`. Where several do (HTML with a heading on the
    line a paragraph ends, or a minified page on one line: probe E, session 37, saw every
    passage of a page given its first section), the last of them whose heading the passage
    begins with: a section's first passage starts with its heading. A later passage of such a
    section gets the first entry, as before (a passage stores no section of its own)."""
    if not isinstance(sections, list) or line is None:
        return None
    holding = [
        entry
        for entry in sections
        if isinstance(entry, dict)
        and isinstance(entry.get("startLine"), int)
        and isinstance(entry.get("endLine"), int)
        and entry["startLine"] <= line <= entry["endLine"]
    ]
    if not holding:
        return None
    if len(holding) > 1:
        opening = text.lstrip("# \t\n")
        for entry in reversed(holding):
            headings = entry.get("headings")
            last = headings[-1] if isinstance(headings, list) and headings else None
            if isinstance(last, str) and last and opening.startswith(last):
                return entry
    return holding[0]


def _message_of(messages: JSONValue | None, document_id: str | None) -> JSONValue:
    if not isinstance(messages, list) or document_id is None:
        return None
    for entry in messages:
        if isinstance(entry, dict) and entry.get("messageId") == document_id:
            return entry
    return None

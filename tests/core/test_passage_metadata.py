"""A hit shows its own section and message, not its document's whole lists."""

from __future__ import annotations

from retrieval_host.core.models import JSONValue, Location
from retrieval_host.core.passage_metadata import passage_metadata

SECTIONS: list[JSONValue] = [
    {"headings": ["Guide"], "startLine": 1, "endLine": 4},
    {"headings": ["Guide", "Fuel"], "startLine": 5, "endLine": 9},
]
MESSAGES: list[JSONValue] = [
    {"messageId": "<a@x>", "from": "Ada", "date": "d", "subject": "s", "attachments": []},
    {"messageId": "<b@x>", "from": "Bo", "date": "d", "subject": "s", "attachments": []},
]


def test_a_passage_shows_the_section_that_holds_its_first_line() -> None:
    metadata: dict[str, JSONValue] = {
        "mediaType": "text/markdown",
        "lineCount": 9,
        "sections": SECTIONS,
    }
    shown = passage_metadata(metadata, Location(start_line=6, end_line=9))
    assert shown == {"mediaType": "text/markdown", "lineCount": 9, "section": SECTIONS[1]}
    assert passage_metadata(metadata, Location(start_line=12))["section"] is None
    assert passage_metadata(metadata, Location())["section"] is None


def test_a_passage_shows_its_message_and_the_list_s_truncation() -> None:
    metadata: dict[str, JSONValue] = {
        "mediaType": "application/mbox",
        "messageCount": 3,
        "messages": MESSAGES,
        "messagesTruncated": True,
    }
    shown = passage_metadata(metadata, Location(start_line=1, document_id="<b@x>"))
    assert shown == {
        "mediaType": "application/mbox",
        "messageCount": 3,
        "message": MESSAGES[1],
        "messagesTruncated": True,
    }
    lost = passage_metadata(metadata, Location(start_line=1, document_id="<c@x>"))
    assert lost["message"] is None and lost["messagesTruncated"] is True


def test_metadata_without_those_lists_or_of_another_shape_is_shown_as_it_is() -> None:
    plain: dict[str, JSONValue] = {"year": 2024, "lang": "en"}
    assert passage_metadata(plain, Location(start_line=1)) is plain
    own: dict[str, JSONValue] = {"sections": ["intro", "usage"], "messages": [{"id": 1}]}
    assert passage_metadata(own, Location(start_line=1, document_id="x")) is own
    # Prepared passages' lists of the ingestion shape, without an ingested media type.
    prepared: dict[str, JSONValue] = {"sections": SECTIONS, "messages": MESSAGES}
    assert passage_metadata(prepared, Location(start_line=6, document_id="<a@x>")) is prepared
    # A caller's own `section` laid over an upload's metadata is kept, and the list too.
    upload: dict[str, JSONValue] = {
        "mediaType": "text/markdown",
        "sections": SECTIONS,
        "section": "ops",
    }
    assert passage_metadata(upload, Location(start_line=6)) is upload

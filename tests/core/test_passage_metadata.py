"""A hit shows its own section and message, not its document's whole lists."""

from __future__ import annotations

from retrieval_host.core.models import JSONValue, Location
from retrieval_host.core.passage_metadata import OWN_METADATA, passage_metadata

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
    shown = passage_metadata(metadata, Location(start_line=6, end_line=9), media_type=OWN_METADATA)
    assert shown == {"mediaType": "text/markdown", "lineCount": 9, "section": SECTIONS[1]}
    assert (
        passage_metadata(metadata, Location(start_line=12), media_type=OWN_METADATA)["section"]
        is None
    )
    assert passage_metadata(metadata, Location(), media_type=OWN_METADATA)["section"] is None


def test_a_passage_shows_its_message_and_the_list_s_truncation() -> None:
    metadata: dict[str, JSONValue] = {
        "mediaType": "application/mbox",
        "messageCount": 3,
        "messages": MESSAGES,
        "messagesTruncated": True,
    }
    shown = passage_metadata(
        metadata, Location(start_line=1, document_id="<b@x>"), media_type=OWN_METADATA
    )
    assert shown == {
        "mediaType": "application/mbox",
        "messageCount": 3,
        "message": MESSAGES[1],
        "messagesTruncated": True,
    }
    lost = passage_metadata(
        metadata, Location(start_line=1, document_id="<c@x>"), media_type=OWN_METADATA
    )
    assert lost["message"] is None and lost["messagesTruncated"] is True


def test_metadata_without_those_lists_or_of_another_shape_is_shown_as_it_is() -> None:
    plain: dict[str, JSONValue] = {"year": 2024, "lang": "en"}
    assert passage_metadata(plain, Location(start_line=1), media_type=OWN_METADATA) is plain
    own: dict[str, JSONValue] = {"sections": ["intro", "usage"], "messages": [{"id": 1}]}
    assert (
        passage_metadata(own, Location(start_line=1, document_id="x"), media_type=OWN_METADATA)
        is own
    )
    # Prepared passages' lists of the ingestion shape, without an ingested media type.
    prepared: dict[str, JSONValue] = {"sections": SECTIONS, "messages": MESSAGES}
    assert (
        passage_metadata(
            prepared, Location(start_line=6, document_id="<a@x>"), media_type=OWN_METADATA
        )
        is prepared
    )
    # A caller's own `section` laid over an upload's metadata is kept, and the list too.
    upload: dict[str, JSONValue] = {
        "mediaType": "text/markdown",
        "sections": SECTIONS,
        "section": "ops",
    }
    assert passage_metadata(upload, Location(start_line=6), media_type=OWN_METADATA) is upload


def test_the_stored_media_type_decides_not_the_metadata_s_own_key() -> None:
    # Probe H (session 40): an upload's caller metadata is laid over the document's, so its
    # `mediaType` turned narrowing off; a prepared source's own `mediaType` turned it on.
    upload: dict[str, JSONValue] = {"mediaType": "text/plain", "sections": SECTIONS}
    shown = passage_metadata(upload, Location(start_line=6), "", media_type="text/markdown")
    assert shown == {"mediaType": "text/plain", "section": SECTIONS[1]}
    mail: dict[str, JSONValue] = {"mediaType": "x", "messages": MESSAGES}
    shown = passage_metadata(mail, Location(document_id="<a@x>"), "", media_type="message/rfc822")
    assert shown == {"mediaType": "x", "message": MESSAGES[0]}
    prepared: dict[str, JSONValue] = {"mediaType": "text/markdown", "sections": SECTIONS}
    assert passage_metadata(prepared, Location(start_line=6), "", media_type=None) is prepared
    assert (
        passage_metadata(prepared, Location(start_line=6), "", media_type="text/plain") is prepared
    )
    # Still never over a caller's own `section`.
    own: dict[str, JSONValue] = {"sections": SECTIONS, "section": "ops"}
    assert passage_metadata(own, Location(start_line=6), "", media_type="text/markdown") is own


def test_a_media_type_key_that_is_no_string_is_no_type() -> None:
    # Read from the metadata itself (a document's own), a list or object failed as unhashable.
    listed: dict[str, JSONValue] = {"mediaType": ["text/markdown"], "sections": SECTIONS}
    assert passage_metadata(listed, Location(start_line=6), media_type=OWN_METADATA) is listed
    assert passage_metadata(listed, Location(start_line=6), "", media_type=None) is listed

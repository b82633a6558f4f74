"""The headers of an e-mail message that its source metadata and citations use: its id, the
id it is cited by in a thread, and its From, Date and Subject as a reader sees them."""

from __future__ import annotations

import hashlib
import re
from email.message import Message
from typing import Final

from retrieval_host.core.models import JSONValue
from retrieval_host.ingest._text import clip
from retrieval_host.ingest.charsets import encoded_words, has_encoded_words, utf8_or_1252

MAX_ATTACHMENTS_LISTED: Final = 20
# Characters: RFC 5322's line length, less room for `#n` (`unique_id`) under core's 998.
MAX_MESSAGE_ID: Final = 990
_MSG_ID: Final = re.compile(r"<[^<>\s]+>")
_RAW_BYTE: Final = re.compile("[\udc80-\udcff]")


def message_id_of(message: Message, raw: bytes) -> str:
    value = header(message, "Message-ID")
    if value is not None:
        value = clip(value, MAX_MESSAGE_ID)
        # RFC 5322 allows comments and folding around the id: `(sent by x) <id@host>`.
        bracketed = _MSG_ID.findall(value)
        if len(bracketed) == 1:
            return str(bracketed[0])
        if value and " " not in value:
            return value
    return "<sha256:" + hashlib.sha256(raw).hexdigest() + ">"


def unique_id(message_id: str, taken: dict[str, int]) -> str:
    """The id, or for its n-th use in the document (n >= 2) `id#n`: two messages of one thread
    with one Message-ID (a resent message, a broken mailer, two identical messages without an
    id) must not cite alike. A suffix another message already cites (its own Message-ID read
    `id#2`, written without angle brackets) is passed over."""
    uses = taken.get(message_id, 0) + 1
    cited = message_id if uses == 1 else f"{message_id}#{uses}"
    while uses > 1 and cited in taken:
        uses += 1
        cited = f"{message_id}#{uses}"
    taken[message_id] = uses
    taken.setdefault(cited, 1)
    return cited


def header(message: Message, name: str) -> str | None:
    """A header's decoded value, or its raw text if the structured parser trips over it.

    Raw 8-bit bytes in a header (against RFC 5322, common in old mailers) are read as text
    is (`utf8_or_1252`), not replaced by U+FFFD."""
    for key, raw in message.raw_items():
        if key.lower() == name.lower():
            if isinstance(raw, str) and _RAW_BYTE.search(raw):
                data = raw.encode("ascii", errors="surrogateescape")
                return " ".join(utf8_or_1252(data).split())
            # Subject words read as bodies are; an address header's stay with the structured
            # parser, which keeps `"Doe, José" <...>` one quoted name (a black-box probe)
            if name == "Subject" and isinstance(raw, str) and has_encoded_words(raw):
                words = encoded_words(raw)
                if words is not None:
                    return words
            break
    try:
        value = message.get(name)
        return None if value is None else str(value)
    except Exception:
        for key, raw in message.raw_items():
            if key.lower() == name.lower():
                return str(raw)
        return None


def message_info(
    message: Message, message_id: str, attachments: list[dict[str, JSONValue]]
) -> dict[str, JSONValue]:
    # Clipped as the id in passage locations is (`message_id_of`): the two must match.
    info: dict[str, JSONValue] = {"messageId": clip(message_id, MAX_MESSAGE_ID)}
    for key, name in (("from", "From"), ("date", "Date"), ("subject", "Subject")):
        value = header(message, name)
        info[key] = clip(value) if value is not None else None
    listed: list[JSONValue] = list(attachments[:MAX_ATTACHMENTS_LISTED])
    info["attachments"] = listed
    if len(attachments) > MAX_ATTACHMENTS_LISTED:
        info["attachmentCount"] = len(attachments)
    return info

"""E-mail: one `.eml` message or an mbox thread as a single versioned source.

Each message is parsed with the standard library (`email.policy.default`); its body text is one
segment (split around the quotes of text another message of the thread says itself, which are
not indexed: `core.mail_quotes`) whose passages carry the Message-ID as `location.documentId`
(the `<...>` id, without the comments RFC 5322 allows around it; a missing or unusable
Message-ID becomes `<sha256:HEX>` of the message's bytes, so it is deterministic; the n-th
message of a document with an id already used gets `ID#n`, so no two messages cite alike). Line
numbers count the lines of that message's extracted body text: its readable text parts, joined
by a blank line. Per part, text/plain is preferred; in `multipart/alternative` the HTML version
is used only when there is no plain one with text, and it is read as an HTML file is
(`ingest.html`): line n of its text is what a reader sees on line n of the decoded HTML part
(scripts, styles and comments dropped; blank where a line has no visible text), so a citation of
an HTML-only message points at the lines of its HTML. Charsets are decoded with replacement; an
unknown or non-text charset is read as UTF-8 with replacement: bad bytes never raise, but a body
text part marked base64 that is not base64 (`_text.base64_body`) is `email-malformed`.

Attachments (any part marked `Content-Disposition: attachment`, any other part with a filename
except inline text/plain, which is body text, any part that is not text/plain or text/html,
messages attached as files) are listed in metadata by file name, content type and decoded
size. They are never parsed, decoded for content or executed. A message forwarded inline (a
`message/rfc822` part neither marked `attachment` nor named) is read as body text: its text
parts where it sits among the parts, as a mail reader shows them.

Source metadata: `messageCount` and `messages`, a list in thread order of `{messageId, from,
date, subject, attachments}` (header values as written, decoded, cut to 300 characters; at most
20 attachments per message). When the list would not fit the metadata budget it is cut short
and `messagesTruncated` is true.

Bounds, each `PAYLOAD_TOO_LARGE`: messages in an mbox (`messages`, counted before parsing), the
header section of any part (`header-bytes`, checked before parsing for the top level), MIME
parts per message (`mime-parts`, estimated from boundary lines before parsing, then counted
exactly), MIME nesting (`mime-depth`), HTML to convert per document (`html-bytes`).

The mbox is split on its envelope lines (mboxo/mboxrd): the first line, and each later line
that starts with `From ` and either carries a whole ctime date as writers put it (`From
sender@example.org Mon Jan  1 10:00:00 2024`, blank line before it or not), or follows a blank
line, carries a date (a time `hh:mm` and a year) and is followed by a header block (header
lines up to a blank line, with a From, Date, Message-ID or Subject field). A body line that
starts with `From ` but is not one (mid-paragraph, without a date: "From here on...", or a
sentence: "From 09:00 to 17:00 in 2024 ...") stays body text of its message; quoted `>From `
body lines are kept as written.

Text is decoded with the declared charset as `charsets.read_text` reads it (the HTML
standard's label table, by the superset senders write), except that a label the standard
reads as windows-1252 (ASCII, ISO-8859-1, windows-1252) or UTF-8, or none, reads the bytes as
UTF-8 where they are UTF-8 and each other byte as windows-1252 (what mailers that mislabel
send). Header values with raw 8-bit bytes, and RFC 2047 words, are read the same way.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email import policy
from email.errors import NoBoundaryInMultipartDefect
from email.message import EmailMessage, Message
from email.parser import BytesParser
from typing import Final, TypeVar

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.mail_quotes import repeated_quote_lines
from retrieval_host.core.models import JSONValue
from retrieval_host.core.reasons import InvalidDocumentReason, PayloadTooLargeReason
from retrieval_host.ingest._text import base64_body, bounded, clip, normalize_text, unflowed
from retrieval_host.ingest.charsets import read_text
from retrieval_host.ingest.chunking import Extracted, Segment, paragraph_blocks
from retrieval_host.ingest.html import visible_lines
from retrieval_host.ingest.mail_headers import message_id_of, message_info, unique_id
from retrieval_host.ingest.settings import (
    MBOX,
    IngestLimits,
    MiB,
    invalid_document,
    too_large,
)

# html.parser handles roughly a megabyte a second; this bounds the time spent on HTML bodies.
MAX_HTML_BYTES: Final = 4 * MiB

# Envelope lines after the first (`_envelopes`). Each pattern is linear in the line's length:
# one nesting of lazy quantifiers took 34 s on a 16 KB line (a review found it).
_FROM_LINE: Final = re.compile(rb"^From \S+[ \t][^\n]*\n", re.MULTILINE)
_TIME: Final = re.compile(rb"\b\d{1,2}:\d{2}\b")
_YEAR: Final = re.compile(rb"\b(?:19|20)\d{2}\b")
# ctime's date, as mbox writers put it: enough alone, even without a blank line before it.
_CTIME: Final = re.compile(
    rb"From \S+[ \t]+[A-Z][a-z]{2}[ \t]+[A-Z][a-z]{2}[ \t]+\d{1,2}[ \t]+"
    rb"\d{1,2}:\d{2}(?::\d{2})?[ \t]+(?:19|20)\d{2}[ \t]*\r?\n"
)
_FIRST_ENVELOPE: Final = re.compile(rb"\AFrom [^\n]*\n")
_HEADER_LINE: Final = re.compile(rb"^[!-9;-~]+[ \t]*:")
_HEADER_END: Final = re.compile(rb"\r?\n\r?\n")
# How far past an envelope line a header block is looked for (`_headers_follow`).
_HEADER_WINDOW: Final = 16 * 1024
_BOUNDARY: Final = re.compile(rb'boundary\s*=\s*(?:"([^"\r\n]{1,200})"|([^\s;"]{1,200}))', re.I)
_DASH_LINE: Final = re.compile(rb"^--([^\r\n]*?)[ \t]*\r?$", re.MULTILINE)
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def extract_email(
    data: bytes,
    media_type: str,
    title: str | None,
    limits: IngestLimits,
    cancel: CancelToken | None,
) -> Extracted:
    """Extract a message or a thread (see the module docstring for the rules and bounds)."""
    raws = _split_mbox(data, limits) if media_type == MBOX else [_single(data)]
    html = _HtmlBudget(MAX_HTML_BYTES, limits.max_html_elements, cancel)
    bodies: list[str] = []
    infos: list[dict[str, JSONValue]] = []
    taken: dict[str, int] = {}
    read: list[tuple[str, tuple[str, ...], str]] = []  # the messages with text
    no_boundary = False
    for raw in raws:
        if cancel is not None:
            cancel.check()
        message = _parse(raw, limits)
        no_boundary = no_boundary or any(
            isinstance(defect, NoBoundaryInMultipartDefect)
            for part in message.walk()
            for defect in part.defects
        )
        message_id = unique_id(message_id_of(message, raw), taken)
        texts: list[str] = []
        attachments: list[dict[str, JSONValue]] = []
        try:
            _collect(message, texts, attachments, html, top=True)
        except _NotBase64 as exc:
            raise invalid_document(
                InvalidDocumentReason.EMAIL_MALFORMED,
                f"message {clip(message_id, 100)}: a text part is marked base64 but holds "
                "characters base64 does not use, so its text cannot be read.",
            ) from exc
        body = "\n\n".join(t for t in texts if t.strip())
        bodies.append(body)
        info = message_info(message, message_id, attachments)
        if body.strip():
            subject = info["subject"]
            read.append((message_id, (subject,) if isinstance(subject, str) else (), body))
        infos.append(info)
        if cancel is not None:
            cancel.progress()
    segments = _segments(read)
    if not segments:
        if no_boundary:
            # Its parts cannot be told apart, so none is read: a malformed message, not an
            # empty one (a black-box test).
            raise invalid_document(
                InvalidDocumentReason.EMAIL_MALFORMED,
                "a multipart part declares no boundary, so its parts cannot be read.",
            )
        raise invalid_document(
            InvalidDocumentReason.EMPTY_DOCUMENT, "no message has any readable text."
        )

    kept, truncated = bounded(infos)
    metadata: dict[str, JSONValue] = {
        "mediaType": media_type,
        "messageCount": len(raws),
        "messages": kept,
    }
    if truncated:
        metadata["messagesTruncated"] = True
    if title is None:
        first_subject = infos[0].get("subject") if infos else None
        title = first_subject if isinstance(first_subject, str) else ""
    return Extracted(tuple(segments), "\f".join(bodies), title, metadata)


def _segments(read: list[tuple[str, tuple[str, ...], str]]) -> list[Segment]:
    """The messages' passages' segments: each body's lines, less the quotes of text another
    message of the thread says itself (`core.mail_quotes`), split where those were."""
    bodies = [tuple(body.split("\n")) for _, _, body in read]
    segments: list[Segment] = []
    for (message_id, path, _), lines, left in zip(
        read, bodies, repeated_quote_lines(bodies), strict=True
    ):
        for dropped, run in itertools.groupby(range(len(lines)), left.__contains__):
            indices = list(run)
            part = lines[indices[0] : indices[-1] + 1]
            if not dropped and any(line.strip() for line in part):
                blocks = paragraph_blocks(part)
                segment = Segment(part, indices[0] + 1, blocks, document_id=message_id, path=path)
                segments.append(segment)
    return segments


# --- framing -----------------------------------------------------------------------------------


def _single(data: bytes) -> bytes:
    """An .eml file; an mbox-style envelope line in front of it is tolerated and dropped, but
    not a second message after it (`_another_message`): that is an mbox, whose other
    messages would be cited as the first one's body."""
    if data.startswith(b"From "):
        for start, end in itertools.islice(_envelopes(data), 1, None):
            if _another_message(data, start, end):
                raise invalid_document(
                    InvalidDocumentReason.CONTENT_TYPE_MISMATCH,
                    "the bytes hold several messages (an mbox): send them as application/mbox.",
                )
        newline = data.find(b"\n")
        data = b"" if newline < 0 else data[newline + 1 :]
    if not _HEADER_LINE.match(data):
        raise invalid_document(
            InvalidDocumentReason.CONTENT_TYPE_MISMATCH,
            "the bytes do not start with an e-mail header.",
        )
    return data


def _another_message(data: bytes, start: int, end: int) -> bool:
    """Whether the envelope line at `start:end` of an .eml opens another message, as in an
    mbox: a blank line before it, then a header block (header and folded lines up to a blank
    line) with a From, Date, Message-ID or Subject field. A body line shaped like an envelope
    (`From the 10:30 call on 3 May 2024`) followed by `Note: ...` is text."""
    if not (data.endswith(b"\n\n", 0, start) or data.endswith(b"\n\r\n", 0, start)):
        return False
    return _headers_follow(data, end)


def _headers_follow(data: bytes, end: int) -> bool:
    """Whether a header block starts at `end`: header and folded lines up to a blank line,
    with a From, Date, Message-ID or Subject field."""
    # Only up to the block's end: a window copied whole for every dated `From ` line made a
    # crafted 16 MB mbox take 21 s (a review).
    stop = min(len(data), end + _HEADER_WINDOW)
    blank = _HEADER_END.search(data, end, stop)
    block = data[end : blank.start() if blank else stop].replace(b"\r\n", b"\n")
    lines = block.split(b"\n")  # the first must be a header line, the rest may be folded
    if blank is None and len(lines) > 1 and stop < len(data):
        lines.pop()  # the window cut this line short
    if not _HEADER_LINE.match(lines[0]) or not all(
        _HEADER_LINE.match(line) or line[:1] in (b" ", b"\t") for line in lines
    ):
        return False
    names = {line.split(b":", 1)[0].strip().lower() for line in lines if b":" in line}
    return bool(names & {b"from", b"date", b"message-id", b"subject"})


def _split_mbox(data: bytes, limits: IngestLimits) -> list[bytes]:
    if not data.startswith(b"From "):
        raise invalid_document(
            InvalidDocumentReason.CONTENT_TYPE_MISMATCH, "an mbox must start with a 'From ' line."
        )
    starts: list[tuple[int, int]] = []
    for envelope in _envelopes(data):
        if len(starts) >= limits.max_messages:
            raise too_large(
                PayloadTooLargeReason.MESSAGES,
                f"the mbox has more than {limits.max_messages} messages.",
            )
        starts.append(envelope)
    if not starts:  # a single envelope line without a newline
        return [b""]
    messages: list[bytes] = []
    for index, (_, body_start) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(data)
        raw = data[body_start:end]
        # The blank line before the next envelope (or at the end of the file) separates
        # messages; it is not content. Without one (the last message of a file that does not
        # end with a blank line; a ctime envelope right after a body) the final newline is the
        # message's own: stripping it would give the message another digest (its id, when it
        # has no Message-ID) there than elsewhere in a thread.
        if raw.endswith((b"\n\n", b"\n\r\n")):
            if raw.endswith(b"\r\n"):
                raw = raw[:-2]
            elif raw.endswith(b"\n"):
                raw = raw[:-1]
        messages.append(raw)
    return messages


def _envelopes(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each envelope line: the first line, whatever its shape; then each
    `From ` line that carries a whole ctime date (`Mon Jan  1 10:00:00 2024`), or follows a
    blank line, carries a time and a year and is followed by a header block."""
    first = _FIRST_ENVELOPE.match(data)
    if first is None:
        return
    yield first.start(), first.end()
    for match in _FROM_LINE.finditer(data, first.end()):
        line, start = match.group(), match.start()
        after_blank = data.endswith(b"\n\n", 0, start) or data.endswith(b"\n\r\n", 0, start)
        dated = after_blank and _TIME.search(line) is not None and _YEAR.search(line) is not None
        # A dated line that is not a ctime envelope splits only when a header block follows:
        # "From 09:00 to 17:00 in 2024 ..." after a blank line is a sentence of the body.
        if _CTIME.fullmatch(line) is not None or (dated and _headers_follow(data, match.end())):
            yield start, match.end()


def _parse(raw: bytes, limits: IngestLimits) -> EmailMessage:
    end = _HEADER_END.search(raw, 0, limits.max_header_bytes + 4)
    header_bytes = end.start() if end else len(raw)
    if header_bytes > limits.max_header_bytes:
        raise _header_too_large(limits)
    _estimate_parts(raw, limits)
    try:
        message = BytesParser(policy=policy.default).parsebytes(raw)
    except RecursionError as exc:
        raise _too_deep(limits) from exc
    except Exception as exc:  # the parser is lenient; anything it still raises is a bad message
        _log.info("unparseable message: %s", type(exc).__name__)
        raise invalid_document(
            InvalidDocumentReason.EMAIL_MALFORMED, "a message could not be parsed."
        ) from exc
    if not isinstance(message, EmailMessage):  # policy.default always builds EmailMessage
        raise invalid_document(
            InvalidDocumentReason.EMAIL_MALFORMED, "a message could not be parsed."
        )
    _check_structure(message, limits)
    return message


def _estimate_parts(raw: bytes, limits: IngestLimits) -> None:
    """Refuse a message with too many parts before the (slow) parser builds them all.

    Every part starts at a delimiter line `--BOUNDARY` of a declared boundary, so the number
    of such lines bounds the number of parts from above.
    """
    declared: set[bytes] = set()
    for match in _BOUNDARY.finditer(raw):
        declared.add(match.group(1) or match.group(2))
        if len(declared) > limits.max_mime_parts:  # each multipart declares one boundary
            raise _too_many_parts(limits)
    if not declared:
        return
    count = 0
    for match in _DASH_LINE.finditer(raw):
        if match.group(1) in declared:  # a closing `--BOUNDARY--` does not match: no new part
            count += 1
            if count > limits.max_mime_parts:
                raise _too_many_parts(limits)


def _check_structure(message: Message, limits: IngestLimits) -> None:
    """Count parts, nesting and header bytes exactly, iteratively (no recursion)."""
    stack: list[tuple[Message, int]] = [(message, 0)]
    parts = 0
    while stack:
        part, depth = stack.pop()
        parts += 1
        if parts > limits.max_mime_parts:
            raise _too_many_parts(limits)
        if depth > limits.max_mime_depth:
            raise _too_deep(limits)
        # The top level's was measured exactly above; a part's is counted from its parsed lines
        # with the shortest line end (`: ` and LF), so no section within the bound is refused.
        if (
            depth
            and sum(len(k) + len(v) + 3 for k, v in part.raw_items()) > limits.max_header_bytes
        ):
            raise _header_too_large(limits)
        if part.is_multipart():
            children = part.get_payload()
            if isinstance(children, list):
                stack.extend((child, depth + 1) for child in children if isinstance(child, Message))


def _too_many_parts(limits: IngestLimits) -> RetrievalError:
    return too_large(
        PayloadTooLargeReason.MIME_PARTS,
        f"a message has more than {limits.max_mime_parts} MIME parts.",
    )


def _too_deep(limits: IngestLimits) -> RetrievalError:
    return too_large(
        PayloadTooLargeReason.MIME_DEPTH,
        f"a message nests MIME parts deeper than {limits.max_mime_depth}.",
    )


def _header_too_large(limits: IngestLimits) -> RetrievalError:
    return too_large(
        PayloadTooLargeReason.HEADER_BYTES,
        f"a header section is larger than {limits.max_header_bytes} bytes.",
    )


# --- content ---------------------------------------------------------------------------------


@dataclass
class _HtmlBudget:
    """What the HTML bodies of one document may still cost: bytes in all, elements each."""

    bytes_left: int
    max_elements: int
    cancel: CancelToken | None


def _collect(
    part: Message,
    texts: list[str],
    attachments: list[dict[str, JSONValue]],
    html: _HtmlBudget,
    *,
    top: bool = False,
) -> None:
    """Readable text of a part into `texts`, attachments into `attachments`.

    Recursive, but only after `_check_structure` has bounded the depth.
    """
    content_type = _content_type(part)
    if part.is_multipart():
        children = list(_children(part))
        if content_type.startswith("message/") and not top:
            # A forwarded message shown inline is body text, as a mail reader shows it; one
            # marked `attachment` (or named) is listed like any other attachment.
            disposition = _safe(part.get_content_disposition)
            if disposition == "attachment" or _safe(part.get_filename) is not None:
                attachments.append(_attachment(part, content_type))
                return
            for child in children:
                _collect(child, texts, attachments, html)
            return
        if content_type == "multipart/alternative":
            # The preferred alternative that has text: an empty text/plain beside the HTML
            # (some mailers send one) must not hide the HTML a reader sees.
            for chosen in _alternatives(children):
                found: list[str] = []
                _collect(chosen, found, attachments, html)
                if any(t.strip() for t in found):
                    texts.extend(found)
                    break
            return
        for child in children:
            _collect(child, texts, attachments, html)
        return
    disposition = _safe(part.get_content_disposition)
    filename = _safe(part.get_filename)
    # An inline text/plain part that carries a file name (`inline; filename=...`, or only a
    # `name` parameter) is what mailers make of a pasted or signed text: body text. Any other
    # named part, or one marked `attachment`, is an attachment.
    named_body = content_type == "text/plain" and disposition in (None, "inline")
    if (
        disposition == "attachment"
        or (filename is not None and not named_body)
        or content_type not in ("text/plain", "text/html")
    ):
        attachments.append(_attachment(part, content_type))
        return
    payload = _body_payload(part)
    text = read_text(payload, _safe(part.get_content_charset))
    if content_type == "text/plain" and _param(part, "format") == "flowed":
        text = unflowed(normalize_text(text), delsp=_param(part, "delsp") == "yes")
    if content_type == "text/html":
        html.bytes_left -= len(payload)
        if html.bytes_left < 0:
            raise too_large(
                PayloadTooLargeReason.HTML_BYTES,
                f"the document has more than {MAX_HTML_BYTES} bytes of HTML.",
            )
        text = visible_lines(normalize_text(text), html.max_elements, html.cancel)
    texts.append(normalize_text(text))


def _children(part: Message) -> Iterator[Message]:
    payload = part.get_payload()
    if isinstance(payload, list):
        yield from (child for child in payload if isinstance(child, Message))


def _alternatives(children: list[Message]) -> list[Message]:
    """The alternatives in the order they are tried: text/plain, then HTML, then the
    structured ones, richest (last) first."""
    types = [_content_type(c) for c in children]
    ordered: list[Message] = []
    for wanted in ("text/plain", "text/html"):
        for child, content_type in zip(children, types, strict=True):
            if content_type == wanted and _safe(child.get_filename) is None:
                ordered.append(child)
    structured = [c for c, t in zip(children, types, strict=True) if t.startswith("multipart/")]
    return ordered + structured[::-1]


def _attachment(part: Message, content_type: str) -> dict[str, JSONValue]:
    filename = _safe(part.get_filename)
    size = None if part.is_multipart() else len(_payload(part))
    return {
        "filename": clip(filename) if isinstance(filename, str) else None,
        "contentType": clip(content_type, 100),
        "size": size,
    }


def _content_type(part: Message) -> str:
    try:
        return part.get_content_type()
    except Exception:  # a header the parser cannot read: the part is opaque data
        return "application/octet-stream"


def _payload(part: Message) -> bytes:
    try:
        payload = part.get_payload(decode=True)
    except Exception:  # a broken transfer encoding: nothing readable
        return b""
    return payload if isinstance(payload, bytes) else b""


class _NotBase64(Exception):
    """A body text part marked base64 whose payload is not (`_text.base64_body`)."""


def _body_payload(part: Message) -> bytes:
    """The bytes of a body text part: a base64 one read strictly (`_NotBase64` otherwise)."""
    if str(part.get("content-transfer-encoding", "")).strip().lower() != "base64":
        return _payload(part)
    raw = part.get_payload()  # bytes outside ASCII come as lone surrogates: not base64 either
    decoded = base64_body(raw.encode()) if isinstance(raw, str) and raw.isascii() else None
    if decoded is None:
        raise _NotBase64
    return decoded


def _param(part: Message, name: str) -> str | None:
    """A Content-Type parameter's plain value, in lower case."""
    value = _safe(lambda: part.get_param(name))
    return value.strip().lower() if isinstance(value, str) else None


def _safe(getter: Callable[[], _T]) -> _T | None:
    try:
        return getter()
    except Exception:  # malformed header parameters never stop ingestion
        return None

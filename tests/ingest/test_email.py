"""E-mail ingestion: one source per thread, Message-IDs in locations, safe decoding."""

from __future__ import annotations

import base64
import json
import quopri
import threading
from typing import Any

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.validation import MAX_METADATA_BYTES
from retrieval_host.ingest import IngestLimits, PreparedDocument, prepare_document
from retrieval_host.ingest.email import _envelopes
from tests.ingest.conftest import TokenCounter
from tests.support import ingest_documents as docs

HTML_REPLY = (
    "<html><head><title>ignored title</title><style>p {color: red}</style></head><body>"
    "<p>The <b>east</b> quay is closed on Sunday.</p>"
    "<script>document.write('never indexed')</script>"
    "<ul><li>Moor west instead.</li><li>Pay at the office.</li></ul>"
    "<!-- a comment that is not text -->"
    "</body></html>"
)


def alternative_message() -> bytes:
    return (
        b"From: Bob <bob@example.org>\r\nSubject: Re: Quay\r\n"
        b"Message-ID: <m2@example.org>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/alternative; boundary="alt"\r\n\r\n'
        b"--alt\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
        b"Plain: the east quay is closed on Sunday.\r\n"
        b"--alt\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
        + HTML_REPLY.encode()
        + b"\r\n--alt--\r\n"
    )


def attachment_message() -> bytes:
    secret = base64.b64encode(b"ATTACHMENT-BODY-NEVER-INDEXED\n" * 3)
    return (
        b"From: Carol <carol@example.org>\r\nSubject: Re: Quay\r\n"
        b"Message-ID: <m3@example.org>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="mix"\r\n\r\n'
        b"--mix\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
        b"Fee table attached.\r\nSee the second column.\r\n"
        b'--mix\r\nContent-Type: text/csv; name="fees.csv"\r\n'
        b'Content-Disposition: attachment; filename="fees.csv"\r\n'
        b"Content-Transfer-Encoding: base64\r\n\r\n" + secret + b"\r\n"
        b"--mix\r\nContent-Type: application/x-sh\r\n"
        b'Content-Disposition: attachment; filename="run.sh"\r\n\r\n'
        b"rm -rf / # never executed, never indexed\r\n"
        b"--mix--\r\n"
    )


def html_only_message() -> bytes:
    return docs.message(
        HTML_REPLY, message_id="<m4@example.org>", content_type="text/html; charset=utf-8"
    )


def thread() -> bytes:
    first = docs.message("Is the east quay open on Sunday?\n\nThanks,\nAlice\n", subject="Quay")
    return docs.mbox(first, alternative_message(), attachment_message(), html_only_message())


def prepare(data: bytes, count_tokens: TokenCounter, media_type: str, **limits: int) -> Any:
    return prepare_document(
        data,
        media_type,
        source_id="quay-thread",
        token_counter=count_tokens,
        limits=IngestLimits(**limits),
    )


def test_a_thread_is_one_source_with_message_ids_in_locations(
    count_tokens: TokenCounter,
) -> None:
    prepared: PreparedDocument = prepare(thread(), count_tokens, "application/mbox")
    by_id = {c.location.document_id: c for c in prepared.chunks}
    assert list(by_id) == [
        "<m1@example.org>",
        "<m2@example.org>",
        "<m3@example.org>",
        "<m4@example.org>",
    ]
    first = by_id["<m1@example.org>"]
    assert first.text == "Is the east quay open on Sunday?\n\nThanks,\nAlice"
    assert (first.location.start_line, first.location.end_line) == (1, 4)
    assert by_id["<m3@example.org>"].text == "Fee table attached.\nSee the second column."
    assert prepared.source.title == "Quay"
    messages: Any = prepared.source.metadata["messages"]
    assert [m["messageId"] for m in messages] == list(by_id)
    assert messages[1] == {
        "messageId": "<m2@example.org>",
        "from": "Bob <bob@example.org>",
        "date": None,
        "subject": "Re: Quay",
        "attachments": [],
    }
    assert messages[0]["date"] == "Mon, 01 Jan 2024 10:00:00 +0000"
    assert prepared.source.metadata["messageCount"] == 4


def test_plain_text_is_preferred_and_html_is_turned_into_text(
    count_tokens: TokenCounter,
) -> None:
    prepared: PreparedDocument = prepare(thread(), count_tokens, "application/mbox")
    by_id = {c.location.document_id: c.text for c in prepared.chunks}
    assert by_id["<m2@example.org>"] == "Plain: the east quay is closed on Sunday."
    # The HTML is one line, so its visible text is one line.
    html_text = by_id["<m4@example.org>"]
    assert html_text == "The east quay is closed on Sunday. Moor west instead. Pay at the office."
    everything = "\n".join(by_id.values())
    for hidden in ("never indexed", "color: red", "ignored title", "a comment"):
        assert hidden not in everything


MULTILINE_HTML = """<html><head><style>p { color: red }</style></head><body>
<p>Great result on the import latency.</p>
<ul><li>p50 is down.</li><li>p99 too.</li></ul>

<p>Thanks,<br>
Bob</p>
</body></html>
"""


@pytest.mark.parametrize("encoding", ["8bit", "quoted-printable", "base64"])
def test_an_html_only_message_is_cited_by_the_lines_of_its_html(
    count_tokens: TokenCounter, encoding: str
) -> None:
    # A black-box tester found the passage of an HTML-only message cited by the lines of the
    # converted text: one `<ul>` line became three, so the citation pointed at the wrong lines.
    body = MULTILINE_HTML.encode()
    if encoding == "base64":
        body = base64.encodebytes(body)
    elif encoding == "quoted-printable":
        body = quopri.encodestring(body)
    raw = docs.message(
        body,
        message_id="<html@example.org>",
        content_type="text/html; charset=utf-8",
        extra_headers=[f"Content-Transfer-Encoding: {encoding}"],
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    [chunk] = prepared.chunks
    start, end = chunk.location.start_line, chunk.location.end_line
    assert (start, end) == (2, 6) and start is not None
    html_lines = MULTILINE_HTML.split("\n")
    for number, line in enumerate(chunk.text.split("\n"), start):
        cited = html_lines[number - 1]
        assert all(word in cited for word in line.split()), (number, line, cited)
    assert chunk.text == (
        "Great result on the import latency.\np50 is down. p99 too.\n\nThanks,\nBob"
    )


def test_attachments_are_listed_and_never_parsed(count_tokens: TokenCounter) -> None:
    prepared: PreparedDocument = prepare(thread(), count_tokens, "application/mbox")
    messages: Any = prepared.source.metadata["messages"]
    assert messages[2]["attachments"] == [
        {"filename": "fees.csv", "contentType": "text/csv", "size": 90},
        {"filename": "run.sh", "contentType": "application/x-sh", "size": 40},
    ]
    texts = "\n".join(c.text for c in prepared.chunks)
    assert "ATTACHMENT-BODY" not in texts
    assert "rm -rf" not in texts


def test_broken_charsets_read_as_utf8_or_windows_1252(count_tokens: TokenCounter) -> None:
    prepared: PreparedDocument = prepare(
        docs.broken_charsets_message(), count_tokens, "message/rfc822"
    )
    text = prepared.chunks[0].text
    # An unknown or non-text label reads as no label: not UTF-8, so windows-1252.
    assert "unknown charset caf\u00e9 \u00ff\u00fe end" in text
    assert "codec charset x\u0153\u00cbH\u00cd\u00c9\u00c9" in text
    # A black-box test: latin-1 bytes labelled UTF-8 were stored as U+FFFD.
    assert "mislabelled \u00e9t\u00e9 latin-1 bytes" in text
    assert prepared.chunks[0].location.document_id == "<charsets@example.org>"


@pytest.mark.parametrize(
    ("charset", "body", "expected"),
    [
        # Outlook's smart quotes under an ISO-8859-1 label were stored as C1 controls.
        (
            "iso-8859-1",
            b"He said \x93yes\x94 \x96 to the zebu.",
            "He said \u201cyes\u201d \u2013 to",
        ),
        # UTF-8 bytes under a US-ASCII label were stored as U+FFFD.
        ("us-ascii", "caf\u00e9 cr\u00e8me".encode(), "caf\u00e9 cr\u00e8me"),
        # UTF-8 with one stray byte stays UTF-8; the stray byte reads as windows-1252.
        (
            "utf-8",
            "\u00e9t\u00e9 ".encode() + b"\xff" + " na\u00efve".encode(),
            "\u00e9t\u00e9 \u00ff na\u00efve",
        ),
        # A Latin-1 message quoting one UTF-8 line keeps both (a review: its accents were lost).
        (
            "iso-8859-1",
            "Gr\u00fc\u00dfe aus K\u00f6ln\n".encode("latin-1") + "> Caf\u00e9".encode(),
            "Gr\u00fc\u00dfe aus K\u00f6ln\n> Caf\u00e9",
        ),
        (None, "Gr\u00fc\u00dfe".encode(), "Gr\u00fc\u00dfe"),
        # A declared charset that decodes keeps its reading, damage and all.
        ("shift_jis", "\u65e5\u672c".encode("shift_jis") + b"\xff", "\u65e5\u672c"),
    ],
)
def test_mislabelled_8bit_text_reads_as_mail_readers_show_it(
    count_tokens: TokenCounter, charset: str | None, body: bytes, expected: str
) -> None:
    content_type = "text/plain" + (f"; charset={charset}" if charset else "")
    raw = docs.message(
        body, content_type=content_type, extra_headers=["Content-Transfer-Encoding: 8bit"]
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert expected in prepared.chunks[0].text


# Probe D (session 35): correct labels read as mojibake (unknown to Python) or losing the
# characters their senders' supersets add, and a neighbour with each (髙橋 became "\ufffd煖ｴ").
@pytest.mark.parametrize(
    ("charset", "text", "encoding"),
    [
        ("iso-8859-8-i", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd", "iso8859_8"),
        ("windows-874", "\u0e40\u0e0b\u0e34\u0e23\u0e4c\u0e1f", "cp874"),
        ("Windows-31J", "\u30b5\u30fc\u30d0\u30fc\u306f\u505c\u6b62", "cp932"),
        ("x-gbk", "\u670d\u52a1\u5668\u5468\u4e8c", "gbk"),
        ("x-mac-roman", "caf\u00e9 \u2014 fin", "mac_roman"),
        ("gb2312", "\u6731\u9555\u57fa \u8bf4", "gbk"),  # 镕 is GBK, not GB 2312
        ("Shift_JIS", "\u2460\u306e\u624b\u9806 \u9ad9\u6a4b\u3055\u3093", "cp932"),
        ("ks_c_5601-1987", "\ub620\uc58c\uafcd", "cp949"),  # Outlook's label of CP949
        ("iso-8859-9", "\u201cT\u00fcrk\u00e7e\u201d", "cp1254"),
        # The rest of the standard's table (probe V): labels Python does not know.
        ("koi8", "\u041f\u0440\u0438\u0432\u0435\u0442", "koi8_r"),
        ("iso88597", "\u0393\u03b5\u03b9\u03ac", "iso8859_7"),
        ("visual", "\u05e9\u05dc\u05d5\u05dd", "iso8859_8"),
        ("ucs-2", "caf\u00e9 \u2603", "utf-16-le"),
        ("iso-2022-kr", "\ud55c\uad6d\uc5b4", "iso2022_kr"),  # a browser shows nothing
    ],
)
def test_a_label_reads_as_the_superset_its_senders_write(
    count_tokens: TokenCounter, charset: str, text: str, encoding: str
) -> None:
    raw = docs.message(
        text.encode(encoding),
        content_type=f"text/plain; charset={charset}",
        extra_headers=["Content-Transfer-Encoding: 8bit"],
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.chunks[0].text == text


@pytest.mark.parametrize("label", ["idna", "undefined", "punycode", "unicode_escape", "cp037"])
def test_a_label_the_standard_does_not_know_reads_as_none(
    count_tokens: TokenCounter, label: str
) -> None:
    # Probe V (session 35): Python codecs no mailer declares garbled text (or crashed HTML).
    raw = docs.message(
        "caf\u00e9 C:\\new\\table \u201cok\u201d".encode(),
        content_type=f"text/plain; charset={label}",
        extra_headers=["Content-Transfer-Encoding: 8bit"],
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.chunks[0].text == "caf\u00e9 C:\\new\\table \u201cok\u201d"


@pytest.mark.parametrize(
    ("charset", "body", "expected"),
    [
        # Probe W (session 35): labels mailers send outside the standard's table were read as
        # UTF-8 or windows-1252, a BOM was ignored, x-user-defined gave private-use characters.
        ("utf-7", "Caf\u00e9 na\u00efve".encode("utf-7"), "Caf\u00e9 na\u00efve"),
        ("cp850", "Gr\u00f6\u00dfe fa\u00e7ade".encode("cp850"), "Gr\u00f6\u00dfe fa\u00e7ade"),
        ("ibm437", "Gr\u00f6\u00dfe".encode("cp437"), "Gr\u00f6\u00dfe"),
        ("euc-cn", "\u4e2d\u6587\u6d4b\u8bd5".encode("gb2312"), "\u4e2d\u6587\u6d4b\u8bd5"),
        ("latin9", "5 \u20ac \u0153uvre".encode("iso8859_15"), "5 \u20ac \u0153uvre"),
        ("utf-32", "Hello w\u00f6rld".encode("utf-32"), "Hello w\u00f6rld"),
        (
            "iso-2022-jp-2",
            "\u65e5\u672c\u8a9e \u00c4".encode("iso2022_jp_2"),
            "\u65e5\u672c\u8a9e \u00c4",
        ),
        (
            "utf-16",
            "Hello w\u00f6rld".encode("utf-16-be").join([b"\xfe\xff", b""]),
            "Hello w\u00f6rld",
        ),
        ("utf-16", b"\xff\xfe" + "Hello w\u00f6rld".encode("utf-16-le"), "Hello w\u00f6rld"),
        ("x-user-defined", "caf\u00e9 na\u00efve".encode("cp1252"), "caf\u00e9 na\u00efve"),
        ("iso-2022-cn", b"\x1b$)A\x0e\x3d\x3b\x0f ok", ""),  # no decoder: unreadable
    ],
)
def test_labels_mailers_send_outside_the_table_and_byte_order_marks_are_read(
    count_tokens: TokenCounter, charset: str, body: bytes, expected: str
) -> None:
    raw = docs.message(
        base64.b64encode(body) + b"\n",
        content_type=f"text/plain; charset={charset}",
        extra_headers=["Content-Transfer-Encoding: base64"],
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    text = prepared.chunks[0].text.strip()
    if expected:
        assert text == expected
    else:  # all of it unreadable, none of its escape bytes shown as text
        assert set(text) == {"\ufffd"}


def test_an_address_header_keeps_its_quoted_display_name(count_tokens: TokenCounter) -> None:
    # Probe W (session 35): read as a subject is, `"Doe, José" <...>` lost its quotes.
    raw = docs.message("Body.\n").replace(
        b"From: Alice <alice@example.org>",
        b"From: =?utf-8?Q?Doe=2C_Jos=C3=A9?= <jose@example.org>",
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    messages: Any = prepared.source.metadata["messages"]
    assert messages[0]["from"] == '"Doe, Jos\u00e9" <jose@example.org>'


def test_encoded_words_read_as_bodies_and_iso_2022_jp_marks_other_sets_unreadable(
    count_tokens: TokenCounter,
) -> None:
    # Probe V (session 35): an ISO-8859-1 encoded word holding windows-1252 quotes showed C1
    # controls; in ISO-2022-JP with the Windows rows, an escape to another set (KS C 5601)
    # left its bytes as text.
    quoted = base64.b64encode("\u201chi\u201d caf\u00e9".encode("cp1252")).decode()
    raw = docs.message(
        b"\x1b$B$3-!\x1b$(C0!\x1b(B tail",
        subject=f"=?iso-8859-1?B?{quoted}?=",
        content_type="text/plain; charset=iso-2022-jp",
        extra_headers=["Content-Transfer-Encoding: 7bit"],
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.source.title == "\u201chi\u201d caf\u00e9"
    assert prepared.chunks[0].text == "\u3053\u2460\ufffd tail"


def test_iso_2022_jp_holds_the_windows_rows_and_encoded_subjects_their_supersets(
    count_tokens: TokenCounter,
) -> None:
    # ① and ㈱ (NEC row 13) as Outlook and Thunderbird write them: Python's codec refuses the
    # row, and its replacement ate the escape back to ASCII.
    body = b"\x1b$B-!\x1b(B restart \x1b$B-j$3$s$K$A$O\x1b(B ok \x1b(I12\x1b(B."
    subject = "=?gb2312?b?" + base64.b64encode("\u6731\u9555\u57fa".encode("gbk")).decode()
    raw = docs.message(
        body,
        subject=subject + "?= =?iso-2022-jp?B?GyRCLSEbKEI=?= report",
        content_type="text/plain; charset=ISO-2022-JP",
        extra_headers=["Content-Transfer-Encoding: 7bit"],
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.chunks[0].text == (
        "\u2460 restart \u3231\u3053\u3093\u306b\u3061\u306f ok \uff71\uff72."
    )
    assert prepared.source.title == "\u6731\u9555\u57fa\u2460 report"
    messages: Any = prepared.source.metadata["messages"]
    assert messages[0]["subject"] == prepared.source.title


@pytest.mark.parametrize(
    ("delsp", "expected"),
    [
        # Apple Mail's soft line ends: a word broken at one is whole again (probe D, session
        # 35: `archi ving` was stored, and lexical search for `archiving` found nothing).
        ("yes", "The retention rule for archiving applies to every mailbox."),
        ("no", "The retention rule for archi ving applies to every mailbox."),
    ],
)
def test_format_flowed_text_reads_as_its_reader_shows_it(
    count_tokens: TokenCounter, delsp: str, expected: str
) -> None:
    soft = " " if delsp == "yes" else ""
    body = (
        f"The retention rule for archi \nving applies to every {soft}\nmailbox.\n\n"
        f"> An earlier {soft}\n> note.\n"
        "-- \nAlice\n"
    )
    raw = docs.message(
        body, content_type=f"text/plain; charset=utf-8; format=flowed; delsp={delsp}"
    )
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    text = prepared.chunks[0].text
    assert text.split("\n")[:3] == [expected, "", "> An earlier note."]
    assert text.endswith("-- \nAlice") or text.endswith("--\nAlice")
    # A signature separator after a flowed line is a line of its own (probe V, session 35).
    raw = docs.message(
        "Regards, \n-- \nJohn\n", content_type="text/plain; charset=utf-8; format=flowed"
    )
    lines = prepare(raw, count_tokens, "message/rfc822").chunks[0].text.split("\n")
    assert lines[0] == "Regards, " or lines[0] == "Regards,"
    assert lines[1].rstrip() == "--" and lines[2] == "John"


def test_a_nul_in_a_body_separates_the_words_around_it(count_tokens: TokenCounter) -> None:
    # Probe D (session 35): the NUL was dropped, joining `before` and `after` into one word.
    raw = docs.message(b"before\x00after and more text.\n")
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.chunks[0].text == "before after and more text."


def test_raw_8bit_headers_read_as_text(count_tokens: TokenCounter) -> None:
    # A black-box test: latin-1 bytes in a Subject became U+FFFD in the title and metadata.
    raw = docs.message("Body.\n", subject="SUBJ").replace(
        b"Subject: SUBJ", "Subject: Gr\u00fc\u00dfe aus K\u00f6ln".encode("latin-1")
    )
    raw = raw.replace(b"From: Alice", "From: J\u00f6rg".encode())
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.source.title == "Gr\u00fc\u00dfe aus K\u00f6ln"
    messages: Any = prepared.source.metadata["messages"]
    assert messages[0]["subject"] == "Gr\u00fc\u00dfe aus K\u00f6ln"
    assert messages[0]["from"] == "J\u00f6rg <alice@example.org>"


def test_a_missing_message_id_becomes_a_content_digest(count_tokens: TokenCounter) -> None:
    raw = docs.message("No id here.\n", message_id=None)
    first: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    again: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    document_id = first.chunks[0].location.document_id
    assert document_id is not None and document_id.startswith("<sha256:")
    assert len(document_id) == len("<sha256:>") + 64
    assert again.chunks[0].location.document_id == document_id


def test_messages_of_one_thread_never_cite_alike(count_tokens: TokenCounter) -> None:
    resent = docs.message("The quay reopens Monday.\n", message_id="<dup@example.org>")
    thread = docs.mbox(
        docs.message("First, with the id.\n", message_id="<dup@example.org>"),
        resent,
        docs.message("No id at all.\n", message_id=None),
        docs.message("No id at all.\n", message_id=None),  # byte-identical to the one before
    )
    prepared: PreparedDocument = prepare(thread, count_tokens, "application/mbox")
    ids = [c.location.document_id for c in prepared.chunks]
    assert ids[:2] == ["<dup@example.org>", "<dup@example.org>#2"]
    assert ids[2] is not None and ids[2].startswith("<sha256:")
    assert ids[3] == f"{ids[2]}#2"
    messages = prepared.source.metadata["messages"]
    assert isinstance(messages, list)
    listed = [m["messageId"] for m in messages if isinstance(m, dict)]
    assert listed == ids  # the console finds each passage's own message


@pytest.mark.parametrize(
    "written",
    [["dup@x.org", "dup@x.org", "dup@x.org#2"], ["dup@x.org#2", "dup@x.org", "dup@x.org"]],
)
def test_a_message_whose_own_id_reads_like_a_repeat_is_never_cited_like_another(
    count_tokens: TokenCounter, written: list[str]
) -> None:
    # A black-box test: ids without angle brackets are kept as written, so the second
    # `dup@x.org` and a message whose Message-ID is `dup@x.org#2` both cited `dup@x.org#2`,
    # and the third message's passages showed the second's From, Date and Subject.
    thread = docs.mbox(
        *(docs.message(f"Message {n} says so.\n", message_id=i) for n, i in enumerate(written))
    )
    prepared: PreparedDocument = prepare(thread, count_tokens, "application/mbox")
    ids = [c.location.document_id for c in prepared.chunks]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert [c.text.split()[1] for c in prepared.chunks] == ["0", "1", "2"]
    assert ids[0] == written[0]  # a message's first use keeps its own id
    messages = prepared.source.metadata["messages"]
    assert isinstance(messages, list)
    assert [m["messageId"] for m in messages if isinstance(m, dict)] == ids


def test_a_message_without_an_id_keeps_its_id_when_another_follows_it(
    count_tokens: TokenCounter,
) -> None:
    # Appending a message to a thread must not move a citation of the one that was last,
    # whether or not the file ends with a blank line (concatenated .eml files do not).
    envelope = b"From sender@example.org Mon Jan  1 10:00:00 2024\n"
    alone = envelope + docs.message("No id here.\n", message_id=None).replace(b"\r\n", b"\n")
    assert alone.endswith(b"No id here.\n")
    followed = alone + b"\n" + envelope + docs.message("A reply.\n").replace(b"\r\n", b"\n")
    ended = alone + b"\n"  # the same message, the file ending with a blank line

    def ids(data: bytes) -> list[str | None]:
        prepared: PreparedDocument = prepare(data, count_tokens, "application/mbox")
        return [c.location.document_id for c in prepared.chunks]

    first = ids(alone)[0]
    assert first is not None and first.startswith("<sha256:")
    assert ids(followed)[0] == first
    assert ids(ended) == [first]
    assert ids(alone + b"\n" + alone) == [first, f"{first}#2"]
    # Concatenated files with no blank line between them (a ctime envelope still splits).
    assert ids(alone + alone) == [first, f"{first}#2"]


def test_a_long_message_id_is_the_same_in_locations_and_metadata(
    count_tokens: TokenCounter,
) -> None:
    long_id = "<" + "k" * 480 + "@example.org>"  # one header line, under RFC 5322's 998
    prepared: PreparedDocument = prepare(
        docs.message("Hi.\n", message_id=long_id), count_tokens, "message/rfc822"
    )
    assert prepared.chunks[0].location.document_id == long_id
    messages = prepared.source.metadata["messages"]
    assert isinstance(messages, list) and isinstance(messages[0], dict)
    assert messages[0]["messageId"] == long_id  # the console joins them by equality


def test_comments_around_a_message_id_are_not_part_of_it(count_tokens: TokenCounter) -> None:
    raw = docs.message("Hi.\n", message_id="(sent by a relay) <cfws@example.org> (trailing)")
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert prepared.chunks[0].location.document_id == "<cfws@example.org>"


def test_an_eml_may_start_with_an_mbox_envelope_line(count_tokens: TokenCounter) -> None:
    raw = b"From someone@example.org Mon Jan  1 10:00:00 2024\n" + docs.message("Hi.\n")
    prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
    assert [c.text for c in prepared.chunks] == ["Hi."]


def test_an_mbox_sent_as_one_message_is_a_mismatch(count_tokens: TokenCounter) -> None:
    # Its other messages would be cited under the first one's Message-ID.
    thread = docs.mbox(docs.message("First.\n"), docs.message("Second.\n", message_id="<b@x>"))
    with pytest.raises(RetrievalError) as caught:
        prepare(thread, count_tokens, "message/rfc822")
    assert caught.value.reason == "content-type-mismatch"
    assert "application/mbox" in str(caught.value)
    # Body lines that only start like an envelope are text, even before a `Key: value` line.
    body = (
        "Notes.\n\nFrom Paris at 10:30 in 2024 we sailed on.\nIt rained.\n\n"
        "From the 10:30 call on 3 May 2024\nAttendees: Ann, Bo\nNote: see the minutes\n"
    )
    prose = b"From someone@example.org Mon Jan  1 10:00:00 2024\n" + docs.message(body)
    prepared: PreparedDocument = prepare(prose, count_tokens, "message/rfc822")
    text = " ".join(c.text for c in prepared.chunks)
    assert "From Paris at 10:30" in text and "Attendees: Ann, Bo" in text


@pytest.mark.parametrize(
    ("data", "media_type"),
    [
        pytest.param(b"# Not mail\n\nJust Markdown.\n", "application/mbox", id="mbox-without-from"),
        pytest.param(b"%PDF-1.7\n%...", "message/rfc822", id="pdf-as-eml"),
    ],
)
def test_bytes_that_are_not_mail_are_a_mismatch(
    data: bytes, media_type: str, count_tokens: TokenCounter
) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare(data, count_tokens, media_type)
    assert caught.value.code == ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "content-type-mismatch"


@pytest.mark.parametrize(
    ("data", "media_type", "limits", "reason"),
    [
        pytest.param(thread(), "application/mbox", {"max_messages": 3}, "messages", id="messages"),
        pytest.param(
            docs.many_parts_message(12), "message/rfc822", {"max_mime_parts": 10}, "mime-parts"
        ),
        pytest.param(docs.nested_message(6), "message/rfc822", {"max_mime_depth": 4}, "mime-depth"),
        pytest.param(
            docs.long_header_message(3000), "message/rfc822", {"max_header_bytes": 2048},
            "header-bytes",
        ),
    ],
)  # fmt: skip
def test_mail_limits_are_typed_errors(
    data: bytes, media_type: str, limits: dict[str, int], reason: str, count_tokens: TokenCounter
) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare(data, count_tokens, media_type, **limits)
    assert caught.value.code == ErrorCode.PAYLOAD_TOO_LARGE
    assert caught.value.reason == reason


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
def test_a_header_section_is_refused_only_past_its_bound(
    count_tokens: TokenCounter, newline: bytes
) -> None:
    # A black-box test: a file with LF line ends was refused two bytes short of the bound (each
    # header line counted with a CRLF it did not have).
    lines = [b"From: a@example.org", b"Subject: s"] + [
        b"X-Pad-%02d: %s" % (n, b"p" * 180) for n in range(10)
    ]
    head = newline.join(lines)
    bound = len(head)
    message = head + newline + newline + b"Body text." + newline
    prepared = prepare(message, count_tokens, "message/rfc822", max_header_bytes=bound)
    assert [c.text for c in prepared.chunks] == ["Body text."]
    with pytest.raises(RetrievalError) as caught:
        prepare(message, count_tokens, "message/rfc822", max_header_bytes=bound - 1)
    assert caught.value.reason == "header-bytes"


def test_a_message_without_text_is_an_empty_document(count_tokens: TokenCounter) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare(b"From: a@example.org\r\nSubject: only headers\r\n", count_tokens, "message/rfc822")
    assert caught.value.reason == "empty-document"


def test_thread_metadata_stays_within_the_metadata_bound(count_tokens: TokenCounter) -> None:
    messages = [
        docs.message(f"Reply {i}.\n", message_id=f"<r{i}@example.org>", subject="S" * 400)
        for i in range(300)
    ]
    prepared: PreparedDocument = prepare(docs.mbox(*messages), count_tokens, "application/mbox")
    metadata = prepared.source.metadata
    assert metadata["messagesTruncated"] is True
    assert metadata["messageCount"] == 300
    assert len(json.dumps(metadata, sort_keys=True)) <= MAX_METADATA_BYTES
    listed: Any = metadata["messages"]
    assert 0 < len(listed) < 300
    assert len(listed[0]["subject"]) == 300  # header values are cut for metadata
    assert len(prepared.chunks) == 300  # every message is still indexed


def named_text_message() -> bytes:
    """The shape of CPython's test message msg_44: text/plain parts that carry a file name,
    one `inline; filename=`, one with only a `name` parameter, beside a real attachment."""
    return (
        b"From: Dana <dana@example.org>\r\nSubject: Tide notes\r\n"
        b"Message-ID: <m5@example.org>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="named"\r\n\r\n'
        b'--named\r\nContent-Type: text/plain; charset=us-ascii; name="tides.txt"\r\n'
        b'Content-Disposition: inline; filename="tides.txt"\r\n\r\n'
        b"High tide is at six in the morning.\r\n"
        b'--named\r\nContent-Type: text/plain; name="notes.txt"\r\n\r\n'
        b"The pilot boards at the outer buoy.\r\n"
        b'--named\r\nContent-Type: text/plain; name="log.txt"\r\n'
        b'Content-Disposition: attachment; filename="log.txt"\r\n\r\n'
        b"ATTACHED-LOG-NEVER-INDEXED\r\n"
        b"--named--\r\n"
    )


def test_inline_text_parts_with_a_file_name_are_body_text(count_tokens: TokenCounter) -> None:
    prepared = prepare(named_text_message(), count_tokens, "message/rfc822")
    text = "\n".join(chunk.text for chunk in prepared.chunks)
    assert "High tide is at six in the morning." in text
    assert "The pilot boards at the outer buoy." in text
    assert "ATTACHED-LOG-NEVER-INDEXED" not in text
    (message,) = prepared.source.metadata["messages"]
    assert message["attachments"] == [
        {"filename": "log.txt", "contentType": "text/plain", "size": 26}
    ]
    assert {chunk.location.document_id for chunk in prepared.chunks} == {"<m5@example.org>"}


def empty_plain_alternative() -> bytes:
    return (
        b"From: Dan <dan@example.org>\r\nSubject: Tapir\r\n"
        b"Message-ID: <emptyalt@example.org>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/alternative; boundary="alt"\r\n\r\n'
        b"--alt\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n \r\n"
        b"--alt\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
        b"<p>Only the HTML alternative has text: tapir indigo.</p>\r\n"
        b"--alt--\r\n"
    )


def test_an_empty_plain_alternative_does_not_hide_the_html(count_tokens: TokenCounter) -> None:
    # A black-box test: the message alone was refused as empty, and in a thread it was
    # listed but had no passage, while every mail reader shows the HTML.
    alone: PreparedDocument = prepare(empty_plain_alternative(), count_tokens, "message/rfc822")
    assert [c.text for c in alone.chunks] == ["Only the HTML alternative has text: tapir indigo."]
    thread = docs.mbox(docs.message("First.\n"), empty_plain_alternative())
    prepared: PreparedDocument = prepare(thread, count_tokens, "application/mbox")
    by_id = {c.location.document_id: c.text for c in prepared.chunks}
    assert "tapir indigo" in by_id["<emptyalt@example.org>"]
    # A plain alternative with text is still the one read.
    plain: PreparedDocument = prepare(alternative_message(), count_tokens, "message/rfc822")
    assert [c.text for c in plain.chunks] == ["Plain: the east quay is closed on Sunday."]


def test_a_body_line_starting_with_from_does_not_split_an_mbox(
    count_tokens: TokenCounter,
) -> None:
    # A black-box test: "From here..." in a body split the message in two, lost the rest of
    # its body and invented an empty message.
    body = (
        "Third message body with a line\n"
        "From here it continues, no envelope.\n"
        "\n"
        "From 9:00 to 17:00 the office is open.\n"
        "Last line.\n"
    )
    data = docs.mbox(
        docs.message("First.\n", message_id="<a@x>"),
        docs.message(body, message_id="<b@x>"),
        docs.message("Fourth.\n", message_id="<c@x>"),
    )
    prepared: PreparedDocument = prepare(data, count_tokens, "application/mbox")
    assert prepared.source.metadata["messageCount"] == 3
    texts = {c.location.document_id: c.text for c in prepared.chunks}
    assert list(texts) == ["<a@x>", "<b@x>", "<c@x>"]
    assert texts["<b@x>"] == body.rstrip("\n")
    # Envelopes in other shapes writers use still split: an RFC 2822 date, CRLF line ends.
    crlf = (
        b"From alice@example.org Fri, 8 Jul 2011 12:08:34 +0000\r\n"
        + docs.message("One.\n", message_id="<d@x>")
        + b"\r\n\r\nFrom - Sat Jan 03 10:11:12 2015\r\n"
        + docs.message("Two.\n", message_id="<e@x>")
    )
    split: PreparedDocument = prepare(crlf, count_tokens, "application/mbox")
    assert [c.location.document_id for c in split.chunks] == ["<d@x>", "<e@x>"]


def forwarding_message(disposition: str) -> bytes:
    return (
        b"From: Eve <eve@example.org>\r\nSubject: Fwd: Gecko\r\n"
        b"Message-ID: <fwd@example.org>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/mixed; boundary="mix"\r\n\r\n'
        b"--mix\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nSee below.\r\n"
        b"--mix\r\nContent-Type: message/rfc822\r\n" + disposition.encode() + b"\r\n"
        b"From: Finn <finn@example.org>\r\nSubject: Gecko\r\nMessage-ID: <inner@example.org>\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n\r\n"
        b"The gecko eats pistachio.\r\n"
        b"--mix--\r\n"
    )


def test_a_message_forwarded_inline_is_body_text(count_tokens: TokenCounter) -> None:
    # A black-box test: an inline forwarded message was listed as an attachment, its text lost.
    inline: PreparedDocument = prepare(forwarding_message(""), count_tokens, "message/rfc822")
    assert [c.text for c in inline.chunks] == ["See below.\n\nThe gecko eats pistachio."]
    messages: Any = inline.source.metadata["messages"]
    assert messages[0]["attachments"] == []
    attached: PreparedDocument = prepare(
        forwarding_message('Content-Disposition: attachment; filename="gecko.eml"\r\n'),
        count_tokens,
        "message/rfc822",
    )
    assert [c.text for c in attached.chunks] == ["See below."]
    listed: Any = attached.source.metadata["messages"]
    assert listed[0]["attachments"] == [
        {"filename": "gecko.eml", "contentType": "message/rfc822", "size": None}
    ]


def test_envelopes_are_found_in_time_linear_in_the_line() -> None:
    # A review: the envelope pattern backtracked (an 8 KB `From ` line of times and years
    # without a newline took 2.9 s, 16 KB 34 s); a worker would burn the ingest deadline.
    line = b"From a@x " + b"10:00 2024 " * 20_000  # 220 KB, no final newline
    data = b"From a@x Mon Jan  1 10:00:00 2024\nSubject: s\n\nBody.\n\n" + line
    done = threading.Event()
    found: list[list[tuple[int, int]]] = []

    def split() -> None:
        found.append(list(_envelopes(data)))
        done.set()

    threading.Thread(target=split, daemon=True).start()
    assert done.wait(timeout=30), "the envelope search did not finish"
    assert len(found[0]) == 1  # the long line has no newline: not an envelope line


@pytest.mark.parametrize(
    "line",
    [
        b"From 09:00 to 17:00 in 2024 the reading room is open.",
        b"From server at 10:15 on 3 March 2024 we saw errors.",
    ],
)
def test_a_dated_sentence_after_a_blank_line_stays_in_its_message(
    count_tokens: TokenCounter, line: bytes
) -> None:
    # A black-box test: the sentence split the message, and the line after it was read as the
    # header of a phantom message: both lost.
    body = (
        b"Opening hours:\n\n" + line + b"\nNote: bring your badge.\n\nThe exhibit closes early.\n"
    )
    data = docs.mbox(docs.message(body), docs.message("Second.\n", message_id="<m2@example.org>"))
    prepared: PreparedDocument = prepare(data, count_tokens, "application/mbox")
    assert prepared.source.metadata["messageCount"] == 2
    text = "\n".join(c.text for c in prepared.chunks)
    for words in (line.decode(), "Note: bring your badge.", "The exhibit closes early."):
        assert words in text
    # A dated envelope that is not ctime's still splits when a header block follows it.
    dated = b"From b@x Tue, 2 Jan 2024 11:30:00 +0000\nMessage-ID: <b@x>\n\nTwo.\n"
    split: PreparedDocument = prepare(data + dated, count_tokens, "application/mbox")
    assert split.source.metadata["messageCount"] == 3
    assert split.chunks[-1].location.document_id == "<b@x>"


def test_an_mbox_without_blank_lines_splits_on_ctime_envelopes(
    count_tokens: TokenCounter,
) -> None:
    data = (
        b"From a@x Mon Jan  1 10:00:00 2024\nMessage-ID: <a@x>\n\nOne.\n"
        b"From b@x Tue Jan  2 11:30:00 2024\nMessage-ID: <b@x>\n\nTwo.\n"
    )
    prepared: PreparedDocument = prepare(data, count_tokens, "application/mbox")
    assert [(c.location.document_id, c.text) for c in prepared.chunks] == [
        ("<a@x>", "One."),
        ("<b@x>", "Two."),
    ]


def test_a_multipart_message_without_a_boundary_is_malformed_not_empty(
    count_tokens: TokenCounter,
) -> None:
    raw = docs.message(
        "--x\nContent-Type: text/plain\n\nThe text is plainly here.\n--x--\n",
        content_type="multipart/mixed",
    )
    with pytest.raises(RetrievalError) as info:
        prepare(raw, count_tokens, "message/rfc822")
    assert (info.value.code, info.value.reason) == (ErrorCode.INVALID_DOCUMENT, "email-malformed")
    assert "no boundary" in info.value.detail


BASE64 = ["Content-Transfer-Encoding: base64"]


@pytest.mark.parametrize(
    "body",
    [
        # Plain text labelled base64: its letters decode, around the spaces, to bytes nobody
        # wrote (its 24 letters make whole groups of four).
        b"The valve is closed weekly ok\n",
        b"The valve, it is closed weekly!\n",
        # Two encodings run together: Python's parser stopped at the first `=`.
        base64.b64encode(b"First half.") + base64.b64encode(b"Second half, never read.") + b"\n",
    ],
)
def test_a_text_part_marked_base64_that_is_not_is_refused_naming_its_message(
    count_tokens: TokenCounter, body: bytes
) -> None:
    # Probe D (session 35): such a body was decoded leniently and indexed as garbage.
    good = docs.message("The gauge reads two bar.\n", message_id="<good@x>")
    bad = docs.message(body, message_id="<bad@x>", extra_headers=BASE64)
    with pytest.raises(RetrievalError) as info:
        prepare(docs.mbox(good, bad), count_tokens, "application/mbox")
    assert (info.value.code, info.value.reason) == (ErrorCode.INVALID_DOCUMENT, "email-malformed")
    assert "<bad@x>" in info.value.detail and "base64" in info.value.detail


def test_a_base64_body_without_padding_or_cut_short_still_reads(
    count_tokens: TokenCounter,
) -> None:
    text = "The gauge reads two bar after the valve is closed, and the log says so: Café!!"
    encoded = base64.encodebytes(text.encode())  # lines of 76, ending `=`
    whole = base64.encodebytes(text.encode()[:-1])  # a multiple of three bytes: no padding
    assert encoded.rstrip().endswith(b"=") and len(whole.replace(b"\n", b"")) % 4 == 0
    # Without its padding; with spaces after its lines and one character cut short after them.
    cases = [(encoded.rstrip(b"=\n"), text), (whole.replace(b"\n", b"  \n") + b"Q", text[:-1])]
    for body, expected in cases:
        raw = docs.message(body + b"\n", extra_headers=BASE64)
        prepared: PreparedDocument = prepare(raw, count_tokens, "message/rfc822")
        assert prepared.chunks[0].text.strip() == expected
    # An attachment's transfer encoding is never read for text: listed, whatever its bytes.
    assert prepare(attachment_message(), count_tokens, "message/rfc822").chunks

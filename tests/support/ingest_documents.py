"""Builders of real documents for ingestion tests: well-formed ones and hostile ones.

Well-formed PDFs come from fpdf2 (one `cell` per line, so the text layer has exactly the
lines written). Hostile PDFs are assembled by hand, object by object, with a correct xref table
unless the point is a broken one. E-mails are raw RFC 5322 bytes.
"""

from __future__ import annotations

import io
import random
import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from fpdf import FPDF
from pypdf import PdfReader, PdfWriter

# --- PDFs with fpdf2 -----------------------------------------------------------------------


def text_pdf(pages: Sequence[Sequence[str]], *, title: str | None = None) -> bytes:
    """A PDF whose page i has exactly the given lines (ASCII, one line per cell)."""
    pdf = FPDF(format="A4")
    pdf.set_creation_date(datetime(2024, 1, 1, tzinfo=UTC))
    if title is not None:
        pdf.set_title(title)
    pdf.set_auto_page_break(auto=False)
    pdf.set_font("Helvetica", size=10)
    for lines in pages:
        pdf.add_page()
        for line in lines:
            pdf.cell(0, 5, line, new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())


def drawing_only_pdf() -> bytes:
    """Two pages with shapes and no text at all (what a scan without OCR looks like)."""
    pdf = FPDF()
    pdf.set_creation_date(datetime(2024, 1, 1, tzinfo=UTC))
    for _ in range(2):
        pdf.add_page()
        pdf.rect(20, 20, 80, 40, style="F")
    return bytes(pdf.output())


def encrypted_pdf(source: bytes, *, user_password: str, algorithm: str = "AES-256") -> bytes:
    """`source` encrypted by pypdf (an empty user password only restricts permissions)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(source)))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


# --- hand-assembled PDFs -------------------------------------------------------------------

_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
_CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
_HELLO = b"BT /F1 12 Tf 72 700 Td (Hello from a hand-made page) Tj ET"


def assemble_pdf(objects: Mapping[int, bytes], *, trailer_extra: bytes = b"") -> bytes:
    """A PDF file of `objects` (object 1 is the root) with a correct classic xref table."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets: dict[int, int] = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n%s\nendobj\n" % (number, objects[number])
    xref_at = len(out)
    size = max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for number in range(1, size):
        if number in offsets:
            out += b"%010d 00000 n \n" % offsets[number]
        else:
            out += b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (
        size,
        trailer_extra,
        xref_at,
    )
    return bytes(out)


def _stream(data: bytes, extra: bytes = b"") -> bytes:
    return b"<< /Length %d%s >>\nstream\n%s\nendstream" % (len(data), extra, data)


def _page(contents: int, parent: int = 2) -> bytes:
    return (
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>" % (parent, contents)
    )


def one_page_pdf() -> bytes:
    """A minimal valid hand-made PDF with one line of text."""
    return assemble_pdf(_one_page_objects())


def _one_page_objects() -> dict[int, bytes]:
    return {
        1: _CATALOG,
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: _page(4),
        4: _stream(_HELLO),
        5: _FONT,
    }


def missing_font_pdf(*, readable_page: bool = True, page_number: bool = False) -> bytes:
    """A PDF whose (last) page draws its text with a font its resources do not hold, which
    pypdf extracts as U+FFFD; with `readable_page`, a readable page comes before it; with
    `page_number`, that page's number is drawn in a font it holds."""
    content = b"BT /F9 12 Tf 72 700 Td (Glyphs no font maps to text at all here) Tj ET"
    if page_number:
        content += b" BT /F1 10 Tf 300 30 Td (Page 2) Tj ET"
    return _after_a_readable_page(content, first=readable_page)


def damaged_page_pdf() -> bytes:
    """Two pages; the second's content stream does not parse (an array closed in a string)."""
    return _after_a_readable_page(
        b"BT /F1 12 Tf 50 750 Td (unbalanced [ ( paren) Tj ] TJ q q q Q garbage%%% ET"
    )


def undecodable_stream_pdf() -> bytes:
    """Two pages; the second's content stream is filtered ASCII85 but holds other bytes (a
    damaged stream, which pypdf fails to decode before any text is read)."""
    return _after_a_readable_page(b"\xff\xfe\x80 not ascii85 at all ~>", filters=b"/ASCII85Decode")


def _after_a_readable_page(content: bytes, *, first: bool = True, filters: bytes = b"") -> bytes:
    """A PDF of a page drawing `content`, after a readable page when `first`."""
    kids = b"[3 0 R 6 0 R]" if first else b"[6 0 R]"
    return assemble_pdf(
        {
            1: _CATALOG,
            2: b"<< /Type /Pages /Kids %s /Count %d >>" % (kids, 2 if first else 1),
            3: _page(4),
            4: _stream(_HELLO),
            5: _FONT,
            6: _page(7),
            7: _stream(content, b" /Filter " + filters if filters else b""),
        }
    )


def one_page_pdf_with_info(info: bytes) -> bytes:
    """`one_page_pdf` with a document information dictionary of these entries."""
    objects = {**_one_page_objects(), 6: b"<< " + info + b" >>"}
    return assemble_pdf(objects, trailer_extra=b" /Info 6 0 R")


def _zeros_deflate(total_mib: int) -> bytes:
    """A zlib stream that inflates to `total_mib` MiB of zero bytes, built without inflating.

    Deflate blocks after a full flush reference only the (all-zero) 32 KiB window, so one
    compressed MiB can be repeated; the Adler-32 of n zeros is ((n mod 65521) << 16) | 1.
    """
    compressor = zlib.compressobj(9)
    mib = bytes(1 << 20)
    head = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    middle = compressor.compress(mib) + compressor.flush(zlib.Z_FULL_FLUSH)
    n = total_mib << 20
    adler = ((n % 65521) << 16) | 1
    # 0x03 0x00: a final, empty, fixed-Huffman block.
    return head + middle * (total_mib - 1) + b"\x03\x00" + adler.to_bytes(4, "big")


def flate_bomb_pdf(total_gib: int = 4) -> bytes:
    """A few-KiB PDF whose page content inflates to `total_gib` GiB (Flate applied twice)."""
    inner = _zeros_deflate(total_gib * 1024)
    outer = zlib.compress(inner, 9)
    return assemble_pdf(
        {
            1: _CATALOG,
            2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            3: _page(4),
            4: _stream(outer, b" /Filter [/FlateDecode /FlateDecode]"),
            5: _FONT,
        }
    )


def circular_xref_pdf() -> bytes:
    """Two xref sections whose /Prev entries point at each other, and nothing else to read."""
    out = bytearray(b"%PDF-1.7\n")
    first = len(out)
    placeholder = b"PPPPPPPPPP"
    out += b"xref\n0 1\n0000000000 65535 f \ntrailer\n<< /Size 4 /Root 1 0 R /Prev %s >>\n" % (
        placeholder
    )
    second = len(out)
    out += b"xref\n0 1\n0000000000 65535 f \ntrailer\n<< /Size 4 /Root 1 0 R /Prev %010d >>\n" % (
        first
    )
    body = bytes(out).replace(placeholder, b"%010d" % second)
    return body + b"startxref\n%d\n%%%%EOF\n" % first


def self_referencing_xref_pdf() -> bytes:
    """A readable PDF whose only xref section names itself as /Prev (pypdf stops the loop)."""
    objects = {
        1: _CATALOG,
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: _page(4),
        4: _stream(_HELLO),
        5: _FONT,
    }
    plain = assemble_pdf(objects)
    xref_at = int(plain.rsplit(b"startxref\n", 1)[1].split(b"\n", 1)[0])
    return assemble_pdf(objects, trailer_extra=b" /Prev %d" % xref_at)


def cyclic_page_tree_pdf() -> bytes:
    """A page tree whose inner node lists the root as its own kid."""
    return assemble_pdf(
        {
            1: _CATALOG,
            2: b"<< /Type /Pages /Kids [3 0 R 6 0 R] /Count 2 >>",
            3: _page(4),
            4: _stream(_HELLO),
            5: _FONT,
            6: b"<< /Type /Pages /Parent 2 0 R /Kids [2 0 R] /Count 1 >>",
        }
    )


def deep_page_tree_pdf(depth: int) -> bytes:
    """One page under `depth` nested /Pages nodes (pypdf reads at most 100 levels)."""
    objects: dict[int, bytes] = {1: _CATALOG, 4: _stream(_HELLO), 5: _FONT}
    for level in range(depth):
        number = 2 if level == 0 else 10 + level
        kid = 10 + level + 1 if level + 1 < depth else 3
        objects[number] = b"<< /Type /Pages /Kids [%d 0 R] /Count 1 >>" % kid
    objects[3] = _page(4, parent=10 + depth - 1 if depth > 1 else 2)
    return assemble_pdf(objects)


def deep_array_pdf(depth: int) -> bytes:
    """A one-page PDF whose catalog also holds an array nested `depth` deep."""
    catalog = b"<< /Type /Catalog /Pages 2 0 R /X " + b"[" * depth + b"]" * depth + b" >>"
    return assemble_pdf(
        {
            1: catalog,
            2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            3: _page(4),
            4: _stream(_HELLO),
            5: _FONT,
        }
    )


def many_pages_pdf(pages: int, *, declared: int | None = None) -> bytes:
    """`pages` pages sharing one content stream; `/Count` says `declared` (default: truth)."""
    kids = b" ".join(b"%d 0 R" % (10 + i) for i in range(pages))
    objects: dict[int, bytes] = {
        1: _CATALOG,
        2: b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, declared or pages),
        4: _stream(_HELLO),
        5: _FONT,
    }
    for i in range(pages):
        objects[10 + i] = _page(4)
    return assemble_pdf(objects)


def flate_page_pdf(
    *, damaged: bool = False, truncated: bool = False, bad_checksum: bool = False, tail: bytes = b""
) -> bytes:
    """Two pages; the second's content stream is Flate-compressed, and with `damaged` its
    compressed bytes are scrambled (all but the zlib header and checksum): pypdf inflates
    no content from it, logs zlib's error and reads the page as empty. With `truncated` it
    is cut to half its bytes (pypdf inflates that half without a word), with `bad_checksum`
    its Adler-32 is wrong, and `tail` follows it inside the stream."""
    content = b"BT /F1 12 Tf 72 700 Td (Second page text behind a Flate filter) Tj ET"
    compressed = bytearray(zlib.compress(content, 9))
    if damaged:
        compressed[2:-4] = bytes(byte ^ 0xA5 for byte in compressed[2:-4])
    if bad_checksum:
        compressed[-4:] = bytes(byte ^ 0xFF for byte in compressed[-4:])
    if truncated:
        del compressed[len(compressed) // 2 :]
    return _after_a_readable_page(bytes(compressed) + tail, filters=b"/FlateDecode")


# --- e-mail --------------------------------------------------------------------------------


def message(
    body: str | bytes,
    *,
    message_id: str | None = "<m1@example.org>",
    subject: str = "Hello",
    content_type: str = "text/plain; charset=utf-8",
    extra_headers: Sequence[str] = (),
) -> bytes:
    """A single-part message with CRLF line ends."""
    headers = ["From: Alice <alice@example.org>", f"Subject: {subject}"]
    headers.append("Date: Mon, 01 Jan 2024 10:00:00 +0000")
    if message_id is not None:
        headers.append(f"Message-ID: {message_id}")
    headers += ["MIME-Version: 1.0", f"Content-Type: {content_type}", *extra_headers]
    raw_body = body.encode("utf-8") if isinstance(body, str) else body
    return ("\r\n".join(headers) + "\r\n\r\n").encode("ascii") + raw_body.replace(b"\n", b"\r\n")


def mbox(*messages: bytes) -> bytes:
    """An mbox of raw messages (CRLF turned into LF, as mbox files are usually written)."""
    out = b""
    for raw in messages:
        out += b"From sender@example.org Mon Jan  1 10:00:00 2024\n"
        out += raw.replace(b"\r\n", b"\n").rstrip(b"\n") + b"\n\n"
    return out


def many_parts_message(parts: int) -> bytes:
    """multipart/mixed with `parts` tiny text parts."""
    body = b"".join(
        b"--sep\r\nContent-Type: text/plain\r\n\r\npart %d\r\n" % i for i in range(parts)
    )
    return (
        b"From: a@example.org\r\nMessage-ID: <parts@example.org>\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=sep\r\n\r\n" + body + b"--sep--\r\n"
    )


def nested_message(depth: int) -> bytes:
    """multipart/mixed nested `depth` levels deep around one text part."""
    opening = b""
    closing = b""
    for level in range(depth):
        opening += b"--b%d\r\nContent-Type: multipart/mixed; boundary=b%d\r\n\r\n" % (
            level,
            level + 1,
        )
        closing = b"--b%d--\r\n" % (level + 1) + closing
    inner = b"--b%d\r\nContent-Type: text/plain\r\n\r\ndeep text\r\n--b%d--\r\n" % (depth, depth)
    return (
        b"From: a@example.org\r\nMessage-ID: <deep@example.org>\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=b0\r\n\r\n"
        + opening
        + inner
        + closing
        + b"--b0--\r\n"
    )


def long_header_message(header_bytes: int) -> bytes:
    """A message whose Subject line alone is `header_bytes` long."""
    return (
        b"From: a@example.org\r\nMessage-ID: <long@example.org>\r\nSubject: "
        + b"x" * header_bytes
        + b"\r\n\r\nbody text\r\n"
    )


def broken_charsets_message() -> bytes:
    """Parts labelled with an unknown charset, a non-text codec and a wrong one."""
    return (
        b"From: a@example.org\r\nMessage-ID: <charsets@example.org>\r\n"
        b"Subject: =?x-no-such-charset?B?SGVsbG8=?=\r\nMIME-Version: 1.0\r\n"
        b"Content-Type: multipart/mixed; boundary=cs\r\n\r\n"
        b"--cs\r\nContent-Type: text/plain; charset=x-no-such-charset\r\n\r\n"
        b"unknown charset caf\xe9 \xff\xfe end\r\n"
        b"--cs\r\nContent-Type: text/plain; charset=zlib\r\n\r\n"
        b"codec charset x\x9c\xcbH\xcd\xc9\xc9\x07\r\n"
        b"--cs\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
        b"mislabelled \xe9t\xe9 latin-1 bytes\r\n"
        b"--cs--\r\n"
    )


def operator_bomb_pdf(operators: int = 500_000) -> bytes:
    """A one-page PDF of a few KiB whose Flate content stream shows one character `operators`
    times (`(x) Tj`): tiny on the wire, seconds of pypdf text extraction per 100,000."""
    return operator_heavy_pdf(1, operators)


def operator_heavy_pdf(pages: int, operators_per_page: int) -> bytes:
    """`pages` pages of `operators_per_page` `(x) Tj` each, every page sharing one Flate
    stream: with counts under the host's operator limits (its scan counts each `(x) Tj` as
    two), a document that parses for a long time (~25 us per operator) yet is refused by no
    static bound."""
    content = b"BT /F1 12 Tf 72 700 Td " + b"(x) Tj " * operators_per_page + b"ET"
    kids = b" ".join(b"%d 0 R" % (6 + i) for i in range(pages))
    objects = {
        1: _CATALOG,
        2: b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        4: _stream(zlib.compress(content, 9), b" /Filter /FlateDecode"),
        5: _FONT,
    }
    for i in range(pages):
        objects[6 + i] = _page(4)
    return assemble_pdf(objects)


def random_body_message(body_bytes: int, seed: int = 7) -> bytes:
    """A message whose text/plain body is `body_bytes` of random printable ASCII (no breaks
    that a tokenizer could merge: about one token per two characters)."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&*+-=?@^_~"
    lines = []
    left = body_bytes
    while left > 0:
        width = min(76, left)
        lines.append("".join(rng.choice(alphabet) for _ in range(width)))
        left -= width + 1
    return message("\n".join(lines) + "\n")


def form_fanout_pdf(stamps: int) -> bytes:
    """One page that draws a tiny form XObject `stamps` times, then a form holding the
    sentence "Unique form sentence about gizmo77." (pypdf follows at most 5,000 form draws per
    page and returns the text before the rest)."""
    content = b"BT /F1 12 Tf 72 720 Td (Body text outside forms.) Tj ET\n"
    content += b"q /S Do Q\n" * stamps + b"q /T Do Q\n"
    stamp = b"0 0 m 1 1 l S"
    sentence = b"BT /F1 12 Tf 72 600 Td (Unique form sentence about gizmo77.) Tj ET"
    form = (
        b" /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >>"
    )
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> /XObject << /S 6 0 R /T 7 0 R >> >> >>"
    )
    return assemble_pdf(
        {
            1: _CATALOG,
            2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            3: page,
            4: _stream(zlib.compress(content, 9), b" /Filter /FlateDecode"),
            5: _FONT,
            6: _stream(stamp, form),
            7: _stream(sentence, form),
        }
    )

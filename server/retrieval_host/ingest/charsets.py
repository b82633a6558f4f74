"""Which codec reads text declared in a given charset, as mailers and pages mean it.

A label is read as the HTML standard's Encoding table reads it (the `webencodings` package
holds the table), in mail as in HTML: only its labels are honoured (Python knows codecs such
as `idna`, `unicode_escape` or EBCDIC that no page or mailer declares, and reading a page by
them garbled or crashed it), and each by the superset its senders write. "gb2312" mail holds
GBK (朱镕基), "shift_jis" and "iso-2022-jp" mail hold the Windows characters (①, ㈱, 髙),
"ks_c_5601-1987" is Outlook's name for CP949 (똠); Python's codecs of those names decode the
strict standard, and their `replace` handler drops a byte and reads the next as ASCII, so one
such character also destroyed its neighbour (髙橋 read as "\ufffd煖ｴ"). Labels the standard
maps to its "replacement" decoder (ISO-2022-KR, HZ), which a browser shows as nothing, are
read by Python's codec of that name where it has one: an archive's text is what it is for.
"""

from __future__ import annotations

import codecs
import re
from email.errors import HeaderParseError
from email.header import decode_header
from typing import TYPE_CHECKING, Final, cast

import webencodings

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12
    from typing_extensions import Buffer


def text_codec(label: str | None, *, mail: bool = False) -> codecs.CodecInfo | None:
    """The codec that reads text declared as `label`; None for no label or an unknown one.
    With `mail`, a label outside the standard's table that names one of Python's character
    sets is read by it (`utf-7`, `cp850`, `iso-2022-jp-2`, `utf-32`, `euc-cn`: mailers send
    them); codecs that are not character sets never are."""
    if not label:
        return None
    encoding = webencodings.lookup(label)
    if encoding is None:
        return _python_charset(label) if mail else None
    if encoding.name == "iso-2022-jp":
        return _ISO_2022_JP
    if encoding.name in ("gbk", "x-user-defined"):
        # the standard's GBK decoder is its gb18030 decoder; x-user-defined is what a page
        # declaring it is read as: windows-1252 (its own bytes are private-use characters)
        return codecs.lookup("gb18030" if encoding.name == "gbk" else "cp1252")
    if encoding.name == "replacement":
        return _python_charset(label) or cast(codecs.CodecInfo, encoding.codec_info)
    return cast(codecs.CodecInfo, encoding.codec_info)


# Python codecs that are no character set a mailer declares: transforms, IDNA, escapes, and
# EBCDIC (a page or message in it garbled whole).
_NOT_CHARSETS: Final = frozenset(
    {"idna", "punycode", "undefined", "unicode-escape", "raw-unicode-escape", "mbcs", "oem"}
    | {"cp037", "cp273", "cp424", "cp500", "cp875", "cp1026", "cp1140"}
)
_PYTHON_SUPERSETS: Final = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
}


def _python_charset(label: str) -> codecs.CodecInfo | None:
    try:
        info = codecs.lookup(label.strip().lower())
    except (LookupError, ValueError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_CHARSETS:
        return None
    superset = _PYTHON_SUPERSETS.get(info.name)
    return codecs.lookup(superset) if superset else info


# ISO-2022-JP as mailers write it: JIS X 0208 rows with the NEC and IBM rows in them (circled
# numbers, ㈱, 髙), which Python's `iso2022_jp` refuses. Its escape sequences switch among
# ASCII, JIS-Roman, half-width katakana and JIS X 0208; the text is re-spelled in Shift_JIS,
# whose Windows superset (cp932) holds the same rows, and read as that.
_ESCAPES: Final = {
    b"\x1b(B": "ascii",
    b"\x1b(J": "ascii",  # JIS-Roman: ASCII but for ¥ and ‾, read as ASCII (as cp932 does)
    b"\x1b(I": "katakana",
    b"\x1b$@": "jis0208",
    b"\x1b$B": "jis0208",
}


_ESCAPE: Final = re.compile(rb"\x1b[\x20-\x2f]{1,3}[\x30-\x7e]")


def _iso2022jp_decode(buffer: Buffer, errors: str = "strict", /) -> tuple[str, int]:
    data = bytes(buffer)
    try:  # the standard and its JIS X 0212 extension, as Python reads them
        return data.decode("iso2022_jp_2"), len(data)
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    pending = bytearray()  # Shift_JIS bytes not yet read

    def unreadable() -> None:
        out.append(pending.decode("cp932", errors=errors) + "\ufffd")
        pending.clear()

    mode = "ascii"
    i = 0
    while i < len(data):
        byte = data[i]
        if byte == 0x1B:
            # ESC, intermediate bytes (0x20-0x2F), a final byte: the whole escape is read
            escape = _ESCAPE.match(data, i)
            sequence = escape.group() if escape else data[i : i + 1]
            i += len(sequence)
            # another set (KS C 5601 is `ESC $ ( C`): its characters are unreadable here
            mode = _ESCAPES.get(sequence, "other-2" if b"$" in sequence else "other-1")
        elif byte in (0x0A, 0x0D) or mode == "ascii":
            if byte < 0x80:
                pending.append(byte)
            else:
                unreadable()
            i += 1
        elif mode == "katakana":
            if 0x21 <= byte <= 0x5F:
                pending.append(byte + 0x80)
            else:
                unreadable()
            i += 1
        elif mode == "jis0208":
            pair = _shift_jis(byte, data[i + 1] if i + 1 < len(data) else 0)
            if pair:
                pending.extend(pair)
            else:
                unreadable()
            i += 2
        else:  # a set this decoder does not hold: one unreadable character per character
            i += 2 if mode == "other-2" else 1
            unreadable()
    out.append(pending.decode("cp932", errors=errors))
    return "".join(out), len(data)


def _shift_jis(row: int, cell: int) -> bytes:
    """One JIS X 0208 character (row and cell bytes, 0x21-0x7E) in Shift_JIS; empty for
    bytes outside those rows."""
    if not (0x21 <= row <= 0x7E and 0x21 <= cell <= 0x7E):
        return b""
    lead = ((row + 1) >> 1) + (0x70 if row <= 0x5E else 0xB0)
    # odd rows take the trail bytes 0x40-0x9E (skipping 0x7F), even rows 0x9F-0xFC
    trail = cell + (0x1F if cell <= 0x5F else 0x20) if row % 2 else cell + 0x7E
    return bytes((lead, trail))


_STRICT_ISO_2022_JP: Final = codecs.lookup("iso2022_jp")
_ISO_2022_JP: Final = codecs.CodecInfo(
    name="iso-2022-jp (with the Windows rows)",
    encode=_STRICT_ISO_2022_JP.encode,
    decode=_iso2022jp_decode,
    streamreader=_STRICT_ISO_2022_JP.streamreader,
    streamwriter=_STRICT_ISO_2022_JP.streamwriter,
)


# How mail's text parts and encoded words are read: as `text_codec` reads their label, except
# that no label, an unknown one, and ASCII, ISO-8859-1 and UTF-8 (the labels mailers get
# wrong) read UTF-8 where the bytes are UTF-8 and each other byte as windows-1252.
_GUESSED: Final = frozenset({"cp1252", "utf-8"})  # the standard reads ASCII and Latin-1 as 1252
_ENCODED_WORD_CHARSET: Final = re.compile(r"=\?([^?*\s]+)(?:\*[^?\s]*)?\?[bBqQ]\?", re.ASCII)
_CP1252_FALLBACK: Final = "retrieval-host-cp1252"
_BOMS: Final = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def read_text(payload: bytes, charset: str | None) -> str:
    """A mail part's bytes as text in its declared charset, replacing what does not decode.
    A NUL (which no store keeps) separates what it stood between, as a space (dropped, it
    joined two words into one no search found: a black-box probe)."""
    info = text_codec(charset, mail=True)
    for bom, unicode in _BOMS:  # a byte-order mark wins over the label, as the standard reads
        if payload.startswith(bom) and not (info and info.name.startswith("utf-32")):
            return payload[len(bom) :].decode(unicode, "replace").replace("\x00", " ")
    if info is None or info.name in _GUESSED:
        return utf8_or_1252(payload).replace("\x00", " ")
    try:
        return info.decode(payload, "replace")[0].replace("\x00", " ")
    except Exception:  # a codec that fails anyway (some are stricter than "replace")
        return utf8_or_1252(payload).replace("\x00", " ")


def utf8_or_1252(data: bytes) -> str:
    """UTF-8 where the bytes are UTF-8, and each byte that is not read as windows-1252 (its
    `0x81`-style holes as U+FFFD): a Latin-1 message quoting one UTF-8 line keeps both its own
    accents and the quote (a review: every accent became U+FFFD)."""
    return data.decode("utf-8", errors=_CP1252_FALLBACK)


def _cp1252_bytes(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeDecodeError):
        raise error
    undecoded = error.object[error.start : error.end]
    return bytes(undecoded).decode("windows-1252", errors="replace"), error.end


codecs.register_error(_CP1252_FALLBACK, _cp1252_bytes)


def has_encoded_words(header: str) -> bool:
    """Whether a raw header holds RFC 2047 words (`=?charset?B?...?=`), which `encoded_words`
    reads as bodies are read: Python's email package reads their charsets strictly (a
    `=?gb2312?...?=` subject holding GBK lost characters, one labelled ISO-8859-1 holding
    windows-1252 quotes showed control characters)."""
    return _ENCODED_WORD_CHARSET.search(header) is not None


def encoded_words(header: str) -> str | None:
    """A raw header's RFC 2047 words, each read as `read_text` reads its charset; None if
    the header does not parse."""
    try:
        parts = decode_header(re.sub(r"\r?\n(?=[ \t])", "", header))
    except HeaderParseError:
        return None
    text = "".join(
        part if isinstance(part, str) else read_text(part, charset and charset.split("*")[0])
        for part, charset in parts
    )
    return " ".join(text.split())

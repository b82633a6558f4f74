"""Which Python codec reads text declared in a given charset, as mailers and pages mean it.

A label names what its sender's software wrote, and for the East Asian and Thai labels that is
a superset of the standard the label names: "gb2312" mail holds GBK (朱镕基), "shift_jis" and
"iso-2022-jp" mail holds the Windows characters (①, ㈱, 髙), "ks_c_5601-1987" is Outlook's
name for CP949 (똠). Python's codecs of those names decode the strict standard, and their
`replace` handler drops a byte and reads the next as ASCII, so one such character also destroys
its neighbour (髙橋 read as "�煖ｴ"). The HTML standard's Encoding table reads each label by
the superset, and names labels Python does not know ("iso-8859-8-i", "windows-874",
"windows-31j", "x-gbk", ...): both are followed here.
"""

from __future__ import annotations

import codecs
import re
from email.errors import HeaderParseError
from email.header import decode_header
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12
    from typing_extensions import Buffer

# Labels Python's codecs do not know (the HTML standard's names for them), by codec.
_UNKNOWN_TO_PYTHON: Final = {
    "gb18030": ("x-gbk", "csgb2312", "gb_2312", "gb_2312-80", "iso-ir-58", "csiso58gb231280"),
    "cp932": ("windows-31j", "x-sjis", "ms932"),
    "cp949": ("windows-949", "cseuckr", "csksc56011987", "iso-ir-149", "ks_c_5601-1989"),
    "cp874": ("windows-874", "dos-874"),
    "iso8859-6": ("iso-8859-6-i", "iso-8859-6-e", "csiso88596i", "csiso88596e"),
    "iso8859-8": ("iso-8859-8-i", "iso-8859-8-e", "csiso88598i", "csiso88598e", "logical"),
    "mac-roman": ("x-mac-roman", "csmacintosh", "mac"),
    "mac-cyrillic": ("x-mac-cyrillic", "x-mac-ukrainian"),
    "big5hkscs": ("cn-big5", "x-x-big5", "csbig5"),
    "euc_jp": ("x-euc-jp", "cseucpkdfmtjapanese"),
    **{f"cp{n}": (f"x-cp{n}",) for n in range(1250, 1258)},
}
_LABELS: Final = {label: codec for codec, labels in _UNKNOWN_TO_PYTHON.items() for label in labels}
_ISO_2022_JP: Final = "retrieval_host_iso2022_jp"
# Python codec names (`codecs.lookup(label).name`) and the superset read instead.
_SUPERSETS: Final = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso8859-11": "cp874",
    "iso8859-9": "cp1254",
    "iso2022_jp": _ISO_2022_JP,
}


def text_codec(label: str | None) -> str | None:
    """The codec that reads text declared as `label`; None for no label, an unknown one, or a
    codec that is not a text encoding (`base64`, `zlib`, ... are codecs too)."""
    if not label:
        return None
    key = label.strip().lower()
    if key in _LABELS:
        return _LABELS[key]
    try:
        info = codecs.lookup(key)
    except (LookupError, ValueError, TypeError):
        return None
    if not getattr(info, "_is_text_encoding", True):
        return None
    return _SUPERSETS.get(info.name, info.name)


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


def _iso2022jp_decode(buffer: Buffer, errors: str = "strict", /) -> tuple[str, int]:
    data = bytes(buffer)
    try:
        return data.decode("iso2022_jp"), len(data)
    except UnicodeDecodeError:
        pass
    out = bytearray()
    mode = "ascii"
    i = 0
    while i < len(data):
        byte = data[i]
        if byte == 0x1B:
            sequence = data[i : i + 3]
            if sequence in _ESCAPES:
                mode = _ESCAPES[sequence]
                i += 3
                continue
            out += b"?"  # an escape of another set (JIS X 0212, ...): one unreadable byte
            i += 1
        elif byte in (0x0A, 0x0D) or byte >= 0x80 or mode == "ascii":
            out.append(byte if byte < 0x80 else 0x3F)
            i += 1
        elif mode == "katakana":
            out.append(byte + 0x80 if 0x21 <= byte <= 0x5F else 0x3F)
            i += 1
        else:
            out += _shift_jis(byte, data[i + 1] if i + 1 < len(data) else 0)
            i += 2
    return out.decode("cp932", errors=errors), len(data)


def _shift_jis(row: int, cell: int) -> bytes:
    """One JIS X 0208 character (row and cell bytes, 0x21-0x7E) in Shift_JIS."""
    if not (0x21 <= row <= 0x7E and 0x21 <= cell <= 0x7E):
        return b"?"
    lead = ((row + 1) >> 1) + (0x70 if row <= 0x5E else 0xB0)
    # odd rows take the trail bytes 0x40-0x9E (skipping 0x7F), even rows 0x9F-0xFC
    trail = cell + (0x1F if cell <= 0x5F else 0x20) if row % 2 else cell + 0x7E
    return bytes((lead, trail))


def _search(name: str) -> codecs.CodecInfo | None:
    if name != _ISO_2022_JP:
        return None
    strict = codecs.lookup("iso2022_jp")
    return codecs.CodecInfo(
        name=_ISO_2022_JP,
        encode=strict.encode,
        decode=_iso2022jp_decode,
        incrementalencoder=strict.incrementalencoder,
        streamreader=strict.streamreader,
        streamwriter=strict.streamwriter,
    )


codecs.register(_search)


# How mail's text parts and encoded words are read: as `text_codec` reads their label, except
# that no label, an unknown one, and ASCII, ISO-8859-1 and UTF-8 (the labels mailers get
# wrong) read UTF-8 where the bytes are UTF-8 and each other byte as windows-1252.
_GUESSED_LABELS: Final = frozenset({"ascii", "iso8859-1", "latin-1", "utf-8"})
_ENCODED_WORD_CHARSET: Final = re.compile(r"=\?([^?*\s]+)(?:\*[^?\s]*)?\?[bBqQ]\?", re.ASCII)
_CP1252_FALLBACK: Final = "retrieval-host-cp1252"


def read_text(payload: bytes, charset: str | None) -> str:
    """A mail part's bytes as text in its declared charset, replacing what does not decode.
    A NUL (which no store keeps) separates what it stood between, as a space (dropped, it
    joined two words into one no search found: a black-box probe)."""
    name = text_codec(charset)
    if name is None or name in _GUESSED_LABELS:
        return utf8_or_1252(payload).replace("\x00", " ")
    try:
        return payload.decode(name, errors="replace").replace("\x00", " ")
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


def read_by_superset(header: str) -> bool:
    """Whether an encoded word of this raw header names a charset `text_codec` reads otherwise
    than Python's email package would (`=?gb2312?...?=` holding GBK, `=?x-gbk?...?=`)."""
    for label in _ENCODED_WORD_CHARSET.findall(header):
        try:
            python = codecs.lookup(label).name
        except (LookupError, ValueError):
            python = None
        if text_codec(label) not in (None, python):
            return True
    return False


def encoded_words(header: str) -> str | None:
    """A raw header's RFC 2047 words, each read as `read_text` reads its charset; None if
    the header does not parse."""
    try:
        parts = decode_header(re.sub(r"\r?\n(?=[ \t])", "", header))
    except HeaderParseError:
        return None
    text = "".join(
        part if isinstance(part, str) else read_text(part, charset) for part, charset in parts
    )
    return " ".join(text.split())

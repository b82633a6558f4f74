"""Page cursors: opaque, bound to their listing, and refused when edited."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.inspection import (
    MAX_FILTERED_SCAN,
    Cursor,
    SourceFilter,
    SourceSummary,
    decode_cursor,
    encode_cursor,
    source_page,
)

ids = st.text(min_size=1, max_size=256)


def signed_cursor(body: str) -> str:
    """A cursor of any JSON payload with a valid check, as any client can write one (the
    format is public): `body` is the JSON text, escapes as written."""
    payload = body.encode()
    check = hashlib.sha256(b"retrieval-host/cursor/v1\x00" + payload).digest()[:10]
    return (payload + check).hex()


def earlier_passages_cursor(corpus: str, after: int, source: str, revision: str) -> str:
    """A passage cursor as the host wrote it before cursors named the write (five fields)."""
    return signed_cursor(json.dumps(["passages", corpus, after, source, revision]))


@given(corpus=ids, after=ids)
def test_a_sources_cursor_decodes_to_its_position(corpus: str, after: str) -> None:
    token = encode_cursor(Cursor("sources", corpus, after))
    assert decode_cursor(token, "sources", corpus) == Cursor("sources", corpus, after)


@given(corpus=ids, source=ids, revision=ids, after=st.integers(0, 10**6))
def test_a_passages_cursor_names_its_source_and_revision(
    corpus: str, source: str, revision: str, after: int
) -> None:
    token = encode_cursor(Cursor("passages", corpus, after, source, revision))
    assert decode_cursor(token, "passages", corpus, source).revision == revision


@given(corpus=ids, source=ids, revision=ids, content=ids, after=st.integers(0, 10**6))
def test_a_passages_cursor_names_the_content_it_was_read_from(
    corpus: str, source: str, revision: str, content: str, after: int
) -> None:
    cursor = Cursor("passages", corpus, after, source, revision, content)
    assert decode_cursor(encode_cursor(cursor), "passages", corpus, source) == cursor


def test_cursors_of_the_earlier_format_still_decode_without_content() -> None:
    # Five fields, as the host wrote them before (a source cursor's meaning did not change).
    earlier = earlier_passages_cursor("docs", 3, "a", "r1")
    assert decode_cursor(earlier, "passages", "docs", "a") == Cursor(
        "passages", "docs", 3, "a", "r1"
    )
    listing = signed_cursor('["sources","docs","a",null,null]')
    assert decode_cursor(listing, "sources", "docs") == Cursor("sources", "docs", "a")


@pytest.mark.parametrize(
    ("body", "kind", "source"),
    [
        # Probe A, session 39: a forged source cursor with a lone surrogate was a 500 (the
        # store could not encode it); a JSON escape spells one in a valid UTF-8 payload.
        ('["sources","docs","\\ud800",null,null]', "sources", None),
        ('["sources","docs","a\\udfff",null,null,null]', "sources", None),
        ('["passages","docs",1,"a","\\ud800"]', "passages", "a"),
        ('["passages","docs",1,"a","r1","\\udc00"]', "passages", "a"),
        # What a listing never writes: a source cursor with a revision or a write.
        ('["sources","docs","a",null,"r1",null]', "sources", None),
        ('["sources","docs","a",null,null,"7"]', "sources", None),
        ('["passages","docs",1,"a","r1",7]', "passages", "a"),
    ],
)
def test_a_forged_cursor_with_what_no_listing_writes_is_refused(
    body: str, kind: str, source: str | None
) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        decode_cursor(signed_cursor(body), kind, "docs", source)  # type: ignore[arg-type]
    assert (excinfo.value.code, excinfo.value.reason) == (
        ErrorCode.INVALID_REQUEST,
        "invalid-cursor",
    )


def test_an_escaped_surrogate_pair_is_one_character_and_decodes() -> None:
    # JSON spells a character outside the BMP as a pair: that is scalar text, not a forgery.
    cursor = signed_cursor('["sources","docs","\\ud83d\\ude00",null,null]')
    assert decode_cursor(cursor, "sources", "docs").after == "\U0001f600"


@given(at=st.integers(0, 200), digit=st.sampled_from("0123456789abcdef"))
def test_an_edited_cursor_is_refused(at: int, digit: str) -> None:
    token = encode_cursor(Cursor("sources", "docs", "some-source"))
    at %= len(token)
    edited = token[:at] + digit + token[at + 1 :]
    if edited == token:
        return
    with pytest.raises(RetrievalError) as excinfo:
        decode_cursor(edited, "sources", "docs")
    assert (excinfo.value.code, excinfo.value.reason) == (
        ErrorCode.INVALID_REQUEST,
        "invalid-cursor",
    )


@pytest.mark.parametrize(
    ("kind", "corpus", "source"),
    [("passages", "docs", "a"), ("sources", "other", None), ("sources", "docs", "a")],
)
def test_a_cursor_of_another_listing_is_refused(kind: str, corpus: str, source: str | None) -> None:
    token = encode_cursor(Cursor("sources", "docs", "a"))
    with pytest.raises(RetrievalError):
        decode_cursor(token, kind, corpus, source)  # type: ignore[arg-type]


def _sources(n: int) -> list[SourceSummary]:
    return [
        SourceSummary(f"s{i:05d}", "r", "report" if i % 1000 == 999 else "memo", {}, 1, 1)
        for i in range(n)
    ]


def _fetcher(
    rows: list[SourceSummary], reads: list[int]
) -> Callable[[str | None, int], list[SourceSummary]]:
    def fetch(after: str | None, n: int) -> list[SourceSummary]:
        start = 0 if after is None else next(i for i, r in enumerate(rows) if r.id == after) + 1
        reads.append(n)
        return rows[start : start + n]

    return fetch


def test_a_filtered_page_fills_up_across_reads_and_resumes_after_its_last_kept_source() -> None:
    rows, reads = _sources(5_000), list[int]()
    page, resume = source_page(_fetcher(rows, reads), SourceFilter(title="REPORT"), None, 2)
    assert [r.id for r in page] == ["s00999", "s01999"]
    assert resume == "s01999" and len(reads) > 1
    page, resume = source_page(_fetcher(rows, reads), SourceFilter(title="report"), resume, 5)
    assert [r.id for r in page] == ["s02999", "s03999", "s04999"] and resume is None


def test_a_filtered_page_stops_after_reading_its_bound_and_says_where_to_go_on() -> None:
    rows, reads = _sources(MAX_FILTERED_SCAN + 2_000), list[int]()
    page, resume = source_page(_fetcher(rows, reads), SourceFilter(title="nothing"), None, 10)
    assert page == [] and resume is not None
    assert MAX_FILTERED_SCAN <= sum(reads) < MAX_FILTERED_SCAN + 512
    page, resume = source_page(_fetcher(rows, reads), SourceFilter(title="nothing"), resume, 10)
    assert page == [] and resume is None


def test_an_unfiltered_page_reads_once() -> None:
    rows, reads = _sources(3), list[int]()
    page, resume = source_page(_fetcher(rows, reads), SourceFilter(), None, 2)
    assert ([r.id for r in page], resume, reads) == (["s00000", "s00001"], "s00001", [3])


def test_a_filter_value_is_bounded() -> None:
    with pytest.raises(RetrievalError):
        SourceFilter(title="")
    with pytest.raises(RetrievalError):
        SourceFilter(media_type="x" * 257)


def test_the_title_filter_ignores_case_accents_and_unicode_spelling() -> None:
    # A black-box tester's title stored in NFD was not found by its NFC spelling, and `ß` by
    # `SS` only by accident of case folding.
    nfd = unicodedata.normalize("NFD", "Résumé der Hauptstraße")
    source = SourceSummary("s1", "r", nfd, {}, 1, 1)
    for wanted in ("résumé", "RESUME", "hauptstrasse", unicodedata.normalize("NFD", "RÉSUMÉ")):
        assert SourceFilter(title=wanted).keeps(source), wanted
    assert not SourceFilter(title="resumes").keeps(source)


def test_a_cursor_without_a_write_keeps_the_earlier_five_field_format() -> None:
    # Review V (session 39): a replica of the previous release, beside this one in a rolling
    # update, refused every cursor of six fields, source cursors included, which name no write.
    def fields(cursor: Cursor) -> list[object]:
        body = json.loads(bytes.fromhex(encode_cursor(cursor))[:-10])
        assert isinstance(body, list)
        return body

    assert fields(Cursor("sources", "docs", "a")) == ["sources", "docs", "a", None, None]
    passage = Cursor("passages", "docs", 3, "a", "r1", "17")
    assert fields(passage) == ["passages", "docs", 3, "a", "r1", "17"]
    assert decode_cursor(encode_cursor(passage), "passages", "docs", "a") == passage

"""Page cursors: opaque, bound to their listing, and refused when edited."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.inspection import Cursor, decode_cursor, encode_cursor

ids = st.text(min_size=1, max_size=256)


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

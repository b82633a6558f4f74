"""The host's search JSON is rendered without the response models: it must stay byte for byte
what the models produce (field order, camelCase names, nulls, floats, any Unicode)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_host.core import models as core
from retrieval_host.wire import retrieval as mapping
from retrieval_host_client import models as wire

_text = st.text(max_size=40)
_scopes = st.builds(core.Scope, _text, _text, _text)
_lines = st.none() | st.integers(min_value=1, max_value=2**31)
_hits = st.builds(
    core.Hit,
    chunk_id=_text,
    source=st.builds(core.SourceRef, _text, _text),
    # What the host stores (`core.validation`): a line range never ends before it starts.
    location=st.builds(core.Location, _lines, _lines, _lines, st.none() | _text).filter(
        lambda loc: loc.start_line is None or loc.end_line is None or loc.end_line >= loc.start_line
    ),
    text=st.text(max_size=200),
    document_sha256=_text,
    score=st.floats(min_value=-1.0, max_value=1.0),
    retrieved_at=_text,
    scope=_scopes,
)


@settings(max_examples=300, deadline=None)
@given(
    hits=st.lists(_hits, max_size=6),
    truncated=st.booleans(),
    retrieved_at=_text,
    scope=st.none() | _scopes,
    usage=st.builds(core.EmbeddingUsage, st.integers(0, 10**9), st.integers(0, 10**9)),
    shared_scope=st.booleans(),
)
def test_the_search_json_is_the_models_json(
    hits: list[core.Hit],
    truncated: bool,
    retrieved_at: str,
    scope: core.Scope | None,
    usage: core.EmbeddingUsage,
    shared_scope: bool,
) -> None:
    if shared_scope and scope is not None:  # the usual case: every hit under the read's scope
        hits = [
            core.Hit(
                h.chunk_id,
                h.source,
                h.location,
                h.text,
                h.document_sha256,
                h.score,
                h.retrieved_at,
                scope,
            )
            for h in hits
        ]
    result = core.SearchResult(hits, truncated, retrieved_at, scope, usage)
    expected = mapping.search_response(result).model_dump_json(by_alias=True).encode()
    assert mapping.search_response_json(result) == expected
    parsed = wire.SearchResponse.model_validate_json(mapping.search_response_json(result))
    assert parsed == mapping.search_response(result)

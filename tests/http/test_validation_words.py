"""A refused field is explained in words, never with the regular expression behind it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.validation import check_chunk_id
from retrieval_host.http.policy import validation_detail
from retrieval_host_client import models as wire


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"corpus":"library","query":"   "}', "body.query: must contain a character that is"),
        (b'{"corpus":"*","query":"x"}', "body.corpus: must be an identifier: 1-256 characters"),
        (b'{"corpus":" lib","query":"x"}', "body.corpus: must be an identifier"),
        (b'{"corpus":"lib","query":"x","limit":0}', "body.limit: Input should be greater than"),
    ],
)
def test_pattern_refusals_read_as_words(body: bytes, expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        wire.SearchRequest.model_validate_json(body, strict=True, by_alias=True, by_name=False)
    detail = validation_detail(caught.value, "body")
    assert detail.startswith(expected), detail
    assert "^" not in detail and "\\x" not in detail


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (
            '[{"id":"c1","text":"t","location":{"page":0}}]',
            "body.chunks.0.location.page: Input should be greater than or equal to 1",
        ),
        (
            '[{"id":"c1","text":"t","extra":1}]',
            "body.chunks.0.extra: Extra inputs are not permitted",
        ),
        ("[]", "body.chunks: Tuple should have at least 1 item after validation, not 0"),
    ],
)
def test_a_failing_chunk_is_not_also_called_missing(chunks: str, expected: str) -> None:
    # pydantic counts only the valid items against a minimum length, so one bad chunk also
    # read "Tuple should have at least 1 item after validation, not 0" (a black-box report).
    body = '{"corpus":"c","source":{"id":"a","revision":"1"},"chunks":' + chunks + "}"
    with pytest.raises(ValidationError) as caught:
        wire.IndexRequest.model_validate_json(body, strict=True, by_alias=True, by_name=False)
    detail = validation_detail(caught.value, "body")
    assert detail == expected


@pytest.mark.parametrize("chunk_id", ["kite]tail", "kite tail", "kite[x", "a\u00a0b", "*"])
def test_a_chunk_id_that_cannot_be_cited_is_refused(chunk_id: str) -> None:
    # A black-box test: these ids were indexed, and every answer citing them failed the host's
    # own citation check (a marker `[source:ID]` ends at whitespace or a bracket).
    chunk = wire.ChunkInput.model_validate({"id": "kite:tail/é.1", "text": "t"})
    assert chunk.id == "kite:tail/é.1"
    body = {"corpus": "c", "source": {"id": "a", "revision": "1"}}
    with pytest.raises(ValidationError) as caught:
        wire.IndexRequest.model_validate({**body, "chunks": [{"id": chunk_id, "text": "t"}]})
    detail = validation_detail(caught.value, "body")
    assert detail.startswith("body.chunks.0.id: must be a citation handle"), detail
    with pytest.raises(RetrievalError) as refused:
        check_chunk_id(chunk_id)
    assert refused.value.code is ErrorCode.INVALID_REQUEST

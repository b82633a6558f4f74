"""A refused field is explained in words, never with the regular expression behind it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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

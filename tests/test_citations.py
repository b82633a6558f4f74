from __future__ import annotations

import json

import httpx
import pytest

from retrieval_host.citations import InvalidCitationError as HostReexport
from retrieval_host.citations import validate_source_citations as host_validate
from retrieval_host_client import (
    InvalidCitationError,
    InvalidRequestError,
    RefusedCitationError,
    validate_source_citations,
)
from retrieval_host_client._responses import error_for

ALLOWED = ["c-1", "c-2", "doc#a1b2"]


def test_returns_unique_ids_in_order_of_first_appearance() -> None:
    text = "A [source:c-2] then B [source:c-1] and again [source:c-2]."
    assert validate_source_citations(text, ALLOWED) == ["c-2", "c-1"]


def test_an_unknown_id_is_refused_without_repair() -> None:
    with pytest.raises(InvalidCitationError) as info:
        validate_source_citations("see [source:c-3]", ALLOWED)
    assert (info.value.code, info.value.reason) == ("INVALID_CITATION", "unknown-source")
    with pytest.raises(InvalidCitationError):
        validate_source_citations("a typo [source:c1]", ALLOWED)


@pytest.mark.parametrize(
    "marker",
    [
        "[source:]",
        "[source: c-1]",
        "[source:c-1",
        "[Source:c-1]",
        "[SOURCE:c-1]",
        "[source:c 1]",
        "[ source:c-1]",  # spaced: a typo is refused, never skipped as plain text
        "[source :c-1]",
        "[\tSource\n:c-1]",
    ],
)
def test_malformed_markers_are_refused(marker: str) -> None:
    with pytest.raises(InvalidCitationError, match="malformed") as info:
        validate_source_citations(f"text {marker} more", ALLOWED)
    assert info.value.reason == "malformed-marker"


def test_a_required_citation_that_is_absent_is_refused() -> None:
    assert validate_source_citations("no markers here", ALLOWED) == []
    with pytest.raises(InvalidCitationError, match="cites no source") as info:
        validate_source_citations("no markers here", ALLOWED, require_citation=True)
    assert info.value.reason == "no-citation"
    assert validate_source_citations("x [source:c-1]", ALLOWED, require_citation=True) == ["c-1"]


def test_markers_inside_code_blocks_and_quotes_count() -> None:
    text = 'He said "[source:c-1]".\n```\nprint("[source:doc#a1b2]")\n```\n`[source:c-2]`'
    assert validate_source_citations(text, ALLOWED) == ["c-1", "doc#a1b2", "c-2"]
    with pytest.raises(InvalidCitationError):
        validate_source_citations("```\n[source:nope]\n```", ALLOWED)


def test_the_host_reexports_the_client_function() -> None:
    assert host_validate is validate_source_citations
    assert HostReexport is InvalidCitationError


def test_one_id_given_as_a_string_is_refused_not_read_as_its_characters() -> None:
    # A black-box tester passed one id as a string: `[source:p]` passed, the real id did not.
    with pytest.raises(TypeError, match="not one string"):
        validate_source_citations("see [source:c]", "c-1")


def test_the_hosts_refusal_of_citations_is_caught_as_an_invalid_citation() -> None:
    body = {
        "type": "urn:x",
        "title": "t",
        "status": 422,
        "code": "INVALID_CITATION",
        "detail": "d",
        "requestId": "r" * 32,
        "reason": "unknown-source",
    }
    headers = httpx.Headers({"content-type": "application/problem+json"})
    error = error_for(422, headers, json.dumps(body).encode())
    assert isinstance(error, RefusedCitationError)
    assert isinstance(error, InvalidCitationError) and isinstance(error, InvalidRequestError)
    assert (error.status, error.reason) == (422, "unknown-source")

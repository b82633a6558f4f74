from __future__ import annotations

import json
import math

import pytest

from retrieval_host.core.descriptor import (
    CorpusDescriptor,
    EmbeddingDescriptor,
    LexicalDescriptor,
    check_label,
    stored_lexical,
)
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host_client.run_models import RunRequest


def _embedding(**overrides: object) -> EmbeddingDescriptor:
    fields: dict[str, object] = {
        "provider_id": "research-embeddings",
        "vendor": "openai",
        "account_id": "research-account",
        "auth_mode": "api-key",
        "model": "text-embedding-3-small",
        "dimensions": 1536,
    }
    fields.update(overrides)
    return EmbeddingDescriptor(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        "sk-proj-abcdefghijklmnop1234",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        "xoxb-1234-5678-abcdefgh",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
        "glpat-xxxxxxxx1xxxxxxxxxxx",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        # Probe V: keys whose random body happens to hold no digit.
        "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZaBcDeFgHiJ",
        "glpat-xYzAbCdEfGhIjKlMnOpQ",
        "sk_live_AbCdEfGhIjKlMnOpQrStUvWx",
        "ghp_aBcDeFgHiJ-kLmNoPqRsTuVwXyZaBcDeFgHiJ",
        # Probe C (session 37): token shapes the prefixes above did not know.
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
        "hf_abcdefghijklmnopqrstuvwxyzabcdefgh",
        "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "r8_AbCdEfGhIjKlMnOpQrStUvWx0123456789",
        "ya29.a0AfH6SMBx1234567890abcdef",
        "Bearer abc",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
        "AKIAIOSFODNN7EXAMPLE",
        "alice@example.com",
        "x" * 64,
        "with space",
        "",
    ],
)
def test_secret_or_address_shaped_labels_are_refused(value: str) -> None:
    with pytest.raises(RetrievalError) as info:
        check_label("account id", value)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(RetrievalError):
        _embedding(account_id=value)


@pytest.mark.parametrize(
    "value",
    [
        "text-embedding-3-small",
        "org/team:embeddings.v2",
        "skunkworks-notes",
        "skyline-embeddings",
        "pkg-docs-internal",
        "ghost-team-01",
        "rkt-cluster-a1",
        "sk-learn-models",
        "AKIA-team",
        "acme-corp-production-embeddings-eu-west-1",
        "org-AbCdEf1234567890XyZ",
        "hf_tei_1",
        "hf-inference-embeddings-2024",
        "npm_registry_docs",
        "3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",  # 32 hex: also a Cloudflare account id
        "123e4567e89b12d3a456426614174000",
        "ya29-notes",
        "CustomerSupportKnowledgeBase2024",  # a corpus an earlier release stored
    ],
)
def test_plain_labels_are_accepted(value: str) -> None:
    # Words that begin as a vendor's key prefix does are labels (black-box probe A).
    assert check_label("corpus id", value) == value


def test_a_model_name_may_hold_an_at_sign_and_other_labels_may_not() -> None:
    # Probe B (session 35): Vertex AI names versions with `@`; README says the endpoint judges.
    for name in ("claude-3-5-sonnet-v2@20241022", "gemini-1.5-pro@002", "gemini@1.5-pro"):
        assert check_label("model", name, model=True) == name
        with pytest.raises(RetrievalError):
            check_label("provider", name)
    for address in ("someone@example.com", "a.b@mail.example.org", "x@y.io", "j@example.com."):
        with pytest.raises(RetrievalError, match="e-mail"):
            check_label("model", address, model=True)
    with pytest.raises(RetrievalError, match="@"):
        check_label("model", "@latest", model=True)
    wire = RunRequest.model_validate(
        {"provider": "p", "model": "claude-3-5-sonnet-v2@20241022", "input": "q"}
    )
    assert wire.model == "claude-3-5-sonnet-v2@20241022"


def test_mismatch_names_every_differing_field() -> None:
    stored = CorpusDescriptor("library", "passages-v1", _embedding(), {"maxTokens": 256})
    same = CorpusDescriptor("library", "passages-v1", _embedding(), {"maxTokens": 256})
    assert same.mismatch(stored.canonical_json()) == []
    other = CorpusDescriptor(
        "library",
        "passages-v2",
        _embedding(model="other-model", dimensions=768),
        {"maxTokens": 128},
    )
    assert other.mismatch(stored.canonical_json()) == [
        "chunking",
        "embedding.dimensions",
        "embedding.model",
        "index_version",
    ]


def _corpus(**lexical: object) -> CorpusDescriptor:
    return CorpusDescriptor(
        "docs",
        "passages-v1",
        _embedding(),
        {"chunker": "markdown"},
        LexicalDescriptor(**lexical),  # type: ignore[arg-type]
    )


def test_a_descriptor_stored_before_the_lexical_field_takes_the_first_analyzer() -> None:
    current = _corpus(analyzer="en-snowball-1")
    stored = json.loads(current.canonical_json())
    del stored["lexical"]  # what the release before the lexical index wrote
    old_json = json.dumps(stored)
    assert current.mismatch(old_json) == []
    assert stored_lexical(old_json) == LexicalDescriptor("en-snowball-1", 0.9, 0.4)
    assert _corpus(analyzer="en-snowball-1", k1=1.2).mismatch(old_json) == ["lexical.k1"]
    # A new corpus gets the newest analyzer; an old one is never silently re-analyzed.
    assert _corpus().mismatch(old_json) == ["lexical.analyzer"]


def test_a_stored_lexical_identity_is_read_back_whole() -> None:
    stored = _corpus(analyzer="en-snowball-1", k1=1.5, b=0.5).canonical_json()
    assert stored_lexical(stored) == LexicalDescriptor("en-snowball-1", 1.5, 0.5)


def test_an_analyzer_a_later_release_stored_is_said_to_be_so() -> None:
    # A black-box test: a corpus a newer replica created stopped an earlier one's start with
    # "unknown lexical analyzer", as if its own configuration had named one.
    stored = json.loads(_corpus().canonical_json())
    stored["lexical"]["analyzer"] = "en-snowball-99"
    with pytest.raises(RetrievalError) as refused:
        stored_lexical(json.dumps(stored))
    assert refused.value.code is ErrorCode.DESCRIPTOR_MISMATCH
    assert "'en-snowball-99' is not one this release knows (a later release" in str(refused.value)


def test_lexical_parameters_are_part_of_the_identity() -> None:
    stored = _corpus().canonical_json()
    assert json.loads(stored)["lexical"] == {"analyzer": "en-snowball-4", "k1": 0.9, "b": 0.4}
    assert _corpus(b=0.75).mismatch(stored) == ["lexical.b"]
    assert _corpus(k1=0.9, b=0.4).mismatch(stored) == []


@pytest.mark.parametrize(
    "lexical", [{"analyzer": "en-porter-9"}, {"k1": -1.0}, {"k1": math.nan}, {"b": 1.5}]
)
def test_invalid_lexical_parameters_are_refused(lexical: dict[str, object]) -> None:
    with pytest.raises(RetrievalError) as info:
        LexicalDescriptor(**lexical)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_REQUEST

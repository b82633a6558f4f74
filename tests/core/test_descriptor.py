from __future__ import annotations

import pytest

from retrieval_host.core.descriptor import CorpusDescriptor, EmbeddingDescriptor, check_label
from retrieval_host.core.errors import ErrorCode, RetrievalError


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


def test_plain_labels_are_accepted() -> None:
    assert check_label("model", "text-embedding-3-small") == "text-embedding-3-small"
    assert check_label("provider", "org/team:embeddings.v2") == "org/team:embeddings.v2"


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

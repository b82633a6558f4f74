"""The check for a token put in a query string by mistake: found among the query's words, at a
bounded cost. Probe S (session 38): looking up every distinct word of a 62 KiB query cost
19-26 ms of the host's CPU per unauthenticated request, 93-229 ms with 1-50 tokens."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest

from retrieval_host.http import auth
from retrieval_host.http.auth import MAX_QUERY_WORDS, TokenAuthenticator, token_sha256
from retrieval_host.settings import TokenSettings

TOKEN = "rh_" + "k" * 43
ALICE = TokenSettings(sha256=token_sha256(TOKEN), subject="alice")
OTHERS = [TokenSettings(sha256=token_sha256(f"rh_other_{i}"), subject=f"s{i}") for i in range(50)]


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many words the check hashed (one item per call)."""
    calls: list[int] = []

    def sha256(data: bytes) -> Any:
        calls.append(1)
        return hashlib.sha256(data)

    monkeypatch.setattr(auth, "hashlib", SimpleNamespace(sha256=sha256))
    return calls


def authenticator() -> TokenAuthenticator:
    return TokenAuthenticator([ALICE, *OTHERS])


def test_a_token_among_the_words_is_found() -> None:
    check = authenticator()
    assert check.token_in_query(f"q=see+{TOKEN}+there".encode())
    assert check.token_in_query(f"note=%22key:{TOKEN}%22".encode())
    assert not check.token_in_query(b"q=battery+lifetime&limit=5")


def test_the_words_looked_up_are_bounded_whatever_the_query(hashed: list[int]) -> None:
    check = authenticator()
    query = "&".join(f"w{i}=v{i}+x{i}" for i in range(5_000)).encode()

    assert not check.token_in_query(query)
    assert len(hashed) == MAX_QUERY_WORDS  # each distinct word once, then no more
    hashed.clear()
    # A credential's parameter name is still refused after the bound.
    assert check.token_in_query(query + b"&access_token=x")
    assert len(hashed) == MAX_QUERY_WORDS

"""The check for a token put in a query string by mistake: found among the query's words, at a
small cost whatever the query's shape, once per request.

Probe S (session 38): looking up every distinct word of a 62 KiB query cost 19-26 ms of the
host's CPU per unauthenticated request. Probe A (session 42): a loop per `&`-separated part
cost 102 ms for `?` and 60,000 `&`, twice on a route that needs a token; a token glued to `.`,
`/`, `~` or `+` was missed; and 1,000 short guesses per request were answered without a token.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval_host.http import auth
from retrieval_host.http.app import create_app
from retrieval_host.http.auth import (
    MAX_QUERY_WORDS,
    MIN_QUERY_TOKEN_CHARS,
    TokenAuthenticator,
    token_sha256,
)
from retrieval_host.settings import TokenSettings
from tests.support.host import CORPUS, World

TOKEN = "rh_" + "k" * 43
ALICE = TokenSettings(sha256=token_sha256(TOKEN), subject="alice")
OTHERS = [TokenSettings(sha256=token_sha256(f"rh_other_{i}"), subject=f"s{i}") for i in range(50)]


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """What the check hashed (one item per call)."""
    calls: list[bytes] = []

    def sha256(data: bytes) -> Any:
        calls.append(data)
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


@pytest.mark.parametrize(
    "template",
    [
        "x={token}.",
        "next=/cb/{token}",
        "next=" + quote("https://app.example/cb/{token}", safe="{}"),
        "x=~{token}",
        "x={token}%2B",
        "x={token}+",
        "x=({token})",
        "{token}.=1",
    ],
)
def test_a_token_glued_to_punctuation_is_found(template: str) -> None:
    assert authenticator().token_in_query(template.format(token=TOKEN).encode())


def test_a_token_with_base64_letters_is_found_however_its_plus_is_written() -> None:
    token = "Zm9v+YmFy/" + "q" * 30 + "=="  # standard base64, padded
    check = TokenAuthenticator([TokenSettings(sha256=token_sha256(token), subject="s")])
    assert check.token_in_query(f"x={quote(token, safe='')}".encode())  # as a form writes it
    assert check.token_in_query(f"x={token}".encode())  # `+` left raw
    assert check.token_in_query(f"x=Bearer+{quote(token, safe='')}&y=1".encode())
    assert not check.token_in_query(f"x={token.replace('+', '-')}".encode())


def test_the_words_looked_up_are_bounded_whatever_the_query(hashed: list[bytes]) -> None:
    check = authenticator()
    query = "&".join(f"w{i:015d}=v{i:015d}+x{i:015d}" for i in range(1_000)).encode()

    assert not check.token_in_query(query)
    assert len(hashed) == len(set(hashed)) == MAX_QUERY_WORDS  # each distinct word once
    hashed.clear()
    # A credential's parameter name is refused wherever it sits, before any word is hashed.
    assert check.token_in_query(query + b"&access_token=x")
    assert check.token_in_query(query + b"&+Access_Token+")
    assert hashed == []


def test_words_shorter_than_a_token_are_not_looked_up(hashed: list[bytes]) -> None:
    # Without a token, 1,000 guesses a request were answered 401 or 200 (probe A): only a
    # word as long as a token could be is looked up, and `token new` makes 46 characters.
    check = authenticator()
    guesses = [secrets.token_urlsafe(16)[: MIN_QUERY_TOKEN_CHARS - 1] for _ in range(1_000)]

    assert not check.token_in_query(("q=" + "%20".join(guesses)).encode())
    assert hashed == []
    assert check.token_in_query(f"q={'%20'.join(guesses)}%20{TOKEN}".encode())
    assert hashed == [TOKEN.encode()]


def _cpu_ms(check: TokenAuthenticator, query: bytes) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        check.token_in_query(query)
        best = min(best, time.thread_time() - start)
    return best * 1000


def test_the_check_costs_about_the_same_whatever_the_shape_of_the_query() -> None:
    # A 62 KiB query of one word against the worst shapes found: the request line may take
    # 64 KiB. Before, `&` x 60,000 cost 300 times the one word (102 ms of CPU); now a few.
    check = authenticator()
    size = 62 * 1024

    def fill(unit: bytes) -> bytes:
        return (unit * (size // len(unit) + 1))[:size]

    words = b"&".join(b"%016d" % i for i in range(size // 17))
    shapes = {
        "empty parts": fill(b"&"),
        "one-letter parts": fill(b"x&"),
        "empty pairs": fill(b"=&"),
        "pairs": fill(b"a=b&"),
        "escapes": fill(b"%41"),
        "escaped plus": fill(b"%2B"),
        "plus": fill(b"+"),
        "stray percent": fill(b"%"),
        "distinct long words": words,
        "words apart by plus": words.replace(b"&", b"+"),
        "short runs": fill(b"a" * (MIN_QUERY_TOKEN_CHARS - 1) + b"."),
    }
    one_word = _cpu_ms(check, b"q=" + b"a" * (size - 2))
    costs = {name: _cpu_ms(check, query) for name, query in shapes.items()}
    assert max(costs.values()) < 20 * max(one_word, 0.5), (one_word, costs)


def test_a_query_found_clean_is_checked_again_for_tokens_it_was_not_checked_for() -> None:
    query = f"q={TOKEN}".encode()
    others = TokenAuthenticator(OTHERS)
    with others.clean_query(query):
        assert authenticator().token_in_query(query)  # knows a token `others` did not
        assert not TokenAuthenticator(OTHERS[:3]).token_in_query(query)
        assert authenticator().token_in_query(bytes(query))  # another query string
    assert authenticator().token_in_query(query)


_PERCENT_ESCAPE = st.builds(
    lambda byte, upper: (b"%%%02X" if upper else b"%%%02x") % byte,
    st.integers(0, 255),
    st.booleans(),
)
_OTHER_BYTE = st.binary(min_size=1, max_size=1).filter(lambda byte: byte != b"%")


@given(st.lists(st.one_of(_OTHER_BYTE, _PERCENT_ESCAPE)))
def test_the_percent_decoding_is_urllibs(pieces: list[bytes]) -> None:
    raw = b"".join(pieces)
    assert auth._percent_decoded(raw) == unquote_to_bytes(raw)


@pytest.fixture
async def client(http_world: World) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(http_world.settings(), http_world.driver))
    async with httpx.AsyncClient(transport=transport, base_url="https://host.test") as client:
        yield client


@pytest.mark.anyio
async def test_a_request_has_its_query_looked_at_once(
    client: httpx.AsyncClient, http_world: World, hashed: list[bytes]
) -> None:
    # The hygiene middleware looks on every route; a route that needs a token looked again.
    headers = {"Authorization": f"Bearer {http_world.tokens['admin']}"}
    first = await client.get(f"/v1/corpora/{CORPUS}/sources?limit=1", headers=headers)
    cursor = first.json()["nextCursor"]
    hashed.clear()

    second = await client.get(
        f"/v1/corpora/{CORPUS}/sources", params={"limit": 1, "cursor": cursor}, headers=headers
    )

    assert [source["id"] for source in second.json()["sources"]] == ["secret"]
    assert any(data in cursor.encode() for data in hashed), hashed  # the cursor's words were
    assert max(Counter(hashed).values()) == 1, Counter(hashed)

"""Bearer tokens: SHA-256 hashes in the configuration, constant-time comparison, per-corpus grants.

The token decides who the caller is (`subject`) and which corpora it may use per operation;
the application's authorizer then decides which sources inside a corpus. An omitted grant
denies. A token in the query string is refused outright (it ends up in logs and histories):
wherever it sits, as a parameter's name or value, percent-decoded or not, alone or as a word
among others (`Bearer <token>`, `"<token>"`, `next=/cb/<token>`, `<token>.`), and so is any
parameter named like a credential. A word is a run of a token's letters of at least
`MIN_QUERY_TOKEN_CHARS`; the check costs at most a few milliseconds of CPU whatever the query.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain, islice
from typing import Final

from retrieval_host.core.errors import ErrorCode, RetrievalError, permission_denied

__all__ = ["Principal", "TokenAuthenticator", "permission_denied", "token_sha256"]
from retrieval_host.core.models import Operation
from retrieval_host.settings import TokenSettings

# Query parameter names under which clients commonly put credentials.
QUERY_CREDENTIAL_NAMES: Final = frozenset(
    {"access_token", "token", "api_key", "apikey", "api-key", "key", "auth", "authorization",
     "bearer", "bearer_token", "id_token", "refresh_token"}
)  # fmt: skip
WWW_AUTHENTICATE: Final = 'Bearer realm="retrieval-host"'
# The shortest word of a query string looked up as a token. The configuration holds only hashes,
# so the length of its tokens is unknown: 16 is below what token generators make (`token new`:
# 46 characters; a UUID: 36; 16 random bytes in hex: 32, in base64: 22). Without a floor, the
# check answered whether any of 1,000 short guesses was a token, without a token (probe A,
# session 42); a token must be high-entropy, and one shorter than this is not looked for.
MIN_QUERY_TOKEN_CHARS: Final = 16
# The distinct words of one query string looked up as tokens, in the order found: the check
# guards against a token put in a URL by mistake (it authenticates nothing), so a token hidden
# behind a thousand other long words passes; looking up every word cost CPU per unauthenticated
# request (probe S, session 38).
MAX_QUERY_WORDS: Final = 1_000

_TOKEN_LETTERS: Final = rb"A-Za-z0-9_\-"  # `token new` (base64url, `serving/tokens.py`)
_B64TOKEN_LETTERS: Final = rb"A-Za-z0-9_\-.~+/"  # RFC 6750 b64token, then `=` padding
# Whole runs only: the lookbehind makes a start inside a shorter run fail at once.
_TOKEN_WORD: Final = re.compile(
    rb"(?<![%s])[%s]{%d,}" % (_TOKEN_LETTERS, _TOKEN_LETTERS, MIN_QUERY_TOKEN_CHARS)
)
_B64TOKEN_WORD: Final = re.compile(
    rb"(?<![%s])[%s]{%d,}=*" % (_B64TOKEN_LETTERS, _B64TOKEN_LETTERS, MIN_QUERY_TOKEN_CHARS)
)
# Each credential name as it ends a parameter's name (`&name=` or `&name&`), in the text below.
_WHITESPACE: Final = b" \t\n\r\x0b\x0c"
_CREDENTIAL_PARAMETERS: Final = tuple(
    b"&" + name.encode("ascii") + end
    for name in sorted(QUERY_CREDENTIAL_NAMES)
    for end in (b"=", b"&")
)


@dataclass(frozen=True, slots=True)
class _CleanQuery:
    query_string: bytes
    digests: frozenset[bytes]


# The query string this request's `HygieneMiddleware` found clean, and the tokens it looked
# for: a route's `authenticate` then answers without a second look (probe A, session 42: the
# check ran twice on every route that needs a token). A context variable, not the ASGI scope,
# because `authenticate` is handed the query string, not the scope; each request is its own
# task and context, and the string is compared by identity.
_CLEAN_QUERY: Final[ContextVar[_CleanQuery | None]] = ContextVar(
    "retrieval_host_clean_query", default=None
)


def token_sha256(token: str) -> str:
    """The hex digest the configuration stores for a token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: its subject and what its token grants."""

    subject: str
    providers: frozenset[str]
    search: frozenset[str]
    index: frozenset[str]
    delete: frozenset[str]

    def may(self, operation: Operation, corpus: str) -> bool:
        grants = {"search": self.search, "index": self.index, "delete": self.delete}[operation]
        return corpus in grants

    def require(self, operation: Operation, corpus: str) -> None:
        if not self.may(operation, corpus):
            raise permission_denied()


class TokenAuthenticator:
    """Checks `Authorization: Bearer` against the configured hashes in constant time."""

    def __init__(self, tokens: Sequence[TokenSettings]) -> None:
        self._entries = [
            (
                bytes.fromhex(t.sha256),
                Principal(
                    subject=t.subject,
                    providers=frozenset(t.providers),
                    search=frozenset(t.retrieval.search),
                    index=frozenset(t.retrieval.index),
                    delete=frozenset(t.retrieval.delete),
                ),
            )
            for t in tokens
        ]
        # For the query-string check only: a set lookup tells no more than its answer does.
        self._digests = frozenset(stored for stored, _ in self._entries)

    def _match(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        # Every configured hash is compared, so timing does not reveal which one (or whether
        # an early one) matched.
        for stored, principal in self._entries:
            if hmac.compare_digest(digest, stored):
                found = principal
        return found

    def authenticate(self, authorization: str | None, query_string: bytes) -> Principal:
        """The principal of a request, or `UNAUTHENTICATED`."""
        if query_string and self.token_in_query(query_string):
            raise RetrievalError(
                ErrorCode.UNAUTHENTICATED,
                "Tokens in the query string are refused; send Authorization: Bearer.",
                reason="token-in-query",
            )
        if authorization is None or not authorization.strip():
            raise RetrievalError(ErrorCode.UNAUTHENTICATED, "A bearer token is required.")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise RetrievalError(ErrorCode.UNAUTHENTICATED, "Use the Authorization: Bearer scheme.")
        principal = self._match(token)
        if principal is None:
            raise RetrievalError(ErrorCode.UNAUTHENTICATED, "The bearer token is not valid.")
        return principal

    def token_in_query(self, query_string: bytes) -> bool:
        """Whether the query string carries a credential: a credential parameter name, or a
        configured token as a word in a name or value (among its first `MAX_QUERY_WORDS`
        distinct words of at least `MIN_QUERY_TOKEN_CHARS`)."""
        clean = _CLEAN_QUERY.get()
        if clean and clean.query_string is query_string and self._digests <= clean.digests:
            return False  # already looked for these tokens, and more, in this request
        named, words = _query_words(query_string)
        if named:
            return True
        for word in islice(words, MAX_QUERY_WORDS):
            if hashlib.sha256(word).digest() in self._digests:
                return True
        return False

    @contextmanager
    def clean_query(self, query_string: bytes) -> Iterator[None]:
        """Within this block (the rest of the request), `token_in_query` of this very query
        string, by an authenticator whose tokens are among these, answers at once. For the
        caller that has just found it clean."""
        reset = _CLEAN_QUERY.set(_CleanQuery(query_string, self._digests))
        try:
            yield
        finally:
            _CLEAN_QUERY.reset(reset)


def _query_words(query_string: bytes) -> tuple[bool, dict[bytes, None]]:
    """Whether a parameter is named like a credential, and the distinct words that could be a
    token, in the order looked up.

    A fixed number of passes in C over the whole query string, none per parameter: a loop per
    `&`-separated part cost 102 ms of CPU for `?` and 60,000 `&` (probe A, session 42). `+` is
    a space in a form but may be a letter of a token: both readings are searched. An escaped
    `&` (`%26`) does not separate parameters (it decodes to NUL here, no letter either)."""
    spaced = _percent_decoded(query_string.replace(b"+", b" ").replace(b"%26", b"%00"))
    # Names compared in any case, whitespace ignored (` Token =` too, and so `to ken`).
    names = b"".join((b"&", spaced.lower(), b"&")).translate(None, _WHITESPACE)
    if any(parameter in names for parameter in _CREDENTIAL_PARAMETERS):
        return True, {}
    found = [_TOKEN_WORD.findall(spaced), _B64TOKEN_WORD.findall(spaced)]
    if b"+" in query_string:
        found.append(_B64TOKEN_WORD.findall(_percent_decoded(query_string)))
    return False, dict.fromkeys(chain.from_iterable(found))


def _percent_decoded(raw: bytes) -> bytes:
    """`urllib.parse.unquote_to_bytes(raw)` in C, but for a `%` that starts no escape, which
    reads as `=` (both are no letter of a token; `%%` as one, a final `%` as none; before CR,
    as `a2b_qp`'s soft line break up to LF, which no HTTP request line holds).

    `unquote_to_bytes` loops in Python once per escape: 4 ms for the 21,000 of a 64 KiB query.
    Quoted-printable has the same escape with `=` for `%`, and `a2b_qp` copies the rest."""
    return binascii.a2b_qp(raw.replace(b"=", b"=3D").replace(b"%", b"="))

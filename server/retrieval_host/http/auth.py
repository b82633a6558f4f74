"""Bearer tokens: SHA-256 hashes in the configuration, constant-time comparison, per-corpus grants.

The token decides who the caller is (`subject`) and which corpora it may use per operation;
the application's authorizer then decides which sources inside a corpus. An omitted grant
denies. A token in the query string is refused outright (it ends up in logs and histories):
wherever it sits, as a parameter's name or value, percent-decoded, alone or as a word among
others (`Bearer <token>`, `<token> `, `"<token>"`), and so is any parameter named like a
credential.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

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
# RFC 6750 b64token: a token inside other text (quotes, `key:token`) is one of these runs.
_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# The distinct words of one query string looked up as tokens: the check guards against a token
# put in a URL by mistake (it authenticates nothing), and looking up every word of a 62 KiB
# query cost 19-26 ms of the host's CPU per unauthenticated request (probe S).
MAX_QUERY_WORDS: Final = 1_000


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
        configured token anywhere in a name or value (among its first `MAX_QUERY_WORDS`
        distinct words)."""
        seen: set[str] = set()
        for is_name, text in _query_texts(query_string):
            stripped = text.strip()
            if is_name and stripped.lower() in QUERY_CREDENTIAL_NAMES:
                return True
            if len(seen) >= MAX_QUERY_WORDS:
                continue  # the names are still checked
            for word in (stripped, *stripped.split(), *_B64TOKEN.findall(stripped)):
                if not word or word in seen:
                    continue
                if len(seen) >= MAX_QUERY_WORDS:
                    break
                seen.add(word)
                digest = hashlib.sha256(word.encode("utf-8", "surrogatepass")).digest()
                if digest in self._digests:
                    return True
        return False


def _query_texts(query_string: bytes) -> Iterator[tuple[bool, str]]:
    """Every parameter name and value, percent-decoded both with `+` as a space (forms) and
    without (a token may hold `+`); undecodable bytes kept as surrogate escapes."""
    for part in query_string.split(b"&"):
        for decoded in {unquote_to_bytes(part.replace(b"+", b" ")), unquote_to_bytes(part)}:
            name, _, value = decoded.partition(b"=")
            yield True, name.decode("utf-8", "surrogateescape")
            yield False, value.decode("utf-8", "surrogateescape")

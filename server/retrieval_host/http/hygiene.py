"""Rules every request and response keeps, whatever the route (pure ASGI, before routing):

- A token in the query string is refused on every route, the public ones included (401,
  reason `token-in-query`): a URL ends up in proxies' logs and browsers' histories, and the
  caller must learn that its token leaked there, not be served as if nothing happened. It is
  looked for once per request: the route's own `authenticate` takes this answer.
- A body in a content coding (`Content-Encoding` other than `identity`) is refused (415): the
  host decodes none, and reading gzip bytes as JSON or Markdown would be a guess.
- Two `Content-Type` headers are refused (400, reason `duplicate-header`): which one is meant?
- Every response says `Cache-Control: no-store` (unless the route set its own) and
  `X-Content-Type-Options: nosniff`: answers carry passage text and run results that no
  shared cache or browser should keep or reinterpret.
"""

from __future__ import annotations

from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason
from retrieval_host.http.auth import WWW_AUTHENTICATE, TokenAuthenticator
from retrieval_host.http.problems import send_problem
from retrieval_host.http.request_id import request_id_of
from retrieval_host.http.strict import InvalidRequest

_NO_STORE: Final = (b"cache-control", b"no-store")
_NOSNIFF: Final = (b"x-content-type-options", b"nosniff")


class HygieneMiddleware:
    """Pure ASGI enforcement of the rules above."""

    def __init__(self, app: ASGIApp, authenticator: TokenAuthenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            headers = [_NO_STORE, _NOSNIFF]
            if refusal.code is ErrorCode.UNAUTHENTICATED:
                # The challenge every other 401 sends (probe A: this one had no realm).
                headers.append((b"www-authenticate", WWW_AUTHENTICATE.encode("ascii")))
            await send_problem(send, refusal, request_id_of(scope), extra_headers=headers)
            return

        async def hardened_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                if b"cache-control" not in names:
                    headers.append(_NO_STORE)
                if b"x-content-type-options" not in names:
                    headers.append(_NOSNIFF)
                message = {**message, "headers": headers}
            await send(message)

        with self.authenticator.clean_query(scope.get("query_string", b"")):
            await self.app(scope, receive, hardened_send)

    def _refusal(self, scope: Scope) -> RetrievalError | None:
        query: bytes = scope.get("query_string", b"")
        if query and self.authenticator.token_in_query(query):
            return RetrievalError(
                ErrorCode.UNAUTHENTICATED,
                "Tokens in the query string are refused; send Authorization: Bearer.",
                reason="token-in-query",
            )
        content_types = 0
        for name, value in scope["headers"]:
            if name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                return RetrievalError(
                    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                    "Send the body without a content coding (no Content-Encoding).",
                    reason="unsupported-media-type",
                )
            if name == b"content-type":
                content_types += 1
        if content_types > 1:
            return InvalidRequest(
                "Send one Content-Type header.",
                status=400,
                reason=InvalidRequestReason.DUPLICATE_HEADER,
            )
        return None

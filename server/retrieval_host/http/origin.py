"""The Origin allow-list for browser callers.

Browsers send `Origin` on cross-origin requests; other clients (back ends, curl) do not. A
request whose `Origin` is not listed gets 403 before any route runs, so a page on another
site cannot make a logged-in browser (or one on the host's network) spend a token. Requests
without `Origin` are not from a browser page and pass. Listed origins get CORS headers
(preflight included) from Starlette's CORS middleware, which this one wraps. A listed origin's
preflight that asks for a method, a header or private-network access the host does not allow
gets 403 too, as a problem like every other refusal (Starlette answers it in plain text).

With the console enabled (`same_origin`), a request whose `Origin` is this host's own, the
scheme the host is reached by and its `Host` header exactly, passes too: it comes from a page
this host served. A page elsewhere cannot claim that origin for a request the browser sends to
this host; DNS rebinding, the way to try, meets the certificate (a name it was not issued for)
and `allowedHosts`. No CORS headers are added: a same-origin response needs none.

Origins are compared as browsers serialize them: case aside, and without the scheme's default
port (`https://app.example:443` listed is the `https://app.example` a browser sends). Starlette
compares exact strings, so it is given both the allow-list and the request's `Origin` in that
form, and echoes the serialized form in `Access-Control-Allow-Origin`.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.http.problems import send_problem
from retrieval_host.http.request_id import request_id_of


def origin_denied() -> RetrievalError:
    return RetrievalError(
        ErrorCode.PERMISSION_DENIED,
        "Requests from this origin are not allowed.",
        reason="origin-not-allowed",
    )


def preflight_refused(cors: CORSMiddleware, asked: Headers) -> RetrievalError | None:
    """Why `cors` would refuse this preflight of a listed origin, or None: the checks of
    Starlette's `preflight_response`, asked of its own settings so that the two cannot drift
    (Starlette answers a refusal itself, in plain text). The detail names what is allowed
    rather than echoing what was asked."""
    if asked.get("access-control-request-method") not in cors.allow_methods:
        allowed = ", ".join(cors.allow_methods)
        return _refused(
            f"Cross-origin requests may use only these methods: {allowed}.",
            "cors-method-not-allowed",
        )
    names = asked.get("access-control-request-headers")
    if names is not None and any(
        name.strip() not in cors.allow_headers for name in names.lower().split(",")
    ):
        allowed = ", ".join(cors.allow_headers)
        return _refused(
            f"Cross-origin requests may send only these headers: {allowed}.",
            "cors-header-not-allowed",
        )
    if "access-control-request-private-network" in asked and not cors.allow_private_network:
        return _refused(
            "Pages on a more public network may not call this host (Private Network Access).",
            "cors-private-network-not-allowed",
        )
    return None


def _refused(detail: str, reason: str) -> RetrievalError:
    return RetrievalError(ErrorCode.PERMISSION_DENIED, detail, reason=reason)


class OriginMiddleware:
    """Pure ASGI: refuse unlisted origins, add CORS headers for listed ones."""

    def __init__(
        self, app: ASGIApp, allowed_origins: Sequence[str], *, same_origin: bool = False
    ) -> None:
        self.allowed = frozenset(_serialized(o) for o in allowed_origins)
        self.same_origin = same_origin
        self.inner = app
        # `app`, as every middleware names the next (tests walk the chain by it).
        self.app = CORSMiddleware(
            app,
            allow_origins=sorted(self.allowed),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            # Retry-After: a page told 503 HOST_BUSY or 429/502 with a wait must be able to
            # read it (probe A, session 37: only X-Request-Id was readable).
            expose_headers=["X-Request-Id", "Retry-After"],
            max_age=600,
        )
        self.rejected = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origins = [v for k, v in scope["headers"] if k == b"origin"]
            if not origins:
                # Not from a browser page: no CORS headers to add, only the `Vary: Origin`
                # Starlette's middleware would add, without its per-request header objects.
                await self.inner(scope, receive, _vary_origin(send))
                return
            if len(origins) == 1 and self.same_origin and _own_origin(scope, origins[0]):
                await self.inner(scope, receive, send)
                return
            origin = _serialized(origins[0].decode("latin-1"))
            if len(origins) > 1 or origin not in self.allowed:
                self.rejected += 1
                await send_problem(send, origin_denied(), request_id_of(scope))
                return
            asked = Headers(scope=scope)
            if scope["method"] == "OPTIONS" and "access-control-request-method" in asked:
                refusal = preflight_refused(self.app, asked)
                if refusal is not None:
                    await send_problem(send, refusal, request_id_of(scope))
                    return
            # Starlette compares (and echoes) the exact string: give it the listed form.
            listed = origin.encode("latin-1")
            headers = [(k, listed if k == b"origin" else v) for k, v in scope["headers"]]
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


def _serialized(origin: str) -> str:
    """`origin` as a browser sends it: lower case, no trailing slash, no default port."""
    origin = origin.rstrip("/").lower()
    for scheme, port in (("https://", ":443"), ("http://", ":80")):
        if origin.startswith(scheme) and origin.endswith(port):
            return origin.removesuffix(port)
    return origin


def _vary_origin(send: Send) -> Send:
    async def varied(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            for i, (name, value) in enumerate(headers):
                if name.lower() == b"vary":
                    headers[i] = (name, value + b", Origin")
                    break
            else:
                headers.append((b"vary", b"Origin"))
            message = {**message, "headers": headers}
        await send(message)

    return varied


def _own_origin(scope: Scope, origin: bytes) -> bool:
    """Whether `origin` is the origin this request was sent to: its scheme and `Host`."""
    hosts: list[bytes] = [v for k, v in scope["headers"] if k == b"host"]
    if len(hosts) != 1 or not hosts[0]:
        return False
    scheme = str(scope.get("scheme", "https")).encode("ascii")
    return origin.lower() == scheme + b"://" + hosts[0].lower()

"""The operator console: three static files under `/console/`, on the API's own origin.

Served only when `console.enabled`. The files are read from the package once, when the app is
built; the router knows their names, so no request path reaches the filesystem. Every console
response carries the same headers, errors included (a 404 at any depth under `/console/`, a
405 for another method than GET or HEAD, and the answers middleware gives before any route
runs: an Origin refusal or a CORS preflight, a token in the query string, a body too large):
a Content-Security-Policy that allows scripts, styles and fetches from this origin only (no
inline script or style, no frames, no plugins, no form posts), `X-Frame-Options: DENY`,
`nosniff`, `no-referrer` and `no-store`. The routes set them on their own answers;
`ConsoleHeaders`, outside every other middleware but the path's own, sets them on whatever is
sent for a console path (the Host and Origin checks' refusals included).

The console holds the bearer token the user pastes in a JavaScript variable of the tab: never in
a URL, a cookie or web storage, so closing the tab forgets it. Its API calls are same-origin
requests; `OriginMiddleware` lets them through when the console is enabled (see there).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.http.problems import problem_response
from retrieval_host.http.request_id import request_id_of

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_SECURITY_HEADER_LINES: Final = tuple(
    (name.lower().encode("ascii"), value.encode("ascii"))
    for name, value in SECURITY_HEADERS.items()
)
_SECURITY_HEADER_NAMES: Final = frozenset(name for name, _ in _SECURITY_HEADER_LINES)
ALLOWED_METHODS: Final = ("GET", "HEAD")
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


class ConsoleRoutes:
    """`GET /console` and `/console/` (the page: its assets are named by absolute paths, so
    either spelling loads them, and the host never redirects) and its assets."""

    def __init__(self) -> None:
        package = resources.files("retrieval_host.console")
        self._files = {name: (package / name).read_bytes() for name in ASSETS}

    def routes(self) -> list[Route]:
        # ASGI endpoints, not request functions: Starlette limits a function to GET, and its
        # router's own 404 and 405 carry no console headers. These see every method and depth.
        return [
            Route("/console", _Endpoint(lambda request: self._answer(request, "index.html"))),
            Route("/console/", _Endpoint(lambda request: self._answer(request, "index.html"))),
            Route(
                "/console/{name:path}",
                _Endpoint(lambda request: self._answer(request, request.path_params["name"])),
            ),
        ]

    def _answer(self, request: Request, name: str) -> Response:
        if request.method not in ALLOWED_METHODS:
            detail = "Method not allowed on this route."
            error = RetrievalError(ErrorCode.INVALID_REQUEST, detail, reason="route")
            headers = {**SECURITY_HEADERS, "Allow": ", ".join(ALLOWED_METHODS)}
            return problem_response(
                error, request_id_of(request.scope), status=405, headers=headers
            )
        if name not in ASSETS:
            error = RetrievalError(ErrorCode.INVALID_REQUEST, "No such route.", reason="route")
            return problem_response(
                error, request_id_of(request.scope), status=404, headers=SECURITY_HEADERS
            )
        return self._file(name)

    def _file(self, name: str) -> Response:
        return Response(self._files[name], media_type=ASSETS[name], headers=SECURITY_HEADERS)


class _Endpoint:
    """An ASGI endpoint around a synchronous answer (nothing here waits)."""

    def __init__(self, answer: Callable[[Request], Response]) -> None:
        self._answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._answer(Request(scope, receive))(scope, receive, send)


def is_console_path(path: str) -> bool:
    """Whether `path` is the console's: `/console` or anything under `/console/`."""
    return path == "/console" or path.startswith("/console/")


class ConsoleHeaders:
    """The console's security headers on every answer to a console path, in place of any
    header of the same name the answer set (never twice): also on answers given before the
    console's routes run (a black-box test found an Origin refusal under `/console/` without
    them; a Host refusal and an `INTERNAL` are covered the same way)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console_path(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in _SECURITY_HEADER_NAMES
                ]
                message = {**message, "headers": [*kept, *_SECURITY_HEADER_LINES]}
            await send(message)

        await self.app(scope, receive, secured)

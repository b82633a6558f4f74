"""The operator console: three static files under `/console/`, on the API's own origin.

Served only when `console.enabled`. The files are read from the package once, when the app is
built; the router knows their names, so no request path reaches the filesystem. Every console
response, a 404 included, carries the same headers: a Content-Security-Policy that allows
scripts, styles and fetches from this origin only (no inline script or style, no frames, no
plugins, no form posts), `X-Frame-Options: DENY`, `nosniff`, `no-referrer` and `no-store`.

The console holds the bearer token the user pastes in a JavaScript variable of the tab: never in
a URL, a cookie or web storage, so closing the tab forgets it. Its API calls are same-origin
requests; `OriginMiddleware` lets them through when the console is enabled (see there).
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

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
        return [
            Route("/console", self.index, methods=["GET"]),
            Route("/console/", self.index, methods=["GET"]),
            Route("/console/{name}", self.asset, methods=["GET"]),
        ]

    async def index(self, request: Request) -> Response:
        return self._file("index.html")

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            error = RetrievalError(ErrorCode.INVALID_REQUEST, "No such route.", reason="route")
            return problem_response(
                error, request_id_of(request.scope), status=404, headers=SECURITY_HEADERS
            )
        return self._file(name)

    def _file(self, name: str) -> Response:
        return Response(self._files[name], media_type=ASSETS[name], headers=SECURITY_HEADERS)

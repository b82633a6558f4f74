"""Corpus ids may hold `/` (README, "Identifiers"); in a path such a corpus is one escaped
segment (`/v1/corpora/team%2Fa/sources`, as the client and the console write it). The server
unescapes `%2F` before routing, so that path was read as corpus `team` and found no route (a
black-box test). For paths under `/v1/corpora/`, this keeps the corpus segment as it was sent,
still escaped, in the path the routes match; the inspection routes unescape it once
(`corpus_param`). A corpus id holds no `%`, so nothing else changes: the rest of the path is
unescaped as the server does, and source and chunk ids keep their rules.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import unquote

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CorpusSegments", "corpus_param"]

_PREFIX: Final = b"/v1/corpora/"


class CorpusSegments:
    """ASGI middleware: the corpus segment of `/v1/corpora/...` paths stays escaped."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if isinstance(raw, bytes) and raw.startswith(_PREFIX):
            # The path alone (some servers' `raw_path` carries the query string too).
            segment, slash, rest = raw.partition(b"?")[0][len(_PREFIX) :].partition(b"/")
            if b"%" in segment:
                path = _PREFIX.decode() + segment.decode("latin-1") + slash.decode()
                scope = {**scope, "path": path + unquote(rest.decode("latin-1"))}
        await self.app(scope, receive, send)


def corpus_param(request: Request) -> str:
    """The route's corpus, unescaped (it arrives escaped when it holds `/`: see above)."""
    return unquote(str(request.path_params["corpus"]))

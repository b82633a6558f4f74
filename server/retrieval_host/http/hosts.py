"""The Host allow-list (`allowedHosts`): refuse requests addressed to a name the host is not.

Nothing the host answers is built from the Host header (there are no redirects, see
`app.py`), so the list is defence in depth: with it, a page that rebinds its own DNS name to
the host's address (DNS rebinding) or a proxy that forwards any name reaches a 400 before any
route runs. An empty list (the default) accepts every Host. The port is ignored and names
compare case-insensitively; a missing, repeated or unlisted Host is refused. `/healthz` and
`/readyz` are exempt: orchestrator probes address the pod by its IP and read nothing secret.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.http.problems import send_problem
from retrieval_host.http.request_id import request_id_of

_PROBES = frozenset({"/healthz", "/readyz"})


def host_not_allowed() -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST,
        "This host does not answer to that Host header.",
        reason="host-not-allowed",
    )


def host_name(value: str) -> str:
    """The name part of a Host header value, lower-cased: `[::1]:8443` → `[::1]`; "" for a
    value that is not one host and an optional port of digits (`a:80,evil.example`, `a:80x`,
    `a b`), which no list names: `127.0.0.1:80,evil.example` read as `127.0.0.1` (session 43)."""
    value = value.strip().lower()
    if not value or any(c in value for c in ", \t/\\@?#"):
        return ""
    if value.startswith("["):
        end = value.find("]")
        name, rest = (value[: end + 1], value[end + 1 :]) if end != -1 else (value, "")
        port = rest.removeprefix(":") if rest.startswith(":") else (None if rest else "")
    elif value.count(":") == 1:
        name, port = value.split(":")
    else:
        name, port = value, ""
    if port is None or (port and not (port.isascii() and port.isdigit())):
        return ""
    return name


class AllowedHostsMiddleware:
    """Pure ASGI: with a non-empty list, only requests whose one Host names a listed host pass."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(host_name(h) for h in allowed_hosts) - {""}
        self.rejected = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed and scope["type"] == "http" and scope["path"] not in _PROBES:
            hosts = [v for k, v in scope["headers"] if k == b"host"]
            if len(hosts) != 1 or host_name(hosts[0].decode("latin-1")) not in self.allowed:
                self.rejected += 1
                await send_problem(send, host_not_allowed(), request_id_of(scope), status=400)
                return
        await self.app(scope, receive, send)

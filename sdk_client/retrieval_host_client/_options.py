"""The client's options, checked when a client is made: token, base URL, TLS trust and
timeouts (with the longer read timeout a stream needs between the host's heartbeats)."""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from typing import Final, TypeAlias

import httpx

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_TIMEOUT",
    "HEARTBEAT_MARGIN_S",
    "MAX_TIMEOUT_S",
    "TOKEN_ENV",
    "TimeoutTypes",
    "check_base_url",
    "checked_timeout",
    "resolve_token",
    "ssl_verify",
    "stream_timeout",
]

TOKEN_ENV: Final = "RETRIEVAL_HOST_TOKEN"  # noqa: S105 - a variable name, not a secret
DEFAULT_TIMEOUT: Final = 30.0

TimeoutTypes: TypeAlias = float | httpx.Timeout | None

_BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def resolve_token(token: str | None, environ: Mapping[str, str]) -> str | None:
    """The token argument, else `RETRIEVAL_HOST_TOKEN`, checked (its value is never echoed)."""
    value = token if token is not None else environ.get(TOKEN_ENV)
    if value is None or value == "":
        return None
    if not _BEARER_TOKEN.fullmatch(value):
        where = "the token argument" if token is not None else TOKEN_ENV
        raise ValueError(
            f"{where} is not a bearer token: only ASCII letters, digits and -._~+/ (then any "
            "'=') may appear, so whitespace or a newline read from a file must be stripped first"
        )
    return value


def check_base_url(base_url: str | httpx.URL) -> httpx.URL:
    """An https URL; plain http only to a loopback address (a local TLS-terminating proxy)."""
    try:
        url = httpx.URL(str(base_url))
    except httpx.InvalidURL as exc:  # `https://[::1`: a ValueError like every other refusal
        raise ValueError(f"base_url is not a URL ({exc}): {str(base_url)!r}") from None
    if url.userinfo:
        raise ValueError("base_url must not carry credentials; pass token= instead")
    if url.scheme not in ("https", "http") or not url.host:
        raise ValueError(
            f"base_url must be an https:// URL with a host (plain http only to a loopback "
            f"address), got {str(base_url)!r}"
        )
    if url.port is not None and not 0 < url.port < 65536:
        raise ValueError(f"base_url's port must be 1-65535, got {url.port} in {str(base_url)!r}")
    if url.scheme == "https" or _is_loopback(url.host):
        return url
    raise ValueError(
        f"base_url must be https:// (plain http only to a loopback address), got {str(base_url)!r}"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ssl_verify(ca_bundle: str | os.PathLike[str] | ssl.SSLContext | None) -> ssl.SSLContext | bool:
    """What httpx verifies the server with: the system's default (True), or a context that
    trusts the given PEM bundle (certificate checks and hostname checks stay on)."""
    if ca_bundle is None:
        return True
    if isinstance(ca_bundle, ssl.SSLContext):
        return ca_bundle
    context = ssl.create_default_context(cafile=os.fspath(ca_bundle))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


# Longer than this, the standard library's clocks overflow (1e10 s): a year is "wait a lot".
MAX_TIMEOUT_S: Final = 365 * 24 * 3600.0
_TIMEOUT_RULE: Final = (
    "timeout must be a positive number of seconds up to a year, or None to wait forever"
)


def checked_timeout(timeout: TimeoutTypes) -> httpx.Timeout:
    """Checked here, not at the first call: httpx accepts -1, infinity or 1e10 and fails when
    it is used (sync and async differently), with errors that are not this package's."""
    if isinstance(timeout, httpx.Timeout):
        parts = timeout.as_dict().values()
        if not all(part is None or _seconds(part) for part in parts):
            raise ValueError(f"{_TIMEOUT_RULE}; every part of an httpx.Timeout too")
        return timeout
    if timeout is not None and not _seconds(timeout):
        raise ValueError(_TIMEOUT_RULE)
    return httpx.Timeout(timeout)


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value <= MAX_TIMEOUT_S
    )


DEFAULT_HEARTBEAT_S: Final = 15.0
"""The host's default `runs.heartbeatS`: assumed of a host whose interval the client was not
told (`discover()` not called, or a host from before `limits.heartbeatS`)."""

HEARTBEAT_MARGIN_S: Final = 5.0
"""Added to the interval for a ping sent late: a host busy on its event loop, the network."""


def stream_timeout(timeout: httpx.Timeout, heartbeat_s: float | None) -> httpx.Timeout:
    """The timeout of a streamed ingest or run: `timeout`, with its read part raised to the
    heartbeat interval plus `HEARTBEAT_MARGIN_S` when shorter (20 s for an interval not known).

    A stream is silent up to one interval between events, and a read that gives up then closes
    the stream, which the host takes for the caller leaving: it cancels the ingest or run. So
    `timeout` alone cannot be a stream's read timeout, nor can a fixed floor alone (a host may
    beat every hour). Connect, write and pool keep `timeout`'s; `None` (no limit) stays.
    """
    if timeout.read is None:
        return timeout
    interval = DEFAULT_HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    floor = min(interval + HEARTBEAT_MARGIN_S, MAX_TIMEOUT_S)
    if timeout.read >= floor:
        return timeout
    return httpx.Timeout(
        connect=timeout.connect, read=floor, write=timeout.write, pool=timeout.pool
    )

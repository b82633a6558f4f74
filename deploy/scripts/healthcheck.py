"""Container health check: GET /healthz over HTTPS, exit 0 when the host answers `ok`.

Standard library only (the image has no curl). Used by the Dockerfile's HEALTHCHECK as
`/opt/retrieval-host/bin/python -I /opt/retrieval-host/libexec/healthcheck.py`.

Environment (deliberately not `RETRIEVAL_HOST_*`: the host treats that prefix as its own
settings and refuses names it does not know):

- `HEALTHCHECK_URL`: default `https://127.0.0.1:8443/healthz`.
- `HEALTHCHECK_CA_FILE`: a CA bundle; when set, the certificate is verified against it.
- `HEALTHCHECK_SERVER_NAME`: the name the certificate is checked for (default: the URL's host),
  for a certificate issued to the service's DNS name while the check dials 127.0.0.1.

Without a CA file the certificate is not verified, which is allowed only when the URL names a
loopback address: the check then never leaves the container's own network namespace.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import ssl
import sys
from collections.abc import Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit

DEFAULT_URL: Final = "https://127.0.0.1:8443/healthz"
TIMEOUT_S: Final = 4.0


class CheckError(Exception):
    """The host is not healthy, or the check is misconfigured."""


def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name could resolve anywhere


def _context(environ: Mapping[str, str], host: str) -> ssl.SSLContext:
    ca_file = environ.get("HEALTHCHECK_CA_FILE")
    if ca_file:
        context = ssl.create_default_context(cafile=ca_file)
    elif _is_loopback_literal(host):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        raise CheckError(
            f"{host} is not a loopback address: set HEALTHCHECK_CA_FILE to verify its certificate"
        )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def check(environ: Mapping[str, str]) -> str:
    """Fetch the health URL; return the reported status or raise `CheckError`."""
    url = urlsplit(environ.get("HEALTHCHECK_URL") or DEFAULT_URL)
    if url.scheme != "https" or url.hostname is None:
        raise CheckError("HEALTHCHECK_URL must be an https:// URL")
    host = url.hostname
    port = url.port or 443
    context = _context(environ, host)
    server_name = environ.get("HEALTHCHECK_SERVER_NAME") or host
    try:
        with (
            socket.create_connection((host, port), timeout=TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname=server_name) as tls,
        ):
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            request = (
                f"GET {url.path or '/'} HTTP/1.1\r\nHost: {authority}\r\n"
                "Accept: application/json\r\nConnection: close\r\n\r\n"
            )
            tls.sendall(request.encode("ascii"))
            response = http.client.HTTPResponse(tls)
            response.begin()
            body = response.read(65536)
    except (OSError, http.client.HTTPException) as exc:
        raise CheckError(f"{url.geturl()}: {exc}") from exc
    if response.status != 200:
        raise CheckError(f"{url.geturl()}: HTTP {response.status}")
    try:
        status = json.loads(body)["status"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckError(f"{url.geturl()}: not a health response") from exc
    if status != "ok":
        raise CheckError(f"{url.geturl()}: status {status!r}")
    return str(status)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Exit 0 when healthy, 1 otherwise (with the reason on stderr)."""
    del argv  # no arguments: configured by the environment only
    try:
        status = check(os.environ if environ is None else environ)
    except CheckError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print(status)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

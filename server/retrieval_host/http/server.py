"""Serving the host with uvicorn: TLS policy, header deadline protocol, loop and logging."""

from __future__ import annotations

from collections.abc import Mapping

import uvicorn

from retrieval_host.http.server_protocol import HeaderDeadlineProtocol
from retrieval_host.settings import HostSettings
from retrieval_host.tls import server_context


class PlainHttpRefused(Exception):
    """The configuration would serve plain HTTP where that is not allowed."""


def uvicorn_config(
    settings: HostSettings,
    app: object,
    environ: Mapping[str, str],
    *,
    log_config: dict[str, object] | None = None,
) -> uvicorn.Config:
    """A uvicorn configuration that enforces the host's transport policy.

    TLS (1.2 minimum, see `tls.server_context`) unless the settings say the host runs behind a
    TLS-terminating proxy on loopback (already validated in `HostSettings`; checked again here
    so no caller can bypass it).
    """
    protocol = HeaderDeadlineProtocol.with_timeouts(
        settings.limits.header_timeout_s, settings.limits.body_timeout_s
    )
    config_kwargs: dict[str, object] = {}
    if settings.tls is not None:
        password = settings.tls_key_password(environ)
        context = server_context(
            settings.tls.cert_file,
            settings.tls.key_file,
            password.get_secret_value() if password is not None else None,
        )
        config_kwargs["ssl_context_factory"] = lambda _config, _default: context
    elif not settings.behind_proxy:
        raise PlainHttpRefused("TLS is required unless behindProxy is set on a loopback host")
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.listen.host,
        port=settings.listen.port,
        http=protocol,
        loop="uvloop",
        ws="none",  # no WebSocket routes: do not even load a WebSocket implementation
        lifespan="on",
        # Forwarded headers are trusted only from a proxy we are told about, on loopback.
        proxy_headers=settings.behind_proxy,
        forwarded_allow_ips="127.0.0.1,::1" if settings.behind_proxy else "",
        server_header=False,
        access_log=False,
        log_config=log_config,
        log_level=settings.log_level,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=10,
        **config_kwargs,  # type: ignore[arg-type]
    )


def serve(
    settings: HostSettings,
    app: object,
    environ: Mapping[str, str],
    *,
    log_config: dict[str, object] | None = None,
) -> None:
    """Serve in the foreground until SIGINT/SIGTERM."""
    uvicorn.Server(uvicorn_config(settings, app, environ, log_config=log_config)).run()

"""TLS policy of the host: 1.2 minimum, no plain HTTP unless behind a loopback proxy."""

from __future__ import annotations

import socket
import ssl
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from retrieval_host.settings import HostSettings, SettingsError, load_settings
from tests.support.host import RunningHost, TlsFiles


def _legacy_client(tls: TlsFiles) -> ssl.SSLContext:
    """A client that offers only TLS 1.0/1.1 (security level 0, so OpenSSL really sends it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    tls.ca.configure_trust(context)
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    return context


@contextmanager
def _legacy_server(tls: TlsFiles) -> Iterator[int]:
    """A bare TLS server that accepts TLS 1.1: the control that the client can speak it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
    listener = socket.create_server(("127.0.0.1", 0))
    versions: list[str | None] = []

    def accept_one() -> None:
        conn, _ = listener.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as wrapped:
                versions.append(wrapped.version())
        except ssl.SSLError:
            versions.append(None)

    thread = threading.Thread(target=accept_one)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        thread.join(timeout=10)
        listener.close()


def _handshake(port: int, context: ssl.SSLContext) -> str | None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped,
    ):
        return wrapped.version()


def test_a_tls_1_1_handshake_is_refused(running_host: RunningHost) -> None:
    legacy = _legacy_client(running_host.tls)
    with _legacy_server(running_host.tls) as control_port:
        assert _handshake(control_port, legacy) == "TLSv1.1"  # the client really offers 1.1
    # The same client fails against the host: the host ends the handshake (uvloop closes the
    # connection rather than sending a protocol-version alert).
    with pytest.raises(ssl.SSLError):
        _handshake(running_host.port, legacy)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_1_2_and_1_3_are_accepted(running_host: RunningHost, version: ssl.TLSVersion) -> None:
    context = running_host.tls.client_context()
    context.minimum_version = version
    context.maximum_version = version
    assert (
        _handshake(running_host.port, context)
        == {
            ssl.TLSVersion.TLSv1_2: "TLSv1.2",
            ssl.TLSVersion.TLSv1_3: "TLSv1.3",
        }[version]
    )


def test_a_host_without_tls_must_be_a_loopback_proxy_backend() -> None:
    with pytest.raises(SettingsError, match="tls is required"):
        load_settings(None, {})
    with pytest.raises(SettingsError, match="loopback"):
        load_settings(
            None, {"RETRIEVAL_HOST_BEHIND_PROXY": "true", "RETRIEVAL_HOST_LISTEN__HOST": "0.0.0.0"}
        )
    settings = load_settings(None, {"RETRIEVAL_HOST_BEHIND_PROXY": "true"})
    assert isinstance(settings, HostSettings)
    assert settings.tls is None
    assert settings.listen.host == "127.0.0.1"

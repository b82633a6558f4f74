"""The loopback metrics port answers only to a loopback Host, a name in `allowedHosts`, or no
Host (probe A, session 42: it served the metrics whatever the Host said, so a page in a browser
on the machine that rebinds its own DNS name to 127.0.0.1 could read them)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from retrieval_host.http.app import create_app
from retrieval_host.serving.server import loopback_metrics
from retrieval_host.settings import HostSettings
from tests.support.ports import free_port

# A family the app registers at start, so it is in every exposition of its registry.
FAMILY = "retrieval_host_http_requests_total"


def _settings(**overrides: Any) -> HostSettings:
    return HostSettings.model_validate(
        {
            # No listener is started: only the metrics port, which is all these tests need.
            "listen": {"host": "127.0.0.1", "port": free_port()},
            "behindProxy": True,
            "metrics": {"port": free_port()},
            **overrides,
        }
    )


@pytest.fixture
def metrics_port() -> Iterator[int]:
    settings = _settings(allowedHosts=["rag.example.com"])
    with loopback_metrics(settings, create_app(settings, None)) as port:
        assert port is not None
        yield port


def _raw_get(port: int, head: bytes) -> tuple[str, bytes]:
    """The status line and body of `GET /metrics` sent with exactly the header lines `head`
    (httpx always sends one Host)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n" + head + b"\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk  # HTTP/1.0: the server closes after the answer
    status, _, rest = answer.partition(b"\r\n")
    return status.decode("latin-1"), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",  # the rebinding page's name and the port it rebinds to
        "127.0.0.1.evil.example:{port}",
        "localhost.evil.example",
        "10.0.0.7:{port}",
        "",
    ],
)
def test_a_host_header_that_names_another_host_gets_400_and_no_metrics(
    metrics_port: int, host: str
) -> None:
    response = httpx.get(
        f"http://127.0.0.1:{metrics_port}/metrics",
        headers={"Host": host.format(port=metrics_port)},
        timeout=10,
    )
    assert response.status_code == 400
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert "loopback Host" in response.text
    assert FAMILY not in response.text


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:{port}",  # what Prometheus sends for a 127.0.0.1:PORT target
        "localhost:{port}",  # curl http://localhost:PORT/metrics
        "LocalHost",
        "[::1]:{port}",
        "rag.example.com:{port}",  # listed in allowedHosts
    ],
)
def test_a_loopback_or_allowed_host_gets_the_metrics(metrics_port: int, host: str) -> None:
    response = httpx.get(
        f"http://127.0.0.1:{metrics_port}/metrics",
        headers={"Host": host.format(port=metrics_port)},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert FAMILY in response.text


def test_a_scrape_by_the_name_localhost_gets_the_metrics(metrics_port: int) -> None:
    response = httpx.get(f"http://localhost:{metrics_port}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert FAMILY in response.text


def test_an_http_1_0_scrape_without_host_gets_the_metrics(metrics_port: int) -> None:
    # Browsers always send a Host, so its absence is no rebinding page.
    status, body = _raw_get(metrics_port, b"")
    assert status.split(" ", 2)[1] == "200", status
    assert FAMILY.encode() in body


def test_a_second_host_header_naming_another_host_gets_400(metrics_port: int) -> None:
    status, body = _raw_get(
        metrics_port, f"Host: 127.0.0.1:{metrics_port}\r\nHost: evil.example\r\n".encode()
    )
    assert status.split(" ", 2)[1] == "400", status
    assert FAMILY.encode() not in body


def test_without_allowed_hosts_only_loopback_names_get_the_metrics() -> None:
    settings = _settings()
    with loopback_metrics(settings, create_app(settings, None)) as port:
        url = f"http://127.0.0.1:{port}/metrics"
        listed_elsewhere = httpx.get(url, headers={"Host": "rag.example.com"}, timeout=10)
        loopback = httpx.get(url, timeout=10)
    assert listed_elsewhere.status_code == 400
    assert loopback.status_code == 200 and FAMILY in loopback.text

"""The console's Ask page in a real browser when the connection is cut during a run: a finding
of probe K (session 40). A network error once `run.started` named the run showed it "failed",
though the host may have completed and recorded it, or recorded it cancelled (a disconnect
cancels a run). The host, the fake provider and the browser are those of `test_console.py`
(this module starts its own).

The cut is real: the page's `POST /v1/runs` goes to a loopback TLS proxy (the host's own
certificate, which the browser trusts) that forwards it to the real host and the host's stream
back, then closes the browser's connection without the final chunk, as a proxy's timeout or a
lost network does. What the proxy does with the host's side decides how the host records the
run: it reads the stream to its end (the run completes or fails), hangs up (the host cancels
the run) or holds it open (the run is still running).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.e2e import test_console as base
from tests.e2e.test_console import Console, _ask, _held_chat, _shot, _signed_in
from tests.e2e.test_console_outcomes import _next_frames, _until
from tests.support.host import wait_until

# The fixtures of `test_console.py`, bound here so that pytest finds them in this module.
playwright = base.playwright
console = base.console
browser = base.browser

# This module's proxies listen here (the session's port range), one port per proxy at a time.
PROXY_PORTS = range(20940, 20980)
CUT_ERROR = "The connection to the host was lost during the run"
UNCHECKED = "The connection was lost: this text was not checked and is not an answer."

Upstream = Literal["drain", "close", "hold"]


def _listen() -> socket.socket:
    """A listener on the first free port of `PROXY_PORTS` (bound, so no race with the other
    test process)."""
    for port in PROXY_PORTS:
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            continue
    raise RuntimeError(f"no free port in {PROXY_PORTS}")


class RunProxy:
    """Forwards one `POST /v1/runs` from the browser to the host and the host's events back,
    up to and including the first event named `stop_after` (none: not even `run.started`),
    then does `upstream` with the host's stream ("drain": read it to its end; "close": hang up;
    "hold": keep it open until `release`), sets `stopped`, and cuts the browser's connection
    once the test sets `cut`. The events withheld from the browser are kept in `withheld`."""

    def __init__(self, console: Console, stop_after: str | None, upstream: Upstream) -> None:
        self._console = console
        self._stop_after = stop_after
        self._upstream = upstream
        self._listener = _listen()
        self.origin = f"https://127.0.0.1:{self._listener.getsockname()[1]}"
        self.run_id: str | None = None
        self.withheld: list[str] = []
        self.stopped = threading.Event()
        self.cut = threading.Event()
        self.release = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RunProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cut.set()
        self.release.set()
        self._listener.close()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the proxy did not stop"

    def _serve(self) -> None:
        try:
            self._forward()
        except BaseException as error:  # reported by `check`, on the test's thread
            self.failure = error
        finally:
            self.stopped.set()

    def check(self) -> None:
        if self.failure is not None:
            raise AssertionError("the proxy failed") from self.failure

    def wait_stopped(self, page: Page) -> str | None:
        """Wait until the forwarding stopped; the run's id, if `run.started` came. Polled
        through `page`: the route that sends its request here runs only while the test waits
        on the page (a plain wait left the request unsent for a minute, once in six runs)."""
        deadline = time.monotonic() + 60  # a whole run, when the proxy drains it
        while not self.stopped.is_set():
            assert time.monotonic() < deadline, "timed out waiting for the end of the forwarding"
            page.evaluate("0")
        self.check()
        return self.run_id

    def _forward(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        state = self._console.ca.parent
        context.load_cert_chain(state / "server.pem", state / "server-key.pem")
        self._listener.settimeout(60)
        raw, _ = self._listener.accept()
        conn = context.wrap_socket(raw, server_side=True)
        try:
            head, body = _read_request(conn)
            verify = ssl.create_default_context(cafile=str(self._console.ca))
            with httpx.Client(base_url=self._console.base, verify=verify, timeout=120) as host:
                headers = {
                    name: value
                    for name in ("authorization", "content-type", "accept")
                    if (value := _header(head, name)) is not None
                }
                with host.stream("POST", "/v1/runs", headers=headers, content=body) as answer:
                    assert answer.status_code == 200, answer.read()
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"cache-control: no-store\r\ntransfer-encoding: chunked\r\n\r\n"
                    )
                    blocks = _event_blocks(answer.iter_lines())
                    for name, block, data in blocks:
                        if name == "run.started":
                            self.run_id = str(json.loads(data)["runId"])
                        if self._stop_after is None:
                            self.withheld.append(name)
                            break
                        chunk = block.encode()
                        conn.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        if name == self._stop_after:
                            break
                    if self._upstream == "drain":
                        self.withheld += [name for name, _, _ in blocks]
                    elif self._upstream == "close":
                        answer.close()  # the host sees its client leave and cancels the run
                    self.stopped.set()
                    assert self.cut.wait(60), "the test never cut the connection"
                    conn.close()  # no final chunk: the browser's read ends in a network error
                    if self._upstream == "hold":
                        assert self.release.wait(60), "the test never released the run"
        finally:
            conn.close()


def _read_request(conn: ssl.SSLSocket) -> tuple[bytes, bytes]:
    """The request's head and its whole body (closing with unread bytes resets the
    connection, which the browser reports before any answer)."""
    request = b""
    while b"\r\n\r\n" not in request:
        data = conn.recv(65536)
        assert data, "the browser closed before its request"
        request += data
    head, _, body = request.partition(b"\r\n\r\n")
    length = int(_header(head, "content-length") or 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head, body


def _header(head: bytes, name: str) -> str | None:
    found = re.search(rb"(?im)^" + name.encode() + rb":\s*(.*?)\s*$", head)
    return None if found is None else found[1].decode("latin-1")


def _event_blocks(lines: Iterator[str]) -> Iterator[tuple[str, str, str]]:
    """`(name, the event as sent, its data)` for each event with data (heartbeats skipped)."""
    block: list[str] = []
    for line in lines:
        if line:
            block.append(line)
            continue
        names = [entry[6:].strip() for entry in block if entry.startswith("event:")]
        data = [entry[5:].removeprefix(" ") for entry in block if entry.startswith("data:")]
        if data:
            yield (names[0] if names else "message"), "\n".join(block) + "\n\n", "\n".join(data)
        block = []


@contextmanager
def _proxied_runs(page: Page, proxy: RunProxy) -> Iterator[RunProxy]:
    """The page's `POST /v1/runs` through `proxy` (its reads of run records go to the host)."""
    with proxy:

        def forward(route: Route) -> None:
            route.continue_(url=proxy.origin + "/v1/runs")

        page.route("**/v1/runs", forward)
        try:
            yield proxy
        finally:
            page.unroute("**/v1/runs", forward)
    proxy.check()


def _record(console: Console, run_id: str) -> dict[str, object]:
    with console.api() as api:
        response = api.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def _recorded_as(console: Console, run_id: str, status: str) -> None:
    """Wait until the host records the run `status` (its client's disconnect reaches the run
    through the host's threads)."""
    wait_until(
        lambda: _record(console, run_id)["status"] == status, timeout=30, what=f"{status} run"
    )


@dataclass(frozen=True)
class Cut:
    provider: str
    model: str
    stop_after: str
    upstream: Upstream
    streamed: bool  # the browser saw some of the answer's text before the cut


CUTS = {
    # The host finished the run; the cut lost `run.completed` (or `run.failed`) only.
    "completed": Cut("local", "extractive", "run.started", "drain", streamed=False),
    "failed": Cut("refusing", "extractive", "run.started", "drain", streamed=False),
    # Some text streamed, then the connection to the host was cut too.
    "cancelled": Cut("fake", "gpt-held", "run.delta", "close", streamed=True),
    # Only the browser's connection was cut: the run goes on.
    "running": Cut("fake", "gpt-held", "run.delta", "hold", streamed=True),
}


@pytest.mark.parametrize("outcome", list(CUTS))
def test_a_run_whose_connection_is_cut_shows_how_its_record_says_it_ended(
    browser: Browser, console: Console, outcome: str
) -> None:
    # Probe K: the run showed "failed" and "The run failed" whatever the host had done.
    cut = CUTS[outcome]
    # With the fake provider: "Based on", then silence; the proxy forwards the first delta
    # ("Based" at least).
    with _held_chat(console, chunks=3) if cut.provider == "fake" else nullcontext():
        page, seen = _signed_in(browser, console)
        with _proxied_runs(page, RunProxy(console, cut.stop_after, cut.upstream)) as proxy:
            _ask(page, base.QUESTION, provider=cut.provider, model=cut.model)
            run_id = proxy.wait_stopped(page)
            assert run_id is not None
            if outcome == "cancelled":
                _recorded_as(console, run_id, "cancelled")
            # The page has taken what was forwarded before the cut, which may overtake it
            # otherwise (in one run of six the page never saw the forwarded `run.started`).
            expect(page.locator("#run-id")).to_have_text(f"run {run_id}")
            if cut.streamed:
                expect(page.locator("#answer")).to_contain_text("Based")
            proxy.cut.set()
            phase = page.locator("#run-phase")
            expect(phase).to_have_text(outcome, timeout=30_000)
            record = _record(console, run_id)
            assert record["status"] == outcome
            expect(page.locator("#run-id")).to_have_text(f"run {run_id}")
            expect(page.locator("#error")).to_contain_text(CUT_ERROR)
            expect(page.get_by_role("button", name="Ask")).to_be_enabled()
            if outcome == "completed":
                # The answer and its sources are the record's: the browser saw none of the text.
                assert "run.completed" in proxy.withheld
                result = record["result"]
                assert isinstance(result, dict)
                expect(page.locator("#answer")).to_have_text(result["text"])
                assert page.locator("#answer a.citation").count() >= 1
                expect(page.locator("#citation-check")).to_contain_text("0 invalid, 0 malformed")
                expect(page.locator("#run-details h2")).to_have_text("Sources")
                expect(page.locator("#run-details li")).to_have_count(len(result["sources"]))
                expect(page.locator("#receipts")).to_have_count(1)
                expect(page.locator("#run-progress")).to_have_attribute("value", "7")
                expect(page.locator("#answer-note")).to_have_count(0)
            else:
                said = (
                    "This run is still running: reload the page to see its answer once it ends."
                    if outcome == "running"
                    else f"This run ended without an answer ({outcome}, {record['errorCode']})."
                )
                expect(page.locator("#receipts")).to_have_count(0)
                expect(page.locator("#answer a")).to_have_count(0)
                if cut.streamed:
                    # What streamed stays, marked unchecked, under the record's word.
                    expect(page.locator("#record-note")).to_have_text(said)
                    expect(page.locator("#answer-note")).to_have_text(UNCHECKED)
                    expect(page.locator("#answer pre.unchecked")).to_contain_text("Based")
                else:
                    assert "run.failed" in proxy.withheld
                    assert record["errorCode"] == "PROVIDER_FAILED"
                    expect(page.locator("#answer-note")).to_have_text(said)
            _shot(page, f"54-run-connection-cut-{outcome}")
            assert page.evaluate("() => location.hash") == f"#/ask?run={run_id}&corpus=library"
        if outcome == "running":
            _recorded_as(console, run_id, "cancelled")  # the proxy hung up on leaving
        assert seen.errors == []
        page.context.close()


def test_a_cut_run_s_late_record_never_overwrites_the_run_asked_meanwhile(
    browser: Browser, console: Console
) -> None:
    # The record of a run whose connection was lost is read as the address's run is (probe K):
    # a question asked before it arrived must end that read.
    with _held_chat(console, chunks=3):
        page, seen = _signed_in(browser, console)
        held: list[Route] = []
        settled: list[str] = []
        page.on("requestfinished", lambda request: settled.append(request.url))
        page.on("requestfailed", lambda request: settled.append(request.url))
        with _proxied_runs(page, RunProxy(console, "run.delta", "close")) as proxy:
            _ask(page, base.QUESTION, provider="fake", model="gpt-held")
            cut_run = proxy.wait_stopped(page)
            assert cut_run is not None
            _recorded_as(console, cut_run, "cancelled")
            expect(page.locator("#answer")).to_contain_text("Based")
            page.route(f"**/v1/runs/{cut_run}", lambda route: held.append(route))
            proxy.cut.set()
            # While the record is read: "connection lost", the error, the text unchecked.
            phase = page.locator("#run-phase")
            expect(phase).to_have_text("connection lost")
            expect(page.locator("#error")).to_contain_text(CUT_ERROR)
            expect(page.locator("#answer-note")).to_have_text(UNCHECKED)
            _until(page, lambda: len(held) == 1, "the held record")
        _shot(page, "55-run-connection-cut-reading-its-record")

        # Asked from the form the page shows, while the cut run's record is on its way.
        page.get_by_label("Provider").fill("local")
        page.get_by_label("Model").fill("extractive")
        page.get_by_role("button", name="Ask").click()
        expect(phase).to_have_text("completed", timeout=60_000)
        run_line = page.locator("#run-id").inner_text()
        assert run_line != f"run {cut_run}"
        answer = page.locator("#answer").inner_text()
        address = page.evaluate("() => location.hash")
        held[0].continue_()
        _until(page, lambda: held[0].request.url in settled, "the end of the record's read")
        _next_frames(page)
        expect(phase).to_have_text("completed")
        expect(page.locator("#run-id")).to_have_text(run_line)
        expect(page.locator("#answer")).to_have_text(answer)
        expect(page.locator("#record-note")).to_have_count(0)
        expect(page.locator("#run-details h2")).to_have_count(1)
        expect(page.locator("#error")).to_be_hidden()
        assert page.evaluate("() => location.hash") == address
        # The read ended when the question was asked: the browser never took the record.
        assert held[0].request.failure == "net::ERR_ABORTED"
        assert seen.errors == []
        page.context.close()


def test_a_run_whose_connection_is_cut_before_it_started_stays_failed(
    browser: Browser, console: Console
) -> None:
    # No `run.started` reached the page: it knows no run to read, and says the run failed.
    page, seen = _signed_in(browser, console)
    with _proxied_runs(page, RunProxy(console, None, "close")) as proxy:
        _ask(page, base.QUESTION)
        proxy.wait_stopped(page)
        assert proxy.withheld == ["run.started"]
        proxy.cut.set()
        expect(page.locator("#run-phase")).to_have_text("failed", timeout=30_000)
    expect(page.locator("#error")).to_be_visible()
    expect(page.locator("#error")).not_to_contain_text(CUT_ERROR)
    expect(page.locator("#run-id")).to_have_text("")
    expect(page.locator("#answer")).to_have_text("")
    assert not [r for r in seen.requests if re.search(r"/v1/runs/", r.url)]
    _shot(page, "56-run-connection-cut-before-it-started")
    assert seen.errors == []
    page.context.close()

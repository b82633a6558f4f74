"""The console's Ask and Ingest pages in a real browser, when an answer comes late, never or as
a refusal: findings of probe K (session 40). The host, the fake provider and the browser are
those of `test_console.py` (this module starts its own).

A held or cut answer is made with Playwright's `page.route`, in the browser: the host itself
answers every other request.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, FilePayload, Page, Route, expect

from tests.e2e import test_console as base
from tests.e2e.test_console import Console, _delete, _index, _open, _shot, _sign_in

# The fixtures of `test_console.py`, bound here so that pytest finds them in this module.
playwright = base.playwright
console = base.console
browser = base.browser


def _recorded_run(console: Console, question: str) -> tuple[str, str]:
    """A run asked through the API (the extractive model, lexical search): its id and answer."""
    body = {
        "provider": "local",
        "model": "extractive",
        "input": question,
        "retrieval": {"corpus": "library", "mode": "before", "searchMode": "lexical"},
    }
    with console.api() as api:
        response = api.post("/v1/runs", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    return result["runId"], result["text"]


def _until(page: Page, predicate: Callable[[], bool], what: str) -> None:
    """Poll `predicate`, each poll a round trip to the page: Playwright hands the page's events
    (requests, routes) to the test's handlers only while the test waits on it."""
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        page.evaluate("0")


def _next_frames(page: Page) -> None:
    """Two frames on: a response the page had by now has been written to it (its writes follow
    its body in one task)."""
    page.evaluate(
        "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
    )


@pytest.mark.parametrize("outcome", ["completed", "failed"])
def test_a_recorded_run_s_late_record_never_overwrites_the_run_asked_meanwhile(
    browser: Browser, console: Console, outcome: str
) -> None:
    # Probe K: the Ask page opened at run A (`#/ask?run=A`) read A's record; a question asked
    # before it arrived ran as B, and A's record, arriving after B ended, showed B "completed"
    # with A's answer and a second Sources list, under B's id.
    _index(console, "late-record", "1", ["The heron gate closes at dusk, marmosetlantern."])
    old, old_answer = _recorded_run(console, "When does the marmosetlantern heron gate close?")
    held: list[Route] = []
    settled: list[str] = []
    page, seen = _open(browser, console, address=f"#/ask?run={old}&corpus=library")
    page.route(f"**/v1/runs/{old}", lambda route: held.append(route))
    page.on("requestfinished", lambda request: settled.append(request.url))
    page.on("requestfailed", lambda request: settled.append(request.url))
    _sign_in(page, console.token)
    expect(page.locator("#run-id")).to_have_text(f"run {old}")
    _until(page, lambda: len(held) == 1, "the held record")

    # Asked from the form the page shows: the address's run is still being read.
    provider = "local" if outcome == "completed" else "refusing"
    page.get_by_label("Provider").fill(provider)
    page.get_by_label("Question").fill(base.QUESTION)
    page.get_by_role("button", name="Ask").click()
    phase = page.locator("#run-phase")
    expect(phase).to_have_text(outcome, timeout=60_000)
    run_line = page.locator("#run-id").inner_text()
    assert run_line != f"run {old}"
    address = page.evaluate("() => location.hash")
    answer = page.locator("#answer").inner_text()
    assert old_answer not in answer

    # A's record arrives, unless its read ended (then the browser has no request to answer).
    held[0].continue_()
    _until(page, lambda: held[0].request.url in settled, "the end of the record's read")
    _next_frames(page)
    expect(phase).to_have_text(outcome)
    expect(page.locator("#run-id")).to_have_text(run_line)
    expect(page.locator("#answer")).to_have_text(answer)
    assert page.evaluate("() => location.hash") == address
    shown = 1 if outcome == "completed" else 0  # one Sources list and one Receipts block
    expect(page.locator("#run-details h2")).to_have_count(shown)
    expect(page.locator("#receipts")).to_have_count(shown)
    expect(page.locator("#citation-check")).to_have_count(shown)
    if outcome == "failed":
        expect(page.locator("#error")).to_contain_text("PROVIDER_FAILED")
        expect(page.locator("#answer a")).to_have_count(0)
    else:
        expect(page.locator("#error")).to_be_hidden()
    _shot(page, f"50-late-record-after-{outcome}-run")
    # The read ended when the question was asked: the browser never took A's record.
    assert held[0].request.failure == "net::ERR_ABORTED"
    assert seen.errors == []
    page.context.close()
    _delete(console, "late-record", "1")


def test_a_recorded_run_whose_sources_changed_says_so_not_that_it_is_missing(
    browser: Browser, console: Console
) -> None:
    # Probe K: a run whose cited source was re-indexed since answers `GET /v1/runs/{id}` with
    # the documented 404 SOURCE_UNAVAILABLE, and the page said "not found". The host answers a
    # missing run (or another subject's) the same way, with no reason: the page says both.
    _index(console, "evolving", "1", ["The platypus enclosure opens at nine, quolltrumpet."])
    run, _ = _recorded_run(console, "When does the quolltrumpet platypus enclosure open?")
    _index(console, "evolving", "2", ["The platypus enclosure opens at ten, quolltrumpet."])
    with console.api() as api:
        record = api.get(f"/v1/runs/{run}")
    assert (record.status_code, record.json()["code"]) == (404, "SOURCE_UNAVAILABLE")
    note = (
        "This run's answer can no longer be shown: a source it read was re-indexed or deleted "
        "since the run, or this token may no longer read it. Or there is no such run for this "
        "token: the host answers both the same way."
    )
    page, seen = _open(browser, console, address=f"#/ask?run={run}&corpus=library")
    _sign_in(page, console.token)
    phase = page.locator("#run-phase")
    expect(phase).to_have_text("unavailable")
    expect(page.locator("#answer-note")).to_have_text(note)
    expect(page.locator("#error")).to_contain_text("SOURCE_UNAVAILABLE")
    expect(page.locator("#receipts")).to_have_count(0)
    _shot(page, "51-recorded-run-sources-changed")

    # A run id no run has: the same answer from the host, the same words.
    page.evaluate("() => { location.hash = '#/ask?run=run_000000000000000000000000'; }")
    expect(page.locator("#run-id")).to_have_text("run run_000000000000000000000000")
    expect(page.locator("#answer-note")).to_have_text(note)
    expect(phase).to_have_text("unavailable")
    # Any other failure to read the record is not a verdict on the run.
    page.route(
        "**/v1/runs/run_busy",
        lambda route: route.fulfill(
            status=503,
            content_type="application/problem+json",
            json={"title": "Host busy", "status": 503, "code": "HOST_BUSY"},
        ),
    )
    page.evaluate("() => { location.hash = '#/ask?run=run_busy'; }")
    expect(page.locator("#run-id")).to_have_text("run run_busy")
    expect(phase).to_have_text("not read")
    expect(page.locator("#error")).to_contain_text("HOST_BUSY")
    expect(page.locator("#answer-note")).to_have_count(0)
    assert seen.errors == []
    page.context.close()
    _delete(console, "evolving", "2")


# Progress, then nothing: the stream ends at an event boundary, without `ingest.completed` or
# `ingest.failed` (a proxy closing a long stream, a connection cut between two events).
CUT_INGEST = (
    'event: ingest.started\ndata: {"type": "ingest.started"}\n\n'
    'event: ingest.progress\ndata: {"type": "ingest.progress", "phase": "parse",'
    ' "passagesDone": 0, "passagesTotal": null}\n\n'
    'event: ingest.progress\ndata: {"type": "ingest.progress", "phase": "embed",'
    ' "passagesDone": 64, "passagesTotal": 200}\n\n'
)


def test_an_ingest_stream_that_ends_without_its_outcome_says_so(
    browser: Browser, console: Console
) -> None:
    # Probe K: the page kept "embed: 64 of 200 passages", showed no error and let the user go
    # on as if the ingest were still running.
    page, seen = _open(browser, console)
    page.route(
        "**/v1/retrieval/ingest?*",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=CUT_INGEST),
    )
    _sign_in(page, console.token)
    expect(page.locator("#corpora")).to_be_visible()
    page.get_by_role("link", name="Ingest").click()
    note = FilePayload(name="cut-note.md", mimeType="text/markdown", buffer=b"# Cut\n\nText.\n")
    page.locator("input[type=file]").set_input_files(files=[note])
    ingest = page.get_by_role("button", name="Ingest")
    ingest.click()
    expect(page.locator("#ingest-phase")).to_have_text("outcome unknown")
    expect(page.locator("#error")).to_contain_text(
        "The ingest's stream ended before the host said how the ingest ended."
    )
    unknown = page.locator("#ingest-unknown")
    expect(unknown).to_have_text(
        "It may or may not have been indexed: read the source back to see which revision is "
        "indexed now (cut-note)."
    )
    expect(unknown.get_by_role("link", name="cut-note")).to_have_attribute(
        "href", "#/source/library/cut-note"
    )
    expect(page.locator("#ingested")).to_have_count(0)
    expect(ingest).to_be_enabled()
    _shot(page, "52-ingest-stream-cut")
    assert seen.errors == []
    page.context.close()


@contextmanager
def _cutting_host(console: Console) -> Iterator[str]:
    """A TLS listener on loopback (the host's own certificate, which the browser trusts) that
    answers one request with the start of an ingest stream and then closes the connection
    with no final chunk: a cut, not a clean end. Yields its origin."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    state = console.ca.parent
    context.load_cert_chain(state / "server.pem", state / "server-key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    chunk = CUT_INGEST.encode()

    def answer() -> None:
        with listener:
            raw, _ = listener.accept()
            with context.wrap_socket(raw, server_side=True) as conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536)
                # The whole upload read: closing with unread bytes resets the connection,
                # which the browser reports before any answer.
                head, _, body = request.partition(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                while length is not None and len(body) < int(length.group(1)):
                    body += conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                    + f"{len(chunk):x}\r\n".encode()
                    + chunk
                    + b"\r\n"
                )

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    thread.join(timeout=30)


def test_an_ingest_stream_whose_connection_is_cut_says_the_outcome_is_unknown(
    browser: Browser, console: Console
) -> None:
    # Review V: a connection cut mid-stream ends the read with a network error, which the page
    # showed as "failed", though the ingest may have been committed.
    page, seen = _open(browser, console)
    with _cutting_host(console) as origin:
        page.route(
            "**/v1/retrieval/ingest?*",
            lambda route: route.continue_(url=origin + "/v1/retrieval/ingest"),
        )
        _sign_in(page, console.token)
        expect(page.locator("#corpora")).to_be_visible()
        page.get_by_role("link", name="Ingest").click()
        note = FilePayload(name="cut.md", mimeType="text/markdown", buffer=b"# Cut\n\nText.\n")
        page.locator("input[type=file]").set_input_files(files=[note])
        page.get_by_role("button", name="Ingest").click()
        expect(page.locator("#ingest-phase")).to_have_text("outcome unknown")
    expect(page.locator("#ingest-unknown")).to_contain_text("may or may not have been indexed")
    expect(page.locator("#ingested")).to_have_count(0)
    _shot(page, "53-ingest-connection-cut")
    assert seen.errors == []
    page.context.close()

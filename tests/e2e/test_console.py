"""The operator console in a real browser: Debian's headless Chromium, driven by Playwright,
against the quickstart host over TLS (the quickstart's state and configuration, one more token
without grants, one that may only index, one that may also search a second corpus, and a fake
OpenAI-compatible provider the tests hold or script, with a second route that refuses every
call). Screenshots of each step go to `test-results/console/`.

Chromium trusts the host by the server certificate's public-key pin, not by ignoring
certificate errors: the connection is the host's real TLS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import ssl
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from playwright.sync_api import (
    Browser,
    FilePayload,
    Locator,
    Page,
    Playwright,
    Request,
    Response,
    Route,
    expect,
    sync_playwright,
)

from retrieval_host.serving.tokens import new_token, token_config_entry
from tests.support.fake_openai import (
    DEFAULT_API_KEY,
    FakeOpenAI,
    PlannedResponse,
    RecordedRequest,
    Reply,
    openai_error,
)
from tests.support.host import RunningHost, wait_until
from tests.support.ports import free_port
from tests.support.quickstart import cli, serving

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "test-results" / "console"
QUESTION = "How do I rotate a token?"
# A second corpus, which only `Console.vault_token` may search; "library" comes first in its
# lists (the host sorts them).
VAULT = "vault"
# A provider's error message holding bidirectional controls (provider "refusing").
REFUSAL = "quota for user \u202etxt.exe\u202c exceeded"
HOSTILE_NOTE = """# Console note

A passage that holds markup: <script>window.__pwned = 1</script>
<img src=x onerror="window.__pwned = 2"> and the word zebracorn, so that a search finds it.
"""


@dataclass
class Console:
    base: str
    token: str
    no_grant_token: str
    index_only_token: str
    vault_token: str  # searches "library" and VAULT, writes VAULT only
    ca: Path
    pin: str
    fake: FakeOpenAI  # providers "fake" and "refusing" of the quickstart token

    def api(self, token: str | None = None) -> httpx.Client:
        """The host's API as `token`, by default the quickstart token."""
        return httpx.Client(
            base_url=self.base,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=120,
        )


def _refuse(server: FakeOpenAI, request: RecordedRequest, number: int) -> Reply:
    """Provider "refusing": a client error whose message holds bidirectional controls."""
    return openai_error(403, REFUSAL, type_="insufficient_quota")


def _pin(certificate: Path) -> str:
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode("ascii")


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    root = tmp_path_factory.mktemp("console")
    port = free_port()
    prepared = subprocess.run(
        [*cli(), "quickstart", "--state-dir", "state", "--port", str(port), "--no-serve"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert prepared.returncode == 0, prepared.stderr
    assert f"Console: https://127.0.0.1:{port}/console/" in prepared.stdout
    state = root / "state"
    config = json.loads((state / "host.json").read_text())
    assert config["console"] == {"enabled": True}
    no_grant = new_token()
    config["tokens"].append(token_config_entry(no_grant, "no-grants", providers=["local"]))
    index_only = new_token()
    config["tokens"].append(token_config_entry(index_only, "quickstart", index=["library"]))
    config["applicationOptions"]["corpora"].append(VAULT)
    vault = new_token()
    config["tokens"].append(
        token_config_entry(
            vault,
            "quickstart",
            search=["library", VAULT],
            index=[VAULT],
            delete=[VAULT],
            providers=["local"],
        )
    )
    (state / "fake-key").write_text(DEFAULT_API_KEY)
    with FakeOpenAI() as fake:
        fake.route("POST", "/v1/refusing/chat/completions", _refuse)
        for name, base_url in (("fake", fake.base_url), ("refusing", f"{fake.base_url}/refusing")):
            config["providers"][name] = {
                "kind": "openai",
                "baseUrl": base_url,
                "apiKey": {"file": "fake-key"},
            }
        for entry in config["tokens"]:
            if entry["subject"] == "quickstart" and "local" in entry["providers"]:
                entry["providers"].extend(["fake", "refusing"])
        (state / "host.json").write_text(json.dumps(config))
        command = [*cli(), "serve", "--config", str(state / "host.json")]
        with serving(command, root, state / "ca.pem", port, announces=False):
            yield Console(
                f"https://127.0.0.1:{port}",
                (state / "token").read_text().strip(),
                no_grant,
                index_only,
                vault,
                state / "ca.pem",
                _pin(state / "server.pem"),
                fake,
            )


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    assert CHROMIUM.exists(), "Debian's chromium package: scripts/test installs it"
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright, console: Console) -> Iterator[Browser]:
    browser = playwright.chromium.launch(
        executable_path=str(CHROMIUM),
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--ignore-certificate-errors-spki-list={console.pin}",
        ],
    )
    yield browser
    browser.close()


@dataclass
class Seen:
    requests: list[Request]
    responses: list[Response]
    errors: list[str]


def _open(
    browser: Browser, console: Console, width: int = 1280, height: int = 800, address: str = ""
) -> tuple[Page, Seen]:
    """A new tab at the console, opened at `address` (`#/...`: the page shown after sign-in)."""
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    seen = Seen([], [], [])
    page.on("request", lambda request: seen.requests.append(request))
    page.on("response", lambda response: seen.responses.append(response))
    page.on("pageerror", lambda error: seen.errors.append(str(error)))
    page.goto(f"{console.base}/console/{address}")
    return page, seen


def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _sign_in(page: Page, token: str) -> None:
    # By keyboard: the token field has the focus, Enter submits.
    expect(page.get_by_label("Bearer token")).to_be_focused()
    page.keyboard.type(token)
    page.keyboard.press("Enter")


def test_an_operator_signs_in_browses_searches_follows_a_citation_asks_and_ingests(
    browser: Browser, console: Console
) -> None:
    page, seen = _open(browser, console)
    _shot(page, "01-sign-in")
    _sign_in(page, console.token)
    corpora = page.locator("#corpora")
    expect(corpora).to_contain_text("library")
    expect(corpora.locator("td.ops")).to_have_text("searchindexdelete")
    _shot(page, "02-corpora")

    # Browse: the corpus's sources, filtered by title, then a source and its passages.
    page.get_by_role("link", name="library").click()
    expect(page.locator("#sources tbody tr")).to_have_count(3)
    page.get_by_label("Title contains").fill("field")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#sources tbody tr")).to_have_count(1)
    expect(page.locator("#sources")).to_contain_text("application/pdf")
    _shot(page, "03-sources-filtered")
    page.get_by_role("link", name="field-handbook").click()
    expect(page.locator("#passages tbody tr")).to_have_count(4)
    expect(page.locator("#passages")).to_contain_text("page 1, lines 1–")
    _shot(page, "04-source")

    # Search: hybrid hits with their fused and per-mode scores, the terms marked.
    page.get_by_role("link", name="Search").click()
    page.get_by_label("Query").fill(QUESTION)
    page.get_by_label("Limit").fill("3")
    page.get_by_role("button", name="Search").click()
    hits = page.locator(".hit")
    expect(hits).to_have_count(3)
    first = hits.first
    expect(first.locator("header")).to_contain_text("score 1.000")
    expect(first.locator("header")).to_contain_text("dense 0.")
    expect(first.locator("header")).to_contain_text("lexical ")
    expect(first.locator("mark").filter(has_text="rotate")).not_to_have_count(0)
    expect(first.locator("mark").filter(has_text="token")).not_to_have_count(0)
    # Whole words only: no mark with a letter or digit right before or after it.
    inside_words = page.evaluate(
        """() => [...document.querySelectorAll('.hit mark')].filter((m) =>
            /[\\p{L}\\p{N}]$/u.test(m.previousSibling?.textContent ?? '') ||
            /^[\\p{L}\\p{N}]/u.test(m.nextSibling?.textContent ?? '')).map((m) => m.textContent)"""
    )
    assert inside_words == []
    _shot(page, "05-search")
    page.get_by_label("Byte budget").fill("200")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#truncated")).to_be_visible()

    # Follow the hit's citation into its source, re-read through the passage route.
    page.get_by_label("Byte budget").fill("")
    page.get_by_role("button", name="Search").click()
    expect(hits).to_have_count(3)
    cited_text = first.locator("pre").inner_text()
    first.get_by_role("link", name="Open the passage in its source").click()
    expect(page.locator("#cited")).to_have_text(cited_text)
    expect(page.locator("main")).to_contain_text("Before (")
    _shot(page, "06-passage")

    # Ask: the run streams to a completed answer whose citations check against the manifest.
    page.get_by_role("link", name="Ask").click()
    page.get_by_label("Question").fill(QUESTION)
    page.get_by_role("button", name="Ask").click()
    expect(page.locator("#run-phase")).to_have_text("completed", timeout=60_000)
    expect(page.locator("#run-progress")).to_have_attribute("value", "7")
    links = page.locator("#answer a.citation")
    assert links.count() >= 1
    expect(page.locator("#answer .citation.invalid")).to_have_count(0)
    expect(page.locator("#citation-check")).to_contain_text("0 invalid, 0 malformed")
    expect(page.locator("#run-id")).to_contain_text("run ")
    _shot(page, "07-ask")
    answer_text = page.locator("#answer").inner_text()
    run_line = page.locator("#run-id").inner_text()
    cited = links.count()
    links.first.click()
    expect(page.locator("#cited")).to_contain_text("rotate")
    _shot(page, "08-cited-answer-passage")
    # Back from the cited passage shows the same run's answer, read from its record.
    page.go_back()
    expect(page.locator("#run-phase")).to_have_text("completed")
    expect(page.locator("#run-id")).to_have_text(run_line)
    expect(page.locator("#answer")).to_have_text(answer_text)
    expect(page.locator("#answer a.citation")).to_have_count(cited)
    expect(page.locator("#citation-check")).to_contain_text("0 invalid, 0 malformed")
    _shot(page, "08b-back-to-the-answer")
    # The address's corpus is believed only when this token may search it (probe V: a
    # crafted address pointed the citation links at another corpus).
    page.goto(re.sub(r"corpus=[^&]*", "corpus=elsewhere", page.url))
    expect(page.locator("#answer a.citation")).to_have_count(cited)
    for href in page.locator("#answer a.citation").evaluate_all("(as) => as.map(a => a.hash)"):
        assert href.startswith("#/passage/library/"), href

    # Ingest a Markdown file holding markup, watch it to the end, find it listed and searched.
    page.get_by_role("link", name="Ingest").click()
    note = FilePayload(
        name="console-note.md", mimeType="text/markdown", buffer=HOSTILE_NOTE.encode()
    )
    page.locator("input[type=file]").set_input_files(files=[note])
    expect(page.get_by_label("Source id")).to_have_value("console-note")
    page.get_by_role("button", name="Ingest").click()
    expect(page.locator("#ingest-phase")).to_have_text("completed", timeout=60_000)
    expect(page.locator("#ingested")).to_contain_text("indexed: 1 passage(s) of console-note")
    _shot(page, "09-ingest")
    page.locator("#ingested a").click()
    expect(page.locator("#passages tbody tr")).to_have_count(1)
    page.get_by_role("link", name="Search").click()
    page.get_by_label("Query").fill("zebracorn markup")
    page.get_by_role("button", name="Search").click()
    expect(page.locator(".hit").first).to_contain_text("<script>window.__pwned = 1</script>")
    assert page.evaluate("() => window.__pwned === undefined")
    page.locator(".hit").first.get_by_role("link", name="Open the passage in its source").click()
    expect(page.locator("#cited")).to_contain_text('<img src=x onerror="window.__pwned = 2">')
    assert page.evaluate("() => window.__pwned === undefined")
    assert page.locator("main script, main img").count() == 0
    _shot(page, "10-markup-as-text")

    # The token never leaves the tab's memory: no URL, cookie or storage holds it.
    assert all(console.token not in r.url for r in seen.requests)
    assert page.context.cookies() == []
    assert page.evaluate("() => localStorage.length + sessionStorage.length") == 0
    assert console.token not in page.evaluate(
        "() => document.cookie + location.href + history.length"
    )
    # Every console response carried the policy; API responses came from the same origin.
    for response in seen.responses:
        if urlsplit(response.url).path.startswith("/console"):
            headers = response.headers
            assert "default-src 'self'" in headers["content-security-policy"], response.url
            assert headers["x-frame-options"] == "DENY"
    assert all(r.url.startswith(console.base) for r in seen.requests)
    assert seen.errors == []

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("Bearer token")).to_be_visible()
    page.context.close()


def test_a_token_without_grants_sees_no_corpus(browser: Browser, console: Console) -> None:
    page, _ = _open(browser, console)
    _sign_in(page, console.no_grant_token)
    expect(page.locator("#no-corpora")).to_be_visible()
    page.get_by_role("link", name="Search").click()
    expect(page.locator("main")).to_contain_text("may not search any corpus")
    _shot(page, "11-no-grants")
    page.context.close()


def test_a_wrong_token_and_a_missing_passage_are_errors_in_words(
    browser: Browser, console: Console
) -> None:
    page, _ = _open(browser, console)
    _sign_in(page, "rh_not-a-token")
    expect(page.locator("#error")).to_contain_text("Authentication required")
    expect(page.get_by_label("Bearer token")).to_be_visible()
    _shot(page, "12-wrong-token")
    page.get_by_label("Bearer token").fill(console.token)
    page.keyboard.press("Enter")
    expect(page.locator("#corpora")).to_be_visible()
    page.evaluate("() => { location.hash = '#/passage/library/no-such-passage'; }")
    expect(page.locator("#error")).to_contain_text("SOURCE_UNAVAILABLE")
    expect(page.locator("main h1")).to_have_text("Could not load this page")
    _shot(page, "13-missing-passage")
    # A reload forgets the token: the console asks for it again.
    page.reload()
    expect(page.get_by_label("Bearer token")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    page.context.close()


def test_the_console_fits_a_narrow_window(browser: Browser, console: Console) -> None:
    page, _ = _open(browser, console, width=390, height=800)
    _sign_in(page, console.token)
    expect(page.locator("#corpora")).to_be_visible()
    page.get_by_role("link", name="Search").click()
    page.get_by_label("Query").fill(QUESTION)
    page.get_by_role("button", name="Search").click()
    expect(page.locator(".hit").first).to_be_visible()
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    _shot(page, "14-narrow-search")
    page.context.close()


def test_every_console_response_carries_the_security_headers(console: Console) -> None:
    trust = ssl.create_default_context(cafile=str(console.ca))
    with httpx.Client(base_url=console.base, verify=trust) as client:
        for path in ("/console/", "/console/console.js", "/console/console.css", "/console/nope"):
            response = client.get(path)
            assert response.status_code == (404 if path.endswith("nope") else 200), path
            assert response.headers["content-security-policy"].startswith("default-src 'self'")
            assert "script-src 'self'" in response.headers["content-security-policy"]
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["x-content-type-options"] == "nosniff"
        # The host never redirects: both spellings are the page, which names its assets by
        # absolute paths (a black-box tester found a 308 here).
        bare = client.get("/console")
        assert bare.status_code == 200 and "location" not in bare.headers
        page = client.get("/console/").text
        assert bare.text == page
        assert 'src="/console/console.js"' in page and 'href="/console/console.css"' in page
        assert "<script>" not in page and "style=" not in page  # nothing inline
        # Same-origin API calls pass the Origin check; another origin's are refused.
        auth = {"Authorization": f"Bearer {console.token}"}
        body = {"corpus": "library", "query": QUESTION}
        own = client.post(
            "/v1/retrieval/search", json=body, headers={**auth, "Origin": console.base}
        )
        assert own.status_code == 200
        other = client.post(
            "/v1/retrieval/search", json=body, headers={**auth, "Origin": "https://evil.example"}
        )
        assert other.status_code == 403
        # Same host, other scheme or port: another origin.
        port = console.base.rsplit(":", 1)[1]
        for origin in (f"http://127.0.0.1:{port}", f"https://127.0.0.1:{int(port) + 1}"):
            refused = client.post(
                "/v1/retrieval/search", json=body, headers={**auth, "Origin": origin}
            )
            assert refused.status_code == 403, origin


def test_a_host_without_the_console_serves_none_and_refuses_its_own_origin(
    running_host: RunningHost,
) -> None:
    with running_host.client() as client:
        assert client.get("/console/").status_code == 404
        assert client.get("/console/console.js").status_code == 404
        own = client.post(
            "/v1/retrieval/search",
            json={"corpus": "handbook", "query": "x"},
            headers={"Origin": running_host.base_url},
        )
        assert own.status_code == 403
        assert own.json()["reason"] == "origin-not-allowed"


def test_an_ingest_the_host_refuses_is_an_error_in_words(
    browser: Browser, console: Console
) -> None:
    page, _ = _open(browser, console)
    _sign_in(page, console.token)
    expect(page.locator("#corpora")).to_be_visible()
    page.get_by_role("link", name="Ingest").click()
    sheet = FilePayload(
        name="budget.xlsx", mimeType="application/vnd.ms-excel", buffer=b"PK\x03\x04"
    )
    page.locator("input[type=file]").set_input_files(files=[sheet])
    page.get_by_role("button", name="Ingest").click()
    expect(page.locator("#ingest-phase")).to_have_text("failed")
    expect(page.locator("#error")).to_contain_text("UNSUPPORTED_MEDIA_TYPE")
    _shot(page, "15-ingest-refused")
    page.context.close()


def _tab_to(page: Page, name: str, limit: int = 20) -> None:
    """Press Tab until the focused element's accessible text is `name`."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        focused = page.evaluate(
            "() => (document.activeElement.labels && document.activeElement.labels[0]"
            " ? document.activeElement.labels[0].textContent"
            " : document.activeElement.textContent || '').trim()"
        )
        if focused.startswith(name):
            return
    raise AssertionError(f"Tab never reached {name!r}")


def test_the_console_works_from_the_keyboard_alone(browser: Browser, console: Console) -> None:
    page, _ = _open(browser, console)
    _sign_in(page, console.token)
    expect(page.locator("#corpora")).to_be_visible()
    _tab_to(page, "Search")
    page.keyboard.press("Enter")
    expect(page.get_by_label("Query")).to_be_visible()
    _tab_to(page, "Query")
    page.keyboard.type("rotate a token")
    page.keyboard.press("Enter")  # submits the form
    expect(page.locator(".hit").first).to_be_visible()
    _tab_to(page, "Open the passage in its source")
    page.keyboard.press("Enter")
    expect(page.locator("#cited")).to_be_visible()
    page.context.close()


# --- findings of a black-box probe (session 28) ---------------------------------------------


def _index(
    console: Console,
    source_id: str,
    revision: str,
    texts: Sequence[str],
    title: str = "",
    prefix: str = "",
) -> list[str]:
    """Index prepared passages (chunk ids `<prefix or source>-c<n>`, kept from one revision to
    the next); their chunk ids."""
    ids = [f"{prefix or source_id}-c{i:04d}" for i in range(len(texts))]
    chunks = [
        {"id": chunk, "text": text, "location": {"startLine": i + 1, "endLine": i + 1}}
        for i, (chunk, text) in enumerate(zip(ids, texts, strict=True))
    ]
    source = {"id": source_id, "revision": revision, "title": title or source_id}
    with console.api() as api:
        response = api.post(
            "/v1/retrieval/index", json={"corpus": "library", "source": source, "chunks": chunks}
        )
    assert response.status_code == 200, response.text
    return ids


def _delete(console: Console, source_id: str, revision: str) -> None:
    body = {"corpus": "library", "sourceId": source_id, "revision": revision}
    with console.api() as api:
        assert api.post("/v1/retrieval/delete", json=body).status_code == 200


def _signed_in(browser: Browser, console: Console, width: int = 1280) -> tuple[Page, Seen]:
    page, seen = _open(browser, console, width=width)
    _sign_in(page, console.token)
    expect(page.locator("#corpora")).to_be_visible()
    return page, seen


def _lexical_search(page: Page, query: str) -> Locator:
    """Search from the Search page in lexical mode; the first hit."""
    page.get_by_role("link", name="Search").click()
    page.get_by_label("Mode").select_option("lexical")
    page.get_by_label("Query").fill(query)
    page.get_by_role("button", name="Search").click()
    return page.locator(".hit").first


def _fits(page: Page) -> bool:
    return bool(page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth"))


def test_a_hit_opens_the_revision_it_showed_never_the_text_that_replaced_it(
    browser: Browser, console: Console
) -> None:
    _index(console, "policy", "v1", ["Refunds are granted within 30 days, quokkafruit."])
    page, _ = _signed_in(browser, console)
    hit = _lexical_search(page, "quokkafruit refunds")
    expect(hit).to_contain_text("granted within 30 days")
    # The same chunk id, other text: the link still names what the hit showed.
    _index(console, "policy", "v2", ["Refunds are never granted, quokkafruit."])
    hit.get_by_role("link", name="Open the passage in its source").click()
    expect(page.locator("#error")).to_contain_text("SOURCE_UNAVAILABLE")
    expect(page.locator("main")).not_to_contain_text("never granted")
    assert page.evaluate("() => location.hash").endswith("?revision=v1")
    _shot(page, "20-stale-citation")
    _delete(console, "policy", "v2")
    page.context.close()


def test_a_passage_page_shows_one_revision_when_a_re_index_lands_while_it_loads(
    browser: Browser, console: Console
) -> None:
    texts = [f"Revision {{}} paragraph {i}, ocelotmoss." for i in range(3)]
    ids = _index(console, "mixed", "v1", [text.format("v1") for text in texts])
    page, _ = _signed_in(browser, console)
    replaced: list[bool] = []

    def re_index_first(route: Route) -> None:
        # The passage was read at v1; its source is replaced before its listing is read.
        if not replaced:
            _index(console, "mixed", "v2", [text.format("v2") for text in texts])
            replaced.append(True)
        route.continue_()

    page.route("**/v1/corpora/library/sources/mixed?*", re_index_first)
    page.evaluate("(id) => { location.hash = '#/passage/library/' + id; }", ids[1])
    expect(page.locator("#cited")).to_have_text("Revision v2 paragraph 1, ocelotmoss.")
    main = page.locator("main")
    expect(main).to_contain_text("Revision v2 paragraph 0")
    expect(main).to_contain_text("Revision v2 paragraph 2")
    expect(main).not_to_contain_text("Revision v1")
    assert replaced == [True]
    _shot(page, "21-one-revision")
    _delete(console, "mixed", "v2")
    page.context.close()


def test_a_passage_past_the_first_thousand_has_its_neighbours(
    browser: Browser, console: Console
) -> None:
    ids = _index(console, "big", "1", [f"Passage {i} of a long source." for i in range(1002)])
    page, _ = _signed_in(browser, console)
    for at in (999, 1000):
        page.evaluate("(id) => { location.hash = '#/passage/library/' + id; }", ids[at])
        expect(page.locator("#cited")).to_have_text(f"Passage {at} of a long source.")
        main = page.locator("main")
        expect(main).to_contain_text(f"Passage {at - 1} of a long source.")
        expect(main).to_contain_text(f"Passage {at + 1} of a long source.")
    _delete(console, "big", "1")
    page.context.close()


def test_an_index_only_token_is_shown_where_it_may_write_and_ingests_there(
    browser: Browser, console: Console
) -> None:
    page, _ = _open(browser, console)
    _sign_in(page, console.index_only_token)
    expect(page.locator("#no-corpora")).to_be_visible()
    # `GET /v1/corpora`'s `writeOnly`: the corpora it may only write to, nothing of their content.
    expect(page.locator("#write-only")).to_contain_text("library (index)")
    page.locator("main").get_by_role("link", name="Ingest").click()
    expect(page.get_by_label("Corpus")).to_have_value("library")
    expect(page.locator("#no-index-corpora")).to_have_count(0)
    expect(page.locator("main")).not_to_contain_text("may not index")
    note = FilePayload(name="idx-note.md", mimeType="text/markdown", buffer=b"# Idx\n\nWritten.\n")
    page.locator("input[type=file]").set_input_files(files=[note])
    page.get_by_role("button", name="Ingest").click()
    expect(page.locator("#ingest-phase")).to_have_text("completed", timeout=60_000)
    expect(page.locator("#ingested")).to_contain_text("indexed: 1 passage(s) of idx-note")
    # It may not read the source it wrote: its id, not a link to a 403 (a black-box test).
    expect(page.locator("#ingested a")).to_have_count(0)
    _shot(page, "22-index-only-ingest")
    page.get_by_role("button", name="Sign out").click()
    # A token without the grant gets the host's answer, in words.
    _sign_in(page, console.no_grant_token)
    expect(page.locator("#no-corpora")).to_be_visible()
    expect(page.locator("#write-only")).to_have_count(0)
    page.locator("#nav").get_by_role("link", name="Ingest").click()
    expect(page.locator("#no-index-corpora")).to_be_visible()
    page.get_by_label("Corpus").fill("library")
    page.locator("input[type=file]").set_input_files(files=[note])
    page.get_by_role("button", name="Ingest").click()
    expect(page.locator("#error")).to_contain_text("PERMISSION_DENIED")
    page.context.close()
    with console.api() as api:
        shown = api.get("/v1/corpora/library/sources/idx-note").json()["source"]
    _delete(console, "idx-note", shown["revision"])


def _ask_held(page: Page, console: Console, stalls: int) -> None:
    """Ask with the fake provider, which answers a little, then holds its stream."""
    page.get_by_role("link", name="Ask").click()
    page.get_by_label("Provider").fill("fake")
    page.get_by_label("Model").fill("gpt-held")
    page.get_by_label("Question").fill(QUESTION)
    page.get_by_role("button", name="Ask").click()
    wait_until(lambda: console.fake.stalled_streams == 1, timeout=60, what="the held stream")
    expect(page.locator("#run-id")).to_contain_text("run ")
    expect(page.get_by_role("button", name="Ask")).to_be_disabled()  # one run at a time
    assert console.fake.chat_disconnects == stalls


@contextmanager
def _held_chat(console: Console, chunks: int) -> Iterator[None]:
    """The fake provider's answers stall after `chunks` chunks within the block; after it, the
    held streams are let go and it answers at once again (the module's tests share it)."""
    console.fake.set_chat_mode("stall", chunks=chunks)
    try:
        yield
    finally:
        console.fake.set_chat_mode("ok")
        console.fake.release_stalls()


def test_leaving_a_page_or_signing_out_cancels_its_run_and_its_error_stays_behind(
    browser: Browser, console: Console
) -> None:
    with _held_chat(console, chunks=1):
        page, seen = _signed_in(browser, console)
        _ask_held(page, console, stalls=0)
        page.get_by_role("link", name="Search").click()
        # The console hung up, so the host cancelled the run and hung up on the model.
        wait_until(lambda: console.fake.chat_disconnects == 1, timeout=30, what="the cancel")
        page.get_by_label("Query").fill(QUESTION)
        page.get_by_role("button", name="Search").click()
        expect(page.locator(".hit").first).to_be_visible()
        expect(page.locator("#error")).to_be_hidden()

        _ask_held(page, console, stalls=1)
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_label("Bearer token")).to_be_visible()
        wait_until(lambda: console.fake.chat_disconnects == 2, timeout=30, what="the cancel")
        expect(page.locator("#error")).to_be_hidden()
        _shot(page, "23-signed-out-mid-run")
        assert seen.errors == []
        page.context.close()


def test_an_answer_with_malformed_or_unknown_markers_fails_and_is_not_shown_as_one(
    browser: Browser, console: Console
) -> None:
    # The host checks every answer's markers (issue 5): this one fails INVALID_CITATION, and
    # the console shows what streamed as unchecked text, never a marker as a link.
    console.fake.script_chat(
        [
            PlannedResponse(
                "Unknown [source:pFAKE000]. Malformed [source: p1] and [Source:p1] and "
                "[source:] and [ source:p1]. Hostile [source:javascript:alert(1)] end."
            )
        ]
    )
    page, _ = _signed_in(browser, console)
    _ask(page, QUESTION, provider="fake", model="gpt-scripted")
    expect(page.locator("#run-phase")).to_have_text("failed", timeout=60_000)
    expect(page.locator("#error")).to_contain_text("INVALID_CITATION")
    expect(page.locator("#answer-note")).to_have_text(
        "The run failed: this text was not checked and is not an answer."
    )
    expect(page.locator("#answer pre.unchecked")).to_contain_text("[source:javascript:alert(1)]")
    expect(page.locator("#answer a")).to_have_count(0)
    _shot(page, "24-malformed-markers")
    # Away and Back: the run's record says how it ended; the unchecked text is not kept.
    page.get_by_role("link", name="Search").click()
    page.go_back()
    expect(page.locator("#run-phase")).to_have_text("failed")
    expect(page.locator("#answer-note")).to_have_text(
        "This run ended without an answer (failed, INVALID_CITATION)."
    )
    expect(page.locator("#answer a")).to_have_count(0)
    page.context.close()


def test_dropping_a_second_file_names_it_and_ingests_it_under_its_own_id(
    browser: Browser, console: Console
) -> None:
    page, _ = _signed_in(browser, console)
    page.get_by_role("link", name="Ingest").click()
    for name, text in (("first-note.md", "# First\n\nfirst\n"), ("second-note.md", "# Second\n\n")):
        dropped = page.evaluate_handle(
            "([name, text]) => { const t = new DataTransfer();"
            " t.items.add(new File([text], name, {type: 'text/markdown'})); return t; }",
            [name, text],
        )
        page.dispatch_event("#drop", "drop", {"dataTransfer": dropped})
    expect(page.locator("#chosen")).to_have_text("second-note.md")
    expect(page.get_by_label("Source id")).to_have_value("second-note")
    page.get_by_role("button", name="Ingest").click()
    expect(page.locator("#ingested")).to_contain_text("of second-note", timeout=60_000)
    with console.api() as api:
        assert api.get("/v1/corpora/library/sources/first-note").status_code == 404
        revision = api.get("/v1/corpora/library/sources/second-note").json()["source"]["revision"]
    # A file chosen with the button is named too; an id the user typed stays theirs.
    page.get_by_label("Source id").fill("my-own-id")
    third = FilePayload(name="third.md", mimeType="text/markdown", buffer=b"# Third\n")
    page.locator("input[type=file]").set_input_files(files=[third])
    expect(page.locator("#chosen")).to_have_text("third.md")
    expect(page.get_by_label("Source id")).to_have_value("my-own-id")
    page.context.close()
    _delete(console, "second-note", revision)


def test_long_and_spoofing_ids_and_titles_neither_widen_the_page_nor_reorder_their_text(
    browser: Browser, console: Console
) -> None:
    long_id, long_title = "S" * 256, "T" * 1024
    _index(console, long_id, "1", ["A passage of the long source, yakwillow."], long_title, "long")
    spoofed = "invoice\u202egpj.exe"
    _index(console, spoofed, "1", ["A spoofed name."], "Invoice \u202egpj.exe", "spoofed")
    for width in (1280, 375):
        page, _ = _signed_in(browser, console, width=width)
        page.evaluate("(id) => { location.hash = '#/source/library/' + id; }", long_id)
        expect(page.locator("main h1")).to_have_text(long_title)
        assert _fits(page), width
        page.get_by_role("link", name="Search").click()
        page.get_by_label("Query").fill("yakwillow")
        page.get_by_role("button", name="Search").click()
        expect(page.locator(".hit").first).to_contain_text(long_id)
        assert _fits(page), width
        page.get_by_role("link", name="Ingest").click()
        expect(page.locator("#ingest-form")).to_be_visible()
        assert _fits(page), width
        _shot(page, f"25-long-names-{width}")
        page.context.close()
    page, _ = _signed_in(browser, console)
    page.evaluate("() => { location.hash = '#/source/library/invoice%E2%80%AEgpj.exe'; }")
    heading = page.locator("main h1")
    expect(heading).to_have_text("Invoice U+202Egpj.exe")
    expect(heading.locator(".control")).to_have_count(1)
    _shot(page, "26-bidi-title")
    page.context.close()
    _delete(console, long_id, "1")
    _delete(console, spoofed, "1")


def test_document_controlled_ids_and_metadata_neither_spoof_nor_break_a_page(
    browser: Browser, console: Console
) -> None:
    # A black-box test: a revision, message id or chunk id holding U+202E read reversed
    # ("msg<RLO>gpj.exe" as "msgexe.jpg"), and `{"messages": 5}` in a source's metadata made
    # every passage of it fail to open ("messages.find is not a function").
    source = {"id": "bidi-src", "revision": "r\u202e1.fdp", "metadata": {"messages": 5}}
    chunk = {
        "id": "bidi-c1\u202eexe",
        "text": "The zebraquartz rotation key is kept in the vault.",
        "location": {"startLine": 1, "endLine": 1, "documentId": "msg\u202egpj.exe"},
    }
    with console.api() as api:
        indexed = api.post(
            "/v1/retrieval/index", json={"corpus": "library", "source": source, "chunks": [chunk]}
        )
    assert indexed.status_code == 200, indexed.text
    page, seen = _signed_in(browser, console)
    hit = _lexical_search(page, "zebraquartz")
    expect(hit).to_contain_text("msgU+202Egpj.exe")  # the message id, its control a mark
    expect(hit).to_contain_text("rU+202E1.fdp")  # and the revision
    hit.get_by_role("link", name="Open the passage in its source").click()
    expect(page.locator("main h1")).to_contain_text("bidi-c1U+202Eexe")
    expect(page.locator("main dl.facts")).to_contain_text("rU+202E1.fdp")
    expect(page.locator("main")).to_contain_text("zebraquartz rotation key")
    expect(page.locator("main h2").filter(has_text="Cited passage")).to_contain_text(
        "message msgU+202Egpj.exe"
    )
    expect(page.locator("#error")).to_be_hidden()
    _shot(page, "27-bidi-ids-and-scalar-messages")
    # A filter that is not JSON: the error, and not the previous search's hits under it.
    page.get_by_role("link", name="Search").click()
    page.get_by_label("Query").fill("zebraquartz")
    page.get_by_role("button", name="Search").click()
    expect(page.locator(".hit").first).to_contain_text("zebraquartz")
    page.get_by_label("Filters (JSON, optional)").fill('{"nope": ')
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#error")).to_contain_text("The filters are not JSON")
    expect(page.locator(".hit")).to_have_count(0)
    assert seen.errors == []
    page.context.close()
    _delete(console, "bidi-src", "r\u202e1.fdp")


def test_the_first_page_keeps_the_filter_and_odd_addresses_are_errors_in_words(
    browser: Browser, console: Console
) -> None:
    with console.api() as api:
        cursor = api.get("/v1/corpora/library/sources?limit=1").json()["nextCursor"]
    page, seen = _signed_in(browser, console)
    page.evaluate(
        "(cursor) => { location.hash = '#/sources/library?title=field&cursor=' +"
        " encodeURIComponent(cursor); }",
        cursor,
    )
    page.get_by_role("link", name="First page").click()
    expect(page.get_by_label("Title contains")).to_have_value("field")
    expect(page.locator("#sources tbody tr")).to_have_count(1)
    # "." and ".." cannot be asked for from a browser; a broken escape is no page.
    for address in ("#/source/library/..", "#/passage/library/."):
        page.evaluate("(address) => { location.hash = address; }", address)
        expect(page.locator("#error")).to_contain_text("cannot be opened in a browser")
    page.evaluate("() => { location.hash = '#/source/library/%E0%A4%A'; }")
    expect(page.locator("#error")).to_contain_text("broken %-escape")
    page.get_by_role("link", name="Search").click()
    expect(page.get_by_label("Limit")).to_have_attribute("max", "100")
    assert seen.errors == []
    page.get_by_role("button", name="Sign out").click()
    _sign_in(page, "rh_tökén")
    expect(page.locator("#error")).to_contain_text("not a valid bearer token")
    assert seen.errors == []
    page.context.close()


def test_a_message_whose_headers_the_thread_did_not_keep_says_so(
    browser: Browser, console: Console
) -> None:
    # A black-box test: past a long thread's header list, a passage's message showed no
    # headers and no word why.
    header = {"messageId": "<m1@x>", "from": "Ada <ada@x>", "date": "Mon, 1 Jan 2024",
              "subject": "Moorings", "attachments": []}  # fmt: skip
    metadata = {"messageCount": 3, "messages": [header], "messagesTruncated": True}
    chunks = [
        {"id": f"thread-{n}", "text": f"Message {n} about moorings.",
         "location": {"startLine": 1, "endLine": 1, "documentId": f"<m{n}@x>"}}
        for n in (1, 3)
    ]  # fmt: skip
    source = {"id": "thread", "revision": "1", "title": "Moorings", "metadata": metadata}
    with console.api() as api:
        body = {"corpus": "library", "source": source, "chunks": chunks}
        assert api.post("/v1/retrieval/index", json=body).status_code == 200
    page, _ = _signed_in(browser, console)
    main = page.locator("main")
    page.evaluate("() => { location.hash = '#/passage/library/thread-1'; }")
    expect(page.locator("#cited")).to_have_text("Message 1 about moorings.")
    expect(main).to_contain_text("Ada <ada@x>")
    page.evaluate("() => { location.hash = '#/passage/library/thread-3'; }")
    expect(page.locator("#cited")).to_have_text("Message 3 about moorings.")
    expect(main).to_contain_text("Not kept: this thread's header list was cut short at 1 of 3")
    expect(main).not_to_contain_text("Ada <ada@x>")
    _shot(page, "message-headers-not-kept")
    _delete(console, "thread", "1")
    page.context.close()


# --- findings of a black-box probe (session 34) ---------------------------------------------

RLO = "\u202e"
# Any bidirectional control the console shows as a mark, in a DOM text node.
_RAW_CONTROLS = """(selector) => [...document.querySelectorAll(selector)].some((root) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
        const text = walker.currentNode.data;
        if (/[\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]/u.test(text)) return true;
    }
    return false;
})"""


def _ask(
    page: Page,
    question: str,
    *,
    provider: str = "local",
    model: str = "extractive",
    mode: str = "before",
    search_mode: str = "hybrid",
) -> None:
    page.get_by_role("link", name="Ask").click()
    page.get_by_label("Provider").fill(provider)
    page.get_by_label("Model").fill(model)
    page.locator("#ask-form select[name=mode]").select_option(mode)
    page.locator("#ask-form select[name=searchMode]").select_option(search_mode)
    page.get_by_label("Question").fill(question)
    page.get_by_role("button", name="Ask").click()


def test_bidi_controls_in_an_answer_neither_reverse_it_nor_its_isolated_markers(
    browser: Browser, console: Console
) -> None:
    # A black-box test: the extractive provider quotes a passage holding U+202E, which reversed
    # the rest of the answer line, its citation links included ("[…p:ecruos]"); the receipts'
    # JSON obeyed the control too.
    _index(console, "okapi", "1", [f"Rotate the okapi key {RLO} gpj.exe now and restart."])
    page, seen = _signed_in(browser, console)
    _ask(page, f"How do I rotate the okapi key {RLO}?", search_mode="lexical")
    expect(page.locator("#run-phase")).to_have_text("completed", timeout=60_000)
    answer = page.locator("#answer")
    expect(answer).to_contain_text("okapi key U+202E gpj.exe")
    expect(answer.locator(".control")).not_to_have_count(0)
    assert not page.evaluate(_RAW_CONTROLS, "#answer")
    citations = answer.locator("a.citation")
    expect(citations).not_to_have_count(0)
    # Each marker is isolated from the text around it, and the answer takes its direction
    # from its own text.
    assert page.evaluate(
        "() => [...document.querySelectorAll('#answer .citation')]"
        ".every((c) => c.parentElement.tagName === 'BDI')"
    )
    expect(answer.locator("pre")).to_have_attribute("dir", "auto")
    page.locator("#receipts summary").click()
    receipts = page.locator("#receipts pre")
    expect(receipts).to_contain_text("okapi key \\u202e?")
    assert not page.evaluate(_RAW_CONTROLS, "#receipts")
    _shot(page, "30-answer-bidi-marked")
    assert seen.errors == []
    page.context.close()
    _delete(console, "okapi", "1")


def test_a_source_s_metadata_shows_its_bidi_controls_escaped(
    browser: Browser, console: Console
) -> None:
    source = {
        "id": "meta-bidi",
        "revision": "1",
        "title": "Mail",
        "metadata": {"subject": f"Re: token {RLO}gpj.exe", f"k{RLO}ey": "x"},
    }
    chunk = {"id": "meta-bidi-c1", "text": "A message.", "location": {"startLine": 1}}
    with console.api() as api:
        body = {"corpus": "library", "source": source, "chunks": [chunk]}
        assert api.post("/v1/retrieval/index", json=body).status_code == 200
    page, _ = _signed_in(browser, console)
    page.evaluate("() => { location.hash = '#/source/library/meta-bidi'; }")
    page.get_by_text("Metadata").click()
    metadata = page.locator("main details pre")
    expect(metadata).to_contain_text('"subject": "Re: token \\u202egpj.exe"')
    expect(metadata).to_contain_text('"k\\u202eey": "x"')
    assert not page.evaluate(_RAW_CONTROLS, "main details pre")
    page.context.close()
    _delete(console, "meta-bidi", "1")


def test_a_deep_link_opened_in_a_new_tab_is_the_page_shown_after_sign_in(
    browser: Browser, console: Console
) -> None:
    # A black-box test: a citation opened in a new tab (or reloaded) landed on the corpora.
    ids = _index(console, "deep", "d1", ["First, deeplinkmoss.", "Second, deeplinkmoss."])
    address = f"#/passage/library/{ids[1]}?revision=d1"
    page = browser.new_context().new_page()
    page.goto(f"{console.base}/console/{address}")
    _sign_in(page, console.token)
    expect(page.locator("#cited")).to_have_text("Second, deeplinkmoss.")
    assert page.evaluate("() => location.hash") == address
    # After a reload, the same page again; after signing out, the corpora.
    page.reload()
    _sign_in(page, console.token)
    expect(page.locator("#cited")).to_have_text("Second, deeplinkmoss.")
    page.get_by_role("button", name="Sign out").click()
    _sign_in(page, console.token)
    expect(page.locator("#corpora")).to_be_visible()
    assert page.evaluate("() => location.hash") == "#/corpora"
    page.context.close()
    _delete(console, "deep", "d1")


def test_a_failed_or_stopped_run_s_text_is_labelled_not_an_answer(
    browser: Browser, console: Console
) -> None:
    # A black-box test: a tool-mode run that the host failed (NO_RETRIEVAL_EVIDENCE) left the
    # model's text on screen, looking like an answer.
    console.fake.script_chat(
        [PlannedResponse(f"Valid [source:none] unknown {RLO} gpj.exe [source:nosuch] end.")]
    )
    page, seen = _signed_in(browser, console)
    _ask(page, QUESTION, provider="fake", model="gpt-scripted", mode="tool")
    expect(page.locator("#run-phase")).to_have_text("failed", timeout=60_000)
    expect(page.locator("#error")).to_contain_text("NO_RETRIEVAL_EVIDENCE")
    note = page.locator("#answer-note")
    expect(note).to_have_text("The run failed: this text was not checked and is not an answer.")
    unchecked = page.locator("#answer pre.unchecked")
    expect(unchecked).to_contain_text("unknown U+202E gpj.exe")  # the streamed text, marked
    assert not page.evaluate(_RAW_CONTROLS, "#answer")
    expect(page.locator("#answer a")).to_have_count(0)
    _shot(page, "31-failed-run-unchecked")

    with _held_chat(console, chunks=3):
        _ask(page, QUESTION, provider="fake", model="gpt-held")
        wait_until(lambda: console.fake.stalled_streams == 1, timeout=60, what="the held stream")
        expect(page.locator("#answer")).to_contain_text("Based on")
        expect(note).to_have_count(0)  # a new run starts clean
        page.get_by_role("button", name="Stop").click()
        expect(page.locator("#run-phase")).to_have_text("stopped")
        expect(note).to_have_text(
            "The run was stopped: this text was not checked and is not an answer."
        )
        expect(unchecked).to_contain_text("Based on")
    assert seen.errors == []
    page.context.close()


def test_a_chosen_file_s_bidi_name_shows_as_text_with_its_mark(
    browser: Browser, console: Console
) -> None:
    page, _ = _signed_in(browser, console)
    page.get_by_role("link", name="Ingest").click()
    name = f"<img src=x onerror=window.__xss=60>{RLO}dm.exe.md"
    chosen = FilePayload(name=name, mimeType="text/markdown", buffer=b"# x\n")
    page.locator("input[type=file]").set_input_files(files=[chosen])
    expect(page.locator("#chosen")).to_have_text(
        "<img src=x onerror=window.__xss=60>U+202Edm.exe.md"
    )
    expect(page.locator("#chosen .control")).to_have_count(1)
    assert page.evaluate("() => window.__xss === undefined")
    page.context.close()


def test_a_passage_of_a_source_a_browser_cannot_list_is_shown_without_its_neighbours(
    browser: Browser, console: Console
) -> None:
    # A black-box test: a passage whose source id is "." or ".." could not be opened at all,
    # even from a citation; the passage route needs only its chunk id.
    ids = _index(console, ".", "1", ["Dotted source, lemurquill."], prefix="dotted")
    page, seen = _signed_in(browser, console)
    hit = _lexical_search(page, "lemurquill")
    expect(hit).to_contain_text("Dotted source")
    expect(hit.locator('a[href="#/source/library/."]')).to_have_count(0)  # no dead link
    hit.get_by_role("link", name="Open the passage in its source").click()
    expect(page.locator("#cited")).to_have_text("Dotted source, lemurquill.")
    expect(page.locator("#source-unopenable")).to_contain_text('a browser drops "."')
    expect(page.locator("#error")).to_be_hidden()
    assert page.evaluate("() => location.hash").startswith(f"#/passage/library/{ids[0]}?")
    assert seen.errors == []
    page.context.close()
    _delete(console, ".", "1")


def test_a_citation_pinned_to_a_replaced_revision_says_so_and_links_the_source(
    browser: Browser, console: Console
) -> None:
    ids = _index(console, "stale-src", "v1", ["Old text, tapirglass."])
    _index(console, "stale-src", "v2", ["New text, tapirglass."])
    page, _ = _signed_in(browser, console)
    page.evaluate("(id) => { location.hash = '#/passage/library/' + id + '?revision=v1'; }", ids[0])
    expect(page.locator("#stale")).to_contain_text("revision v1, which may no longer be indexed")
    expect(page.locator("#error")).to_contain_text("SOURCE_UNAVAILABLE")
    expect(page.locator("main")).not_to_contain_text("New text")
    current = page.locator("#stale-source a")
    expect(current).to_have_attribute("href", "#/source/library/stale-src")
    _shot(page, "32-stale-citation-explained")
    current.click()
    expect(page.locator("main dl.facts")).to_contain_text("v2")
    # A passage that exists at no revision: no source to link.
    page.evaluate("() => { location.hash = '#/passage/library/no-such-chunk?revision=v1'; }")
    expect(page.locator("#stale")).to_be_visible()
    expect(page.locator("#stale-source")).to_have_count(0)
    page.context.close()
    _delete(console, "stale-src", "v2")


def test_right_to_left_text_takes_its_own_direction_and_empty_locations_no_parentheses(
    browser: Browser, console: Console
) -> None:
    arabic = "لتدوير مفتاح الوصول، أنشئ مفتاحا جديدا. token rotation"
    source = {"id": "rtl", "revision": "1", "title": "تدوير المفاتيح"}
    chunks = [
        {"id": "rtl-c1", "text": arabic},  # no location at all
        {"id": "rtl-c2", "text": "ثانيا، احذف المفتاح القديم."},
    ]
    with console.api() as api:
        body = {"corpus": "library", "source": source, "chunks": chunks}
        indexed = api.post("/v1/retrieval/index", json=body)
    assert indexed.status_code == 200, indexed.text
    page, _ = _signed_in(browser, console)
    direction = "(el) => getComputedStyle(el).direction"
    hit = _lexical_search(page, "لتدوير")
    assert hit.locator("pre").evaluate(direction) == "rtl"
    hit.get_by_role("link", name="Open the passage in its source").click()
    cited = page.locator("#cited")
    expect(cited).to_have_text(arabic)
    assert cited.evaluate(direction) == "rtl"
    # A passage without a location: its headings hold no empty parentheses.
    expect(page.locator("main h2")).to_have_text(["Cited passage", "After"])
    page.evaluate("() => { location.hash = '#/source/library/rtl'; }")
    heading = page.locator("main h1")
    expect(heading).to_have_text("تدوير المفاتيح")
    assert heading.evaluate(direction) == "rtl"
    page.evaluate(
        "() => { location.hash = '#/sources/library?title=' + encodeURIComponent('تدوير'); }"
    )
    title_cell = page.locator("#sources tbody td").nth(1)
    expect(title_cell).to_have_text("تدوير المفاتيح")
    assert title_cell.evaluate(direction) == "rtl"
    _shot(page, "33-rtl")
    page.context.close()
    _delete(console, "rtl", "1")


# --- findings of a black-box probe (session 38, probe G) --------------------------------------


def test_caller_metadata_of_any_shape_leaves_a_message_s_passage_readable(
    browser: Browser, console: Console
) -> None:
    # Probe G: `"attachments": "report.pdf"` or `[null]` in a caller's metadata made the
    # passage fail to open ("….map is not a function", "Cannot read properties of null").
    # A header that is not a string is left out, like an attachment that names no file.
    messages = [
        {"messageId": "<m1@x>", "from": "Ada <ada@x>", "date": 5, "subject": {"re": "x"},
         "attachments": "report.pdf"},
        {"messageId": "<m2@x>", "from": ["Bob"],
         "attachments": [None, 7, "loose.pdf", {"filename": 3}, {"filename": "minutes.pdf"}]},
    ]  # fmt: skip
    mail = {"id": "odd-mail", "revision": "1", "metadata": {"messages": messages}}
    cut = {"messages": "none", "messageCount": "many", "messagesTruncated": True}
    thread = {"id": "odd-thread", "revision": "1", "metadata": cut}
    with console.api() as api:
        for source, numbers in ((mail, (1, 2)), (thread, (9,))):
            chunks = [
                {"id": f"{source['id']}-{n}", "text": f"Message {n} about invoices.",
                 "location": {"documentId": f"<m{n}@x>"}}
                for n in numbers
            ]  # fmt: skip
            body = {"corpus": "library", "source": source, "chunks": chunks}
            indexed = api.post("/v1/retrieval/index", json=body)
            assert indexed.status_code == 200, indexed.text
    page, seen = _signed_in(browser, console)
    headers = page.locator("main h2:has-text('Message headers') + dl.facts")
    page.evaluate("() => { location.hash = '#/passage/library/odd-mail-1'; }")
    expect(page.locator("#cited")).to_have_text("Message 1 about invoices.")
    expect(headers.locator("dt")).to_have_text(["From", "Message-ID"])
    expect(headers.locator("dd")).to_have_text(["Ada <ada@x>", "<m1@x>"])
    _shot(page, "40-odd-metadata-string-attachments")
    page.evaluate("() => { location.hash = '#/passage/library/odd-mail-2'; }")
    expect(page.locator("#cited")).to_have_text("Message 2 about invoices.")
    expect(headers.locator("dt")).to_have_text(["Message-ID", "Attachments"])
    expect(headers.locator("dd")).to_have_text(["<m2@x>", "minutes.pdf"])
    _shot(page, "41-odd-metadata-mixed-attachments")
    page.evaluate("() => { location.hash = '#/passage/library/odd-thread-9'; }")
    expect(page.locator("#cited")).to_have_text("Message 9 about invoices.")
    expect(page.locator("main")).to_contain_text(
        "Not kept: this thread's header list was cut short."
    )
    expect(page.locator("#error")).to_be_hidden()
    assert seen.errors == []
    page.context.close()
    _delete(console, "odd-mail", "1")
    _delete(console, "odd-thread", "1")


def test_a_recorded_run_s_citations_link_into_the_corpus_it_searched(
    browser: Browser, console: Console
) -> None:
    # Probe G: a run over a second corpus, opened as `#/ask?run=ID` (a run id pasted, no
    # corpus) or with another corpus in the address, linked every citation into the form's
    # first corpus, where the passage "may no longer be indexed".
    source = {"id": "vault-note", "revision": "1", "title": "Vault note"}
    text = "The vault gate code is kept by the porter, wombatlantern."
    chunk = {"id": "vault-note-c1", "text": text}
    with console.api(console.vault_token) as api:
        body = {"corpus": VAULT, "source": source, "chunks": [chunk]}
        indexed = api.post("/v1/retrieval/index", json=body)
        assert indexed.status_code == 200, indexed.text
    page, seen = _open(browser, console)
    _sign_in(page, console.vault_token)
    expect(page.locator("#corpora")).to_be_visible()
    page.get_by_role("link", name="Ask").click()
    corpus = page.locator("#ask-form select[name=corpus]")
    expect(corpus).to_have_value("library")  # the form's first corpus is not the run's
    corpus.select_option(VAULT)
    page.locator("#ask-form select[name=searchMode]").select_option("lexical")
    page.get_by_label("Question").fill("Who keeps the wombatlantern gate code?")
    page.get_by_role("button", name="Ask").click()
    expect(page.locator("#run-phase")).to_have_text("completed", timeout=60_000)
    run_id = page.locator("#run-id").inner_text().removeprefix("run ")
    citations = page.locator("#answer a.citation")
    for address in (f"#/ask?run={run_id}", f"#/ask?run={run_id}&corpus=library"):
        page.evaluate("() => { location.hash = '#/corpora'; }")
        expect(page.locator("#corpora")).to_be_visible()
        page.evaluate("(address) => { location.hash = address; }", address)
        expect(page.locator("#run-phase")).to_have_text("completed")
        expect(citations).not_to_have_count(0)
        hrefs = citations.evaluate_all("(as) => as.map((a) => a.hash)")
        assert all(href.startswith(f"#/passage/{VAULT}/vault-note-c1?") for href in hrefs), hrefs
        expect(corpus).to_have_value(VAULT)
    _shot(page, "42-recorded-run-other-corpus")
    citations.first.click()
    expect(page.locator("#cited")).to_contain_text("wombatlantern")
    expect(page.locator("#error")).to_be_hidden()
    assert seen.errors == []
    page.context.close()
    with console.api(console.vault_token) as api:
        body = {"corpus": VAULT, "sourceId": "vault-note", "revision": "1"}
        assert api.post("/v1/retrieval/delete", json=body).status_code == 200


def test_bidi_controls_in_an_error_s_detail_are_shown_as_marks(
    browser: Browser, console: Console
) -> None:
    # Probe G: a provider's message "quota for user <U+202E>txt.exe<U+202C> exceeded" went into
    # the error box as it came, and read "quota for user exe.txt exceeded" reordered.
    page, seen = _signed_in(browser, console)
    _ask(page, QUESTION, provider="refusing", model="gpt-refused")
    expect(page.locator("#run-phase")).to_have_text("failed", timeout=60_000)
    error = page.locator("#error")
    expect(error).to_contain_text("PROVIDER_FAILED")
    expect(error).to_contain_text("quota for user U+202Etxt.exeU+202C exceeded")
    expect(error.locator(".control")).to_have_count(2)
    assert not page.evaluate(_RAW_CONTROLS, "#error")
    _shot(page, "43-error-bidi-marked")
    assert seen.errors == []
    page.context.close()

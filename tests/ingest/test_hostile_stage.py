"""A bounded hostile-document stage: mutated PDFs, operator bombs, pathological Markdown,
HTML, plain text and MIME, each through the real driver (parse workers, the local model,
SQLite) under a short ingest deadline. Every input is either indexed or refused with a typed
4xx within the deadline (plus the time to kill and answer), and a refusal leaves the previous
revision served."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from retrieval_host.core.errors import STATUS, ErrorCode, RetrievalError
from retrieval_host.core.models import SearchRequest
from retrieval_host.driver import IngestRequest
from tests.support import ingest_documents as docs
from tests.support.ingest_driver import CORPUS, NAMESPACE, Host, context

PDF, MD, EML, MBOX = "application/pdf", "text/markdown", "message/rfc822", "application/mbox"
HTML, TXT = "text/html", "text/plain"
DEADLINE_S = 3.0
# The deadline, then the kill, the store's rollback and a loaded host's scheduling.
ANSWER_BOUND_S = DEADLINE_S + 6.0
GUIDE = b"# Harbour guide\n\nBoats moor on the east quay. Fees are paid before noon.\n"


def _mutations(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    base = [docs.one_page_pdf(), docs.text_pdf([["Mooring", "Fees are paid at noon."]] * 2)]
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 12)):
            at = rng.randrange(len(data))
            op = rng.random()
            if op < 0.5:
                data[at] = rng.randrange(256)
            elif op < 0.8:
                del data[at : at + rng.randint(1, 64)]
            else:
                data[at:at] = data[rng.randrange(len(data)) :][: rng.randint(1, 256)]
        out.append(bytes(data))
    return out


def _markdown() -> list[bytes]:
    return [
        b"# a\n" * 20_000,
        b"#" * 6 + b" x\n" + b"> " * 5_000 + b"quote\n",
        b"- " * 20_000 + b"deep\n",
        b"```\n" + b"code line\n" * 20_000,  # an unclosed fence
        b"word " * 200_000,  # one 1 MB line
        b"[" * 50_000 + b"]" * 50_000,
        b"---\n" + b"key: value\n" * 5_000 + b"---\n# T\n\ntext\n",
        b"\n".join(b"Title %d\n===" % i for i in range(5_000)),
    ]


def _mime() -> list[tuple[bytes, str]]:
    return [
        (docs.random_body_message(60_000), EML),
        (docs.many_parts_message(900), EML),
        (docs.nested_message(15), EML),
        (docs.message("<p>" * 20_000, content_type="text/html; charset=utf-8"), EML),
        (docs.mbox(*[docs.message(f"m{i}\n", message_id=f"<{i}@x>") for i in range(2_000)]), MBOX),
        (docs.message(bytes(random.Random(3).randrange(256) for _ in range(30_000))), EML),
    ]


def _html() -> list[bytes]:
    return [
        b"<div>" * 400_000 + b"<p>deep</p>",  # deep nesting, past the element bound
        b"<b>" * 250_000,  # many tags, past the element bound
        b"<p>x</p>" * 150_000,  # under the bound: parsed or stopped by the deadline
        b"<a " * 200_000,  # unterminated tags: superlinear in the tokenizer
        b"<!--" + b"x" * 2_000_000,  # an unclosed comment
        b"<script>" + b"var a = '<p>';" * 100_000,  # an unclosed script
        b"<h1>" * 100_000 + b"t",  # headings that never close
        b"<p>" + b"&amp;" * 500_000 + b"</p>",  # a million references on one line
        b'<p title="' + b"v" * 4_000_000 + b'">x</p>',  # a huge attribute
    ]


def _text() -> list[bytes]:
    return [b"\n" * 2_000_000, b"word " * 400_000, b"a\n\n" * 300_000]


CASES: list[tuple[str, Callable[[], bytes], str]] = [
    *[(f"mutated-pdf-{i}", (lambda d=d: d), PDF) for i, d in enumerate(_mutations(13, 16))],
    *[(f"operator-bomb-{n}", (lambda n=n: docs.operator_bomb_pdf(n)), PDF)
      for n in (100_001, 300_000, 500_000)],
    ("operators-under-the-limits", lambda: docs.operator_heavy_pdf(20, 45_000), PDF),
    ("flate-bomb", docs.flate_bomb_pdf, PDF),
    *[(f"markdown-{i}", (lambda d=d: d), MD) for i, d in enumerate(_markdown())],
    *[(f"mime-{i}", (lambda d=d: d), mt) for i, (d, mt) in enumerate(_mime())],
    *[(f"html-{i}", (lambda d=d: d), HTML) for i, d in enumerate(_html())],
    *[(f"text-{i}", (lambda d=d: d), TXT) for i, d in enumerate(_text())],
]  # fmt: skip


@pytest.mark.slow
def test_hostile_documents_get_a_typed_answer_within_the_deadline(host: Host) -> None:
    first = host.driver.ingest_context(IngestRequest(CORPUS, "victim", MD, GUIDE), context())
    host.library.readable["victim"] = first.source.revision
    outcomes: dict[str, str] = {}
    for name, make, media_type in CASES:
        before = host.store.get_source(CORPUS, NAMESPACE, "victim")
        assert before is not None
        started = time.monotonic()
        refusal: ErrorCode | None = None
        try:
            result = host.driver.ingest_context(
                IngestRequest(CORPUS, "victim", media_type, make()),
                context(),
                deadline_s=DEADLINE_S,
            )
            outcomes[name] = result.status
            host.library.readable["victim"] = result.source.revision
        except RetrievalError as error:
            outcomes[name] = f"{error.code.value}/{error.reason}"
            refusal = error.code
        elapsed = time.monotonic() - started
        if refusal is not None:
            assert refusal is not ErrorCode.INTERNAL, name
            assert 400 <= STATUS[refusal] < 500, (name, refusal)
            after = host.store.get_source(CORPUS, NAMESPACE, "victim")
            assert after is not None and after.revision == before.revision, name
        assert elapsed < ANSWER_BOUND_S, (name, elapsed)
        hits = host.driver.search_context(SearchRequest(CORPUS, "boats", limit=1), context())
        assert hits.hits, name  # the victim is still searchable, whichever revision it has
    refused = [name for name, outcome in outcomes.items() if "/" in outcome]
    assert all("DOCUMENT_TOO_COMPLEX" in outcomes[n] for n in outcomes if "bomb-" in n)
    assert outcomes["operators-under-the-limits"] == "DOCUMENT_TOO_COMPLEX/deadline"
    # Past the element bound: `html-elements`, or the deadline first on a loaded machine.
    assert all(outcomes[n].startswith("DOCUMENT_TOO_COMPLEX/") for n in ("html-0", "html-1"))
    assert len(refused) >= len(CASES) // 2, outcomes

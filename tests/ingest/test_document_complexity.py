"""Documents that are small on the wire but expensive to parse or embed (issue 13, defect 2).

Each is refused with a typed 4xx (`DOCUMENT_TOO_COMPLEX` and a reason) well within the ingest
deadline, and the source's previous revision stays indexed and searchable. Upper bounds on time
are generous (the suite shares two cores with other work); what they catch is the unbounded
case (the operator bomb took ~40 s, the heading flood minutes of embedding).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from retrieval_host.core.errors import STATUS, ErrorCode, RetrievalError
from retrieval_host.core.models import SearchRequest
from retrieval_host.driver import IngestRequest
from retrieval_host.ingest import IngestLimits
from tests.support import ingest_documents as docs
from tests.support.ingest_driver import CORPUS, NAMESPACE, Host, context

GUIDE = b"# Harbour guide\n\nBoats moor on the east quay. Fees are paid before noon.\n"
SOURCE = "guide"
PDF, MD, EML = "application/pdf", "text/markdown", "message/rfc822"
# Far below the 40 s the operator bomb took, far above what a refusal costs on a loaded host.
REFUSAL_BOUND_S = 15.0


def _refused(
    host: Host, data: bytes, media_type: str, *, deadline_s: float | None = None
) -> tuple[RetrievalError, float]:
    first = host.driver.ingest_context(IngestRequest(CORPUS, SOURCE, MD, GUIDE), context())
    host.library.readable[SOURCE] = first.source.revision
    started = time.monotonic()
    with pytest.raises(RetrievalError) as caught:
        host.driver.ingest_context(
            IngestRequest(CORPUS, SOURCE, media_type, data), context(), deadline_s=deadline_s
        )
    elapsed = time.monotonic() - started
    stored = host.store.get_source(CORPUS, NAMESPACE, SOURCE)
    assert stored is not None and stored.revision == first.source.revision
    hits = host.driver.search_context(
        SearchRequest(CORPUS, "where do boats moor?", limit=1), context()
    ).hits
    assert [(hit.source.id, hit.source.revision) for hit in hits] == [
        (SOURCE, first.source.revision)
    ]
    return caught.value, elapsed


def test_an_operator_bomb_pdf_is_refused_as_too_complex_before_extraction(host: Host) -> None:
    bomb = docs.operator_bomb_pdf(500_000)
    assert len(bomb) < 8 * 1024
    error, elapsed = _refused(host, bomb, PDF)
    assert (error.code, error.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, "pdf-operators")
    assert 400 <= STATUS[error.code] < 500
    assert elapsed < REFUSAL_BOUND_S


def test_a_heading_flood_is_refused_by_passages_per_input_byte(host: Host) -> None:
    flood = b"# a\n" * 9000  # 36 KB that would make 9,000 one-word passages to embed
    error, elapsed = _refused(host, flood, MD)
    assert (error.code, error.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, "passages-per-byte")
    assert elapsed < REFUSAL_BOUND_S


def test_a_random_mail_body_that_outlasts_the_deadline_is_refused_at_the_deadline(
    host: Host,
) -> None:
    # 60 KB of random text: ~200 full passages, a minute of embedding on a busy host.
    body = docs.random_body_message(60_000)
    error, elapsed = _refused(host, body, EML, deadline_s=1.0)
    assert (error.code, error.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, "deadline")
    assert elapsed < REFUSAL_BOUND_S


@pytest.mark.parametrize(
    ("limits", "make", "reason"),
    [
        pytest.param(
            IngestLimits(max_content_stream_bytes=4096),
            lambda: docs.operator_bomb_pdf(2_000),
            "pdf-content-stream",
            id="content-stream-bytes",
        ),
        pytest.param(
            IngestLimits(max_page_operators=1_000),
            lambda: docs.operator_bomb_pdf(2_000),
            "pdf-operators",
            id="operators-per-page",
        ),
        pytest.param(
            IngestLimits(max_document_operators=3_000),
            lambda: docs.text_pdf([[f"line {i}" for i in range(40)]] * 40),
            "pdf-operators",
            id="operators-per-document",
        ),
        pytest.param(
            IngestLimits(passages_per_kib=1, min_passage_allowance=1),
            lambda: b"".join(b"# Part %d\n\nSome words.\n\n" % i for i in range(200)),
            "passages-per-byte",
            id="passages-per-kib",
        ),
    ],
)
def test_each_complexity_limit_is_a_typed_refusal(
    host: Host, limits: IngestLimits, make: Callable[[], bytes], reason: str
) -> None:
    host.driver.ingest_limits = limits
    data = make()
    media_type = PDF if data.startswith(b"%PDF") else MD
    error, _ = _refused(host, data, media_type)
    assert (error.code, error.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, reason)


def test_real_documents_pass_every_complexity_limit(host: Host) -> None:
    line = "Paragraph {}.{}: the harbour opens at seven."
    pages = [[line.format(p, i) for i in range(20)] for p in range(8)]
    for data, media_type in (
        (docs.text_pdf(pages), PDF),
        (b"".join(b"## Step %d\n\nDo the thing number %d.\n\n" % (i, i) for i in range(60)), MD),
    ):
        result = host.driver.ingest_context(
            IngestRequest(CORPUS, "real", media_type, data), context()
        )
        assert result.status == "indexed"

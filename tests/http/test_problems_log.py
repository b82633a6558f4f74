"""What the host's log says of a failure it answers with a 5xx."""

from __future__ import annotations

import logging

import apsw
import pytest

from retrieval_host.adapters.sqlite.schema import translated
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.http import ingest_stream
from retrieval_host.http.problems import error_response


def _raised(work: BaseException) -> RetrievalError:
    with pytest.raises(RetrievalError) as caught, translated("replacing a source"):
        raise work
    return caught.value


def test_a_store_failure_is_logged_with_the_drivers_own_first_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A black-box test filled the disk: the answer was 503 `sqlite-error` and the log said
    # only "the database failed while replacing a source", never that the disk was full.
    caplog.set_level(logging.WARNING, logger="retrieval_host.http")
    error = _raised(apsw.FullError("database or disk is full\nsecond line"))
    response = error_response(error, "req-1")
    assert response.status_code == 503
    assert b"disk is full" not in response.body  # the caller gets the detail alone
    [record] = [r for r in caplog.records if r.name == "retrieval_host.http"]
    message = record.getMessage()
    assert message.startswith("STORE_UNAVAILABLE: the database failed while replacing a source.")
    assert message.endswith("(FullError: database or disk is full)")


def test_an_upstream_failure_logs_no_words_of_its_own(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="retrieval_host.http")
    try:
        raise RetrievalError(ErrorCode.PROVIDER_FAILED, "quoted the passage", reason="x")
    except RetrievalError as exc:
        error_response(exc, "req-2")
    assert [r.getMessage() for r in caplog.records] == ["PROVIDER_FAILED: x"]


def test_a_streamed_ingest_failure_is_logged_with_its_cause_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A black-box test: the full disk was named for a JSON answer, not for the `ingest.failed`
    # event of a streamed ingest (the clients' default).
    caplog.set_level(logging.WARNING, logger="retrieval_host.http")
    failed = ingest_stream._failed(_raised(apsw.FullError("database or disk is full")), "req-3")
    assert failed["problem"]["code"] == "STORE_UNAVAILABLE"
    assert [r.getMessage() for r in caplog.records] == [
        "STORE_UNAVAILABLE: the database failed while replacing a source. "
        "(FullError: database or disk is full)"
    ]

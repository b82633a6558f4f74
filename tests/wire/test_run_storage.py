"""Run results are stored in a versioned format of their own, and the previous release's
records (the public wire JSON, no version) read back identically.

The run stores' handling of such records: `tests/adapters/sqlite/test_run_store_migration.py`
and `tests/adapters/postgres/test_run_store.py`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import RerankUsage
from retrieval_host.core.runs_model import (
    CitationReport,
    CitedSource,
    FinishReason,
    QuoteCheck,
    RunResult,
)
from retrieval_host.wire.run_storage import STORAGE_VERSION, decode_result, encode_result
from retrieval_host.wire.runs import result_to_json
from tests.support.run_records import OLD_PLAIN, OLD_PLAIN_JSON, OLD_RESULT, OLD_RESULT_JSON


def test_the_previous_release_records_read_back_identically() -> None:
    assert decode_result(OLD_RESULT_JSON) == OLD_RESULT
    assert decode_result(OLD_PLAIN_JSON) == OLD_PLAIN


def test_the_literal_old_records_are_what_the_previous_release_wrote() -> None:
    # The literals stay (they are the old records); what the wire added since is listed here:
    # receipts name their search mode (null for a receipt recorded before they did), usage
    # counts reranking (none in a run recorded before it existed), the host's citation
    # check is null for a run that did not ask for one, no fallback was taken, receipts
    # name their outcome (derived from what they recorded), and what was not kept is null
    # (how the answer ended, `finishReason`, too: unknown).
    for result, stored in ((OLD_RESULT, OLD_RESULT_JSON), (OLD_PLAIN, OLD_PLAIN_JSON)):
        expected = json.loads(stored)
        for receipt in expected["receipts"]:
            receipt["searchMode"] = None
            receipt["outcome"] = {
                "ok": "evidence" if receipt["sourceIds"] else "empty",
                "failed": "unavailable"
                if receipt["errorCode"] in ("PERMISSION_DENIED", "SOURCE_UNAVAILABLE")
                else "failed",
            }.get(receipt["status"], receipt["status"])
            receipt["rawQuery"] = None  # not kept before
            receipt["success"] = None
            receipt["extensions"] = {}
            receipt["effectError"] = None
            receipt["rawHits"] = []  # not kept before
        expected["usage"]["rerank"] = {"requests": 0, "documents": 0, "inputTokens": 0}
        expected["citations"] = None
        expected["fallbacks"] = []
        expected["state"] = None
        expected["verification"] = None
        expected["finishReason"] = None
        assert result_to_json(result) == expected


def test_a_stored_result_names_its_format_and_version_and_is_not_the_wire_json() -> None:
    stored = json.loads(encode_result(OLD_RESULT))
    assert (stored["format"], stored["version"]) == ("retrieval-host/run-result", 2)
    assert STORAGE_VERSION == 2
    assert "runId" not in stored and stored["run_id"] == "run_old"
    assert stored != result_to_json(OLD_RESULT)


@pytest.mark.parametrize("result", [OLD_RESULT, OLD_PLAIN])
def test_a_stored_result_reads_back_equal(result: RunResult) -> None:
    assert decode_result(encode_result(result)) == result
    replayed = replace(result, replayed=True)
    assert decode_result(encode_result(replayed)) == replayed
    checked = replace(
        result,
        citations=CitationReport(
            [CitedSource("c1", (QuoteCheck("as quoted", True), QuoteCheck("not there", False)))]
        ),
    )
    assert decode_result(encode_result(checked)) == checked


@pytest.mark.parametrize("finish", ["stop", "length", "content-filter", "other"])
def test_how_the_answer_ended_is_stored_and_a_record_written_before_reads_unknown(
    finish: FinishReason,
) -> None:
    ended = replace(OLD_RESULT, finish_reason=finish)
    stored = json.loads(encode_result(ended))
    assert stored["finish_reason"] == finish
    assert decode_result(json.dumps(stored)) == ended
    del stored["finish_reason"]  # a version-2 record of a host before runs kept it
    assert decode_result(json.dumps(stored)).finish_reason is None


def test_a_record_of_a_later_storage_version_is_refused() -> None:
    later = json.loads(encode_result(OLD_RESULT))
    later["version"] = STORAGE_VERSION + 1
    with pytest.raises(RetrievalError) as caught:
        decode_result(json.dumps(later))
    assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
    assert caught.value.reason == "record-version"
    assert "version 3" in caught.value.detail


def test_a_version_2_record_written_before_reranking_reads_as_no_reranking() -> None:
    # The previous main wrote version 2 without `usage.rerank`.
    stored = json.loads(encode_result(OLD_RESULT))
    del stored["usage"]["rerank"]
    assert decode_result(json.dumps(stored)).usage.rerank == RerankUsage()


def test_reranking_usage_survives_the_record() -> None:
    usage = replace(OLD_RESULT.usage, rerank=RerankUsage(requests=2, documents=80, input_tokens=9))
    result = replace(OLD_RESULT, usage=usage)
    assert decode_result(encode_result(result)).usage.rerank == usage.rerank

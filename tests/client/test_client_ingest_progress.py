"""A streamed ingest through both clients against a real host over TLS: progress events as
the document is parsed, embedded and committed, then the result; failures typed either way."""

from __future__ import annotations

import pytest

from retrieval_host_client import (
    IngestProgressEvent,
    InvalidDocumentError,
    PermissionDeniedError,
)
from tests.client.modes import ClientApi
from tests.support.host import CORPUS

# 400 sections: 400 passages with the default chunking (a section never shares a passage).
RULES = "\n\n".join(
    f"## Harbour rule {n}\n\nVessel {n} moors at berth {n % 17} and pays the fee listed for "
    f"its length and tonnage, rule {n}."
    for n in range(400)
)
PHASES = ("parse", "embed", "commit")


def test_a_400_passage_markdown_streams_its_progress_then_its_result(
    api: ClientApi, mode: str
) -> None:
    seen: list[IngestProgressEvent] = []
    result = api.ingest_context(
        RULES.encode(),
        corpus=CORPUS,
        source_id=f"{mode}-rules",
        media_type="text/markdown",
        on_progress=seen.append,
    )
    assert (result.status, result.chunk_count) == ("indexed", 400)

    phases = [event.phase for event in seen]
    assert phases == sorted(phases, key=PHASES.index), phases  # parse, then embed, then commit
    parse = [(e.passages_done, e.passages_total) for e in seen if e.phase == "parse"]
    assert parse == [(0, None), (400, 400)]
    embed = [e.passages_done for e in seen if e.phase == "embed"]
    assert embed == [0, 64, 128, 192, 256, 320, 384, 400]
    assert all(e.passages_total == 400 for e in seen if e.phase != "parse" or e.passages_done)
    assert [(e.phase, e.passages_done) for e in seen[-1:]] == [("commit", 400)]

    # The same document again: parsed, found identical, nothing embedded or committed.
    again: list[IngestProgressEvent] = []
    same = api.ingest_context(
        RULES.encode(),
        corpus=CORPUS,
        source_id=f"{mode}-rules",
        media_type="text/markdown",
        on_progress=again.append,
    )
    assert same.status == "unchanged"
    assert {e.phase for e in again} == {"parse"}


def test_a_failure_after_the_stream_started_is_the_typed_error(api: ClientApi, mode: str) -> None:
    seen: list[IngestProgressEvent] = []
    with pytest.raises(InvalidDocumentError) as caught:
        api.ingest_context(
            b"   \n\n  \n",
            corpus=CORPUS,
            source_id=f"{mode}-blank",
            media_type="text/markdown",
            on_progress=seen.append,
        )
    assert caught.value.code == "INVALID_DOCUMENT"
    assert caught.value.status == 422
    assert caught.value.request_id  # the stream's problem carries the request id


def test_a_refusal_before_parsing_is_a_plain_problem(api: ClientApi, mode: str) -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        api.ingest_context(
            b"# Note\n\nText.\n",
            corpus="no-such-corpus",
            source_id=f"{mode}-refused",
            media_type="text/markdown",
        )
    assert caught.value.status == 403


def test_one_json_answer_when_not_streamed(api: ClientApi, mode: str) -> None:
    seen: list[IngestProgressEvent] = []
    result = api.ingest_context(
        b"# Quay\n\nThe quay opens at dawn.\n",
        corpus=CORPUS,
        source_id=f"{mode}-quay-json",
        media_type="text/markdown",
        on_progress=seen.append,
        stream=False,
    )
    assert result.status == "indexed"
    assert seen == []


def test_metadata_given_at_ingest_is_what_search_filters_on(api: ClientApi, mode: str) -> None:
    for year in (2021, 2024):
        api.ingest_context(
            f"# Survey {year}\n\nThe breakwater survey of {year} found settling.\n".encode(),
            corpus=CORPUS,
            source_id=f"{mode}-survey-{year}",
            media_type="text/markdown",
            metadata={"kind": f"survey-{mode}", "year": year},
        )
    hits = api.search_context(
        corpus=CORPUS,
        query="breakwater survey",
        filters={"kind": f"survey-{mode}", "year": {"gt": 2022}},
    ).hits
    assert [h.source.id for h in hits] == [f"{mode}-survey-2024"]
    assert hits[0].metadata["year"] == 2024

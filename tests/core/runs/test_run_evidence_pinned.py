"""A run's evidence is pinned to the passages it read, not to the revision label alone: a label
deleted and written again with other text (or `r1` -> `r3` -> `r1`), or the same document cut
into other passages under the same ids, keeps its name, and an answer written from the old
passages is not served as if it were grounded in the new ones (black-box tests read such runs
back and replayed them, on SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses

import pytest

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import ChunkInput, DeleteRequest, IndexRequest, Location, SourceInfo
from retrieval_host.core.runs.evidence import reauthorize_manifest
from retrieval_host.core.runs_model import (
    RunCompleted,
    RunFailed,
    RunRequest,
    RunRetrieval,
)
from retrieval_host.wire.run_storage import decode_result, encode_result
from tests.support.run_engine import DOCS, RunWorld, acting_at

ALICE = RequestContext("alice")
QUESTION = "How long does the battery last?"


def _request(key: str | None = None) -> RunRequest:
    return RunRequest(
        provider="local",
        model="extractive",
        input=QUESTION,
        retrieval=RunRetrieval(corpus="library", source_ids=["battery"]),
        idempotency_key=key,
    )


def _write(world: RunWorld, revision: str, *texts: str, digest: str | None = None) -> None:
    world.service.index_context(
        IndexRequest(
            "library",
            SourceInfo("battery", revision, title="Battery"),
            [
                ChunkInput(f"battery-{i}", text, Location(page=1, start_line=i, end_line=i))
                for i, text in enumerate(texts, start=1)
            ],
            document_sha256=digest,
        ),
        ALICE,
    )
    world.acl.search["battery"] = revision


def _refused(call: object) -> None:
    with pytest.raises(RetrievalError) as refused:
        call()  # type: ignore[operator]
    assert refused.value.code is ErrorCode.SOURCE_UNAVAILABLE


OTHER = "The measured battery lifetime was 90 charge cycles at 25 degrees."


def test_a_label_recreated_with_other_text_makes_its_runs_unavailable(
    run_world: RunWorld,
) -> None:
    first = run_world.engine.run(_request("pinned"), ALICE)
    assert [s.source_id for s in first.sources] == ["battery"]
    assert first.sources[0].text_sha256  # kept, and kept by the run store
    assert run_world.engine.get_run(first.run_id, ALICE).result == first
    run_world.service.delete_context(DeleteRequest("library", "battery", "r1"), ALICE)
    _write(run_world, "r1", OTHER)
    _refused(lambda: run_world.engine.get_run(first.run_id, ALICE))
    _refused(lambda: run_world.engine.run(_request("pinned"), ALICE))
    # The same text written back at the label: the answer is grounded again.
    run_world.service.delete_context(DeleteRequest("library", "battery", "r1"), ALICE)
    _write(run_world, "r1", DOCS["battery"])
    assert run_world.engine.get_run(first.run_id, ALICE).result == first
    assert run_world.engine.run(_request("pinned"), ALICE).replayed


def test_a_label_rolled_back_to_with_other_text_makes_its_runs_unavailable(
    run_world: RunWorld,
) -> None:
    first = run_world.engine.run(_request("rolled"), ALICE)
    _write(run_world, "r3", "Capacity is not measured.")
    _write(run_world, "r1", OTHER)  # labels are not an order: r1 is current again
    _refused(lambda: run_world.engine.get_run(first.run_id, ALICE))
    # A record made before digests were kept is checked by its label, as before.
    legacy = dataclasses.replace(
        first,
        sources=[dataclasses.replace(s, text_sha256=None) for s in first.sources],
    )
    assert decode_result(encode_result(legacy)) == legacy
    reauthorize_manifest(run_world.service, legacy, ALICE)  # the label is current


def test_a_label_recreated_during_a_run_fails_it_instead_of_recording_it(
    run_world: RunWorld,
) -> None:
    def recreate() -> None:
        run_world.service.delete_context(DeleteRequest("library", "battery", "r1"), ALICE)
        _write(run_world, "r1", OTHER)

    events, sink = acting_at("recording", recreate)
    run_world.engine.execute(_request(), ALICE, sink)
    assert isinstance(events[-1], RunFailed), events[-1]
    assert events[-1].error.code is ErrorCode.SOURCE_UNAVAILABLE
    record = run_world.runs.get(events[-1].run_id)
    assert record is not None and record.status == "failed" and record.result is None
    # Untouched, the same run records.
    events.clear()
    run_world.engine.execute(_request(), ALICE, events.append)
    assert isinstance(events[-1], RunCompleted), events[-1]


@pytest.mark.parametrize("digest", [None, "a" * 64])
def test_the_same_document_cut_otherwise_under_the_same_ids_makes_its_runs_unavailable(
    run_world: RunWorld, digest: str | None
) -> None:
    # A black-box test: the document's digest (joined passages, or one the client sends) did
    # not change, but the cited id now held another part of it, and the run read back 200.
    first_half, second_half = DOCS["battery"].split(". ", 1)
    _write(run_world, "r2", f"{first_half}.", second_half, digest=digest)
    first = run_world.engine.run(_request("cut"), ALICE)
    assert {s.id for s in first.sources} == {"battery-1", "battery-2"}
    run_world.service.delete_context(DeleteRequest("library", "battery", "r2"), ALICE)
    _write(run_world, "r2", first_half, f". {second_half}", digest=digest)
    _refused(lambda: run_world.engine.get_run(first.run_id, ALICE))
    _refused(lambda: run_world.engine.run(_request("cut"), ALICE))

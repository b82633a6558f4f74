"""Metadata deeper than the host now accepts, stored by an earlier release, is still served.

A black-box test upgraded a store holding metadata 300 levels deep (written in-process) and
190-198 levels (over HTTP) before the 32-level bound existed: every listing, source, passage
and search answer holding it was a 500 (the reply could not be serialized) or failed in the
client's parser (`ProtocolError`). Replies now show such containers, from level 33 on, as a
marker string."""

from __future__ import annotations

from pydantic import JsonValue

from retrieval_host.core import inspection
from retrieval_host.core.validation import DEEPER_THAN_SHOWN, MAX_METADATA_DEPTH, shown_metadata
from retrieval_host.wire import retrieval as wire_retrieval
from retrieval_host_client import models as wire


def _nested(depth: int) -> dict[str, JsonValue]:
    value: JsonValue = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"x": value, "flat": 1}


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def test_metadata_within_the_bound_is_shown_as_stored() -> None:
    stored = _nested(MAX_METADATA_DEPTH)
    assert shown_metadata(stored) is stored


def test_deeper_metadata_stored_earlier_is_cut_at_the_bound_and_parses_in_the_client() -> None:
    for depth in (MAX_METADATA_DEPTH + 1, 198, 300, 900):
        stored = _nested(depth)
        shown = shown_metadata(stored)
        assert _depth(shown) == MAX_METADATA_DEPTH and shown["flat"] == 1
        inner: object = shown["x"]
        while isinstance(inner, list):
            inner = inner[0]
        assert inner == DEEPER_THAN_SHOWN
        summary = inspection.SourceSummary("deep", "r1", "", stored, chunk_count=1, bytes=10)
        reply = wire_retrieval.sources_response(inspection.SourcePage([summary], None))
        body = reply.model_dump_json(by_alias=True)  # raised at 300 levels: a 500
        parsed = wire.SourcesResponse.model_validate_json(body)  # the client's own parse
        assert parsed.sources[0].metadata == shown

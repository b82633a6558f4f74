"""The in-process API is what `retrieval_host.__all__` names: pinned here, so adding to or
removing from it is a visible decision (httpx pins its surface the same way)."""

from __future__ import annotations

import inspect

import retrieval_host

PUBLIC = {
    # the application boundary
    "Driver", "IngestRequest", "RequestContext", "CancelToken",
    "RetrievalService", "Corpus", "CommitEvent", "RunEngine",
    # an application's own retrievals on the same lifecycle (`Driver.retrieve`)
    "Retrieval", "Retrieved", "Effect",
    # retrieval requests and results
    "SearchRequest", "SearchResult", "IndexRequest", "IndexResult", "DeleteRequest",
    "DeleteResult", "ChunkInput", "SourceInfo", "Location", "Hit", "SourceRef", "Scope",
    "EmbeddingUsage",
    # inspection: what a subject may see of its corpora, sources and passages
    "CorpusSummary", "SourcePage", "SourceSummary", "SourceDetail", "PassageSummary", "Passage",
    # errors
    "ErrorCode", "RetrievalError",
    # what an application plugs in
    "ANY_REVISION", "AuthorizationRequest", "Authorizer", "Grant", "CapacityLimits",
    "EmbeddingAdapter", "VectorStore", "GenerationProvider", "RunStore",
    # grounded runs
    "RunRequest", "RunRetrieval", "OutputArtifactSpec", "RunResult", "RunEvent", "RunStarted",
    "RunProgress", "RunDelta", "RunCompleted", "RunFailed", "RunRecord",
    # ingestion
    "ChunkingSettings", "IngestLimits", "PreparedDocument", "prepare_document",
    "media_type_for_path", "ingest_paths", "BatchReport", "BatchItem", "JournalInUseError",
    # configuration
    "HostSettings", "load_settings", "SettingsError",
    # the citation check: the client package's own, re-exported (SPEC 3.10)
    "validate_source_citations", "InvalidCitationError",
}  # fmt: skip
FROM_THE_CLIENT = {"validate_source_citations", "InvalidCitationError"}


def test_all_names_exactly_the_pinned_in_process_api() -> None:
    assert set(retrieval_host.__all__) == PUBLIC
    assert len(retrieval_host.__all__) == len(PUBLIC)  # no name listed twice
    assert retrieval_host.__all__ == sorted(retrieval_host.__all__, key=_ruff_order)


def test_every_exported_name_resolves_and_its_classes_and_functions_are_documented() -> None:
    for name in retrieval_host.__all__:
        member = getattr(retrieval_host, name)
        if inspect.isclass(member) or inspect.isfunction(member):
            home = "retrieval_host_client" if name in FROM_THE_CLIENT else "retrieval_host."
            assert member.__module__.startswith(home), name
            assert inspect.getdoc(member), f"{name} has no docstring"


def test_the_http_layer_and_the_serving_wing_are_not_part_of_it() -> None:
    for name in retrieval_host.__all__:
        module = getattr(getattr(retrieval_host, name), "__module__", "") or ""
        assert not module.startswith(("retrieval_host.http", "retrieval_host.serving")), name


def _ruff_order(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: SCREAMING_CASE first, then CamelCase, then the rest.
    if name.isupper():
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)

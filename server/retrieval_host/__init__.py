"""retrieval-host: authenticated HTTPS retrieval, authorized search and grounded runs.

The in-process API, for applications that embed the host or write its application factory:

    from retrieval_host import Corpus, Driver, RequestContext, RetrievalService, SearchRequest

    driver = Driver(RetrievalService([Corpus(...)]))
    hits = driver.search_context(SearchRequest("library", "rotate a token"),
                                 RequestContext(subject="alice")).hits

Every operation is synchronous and asks the corpus's authorizer; errors are `RetrievalError`
with a stable `ErrorCode`. The HTTP layer (`retrieval_host.http`) and the serving wing
(`retrieval_host.serving`: CLI, uvicorn, workers, TLS) are built on this API and are not part
of it. The citation check (`validate_source_citations`) is the
client package's own, re-exported so both sides run the same code. `__all__` is pinned by
`tests/test_exported_members.py`.
"""

from retrieval_host.batch import BatchItem, BatchReport, JournalInUseError, ingest_paths
from retrieval_host.citations import InvalidCitationError, validate_source_citations
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.inspection import (
    CorpusSummary,
    Passage,
    PassageSummary,
    SourceDetail,
    SourcePage,
    SourceSummary,
)
from retrieval_host.core.lifecycle import Effect, Retrieval, Retrieved
from retrieval_host.core.models import (
    ChunkInput,
    DeleteRequest,
    DeleteResult,
    EmbeddingUsage,
    Hit,
    IndexRequest,
    IndexResult,
    Location,
    Scope,
    SearchRequest,
    SearchResult,
    SourceInfo,
    SourceRef,
)
from retrieval_host.core.ports import (
    ANY_REVISION,
    AuthorizationRequest,
    Authorizer,
    CapacityLimits,
    EmbeddingAdapter,
    Grant,
    VectorStore,
)
from retrieval_host.core.run_ports import GenerationProvider, RunRecord, RunStore
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.runs_model import (
    OutputArtifactSpec,
    RunCompleted,
    RunDelta,
    RunEvent,
    RunFailed,
    RunProgress,
    RunRequest,
    RunResult,
    RunRetrieval,
    RunStarted,
)
from retrieval_host.core.service import CommitEvent, Corpus, RetrievalService
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.ingest import (
    ChunkingSettings,
    IngestLimits,
    PreparedDocument,
    media_type_for_path,
    prepare_document,
)
from retrieval_host.settings import HostSettings, SettingsError, load_settings

__all__ = [
    "ANY_REVISION",
    "AuthorizationRequest",
    "Authorizer",
    "BatchItem",
    "BatchReport",
    "CancelToken",
    "CapacityLimits",
    "ChunkInput",
    "ChunkingSettings",
    "CommitEvent",
    "Corpus",
    "CorpusSummary",
    "DeleteRequest",
    "DeleteResult",
    "Driver",
    "Effect",
    "EmbeddingAdapter",
    "EmbeddingUsage",
    "ErrorCode",
    "GenerationProvider",
    "Grant",
    "Hit",
    "HostSettings",
    "IndexRequest",
    "IndexResult",
    "IngestLimits",
    "IngestRequest",
    "InvalidCitationError",
    "JournalInUseError",
    "Location",
    "OutputArtifactSpec",
    "Passage",
    "PassageSummary",
    "PreparedDocument",
    "RequestContext",
    "Retrieval",
    "RetrievalError",
    "RetrievalService",
    "Retrieved",
    "RunCompleted",
    "RunDelta",
    "RunEngine",
    "RunEvent",
    "RunFailed",
    "RunProgress",
    "RunRecord",
    "RunRequest",
    "RunResult",
    "RunRetrieval",
    "RunStarted",
    "RunStore",
    "Scope",
    "SearchRequest",
    "SearchResult",
    "SettingsError",
    "SourceDetail",
    "SourceInfo",
    "SourcePage",
    "SourceRef",
    "SourceSummary",
    "VectorStore",
    "ingest_paths",
    "load_settings",
    "media_type_for_path",
    "prepare_document",
    "validate_source_citations",
]

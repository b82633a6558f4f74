"""An application's own retrieval on the host's lifecycle, in-process: an exact-phrase lookup
(error codes, part numbers: what semantic search blurs), run through the same steps as the
built-in search (prepare, assert input, authorize, execute, assert result, effects) by
`Driver.retrieve` (local model, SQLite)."""

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError, permission_denied
from retrieval_host.core.models import (
    ChunkInput,
    Hit,
    IndexRequest,
    JSONValue,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import Driver

REVISIONS = {"pump-manual": "r1", "field-log": "r1", "hr-memo": "r1"}
TEXTS = {
    "pump-manual": "Error E-417 means the intake valve is stuck; close it and restart the pump.",
    "field-log": "Tuesday: E-417 again on pump 3, cleared by restarting. E-412 seen once.",
    "hr-memo": "Quarterly reviews (form E-417-HR) are due on Friday.",
}


def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    if request.operation == "index" and context.subject == "indexer":
        return Grant("plant-7", {sid: ANY_REVISION for sid in request.source_ids or ()})
    if request.operation == "search" and context.subject == "technician":
        # The HR memo is not theirs to read.
        return Grant("plant-7", {k: v for k, v in REVISIONS.items() if k != "hr-memo"})
    return None


@dataclass(frozen=True)
class Phrase:
    corpus: str
    text: str


class PhraseLookup:
    """Passages holding the exact phrase (case ignored) among those the caller may read."""

    name = "phrase_lookup"

    def __init__(self, service: RetrievalService) -> None:
        self.service = service

    def prepare(self, request: Phrase, context: RequestContext) -> Phrase:
        return Phrase(request.corpus, " ".join(request.text.split()))

    def assert_input(self, prepared: Phrase) -> None:
        if not 3 <= len(prepared.text) <= 200:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "a phrase holds 3 to 200 characters.")

    def authorize(self, prepared: Phrase, context: RequestContext) -> Grant:
        grant = self.service.current_grant(prepared.corpus, None, context)
        if grant is None:
            raise permission_denied()
        return grant

    def execute(self, prepared: Phrase, grant: Grant, context: RequestContext) -> list[Hit]:
        # The lexical ranking finds candidates (itself authorized); the phrase decides.
        found = self.service.search_context(
            SearchRequest(prepared.corpus, prepared.text, limit=50, mode="lexical"), context
        )
        wanted = prepared.text.lower()
        return [h for h in found.hits if wanted in " ".join(h.text.split()).lower()]

    def assert_result(
        self, prepared: Phrase, grant: Grant, found: list[Hit], context: RequestContext
    ) -> list[Hit]:
        # Asked again after the read: a revision no longer granted is not returned.
        now = self.service.current_grant(prepared.corpus, None, context)
        allowed = {} if now is None or now.namespace != grant.namespace else now.sources
        return [h for h in found if allowed.get(h.source.id) == h.source.revision]


class CountBySource:
    """Effect: how many passages of each source matched, kept with the result."""

    name = "by_source"

    def after(self, result: list[Hit], context: RequestContext) -> JSONValue:
        counts: dict[str, JSONValue] = {}
        for hit in result:
            previous = counts.get(hit.source.id, 0)
            counts[hit.source.id] = (previous if isinstance(previous, int) else 0) + 1
        return counts


state = Path(tempfile.mkdtemp(prefix="retrieval-custom-"))
atexit.register(shutil.rmtree, state, ignore_errors=True)  # a demo: nothing kept
store = SqliteVectorStore.open(state / "plant.db")
service = RetrievalService([Corpus("plant", "passages-v1", LocalEmbedding(), store, authorize)])
driver = Driver(service)
technician = RequestContext(subject="technician")
for source_id, text in TEXTS.items():
    service.index_context(
        IndexRequest(
            "plant", SourceInfo(source_id, "r1", source_id), [ChunkInput(source_id, text)]
        ),
        RequestContext(subject="indexer"),
    )

lookup = PhraseLookup(service)
found = driver.retrieve(lookup, Phrase("plant", "  e-417 "), technician, effects=[CountBySource()])
for hit in found.result:
    print(f"{hit.source.id}: {hit.text}")
print("extensions:", dict(found.extensions))
for subject, phrase in (("visitor", "E-417"), ("technician", "E4")):
    try:
        driver.retrieve(lookup, Phrase("plant", phrase), RequestContext(subject=subject))
    except RetrievalError as error:
        print(f"{subject} {phrase!r}: {error.code.value}")
store.close()

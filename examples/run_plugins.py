"""A grounded run with the application's own plug-ins, in-process: a retriever, an effect, a
context policy and a verifier around the built-in lifecycle (local model, SQLite, the offline
extractive provider)."""

import atexit
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.provider_extractive import ExtractiveProvider
from retrieval_host.adapters.sqlite import SqliteRunStore, SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import (
    ChunkInput,
    Hit,
    IndexRequest,
    JSONValue,
    SearchRequest,
    SearchResult,
    SourceInfo,
)
from retrieval_host.core.ports import AuthorizationRequest, Grant
from retrieval_host.core.run_ports import EvidencePassage, Verdict
from retrieval_host.core.runs import RunEngine
from retrieval_host.core.runs_model import Receipt, RunRequest, RunRetrieval
from retrieval_host.core.service import Corpus, RetrievalService

REVISIONS = {"battery-study": "r1", "solar-notes": "r1", "wind-memo": "r1"}
TEXTS = {
    "battery-study": "The measured battery lifetime was 1,200 charge cycles at 25 degrees.",
    "solar-notes": "Panel output fell by half a percent per year over the ten-year survey.",
    "wind-memo": "Turbine maintenance is scheduled every six months.",
}


def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    return Grant("workspace-1", REVISIONS) if context.subject == "user-123" else None


class MemosLast:
    """Retriever: the built-in search, with memos moved to the end. The host re-reads every
    hit under the caller's grant; only this order is taken from it."""

    def __init__(self, service: RetrievalService) -> None:
        self.service = service

    def search(self, request: SearchRequest, context: RequestContext) -> SearchResult:
        found = self.service.search_context(request, context)
        hits = sorted(found.hits, key=lambda h: h.source.id.endswith("-memo"))
        return SearchResult(hits, found.truncated, found.retrieved_at, found.scope, found.usage)


class Audit:
    """Effect: what each successful search found, kept in its receipt's extensions."""

    name = "audit"

    def after(self, receipt: Receipt, hits: Sequence[Hit]) -> JSONValue:
        return {"query": receipt.query, "sources": [h.source.id for h in hits]}


class TopTwo:
    """Context policy: the model reads at most two passages."""

    def select(
        self, question: str, evidence: Sequence[EvidencePassage]
    ) -> Sequence[EvidencePassage]:
        return list(evidence)[:2]


class CitesEnough:
    """Verifier: an answer citing fewer than two passages goes to a person."""

    def verify(self, question: str, answer: str, evidence: Sequence[EvidencePassage]) -> Verdict:
        return Verdict("accept" if answer.count("[source:") >= 2 else "needs-review")


state = Path(tempfile.mkdtemp(prefix="retrieval-plugins-"))
atexit.register(shutil.rmtree, state, ignore_errors=True)  # a demo: nothing kept
store = SqliteVectorStore.open(state / "library.db")
runs = SqliteRunStore.open(state / "runs.db")
service = RetrievalService([Corpus("library", "passages-v1", LocalEmbedding(), store, authorize)])
context = RequestContext(subject="user-123")
for source_id, text in TEXTS.items():
    service.index_context(
        IndexRequest(
            "library", SourceInfo(source_id, "r1", source_id), [ChunkInput(source_id, text)]
        ),
        context,
    )

engine = RunEngine(
    service,
    {"local": ExtractiveProvider()},
    runs,
    retriever=MemosLast(service),
    effects=[Audit()],
    context_policy=TopTwo(),
    verifier=CitesEnough(),
)
result = engine.run(
    RunRequest(
        "local",
        "extractive",
        "How long do batteries, panels and turbines last?",
        RunRetrieval("library", limit=3),
    ),
    context,
)
print(result.text.rstrip())
print("manifest:", [s.source_id for s in result.sources])
print("extensions:", dict(result.receipts[0].extensions))
print("verification:", result.verification)
runs.close()
store.close()

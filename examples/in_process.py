"""Index three sources with the local model into SQLite, search them, print every hit field."""

import atexit
import shutil
import tempfile
from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.ports import AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService

# The application owns permissions: here, one subject may read exactly these revisions.
REVISIONS = {"battery-study": "r1", "solar-notes": "r1", "wind-memo": "r1"}


def authorize(request: AuthorizationRequest, context: RequestContext) -> Grant | None:
    if context.subject != "user-123":
        return None
    return Grant(namespace="workspace-1", sources=REVISIONS)


state = Path(tempfile.mkdtemp(prefix="retrieval-example-"))
atexit.register(shutil.rmtree, state, ignore_errors=True)  # a demo: nothing kept
store = SqliteVectorStore.open(state / "library.db")
service = RetrievalService([Corpus("library", "passages-v1", LocalEmbedding(), store, authorize)])
context = RequestContext(subject="user-123")
texts = {
    "battery-study": "The measured battery lifetime was 1,200 charge cycles at 25 °C.",
    "solar-notes": "Panel output fell by 0.5 % per year over the ten-year survey.",
    "wind-memo": "Turbine maintenance is scheduled every six months.",
}
for source_id, text in texts.items():
    service.index_context(
        IndexRequest(
            corpus="library",
            source=SourceInfo(id=source_id, revision="r1", title=source_id),
            chunks=[
                ChunkInput(f"{source_id}-p1", text, Location(page=1, start_line=1, end_line=1))
            ],
        ),
        context,
    )

result = service.search_context(
    SearchRequest(corpus="library", query="How long does the battery last?", limit=2), context
)
for hit in result.hits:
    print(f"[source:{hit.chunk_id}] score={hit.score:.3f}")
    print(f"  source={hit.source.id}@{hit.source.revision} location={hit.location}")
    print(f"  text={hit.text!r}")
    print(f"  documentSha256={hit.document_sha256}")
    print(f"  retrievedAt={hit.retrieved_at} scope={hit.scope}")
print(f"truncated={result.truncated} embedding={result.usage}")
store.close()

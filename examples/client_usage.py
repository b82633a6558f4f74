"""Use the typed client against the quickstart host: discover, search, ingest, run, delete.

Start the host with `retrieval-host quickstart`, then run this from the same directory (the
one holding `state/`): `python examples/client_usage.py [BASE_URL]`.
"""

import asyncio
import sys
from pathlib import Path

from retrieval_host_client import (
    AsyncClient,
    Client,
    RunDeltaEvent,
    RunProgressEvent,
    RunRequest,
    RunRetrieval,
    SourceUnavailableError,
    validate_source_citations,
)

BASE_URL = sys.argv[1] if len(sys.argv) > 1 else "https://127.0.0.1:8443"
STATE = Path("state")
TOKEN = (STATE / "token").read_text(encoding="utf-8").strip()
CA_BUNDLE = STATE / "ca.pem"  # the quickstart's own CA: trust it, and only for this host
QUESTION = "How do I rotate a token?"

with Client(BASE_URL, token=TOKEN, ca_bundle=CA_BUNDLE) as client:
    info = client.discover()
    print(f"{info.name} protocol v{info.version}: {', '.join(info.capabilities)}")

    found = client.search_context(corpus="library", query=QUESTION, limit=2)
    for hit in found.hits:
        where = f"lines {hit.location.start_line}-{hit.location.end_line}"
        if hit.location.page is not None:
            where = f"page {hit.location.page}, {where}"
        print(f"[source:{hit.chunk_id}] {hit.source.id}@{hit.source.revision[:12]} ({where})")
        # `score` ranks the hits (hybrid: the fused score); `scores` has each ranking's own.
        cosine = "-" if hit.scores.dense is None else f"{hit.scores.dense:.2f}"
        print(f"  score {hit.score:.2f} (cosine {cosine}): {hit.text[:80]!r}")

    note = client.ingest_context(
        STATE / "my-note.md", corpus="library", source_id="my-note", revision="1"
    )
    print(f"my-note revision {note.source.revision}: {note.status}, {note.chunk_count} passages")

    request = RunRequest(
        provider="local",  # the quickstart's offline extractive provider: no model account
        model="extractive",
        input=QUESTION,
        retrieval=RunRetrieval(corpus="library", mode="before"),
    )
    with client.stream_run(request) as stream:
        for event in stream:
            if isinstance(event, RunProgressEvent):
                print(f"  ... {event.phase}")
            elif isinstance(event, RunDeltaEvent):
                print(event.text, end="")
        result = stream.until_done()  # the result, or the failed run's typed error
    print()
    allowed = [source.id for source in result.sources]
    cited = validate_source_citations(result.text, allowed, require_citation=True)
    print(f"run {result.run_id} cites {cited}")
    print(f"recorded as: {client.get_run(result.run_id).status}")

    deleted = client.delete_context(corpus="library", source_id="my-note", revision="1")
    print(f"deleted {deleted.deleted_chunks} passages of my-note")
    try:
        client.search_context(corpus="library", query="my first note", source_ids=["my-note"])
    except SourceUnavailableError as error:
        print(f"my-note is gone: {error.code} (HTTP {error.status})")


async def search_concurrently() -> None:
    """The same API with asyncio: two searches in flight at once."""
    async with AsyncClient(BASE_URL, token=TOKEN, ca_bundle=CA_BUNDLE) as client:
        first, second = await asyncio.gather(
            client.search_context(corpus="library", query=QUESTION, limit=1),
            client.search_context(corpus="library", query="How is a corpus reindexed?", limit=1),
        )
        for response in (first, second):
            print(f"async: [source:{response.hits[0].chunk_id}] {response.hits[0].source.id}")


asyncio.run(search_concurrently())

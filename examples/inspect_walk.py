"""See what is indexed: list what a token may search, inspect a source, open a saved citation,
then delete the source by the revision its listing shows.

Against the quickstart host, from the directory that holds `state/`:
RETRIEVAL_HOST_TOKEN=$(cat state/token) python examples/inspect_walk.py \
    https://127.0.0.1:8443 state/ca.pem
"""

import sys

from retrieval_host_client import Client, SourceUnavailableError

BASE_URL, CA_BUNDLE = sys.argv[1], sys.argv[2]
CORPUS = "library"

with Client(BASE_URL, ca_bundle=CA_BUNDLE) as client:  # the token: RETRIEVAL_HOST_TOKEN
    # 1. List: the corpora this token may search, then every source its subject may see, at
    #    the revision a delete names (the iterator fetches the pages as it goes).
    for corpus in client.list_corpora():
        print(
            f"{corpus.id}: {corpus.sources} sources, {corpus.passages} passages, "
            f"{corpus.bytes} bytes; this token may {', '.join(corpus.operations)}"
        )
    listing = {source.id: source for source in client.list_sources(CORPUS)}
    for source in listing.values():
        print(f"  {source.id} @ {source.revision}: {source.chunk_count} passages")

    # 2. Search, and keep what an answer's citation carries: the corpus and the chunk id.
    hit = client.search_context(corpus=CORPUS, query="How do I rotate a token?").hits[0]
    citation = (CORPUS, hit.chunk_id)

    # 3. Inspect the cited source: its passages, and where in the document each one is.
    shown = client.get_source(CORPUS, hit.source.id)
    for listed_passage in shown.passages:
        where = listed_passage.location.model_dump(exclude_none=True)
        print(f"  {listed_passage.chunk_id}: {where}, {listed_passage.bytes} bytes")

    # 4. Navigate the citation later: the same passage, authorized again when it is read.
    cited = client.get_passage(*citation)
    assert (cited.text, cited.source) == (hit.text, hit.source)
    print(f"cited {cited.source.id}@{cited.source.revision}: {cited.text[:60]!r}")

    # 5. Delete the source by the revision the listing showed; the citation goes with it.
    listed = listing[hit.source.id]
    deleted = client.delete_context(corpus=CORPUS, source_id=listed.id, revision=listed.revision)
    print(f"deleted {deleted.deleted_chunks} passages of {listed.id}@{listed.revision}")
    try:
        client.get_passage(*citation)
    except SourceUnavailableError:
        print("the citation is unavailable now: its revision is gone")

"""Passage context end to end: a document's title and section path take part in each passage's
embedding and lexical text, never in what is stored and cited, and corpora made before it
keep working as they were."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import (
    ChunkInput,
    IndexRequest,
    JSONScalar,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from retrieval_host.driver import IngestRequest
from retrieval_host.ingest import ChunkingSettings, prepare_document
from tests.support.ingest_driver import CORPUS, Host, context, dump_index, make_host

SMALL: dict[str, JSONScalar] = {"scheme": "rh-ingest/1", "max_tokens": 48, "overlap_tokens": 0}
GUIDE = b"""# Keeping a coastal beacon

## The lamp

The lamp turns once every ten seconds and its beam reaches twenty nautical miles on a clear
night. Its rotation is driven by a clockwork weight that the keeper winds at dusk.

The bulb is changed every spring. A spare bulb is kept in the cabinet beside the stairs, with
the gloves that keep skin oil off the glass.

The lens is polished weekly with a soft cloth and alcohol; scratches scatter the beam and
shorten its reach.

## The fog horn

In fog the horn sounds twice a minute. Its compressor is started by hand.
"""


def ingest(host: Host, source_id: str, data: bytes = GUIDE) -> str:
    result = host.driver.ingest_context(
        IngestRequest(CORPUS, source_id, "text/markdown", data), context()
    )
    host.library.readable[source_id] = result.source.revision
    return result.status


def lexical_hits(host: Host, query: str) -> list[str]:
    result = host.driver.search_context(
        SearchRequest(CORPUS, query, limit=50, mode="lexical"), context()
    )
    return [h.text for h in result.hits]


def test_every_passage_is_embedded_with_its_title_and_section(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    host = make_host(tmp_path / "index.db", local_embedding, chunking=SMALL)
    try:
        assert host.corpus.chunking == {**SMALL, "context": "title-sections"}
        ingest(host, "beacon")
        result = host.driver.search_context(
            SearchRequest(CORPUS, "lamp bulb lens horn", limit=50, mode="dense"), context()
        )
        passages = sorted(result.hits, key=lambda h: h.location.start_line or 0)
        assert len(passages) >= 4
        lines = GUIDE.decode().split("\n")
        for hit in passages:
            # Stored and cited: the exact lines of the document, nothing added.
            start, end = hit.location.start_line, hit.location.end_line
            assert start is not None and end is not None
            assert hit.text.split("\n")[0] in lines[start - 1]
            assert "Keeping a coastal beacon >" not in hit.text
            embedded = next(
                t for t in host.embedding.texts if t == hit.text or t.endswith(f"\n\n{hit.text}")
            )
            if hit.text.startswith("# Keeping a coastal beacon\n\n## The lamp"):
                assert embedded == hit.text  # it opens with its title and heading
            elif hit.text.startswith("## The fog horn"):
                assert embedded == f"Keeping a coastal beacon\n\n{hit.text}"
            else:
                section = "The fog horn" if "horn" in hit.text else "The lamp"
                assert embedded == f"Keeping a coastal beacon > {section}\n\n{hit.text}"
            # Its own text never gives way to the context: the whole fits the model.
            assert local_embedding.count_tokens([embedded])[0] <= local_embedding.max_input_tokens
            assert local_embedding.count_tokens([hit.text])[0] <= 48 - 6
    finally:
        host.store.close()


def test_a_title_word_finds_the_passages_that_do_not_hold_it(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    on = make_host(tmp_path / "on.db", local_embedding, chunking=SMALL)
    off = make_host(tmp_path / "off.db", local_embedding, chunking={**SMALL, "context": "none"})
    try:
        for host in (on, off):
            ingest(host, "beacon")
        with_context = lexical_hits(on, "coastal beacon")
        without = lexical_hits(off, "coastal beacon")
        assert without == [t for t in without if "coastal beacon" in t]  # only the first
        assert len(without) == 1
        assert len(with_context) == len(lexical_hits(on, "lamp bulb lens horn fog"))
        assert len(with_context) >= 4
        # Without context, a corpus stores its chunking exactly as before (no key).
        assert off.corpus.chunking == SMALL
        assert off.store.stored_descriptor(CORPUS) == off.corpus.descriptor.canonical_json()
    finally:
        on.store.close()
        off.store.close()


def test_a_corpus_made_before_passage_context_keeps_working_without_it(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    db = tmp_path / "index.db"
    default = ChunkingSettings().as_identity()
    assert "context" not in default  # the host's configuration leaves it to the corpus
    # What the previous release stored: its descriptor had no `context` (written here through
    # the store, as that release's service did), and its passages were embedded bare.
    with SqliteVectorStore.open(db) as store:
        old = Corpus(CORPUS, "passages-v1", local_embedding, store, deny, chunking=default)
        store.open_corpus(old.descriptor)
        stored = store.stored_descriptor(CORPUS)
    host = make_host(db, local_embedding)  # the current release, default configuration
    try:
        assert host.corpus.chunking == default
        assert host.store.stored_descriptor(CORPUS) == stored
        ingest(host, "beacon")
        assert ingest(host, "beacon") == "unchanged"
        stored_texts = [row[3] for row in dump_index(host, ["beacon"])]
        assert sorted(host.embedding.texts) == sorted(stored_texts)  # embedded bare
        assert len(lexical_hits(host, "coastal beacon")) == 1
    finally:
        host.store.close()
    # A new corpus next to it gets the default.
    with SqliteVectorStore.open(db) as store:
        fresh = Corpus("fresh", "passages-v1", local_embedding, store, deny)
        service = RetrievalService([fresh, replace(old, store=store)])
        assert service.corpus("fresh").chunking == {"context": "title-sections"}
        assert service.corpus(CORPUS).chunking == default


def deny(request: AuthorizationRequest, ctx: RequestContext) -> Grant | None:
    return None


def test_asking_for_context_on_a_corpus_made_without_it_is_a_descriptor_mismatch(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    db = tmp_path / "index.db"
    make_host(db, local_embedding, chunking={**SMALL, "context": "none"}).store.close()
    with pytest.raises(RetrievalError) as excinfo:
        make_host(db, local_embedding, chunking={**SMALL, "context": "title-sections"})
    assert excinfo.value.code is ErrorCode.DESCRIPTOR_MISMATCH
    assert "chunking" in excinfo.value.detail


def test_the_context_gives_way_part_by_part_when_the_passage_fills_the_model(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    host = make_host(tmp_path / "index.db", local_embedding, chunking=SMALL)
    try:
        limit = local_embedding.max_input_tokens
        words = "beam " * 300
        # Passages given by the application, sized by it: one leaves room for the whole
        # context, one only for the title, one for nothing.
        full = "keeper " * 40
        tight = _fill(local_embedding, "Beacon > A rather long section heading here", limit)
        title_only = _fill(local_embedding, "Beacon", limit)
        bare = " ".join(words.split()[: _words_at(local_embedding, limit)])
        chunks = [
            ChunkInput("c0", full, section_path=("Part",)),
            ChunkInput("c1", tight, section_path=("A rather long section heading here",)),
            ChunkInput("c2", title_only, section_path=("Another heading",)),
            ChunkInput("c3", bare, section_path=("Part",)),
        ]
        host.driver.retrieval.index_context(
            IndexRequest(CORPUS, SourceInfo("given", "r1", "Beacon"), tuple(chunks)), context()
        )
        embedded = host.embedding.texts[-4:]
        assert embedded[0] == f"Beacon > Part\n\n{full}"
        assert embedded[1] == f"Beacon > A rather long section heading here\n\n{tight}"
        assert embedded[2] == f"Beacon\n\n{title_only}"
        assert embedded[3] == bare
        assert all(n <= limit for n in local_embedding.count_tokens(embedded))
    finally:
        host.store.close()


def _words_at(embedding: LocalEmbedding, tokens: int) -> int:
    """How many `beam` words make exactly `tokens` tokens with the special tokens."""
    return tokens - embedding.count_tokens([""])[0]


def _fill(embedding: LocalEmbedding, context_line: str, limit: int) -> str:
    """Passage text that fills the model's input exactly together with `context_line`."""
    room = limit - embedding.count_tokens([f"{context_line}\n\n"])[0]
    return " ".join(["beam"] * room)


def test_extractors_give_each_passage_its_section_path(
    local_embedding: LocalEmbedding,
) -> None:
    prepared = prepare_document(
        GUIDE,
        "text/markdown",
        source_id="beacon",
        token_counter=local_embedding.count_tokens,
        settings=ChunkingSettings(max_tokens=48, overlap_tokens=0, context="title-sections"),
    )
    paths = {c.section_path for c in prepared.chunks}
    assert paths == {
        ("Keeping a coastal beacon", "The lamp"),
        ("Keeping a coastal beacon", "The fog horn"),
    }
    thread = (
        b"From a@example.org Mon Jan  1 00:00:00 2024\n"
        b"Message-ID: <one@example.org>\nSubject: Beacon schedule\n\nWinding at dusk.\n\n"
        b"From b@example.org Mon Jan  1 00:00:00 2024\n"
        b"Message-ID: <two@example.org>\nSubject: Re: Beacon schedule\n\nAgreed, at dusk.\n"
    )
    mail = prepare_document(
        thread,
        "application/mbox",
        source_id="thread",
        token_counter=local_embedding.count_tokens,
    )
    assert [c.section_path for c in mail.chunks] == [
        ("Beacon schedule",),
        ("Re: Beacon schedule",),
    ]
    assert mail.source.title == "Beacon schedule"

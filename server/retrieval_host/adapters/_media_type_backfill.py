"""Which sources an earlier release ingested, for the vector stores' media-type migration.

Sources written before the stores recorded a media type (SQLite schema version 2 and
PostgreSQL `vector-store` 2, and earlier) hold NULL; ingestion also wrote the type into the
source's metadata, and the migration to SQLite 5 / PostgreSQL 4 reads it back from there for
ingested sources only: a prepared-passage source stays NULL by contract, whatever `mediaType`
key its own metadata holds (README: prepared passages are never narrowed).

Ingested means: every passage id is the one ingestion derives for that passage
(`core.validation.derived_chunk_id` of the source id, revision, position and text, the rule
the write path refuses other prepared ids of that shape by), and the metadata names a type the
host ingests. The previous main checked only the ids' shape ("p" and 24 hex digits), and
releases before 60382e0 accepted prepared passages with such ids (a copy of an ingested source
made through the index API has them): probe U, session 42, found such a prepared source
listed as `text/markdown` after the upgrade and its hits' metadata narrowed. Comparing with the
derivation needs each passage's text, so this is a Python step of each store's migration, run
inside the migration's transaction (`sqlite.tables`, `postgres.media_types`); the rows are
read and written through the callables each store passes, so both stores decide alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from retrieval_host.core.validation import derived_chunk_id

# The types ingestion has written into source metadata (`ingest.MEDIA_TYPES` when the column
# came, spelt out: the migration repairs what earlier releases wrote, whatever the current
# release ingests).
INGESTED_MEDIA_TYPES: Final = (
    "application/mbox",
    "application/pdf",
    "message/rfc822",
    "text/html",
    "text/markdown",
    "text/plain",
)
# Sources read per window of the table (keyset pagination on the row key), and passages read
# per batch of the candidates among them: bounds the memory of one batch (PostgreSQL's
# client-side cursor holds its whole result) to about this many passage texts, whatever the
# store's size. A source with more passages is a batch of its own.
SOURCES_PER_WINDOW: Final = 512
PASSAGES_PER_BATCH: Final = 4096
# Below every row key both stores give (SQLite rowids and PostgreSQL identities start at 1).
BEFORE_ALL: Final = -(2**63)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A source with no media type whose metadata names one ingestion writes: its row key, id,
    revision, that type and its passage count (`chunk_count`)."""

    pk: int
    source_id: str
    revision: str
    media_type: str
    passages: int


# (source row key, ordinal, chunk id, text) of one stored passage.
Passage = tuple[int, int, str, str]
# The candidates among a window of sources, and the window's last row key (None: no source
# was left after the key asked from).
Window = tuple[Sequence[Candidate], int | None]


def batches(candidates: Sequence[Candidate], passages: int) -> Iterator[list[Candidate]]:
    """`candidates` in order, cut into runs of at most `passages` passages (a larger source
    alone)."""
    batch: list[Candidate] = []
    total = 0
    for candidate in candidates:
        if batch and total + candidate.passages > passages:
            yield batch
            batch, total = [], 0
        batch.append(candidate)
        total += candidate.passages
    if batch:
        yield batch


def ingested(batch: Sequence[Candidate], rows: Iterable[Passage]) -> list[tuple[str, int]]:
    """`(media type, row key)` of each source of `batch` that ingestion wrote: it has at least
    one passage, and each of its passages (in `rows`, any order) carries the id ingestion
    derives for it. A source with any other id (a prepared passage's own, or the derived id of
    another source, position or text) keeps no type."""
    by_pk = {c.pk: c for c in batch}
    seen: set[int] = set()
    refused: set[int] = set()
    for pk, ordinal, chunk_id, text in rows:
        seen.add(pk)
        if pk in refused:
            continue
        candidate = by_pk[pk]
        if chunk_id != derived_chunk_id(candidate.source_id, candidate.revision, ordinal, text):
            refused.add(pk)
    return [(c.media_type, c.pk) for c in batch if c.pk in seen and c.pk not in refused]


def fill_media_types(
    window: Callable[[int, int], Window],
    passages: Callable[[Sequence[int]], Iterable[Passage]],
    record: Callable[[Sequence[tuple[str, int]]], None],
) -> int:
    """Record the media type of every candidate source ingestion wrote; how many it recorded.

    `window(after, limit)`: the next `limit` sources by row key after `after`, whatever they
    hold (`ORDER BY id LIMIT` on the primary key alone), as the candidates among them and the
    last key. `passages(keys)`: the stored passages of those sources. `record(pairs)`: set
    each `(media type, row key)`.

    Linear in the store: every source row is read once, a window at a time, and every
    candidate passage's text once (by its source's key, through the index on `(source_pk,
    ordinal)`) and hashed once. The window is not the first `limit` *candidates* after the
    key: with the filter in the same query, PostgreSQL without fresh statistics (a bulk-loaded
    schema) planned a scan and sort of the whole table per page (800k passages, half of them
    ingested: 7.8 s; by windows 4.6 s, and 1.2 s for 200k; SQLite 4.8 s for 960k). A window
    is read whole before its sources are updated.
    """
    recorded = 0
    after: int | None = BEFORE_ALL
    while after is not None:
        found, after = window(after, SOURCES_PER_WINDOW)
        for batch in batches(found, PASSAGES_PER_BATCH):
            typed = ingested(batch, passages([c.pk for c in batch]))
            if typed:
                record(typed)
                recorded += len(typed)
    return recorded

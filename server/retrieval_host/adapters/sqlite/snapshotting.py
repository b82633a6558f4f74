"""The snapshot methods of `SqliteVectorStore`: adopting a corpus's index snapshot at open and
writing one when enough changed (the file format and its checks are in `snapshot`). Opening,
loading and writes stay in `vector_store.py`; this mixin declares what it uses of them."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import apsw

from retrieval_host.adapters.sqlite import graph_file, snapshot, snapshot_image
from retrieval_host.adapters.sqlite.catalog import open_reader
from retrieval_host.adapters.sqlite.schema import transaction, translated
from retrieval_host.adapters.sqlite.segment import CorpusState
from retrieval_host.adapters.sqlite.tables import committed_generation
from retrieval_host.core.errors import RetrievalError

_log = logging.getLogger(__name__)

# A snapshot is written in the background once this many rows (or a quarter of the corpus,
# if more) changed since the last one.
SNAPSHOT_MIN_CHANGES = 20_000
# A delete's rewrite that could not be written is tried again this many times, this much later
# each time (seconds, growing).
ERASE_RETRIES = 3
ERASE_RETRY_S = 1.0


class SqliteSnapshots:
    """Index snapshots of the corpora; `SqliteVectorStore` provides the state and settings."""

    _path: Path
    _read_only: bool
    _snapshots: bool
    _trusted_groups: frozenset[int]
    _snapshot_lock: threading.Lock
    _snapshot_writer: threading.Thread | None
    _erasing: set[str]
    _eraser: threading.Thread | None
    _cache_lock: threading.Lock
    _corpora: dict[str, CorpusState]

    def _connection(self) -> apsw.Connection:
        raise NotImplementedError

    def _adopt_snapshot(self, state: CorpusState) -> bool:
        """Start a new corpus state from its snapshot, keeping only the sources SQLite holds
        exactly as written (the caller holds the db lock; `_refresh` then loads the rest).
        Whether the file must be rewritten: it holds rows that are not live (deleted or
        replaced since it was written, or written by a release that kept dead rows; their text
        must leave the disk), or it is there and not used (the same). A snapshot of a
        generation past the database's is not used (`_discard_future`)."""
        descriptor = state.descriptor
        path = snapshot.snapshot_path(self._path, descriptor.corpus_id)
        mapped = snapshot.read(
            path,
            descriptor.corpus_id,
            descriptor.canonical_json(),
            state.dimensions,
            self._trusted_groups,
            remove_damaged=not self._read_only,
        )
        if mapped is None:
            # A file there but not used (another format, one written before checksums, of
            # another descriptor) is rewritten too: it may hold deleted text, and a rewrite
            # was due only once enough rows changed (probe U, session 42: a format-1 file kept
            # a deleted source's text until a clean stop).
            return not self._read_only and path.exists()
        conn = self._connection()
        # Read after the file, in one read transaction: a snapshot of this database's history
        # was written at a generation it had committed, so it is never past the one read here.
        with translated("reading the corpus's sources"), transaction(conn, "BEGIN"):
            committed = committed_generation(conn, descriptor.corpus_id) or 0
            listing = {
                (str(ns), str(sid)): (
                    str(rev),
                    str(sha),
                    str(fingerprint),
                    int(gen),
                    int(count),
                    json.loads(meta),
                    None if media_type is None else str(media_type),
                )
                for ns, sid, rev, sha, fingerprint, gen, count, meta, media_type in conn.execute(
                    "SELECT namespace, source_id, revision, document_sha256, fingerprint, "
                    "generation, chunk_count, metadata_json, media_type FROM sources "
                    "WHERE corpus_id = ?",
                    (descriptor.corpus_id,),
                )
            }
        if mapped.generation > committed:
            self._discard_future(path, mapped, committed)
            return False
        try:
            adopted = list(snapshot.segments(mapped, state.dimensions, listing))
        except snapshot.SnapshotUnusable as exc:
            _log.warning("index snapshot %s not used: %s", path, exc)
            return not self._read_only
        dead = 0
        for namespace, segment, kept in adopted:
            dead += segment.size - sum(s.stop - s.start for s in segment.spans.values())
            state.segments[namespace] = segment
            segment.origin = graph_file.Origin(
                graph_file.graph_path(path, namespace, mapped.identity),
                segment.size,
                segment.matrix,
                self._trusted_groups,
                path,
                mapped.identity,
            )
            for source_id, generation in kept:
                state.generations[(namespace, source_id)] = generation
        _log.info(
            "mapped the index snapshot of corpus %s (%d sources)",
            descriptor.corpus_id,
            len(state.generations),
        )
        if dead and not self._read_only:
            state.unsnapshotted += dead  # a close rewrites it, if the eraser has not
            return True
        return False

    def _discard_future(self, path: Path, mapped: snapshot.Snapshot, committed: int) -> None:
        """The snapshot at `path` (`mapped`) is of a generation past the database's
        `committed`: it comes from a state the database does not hold (a restored backup, a
        new database in the same place). None of its rows is used: the index loads from
        SQLite, as at a first start. A store that may write removes it and its graph files
        now: a write never replaces a newer generation, so every later rewrite (a delete's
        among them) would have been skipped until the database counted past it, the deleted
        and rolled-back text left on disk (probe T, session 40). Under the writers' lock,
        and only the version read: another process (a worker of the same host) may have
        removed it already and written the database's state in its place."""
        what = (
            f"index snapshot {path} not used: it is of commit generation {mapped.generation}, "
            f"past the database's {committed} (a restored backup, or a new database in its "
            "place)"
        )
        if self._read_only:
            _log.warning("%s; a read-only store leaves it in place", what)
            return
        try:
            with snapshot.writing(path):
                if snapshot.current_identity(path) != mapped.identity:
                    return  # removed or rewritten by another process meanwhile
                path.unlink()
                graph_file.remove_graphs(path)
        except OSError as exc:
            _log.warning("%s; it could not be removed: %s", what, exc)
            return
        _log.warning("%s; removed with its graph files, the index is read from SQLite", what)

    def _remove_snapshot(self, corpus: str) -> None:
        """After a delete with snapshots off: a snapshot an earlier start wrote is removed,
        its graph files too, for it holds the deleted rows (the delete answered `overwritten`
        while the text stayed in it, a black-box test); the next start with snapshots on
        loads from SQLite."""
        path = snapshot.snapshot_path(self._path, corpus)
        if not path.exists():
            return
        try:
            with snapshot.writing(path):
                path.unlink(missing_ok=True)
                graph_file.remove_graphs(path)
        except OSError as exc:
            _log.warning("could not remove the index snapshot %s: %s", path, exc)
            return
        _log.info("removed the index snapshot of corpus %s (snapshots are off)", corpus)

    def _snapshot_if_due(self, state: CorpusState) -> None:
        """Write a snapshot on a background thread when enough rows changed since the last."""
        if self._read_only or not self._snapshots:
            return
        with self._cache_lock:
            size = sum(segment.size for segment in state.segments.values())
            due = state.unsnapshotted >= max(SNAPSHOT_MIN_CHANGES, size // 4)
        writer = self._snapshot_writer
        if not due or (writer is not None and writer.is_alive()):
            return
        self._snapshot_writer = threading.Thread(
            target=self._write_snapshot, args=(state,), name="store-snapshot", daemon=True
        )
        self._snapshot_writer.start()

    def _write_snapshot(self, state: CorpusState, force: bool = False) -> bool:
        """Write one corpus's snapshot unless one as recent is there already (`force`: also
        over one of the same generation; never over a newer one, unless it is newer than the
        database too: `_discard_future`). A failure is logged: the snapshot is only a cache.
        Whether the file now holds this state or a newer one."""
        if self._read_only or not self._snapshots:
            return True
        corpus = state.descriptor.corpus_id
        with self._snapshot_lock:
            with self._cache_lock:
                if self._corpora.get(corpus) is not state:
                    return True  # closed, or replaced by a newer state of the corpus
                if state.loaded_generation < 0:
                    return False  # a reload failed: the next search retries it
                images = [snapshot_image.image(ns, seg) for ns, seg in state.segments.items()]
                generation, changed = state.loaded_generation, state.unsnapshotted
            path = snapshot.snapshot_path(self._path, corpus)
            descriptor_json = state.descriptor.canonical_json()
            try:
                # Workers of one host write the same file: the check and the rename are one
                # step across processes, or a worker with an older state renamed its image
                # over the one a delete had just cleaned (a review found the deleted text
                # back in the file). An older generation never replaces a newer one.
                with snapshot.writing(path):
                    written = snapshot.written_generation(
                        path, corpus, descriptor_json, state.dimensions, self._trusted_groups
                    )
                    # Read after the file (see `_adopt_snapshot`): the database's generation,
                    # and the fingerprint of each source the images hold.
                    committed, held = self._committed_sources(corpus)
                    if written is not None and written > committed:
                        _log.warning(
                            "index snapshot %s is of commit generation %d, past the "
                            "database's %d: replaced",
                            path,
                            written,
                            committed,
                        )
                    elif written is not None and (
                        written > generation or (written == generation and not force)
                    ):
                        # Another process (a worker of the same host) wrote it already.
                        with self._cache_lock:
                            state.unsnapshotted = max(0, state.unsnapshotted - changed)
                        return True
                    images = [snapshot_image.with_fingerprints(i, held) for i in images]
                    snapshot.remove_temporaries(path)
                    size = snapshot.write(path, corpus, descriptor_json, generation, images)
                    # Graphs of earlier versions of the file hold their rows' vectors (int8),
                    # deleted ones too; none fits the new file.
                    graph_file.remove_graphs(path)
            except (OSError, RetrievalError) as exc:
                _log.warning("could not write the index snapshot %s: %s", path, exc)
                return False
            with self._cache_lock:
                state.unsnapshotted = max(0, state.unsnapshotted - changed)
            _log.info("wrote the index snapshot of corpus %s (%d bytes)", corpus, size)
            return True

    def _committed_sources(self, corpus: str) -> tuple[int, dict[tuple[str, str], tuple[int, str]]]:
        """The corpus's committed generation and each source's (generation, fingerprint), read
        in one transaction on a connection of its own: the store's is used under the db lock,
        which an open holds while it waits for the snapshot's lock (`_adopt_snapshot`)."""
        with translated("reading the sources' fingerprints"):
            conn = open_reader(self._path)
            try:
                with transaction(conn, "BEGIN"):
                    committed = committed_generation(conn, corpus) or 0
                    held = {
                        (str(ns), str(sid)): (int(gen), str(fingerprint))
                        for ns, sid, gen, fingerprint in conn.execute(
                            "SELECT namespace, source_id, generation, fingerprint FROM sources "
                            "WHERE corpus_id = ?",
                            (corpus,),
                        )
                    }
            finally:
                conn.close()
        return committed, held

    def _after_delete(self, state: CorpusState) -> None:
        """The deleted rows leave the snapshot file: rewritten without them, or, with
        snapshots off, the file an earlier start wrote removed."""
        if self._snapshots:
            self._erase_from_snapshot(state)
        else:
            self._remove_snapshot(state.descriptor.corpus_id)

    def _erase_from_snapshot(self, state: CorpusState) -> None:
        """After a delete (or an open that found a file holding rows no longer live): rewrite
        the corpus's snapshot in the background, so those rows leave that file too (a
        snapshot holds live rows only). Requests while a rewrite runs are coalesced."""
        if self._read_only or not self._snapshots:
            return
        with self._cache_lock:
            self._erasing.add(state.descriptor.corpus_id)
            if self._eraser is not None and self._eraser.is_alive():
                return  # it takes the corpus before it stops (`_erase`)
            self._eraser = threading.Thread(target=self._erase, name="store-erase", daemon=True)
            self._eraser.start()

    def _erase(self) -> None:
        failures = 0
        while True:
            with self._cache_lock:
                if not self._erasing:
                    self._eraser = None
                    return
                corpus = self._erasing.pop()
                state = self._corpora.get(corpus)
            # `force`: a file of the same generation may still hold dead rows (one written by
            # a release that kept them); never one of a newer generation.
            if state is None or self._write_snapshot(state, force=True):
                continue
            # Not written (a failed reload, a full disk): tried again a few times, then left
            # to the next due write or the close (its rows count as unsnapshotted).
            failures += 1
            if failures <= ERASE_RETRIES:
                time.sleep(ERASE_RETRY_S * failures)
                with self._cache_lock:
                    self._erasing.add(corpus)

    def checkpoint(self) -> None:
        """Write the snapshot of every open corpus now (waiting for one being written)."""
        writer = self._snapshot_writer
        if writer is not None:
            writer.join()
        with self._cache_lock:
            states = list(self._corpora.values())
        for state in states:
            self._write_snapshot(state, force=True)

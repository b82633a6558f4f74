"""The quality harness's own logic: the BEIR reader, the metrics, the cache (not a benchmark).

The metrics are checked against a hand-computed example and against pytrec_eval on random
runs; the cached index is built once over three documents and then reused without ingesting
again.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from bench import quality

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.adapters.sqlite import SqliteVectorStore
from tests.support.pg import drop_schema


def _write_beir(directory: Path) -> Path:
    directory.mkdir()
    corpus = [
        {"_id": "d1", "title": "Cell division", "text": "Cells divide by mitosis."},
        {"_id": "d2", "title": "", "text": "Photosynthesis turns light into sugar."},
        {"_id": "*", "title": "Wildcard id", "text": "Ribosomes build proteins."},
    ]
    queries = [
        {"_id": "q1", "text": "How do cells divide?"},
        {"_id": "q2", "text": "What builds proteins?"},
        {"_id": "q3", "text": "An unjudged query."},
    ]
    (directory / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (directory / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (directory / "qrels").mkdir()
    (directory / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\t*\t2\nq2\td2\t0\n"
    )
    return directory


def test_the_reader_keeps_only_the_queries_judged_in_the_split(tmp_path: Path) -> None:
    dataset = quality.read_beir(_write_beir(tmp_path / "tiny"), "train")
    assert dataset.name == "tiny"
    assert list(dataset.corpus) == ["d1", "d2", "*"]
    assert dataset.corpus["d1"] == quality.Document("Cell division", "Cells divide by mitosis.")
    assert dataset.queries == {"q1": "How do cells divide?", "q2": "What builds proteins?"}
    assert dataset.qrels == {"q1": {"d1": 1}, "q2": {"*": 2, "d2": 0}}
    limited = quality.read_beir(tmp_path / "tiny", "train", limit_queries=1)
    assert limited.queries == {"q1": "How do cells divide?"}
    assert limited.qrels == {"q1": {"d1": 1}}


def test_documents_become_markdown_sources_with_ids_the_rules_accept() -> None:
    assert quality.markdown(quality.Document(" A  title ", "Body.\n")) == b"# A title\n\nBody.\n"
    assert quality.markdown(quality.Document("", "Body.")) == b"Body.\n"
    ids = quality.source_ids(["d1", "*", " padded"])
    assert ids["d1"] == "d1"
    assert ids["*"].startswith("doc-") and ids[" padded"].startswith("doc-")
    assert len(set(ids.values())) == 3


def test_ndcg_and_recall_match_a_hand_computed_example() -> None:
    qrels = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"d": 1}}
    run = {"q1": {"x": 0.9, "b": 0.8, "a": 0.7}, "q2": {}}
    # q1: DCG = 0/log2(2) + 1/log2(3) + 2/log2(4); ideal = 2/log2(2) + 1/log2(3).
    expected_q1 = (1 / math.log2(3) + 1.0) / (2.0 + 1 / math.log2(3))
    assert quality.ndcg_at(run["q1"], qrels["q1"], 10) == pytest.approx(expected_q1)
    assert quality.ndcg_at(run["q1"], qrels["q1"], 1) == 0.0
    assert quality.recall_at(run["q1"], qrels["q1"], 100) == 1.0
    assert quality.recall_at(run["q1"], qrels["q1"], 2) == 0.5
    scores = quality.own_scores(run, qrels)
    assert scores.ndcg_10 == pytest.approx(expected_q1 / 2)  # q2 found nothing: 0
    assert scores.recall_100 == pytest.approx(0.5)


def test_tied_scores_rank_by_document_id_descending_as_trec_eval_does() -> None:
    assert quality.ndcg_at({"a": 1.0, "b": 1.0}, {"a": 1}, 1) == 0.0
    assert quality.ndcg_at({"a": 1.0, "b": 1.0}, {"b": 1}, 1) == 1.0


def test_own_metrics_agree_with_pytrec_eval_on_random_runs() -> None:
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(300)]
    qrels = {f"q{q}": {d: rng.randint(0, 3) for d in rng.sample(docs, 6)} for q in range(40)}
    run = {
        q: {d: round(rng.random(), 2) for d in rng.sample(docs, rng.randint(0, 150))} for q in qrels
    }
    own = quality.own_scores(run, qrels)
    reference = quality.pytrec_scores(run, qrels)
    assert reference is not None
    assert own.ndcg_10 == pytest.approx(reference.ndcg_10, abs=1e-9)
    assert own.recall_100 == pytest.approx(reference.recall_100, abs=1e-9)


def test_the_gate_takes_hybrid_or_else_the_best_supported_mode() -> None:
    low, high = quality.Scores(0.5, 0.8, "own"), quality.Scores(0.7, 0.9, "own")
    assert quality.gated({"dense": high, "hybrid": low}) == ("hybrid", low)
    assert quality.gated({"dense": low, "lexical": high, "hybrid": None}) == ("lexical", high)
    assert quality.gated({"hybrid": None}) is None
    assert quality.mode_supported("dense")


def test_the_index_is_ingested_once_then_reused_and_searched_per_document(tmp_path: Path) -> None:
    dataset = quality.read_beir(_write_beir(tmp_path / "tiny"), "train")
    cache = tmp_path / "cache"
    embedding = LocalEmbedding(threads=1)
    with quality.cached_index(dataset, cache, embedding, progress=lambda _: None) as index:
        assert index.ingest_s is not None
        assert set(index.document_of().values()) == {"d1", "d2", "*"}
        dense = quality.search_all(index, dataset.queries, "dense")
    assert dense.run is not None
    assert set(dense.run) == {"q1", "q2"}
    assert set(dense.run["q1"]) == {"d1", "d2", "*"}  # documents, not passages
    assert max(dense.run["q1"], key=dense.run["q1"].__getitem__) == "d1"
    assert len(dense.latencies_s) == 2
    with quality.cached_index(dataset, cache, embedding, progress=lambda _: None) as again:
        assert again.ingest_s is None
        assert again.revisions == index.revisions
        assert quality.search_all(again, dataset.queries, "dense").run == dense.run


def test_a_postgresql_index_replays_the_sqlite_vectors_and_ranks_alike(
    tmp_path: Path, pg_dsn: str
) -> None:
    dataset = quality.read_beir(_write_beir(tmp_path / "tiny"), "train")
    cache = tmp_path / "cache"
    embedding = LocalEmbedding(threads=1)
    with quality.cached_index(dataset, cache, embedding, progress=lambda _: None) as index:
        dense = quality.search_all(index, dataset.queries, "dense")
        hybrid = quality.search_all(index, dataset.queries, "hybrid")
    with quality.cached_index(
        dataset, cache, embedding, progress=lambda _: None, postgres_dsn=pg_dsn
    ) as pg:
        assert pg.ingest_s is not None
        replayed = pg.embedding
        assert isinstance(replayed, quality.ReplayEmbedding)
        assert replayed.replayed == pg.passages  # no passage embedded twice
        pg_dense = quality.search_all(pg, dataset.queries, "dense")
        pg_hybrid = quality.search_all(pg, dataset.queries, "hybrid")
    assert pg_dense.run is not None and dense.run is not None
    for query in dense.run:
        assert pg_dense.run[query] == pytest.approx(dense.run[query], abs=1e-5)
    assert pg_hybrid.run is not None and hybrid.run is not None
    assert {q: max(r, key=r.__getitem__) for q, r in pg_hybrid.run.items()} == {
        q: max(r, key=r.__getitem__) for q, r in hybrid.run.items()
    }
    # The schema is reused while it holds the manifest's revisions.
    try:
        with quality.cached_index(
            dataset, cache, embedding, progress=lambda _: None, postgres_dsn=pg_dsn
        ) as again:
            assert again.ingest_s is None
    finally:
        chunking = quality.chunking_identity()
        drop_schema(pg_dsn, f"quality_{quality.fingerprint(dataset, embedding, chunking)}")


def test_passage_context_none_builds_an_index_without_context(tmp_path: Path) -> None:
    dataset = quality.read_beir(_write_beir(tmp_path / "tiny"), "train")
    embedding = LocalEmbedding(threads=1)
    stored: dict[str, object] = {}
    for context in ("none", "title-sections"):
        chunking = quality.chunking_identity(context)
        with quality.cached_index(
            dataset, tmp_path / "cache", embedding, progress=lambda _: None, chunking=chunking
        ) as index:
            path = index.directory / "store.sqlite"
        store = SqliteVectorStore.open(path)
        try:
            descriptor = store.stored_descriptor(quality.CORPUS)
        finally:
            store.close()
        assert descriptor is not None
        stored[context] = json.loads(descriptor)["chunking"].get("context")
    assert stored == {"none": None, "title-sections": "title-sections"}


def test_a_refused_document_and_an_oversized_query_are_counted_not_fatal(tmp_path: Path) -> None:
    # A black-box test: one empty record (or one with NUL) stopped the whole run with a
    # traceback; a query over the search's bound did too, and placed first it made the report
    # say every mode was "not supported by this build".
    directory = _write_beir(tmp_path / "edges")
    with (directory / "corpus.jsonl").open("a") as corpus:
        corpus.write(json.dumps({"_id": "blank", "title": "", "text": "   "}) + "\n")
    with (directory / "queries.jsonl").open("a") as queries:
        queries.write(json.dumps({"_id": "q0", "text": "cells " * 2_000}) + "\n")  # 12 KB
    qrels = directory / "qrels" / "train.tsv"
    lines = qrels.read_text().splitlines()
    qrels.write_text("\n".join([lines[0], "q0\td1\t1", "q0\tblank\t1", *lines[1:]]) + "\n")
    dataset = quality.read_beir(directory, "train")
    assert next(iter(dataset.queries)) == "q0"
    embedding = LocalEmbedding(threads=1)
    with quality.cached_index(
        dataset, tmp_path / "cache", embedding, progress=lambda _: None
    ) as index:
        assert index.refused == {"blank": "INVALID_DOCUMENT empty-document"}
        outcomes = {m: quality.search_all(index, dataset.queries, m) for m in ("dense", "hybrid")}
    for outcome in outcomes.values():
        assert outcome.run is not None and outcome.refused == 1
        assert outcome.run["q0"] == {} and "d1" in outcome.run["q1"]
        assert len(outcome.latencies_s) == 2
    with quality.cached_index(
        dataset, tmp_path / "cache", embedding, progress=lambda _: None
    ) as again:
        assert again.ingest_s is None and again.refused == index.refused

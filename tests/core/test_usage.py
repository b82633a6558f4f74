"""Usage records (pure): one per kind of call that spent something, attributed, and summed."""

from __future__ import annotations

from retrieval_host.core.descriptor import EmbeddingDescriptor, RerankDescriptor
from retrieval_host.core.models import EmbeddingUsage, RerankUsage
from retrieval_host.core.runs_model import GenerationUsage, RunUsage
from retrieval_host.core.usage import (
    UsageRecord,
    embedding_record,
    rerank_record,
    run_records,
    summarize,
)

EMBEDDING = EmbeddingDescriptor("hosted-embed", "openai", "acct-7", "api-key", "text-emb-3", 8)
RERANK = RerankDescriptor("rerank-http", "cohere", "acct-9", "api-key", "rerank-v3")


def test_nothing_spent_records_nothing() -> None:
    assert embedding_record("t", "alice", "search", "docs", EMBEDDING, EmbeddingUsage()) == []
    assert rerank_record("t", "alice", "search", "docs", RERANK, RerankUsage()) == []
    assert rerank_record("t", "alice", "search", "docs", None, RerankUsage(1, 5, 40)) == []
    assert run_records("t", "a", "r", "p", None, "m", RunUsage(), "docs", EMBEDDING, None) == []


def test_each_record_names_who_spent_what_on_which_account_and_model() -> None:
    [embedded] = embedding_record("t", "alice", "ingest", "docs", EMBEDDING, EmbeddingUsage(2, 300))
    assert (embedded.provider, embedded.account, embedded.model) == (
        "hosted-embed",
        "acct-7",
        "text-emb-3",
    )
    assert (embedded.subject, embedded.corpus, embedded.requests, embedded.input_tokens) == (
        "alice",
        "docs",
        2,
        300,
    )
    [reranked] = rerank_record("t", "alice", "search", "docs", RERANK, RerankUsage(1, 20, 900))
    assert (reranked.kind, reranked.documents, reranked.account) == ("rerank", 20, "acct-9")


def test_a_run_records_its_generation_and_its_searches_calls() -> None:
    usage = RunUsage(GenerationUsage(2, 500, 80), EmbeddingUsage(1, 9), RerankUsage(1, 6, 0))
    records = run_records(
        "t", "bob", "run_1", "gpt", "team-a", "m-4", usage, "docs", EMBEDDING, RERANK
    )
    assert [(r.kind, r.provider, r.account, r.run_id) for r in records] == [
        ("generation", "gpt", "team-a", "run_1"),
        ("embedding", "hosted-embed", "acct-7", "run_1"),
        ("rerank", "rerank-http", "acct-9", "run_1"),
    ]
    assert (records[0].input_tokens, records[0].output_tokens) == (500, 80)
    # A run without retrieval has only its generation.
    alone = run_records("t", "bob", "run_2", "gpt", None, "m-4", usage, None, None, None)
    assert [r.kind for r in alone] == ["generation"]


def test_summaries_add_up_per_subject_corpus_operation_kind_provider_account_and_model() -> None:
    def one(at: str, subject: str, tokens: int) -> UsageRecord:
        return UsageRecord(at, subject, "search", "embedding", "p", "a", "m", "docs", 1, tokens)

    totals = summarize([one("1", "alice", 3), one("3", "alice", 4), one("2", "bob", 5)])
    assert [(key[0], r.requests, r.input_tokens, r.at) for key, r in totals] == [
        ("alice", 2, 7, "3"),
        ("bob", 1, 5, "2"),
    ]

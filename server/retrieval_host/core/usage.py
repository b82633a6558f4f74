"""Usage records: who spent which model calls, on what (pure; the sink is a port).

One record per (operation, kind) with something spent: the embedding calls of a search or an
ingest, a search's rerank calls, a run's generation, embedding and rerank calls together.
Each names the subject, the corpus, the provider instance (a descriptor's `provider_id`, or
the run's provider as configured), its account (`account_id`; for generation, the provider's
own when it has one) and the model, so that an operator can attribute cost per tenant, corpus,
account and model. A replayed run spent nothing and records nothing; a failed operation
records nothing either (what it may have spent before failing is not metered).

Records go to a `UsageSink` after the operation succeeded. A sink never raises: one that cannot
write logs that and drops the records, so metering never fails an operation that succeeded.
The default sink is a table in the run store, which also reads them back (`UsageLog`: the
`retrieval-host usage` command).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from retrieval_host.core.descriptor import EmbeddingDescriptor, RerankDescriptor
from retrieval_host.core.models import EmbeddingUsage, RerankUsage
from retrieval_host.core.runs_model import RunUsage

UsageOperation = Literal["search", "index", "ingest", "run"]
UsageKind = Literal["embedding", "rerank", "generation"]


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """What one operation spent on one kind of model call."""

    at: str  # RFC 3339, UTC: when the operation completed
    subject: str
    operation: UsageOperation
    kind: UsageKind
    provider: str  # the provider instance
    account: str | None
    model: str
    corpus: str | None
    requests: int
    input_tokens: int = 0
    output_tokens: int = 0
    documents: int = 0  # reranked documents
    run_id: str | None = None


class UsageSink(Protocol):
    """Where usage records go (default: the run store's `usage` table). Never raises."""

    def record_usage(self, records: Sequence[UsageRecord]) -> None: ...


@runtime_checkable
class UsageLog(UsageSink, Protocol):
    """A sink that reads its records back, oldest first, for the operator."""

    def read_usage(
        self, *, since: str | None = None, subject: str | None = None, limit: int = 10_000
    ) -> list[UsageRecord]: ...


def embedding_record(
    at: str,
    subject: str,
    operation: UsageOperation,
    corpus: str,
    descriptor: EmbeddingDescriptor,
    usage: EmbeddingUsage,
    run_id: str | None = None,
) -> list[UsageRecord]:
    """The embedding record of one operation on `corpus` (none when it embedded nothing)."""
    if usage.requests == 0:
        return []
    return [
        UsageRecord(
            at,
            subject,
            operation,
            "embedding",
            descriptor.provider_id,
            descriptor.account_id,
            descriptor.model,
            corpus,
            usage.requests,
            usage.input_tokens,
            run_id=run_id,
        )
    ]


def rerank_record(
    at: str,
    subject: str,
    operation: UsageOperation,
    corpus: str,
    descriptor: RerankDescriptor | None,
    usage: RerankUsage,
    run_id: str | None = None,
) -> list[UsageRecord]:
    """The rerank record of one operation (none without a reranker or a rerank call)."""
    if descriptor is None or usage.requests == 0:
        return []
    return [
        UsageRecord(
            at,
            subject,
            operation,
            "rerank",
            descriptor.provider_id,
            descriptor.account_id,
            descriptor.model,
            corpus,
            usage.requests,
            usage.input_tokens,
            documents=usage.documents,
            run_id=run_id,
        )
    ]


def summarize(records: Sequence[UsageRecord]) -> list[tuple[tuple[str, ...], UsageRecord]]:
    """Records summed per (subject, corpus, operation, kind, provider, account, model), in
    that order: each key with a record holding the sums (`at`: the latest)."""
    totals: dict[tuple[str, ...], UsageRecord] = {}
    for r in records:
        key = (
            r.subject,
            r.corpus or "",
            r.operation,
            r.kind,
            r.provider,
            r.account or "",
            r.model,
        )
        seen = totals.get(key)
        totals[key] = (
            r
            if seen is None
            else UsageRecord(
                max(seen.at, r.at),
                r.subject,
                r.operation,
                r.kind,
                r.provider,
                r.account,
                r.model,
                r.corpus,
                seen.requests + r.requests,
                seen.input_tokens + r.input_tokens,
                seen.output_tokens + r.output_tokens,
                seen.documents + r.documents,
            )
        )
    return sorted(totals.items())


def run_records(
    at: str,
    subject: str,
    run_id: str,
    provider: str,
    account: str | None,
    model: str,
    usage: RunUsage,
    corpus: str | None,
    embedding: EmbeddingDescriptor | None,
    reranker: RerankDescriptor | None,
) -> list[UsageRecord]:
    """A completed run's records: its generation calls, and the embedding and rerank calls of
    its searches on `corpus` (with that corpus's descriptors)."""
    records: list[UsageRecord] = []
    generated = usage.generation
    if generated.requests:
        records.append(
            UsageRecord(
                at,
                subject,
                "run",
                "generation",
                provider,
                account,
                model,
                corpus,
                generated.requests,
                generated.input_tokens,
                generated.output_tokens,
                run_id=run_id,
            )
        )
    if corpus is not None and embedding is not None:
        records += embedding_record(at, subject, "run", corpus, embedding, usage.embedding, run_id)
    if corpus is not None:
        records += rerank_record(at, subject, "run", corpus, reranker, usage.rerank, run_id)
    return records

"""One run in progress: its identity, what it has found and spent, and where it reports."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import EmbeddingUsage, RerankUsage
from retrieval_host.core.run_ports import (
    ContextPolicy,
    DedupKey,
    EvidencePassage,
    RetrievalEffect,
    Retriever,
)
from retrieval_host.core.runs_model import GenerationUsage, Receipt, RunEvent
from retrieval_host.core.service import RetrievalService

EventSink = Callable[[RunEvent], None]


def default_dedup_key(corpus: str, source_ids: Sequence[str] | None, query: str) -> str:
    """The built-in dedup key: corpus, the sorted source ids and the case-folded query."""
    material = json.dumps(
        [corpus, sorted(source_ids or []), query.casefold()], separators=(",", ":")
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:24]


def new_run_id() -> str:
    return "run_" + secrets.token_hex(12)


def new_delimiter() -> str:
    return "EVIDENCE-" + secrets.token_hex(16)


@dataclass
class ActiveRun:
    """The mutable state of one run, owned by the worker thread that executes it."""

    run_id: str
    created_at: str
    # Fences the evidence in prompts; random per run so a passage cannot close the fence.
    delimiter: str
    context: RequestContext
    emit: EventSink
    clock: Callable[[], str]
    retrieval: RetrievalService | None
    seen: set[str] = field(default_factory=set)  # dedup keys of the searches made
    successes: int = 0  # searches that returned, counted against `maxQueries`
    sequence: int = 0  # receipts issued
    evidence: dict[str, EvidencePassage] = field(default_factory=dict)  # by chunk id
    receipts: list[Receipt] = field(default_factory=list)
    generation: GenerationUsage = field(default_factory=GenerationUsage)
    embedding: EmbeddingUsage = field(default_factory=EmbeddingUsage)
    rerank: RerankUsage = field(default_factory=RerankUsage)
    rerank_calls: int = 0  # reranker calls made (failed ones too), against `maxRerankCalls`
    # The run's `maxTokens` (None: unbounded), checked before each search and model call.
    max_tokens: int | None = None
    # The application's choice of what evidence reaches the model (None: all of it), and the
    # handles that did reach it (the manifest when a policy is set).
    context_policy: ContextPolicy | None = None
    # The application's own search for the run's retrievals (None: the corpus's).
    retriever: Retriever | None = None
    # How searches are told apart (`core.run_ports.DedupKey`) and what runs after each one.
    dedup_key: DedupKey = field(default=default_dedup_key)
    effects: Sequence[RetrievalEffect] = ()
    shown: set[str] = field(default_factory=set)
    # Bytes of passage text the run's searches added to its evidence (never given back when
    # a revoked passage is dropped: it may have reached the model), against `maxContextBytes`.
    context_bytes: int = 0
    # The first search a budget kept from being made (its sequence and that budget, named
    # with its request field: `maxRerankCalls`, `maxTokens`, `maxContextBytes`; `maxQueries`,
    # spent only by searches that were made, is not one). A run left without evidence then
    # fails naming it: its documents were not searched, so no `noEvidence` reply applies.
    held_back: tuple[int, str] | None = None

    def visible(self, question: str) -> list[EvidencePassage]:
        """The evidence the model may read now, as the context policy selects it (only
        passages of the evidence, each once); noted as shown."""
        passages = list(self.evidence.values())
        if self.context_policy is not None:
            chosen = self.context_policy.select(question, passages)
            held = {p.handle for p in passages}
            picked: dict[str, EvidencePassage] = {}
            for p in chosen:
                if p.handle in held and p.handle not in picked:
                    picked[p.handle] = self.evidence[p.handle]  # the host's copy, not the policy's
            passages = list(picked.values())
        self.shown.update(p.handle for p in passages)
        return passages

    def cited_evidence(self) -> dict[str, EvidencePassage]:
        """What the answer may cite: the evidence that reached the model (all of it without a
        context policy)."""
        if self.context_policy is None:
            return dict(self.evidence)
        return {h: p for h, p in self.evidence.items() if h in self.shown}

    @property
    def tokens_spent(self) -> int:
        """Tokens of every search, rerank and model call so far (what `maxTokens` bounds)."""
        g = self.generation
        return (
            self.embedding.input_tokens
            + self.rerank.input_tokens
            + g.input_tokens
            + g.output_tokens
        )

    @property
    def service(self) -> RetrievalService:
        """The retrieval service: only a run with retrieval takes the steps that need it."""
        assert self.retrieval is not None
        return self.retrieval

"""A run whose search a budget kept from being made fails naming the budget, never with its
`noEvidence` reply (probe H, session 40: `maxRerankCalls: 0` on a reranking corpus answered
"The documents do not cover this." without searching them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.runs_model import (
    Fallbacks,
    FixedAnswer,
    RunEvent,
    RunFailed,
    RunProgress,
    RunRequest,
    RunRetrieval,
)
from tests.support.run_engine import open_reranking_run_world, open_run_world

ALICE = RequestContext("alice")


@pytest.mark.parametrize("fallbacks", [Fallbacks(), Fallbacks(no_evidence=FixedAnswer("none"))])
def test_a_run_whose_rerank_budget_kept_its_search_from_being_made_fails_naming_it(
    tmp_path: Path, local_embedding: LocalEmbedding, fallbacks: Fallbacks
) -> None:
    with open_reranking_run_world(tmp_path, local_embedding) as (world, fake):
        request = RunRequest(
            provider="local",
            model="extractive",
            input="How long does the battery last?",
            retrieval=RunRetrieval(corpus="library", max_rerank_calls=0),
            fallbacks=fallbacks,
        )
        events: list[RunEvent] = []
        world.engine.execute(request, ALICE, events.append)
        assert world.provider.requests == []
        # The same run with a rerank call to spend finds the passages the budget kept back.
        found = world.engine.run(
            RunRequest(
                provider="local",
                model="extractive",
                input="How long does the battery last?",
                retrieval=RunRetrieval(corpus="library", max_rerank_calls=1),
                fallbacks=fallbacks,
            ),
            ALICE,
        )
    assert [r.status for r in found.receipts] == ["ok"] and found.sources
    assert len(fake.requests) == 1  # only the second run's search called the reranker
    receipts = [
        e.context for e in events if isinstance(e, RunProgress) and e.phase == "retrieval.receipt"
    ]
    assert [r["status"] for r in receipts] == ["quota-exceeded"]
    assert not any(isinstance(e, RunProgress) and e.phase == "outcome" for e in events)
    failed = events[-1]
    assert isinstance(failed, RunFailed)
    assert failed.error.code is ErrorCode.NO_RETRIEVAL_EVIDENCE
    assert "maxRerankCalls" in failed.error.detail
    assert "No authorized passage matched" not in failed.error.detail


def test_an_empty_search_still_takes_the_no_evidence_reply(
    tmp_path: Path, local_embedding: LocalEmbedding
) -> None:
    # The searches it may make were made and found nothing: the documents do not cover it.
    with open_run_world(tmp_path, local_embedding) as world:
        request = RunRequest(
            provider="local",
            model="extractive",
            input="zzqx",
            retrieval=RunRetrieval(corpus="library", search_mode="lexical", max_rerank_calls=0),
            fallbacks=Fallbacks(no_evidence=FixedAnswer("none")),
        )
        result = world.engine.run(request, ALICE)
        with pytest.raises(RetrievalError) as caught:
            world.engine.run(
                RunRequest(
                    provider="local",
                    model="extractive",
                    input="zzqx",
                    retrieval=RunRetrieval(corpus="library", search_mode="lexical"),
                ),
                ALICE,
            )
    assert [r.outcome for r in result.receipts] == ["empty"]
    assert result.text == "none"
    assert caught.value.detail == "No authorized passage matched; nothing was generated."

"""A run's evidence: fenced into what the model reads, and re-authorized at each point where
it is used (before each generation step, before the result is recorded, on replay).

These are point-in-time checks: bytes already sent to a provider or streamed to a client
cannot be retracted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import source_unavailable
from retrieval_host.core.evidence import fence
from retrieval_host.core.freshness import fresh_revisions
from retrieval_host.core.run_ports import EvidencePassage
from retrieval_host.core.runs.state import ActiveRun
from retrieval_host.core.runs_model import RunProgress, RunResult, RunRetrieval
from retrieval_host.core.service import RetrievalService


def user_prompt(
    question: str, visible: Sequence[EvidencePassage], delimiter: str, *, fenced: bool
) -> str:
    """The user message: the question, and in mode `before` the visible evidence fenced
    after it."""
    if not fenced or not visible:
        return f"Question:\n{question}"
    return f"Question:\n{question}\n\n{fence(list(visible), delimiter)}"


def render_tool(
    outcome: str | list[str], visible: Mapping[str, EvidencePassage], delimiter: str
) -> str:
    """A tool call's answer as the model reads it now: its still-authorized passages the
    context policy lets through, fenced."""
    if isinstance(outcome, str):
        return outcome
    passages = [visible[h] for h in outcome if h in visible]
    return fence(passages, delimiter) if passages else "No passages matched."


def recheck_evidence(run: ActiveRun, spec: RunRetrieval, *, drop: bool) -> None:
    """Re-authorize the run's evidence: drop revoked passages (`drop`), or fail the run with
    `SOURCE_UNAVAILABLE` if any was revoked. With `maxAgeS`, a passage whose revision is no
    longer fresh enough now (by the run's clock) counts as revoked: it was fresh when found."""
    run.emit(RunProgress("retrieval.authorization", {"check": "evidence", "corpus": spec.corpus}))
    ids = sorted({p.source_id for p in run.evidence.values()})
    grant = run.service.current_grant(spec.corpus, ids, run.context)
    allowed = dict(grant.sources) if grant is not None else {}
    if grant is not None and spec.max_age_s is not None and allowed:
        corpus = run.service.corpus(spec.corpus)
        indexed = corpus.store.indexed_at(corpus.id, grant.namespace, allowed.keys())
        allowed = fresh_revisions(allowed, indexed, run.clock(), spec.max_age_s)
    namespace = grant.namespace if grant is not None else None
    revoked = [
        h
        for h, p in run.evidence.items()
        if p.namespace != namespace or allowed.get(p.source_id) != p.revision
    ]
    if revoked and not drop:
        raise source_unavailable()
    for handle in revoked:
        del run.evidence[handle]


def reauthorize_manifest(
    retrieval: RetrievalService | None, result: RunResult, context: RequestContext
) -> None:
    """`SOURCE_UNAVAILABLE` unless every passage of a recorded result is still readable at
    its recorded revision, in the namespace it was read in.

    A subject the application moved to another namespace may hold there a source of the same
    id at the same revision: the namespace decides. Records made before the namespace was kept
    have none; for those each cited passage must be found in the caller's namespace now, as
    the same source at the same revision."""
    if not result.sources:
        return
    if retrieval is None or result.corpus is None:
        raise source_unavailable()
    ids = sorted({e.source_id for e in result.sources})
    grant = retrieval.current_grant(result.corpus, ids, context)
    if grant is None:
        raise source_unavailable()
    allowed = dict(grant.sources)
    if any(allowed.get(e.source_id) != e.revision for e in result.sources):
        raise source_unavailable()
    if result.namespace is not None:
        if result.namespace != grant.namespace:
            raise source_unavailable()
        return
    store = retrieval.corpus(result.corpus).store
    for entry in result.sources:
        stored = store.read_passage(result.corpus, grant.namespace, entry.id)
        if stored is None or (stored.source_id, stored.revision) != (
            entry.source_id,
            entry.revision,
        ):
            raise source_unavailable()

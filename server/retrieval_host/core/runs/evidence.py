"""A run's evidence: fenced into what the model reads, and re-authorized at each point where
it is used (before each generation step, before the result is recorded, on replay).

These are point-in-time checks: bytes already sent to a provider or streamed to a client
cannot be retracted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import source_unavailable
from retrieval_host.core.evidence import fence
from retrieval_host.core.fingerprint import sha256_text
from retrieval_host.core.freshness import fresh_revisions
from retrieval_host.core.inspection import StoredPassage
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
    if namespace is not None:
        # The passage itself, as the model read it: a label deleted and written again, or
        # rolled back to, may hold other text under the same chunk ids.
        pinned = {h: (p.source_id, p.revision) for h, p in run.evidence.items()}
        current = _passages(run.service, spec.corpus, namespace, pinned)
        revoked += [
            h
            for h, p in run.evidence.items()
            if h not in revoked and not _same(current.get(h), p.source_id, p.revision, p.text)
        ]
    if revoked and not drop:
        raise source_unavailable()
    for handle in revoked:
        del run.evidence[handle]


def _passages(
    service: RetrievalService,
    corpus_id: str,
    namespace: str,
    pinned: Mapping[str, tuple[str, str]],
) -> dict[str, StoredPassage]:
    """The passages stored now under these chunk ids in the namespace, each only if it is of
    the (source id, revision) it is pinned to: one of another is left out as a missing one is
    (either fails the check), and the store reads no text of it.

    Evidence is pinned to the passages, not to its revision label alone: a source deleted and
    indexed again at the same label with other text (or `r1` -> `r3` -> `r1`), or the same
    text cut into other passages under the same ids, keeps the label, and an answer written
    from the old passages is no longer grounded in what is served (black-box tests read such
    runs back and replayed them)."""
    corpus = service.corpus(corpus_id)
    found: dict[str, StoredPassage] = {}
    for chunk_id in sorted(pinned):
        stored = corpus.store.read_passage(corpus.id, namespace, chunk_id, _of(pinned[chunk_id]))
        if stored is not None:
            found[chunk_id] = stored
    return found


def _of(pin: tuple[str, str]) -> Callable[[str, str], bool]:
    return lambda source_id, revision: (source_id, revision) == pin


def _same(stored: StoredPassage | None, source_id: str, revision: str, text: str | None) -> bool:
    """Whether `stored` is that source's passage at that revision, with that text (`text`
    None: any, for records made before the text's digest was kept)."""
    if stored is None or (stored.source_id, stored.revision) != (source_id, revision):
        return False
    return text is None or stored.text == text


def reauthorize_manifest(
    retrieval: RetrievalService | None, result: RunResult, context: RequestContext
) -> None:
    """`SOURCE_UNAVAILABLE` unless every passage of a recorded result is still readable at
    its recorded revision, in the namespace it was read in.

    A subject the application moved to another namespace may hold there a source of the same
    id at the same revision: the namespace decides. Each passage must be found in that
    namespace now, as the same source at the same revision with the text the run read (its
    SHA-256 is kept with the record). Records made before the namespace was kept are read in
    the caller's namespace; those made before the text's digest was kept are checked by
    their labels (and, without a namespace, by each passage's source and revision)."""
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
    if result.namespace is not None and result.namespace != grant.namespace:
        raise source_unavailable()
    if result.namespace is not None and all(e.text_sha256 is None for e in result.sources):
        return  # recorded before passages were pinned: the labels decide, as then
    pinned = {e.id: (e.source_id, e.revision) for e in result.sources}
    current = _passages(retrieval, result.corpus, grant.namespace, pinned)
    for entry in result.sources:
        stored = current.get(entry.id)
        if stored is None or not _same(stored, entry.source_id, entry.revision, None):
            raise source_unavailable()
        if entry.text_sha256 is not None and sha256_text(stored.text) != entry.text_sha256:
            raise source_unavailable()

"""Searches inside a run, each leaving a receipt, and the `search_context` tool that asks for
them.

Every retrieval goes through `retrieve`, in this order: prepare (normalize) → check input →
dedup and quota → authorize → rerank budget → reserve the dedup key → execute → check result →
count successes and sources → effects (progress, receipt). A failed attempt keeps its key and
is not retried.

`maxContextBytes` is the run's, not each search's: the passages all searches of a run add to
its evidence fit in it together (whole passages in rank order, `apply_byte_budget`). A search
once it is spent is not made (`quota-exceeded`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from retrieval_host.core.budget import apply_byte_budget
from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Hit, JSONValue, SearchRequest, SearchResult
from retrieval_host.core.run_ports import EvidencePassage, Message, ToolCall, ToolSpec
from retrieval_host.core.runs.generation import StepOutput, ToolRound
from retrieval_host.core.runs.state import ActiveRun
from retrieval_host.core.runs_model import (
    RawHit,
    Receipt,
    ReceiptStatus,
    RunProgress,
    RunRetrieval,
)
from retrieval_host.core.service import RetrievalService
from retrieval_host.core.validation import cut_query, is_citation_handle

SEARCH_TOOL = ToolSpec(
    name="search_context",
    description=(
        "Search the documents you are allowed to read. Returns passages with [source:ID] "
        "handles to cite."
    ),
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for."}},
        "required": ["query"],
        "additionalProperties": False,
    },
)


def answer_tool_calls(run: ActiveRun, spec: RunRetrieval, output: StepOutput) -> ToolRound:
    """The model's message of a step and the outcome of each tool call it made."""
    assistant = Message("assistant", output.text, tool_calls=output.calls)
    return assistant, [(c.id, tool_call(run, spec, c)) for c in output.calls]


def tool_call(run: ActiveRun, spec: RunRetrieval, call: ToolCall) -> str | list[str]:
    """One tool call: the handles it found (rendered per step), or a note for the model."""
    if call.name != SEARCH_TOOL.name:
        return "Unknown tool. Only search_context is available."
    try:
        arguments = json.loads(call.arguments)
        query = arguments["query"] if isinstance(arguments, dict) else None
    except (ValueError, KeyError):
        query = None
    if not isinstance(query, str):
        query = ""
    receipt = retrieve(run, spec, query)
    if receipt.status == "ok":
        return list(receipt.source_ids)
    if receipt.status == "quota-exceeded" and receipt.raw_hits:
        note = "The run's context budget has no room for the new passages this search found."
        if receipt.source_ids:  # its hits the run already holds: the model has read them
            held = " ".join(f"[source:{i}]" for i in receipt.source_ids)
            note += f" It also found these, already in your evidence above: {held}."
        return note
    return {
        "duplicate": "This query was already searched in this run.",
        "quota-exceeded": "The search quota of this run is used up.",
    }.get(receipt.status, "The search failed.")


def _held_back(run: ActiveRun, budget: str, receipt: Receipt) -> Receipt:
    """Note the first search a budget kept from being made (`ActiveRun.held_back`)."""
    if run.held_back is None:
        run.held_back = (receipt.sequence, budget)
    return receipt


def retrieve(run: ActiveRun, spec: RunRetrieval, raw_query: str) -> Receipt:
    """One search of the run's corpus; its passages join the run's evidence."""
    service = run.service
    context = run.context
    emit = run.emit
    started = run.clock()
    # prepare
    query = cut_query(" ".join(raw_query.split()))
    key = run.dedup_key(spec.corpus, spec.source_ids, query)
    run.sequence += 1

    def receipt(
        status: ReceiptStatus,
        ids: Sequence[str] = (),
        code: str | None = None,
        *,
        extensions: Mapping[str, JSONValue] | None = None,
        effect_error: Mapping[str, str] | None = None,
        raw: Sequence[Hit] = (),
        append: bool = True,
    ) -> Receipt:
        success = run.successes if status == "ok" else None
        r = Receipt(
            run.sequence,
            query,
            key,
            started,
            status,
            list(ids),
            code,
            spec.search_mode,
            raw_query=raw_query,
            success=success,
            extensions=dict(extensions or {}),
            effect_error=effect_error,
            raw_hits=[RawHit(h.chunk_id, h.score) for h in raw],
        )
        if not append:
            return r
        run.receipts.append(r)
        emit(
            RunProgress(
                "retrieval.receipt",
                {
                    "sequence": r.sequence,
                    "status": status,
                    "outcome": r.outcome,
                    "sources": len(ids),
                },
            )
        )
        return r

    # check input
    if not query:
        return receipt("failed", code=ErrorCode.INVALID_REQUEST.value)
    # dedup and quota
    if key in run.seen:
        return receipt("duplicate")
    if run.successes >= spec.max_queries:
        return receipt("quota-exceeded")
    # authorize (the service checks again, point-in-time, around its read)
    emit(RunProgress("retrieval.authorization", {"check": "query", "corpus": spec.corpus}))
    if service.current_grant(spec.corpus, spec.source_ids, context) is None:
        run.seen.add(key)
        return receipt("failed", code=ErrorCode.PERMISSION_DENIED.value)
    # the rerank budget: a search that would call the reranker past it is not made
    try:
        reranks = service.reranks(spec.corpus, spec.rerank)
    except RetrievalError as error:  # `rerank: true` on a corpus without a reranker
        run.seen.add(key)
        return receipt("failed", code=error.code.value)
    if reranks and run.rerank_calls >= spec.max_rerank_calls:
        return _held_back(run, "reranker-call budget (maxRerankCalls)", receipt("quota-exceeded"))
    if run.max_tokens is not None and run.tokens_spent >= run.max_tokens:
        # the run's token budget is spent
        return _held_back(run, "token budget (maxTokens)", receipt("quota-exceeded"))
    # the run's byte budget: nothing more can join the evidence once it is spent
    remaining = (
        None if spec.max_context_bytes is None else spec.max_context_bytes - run.context_bytes
    )
    if remaining is not None and remaining <= 0:
        return _held_back(run, "byte budget (maxContextBytes)", receipt("quota-exceeded"))
    # reserve the key: a failed attempt keeps it and is not retried
    run.seen.add(key)

    def forward(phase: str, details: Mapping[str, JSONValue]) -> None:
        emit(RunProgress(phase, dict(details)))

    scoped = RequestContext(context.subject, context.cancel, context.request_id, forward)
    if reranks:
        run.rerank_calls += 1  # drawn before the call: a failed call spent it too
    try:
        search = SearchRequest(
            corpus=spec.corpus,
            query=query,
            source_ids=spec.source_ids,
            limit=spec.limit,
            # The run's remaining bytes, applied below to what is new to the run.
            max_context_bytes=None,
            mode=spec.search_mode,
            rerank=reranks,
            max_age_s=spec.max_age_s,
            filters=None if spec.filters is None else dict(spec.filters),
            min_score=spec.min_score,
        )
        if run.retriever is None:
            result = service.search_context(search, scoped)
        else:
            result = _reread(service, spec, run.retriever.search(search, scoped), scoped)
    except RetrievalError as error:
        if error.code in (ErrorCode.CANCELLED, ErrorCode.TIMEOUT):
            raise
        return receipt("failed", code=error.code.value)
    run.embedding += result.usage
    run.rerank += result.rerank_usage
    # check result: one passage once, only passages of the requested corpus, and only ones a
    # marker can cite (an id an earlier release stored with white space or a bracket made
    # every answer citing it fail the citation check: a black-box test)
    new = [
        h for h in result.hits if h.chunk_id not in run.evidence and is_citation_handle(h.chunk_id)
    ]
    for hit in new:
        if hit.scope.corpus != spec.corpus:  # pragma: no cover - the service guarantees it
            raise RetrievalError(ErrorCode.INTERNAL, "Internal error.")
    fresh = new
    new, _ = apply_byte_budget(fresh, remaining)
    if fresh and not new:
        # The byte budget left out every passage new to the run: not an empty result (a run
        # answered "not covered" by its `noEvidence` reply while 6 authorized passages had
        # matched: probe R). Not a success either; the search was made (its raw hits kept).
        return receipt(
            "quota-exceeded",
            [h.chunk_id for h in result.hits if h.chunk_id in run.evidence],
            raw=result.hits,
        )
    # count successes and sources
    run.successes += 1
    titles = _titles(service, spec.corpus, new)
    for hit in new:
        title = titles.get((hit.scope.namespace, hit.source.id, hit.source.revision), "")
        run.evidence[hit.chunk_id] = EvidencePassage(
            hit.chunk_id,
            hit.source.id,
            hit.source.revision,
            title,
            hit.location,
            hit.text,
            hit.scope.namespace,
        )
        run.context_bytes += len(hit.text.encode("utf-8"))
    # effects: the application's, in order, after the success; a failure stops the rest
    ids = [h.chunk_id for h in result.hits if h.chunk_id in run.evidence]
    done = receipt("ok", ids, raw=result.hits, append=False)
    extensions, effect_error = _effects(run, done, result.hits)
    return receipt("ok", ids, extensions=extensions, effect_error=effect_error, raw=result.hits)


def _titles(
    service: RetrievalService, corpus_id: str, hits: Sequence[Hit]
) -> dict[tuple[str, str, str], str]:
    """(namespace, source id, revision) -> the revision's title, for the sources of `hits`
    (already authorized): one read per source. A source replaced since the search has no
    title here; its passages are shown under their source id."""
    store = service.corpus(corpus_id).store
    titles: dict[tuple[str, str, str], str] = {}
    for namespace, source_id in dict.fromkeys((h.scope.namespace, h.source.id) for h in hits):
        stored = store.get_source(corpus_id, namespace, source_id)
        if stored is not None and stored.title:
            titles[(namespace, source_id, stored.revision)] = stored.title
    return titles


def _effects(
    run: ActiveRun, receipt: Receipt, hits: Sequence[Hit]
) -> tuple[dict[str, JSONValue], dict[str, str] | None]:
    """Run the application's effects in order: what each returned (JSON), and the first that
    failed (its name and exception type; its message may hold anything, so it stays out)."""
    extensions: dict[str, JSONValue] = {}
    for effect in run.effects:
        try:
            value = effect.after(receipt, list(hits))
            json.dumps(value, allow_nan=False)  # kept in the run's record
        except Exception as error:  # an application effect's failure is reported, not raised
            return extensions, {"effect": effect.name, "error": type(error).__name__}
        extensions[effect.name] = value
    return extensions, None


def _reread(
    service: RetrievalService, spec: RunRetrieval, found: SearchResult, context: RequestContext
) -> SearchResult:
    """An application retriever's hits, each read again from the corpus's store by chunk id
    under the caller's grant now (`get_passage`): only passages it may read, at their
    current revision, with the stored text and location; the retriever's order and scores
    are kept. The rest is dropped."""
    hits: list[Hit] = []
    for hit in found.hits[: spec.limit]:
        try:
            stored = service.get_passage(spec.corpus, hit.chunk_id, context)
        except RetrievalError as error:
            if error.code is ErrorCode.SOURCE_UNAVAILABLE:
                continue
            raise
        if stored.source != hit.source:
            continue  # another revision than the one the retriever named
        hits.append(
            replace(
                hit,
                location=stored.location,
                text=stored.text,
                document_sha256=stored.document_sha256,
                scope=stored.scope,
                metadata=stored.metadata,
            )
        )
    return replace(found, hits=hits)

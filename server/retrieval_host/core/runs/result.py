"""The result a completed run records: its text, the manifest of what it may cite, its
receipts, usage and artifact."""

from __future__ import annotations

import re
from collections.abc import Sequence

from retrieval_host.core.fingerprint import sha256_text
from retrieval_host.core.runs.state import ActiveRun
from retrieval_host.core.runs_model import (
    CitationReport,
    FallbackApplied,
    ManifestEntry,
    OutputArtifact,
    RetrievalState,
    RunRequest,
    RunResult,
    RunUsage,
)


def build_result(
    request: RunRequest,
    run: ActiveRun,
    text: str,
    citations: CitationReport | None = None,
    fallbacks: Sequence[FallbackApplied] = (),
) -> RunResult:
    """The run's result, completed now. An artifact lists the sources the text cites, or all
    the evidence when it cites none."""
    spec = request.retrieval
    # With a context policy, what reached the model; else all the evidence (all of it did).
    manifest = [
        ManifestEntry(
            p.handle,
            p.source_id,
            p.revision,
            p.location,
            p.title,
            text_sha256=sha256_text(p.text),
        )
        for p in run.cited_evidence().values()
    ]
    artifact = None
    if request.output_artifact is not None:
        cited = [m for m in cited_ids(text) if m in run.evidence]
        artifact = OutputArtifact(
            request.output_artifact.name,
            request.output_artifact.media_type,
            cited or list(run.evidence),
        )
    return RunResult(
        run_id=run.run_id,
        status="completed",
        provider=request.provider,
        model=request.model,
        text=text,
        sources=manifest,
        receipts=list(run.receipts),
        usage=RunUsage(run.generation, run.embedding, run.rerank),
        created_at=run.created_at,
        completed_at=run.clock(),
        artifact=artifact,
        corpus=spec.corpus if spec is not None and manifest else None,
        namespace=_namespace(run) if manifest else None,
        citations=citations,
        fallbacks=tuple(fallbacks),
        state=None
        if spec is None or spec.mode == "off"
        else RetrievalState(
            query_count=run.successes,
            max_queries=spec.max_queries,
            seen=tuple(sorted(run.seen)),
            sources=tuple(sorted({p.source_id for p in run.evidence.values()})),
        ),
    )


def cited_ids(text: str) -> list[str]:
    """The `[source:ID]` handles of a text, first mention first."""
    return list(dict.fromkeys(re.findall(r"\[source:([^\[\]\s]+)\]", text)))


def _namespace(run: ActiveRun) -> str | None:
    """The namespace the cited evidence was read in (one: evidence of another namespace is
    dropped or fails the run when re-authorized before recording)."""
    namespaces = {p.namespace for p in run.cited_evidence().values()}
    return namespaces.pop() if len(namespaces) == 1 else None

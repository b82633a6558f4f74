"""Run results exactly as the previous release stored them: the public wire JSON of the result,
no version field (`wire/run_storage.py` calls this storage version 1)."""

from __future__ import annotations

from retrieval_host.core.models import EmbeddingUsage, Location
from retrieval_host.core.runs_model import (
    GenerationUsage,
    ManifestEntry,
    OutputArtifact,
    Receipt,
    RunResult,
    RunUsage,
)

# `result_json` exactly as the previous release wrote it (its `json.dumps(result_to_json(r),
# separators=(",", ":"))`), for `OLD_RESULT`. A literal on purpose: it must not follow the
# public wire if that changes.
OLD_RESULT_JSON = (
    '{"runId":"run_old","status":"completed","provider":"local","model":"extractive",'
    '"text":"Otters \\u201csleep\\u201d holding hands [source:a-1] [source:b-2].",'
    '"sources":[{"id":"a-1","origin":"retrieval","source":{"id":"a","revision":"r1"},'
    '"title":"Otters","location":{"page":2,"startLine":3,"endLine":4}},'
    '{"id":"b-2","origin":"retrieval","source":{"id":"b","revision":"r7"},"title":"",'
    '"location":{"documentId":"mail-9"}}],'
    '"receipts":[{"sequence":1,"query":"otters","key":"k1",'
    '"startedAt":"2026-01-01T00:00:00.000Z","status":"ok","sourceIds":["a-1"],'
    '"errorCode":null},{"sequence":2,"query":"sleep","key":"k2",'
    '"startedAt":"2026-01-01T00:00:00.500Z","status":"failed","sourceIds":[],'
    '"errorCode":"PERMISSION_DENIED"},{"sequence":3,"query":"otters","key":"k1",'
    '"startedAt":"2026-01-01T00:00:00.600Z","status":"duplicate","sourceIds":[],'
    '"errorCode":null}],'
    '"usage":{"generation":{"requests":2,"inputTokens":10,"outputTokens":5},'
    '"embedding":{"requests":1,"inputTokens":7}},'
    '"artifact":{"name":"answer.md","mediaType":"text/markdown","sourceIds":["a-1"]},'
    '"corpus":"docs","createdAt":"2026-01-01T00:00:00.000Z",'
    '"completedAt":"2026-01-01T00:00:01.000Z","replayed":false}'
)
OLD_PLAIN_JSON = (
    '{"runId":"run_plain","status":"completed","provider":"local","model":"extractive",'
    '"text":"Hi.","sources":[],"receipts":[],"usage":{"generation":{"requests":0,'
    '"inputTokens":0,"outputTokens":0},"embedding":{"requests":0,"inputTokens":0}},'
    '"artifact":null,"corpus":null,"createdAt":"t0","completedAt":"t1","replayed":false}'
)
OLD_RESULT = RunResult(
    run_id="run_old",
    status="completed",
    provider="local",
    model="extractive",
    text="Otters \u201csleep\u201d holding hands [source:a-1] [source:b-2].",
    sources=[
        ManifestEntry("a-1", "a", "r1", Location(page=2, start_line=3, end_line=4), "Otters"),
        ManifestEntry("b-2", "b", "r7", Location(document_id="mail-9")),
    ],
    receipts=[
        Receipt(1, "otters", "k1", "2026-01-01T00:00:00.000Z", "ok", ["a-1"]),
        Receipt(2, "sleep", "k2", "2026-01-01T00:00:00.500Z", "failed", [], "PERMISSION_DENIED"),
        Receipt(3, "otters", "k1", "2026-01-01T00:00:00.600Z", "duplicate", []),
    ],
    usage=RunUsage(GenerationUsage(2, 10, 5), EmbeddingUsage(1, 7)),
    created_at="2026-01-01T00:00:00.000Z",
    completed_at="2026-01-01T00:00:01.000Z",
    artifact=OutputArtifact("answer.md", "text/markdown", ["a-1"]),
    corpus="docs",
)
OLD_PLAIN = RunResult(
    "run_plain", "completed", "local", "extractive", "Hi.", [], [], RunUsage(), "t0", "t1"
)

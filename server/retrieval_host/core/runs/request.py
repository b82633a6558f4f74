"""What a run request must satisfy before a run exists, and when two requests are the same."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, replace

from retrieval_host.core.descriptor import check_label
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.filters import parse_filter
from retrieval_host.core.models import SEARCH_MODES
from retrieval_host.core.reasons import InvalidRequestReason
from retrieval_host.core.runs_model import RETRIEVAL_MODES, Fallbacks, RunRequest
from retrieval_host.core.validation import MAX_LIMIT, check_not_one_string, check_text

# As the wire's `input` (a black-box test: in-process took four times as much); at most
# `MAX_INPUT_BYTES` of UTF-8 so.
MAX_INPUT_CHARS = 16_384
MAX_INPUT_BYTES = 4 * MAX_INPUT_CHARS
MAX_GENERATION_STEPS = 16
MAX_RERANK_CALLS = 16
# `RunRetrieval` fields added after runs were first recorded, with their defaults.
_ADDED_RETRIEVAL_DEFAULTS = {
    "search_mode": "hybrid",
    "rerank": None,
    "max_rerank_calls": 3,
    "max_age_s": None,
    "filters": None,
    "min_score": None,
}


# Fallbacks added after the first ones, at their defaults: left out like the fields above.
_ADDED_FALLBACK_DEFAULTS: dict[str, object] = {"search_failed": None, "answer_rejected": "fail"}
_ORIGINAL_FALLBACKS = {
    k: v for k, v in asdict(Fallbacks()).items() if k not in _ADDED_FALLBACK_DEFAULTS
}


# The most attempts a run may allow per model call (`RunRequest.max_attempts`).
MAX_ATTEMPTS = 5


def request_fingerprint(request: RunRequest) -> str:
    """What makes two run requests 'the same' for an idempotency key (timeouts excluded).

    Fields added later are left out at their defaults, as if they did not exist: runs recorded
    before them keep their fingerprints, so replaying their keys still finds them."""
    body = asdict(replace(request, idle_timeout_ms=None))
    for added in ("citations", "max_tokens"):
        if body.get(added) is None:
            del body[added]  # added later: absent, as in the runs recorded before it
    if body.get("max_attempts") == 1:
        del body["max_attempts"]
    fallbacks = body.get("fallbacks")
    if isinstance(fallbacks, dict):
        for added, default in _ADDED_FALLBACK_DEFAULTS.items():
            if fallbacks.get(added) == default:
                del fallbacks[added]
        if fallbacks == _ORIGINAL_FALLBACKS:
            del body["fallbacks"]
    retrieval = body.get("retrieval")
    if isinstance(retrieval, dict):
        for name, default in _ADDED_RETRIEVAL_DEFAULTS.items():
            if retrieval.get(name) == default:
                del retrieval[name]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def check_model(provider: object, request: RunRequest) -> None:
    """Refuse a model the provider says it does not serve (`GenerationProvider`'s optional
    `models`); the offline extractive provider serves only `extractive`."""
    served = getattr(provider, "models", None)
    if isinstance(served, (set, frozenset)) and request.model not in served:
        names = ", ".join(sorted(str(name) for name in served))
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST,
            f"Provider {request.provider!r} serves the model(s) {names}, not {request.model!r}.",
            reason=InvalidRequestReason.UNKNOWN_MODEL,
        )


def check_run_request(request: RunRequest) -> None:
    """Raise `INVALID_REQUEST` for a request no run may start from."""
    check_label("provider", request.provider)
    check_label("model", request.model, model=True)
    if (
        not isinstance(request.input, str)
        or not request.input.strip()
        or len(request.input) > MAX_INPUT_CHARS
    ):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"input must be 1-{MAX_INPUT_CHARS} characters of text."
        )
    check_text("input", request.input)  # no NUL, no lone surrogate (a raw encoding error)
    if not 1 <= request.max_generation_steps <= MAX_GENERATION_STEPS:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"maxGenerationSteps must be in 1..{MAX_GENERATION_STEPS}."
        )
    if isinstance(request.max_attempts, bool) or not 1 <= request.max_attempts <= MAX_ATTEMPTS:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"maxAttempts must be in 1..{MAX_ATTEMPTS}."
        )
    if request.max_tokens is not None and (
        isinstance(request.max_tokens, bool) or request.max_tokens < 1
    ):
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "maxTokens must be positive.")
    if request.idle_timeout_ms is not None and request.idle_timeout_ms < 1:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "idleTimeoutMs must be positive.")
    if request.idempotency_key is not None and not 1 <= len(request.idempotency_key) <= 200:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "idempotencyKey must be 1-200 chars.")
    r = request.retrieval
    if r is not None and r.mode not in RETRIEVAL_MODES:
        # A typo must not run without evidence: anything but these three is refused.
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, "retrieval mode must be off, before or tool."
        )
    if r is not None and not 0 <= r.max_queries <= 16:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "maxQueries must be in 0..16.")
    if r is not None and r.mode != "off" and r.max_queries == 0:
        # A run's evidence comes from its searches: none allowed can only end without any.
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"maxQueries must be at least 1 in {r.mode} mode."
        )
    if r is not None and (
        isinstance(r.limit, bool) or not isinstance(r.limit, int) or not 1 <= r.limit <= MAX_LIMIT
    ):
        raise RetrievalError(ErrorCode.INVALID_REQUEST, f"limit must be in 1..{MAX_LIMIT}.")
    if r is not None and r.max_context_bytes is not None and r.max_context_bytes < 1:
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "maxContextBytes must be positive.")
    if r is not None and not 0 <= r.max_rerank_calls <= MAX_RERANK_CALLS:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"maxRerankCalls must be in 0..{MAX_RERANK_CALLS}."
        )
    if r is not None and r.search_mode not in SEARCH_MODES:
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, "searchMode must be hybrid, dense or lexical."
        )
    if r is not None and r.filters is not None:
        parse_filter(r.filters)  # a malformed filter refuses the run, not each of its searches
    if r is not None and r.source_ids is not None:
        check_not_one_string("source ids", r.source_ids)
    if (
        r is not None
        and r.min_score is not None
        and (isinstance(r.min_score, bool) or not math.isfinite(r.min_score))
    ):
        raise RetrievalError(ErrorCode.INVALID_REQUEST, "minScore must be a finite number.")

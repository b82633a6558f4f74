"""The trusted context of a call: who asks (from the token, never the body) and how to stop."""

from __future__ import annotations

from dataclasses import dataclass, field

from retrieval_host.core.cancel import CancelToken


@dataclass(frozen=True, slots=True)
class RequestContext:
    subject: str
    cancel: CancelToken = field(default_factory=CancelToken)
    request_id: str | None = None

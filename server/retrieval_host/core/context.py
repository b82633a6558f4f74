"""The trusted context of a call: who asks (from the token, never the body) and how to stop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.models import JSONValue

ProgressSink = Callable[[str, Mapping[str, JSONValue]], None]


@dataclass(frozen=True, slots=True)
class RequestContext:
    subject: str
    cancel: CancelToken = field(default_factory=CancelToken)
    request_id: str | None = None
    # Receives (phase, context) as work advances: runs turn these into `run.progress` events.
    on_progress: ProgressSink | None = None

    def report(self, phase: str, **details: JSONValue) -> None:
        if self.on_progress is not None:
            self.on_progress(phase, details)

"""The event stream of an ingest (`Accept: text/event-stream`), read the same way by both
clients: typed events, the progress handed to the caller, the result or the typed error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeAlias

from pydantic import ValidationError

from retrieval_host_client._errors import ProtocolError, error_from_problem
from retrieval_host_client._sse import ServerSentEvent, SSEDecoder, SSEError
from retrieval_host_client.models import (
    IndexResponse,
    IngestCompletedEvent,
    IngestEvent,
    IngestFailedEvent,
    IngestProgressEvent,
    IngestStartedEvent,
)

__all__ = ["IngestEventReader", "ProgressCallback"]

ProgressCallback: TypeAlias = Callable[[IngestProgressEvent], None]

_EventModel: TypeAlias = (
    type[IngestStartedEvent]
    | type[IngestProgressEvent]
    | type[IngestCompletedEvent]
    | type[IngestFailedEvent]
)
_MODELS: Final[Mapping[str, _EventModel]] = {
    "ingest.started": IngestStartedEvent,
    "ingest.progress": IngestProgressEvent,
    "ingest.completed": IngestCompletedEvent,
    "ingest.failed": IngestFailedEvent,
}


def _event(sse: ServerSentEvent) -> IngestEvent | None:
    model = _MODELS.get(sse.event)
    if model is None:
        return None  # an event type this client does not know yet: skipped, not an error
    try:
        return model.model_validate_json(sse.data)
    except ValidationError as exc:
        raise ProtocolError(
            f"a malformed {sse.event} event: {exc.error_count()} error(s)"
        ) from None


class IngestEventReader:
    """Turns the bytes of an ingest's event stream into typed events, in order:
    `ingest.started`, progress, then `ingest.completed` (its result must pass `check`) or
    `ingest.failed`. Each progress event goes to `on_progress` as it is read. Nothing after
    the terminal event is read as an event (as `RunEventReader`)."""

    def __init__(
        self,
        check: Callable[[IndexResponse], IndexResponse],
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self._decoder = SSEDecoder()
        self._check = check
        self._on_progress = on_progress
        self.started = False
        self.result: IndexResponse | None = None
        self.failure: IngestFailedEvent | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None or self.failure is not None

    def feed(self, chunk: bytes) -> None:
        """Decode a chunk of the response body, handling the events it completes."""
        try:
            decoded = self._decoder.feed(chunk)
        except SSEError as exc:
            raise ProtocolError(str(exc)) from None
        for sse in decoded:
            if self.finished:
                break
            event = _event(sse)
            if event is not None:
                self._accept(event)

    def _accept(self, event: IngestEvent) -> None:
        if isinstance(event, IngestStartedEvent):
            if self.started:
                raise ProtocolError("a second ingest.started event")
            self.started = True
            return
        if not self.started:
            raise ProtocolError(f"a {event.type} event before ingest.started")
        if isinstance(event, IngestProgressEvent):
            if self._on_progress is not None:
                self._on_progress(event)
        elif isinstance(event, IngestCompletedEvent):
            self.result = self._check(event.result)
        else:
            self.failure = event

    def end(self) -> None:
        """The body ended: raise `ProtocolError` unless the terminal event was read."""
        truncated = self._decoder.end()
        if not self.finished:
            what = "in the middle of an event" if truncated else "before the ingest ended"
            raise ProtocolError(f"the event stream stopped {what}")

    def outcome(self) -> IndexResponse:
        """The index result, or the typed error of the failed ingest."""
        if self.result is not None:
            return self.result
        if self.failure is not None:
            raise error_from_problem(self.failure.problem)
        raise ProtocolError("the ingest has not ended")

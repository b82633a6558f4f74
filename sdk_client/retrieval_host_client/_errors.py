"""Typed errors of the client. Each carries the stable problem `code` of the host."""

from __future__ import annotations


class RetrievalHostError(Exception):
    """Base of every error this package raises. `code` is the host's stable problem code."""

    code: str = "INTERNAL"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidCitationError(RetrievalHostError, ValueError):
    """A `[source:ID]` marker is malformed or unknown, or a required citation is absent."""

    code = "INVALID_CITATION"

"""The citation check, re-exported from the client package so both sides run the same code."""

from retrieval_host_client import InvalidCitationError, validate_source_citations

__all__ = ["InvalidCitationError", "validate_source_citations"]

"""Typed Python client of retrieval-host."""

from retrieval_host_client._citations import validate_source_citations
from retrieval_host_client._errors import InvalidCitationError, RetrievalHostError

__all__ = ["InvalidCitationError", "RetrievalHostError", "validate_source_citations"]

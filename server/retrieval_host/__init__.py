"""retrieval-host: authenticated HTTPS retrieval, authorized search and grounded runs."""

"""The domain core: models, errors, ports and the retrieval service. No I/O lives here."""

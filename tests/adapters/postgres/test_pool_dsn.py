"""A connection string libpq cannot parse is a typed error that never shows the string.

libpq's own message quotes it whole (`missing "=" after "postgresql//user:PASSWORD@..."`):
a black-box tester left out one `:` and `serve` printed the password in a traceback, exit 1.
No server is needed: the string is refused before any connection."""

from __future__ import annotations

import traceback

import pytest

from retrieval_host.adapters.postgres.pool import ConnectionPool
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason

SECRET = "Sup3rSecretPW"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql//postgres:{SECRET}@127.0.0.1:55480/postgres",  # one `:` left out
        f"mysql://root:{SECRET}@127.0.0.1/library",
        f"postgresql://postgres:{SECRET}@[::1/postgres",  # an unclosed IPv6 address
        f"host=127.0.0.1 password='{SECRET}",  # an unclosed quote
        f"host=127.0.0.1 password={SECRET} sslmod=require",  # an unknown key
    ],
)
def test_an_unparsable_dsn_is_store_unavailable_without_any_part_of_it(dsn: str) -> None:
    with pytest.raises(RetrievalError) as refused:
        ConnectionPool(dsn, 1, lambda conn: None)
    error = refused.value
    assert error.code is ErrorCode.STORE_UNAVAILABLE
    assert error.reason == StoreUnavailableReason.CONNECTION
    assert "store.postgresDsn" in error.detail
    # Not in the message, nor in a cause or context a traceback or a log would print.
    assert error.__cause__ is None and error.__context__ is None
    assert SECRET not in "".join(traceback.format_exception(error))
    for part in ("127.0.0.1", "root", "postgres:", "sslmod"):
        assert part not in str(error)

"""A database limit (SQLSTATE class 54) is reported as such, not as a failed connection.

psycopg raises class 54 ("program limit exceeded") as an `OperationalError`, and the store
reported it as reason `connection`, which tells a client to try again: a source holding a word
too long for a btree index row was retried in vain forever (probe "parity", session 44).
"""

from __future__ import annotations

import json
import random

import psycopg
import pytest

from retrieval_host.adapters.postgres.pool import translated
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import StoreUnavailableReason
from retrieval_host.http.problems import error_response
from tests.support.pg import connect


def test_an_index_row_over_the_btree_limit_is_a_database_error(pg_dsn: str) -> None:
    word = random.Random(54).randbytes(1400).hex()  # 2,800 bytes pglz cannot compress
    with connect(pg_dsn) as conn:
        conn.execute('CREATE TEMP TABLE terms (term text COLLATE "C" PRIMARY KEY)')
        with pytest.raises(RetrievalError) as caught, translated("replacing a source"):
            conn.execute("INSERT INTO terms VALUES (%s)", (word,))
    error = caught.value
    assert isinstance(error.__cause__, psycopg.errors.ProgramLimitExceeded)
    assert isinstance(error.__cause__, psycopg.OperationalError)  # why it read as a connection
    assert error.code is ErrorCode.STORE_UNAVAILABLE
    assert error.reason == StoreUnavailableReason.DATABASE_ERROR
    assert error.detail == (
        "a database limit was exceeded while replacing a source; the same request fails again."
    )
    response = error_response(error, "req-54")
    assert response.status_code == 503
    assert "retry-after" not in response.headers  # no invitation to try again
    body = json.loads(bytes(response.body))
    assert body["reason"] == "database-error" and word not in body["detail"]

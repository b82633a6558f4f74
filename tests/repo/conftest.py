"""The quality harness's PostgreSQL test uses the session's real server (`tests.support.pg`)."""

from __future__ import annotations

from tests.support.pg import pg_dsn

__all__ = ["pg_dsn"]

"""Fixtures of the PostgreSQL tests: one real server per session (see `tests.support.pg`)."""

from __future__ import annotations

from tests.support.pg import pg_dsn, pg_schema

__all__ = ["pg_dsn", "pg_schema"]

"""A metadata filter (`core.filters`) as one SQL condition on `s.metadata` (jsonb), meaning
exactly what `core.filters.matches` means: the store contract runs both on the same cases.

Every piece is true or false, never NULL (an absent key makes `->` NULL, hence the
`COALESCE`s), so that `NOT` negates as the core does. Keys and operands are parameters;
numbers compare as `numeric` (the exact value of their JSON text, as the core's `Decimal`),
strings in code point order (`COLLATE "C"` on UTF-8), and a value of another kind never
compares: `CASE` keeps the cast from ever seeing it.
"""

from __future__ import annotations

import json

from psycopg import sql

from retrieval_host.core.filters import AllOf, Condition, MetadataFilter
from retrieval_host.core.models import JSONScalar

__all__ = ["filter_sql"]

_ORDER = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_FOUND = sql.SQL("COALESCE(s.metadata -> %s = ANY(%s::jsonb[]), false)")
_EQUAL = sql.SQL("COALESCE(s.metadata -> %s = %s::jsonb, false)")
_STRING = sql.SQL(
    "(CASE WHEN jsonb_typeof(s.metadata -> %s) = 'string' THEN "
    '(s.metadata ->> %s) COLLATE "C" {sign} %s::text COLLATE "C" ELSE false END)'
)
_NUMBER = sql.SQL(
    "(CASE WHEN jsonb_typeof(s.metadata -> %s) = 'number' THEN "
    "(s.metadata ->> %s)::numeric {sign} %s::numeric ELSE false END)"
)
_NOT = sql.SQL("NOT ")


def _json(value: JSONScalar) -> str:
    return json.dumps(value, allow_nan=False)


def _condition(c: Condition, params: list[object]) -> sql.Composable:
    if isinstance(c.operand, tuple):  # in, nin
        params.extend([c.key, [_json(v) for v in c.operand]])
        return _FOUND if c.op == "in" else _NOT + _FOUND
    if c.op in ("eq", "ne"):
        params.extend([c.key, _json(c.operand)])
        return _EQUAL if c.op == "eq" else _NOT + _EQUAL
    sign = sql.SQL(_ORDER[c.op])
    if isinstance(c.operand, str):
        params.extend([c.key, c.key, c.operand])
        return _STRING.format(sign=sign)
    params.extend([c.key, c.key, _json(c.operand)])
    return _NUMBER.format(sign=sign)


def filter_sql(tree: MetadataFilter | None, params: list[object]) -> sql.Composable:
    """The SQL condition of `tree` over the sources table aliased `s`; its parameters are
    appended to `params`, in order. No filter: `true`."""
    if tree is None:
        return sql.SQL("true")
    if isinstance(tree, Condition):
        return _condition(tree, params)
    if not tree.parts:
        return sql.SQL("true" if isinstance(tree, AllOf) else "false")
    joiner = sql.SQL(" AND " if isinstance(tree, AllOf) else " OR ")
    return sql.SQL("({})").format(joiner.join(filter_sql(part, params) for part in tree.parts))

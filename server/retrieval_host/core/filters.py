"""Metadata filters: the JSON a search names them in, parsed once into a tree the stores apply
before anything is ranked (SQLite through `matches`, PostgreSQL by compiling the same tree to
SQL over `jsonb`).

The JSON (the same in-process and on the wire):

    filter  = {clause, ...}                      every clause holds ({} matches every source)
    clause  = key: scalar                        shorthand for {"eq": scalar}
            | key: {op: operand, ...}            every operator holds (at least one)
            | "and": [filter, ...]               every filter holds
            | "or": [filter, ...]                at least one filter holds

    eq, ne        a scalar (string, number, boolean or null)
    in, nin       a list of 1-100 scalars
    gt, gte,      a number or a string; the key's value must be of the same kind
    lt, lte

`and` and `or` are combinators only with a list value; with any other value they are keys
like any other (a list is never a comparison operand). Comparison is JSON's, not Python's:
`true` never equals `1`, numbers compare by exact decimal value (`1` equals `1.0`), strings by
code point. A key that is absent, or whose value is a list or an object, satisfies only `ne`
and `nin`: those are the negations of `eq` and `in`.

Bounds: 16 clauses per object, 16 filters per `and`/`or`, combinators nested at most 3 deep
(counting the top object), 100 values per `in`/`nin`, and 256 conditions in all (each
operator counts one), so that a filter's cost stays small beside the search it narrows.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal, TypeAlias

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import JSONScalar
from retrieval_host.core.validation import check_id, check_text

__all__ = [
    "AllOf",
    "AnyOf",
    "Condition",
    "MetadataFilter",
    "conditions",
    "matches",
    "parse_filter",
]

Operator: TypeAlias = Literal["eq", "ne", "in", "nin", "gt", "gte", "lt", "lte"]
OPERATORS: tuple[Operator, ...] = ("eq", "ne", "in", "nin", "gt", "gte", "lt", "lte")
ORDERINGS: frozenset[str] = frozenset({"gt", "gte", "lt", "lte"})

MAX_CLAUSES = 16
MAX_BRANCHES = 16
MAX_DEPTH = 3
MAX_VALUES = 100
MAX_CONDITIONS = 256


@dataclass(frozen=True, slots=True)
class Condition:
    """`key op operand`; `operand` is a tuple of scalars for `in` and `nin`, whose `members`
    are what `matches` looks a value up in."""

    key: str
    op: Operator
    operand: JSONScalar | tuple[JSONScalar, ...]
    # Built once per filter, not per source: the largest filter the bounds allow (256
    # conditions of 100 values) cost 73 ms per source compared value by value (a black-box
    # test held the store for minutes with it over 10,000 sources); 0.3 ms with sets.
    members: frozenset[tuple[str, object]] = field(
        default=frozenset(), init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if isinstance(self.operand, tuple):
            object.__setattr__(self, "members", frozenset(_member(v) for v in self.operand))


@dataclass(frozen=True, slots=True)
class AllOf:
    parts: tuple[MetadataFilter, ...]


@dataclass(frozen=True, slots=True)
class AnyOf:
    parts: tuple[MetadataFilter, ...]


MetadataFilter: TypeAlias = Condition | AllOf | AnyOf


def _invalid(detail: str) -> RetrievalError:
    return RetrievalError(ErrorCode.INVALID_REQUEST, detail)


def _scalar(where: str, value: object) -> JSONScalar:
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str):
            check_text(where, value)
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise _invalid(f"{where} must be a finite number.")
        return value
    raise _invalid(f"{where} must be a string, number, boolean or null.")


def _operand(key: str, op: str, value: object) -> JSONScalar | tuple[JSONScalar, ...]:
    where = f"filter {key!r} {op}"
    if op in ("in", "nin"):
        if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_VALUES:
            raise _invalid(f"{where} takes a list of 1-{MAX_VALUES} values.")
        return tuple(_scalar(where, v) for v in value)
    scalar = _scalar(where, value)
    if op in ORDERINGS and (scalar is None or isinstance(scalar, bool)):
        raise _invalid(f"{where} compares a number or a string.")
    return scalar


def _clause(key: str, value: object, depth: int) -> list[MetadataFilter]:
    if key in ("and", "or") and isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            # It said "'and'/'or' at most 3 deep" of three combinators (a black-box test).
            raise _invalid(
                f"filters nest at most {MAX_DEPTH} objects deep, so 'and'/'or' may appear in "
                f"the first {MAX_DEPTH - 1} only."
            )
        if not 1 <= len(value) <= MAX_BRANCHES:
            raise _invalid(f"filter '{key}' takes a list of 1-{MAX_BRANCHES} filters.")
        parts = tuple(_object(part, depth + 1) for part in value)
        return [AllOf(parts) if key == "and" else AnyOf(parts)]
    check_id("filter key", key)
    if isinstance(value, Mapping):
        if not value:
            raise _invalid(f"filter {key!r} needs at least one operator.")
        found: list[MetadataFilter] = []
        for op, operand in value.items():
            if op not in OPERATORS:
                raise _invalid(
                    f"filter {key!r}: unknown operator {op!r} (one of {', '.join(OPERATORS)})."
                )
            found.append(Condition(key, op, _operand(key, op, operand)))
        return found
    if isinstance(value, list | tuple):
        raise _invalid(f"filter {key!r}: a list is not a value (use 'in').")
    return [Condition(key, "eq", _scalar(f"filter {key!r}", value))]


def _object(raw: object, depth: int) -> MetadataFilter:
    if not isinstance(raw, Mapping):
        raise _invalid("a filter is a JSON object.")
    if len(raw) > MAX_CLAUSES:
        raise _invalid(f"a filter object has at most {MAX_CLAUSES} keys.")
    parts: list[MetadataFilter] = []
    for key, value in raw.items():
        if not isinstance(key, str):
            raise _invalid("filter keys are strings.")
        parts.extend(_clause(key, value, depth))
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))  # {}: AllOf(()), always true


def parse_filter(raw: Mapping[str, object]) -> MetadataFilter:
    """The tree of a filter in its JSON form; `INVALID_REQUEST` naming the first fault."""
    tree = _object(raw, 1)
    if conditions(tree) > MAX_CONDITIONS:
        raise _invalid(f"a filter has at most {MAX_CONDITIONS} conditions.")
    return tree


def conditions(tree: MetadataFilter) -> int:
    if isinstance(tree, Condition):
        return 1
    return sum(conditions(part) for part in tree.parts)


# --- evaluation (the reference every store must agree with) ----------------------------------


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "structured"


@functools.lru_cache(maxsize=4096)
def _number(value: int | float) -> Decimal:
    # The exact value of the number's JSON text: what PostgreSQL's `numeric` compares. Cached:
    # a filter compares the same operands with every source's value (1 and 1.0 share an entry,
    # and their Decimals are equal, which is all a comparison asks).
    return Decimal(json.dumps(value))


def _member(value: object) -> tuple[str, object]:
    """What `in`/`nin` compare by: the kind (so `true` is not `1`) and, for a number, its
    exact decimal value (so `1` is `1.0`)."""
    kind = _kind(value)
    if kind == "number" and isinstance(value, int | float):
        return kind, _number(value)
    return kind, value


def _equal(have: object, want: JSONScalar) -> bool:
    kind = _kind(have)
    if kind != _kind(want):
        return False
    if kind == "number" and isinstance(have, int | float) and isinstance(want, int | float):
        return _number(have) == _number(want)
    return have == want


_ORDER = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}


def _ordered(have: object, op: str, want: JSONScalar) -> bool:
    kind = _kind(have)
    if kind != _kind(want):
        return False
    if kind == "number" and isinstance(have, int | float) and isinstance(want, int | float):
        return bool(_ORDER[op](_number(have), _number(want)))
    if isinstance(have, str) and isinstance(want, str):
        return bool(_ORDER[op](have, want))
    return False


def _holds(condition: Condition, metadata: Mapping[str, object]) -> bool:
    present = condition.key in metadata
    have = metadata.get(condition.key)
    op, operand = condition.op, condition.operand
    if isinstance(operand, tuple):  # in, nin
        found = present and _kind(have) != "structured" and _member(have) in condition.members
        return found if op == "in" else not found
    if op in ("eq", "ne"):
        equal = present and _equal(have, operand)
        return equal if op == "eq" else not equal
    return present and _ordered(have, op, operand)


def matches(tree: MetadataFilter | None, metadata: Mapping[str, object]) -> bool:
    """Whether a source with this metadata passes the filter (no filter: every source)."""
    if tree is None:
        return True
    if isinstance(tree, Condition):
        return _holds(tree, metadata)
    if isinstance(tree, AllOf):
        return all(matches(part, metadata) for part in tree.parts)
    return any(matches(part, metadata) for part in tree.parts)


def operands(values: Sequence[JSONScalar]) -> list[str]:
    """The JSON texts of scalar operands, as a store passes them to `jsonb`."""
    return [json.dumps(v, allow_nan=False) for v in values]

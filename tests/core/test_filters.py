"""`core.filters`: the filter language's rules (what is refused, and why) and its meaning."""

from __future__ import annotations

from typing import Any

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.filters import (
    MAX_CONDITIONS,
    AllOf,
    AnyOf,
    Condition,
    conditions,
    matches,
    parse_filter,
)

BOOK = {"lang": "en", "year": 2021, "draft": False, "score": 0.5, "tags": ["a"], "none": None}


def holds(raw: dict[str, Any], metadata: dict[str, Any] = BOOK) -> bool:
    return matches(parse_filter(raw), metadata)


def test_a_scalar_is_equality_and_an_object_holds_every_clause() -> None:
    assert parse_filter({"lang": "en"}) == Condition("lang", "eq", "en")
    assert parse_filter({"lang": "en", "year": {"gte": 2020, "lt": 2022}}) == AllOf(
        (
            Condition("lang", "eq", "en"),
            Condition("year", "gte", 2020),
            Condition("year", "lt", 2022),
        )
    )
    assert parse_filter({}) == AllOf(())
    assert holds({})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"lang": "en"}, True),
        ({"lang": {"ne": "en"}}, False),
        ({"lang": {"in": ["de", "en"]}}, True),
        ({"lang": {"nin": ["de", "en"]}}, False),
        ({"year": {"gt": 2020}}, True),
        ({"year": {"gte": 2021, "lte": 2021}}, True),
        ({"year": {"lt": 2021}}, False),
        ({"year": 2021.0}, True),  # numbers by value
        ({"draft": 0}, False),  # JSON: false is not 0
        ({"draft": False}, True),
        ({"none": None}, True),
        ({"missing": None}, False),  # absent is not null
        ({"missing": {"ne": "x"}}, True),  # ne and nin negate eq and in
        ({"missing": {"nin": ["x"]}}, True),
        ({"missing": {"gt": 0}}, False),
        ({"tags": "a"}, False),  # a list never equals a scalar
        ({"tags": {"ne": "a"}}, True),
        ({"year": {"gt": "2020"}}, False),  # a number never compares with a string
        ({"lang": {"gt": "de", "lt": "fr"}}, True),  # strings by code point
        ({"lang": {"gt": "EN"}}, True),  # lowercase after uppercase
        ({"score": {"gt": 0.49999999999999994}}, True),
    ],
)
def test_operators_mean_what_the_readme_says(raw: dict[str, Any], expected: bool) -> None:
    assert holds(raw) is expected


def test_and_or_combine_and_nest() -> None:
    either = {"or": [{"lang": "de"}, {"year": {"gte": 2021}}]}
    assert holds(either)
    assert not holds({"or": [{"lang": "de"}, {"year": {"gte": 2022}}]})
    assert holds({"and": [either, {"draft": False}]})
    assert not holds({"and": [either, {"draft": True}]})
    assert isinstance(parse_filter(either), AnyOf)
    # `and` with a value that is not a list is an ordinary key.
    assert holds({"and": "x"}, {"and": "x"})
    assert parse_filter({"or": {"eq": 1}}) == Condition("or", "eq", 1)


def test_numbers_compare_by_their_exact_decimal_value() -> None:
    # Past 2**53 a double cannot tell these apart; PostgreSQL's numeric can, and so do we.
    assert holds({"n": {"gt": 2**60}}, {"n": 2**60 + 1})
    assert not holds({"n": 2**60}, {"n": 2**60 + 1})
    # A float is the number its JSON text writes: 2.0**60 is written 1.152921504606847e+18.
    assert holds({"n": {"gt": 2**60 + 1}}, {"n": float(2**60)})
    assert holds({"n": 1152921504606847000}, {"n": float(2**60)})


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        ({"lang": ["en"]}, "a list is not a value"),
        ({"lang": {}}, "at least one operator"),
        ({"lang": {"like": "e%"}}, "unknown operator"),
        ({"lang": {"in": []}}, "list of 1-100"),
        ({"lang": {"in": list(range(101))}}, "list of 1-100"),
        ({"lang": {"in": "en"}}, "list of 1-100"),
        ({"lang": {"in": [["en"]]}}, "string, number, boolean or null"),
        ({"lang": {"eq": {"x": 1}}}, "string, number, boolean or null"),
        ({"year": {"gt": True}}, "compares a number or a string"),
        ({"year": {"lt": None}}, "compares a number or a string"),
        ({"year": float("nan")}, "finite"),
        ({"year": {"gte": float("inf")}}, "finite"),
        ({"lang": "a\x00b"}, "NUL"),
        ({" lang": "en"}, "filter key"),
        ({"la\x85ng": "en"}, "control"),
        ({"*": "en"}, "wildcard"),
        ({"and": []}, "list of 1-16"),
        ({"or": [{"a": 1}] * 17}, "list of 1-16"),
        ({"or": ["en"]}, "a filter is a JSON object"),
        ({"and": [{"and": [{"and": [{"a": 1}]}]}]}, "at most 3 objects deep"),
        ({f"k{i}": i for i in range(17)}, "at most 16 keys"),
    ],
)
def test_each_fault_is_refused_with_a_reason(raw: dict[str, Any], fault: str) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        parse_filter(raw)
    assert excinfo.value.code is ErrorCode.INVALID_REQUEST
    assert fault in str(excinfo.value), excinfo.value


def test_a_filter_holds_at_most_256_conditions() -> None:
    # 16 branches of 16 keys: 256 conditions pass, one more is refused.
    wide = {f"k{i}": i for i in range(16)}
    assert conditions(parse_filter({"or": [wide] * 16})) == MAX_CONDITIONS
    with pytest.raises(RetrievalError, match="at most 256 conditions"):
        parse_filter({"x": 1, "or": [wide] * 16})
    two_levels = {"and": [{"or": [wide] * 2}] * 9}
    with pytest.raises(RetrievalError, match="at most 256 conditions"):
        parse_filter(two_levels)

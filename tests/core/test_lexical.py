"""The lexical analyzer and BM25 reference: what both stores index and rank by."""

from __future__ import annotations

import math
import time

import pytest

from retrieval_host.core.lexical import (
    ANALYZER_EN_SNOWBALL_1,
    ANALYZER_EN_SNOWBALL_2,
    ANALYZER_EN_SNOWBALL_3,
    ANALYZER_EN_SNOWBALL_4,
    Bm25,
    analyze,
    query_terms,
    term_frequencies,
)


def test_the_analyzer_lowercases_drops_stop_words_and_one_letter_tokens_and_stems() -> None:
    assert analyze("The Running of the studies, a B-cell in 2024!", ANALYZER_EN_SNOWBALL_1) == [
        "run",
        "studi",
        "cell",
        "2024",
    ]
    assert query_terms("Studies running", ANALYZER_EN_SNOWBALL_1) == ["studi", "run"]


@pytest.mark.parametrize(
    ("text", "compounds"),
    [
        ("tdb 1.4.8-2 released", ["1.4.8-2"]),  # every part one character: no term before
        ("Python 3.11", ["3.11"]),
        ("C++ and C# and F#", ["c++", "c#", "f#"]),
        ("x-1-b", ["x-1-b"]),  # two joints
        ("IL-6 and well-known", []),  # a lone hyphen: the parts match already
        ("End of a sentence. Next one", []),
        ("東京 1.2-3", ["1.2-3"]),
        ("東京.大阪", []),  # CJK runs are pairs, not compounds
    ],
)
def test_the_third_analyzer_adds_a_term_for_versions_and_language_names(
    text: str, compounds: list[str]
) -> None:
    second = analyze(text, ANALYZER_EN_SNOWBALL_2)
    assert analyze(text, ANALYZER_EN_SNOWBALL_3) == second + compounds


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        # Vowel signs and viramas are not `\w`: the third analyzer cut these words to nothing.
        ("दिल्ली", ["दिल्ली"]),
        ("சென்னை நகரம்", ["சென்னை", "நகரம்"]),
        ("ঢাকা", ["ঢাকা"]),
        # Harakat, tatweel and Hebrew points are folded away, as Latin accents are.
        ("كَتَبَ", ["كتب"]),
        ("عـــربي", ["عربي"]),
        ("שָלוֹם", ["שלום"]),
        # ASCII and Latin text: the third analyzer's terms.
        ("Résumé of tdb 1.4.8-2 in C++", ["resum", "tdb", "1.4.8-2", "c++"]),
    ],
)
def test_the_fourth_analyzer_keeps_marks_inside_words_and_folds_semitic_points(
    text: str, terms: list[str]
) -> None:
    assert query_terms(text, ANALYZER_EN_SNOWBALL_4) == terms
    assert term_frequencies(text, ANALYZER_EN_SNOWBALL_4) == dict.fromkeys(terms, 1)


def test_the_fourth_analyzer_gives_a_passage_its_cjk_characters_beside_the_pairs() -> None:
    # A one-character word is a query term; a passage held only pairs, so it never matched.
    assert query_terms("猫", ANALYZER_EN_SNOWBALL_4) == ["猫"]
    assert query_terms("天気予報", ANALYZER_EN_SNOWBALL_4) == ["天気", "気予", "予報"]
    passage = term_frequencies("猫が好き。天気", ANALYZER_EN_SNOWBALL_4)
    assert passage == dict.fromkeys(["猫が", "が好", "好き", "天気", "猫", "が", "好", "き"], 1) | {
        "天": 1,
        "気": 1,
    }
    assert "猫" not in term_frequencies("猫が好き", ANALYZER_EN_SNOWBALL_3)


def test_term_frequencies_count_each_term() -> None:
    assert term_frequencies("cells cell CELL divide", ANALYZER_EN_SNOWBALL_1) == {
        "cell": 3,
        "divid": 1,
    }
    assert term_frequencies("the a an", ANALYZER_EN_SNOWBALL_1) == {}


def test_bm25_matches_the_formula_by_hand() -> None:
    bm25 = Bm25(k1=0.9, b=0.4)
    idf = math.log(1 + (10 - 2 + 0.5) / (2 + 0.5))
    weight = 3 / (3 + 0.9 * (1 - 0.4 + 0.4 * 4 / 5.0))
    passage = {"cell": 3, "divid": 1}
    score = bm25.score(["cell", "cell", "absent"], passage, {"cell": 2}, 10, 5.0)
    assert math.isclose(score, 2 * idf * weight)
    assert bm25.idf(10, 10) > 0  # a term in every passage still counts a little


@pytest.mark.parametrize(
    "text",
    ["a" * 40_000, "a." * 20_000, "a-" * 20_000 + "b", "+" * 40_000, "ab" * 20_000 + "++"],
    ids=["one-word", "dots", "hyphens", "pluses", "word-then-pluses"],
)
def test_the_third_analyzer_is_linear_in_the_text(text: str) -> None:
    """The compound pattern first tried each position inside a word run again: a word of
    16,000 characters took 4.7 s, one of 40,000 about 30 s (a query may hold 8 KiB, a
    passage more). Now milliseconds; the bound only tells quadratic from a slow machine."""
    started = time.perf_counter()
    terms = analyze(text, ANALYZER_EN_SNOWBALL_3)
    assert time.perf_counter() - started < 10.0
    assert len(terms) <= 2

"""Lexical retrieval, the pure part: the analyzer and the BM25 formula both stores use.

Analyzer `en-snowball-1` (the one bm25s uses for English, so the figures of issue 15 carry
over): lowercase; tokens are runs of two or more word characters (`(?u)\\b\\w\\w+\\b`, as
bm25s and scikit-learn); bm25s's English stop words are dropped; the rest is stemmed with the
Snowball English stemmer (PyStemmer). Passages and queries go through the same analyzer. A
change to any step is a new analyzer name: the name is part of the corpus descriptor, and the
stores keep term frequencies computed by it.

Scoring is BM25 in the variant bm25s calls "lucene": for each query term occurrence,

    idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl)),
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)),

with `tf` the term's count in the passage, `dl` the passage's term count (after stop words),
and `N`, `df`, `avgdl` taken over exactly the passages the search may rank: the allowed
revisions of one corpus namespace that match the request's filters (`VectorStore.lexical_search`).
Statistics over the whole namespace would let a caller see, in the scores of its own passages,
whether its query words occur in sources it may not read. With the whole namespace granted they
are the namespace's statistics. A term repeated in the query counts once per occurrence, as in
bm25s.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import Stemmer

ANALYZER_EN_SNOWBALL_1: Final = "en-snowball-1"
ANALYZERS: Final = frozenset({ANALYZER_EN_SNOWBALL_1})

_TOKEN: Final = re.compile(r"(?u)\b\w\w+\b")
# bm25s's `STOPWORDS_EN` (bm25s 0.2, `bm25s/stopwords.py`), copied as data: the analyzer must
# not change when that package does.
STOP_WORDS_EN: Final = frozenset(
    (
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into",
        "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then",
        "there", "these", "they", "this", "to", "was", "will", "with",
    )
)  # fmt: skip

# PyStemmer's stemmer objects keep a cache and are not safe to share between threads.
_stemmers = threading.local()


def _stemmer() -> Stemmer.Stemmer:
    stemmer: Stemmer.Stemmer | None = getattr(_stemmers, "english", None)
    if stemmer is None:
        stemmer = _stemmers.english = Stemmer.Stemmer("english")
    return stemmer


def analyze(text: str) -> list[str]:
    """The terms of `text`, in order, repeated as often as they occur."""
    tokens = [t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS_EN]
    stems: list[str] = _stemmer().stemWords(tokens)
    return stems


def term_frequencies(text: str) -> dict[str, int]:
    """Term -> count in `text` (a new dict); the passage's length is the sum of the counts."""
    return dict(Counter(analyze(text)))


def query_terms(text: str) -> list[str]:
    """The analyzed terms of a query (what `VectorStore.lexical_search` takes)."""
    return analyze(text)


@dataclass(frozen=True, slots=True)
class Bm25:
    """BM25 parameters of one corpus (`LexicalDescriptor.k1`, `.b`)."""

    k1: float
    b: float

    @staticmethod
    def idf(df: int, passages: int) -> float:
        """ln(1 + (N - df + 0.5) / (df + 0.5)): positive for every df <= N."""
        return math.log(1.0 + (passages - df + 0.5) / (df + 0.5))

    def weight(self, tf: float, length: float, average_length: float) -> float:
        """The term-frequency part for one passage (a reference; stores vectorise it)."""
        norm = self.k1 * (1.0 - self.b + self.b * length / average_length)
        return tf / (tf + norm)

    def score(
        self,
        query: Sequence[str],
        passage: Mapping[str, int],
        df: Mapping[str, int],
        passages: int,
        average_length: float,
    ) -> float:
        """One passage's score, term by term (the reference the store tests compare with)."""
        length = sum(passage.values())
        total = 0.0
        for term, count in sorted(Counter(query).items()):
            tf = passage.get(term, 0)
            if tf and df.get(term, 0):
                weight = self.weight(tf, length, average_length)
                total += count * self.idf(df[term], passages) * weight
        return total

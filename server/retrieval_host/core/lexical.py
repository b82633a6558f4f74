"""Lexical retrieval, the pure part: the analyzers and the BM25 formula both stores use.

Analyzer `en-snowball-1` (the one bm25s uses for English, so the figures of issue 15 carry
over): lowercase; tokens are runs of two or more word characters (`(?u)\\b\\w\\w+\\b`, as
bm25s and scikit-learn); bm25s's English stop words are dropped; the rest is stemmed with the
Snowball English stemmer (PyStemmer).

Analyzer `en-snowball-2`, the default of corpora created since (one created before keeps the
analyzer it was built with, its descriptor says which): the same, after folding the text so
that what reads alike matches alike, and with CJK text cut into words a query can hit:
- NFKC (compatibility forms: full-width letters, ligatures, superscripts), then case folding
  (`ß` is `ss`), then invisible format characters removed (soft hyphen, zero-width space and
  joiners, word joiner, BOM, bidi controls: `pass\u200bword` is `password`), then Latin,
  Greek and Cyrillic diacritics removed (`Résumé`, its decomposed NFD spelling and `resume`
  are one term; `İstanbul` is `istanbul`). Text that is ASCII only is just lowercased: on it
  both analyzers give the same terms.
- A run of Han, Hiragana, Katakana or Hangul characters gives its overlapping pairs of
  characters (`天気予報` is `天気 気予 予報`; a lone character is itself), as Lucene's CJK
  bigrams do; such scripts do not separate words with spaces, and a run is otherwise one
  token that only the whole run finds.
Symbols (emoji) are not words in either analyzer.

Analyzer `en-snowball-3`, the default of corpora created since (again, a corpus keeps the
analyzer it was built with): `en-snowball-2`'s terms, then one more term for each compound
that reads as a version, a decimal or a language name: word-character runs joined by `.`, `-`,
`+` or `#`, kept when the compound holds a `.`, `+` or `#`, or two or more joints (`1.4.8-2`,
`3.11`, `c++`, `c#`, `e.g`, `x-1-b`), not with a lone hyphen (`il-6`, `well-known`: their
parts already match). Parts of one character are no terms, so `1.4.8-2` had no term at all
and a message was found by none of its version (a black-box probe: 120 queries that were a
Debian version alone, the lexical search found the message in its top 10 for 42 %). Measured
on SciFact train against `en-snowball-2` by one script doing both (documents, BM25 and the
convex fusion as the stores do): hybrid nDCG@10 0.7381 vs 0.7386, lexical 0.6943 vs 0.6945;
a term for every joined compound cost 0.0064 in hybrid, hence the rule. `bench/quality.py` on a
new index: hybrid 0.741 / recall@100 0.943 as with `en-snowball-2`, lexical 0.692 (0.691).

Analyzer `en-snowball-4`, the default of corpora created since (a corpus keeps the analyzer it
was built with): `en-snowball-3`, with three changes for scripts other than Latin, Greek and
Cyrillic (on ASCII text it gives `en-snowball-3`'s terms):
- combining marks (Unicode Mn, Mc, Me: Indic vowel signs and viramas, among others) stay
  inside a word. They are not word characters to `\\w`, so a word was cut at each of them:
  `दिल्ली`, `சென்னை` and `ঢাকা` had no term at all, and a search for the document's own
  spelling found nothing (a black-box probe);
- Arabic vowel marks (harakat) and tatweel and Hebrew points are removed in folding, as Latin
  accents are: `كَتَبَ` and `كتب`, `שָלוֹם` and `שלום` are one term;
- a passage's CJK runs also give each character as a term, beside the pairs (a query's run of
  two or more still gives pairs only): a one-character word (`猫`) is a query term that no
  passage held, since passages had only pairs, so it never matched.
The first two apply to queries and passages alike; the third only to passages
(`term_frequencies`; `query_terms` does not add it).

Passages and queries go through the same analyzer (but for `en-snowball-4`'s passage
characters). A change to any step is a new analyzer name: the name is part of the corpus
descriptor, and the stores keep term frequencies computed by it.

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
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import Stemmer

from retrieval_host.core.unicode_marks import MARK_RANGES

ANALYZER_EN_SNOWBALL_1: Final = "en-snowball-1"
ANALYZER_EN_SNOWBALL_2: Final = "en-snowball-2"
ANALYZER_EN_SNOWBALL_3: Final = "en-snowball-3"
ANALYZER_EN_SNOWBALL_4: Final = "en-snowball-4"
ANALYZERS: Final = frozenset(
    {ANALYZER_EN_SNOWBALL_1, ANALYZER_EN_SNOWBALL_2, ANALYZER_EN_SNOWBALL_3, ANALYZER_EN_SNOWBALL_4}
)
# What a corpus created now is analyzed with.
DEFAULT_ANALYZER: Final = ANALYZER_EN_SNOWBALL_4

_TOKEN: Final = re.compile(r"(?u)\b\w\w+\b")
_WORD: Final = re.compile(r"(?u)\w+")
# `en-snowball-4`'s words: word characters and combining marks.
_MARKS: Final = "".join(f"\\U{start:08x}-\\U{end:08x}" for start, end in MARK_RANGES)
_WORD_WITH_MARKS: Final = re.compile(f"[\\w{_MARKS}]+")
# Removed by `en-snowball-4`'s folding: Hebrew points and cantillation, Arabic honorific and
# Quranic marks, harakat, superscript alef and tatweel (a letter-stretching character).
_SEMITIC_POINTS: Final = re.compile(
    "[\u0591-\u05bd\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7\u0610-\u061a\u0640\u064b-\u065f"
    "\u0670\u06d6-\u06dc\u06df-\u06e4\u06e7\u06e8\u06ea-\u06ed]"
)
# `en-snowball-3`'s compounds: word runs joined by `.`, `-`, `+` or `#` (a trailing `+`/`#`
# kept: `c++`); a term when `_COMPOUND_KEPT` finds a `.`, `+` or `#`, or two joints. Linear
# in the text: a match starts only where a word run does (`(?<!\w)`) and never gives back what
# a run took (possessive `++`); with plain `\w+` each position inside a long run was tried again
# and a 16,000-character word took 4.7 s (a test under load found it).
_COMPOUND: Final = re.compile(r"(?u)(?<!\w)\w++(?:[.+#-]\w++)++[+#]*+|(?<!\w)\w++[+#]++(?!\w)")
_COMPOUND_KEPT: Final = re.compile(r"[.+#]|[-.].*[-.]")
# Default-ignorable format characters a reader does not see: soft hyphen, combining grapheme
# joiner, Arabic letter mark, Mongolian and variation selectors, zero-width space and joiners,
# directional marks and controls, word joiner and invisible operators, BOM.
_INVISIBLE: Final = re.compile(
    "[\u00ad\u034f\u061c\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufe00-\ufe0f\ufeff]"
)
# The combining diacritical marks of Latin, Greek and Cyrillic (what NFD splits off accented
# letters); the combining signs of other scripts are letters' parts there, and kept.
_DIACRITICS: Final = re.compile("[\u0300-\u036f]")
_CJK_CLASS: Final = (
    "\u1100-\u11ff\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\U00020000-\U0003134f"
)
_CJK: Final = re.compile(f"[{_CJK_CLASS}]")
_CJK_OR_NOT: Final = re.compile(f"[{_CJK_CLASS}]+|[^{_CJK_CLASS}]+")
_CJK_RUN: Final = re.compile(f"[{_CJK_CLASS}]{{2,}}")
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


def analyze(text: str, analyzer: str, *, passage: bool = False) -> list[str]:
    """The terms of `text` by `analyzer`, in order, repeated as often as they occur; with
    `passage`, as a passage is analyzed (`en-snowball-4` adds CJK characters)."""
    if analyzer == ANALYZER_EN_SNOWBALL_1:
        words = _TOKEN.findall(text.lower())
    elif analyzer == ANALYZER_EN_SNOWBALL_2:
        words = _words(fold(text))
    elif analyzer == ANALYZER_EN_SNOWBALL_3:
        folded = fold(text)
        words = _words(folded) + _compounds(folded)
    elif analyzer == ANALYZER_EN_SNOWBALL_4:
        folded = fold(text)
        if not folded.isascii():
            folded = _SEMITIC_POINTS.sub("", folded)
        words = _words(folded, _WORD_WITH_MARKS) + _compounds(folded)
        if passage and not folded.isascii():
            words += _cjk_characters(folded)
    else:
        raise ValueError(f"unknown lexical analyzer {analyzer!r}")
    tokens = [t for t in words if t not in STOP_WORDS_EN]
    stems: list[str] = _stemmer().stemWords(tokens)
    return stems


def fold(text: str) -> str:
    """`en-snowball-2`'s folding (module docstring): compatibility forms, case, invisible
    characters and Latin, Greek and Cyrillic diacritics."""
    if text.isascii():
        return text.lower()
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text).casefold())
    return unicodedata.normalize("NFC", _DIACRITICS.sub("", unicodedata.normalize("NFD", text)))


def _words(folded: str, word: re.Pattern[str] = _WORD) -> list[str]:
    """Runs of two or more word characters (as `word` finds them); CJK runs as overlapping
    pairs (module docstring)."""
    if folded.isascii():
        return _TOKEN.findall(folded)
    words: list[str] = []
    for run in word.findall(folded):
        if not _CJK.search(run):
            if len(run) > 1:
                words.append(run)
            continue
        for part in _CJK_OR_NOT.findall(run):
            if not _CJK.match(part):
                if len(part) > 1:
                    words.append(part)
            elif len(part) == 1:
                words.append(part)
            else:
                words.extend(part[i : i + 2] for i in range(len(part) - 1))
    return words


def _cjk_characters(folded: str) -> list[str]:
    """`en-snowball-4`'s passage terms: each character of a CJK run of two or more (a lone one
    is a word already)."""
    return [c for run in _CJK_RUN.findall(folded) for c in run]


def _compounds(folded: str) -> list[str]:
    """`en-snowball-3`'s compound terms (module docstring), in order, after the words."""
    return [
        c
        for c in _COMPOUND.findall(folded)
        if _COMPOUND_KEPT.search(c) and (c.isascii() or not _CJK.search(c))
    ]


def term_frequencies(text: str, analyzer: str) -> dict[str, int]:
    """Term -> count in the passage `text` (a new dict); its length is the sum of the counts."""
    return dict(Counter(analyze(text, analyzer, passage=True)))


def query_terms(text: str, analyzer: str) -> list[str]:
    """The analyzed terms of a query (what `VectorStore.lexical_search` takes)."""
    return analyze(text, analyzer)


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

"""Which lexical analyzer a corpus gets, and what each new one matches that the one before did not.

A black-box tester found lexical search blind to Unicode: a word in decomposed (NFD) form never
matched its composed (NFC) spelling, `ß` not `ss`, `İstanbul` not `istanbul`, full-width
letters, ligatures and words broken by a soft hyphen not their plain form, and Chinese or
Japanese text only by whole runs. A new corpus is analyzed by `en-snowball-2`, which folds all of
these; a corpus built before it keeps `en-snowball-1`, whose stored term frequencies its
queries must keep matching. A black-box probe then found version numbers invisible (`1.4.8-2`
is all one-character parts) and `C++` the same as `C`: `en-snowball-3` adds a term for such
compounds; a corpus built with `en-snowball-2` keeps it. A third probe found Hindi, Tamil and
pointed Arabic or Hebrew words invisible (cut at every combining mark) and a one-character
Chinese or Japanese word never matched: `en-snowball-4`, the newest, keeps marks in words,
folds Semitic points away and gives passages their CJK characters. Over each store adapter,
through the service.
"""

from __future__ import annotations

import unicodedata

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.context import RequestContext
from retrieval_host.core.descriptor import CorpusDescriptor, LexicalDescriptor
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import (
    ANALYZER_EN_SNOWBALL_1,
    ANALYZER_EN_SNOWBALL_2,
    ANALYZER_EN_SNOWBALL_3,
    ANALYZER_EN_SNOWBALL_4,
)
from retrieval_host.core.models import ChunkInput, IndexRequest, Location, SearchRequest, SourceInfo
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import Corpus, RetrievalService
from tests.contract.conftest import StoreHarness
from tests.support.pg import schema_for, shared_dsn
from tests.support.previous_vector_store import pg_v2_schema, sqlite_v2_database

CORPUS = "docs"
NAMESPACE = "ns"
TEXTS = {
    "nfd": unicodedata.normalize("NFD", "Le résumé du café de Zürich."),
    "strasse": "Die Hauptstraße ist gesperrt.",
    "istanbul": "İSTANBUL liegt am Bosporus.",
    "fullwidth": "ＦＵＬＬＷＩＤＴＨ letters and the ﬁsh ligature.",
    "hyphen": "A soft\u00adware update with pass\u200bword rules.",
    "cjk": "東京都の天気予報は明日は晴れです。",
    "v148": "Release 1.4.8-2 of tdb fixes the lock.",
    "v248": "Release 2.4.8-1 of tdb fixes the lock.",
    "v146": "Release 1.4.6-1 of tdb fixes the lock.",
    "cpp": "The parser is written in C++ with bindings.",
    "plain-c": "The parser is written in C with bindings.",
    "hindi": "दिल्ली भारत की राजधानी है।",
    "arabic": "كَتَبَ الوَلَدُ الدَّرْسَ",
    "hebrew": "שָלוֹם עֲלֵיכֶם",
    "cat": "猫が窓の外で鳴いています。",
}


def grant_all(request: AuthorizationRequest, context: RequestContext) -> Grant:
    if request.operation == "search":
        return Grant(NAMESPACE, {sid: "r1" for sid in request.source_ids or [*TEXTS, "plain"]})
    return Grant(NAMESPACE, {sid: ANY_REVISION for sid in request.source_ids or ()})


def service(harness: StoreHarness, embedding: LocalEmbedding, **corpus: object) -> RetrievalService:
    store = harness.open()
    return RetrievalService(
        [Corpus(CORPUS, "passages-v1", embedding, store, grant_all, **corpus)]  # type: ignore[arg-type]
    )


def found(svc: RetrievalService, query: str) -> list[str]:
    result = svc.search_context(
        SearchRequest(CORPUS, query, mode="lexical", limit=10), RequestContext("reader")
    )
    return sorted({hit.source.id for hit in result.hits})


def _indexed(svc: RetrievalService) -> RetrievalService:
    for source_id, text in TEXTS.items():
        svc.index_context(
            IndexRequest(
                CORPUS,
                SourceInfo(source_id, "r1", title=source_id),
                [ChunkInput(f"{source_id}-0", text, Location(start_line=1))],
            ),
            RequestContext("writer"),
        )
    return svc


@pytest.fixture
def new_corpus(harness: StoreHarness, local_embedding: LocalEmbedding) -> RetrievalService:
    return _indexed(service(harness, local_embedding))


def ranked(svc: RetrievalService, query: str) -> list[str]:
    result = svc.search_context(
        SearchRequest(CORPUS, query, mode="lexical", limit=10), RequestContext("reader")
    )
    return [hit.source.id for hit in result.hits]


def test_a_new_corpus_is_analyzed_by_the_newest_analyzer(new_corpus: RetrievalService) -> None:
    corpus = new_corpus.corpora[CORPUS]
    assert corpus.analyzer == ANALYZER_EN_SNOWBALL_4
    assert corpus.descriptor.lexical == LexicalDescriptor(ANALYZER_EN_SNOWBALL_4)


@pytest.mark.parametrize(
    ("query", "source_id"),
    [
        ("दिल्ली", "hindi"),  # the document's own spelling
        ("राजधानी", "hindi"),
        ("كَتَبَ", "arabic"),
        ("كتب الولد", "arabic"),  # unpointed, as users type it
        ("שלום", "hebrew"),
        ("猫", "cat"),  # a one-character word
        ("窓の外", "cat"),
    ],
)
def test_words_of_other_scripts_are_found(
    new_corpus: RetrievalService, query: str, source_id: str
) -> None:
    assert found(new_corpus, query) == [source_id]


@pytest.mark.parametrize(
    ("query", "first"),
    [("1.4.8-2", "v148"), ("2.4.8-1", "v248"), ("tdb 1.4.6-1", "v146"), ("C++", "cpp")],
)
def test_versions_and_language_names_are_terms(
    new_corpus: RetrievalService, query: str, first: str
) -> None:
    assert ranked(new_corpus, query)[0] == first


@pytest.mark.parametrize(
    ("analyzer", "unknown", "known"),
    [
        # No term for a version (a one-character part each) under the second analyzer.
        (ANALYZER_EN_SNOWBALL_2, "1.4.8-2", ("résumé café zürich", "nfd")),
        # Nor for a Hindi word (cut at its vowel signs) under the third.
        (ANALYZER_EN_SNOWBALL_3, "दिल्ली", ("1.4.8-2", "v148")),
    ],
)
def test_a_corpus_built_with_an_earlier_analyzer_keeps_it(
    harness: StoreHarness,
    local_embedding: LocalEmbedding,
    analyzer: str,
    unknown: str,
    known: tuple[str, str],
) -> None:
    """What an earlier release made: its stored descriptor names its analyzer, and a corpus
    configured without one opens with it (its terms were analyzed by it)."""
    built = _indexed(service(harness, local_embedding, lexical=LexicalDescriptor(analyzer)))
    assert ranked(built, unknown) == []
    reopened = service(harness, local_embedding)
    assert reopened.corpora[CORPUS].analyzer == analyzer
    assert ranked(reopened, unknown) == []
    query, first = known
    assert ranked(reopened, query)[0] == first


@pytest.mark.parametrize(
    ("query", "source_id"),
    [
        ("résumé café zürich", "nfd"),  # composed query, decomposed text
        ("resume cafe zurich", "nfd"),
        (unicodedata.normalize("NFD", "RÉSUMÉ"), "nfd"),
        ("HAUPTSTRASSE", "strasse"),
        ("istanbul", "istanbul"),
        ("fullwidth fish", "fullwidth"),
        ("software password", "hyphen"),
        ("天気", "cjk"),
        ("明日の天気", "cjk"),
    ],
)
def test_what_reads_alike_matches_alike(
    new_corpus: RetrievalService, query: str, source_id: str
) -> None:
    assert found(new_corpus, query) == [source_id]


def _previous_release_store(harness: StoreHarness, embedding: LocalEmbedding) -> None:
    """The store as the release before `en-snowball-2` left it: its descriptor says no analyzer
    (`en-snowball-1` by default), its passages' terms analyzed by that one."""
    described = CorpusDescriptor(CORPUS, "passages-v1", embedding.descriptor)
    corpus = {(NAMESPACE, "nfd"): [TEXTS["nfd"]], (NAMESPACE, "plain"): ["The cafe in Zurich."]}
    if harness.kind == "sqlite":
        harness.location.chmod(0o700)
        sqlite_v2_database(harness.location / "store.db", described, corpus)
    else:
        pg_v2_schema(shared_dsn(), schema_for(harness.location), described, corpus)


def test_a_corpus_built_before_keeps_its_analyzer_and_its_matches(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    _previous_release_store(harness, local_embedding)
    svc = service(harness, local_embedding)
    assert svc.corpora[CORPUS].analyzer == ANALYZER_EN_SNOWBALL_1
    # Its stored terms are the first analyzer's (the decomposed text lost its accented words).
    assert found(svc, "cafe zurich") == ["nfd", "plain"]
    assert found(svc, "zu rich") == ["nfd"]


def test_bm25_parameters_set_without_an_analyzer_keep_the_stored_one(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    # An application that only tunes k1 and b never chose an analyzer: its corpus built
    # before opens as it was (found by review: LexicalDescriptor(k1=...) named the newest).
    _previous_release_store(harness, local_embedding)
    svc = service(harness, local_embedding, lexical=LexicalDescriptor(k1=0.9, b=0.4))
    assert svc.corpora[CORPUS].lexical == LexicalDescriptor(ANALYZER_EN_SNOWBALL_1, 0.9, 0.4)
    assert found(svc, "zu rich") == ["nfd"]


def test_a_corpus_built_before_is_not_reopened_with_another_analyzer(
    harness: StoreHarness, local_embedding: LocalEmbedding
) -> None:
    _previous_release_store(harness, local_embedding)
    with pytest.raises(RetrievalError) as excinfo:
        service(harness, local_embedding, lexical=LexicalDescriptor(ANALYZER_EN_SNOWBALL_2))
    assert excinfo.value.code is ErrorCode.DESCRIPTOR_MISMATCH
    assert "lexical.analyzer" in str(excinfo.value)

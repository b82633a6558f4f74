"""The identity of a corpus: which embedding produced its vectors, how it was chunked, how
its passages are analyzed and ranked lexically, and which model reranks its results.

Stored with the corpus and compared at open, before any embedding call; nothing is converted.
A descriptor stored before a field existed takes that field's default when compared
(`STORED_DEFAULTS`): corpora made before the lexical index have analyzer `en-snowball-1`
with the default k1 and b, those made before reranking have no reranker.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.lexical import ANALYZER_EN_SNOWBALL_1, ANALYZERS, DEFAULT_ANALYZER
from retrieval_host.core.models import JSONScalar

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
# A model name may also hold `@` (Vertex AI's `claude-3-5-sonnet-v2@20241022`).
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$")
_LABEL_MAX = 128  # characters, as `_LABEL` allows
# Shapes of secrets that must never be used as a label (they end up in logs and descriptors).
# Each vendor's prefix is matched with its separator and a key body that reads as random: a
# digit in it, or 16 letters and digits in a row (no word of a name is that long; a GitHub
# or GitLab key without a digit is). A bare `^(sk|gho|...)` prefix refused
# `skunkworks-notes` and `ghost-team-01`, and a 40-character run counting hyphens refused
# `acme-corp-production-embeddings-eu-west-1` (black-box probes A and V). Every shape here
# matches only what the earlier shapes refused.
_KEY_PREFIX = r"^(?:sk|pk|rk|xox[abpr]|ghp|gho|github_pat|glpat)[-_]"
_SECRET_SHAPES = (
    re.compile(_KEY_PREFIX + r"(?=[-_\w]*[0-9])[-_\w]{8,}"),
    re.compile(_KEY_PREFIX + r"[-_\w]*[A-Za-z0-9]{16}"),
    re.compile(r"^AKIA[0-9A-Z]{16}"),  # an AWS access key id
    re.compile(r"^AIza[-_A-Za-z0-9]{35}"),  # a Google API key
    re.compile(r"^(bearer|basic)[\s:]", re.IGNORECASE),
    re.compile(r"^eyJ[A-Za-z0-9_-]{8,}\."),  # a JWT
    re.compile(r"[A-Za-z0-9]{40,}"),  # a long opaque run of key material
    # Hugging Face, npm and Replicate tokens, a Google OAuth access token (probe C, session
    # 37): the prefix and then the whole random body, so `hf_tei_1` stays a provider label.
    re.compile(r"^(?:hf|npm|r8)_[A-Za-z0-9]{30,}"),
    re.compile(r"^ya29\.[-_A-Za-z0-9]{20,}"),
    # No rule for 32 letters and digits (Mistral's and Azure's key shapes): they are also a
    # CamelCase corpus id with a year (`CustomerSupportKnowledgeBase2024`, which an earlier
    # release stored), a Cloudflare account id, an MD5 (probe V, session 37).
)
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
# In a model name, `@` names a version (`gemini@1.5-pro`): an address there is one whose
# domain ends in a name of letters.
_MODEL_EMAIL = re.compile(r"[^@\s]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\.?(?![A-Za-z0-9-])")


def check_label(kind: str, value: str, *, model: bool = False) -> str:
    """Accept a non-secret identifier; reject anything shaped like a key, token or address.
    `model`: a model name, which may also hold `@`."""
    if not 1 <= len(value) <= _LABEL_MAX:
        # The length rule answers first: a long plain id (130 characters of `my-corpus-...`)
        # was refused as secret-shaped by the run-of-key-material rule below.
        raise _not_a_label(kind, model=model)
    if (_MODEL_EMAIL if model else _EMAIL).search(value):
        raise RetrievalError(ErrorCode.INVALID_REQUEST, f"{kind} must not be an e-mail address.")
    if any(p.search(value) for p in _SECRET_SHAPES):
        raise RetrievalError(
            ErrorCode.INVALID_REQUEST, f"{kind} looks like a secret; use a non-secret label."
        )
    if not (_MODEL if model else _LABEL).match(value):
        raise _not_a_label(kind, model=model)
    return value


def _not_a_label(kind: str, *, model: bool = False) -> RetrievalError:
    return RetrievalError(
        ErrorCode.INVALID_REQUEST,
        f"{kind} must be 1-128 characters of letters, digits and . _ : / -"
        + (" @" if model else ""),
    )


@dataclass(frozen=True, slots=True)
class EmbeddingDescriptor:
    """Everything that makes two vectors comparable. Separate from any generation model."""

    provider_id: str
    vendor: str
    account_id: str
    auth_mode: Literal["api-key", "none", "local"]
    model: str
    dimensions: int
    metric: Literal["cosine"] = "cosine"

    def __post_init__(self) -> None:
        for kind in ("provider_id", "vendor", "account_id", "model"):
            check_label(kind, getattr(self, kind))
        if not 1 <= self.dimensions <= 16384:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "dimensions must be in 1..16384")


@dataclass(frozen=True, slots=True)
class LexicalDescriptor:
    """How passages are analyzed and ranked lexically (BM25): see `core.lexical`.

    k1 and b are bm25s's settings, measured on SciFact in issue 15 (nDCG@10 0.695). An
    analyzer left None is the stored corpus's when there is one (a corpus keeps the analyzer
    it was built with), else the newest (`core.lexical.DEFAULT_ANALYZER`): `resolved`.
    """

    analyzer: str | None = None
    k1: float = 0.9
    b: float = 0.4

    @property
    def chosen(self) -> str:
        """The analyzer's name (the newest while it is left None)."""
        return self.analyzer or DEFAULT_ANALYZER

    def resolved(self, stored: LexicalDescriptor | None) -> LexicalDescriptor:
        """This descriptor with its analyzer chosen: the stored corpus's, else the newest."""
        if self.analyzer is not None:
            return self
        analyzer = stored.analyzer if stored is not None else DEFAULT_ANALYZER
        return LexicalDescriptor(analyzer, self.k1, self.b)

    def __post_init__(self) -> None:
        if self.analyzer is not None and self.analyzer not in ANALYZERS:
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST,
                f"unknown lexical analyzer; known: {', '.join(sorted(ANALYZERS))}.",
            )
        if not (math.isfinite(self.k1) and 0 <= self.k1 <= 100):
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "lexical k1 must be in 0..100")
        if not (math.isfinite(self.b) and 0 <= self.b <= 1):
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "lexical b must be in 0..1")


@dataclass(frozen=True, slots=True)
class RerankDescriptor:
    """The reranking model a corpus's searches use, pinned like its embedding: a search's
    order depends on it, so another reranker is another corpus configuration (a new index
    version), never a silent swap."""

    provider_id: str
    vendor: str
    account_id: str
    auth_mode: Literal["api-key", "none"]
    model: str

    def __post_init__(self) -> None:
        for kind in ("provider_id", "vendor", "account_id", "model"):
            check_label(kind, getattr(self, kind))
        if self.auth_mode not in ("api-key", "none"):
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "auth_mode must be api-key or none")


@dataclass(frozen=True, slots=True)
class CorpusDescriptor:
    corpus_id: str
    index_version: str
    embedding: EmbeddingDescriptor
    chunking: Mapping[str, JSONScalar] = field(default_factory=dict)
    lexical: LexicalDescriptor = field(default_factory=LexicalDescriptor)
    reranking: RerankDescriptor | None = None

    def __post_init__(self) -> None:
        check_label("corpus id", self.corpus_id)
        check_label("index version", self.index_version)
        if self.lexical.analyzer is None:
            # What is stored and compared always names its analyzer: the newest, here (the
            # service resolves a stored corpus's before it builds the descriptor).
            object.__setattr__(self, "lexical", self.lexical.resolved(None))

    def canonical_json(self) -> str:
        """A stable serialization: equal descriptors give byte-equal strings."""
        body = asdict(self)
        body["chunking"] = dict(self.chunking)
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    def mismatch(self, stored_json: str) -> list[str]:
        """The names of fields that differ from a stored descriptor (empty when compatible)."""
        stored = {**STORED_DEFAULTS, **json.loads(stored_json)}
        mine = json.loads(self.canonical_json())
        diffs: list[str] = []
        for key in sorted(set(stored) | set(mine)):
            if key in ("embedding", "lexical", "reranking"):
                a, b = stored.get(key) or {}, mine.get(key) or {}
                if key == "reranking" and (a == {}) != (b == {}):
                    diffs.append(key)  # one has a reranker, the other none
                    continue
                diffs += [f"{key}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            elif stored.get(key) != mine.get(key):
                diffs.append(key)
        return diffs


# Fields added after corpora were first stored, with the value an older corpus has: the
# lexical index came with analyzer `en-snowball-1`.
STORED_DEFAULTS: Mapping[str, object] = {
    "lexical": asdict(LexicalDescriptor(ANALYZER_EN_SNOWBALL_1)),
    "reranking": None,
}


def stored_lexical(stored_json: str) -> LexicalDescriptor:
    """The lexical identity of a stored descriptor (`STORED_DEFAULTS`' in one stored without)."""
    stored = {**STORED_DEFAULTS, **json.loads(stored_json)}
    lexical = stored.get("lexical")
    if not isinstance(lexical, dict):
        raise RetrievalError(ErrorCode.DESCRIPTOR_MISMATCH, "the stored descriptor is not valid.")
    if lexical.get("analyzer") not in ANALYZERS:
        # A later release's (a rollback, or an earlier replica beside a newer one): said so,
        # not "unknown lexical analyzer" as if the configuration had named it.
        raise RetrievalError(
            ErrorCode.DESCRIPTOR_MISMATCH,
            f"its lexical analyzer {lexical.get('analyzer')!r} is not one this release knows "
            "(a later release created it): serve it with that release, or index its sources "
            "into another corpus.",
        )
    return LexicalDescriptor(
        str(lexical.get("analyzer")), float(lexical.get("k1", 0.9)), float(lexical.get("b", 0.4))
    )


def stored_chunking(stored_json: str) -> Mapping[str, JSONScalar]:
    """The chunking identity of a stored descriptor (empty in one stored without)."""
    chunking = json.loads(stored_json).get("chunking")
    return dict(chunking) if isinstance(chunking, dict) else {}

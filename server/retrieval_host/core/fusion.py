"""Search modes and the fusion of dense and lexical candidates (pure).

`hybrid` takes the top candidates of both the vector search and the lexical search (each
already restricted to the grant by the store) and fuses them per query:

- `convex` (the default): every candidate of either list is scored in both modes (the store
  scores a passage missing from one list in that mode too: `VectorStore.dense_scores` and
  `lexical_scores`), each mode's scores min-max scaled to [0, 1] over the candidates of this
  query (over the first `candidates` of each list, so a passage's score does not depend on
  the request's limit; a deeper one below that range counts 0 in that mode), then
  `dense_weight * dense + (1 - dense_weight) * lexical`. A passage the store no
  longer holds at its revision counts 0 in the mode it could not be scored in. 0.45 / 0.55
  measured best on SciFact train in issue 15. Scoring the missing mode, rather than counting
  it 0, lifted hybrid nDCG@10 from 0.736 to 0.741 there (recall@100 0.953 to 0.958): a
  passage ranked 101st by one mode is not worth nothing in it.
- `rrf`: reciprocal rank fusion, the sum over both lists of 1 / (rrf_k + rank), rank from 1
  (over the lists as read: a larger limit reads deeper lists, whose ranks add to the first
  hits' competitors, so rrf's order can depend on the limit).

Dense min-max scaling divides by at least `dense_min_spread` of cosine similarity. Min-max
stretches whatever spread a query's candidates have to the whole of 0..1: for a query the
model embeds poorly (an identifier: `QX-1317`, `--file-name`, a version), every candidate's
similarity lies within a narrow band (0.17-0.43 for such queries on man pages, against
0.41-0.72 for SciFact's claims, 5th-75th percentile), and differences the model barely sees
outweighed the lexical match that names the passage. With the floor, such a mode adds at
most its weight times its spread over the floor. 0.5 was measured for the local model
(`MEASURED_DENSE_MIN_SPREAD`; bench/README.md, session 24): SciFact train nDCG@10 0.7407 ->
0.7418, identifier-only queries' MRR@10 up on planted sensor codes (0.965 -> 1.000), man page
options (0.835 -> 0.855) and mail versions, no query kind down by more than 0.002. A model
not measured keeps plain min-max (its cosines may lie on another scale).

Equal fused scores come in dense similarity order, then chunk id order, so a result never
depends on which store answered. A convex fusion's hits are the first of one order over every
passage, whatever the limit: `settled` tells `core.ranking` whether a passage in neither list
could still come before the last hit, and it reads deeper while one could.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import SEARCH_MODES, SearchMode
from retrieval_host.core.ports import Candidate

__all__ = [
    "MEASURED_DENSE_MIN_SPREAD",
    "SEARCH_MODES",
    "FusionSettings",
    "Ranked",
    "SearchMode",
    "for_model",
    "fuse",
    "fuse_settled",
    "missing",
    "single",
]

# The dense floor measured per embedding model (its descriptor's `model`); the local model's
# name is `adapters.embedding_local.MODEL_NAME` (a test holds the two together).
MEASURED_DENSE_MIN_SPREAD: Final[Mapping[str, float]] = {"all-MiniLM-L6-v2-int8": 0.5}


@dataclass(frozen=True, slots=True)
class FusionSettings:
    """How one corpus fuses its two rankings (see the module docstring)."""

    method: Literal["convex", "rrf"] = "convex"
    dense_weight: float = 0.45
    rrf_k: int = 60
    # Candidates taken from each ranking (at least the request's limit + 1). With every
    # candidate scored in both modes, SciFact train's nDCG@10 held within 0.001 from 30 to 100
    # (0.7422 at 50, 0.7415 at 100); 50 costs about half of 100's candidate reading.
    candidates: int = 50
    # The least cosine spread dense scaling divides by (module docstring). None: the measured
    # value of the corpus's model (`for_model`), or 0 (plain min-max) for a model not measured.
    dense_min_spread: float | None = None

    def __post_init__(self) -> None:
        if self.method not in ("convex", "rrf"):
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "fusion method must be convex or rrf")
        if not (math.isfinite(self.dense_weight) and 0 <= self.dense_weight <= 1):
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "fusion dense_weight must be in 0..1")
        if isinstance(self.rrf_k, bool) or self.rrf_k < 1:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "fusion rrf_k must be positive")
        if isinstance(self.candidates, bool) or not 1 <= self.candidates <= 1000:
            raise RetrievalError(ErrorCode.INVALID_REQUEST, "fusion candidates must be 1..1000")
        spread = self.dense_min_spread
        if spread is not None and not (math.isfinite(spread) and 0 <= spread <= 2):
            raise RetrievalError(
                ErrorCode.INVALID_REQUEST, "fusion dense_min_spread must be in 0..2 (cosine)"
            )


def for_model(settings: FusionSettings, model: str) -> FusionSettings:
    """`settings` with its dense floor resolved for the embedding model `model`."""
    if settings.dense_min_spread is not None:
        return settings
    return replace(settings, dense_min_spread=MEASURED_DENSE_MIN_SPREAD.get(model, 0.0))


@dataclass(frozen=True, slots=True)
class Ranked:
    """A candidate with its final score and the score each mode gave it (absent: not ranked
    by that mode, nor scored in it by the store)."""

    candidate: Candidate
    scores: Mapping[str, float]


def single(mode: Literal["dense", "lexical"], candidates: Sequence[Candidate]) -> list[Ranked]:
    """One mode's candidates as they are (the store's order and scores)."""
    return [Ranked(c, {mode: c.score}) for c in candidates]


@dataclass(frozen=True, slots=True)
class _Scale:
    """Min-max over a set of scores, applied to any score of the mode and kept within 0..1: a
    deeper candidate below that range counts 0, and one above it (an approximate dense list's
    deeper candidate scored exactly) counts 1."""

    low: float
    high: float
    spread: float  # 0: one score for every candidate in the range

    @classmethod
    def over(cls, basis: Sequence[float], min_spread: float) -> _Scale:
        low, high = min(basis), max(basis)
        # With a floor, equal scores are a band of width 0: they add nothing, as a band of
        # 0.001 adds almost nothing (no jump between the two).
        return cls(
            low, high, 0.0 if high == low and not min_spread else max(high - low, min_spread)
        )

    def __call__(self, value: float) -> float:
        if not self.spread:
            # One score for every candidate ranks nothing. Positive (one candidate, or equal
            # matches), each is as good as the best; zero or less (no query term in any
            # passage, no similarity), none is worth anything: a query matching no word
            # scored 1.0 in hybrid, above real matches, which `minScore` could not tell apart.
            return 1.0 if self.high > 0 and value >= self.high else 0.0
        return min(1.0, max(0.0, (value - self.low) / self.spread))


def _scale(
    values: Mapping[str, float], min_spread: float = 0.0, scale: frozenset[str] | None = None
) -> _Scale | None:
    """The min-max of one mode over the candidates in `scale` (all when None); None when the
    mode scored no candidate."""
    if not values:
        return None
    basis = [v for i, v in values.items() if i in scale] if scale is not None else []
    return _Scale.over(basis or list(values.values()), min_spread)


def missing(
    dense: Sequence[Candidate], lexical: Sequence[Candidate]
) -> tuple[list[Candidate], list[Candidate]]:
    """(candidates only the lexical list has, candidates only the dense list has): what the
    store scores in the other mode before a convex fusion."""
    in_dense = {c.chunk_id for c in dense}
    in_lexical = {c.chunk_id for c in lexical}
    return (
        [c for c in lexical if c.chunk_id not in in_dense],
        [c for c in dense if c.chunk_id not in in_lexical],
    )


def fuse(
    dense: Sequence[Candidate],
    lexical: Sequence[Candidate],
    settings: FusionSettings,
    completed: Mapping[str, Mapping[str, float]] | None = None,
    limit: int | None = None,
) -> list[Ranked]:
    """Both rankings fused into one, best first (every candidate of either list kept, or the
    first `limit`).

    `completed`: per mode, the scores of candidates missing from that mode's list, as the
    store gave them (`missing`); used by the convex method, shown in every hit's `scores`."""
    return _fuse(dense, lexical, settings, completed, limit)[0]


def fuse_settled(
    dense: Sequence[Candidate],
    lexical: Sequence[Candidate],
    settings: FusionSettings,
    completed: Mapping[str, Mapping[str, float]] | None,
    depth: int,
    wanted: int,
) -> tuple[list[Ranked], bool]:
    """`fuse`'s first `wanted` of lists each read `depth` deep, and whether they are settled
    (`_settled`), the modes' scaling computed once for both (it was computed twice: ~3 % of a
    limit-100 hybrid search in a profile, session 42)."""
    ranked, scales = _fuse(dense, lexical, settings, completed, wanted)
    return ranked, _settled(dense, lexical, settings, scales, depth, ranked, wanted)


def _fuse(
    dense: Sequence[Candidate],
    lexical: Sequence[Candidate],
    settings: FusionSettings,
    completed: Mapping[str, Mapping[str, float]] | None,
    limit: int | None,
) -> tuple[list[Ranked], dict[str, _Scale | None]]:
    """`fuse`, and the convex method's per-mode scaling (empty for reciprocal rank fusion)."""
    by_id: dict[str, Candidate] = {}
    raw: dict[str, dict[str, float]] = {}
    for mode, candidates in (("dense", dense), ("lexical", lexical)):
        for c in candidates:
            by_id.setdefault(c.chunk_id, c)
            raw.setdefault(c.chunk_id, {})[mode] = c.score
    fused: dict[str, float] = dict.fromkeys(by_id, 0.0)
    scales: dict[str, _Scale | None] = {}
    if settings.method == "convex":
        values, scales = _convex(dense, lexical, settings, completed)
        for mode, weight in _weights(settings).items():
            scaled = scales[mode]
            for chunk_id, value in values[mode].items():
                raw[chunk_id][mode] = value
                if scaled is not None:
                    fused[chunk_id] += weight * scaled(value)
    else:
        for candidates in (dense, lexical):
            for rank, c in enumerate(candidates, start=1):
                fused[c.chunk_id] += 1.0 / (settings.rrf_k + rank)

    # Equal fused scores by their dense similarity, then chunk id. Below the scaling range of
    # both lists every candidate scores 0, and which of them are read depends on the limit
    # (each list is read `limit + 1` deep): in chunk id order, limit 55 kept a passage that
    # limit 100 ranked after deeper ones (a black-box test); in similarity order, the first
    # of that tail are the dense list's next ones, which every limit reads.
    def key(chunk_id: str) -> tuple[float, float, str]:
        return (-fused[chunk_id], -raw[chunk_id].get("dense", -math.inf), chunk_id)

    order = sorted(by_id, key=key)[:limit]
    return [Ranked(replace(by_id[i], score=fused[i]), raw[i]) for i in order], scales


def _settled(
    dense: Sequence[Candidate],
    lexical: Sequence[Candidate],
    settings: FusionSettings,
    scales: Mapping[str, _Scale | None],
    depth: int,
    ranked: Sequence[Ranked],
    wanted: int,
) -> bool:
    """Whether `ranked`, the first `wanted` of a convex fusion of lists each read `depth`
    deep, are the first `wanted` over every passage the lists were read from: no passage in
    neither list can come before its last. Such a passage scores at most the dense list's
    last score in dense and the lexical list's last in lexical (0 when that list is shorter
    than `depth`: every passage with a matching term is in it), so it scales to at most
    their scaled values (`_Scale` is monotone). A dense list shorter than `depth` holds every
    passage. Reciprocal rank fusion depends on the depth read anyway: always settled."""
    if settings.method != "convex" or len(dense) < depth or len(ranked) < wanted:
        return True
    weights = _weights(settings)
    last = {"dense": dense[-1].score, "lexical": lexical[-1].score if len(lexical) >= depth else 0}
    ceiling = sum(
        weights[mode] * scaled(last[mode]) for mode, scaled in scales.items() if scaled is not None
    )
    edge = ranked[wanted - 1]
    # On an equal fused score, the higher dense similarity comes first (`fuse`); one equal
    # to the edge's too is a tie of the same text, in no defined order (README).
    return ceiling < edge.candidate.score or (
        ceiling == edge.candidate.score and last["dense"] <= edge.scores.get("dense", -math.inf)
    )


def _weights(settings: FusionSettings) -> dict[str, float]:
    return {"dense": settings.dense_weight, "lexical": 1.0 - settings.dense_weight}


def _convex(
    dense: Sequence[Candidate],
    lexical: Sequence[Candidate],
    settings: FusionSettings,
    completed: Mapping[str, Mapping[str, float]] | None,
) -> tuple[dict[str, dict[str, float]], dict[str, _Scale | None]]:
    """Per mode, every candidate's score (its list's, or the store's `completed` one) and the
    min-max that mode is scaled by.

    Scaled over the first `candidates` of each list, whatever the limit: a search with limit
    100 reads 101 of each, and scaled over all of them, the same passages got other scores
    and near-ties other places than at limit 8 (a black-box test: 18 of 86 queries' top 8
    differed), so `minScore` admitted other passages."""
    floors = {"dense": settings.dense_min_spread or 0.0, "lexical": 0.0}
    depth = settings.candidates
    scale = frozenset(c.chunk_id for c in (*dense[:depth], *lexical[:depth]))
    known = {c.chunk_id for c in (*dense, *lexical)}
    values: dict[str, dict[str, float]] = {}
    scales: dict[str, _Scale | None] = {}
    for mode, candidates in (("dense", dense), ("lexical", lexical)):
        own = {c.chunk_id: c.score for c in candidates}
        for chunk_id, value in (completed or {}).get(mode, {}).items():
            if chunk_id in known and chunk_id not in own:
                own[chunk_id] = value
        values[mode], scales[mode] = own, _scale(own, floors[mode], scale)
    return values, scales

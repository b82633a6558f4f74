"""Fusion of the dense and lexical rankings (pure)."""

from __future__ import annotations

import math

import pytest

from retrieval_host.adapters.embedding_local import MODEL_NAME
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.fusion import FusionSettings, for_model, fuse, missing, single
from retrieval_host.core.models import Location
from retrieval_host.core.ports import Candidate


def cand(chunk_id: str, score: float) -> Candidate:
    return Candidate(chunk_id, chunk_id[0], "r1", f"text {chunk_id}", Location(), "sha", score)


def test_convex_fusion_scales_each_ranking_per_query_and_mixes_them() -> None:
    dense = [cand("a", 0.9), cand("b", 0.7), cand("c", 0.5)]
    lexical = [cand("c", 12.0), cand("d", 6.0), cand("a", 2.0)]
    fused = fuse(dense, lexical, FusionSettings())
    expected = {
        "a": 0.45 * 1.0 + 0.55 * 0.0,
        "b": 0.45 * 0.5,
        "c": 0.45 * 0.0 + 0.55 * 1.0,
        "d": 0.55 * 0.4,
    }
    assert [r.candidate.chunk_id for r in fused] == ["c", "a", "b", "d"]
    for r in fused:
        assert math.isclose(r.candidate.score, expected[r.candidate.chunk_id])
    by_id = {r.candidate.chunk_id: dict(r.scores) for r in fused}
    assert by_id["a"] == {"dense": 0.9, "lexical": 2.0}
    assert by_id["b"] == {"dense": 0.7}
    assert by_id["d"] == {"lexical": 6.0}


def test_rrf_sums_reciprocal_ranks() -> None:
    dense = [cand("a", 0.9), cand("b", 0.8)]
    lexical = [cand("b", 3.0), cand("c", 1.0)]
    fused = fuse(dense, lexical, FusionSettings(method="rrf", rrf_k=60))
    scores = {r.candidate.chunk_id: r.candidate.score for r in fused}
    assert math.isclose(scores["b"], 1 / 62 + 1 / 61)
    assert math.isclose(scores["a"], 1 / 61)
    assert math.isclose(scores["c"], 1 / 62)
    assert [r.candidate.chunk_id for r in fused] == ["b", "a", "c"]


def test_equal_scores_come_by_similarity_then_chunk_id_and_one_candidate_scales_to_one() -> None:
    fused = fuse([cand("b", 0.3)], [cand("a", 5.0)], FusionSettings(dense_weight=0.5))
    # `a` has no dense similarity (the store could not score it): it comes last.
    assert [(r.candidate.chunk_id, r.candidate.score) for r in fused] == [("b", 0.5), ("a", 0.5)]
    twins = fuse(
        [cand("b", 0.3), cand("a", 0.3)], [], FusionSettings(), {"lexical": {"a": 1.0, "b": 1.0}}
    )
    assert [(r.candidate.chunk_id, r.candidate.score) for r in twins] == [("a", 1.0), ("b", 1.0)]
    assert fuse([], [], FusionSettings()) == []


def test_a_smaller_limits_hits_are_the_first_of_a_larger_ones_in_the_zero_tail() -> None:
    """A black-box test: below the scaling range of both lists every candidate scores 0, and
    which of them are read depends on the limit (each list `limit + 1` deep); ordered by
    chunk id, limit 55 kept a passage limit 100 ranked after deeper ones."""
    names = [f"p{(n * 37) % 150:03d}" for n in range(150)]  # chunk ids out of rank order
    dense_of = {name: 0.9 - 0.005 * n for n, name in enumerate(names)}
    # The two rankings agree but for the order within each block of 8.
    lexical_of = {name: 30.0 - 0.2 * (n // 8 * 8 + 7 - n % 8) for n, name in enumerate(names)}

    def search(limit: int) -> list[tuple[str, float]]:
        depth = max(limit + 1, 50)
        dense = sorted(names, key=lambda i: -dense_of[i])[:depth]
        lexical = sorted(names, key=lambda i: -lexical_of[i])[:depth]
        completed = {
            "dense": {i: dense_of[i] for i in lexical if i not in dense},
            "lexical": {i: lexical_of[i] for i in dense if i not in lexical},
        }
        fused = fuse(
            [cand(i, dense_of[i]) for i in dense],
            [cand(i, lexical_of[i]) for i in lexical],
            FusionSettings(),
            completed,
            limit,
        )
        return [(r.candidate.chunk_id, r.candidate.score) for r in fused]

    largest = search(100)
    assert sum(1 for _, score in largest if score == 0.0) > 10  # the tail is there
    for limit in (1, 8, 49, 50, 55, 60, 70, 99):
        assert search(limit) == largest[:limit], limit


def test_a_mode_where_no_candidate_scored_adds_nothing() -> None:
    """A query matching no word: every candidate's lexical score is 0 (completed from the
    store). It scaled to 1.0 for all, so nonsense scored a hybrid 1.0, above real matches."""
    dense = [cand("a", 0.31), cand("b", 0.12)]
    completed = {"lexical": {"a": 0.0, "b": 0.0}}
    fused = fuse(dense, [], FusionSettings(), completed)
    assert [(r.candidate.chunk_id, r.candidate.score) for r in fused] == [("a", 0.45), ("b", 0.0)]
    # Equal positive scores still count fully (each as good as the best), and so does a
    # single matching candidate.
    equal = fuse(dense, [], FusionSettings(), {"lexical": {"a": 2.5, "b": 2.5}})
    assert [r.candidate.score for r in equal] == [1.0, 0.55]


def test_a_single_mode_keeps_the_store_order_and_names_its_score() -> None:
    ranked = single("lexical", [cand("a", 4.0), cand("b", 1.0)])
    assert [(r.candidate.score, dict(r.scores)) for r in ranked] == [
        (4.0, {"lexical": 4.0}),
        (1.0, {"lexical": 1.0}),
    ]


@pytest.mark.parametrize(
    "settings",
    [{"method": "max"}, {"dense_weight": 1.5}, {"dense_weight": math.nan}, {"rrf_k": 0}],
)
def test_invalid_fusion_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(RetrievalError):
        FusionSettings(**settings)  # type: ignore[arg-type]


def test_convex_fusion_uses_the_scores_the_store_gave_a_missing_mode() -> None:
    dense = [cand("a", 0.9), cand("b", 0.5)]
    lexical = [cand("c", 10.0), cand("a", 5.0)]
    # b scored lexically by the store (2.0), c densely (0.7); x was in neither list: ignored.
    completed = {"dense": {"c": 0.7, "x": 0.99}, "lexical": {"b": 2.0, "x": 50.0}}
    fused = fuse(dense, lexical, FusionSettings(), completed)
    # dense over {a 0.9, b 0.5, c 0.7}; lexical over {c 10, a 5, b 2}
    expected = {
        "a": 0.45 * 1.0 + 0.55 * (3.0 / 8.0),
        "b": 0.45 * 0.0 + 0.55 * 0.0,
        "c": 0.45 * 0.5 + 0.55 * 1.0,
    }
    assert [r.candidate.chunk_id for r in fused] == ["c", "a", "b"]
    for r in fused:
        assert math.isclose(r.candidate.score, expected[r.candidate.chunk_id])
    by_id = {r.candidate.chunk_id: dict(r.scores) for r in fused}
    assert by_id["b"] == {"dense": 0.5, "lexical": 2.0}
    assert by_id["c"] == {"dense": 0.7, "lexical": 10.0}
    # Without the store's scores, a missing mode counts 0 after scaling (c: 0.55 only).
    bare = {r.candidate.chunk_id: r.candidate.score for r in fuse(dense, lexical, FusionSettings())}
    assert math.isclose(bare["c"], 0.55)


def test_missing_names_the_candidates_each_mode_did_not_rank() -> None:
    no_dense, no_lexical = missing(
        [cand("a", 0.9), cand("b", 0.5)], [cand("c", 1.0), cand("a", 0.5)]
    )
    assert [c.chunk_id for c in no_dense] == ["c"]
    assert [c.chunk_id for c in no_lexical] == ["b"]


def test_dense_scaling_divides_by_at_least_the_floor_so_a_narrow_band_cannot_prevail() -> None:
    """An identifier the model embeds poorly: every candidate's cosine within 0.1. Plain
    min-max stretched that to 0..1 and put a look-alike above the passage naming the
    identifier; with a floor of 0.5 the dense difference counts 0.1 / 0.5 of its weight."""
    dense = [cand("look", 0.40), cand("other", 0.35), cand("hit", 0.30)]
    lexical = [cand("hit", 10.0), cand("look", 7.0), cand("other", 0.0)]
    plain = fuse(dense, lexical, FusionSettings(dense_min_spread=0.0))
    assert [r.candidate.chunk_id for r in plain] == ["look", "hit", "other"]  # 0.835 > 0.55
    floored = fuse(dense, lexical, FusionSettings(dense_min_spread=0.5))
    scores = {r.candidate.chunk_id: r.candidate.score for r in floored}
    assert [r.candidate.chunk_id for r in floored] == ["hit", "look", "other"]
    assert math.isclose(scores["hit"], 0.55 * 1.0)
    assert math.isclose(scores["look"], 0.45 * 0.1 / 0.5 + 0.55 * 0.7)
    assert math.isclose(scores["other"], 0.45 * 0.05 / 0.5)
    # Equal dense scores are a band of width 0 under a floor: nothing, as a band of 0.001
    # is almost nothing (no jump between the two); without a floor they count fully.
    tied = [cand("p", 0.3), cand("q", 0.3)]
    words = {"lexical": {"p": 2.0, "q": 1.0}}
    assert [
        r.candidate.score for r in fuse(tied, [], FusionSettings(dense_min_spread=0.5), words)
    ] == [0.55, 0.0]
    assert [r.candidate.score for r in fuse(tied, [], FusionSettings(), words)] == [1.0, 0.45]
    # A spread wider than the floor scales as before; the floor never touches lexical.
    wide = [cand("a", 0.9), cand("b", 0.2)]
    same = fuse(wide, [], FusionSettings(dense_min_spread=0.5), {"lexical": {"a": 1.0}})
    assert [r.candidate.score for r in same] == [1.0, 0.0]


def test_the_floor_defaults_to_what_was_measured_for_the_corpus_model() -> None:
    assert for_model(FusionSettings(), MODEL_NAME).dense_min_spread == 0.5
    assert for_model(FusionSettings(), "text-embedding-3-small").dense_min_spread == 0.0
    chosen = FusionSettings(dense_min_spread=0.2)
    assert for_model(chosen, MODEL_NAME) is chosen
    for refused in (-0.1, 2.5, math.nan):
        with pytest.raises(RetrievalError, match="dense_min_spread"):
            FusionSettings(dense_min_spread=refused)


def test_scores_and_order_of_the_first_candidates_do_not_depend_on_the_limit() -> None:
    """A search with a larger limit reads deeper lists (limit + 1 of each); scaled over all of
    them, the same passages got other scores than at a small limit, and near-ties swapped
    (a black-box test), so `minScore` admitted other passages at other limits."""
    depth = 4
    settings = FusionSettings(candidates=depth)
    dense = [cand(f"d{i}", 0.9 - 0.05 * i) for i in range(8)]
    lexical = [cand(f"l{i}", 10.0 - i) for i in range(8)]
    every = {c.chunk_id for c in (*dense, *lexical)}
    # Each list's deeper candidates score lower in the other mode too, so a deeper read
    # lowers each mode's minimum.
    completed = {
        "dense": {c.chunk_id: 0.5 - 0.04 * i for i, c in enumerate(lexical)},
        "lexical": {c.chunk_id: 3.0 - 0.3 * i for i, c in enumerate(dense)},
    }

    def scores(deep: int) -> dict[str, float]:
        # What a search at limit `deep - 1` fuses: the first `deep` of each list.
        d, lx = dense[:deep], lexical[:deep]
        drawn = {c.chunk_id for c in (*d, *lx)}
        done = {m: {i: v for i, v in s.items() if i in drawn} for m, s in completed.items()}
        fused = fuse(d, lx, settings, done)
        return {r.candidate.chunk_id: r.candidate.score for r in fused}

    shallow, deep = scores(depth), scores(8)
    assert set(deep) == every
    for chunk_id, score in shallow.items():
        assert math.isclose(deep[chunk_id], score), chunk_id
    # The deeper candidates rank after the first ones, within [0, 1].
    assert all(0.0 <= deep[i] <= 1.0 for i in every)
    assert sorted(deep, key=lambda i: -deep[i])[: len(shallow)] == sorted(
        shallow, key=lambda i: -shallow[i]
    )


def test_a_deeper_candidate_above_the_scaled_range_counts_one_not_more() -> None:
    """An approximate dense list can leave a closer passage deeper than its first candidates
    (its exact score, completed, above their range): scaled over the first ones it passed 1."""
    settings = FusionSettings(candidates=2)
    dense = [cand("a", 0.6), cand("b", 0.5), cand("c", 0.9)]  # "c" found late, scored exactly
    lexical = [cand("a", 2.0), cand("b", 1.0), cand("c", 0.5)]
    fused = fuse(dense, lexical, settings)
    assert all(0.0 <= r.candidate.score <= 1.0 for r in fused)
    by_id = {r.candidate.chunk_id: r.candidate.score for r in fused}
    assert math.isclose(by_id["c"], 0.45 * 1.0 + 0.55 * 0.0)

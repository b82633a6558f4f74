from __future__ import annotations

from retrieval_host.core.budget import apply_byte_budget
from retrieval_host.core.models import Hit, Location, Scope, SourceRef


def _hit(text: str) -> Hit:
    return Hit(
        text, SourceRef("s", "r"), Location(), text, "0" * 64, 0.5, "t", Scope("c", "v", "n")
    )


def test_whole_passages_are_kept_in_rank_order_until_one_does_not_fit() -> None:
    hits = [_hit("aaaa"), _hit("bb"), _hit("cccccc"), _hit("d")]
    kept, dropped = apply_byte_budget(hits, 7)
    assert [h.text for h in kept] == ["aaaa", "bb"]
    assert dropped is True


def test_text_is_never_cut_and_bytes_are_utf8() -> None:
    kept, dropped = apply_byte_budget([_hit("é" * 3)], 5)  # 6 bytes in UTF-8
    assert kept == [] and dropped is True
    kept, dropped = apply_byte_budget([_hit("é" * 3)], 6)
    assert [h.text for h in kept] == ["ééé"] and dropped is False


def test_no_budget_keeps_everything() -> None:
    hits = [_hit("x" * 1000)] * 3
    assert apply_byte_budget(hits, None) == (hits, False)

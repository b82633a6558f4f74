"""The context line a passage is embedded and analyzed with, and which corpora get one."""

from __future__ import annotations

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import JSONScalar
from retrieval_host.core.passage_context import (
    DEFAULT_CONTEXT,
    MAX_CONTEXT_CHARS,
    context_of,
    context_reserve_tokens,
    embedding_text,
    lexical_text,
    passage_context,
    resolve_chunking,
    shorter,
)

IDENTITY: dict[str, JSONScalar] = {"scheme": "rh-ingest/1", "max_tokens": 256, "overlap_tokens": 32}


def test_the_context_is_the_title_then_the_section_path() -> None:
    line = passage_context("Field handbook", ("Safety", "Ladders"), "Hold on with both hands.")
    assert line == "Field handbook > Safety > Ladders"
    assert embedding_text(line, "Hold on.") == "Field handbook > Safety > Ladders\n\nHold on."
    assert lexical_text(line, "Hold on.") == "Field handbook > Safety > Ladders\nHold on."


def test_parts_the_passage_opens_with_or_that_repeat_are_left_out() -> None:
    # A Markdown document whose first heading is its title: the first passage opens with it.
    assert passage_context("Lamps", ("Lamps",), "# Lamps\n\nThe lamp turns.") == ""
    assert passage_context("Lamps", ("Lamps", "Bulbs"), "## Bulbs\n\nChange them.") == "Lamps"
    assert passage_context("Lamps", ("Lamps",), "They turn slowly.") == "Lamps"
    # Only a whole line counts, not the same words inside the text.
    assert passage_context("Lamps", ("The lamp",), "The lamp turns.") == "Lamps > The lamp"
    assert passage_context("Guide", ("Lamps",), "# Guide\n\n## Lamps\n\nText.") == ""
    # Whitespace inside a heading is folded; an empty title adds nothing.
    assert passage_context("", ("Care  and\nrepair",), "Oil it.") == "Care and repair"
    assert passage_context("", (), "Oil it.") == ""


def test_a_long_context_is_cut_at_a_word_within_the_bound() -> None:
    line = passage_context("word " * 200, ("Section",), "Text.")
    assert 0 < len(line) <= MAX_CONTEXT_CHARS
    assert line.endswith("word")


def test_shorter_drops_the_last_part_down_to_nothing() -> None:
    assert shorter("Title > Part > Sub") == "Title > Part"
    assert shorter("Title > Part") == "Title"
    assert shorter("Title") == ""
    # A long heading is cut to its first words, keeping its name, before it is left out.
    signature = "urllib.request > urlopen(url, data=None, timeout=10, *, context=None)"
    assert shorter(signature) == "urllib.request > urlopen(url, data=None,"
    assert shorter("urllib.request > urlopen(url, data=None,") == "urllib.request > urlopen(url,"
    assert shorter("urllib.request > urlopen(url,") == "urllib.request"
    assert shorter("A long title of seven words here") == "A long title"


def test_a_new_corpus_gets_the_default_and_a_stored_one_keeps_its_own() -> None:
    assert resolve_chunking(IDENTITY, None) == {**IDENTITY, "context": DEFAULT_CONTEXT}
    assert resolve_chunking({}, None) == {"context": DEFAULT_CONTEXT}
    # Stored before passage context existed (no key): "none", stored as no key at all.
    assert resolve_chunking(IDENTITY, IDENTITY) == IDENTITY
    assert resolve_chunking({}, {}) == {}
    stored = {**IDENTITY, "context": "title-sections"}
    assert resolve_chunking(IDENTITY, stored) == stored


def test_a_configured_context_is_kept_whatever_is_stored() -> None:
    none = {**IDENTITY, "context": "none"}
    assert resolve_chunking(none, None) == IDENTITY
    assert resolve_chunking(none, {**IDENTITY, "context": "title-sections"}) == IDENTITY
    on = {**IDENTITY, "context": "title-sections"}
    assert resolve_chunking(on, IDENTITY) == on  # the store then reports the mismatch


def test_an_unknown_context_is_a_typed_error() -> None:
    with pytest.raises(RetrievalError) as excinfo:
        context_of({"context": "everything"})
    assert excinfo.value.code is ErrorCode.INVALID_REQUEST
    assert excinfo.value.reason == "chunking-settings"
    assert context_of({}) == "none"


def test_the_reserve_is_an_eighth_of_the_passage_at_most_32_tokens() -> None:
    assert context_reserve_tokens(256) == 32
    assert context_reserve_tokens(128) == 16
    assert context_reserve_tokens(8192) == 32

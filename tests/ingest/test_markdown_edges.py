"""Markdown edges: markup lines never make a passage; front-matter keys as the shape check reads
them."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.ingest import (
    CHUNKING_SCHEME,
    ChunkingSettings,
    PreparedDocument,
    prepare_document,
)
from retrieval_host.ingest import document as document_module
from tests.ingest.conftest import TokenCounter

_MARKUP = re.compile(r"^ {0,3}(?:`{3,}[^`]*|~{3,}.*|(?:[-*_][ \t]*){3,}|=+)$")


def cut(doc: str, count_tokens: TokenCounter) -> PreparedDocument:
    """`doc` cut into 64-token passages with 8 of overlap, the settings the defect was seen at."""
    return prepare_document(
        doc.encode(),
        "text/markdown",
        source_id="fence.md",
        token_counter=count_tokens,
        settings=ChunkingSettings(max_tokens=64, overlap_tokens=8),
    )


def markup_only(text: str) -> bool:
    return all(not line.strip() or _MARKUP.match(line) for line in text.split("\n"))


WIDE = "total_{n} = fee_{n}(rate, rate, rate, )"


def fenced(lines: int, template: str, fence: str) -> str:
    """A section that ends in a fence of `lines` code lines, then another section."""
    code = "\n".join(template.format(n=n) for n in range(lines))
    return f"# Fees\n\nHow the fees add up.\n\n{fence}python\n{code}\n{fence}\n\n## Next\n\nMore.\n"


def assert_cited(chunk_text: str, start: int | None, end: int | None, lines: list[str]) -> None:
    """README, "Passage context": the passage occurs in its cited lines joined by line breaks,
    starting in the first of them and ending in the last."""
    assert start is not None and end is not None
    cited = "\n".join(lines[start - 1 : end])
    at = cited.find(chunk_text)
    assert at >= 0
    assert at <= len(lines[start - 1])
    assert at + len(chunk_text) >= len(cited) - len(lines[end - 1])


# Cut before the fix, each of these ended its first section with a passage of the closing
# line alone (a wide code line is more than the 8 tokens of overlap) or of the overlap again
# and the closing line (two short lines are within them).
@pytest.mark.parametrize(
    ("lines", "template", "fence"),
    [(7, WIDE, "```"), (23, WIDE, "~~~~"), (25, "go({n})", "```"), (38, "n += {n}", "```")],
)
def test_a_cut_fence_never_leaves_a_passage_of_its_closing_line(
    lines: int, template: str, fence: str, count_tokens: TokenCounter
) -> None:
    doc = fenced(lines, template, fence)
    file_lines = doc.split("\n")
    chunks = cut(doc, count_tokens).chunks
    assert len(chunks) >= 3  # the fence was cut
    for chunk in chunks:
        assert not markup_only(chunk.text), chunk
        assert_cited(chunk.text, chunk.location.start_line, chunk.location.end_line, file_lines)
    for before, after in itertools.pairwise(chunks):
        # Each passage brings a line the one before did not hold, and not only markup.
        new = [line for line in after.text.split("\n") if line not in before.text.split("\n")]
        assert not markup_only("\n".join(new)), (before.text, after.text)
    every = "\n".join(c.text for c in chunks).split("\n")
    for n in range(lines):
        assert template.format(n=n) in every  # every code line is still in a passage


@pytest.mark.parametrize("rule", ["---", "***", "* * *"])
def test_a_rule_after_a_full_passage_is_no_passage_of_its_own(
    rule: str, count_tokens: TokenCounter
) -> None:
    # The section's text fills its passage, and the last sentence is longer than the overlap:
    # the thematic break was a passage of its own.
    rules = "Every boat must keep well inside the marked channel at night. " * 3
    prose = rules + "The harbour master " + "very " * 16 + "strictly checks this."
    doc = f"# Rules\n\n{prose}\n\n{rule}\n\n## After\n\nText.\n"
    chunks = cut(doc, count_tokens).chunks
    assert any(c.text.endswith("strictly checks this.") for c in chunks)
    assert [c.text for c in chunks if markup_only(c.text)] == []


def test_a_document_of_markup_only_has_nothing_to_index(count_tokens: TokenCounter) -> None:
    with pytest.raises(RetrievalError) as caught:
        cut("```\n```\n\n***\n", count_tokens)
    assert caught.value.code is ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "empty-document"


def test_an_unclosed_fence_keeps_its_last_line_as_code(count_tokens: TokenCounter) -> None:
    # The last line of a fence that never closes is code, not a closing line to drop.
    code = "\n".join(f"step_{n}(" + "arg, " * 6 + ")" for n in range(22))
    doc = f"# Steps\n\n```\n{code}\n"
    every = "\n".join(c.text for c in cut(doc, count_tokens).chunks)
    assert f"step_21({'arg, ' * 6})" in every


def test_a_passage_split_again_after_counting_leaves_no_fence_line_alone(
    count_tokens: TokenCounter,
) -> None:
    # A tokenizer that counts a text ending in a closing fence as far longer than its pieces
    # (token counts need not add up): the real count re-splits such passages in halves down
    # to the closing line alone, which is then no passage.
    def counter(texts: Sequence[str]) -> list[int]:
        extra = [100 if t.endswith("\n```") else 0 for t in texts]
        return [n + e for n, e in zip(count_tokens(texts), extra, strict=True)]

    doc = "# Setup\n\n```\nx = 1\ny = 2\n```\n"
    prepared = prepare_document(
        doc.encode(),
        "text/markdown",
        source_id="setup.md",
        token_counter=counter,
        settings=ChunkingSettings(max_tokens=64, overlap_tokens=8),
    )
    texts = [c.text for c in prepared.chunks]
    assert "y = 2" in "\n".join(texts)
    assert [t for t in texts if markup_only(t)] == []


def test_every_key_that_makes_front_matter_is_kept(count_tokens: TokenCounter) -> None:
    # These keys made the block front matter, and the reader then dropped all but `title`.
    long_key = "k" * 70
    doc = (
        "---\n"
        "title: Pumps\n"
        "og:image: https://example.org/p.png\n"
        "$schema: https://example.org/s.json\n"
        '"my key": one\n'
        "'other key': two\n"
        "título: Bombas\n"
        f"{long_key}: long\n"
        "url: https://example.org:8443/a\n"
        "---\n"
        "# Pumps\n\nPrime the pump.\n"
    )
    front = cut(doc, count_tokens).source.metadata["frontMatter"]
    assert front == {
        "title": "Pumps",
        "og:image": "https://example.org/p.png",
        "$schema": "https://example.org/s.json",
        "my key": "one",
        "other key": "two",
        "título": "Bombas",
        long_key: "long",
        "url": "https://example.org:8443/a",
    }


def test_a_quoted_title_key_names_the_document(count_tokens: TokenCounter) -> None:
    doc = '---\n"title": Pump guide\n---\n# Pumps\n\nPrime the pump.\n'
    prepared = cut(doc, count_tokens)
    assert prepared.source.title == "Pump guide"
    assert prepared.source.metadata["frontMatter"] == {"title": "Pump guide"}


def _earlier_default_revision(prepared: PreparedDocument, settings: ChunkingSettings) -> str:
    """The default revision as releases before markup lines were left out derived it."""
    return "sha256:" + document_module._digest(
        {
            "scheme": CHUNKING_SCHEME,
            "chunking": dict(settings.as_identity()),
            "mediaType": "text/markdown",
            "documentSha256": prepared.document_sha256,
            "title": prepared.source.title,
            "metadata": dict(prepared.source.metadata),
        }
    )


def test_only_a_document_whose_passages_changed_gets_a_new_default_revision(
    count_tokens: TokenCounter,
) -> None:
    # Its passages under the same default revision as before would make sending it again a
    # `revision-content-differs` conflict; every other document keeps its revision (no
    # re-indexing of a corpus for a rule that did not change its passages).
    settings = ChunkingSettings(max_tokens=64, overlap_tokens=8)
    changed = cut(fenced(7, WIDE, "```"), count_tokens)
    assert changed.source.revision != _earlier_default_revision(changed, settings)
    same = cut(fenced(3, "go({n})", "```") + "\n---\n\nAfter a short rule.\n", count_tokens)
    assert len(same.chunks) >= 2
    assert same.source.revision == _earlier_default_revision(same, settings)

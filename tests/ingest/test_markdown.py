"""Markdown ingestion: heading paths, file line ranges, whole code fences, front matter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.validation import MAX_METADATA_BYTES, json_bytes
from retrieval_host.ingest import ChunkingSettings, PreparedDocument, prepare_document
from tests.ingest.conftest import TokenCounter

GUIDE = """\
---
title: "Harbour guide"
owner: port-authority
---
# Harbour

The harbour opens at dawn.

## Mooring

Boats moor on the east quay.
Fees are paid at the office.

### Winter

In winter the west quay closes.

## Fuel

```sh
pump --start
pump --litres 40

pump --stop
```

After fuelling, sign the log.

Lights
======

The lighthouse is checked weekly.
"""


def prepare(data: bytes, count_tokens: TokenCounter, **settings: Any) -> PreparedDocument:
    return prepare_document(
        data,
        "text/markdown",
        source_id="guide.md",
        token_counter=count_tokens,
        settings=ChunkingSettings(**settings),
    )


def section_of(prepared: PreparedDocument, line: int) -> list[str]:
    sections: Any = prepared.source.metadata["sections"]
    for section in sections:
        if section["startLine"] <= line <= section["endLine"]:
            return list(section["headings"])
    raise AssertionError(f"no section holds line {line}")


def test_passages_follow_sections_with_file_line_numbers(count_tokens: TokenCounter) -> None:
    prepared = prepare(GUIDE.encode(), count_tokens)
    lines = GUIDE.split("\n")
    located = [(c.location.start_line, c.location.end_line, c.text) for c in prepared.chunks]
    for start, end, text in located:
        assert start is not None and end is not None
        assert text == "\n".join(lines[start - 1 : end])  # whole lines here: exact slices
    assert located[0] == (5, 7, "# Harbour\n\nThe harbour opens at dawn.")
    assert (9, 12, "## Mooring\n\nBoats moor on the east quay.\nFees are paid at the office.") in (
        located
    )
    winter = next(c for c in prepared.chunks if "west quay closes" in c.text)
    assert winter.location.start_line == 14
    assert section_of(prepared, 14) == ["Harbour", "Mooring", "Winter"]
    assert section_of(prepared, 20) == ["Harbour", "Fuel"]
    lights = next(c for c in prepared.chunks if "lighthouse" in c.text)
    assert lights.location.start_line == 29  # the setext heading's first line
    assert section_of(prepared, 32) == ["Lights"]


def test_front_matter_is_metadata_and_never_a_passage(count_tokens: TokenCounter) -> None:
    prepared = prepare(GUIDE.encode(), count_tokens)
    assert prepared.source.metadata["frontMatter"] == {
        "title": "Harbour guide",
        "owner": "port-authority",
    }
    assert prepared.source.title == "Harbour guide"
    assert all("port-authority" not in c.text for c in prepared.chunks)
    assert min(c.location.start_line or 0 for c in prepared.chunks) == 5


def test_front_matter_and_sections_count_their_bytes_in_utf8(count_tokens: TokenCounter) -> None:
    # A black-box test: `é` counted the 6 bytes of its escape, so 20 front-matter values of
    # 100 `é` kept 4 (840 bytes) of the 3,000 allowed, and CJK headings filled "11,000 bytes"
    # of sections at 7,945.
    front = "".join(f"k{n}: {'é' * 100}\n" for n in range(20))
    doc = f"---\n{front}---\n\n" + "".join(f"## 章節{n:03}\n\n本文。\n\n" for n in range(800))
    metadata = prepare(doc.encode(), count_tokens).source.metadata
    kept = metadata["frontMatter"]
    assert isinstance(kept, dict) and 13 <= len(kept) < 20
    assert 2_800 < json_bytes(kept) <= 3_000
    sections = metadata["sections"]
    assert metadata["sectionsTruncated"] is True
    assert 10_000 < json_bytes(sections) <= 11_000
    assert json_bytes(metadata) <= MAX_METADATA_BYTES


@pytest.mark.parametrize(
    "block",
    [
        "\nThe maximum inlet pressure is 6 bar.\n",  # prose between two rules
        "- maximum inlet pressure\n- 6 bar\n",  # a list alone
        "title: Pumps\nThe maximum inlet pressure is 6 bar.\n",  # a key, then prose
        # Headings (YAML comments) and prose holding colons: a verifier's 167-line file.
        "## Step 0\n\nCheck the maximum inlet pressure: 6 bar.\n\n## Step 1\n\nDo it: now.\n",
    ],
)
def test_a_leading_rule_around_text_is_not_front_matter(
    block: str, count_tokens: TokenCounter
) -> None:
    # A black-box test: a file opening with a `---` rule lost everything up to the next one
    # (in one file 160 of 167 lines), and the ingest said `indexed`.
    data = f"---\n{block}---\n## Changes\n\n- Faster start-up.\n"
    prepared = prepare(data.encode(), count_tokens)
    assert "frontMatter" not in prepared.source.metadata
    text = "\n".join(c.text for c in prepared.chunks)
    assert "maximum inlet pressure" in text
    # Indexed from the opening rule, or from the first line after it that holds text where
    # the rule is alone in its section: markup is in no passage of its own (session 43).
    first = next(n for n, line in enumerate(data.split("\n")[1:], 2) if line.strip())
    assert min(c.location.start_line or 0 for c in prepared.chunks) in (1, first)


def test_front_matter_may_hold_comments_lists_and_nested_values(
    count_tokens: TokenCounter,
) -> None:
    data = (
        b"---\n# a comment\ntitle: Pumps\ntags:\n  - a\n- b\n-\nowner:\n  name: ops\n"
        b'og:image: pump.png\n$schema: page\n"quoted key": 1\n---\nBody.\n'
    )
    prepared = prepare(data, count_tokens)
    assert prepared.source.metadata["frontMatter"] == {
        "title": "Pumps",
        "tags": "  - a\n- b\n-",  # no common indentation to remove: kept as written
        "owner": "name: ops",
        # Keys the shape admits are kept: they were dropped, silently (session 43).
        "og:image": "pump.png",
        "$schema": "page",
        "quoted key": "1",
    }
    assert [(c.location.start_line, c.text) for c in prepared.chunks] == [(14, "Body.")]


def test_a_nested_front_matter_value_is_kept_as_its_text(count_tokens: TokenCounter) -> None:
    # Probe I, session 42: `tags:` over an indented list was stored as `""`, though nested
    # values were documented as kept as their text.
    data = (
        "---\n"
        "title: Front Matter Title\n"
        "tags:\n  - alpha\n  - beta\n"
        "aliases:\n- one\n- two\n"  # YAML's compact list, at the key's own column
        "owner:\n  name: ops\n  on_call:\n    - mira\n"
        "summary: |\n  First line.\n\n  Third line.\n"
        "note: starts here\n  and goes on\n"
        "# a comment ends the block above it\n"
        'quoted: "kept flat"\n'
        "empty:\n"
        "---\n# Body\n\nText.\n"
    )
    prepared = prepare(data.encode(), count_tokens)
    assert prepared.source.metadata["frontMatter"] == {
        "title": "Front Matter Title",
        "tags": "- alpha\n- beta",
        "aliases": "- one\n- two",
        "owner": "name: ops\non_call:\n  - mira",
        "summary": "First line.\n\nThird line.",  # `|` is syntax, not text
        "note": "starts here\nand goes on",
        "quoted": "kept flat",
        "empty": "",
    }
    assert prepared.source.title == "Front Matter Title"
    assert [(c.location.start_line, c.text) for c in prepared.chunks] == [(23, "# Body\n\nText.")]


def test_nested_front_matter_values_keep_the_front_matter_bounds(
    count_tokens: TokenCounter,
) -> None:
    # 12 keys of 15 items: 192 lines, under the 200 a front matter may have.
    items = "".join(f"  - a rather long tag, number {n:02}\n" for n in range(15))
    lists = "".join(f"list{k}:\n{items}" for k in range(12))
    data = f"---\n{lists}---\nBody.\n"
    front = prepare(data.encode(), count_tokens).source.metadata["frontMatter"]
    assert isinstance(front, dict) and 5 <= len(front) < 12
    assert 2_600 < json_bytes(front) <= 3_000
    first = front["list0"]
    assert isinstance(first, str)
    assert len(first) == 300 and first.endswith("…")
    assert first.startswith("- a rather long tag, number 00\n- a rather long tag, number 01\n")


def test_prose_between_two_rules_is_text_not_a_heading(count_tokens: TokenCounter) -> None:
    # A review: the opening rule began a paragraph that the closing one made a heading.
    prepared = prepare(b"---\n\nProse between rules.\n\n---\n\nAfter.\n", count_tokens)
    sections: Any = prepared.source.metadata["sections"]
    assert [s["headings"] for s in sections] == [[]]
    assert "Prose between rules." in prepared.chunks[0].text


@pytest.mark.parametrize(
    "block",
    [
        "- item",
        "1. item",
        "> quoted: rail thyme",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "a | b\n--|--",
    ],
)
def test_an_underline_after_a_list_quote_or_table_is_no_heading(
    block: str, count_tokens: TokenCounter
) -> None:
    # CommonMark: a setext underline makes a heading of a paragraph only; a black-box test
    # found `- item` in a heading path.
    data = f"# Top\n\n{block}\n---\n\nAfter the rule.\n"
    prepared = prepare(data.encode(), count_tokens)
    sections: Any = prepared.source.metadata["sections"]
    assert [s["headings"] for s in sections] == [["Top"]]
    # A paragraph's underline still makes a heading, a later `2.` line going on with it.
    heading = prepare(b"# Top\n\nPlain words\n2. more\n---\n\nBody.\n", count_tokens)
    assert section_of(heading, 7) == ["Top", "Plain words 2. more"]


HTML_AND_INDENTED = """# Install guide

Intro text alpha.

<!--
# TODO: write the upgrade chapter
-->

Run the installer, word bravo.

## Configure

    $ retrieval-host token new
---

Edit host.json, word charlie.

<div class="warning">
## Not a heading: raw HTML block text
</div>

<?php echo "# neither"; ?>
<!-- # nor this --> after a one-line comment

Restart the service, word delta.
"""


def test_html_blocks_and_indented_code_hold_no_heading(count_tokens: TokenCounter) -> None:
    # Probe E (session 37): a heading commented out in `<!-- -->` named every later section, a
    # `##` line inside a `<div>` block was a heading, and indented code underlined by `---` a
    # setext heading. CommonMark reads only `Install guide` and `Configure` here.
    prepared = prepare(HTML_AND_INDENTED.encode(), count_tokens)
    sections: Any = prepared.source.metadata["sections"]
    assert [(s["headings"], s["startLine"]) for s in sections] == [
        (["Install guide"], 1),
        (["Install guide", "Configure"], 11),
    ]
    text = "\n".join(c.text for c in prepared.chunks)
    for kept in ("# TODO: write the upgrade chapter", "## Not a heading", "$ retrieval-host"):
        assert kept in text  # still indexed, as text
    # Probe V (session 37): what follows indented code or an HTML block may be underlined into
    # a heading of its own lines only (the first cut found none, or took the comment in).
    for document, headings in (
        (b"    code\nFoo\n---\n\nBody.\n", ["Foo"]),
        (b"\tcode\nTitle\n===\n\nBody.\n", ["Title"]),
        (b"<!-- badges -->\nTitle\n=====\n\nBody.\n", ["Title"]),
        (b"Heading text\n<!-- note -->\n---\n\nBody.\n", []),
    ):
        found: Any = prepare(document, count_tokens).source.metadata["sections"]
        assert [h for s in found for h in s["headings"]] == headings, document
    # After a block ends, headings are read again.
    after: Any = prepare(b"<div>\n# no\n</div>\n\n# Yes\n\nBody.\n", count_tokens)
    assert [s["headings"] for s in after.source.metadata["sections"]] == [[], ["Yes"]]


def test_a_code_fence_that_fits_stays_whole(count_tokens: TokenCounter) -> None:
    prepared = prepare(GUIDE.encode(), count_tokens, max_tokens=40, overlap_tokens=0)
    fence = "```sh\npump --start\npump --litres 40\n\npump --stop\n```"
    holding = [c for c in prepared.chunks if "pump --start" in c.text]
    assert len(holding) == 1
    assert fence in holding[0].text


def test_a_fence_longer_than_a_passage_is_split_by_whole_lines(
    count_tokens: TokenCounter,
) -> None:
    code = [f"    step_{n} = compute(step_{n - 1}, factor={n})" for n in range(1, 61)]
    doc = "# Script\n\n```python\n" + "\n".join(code) + "\n```\n"
    prepared = prepare(doc.encode(), count_tokens, max_tokens=64, overlap_tokens=0)
    assert len(prepared.chunks) > 3
    counts = count_tokens([c.text for c in prepared.chunks])
    assert max(counts) <= 64
    file_lines = doc.split("\n")
    for chunk in prepared.chunks:
        start, end = chunk.location.start_line, chunk.location.end_line
        assert start is not None and end is not None
        # Whole lines: the passage equals the file's lines (code keeps its indentation).
        assert chunk.text == "\n".join(file_lines[start - 1 : end])
    joined = "\n".join(c.text for c in prepared.chunks)
    assert all(line.strip() in joined for line in code)


def test_a_heading_without_text_joins_its_first_subsection(count_tokens: TokenCounter) -> None:
    doc = b"# Manual\n## Setup\n\nInstall the tool.\n"
    prepared = prepare(doc, count_tokens)
    assert [c.text for c in prepared.chunks] == ["# Manual\n## Setup\n\nInstall the tool."]
    assert section_of(prepared, 1) == ["Manual", "Setup"]


def test_crlf_and_lf_files_are_the_same_revision(count_tokens: TokenCounter) -> None:
    lf = prepare(GUIDE.encode(), count_tokens)
    crlf = prepare(GUIDE.replace("\n", "\r\n").encode(), count_tokens)
    bom = prepare(b"\xef\xbb\xbf" + GUIDE.encode(), count_tokens)
    assert lf == crlf == bom
    assert lf.source.revision.startswith("sha256:")


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16", "utf-16-be"])
def test_markdown_must_be_utf8(count_tokens: TokenCounter, encoding: str) -> None:
    data = "# Café\n\nCrème brûlée.\n".encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    with pytest.raises(RetrievalError) as caught:
        prepare(data, count_tokens)
    assert caught.value.code == ErrorCode.INVALID_DOCUMENT
    assert caught.value.reason == "markdown-not-utf8"


@pytest.mark.parametrize("data", [b"# Title\n\x00\x01binary", b"%PDF-1.7\n%binary"])
def test_binary_bytes_are_not_markdown(data: bytes, count_tokens: TokenCounter) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare(data, count_tokens)
    assert caught.value.reason == "content-type-mismatch"


def test_a_document_of_only_front_matter_is_empty(count_tokens: TokenCounter) -> None:
    with pytest.raises(RetrievalError) as caught:
        prepare(b"---\ntitle: x\n---\n\n   \n", count_tokens)
    assert caught.value.reason == "empty-document"


def test_many_sections_stay_within_the_metadata_bound(count_tokens: TokenCounter) -> None:
    doc = "\n".join(f"## Part {n}\n\nText of part {n}.\n" for n in range(1500))
    prepared = prepare(doc.encode(), count_tokens)
    assert prepared.source.metadata["sectionsTruncated"] is True
    assert len(json.dumps(prepared.source.metadata, sort_keys=True)) <= MAX_METADATA_BYTES
    assert len(prepared.chunks) == 1500


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("# Pump guide\n\n## Priming\n\nPrime the pump.\n", "Pump guide"),
        ("# Pump guide\n\nIntro.\n\n## Priming\n\nPrime the pump.\n", "Pump guide"),
        ("Pump guide\n==========\n\n## Priming\n\nPrime the pump.\n", "Pump guide"),
        ("## Priming\n\nPrime the pump.\n", ""),
        ("Intro.\n\n## Priming\n\n# Later h1\n\nText.\n", "Later h1"),
    ],
)
def test_the_first_h1_is_the_title_even_directly_before_a_deeper_heading(
    count_tokens: TokenCounter, text: str, title: str
) -> None:
    # A heading-only `# Title` is folded into the `## Section` after it: the title came out
    # empty for the commonest shape of a Markdown document (a black-box test).
    assert prepare(text.encode(), count_tokens).source.title == title

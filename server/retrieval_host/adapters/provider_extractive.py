"""The offline `extractive` provider: answers with sentences quoted from the evidence.

No language model is involved. It exists so the whole product works on one machine with no
account, and it is labelled as extractive in every answer. Deterministic: the same evidence and
question give the same answer.

Each line of an answer quotes one sentence as the cited passage has it modulo white space,
less the `>` marks that begin quoted e-mail lines. Where leaving them out would put in the
answer a quotation (text in quotation marks) that the passage does not hold, the sentence
keeps them: the host's quote check (`citations.quotes`) passes every answer.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.evidence import defang
from retrieval_host.core.lexical import DEFAULT_ANALYZER, analyze
from retrieval_host.core.mail_quotes import ATTRIBUTION, QUOTE_MARKS, is_attribution
from retrieval_host.core.run_ports import (
    EvidencePassage,
    FinishReported,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallRequested,
    UsageReported,
)
from retrieval_host.core.runs.citations import check_citations
from retrieval_host.core.runs_model import CitationPolicy, GenerationUsage

LABEL = "Extractive answer (sentences quoted from the evidence; no language model was used):"
# What it says when no sentence of the evidence shares a word with the question: no citation,
# so a run that requires one (`citations.require`) fails `INVALID_CITATION` / `no-citation`.
DECLINED = "No sentence of the evidence shares a word with the question: it does not answer it."
# A sentence ends at `.`, `!` or `?` before white space, at the full stops and marks of
# Chinese, Japanese, Arabic and Devanagari text with or without it (those scripts put no space
# after them: a black-box test saw a whole Japanese paragraph quoted as one sentence), after a
# closing quote or bracket that follows one (`“价格很好。”` is one sentence), or at a line break.
_STOPS = "。！？｡．؟۔।॥"
_CLOSERS = "”’」』）)〉》"
_SENTENCE_END = re.compile(
    rf"(?<=[.!?])\s+|(?<=[{_STOPS}])(?![{_CLOSERS}])\s*|(?<=[{_STOPS}][{_CLOSERS}])\s*|\n+"
)
_STOP = frozenset(
    "a an and are as at be by can do does for from how i in is it its of on or that the this "
    "to was what when where which who why will with you your".split()
)


# Words are compared as the lexical index compares them (folded, stemmed: "batteries" shares
# "battery" with a sentence), less the question words a question shares with anything.
_STOP_STEMS = frozenset(analyze(" ".join(sorted(_STOP)), DEFAULT_ANALYZER))


def _terms(text: str) -> set[str]:
    return {t for t in analyze(text, DEFAULT_ANALYZER) if t not in _STOP_STEMS}


@dataclass(frozen=True, slots=True)
class _Sentence:
    text: str  # as shown: white space normalized, no quote marks
    terms: frozenset[str]
    heading: frozenset[str]  # the terms of the heading above it in the passage, if any
    depth: int  # how many `>` marks its lines began with (0: the message's own text)
    verbatim: str  # `text` with the marks of the lines it continues onto, if it does


# Markdown structure, as CommonMark spells it: a fence opens with 3+ backticks or tildes (and
# may name a language) and closes with 3+ of the same character and nothing else; an ATX
# heading is 1-6 `#` and a space or the line's end (`#include <stdio.h>` is text); a setext
# heading underlines its paragraph; a line indented 4 spaces outside a paragraph is code.
_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^#{1,6}(?:[ \t]+|$)")
_SETEXT = re.compile(r"^(?:=+|-+)[ \t]*$")
_INDENTED = re.compile(r"^(?: {4}|\t)")
_PROSE = re.compile(r"[^\W\d_]|\s")  # letters and spaces: most of prose, less of code


def _prose_share(lines: list[str]) -> float:
    text = "".join(lines)
    return len(_PROSE.findall(text)) / len(text) if text else 1.0


def _began_in_code(lines: list[str]) -> bool:
    """Whether a passage begins inside a code block (the chunker cut a long block): its first
    fence is bare and unpaired, and the text before it reads less like prose than the text
    after it (a passage that opens a bare block and is cut reads the other way round)."""
    fences = [i for i, line in enumerate(lines) if _FENCE.match(line)]
    if not fences or len(fences) % 2 == 0:
        return False
    first = _FENCE.match(lines[fences[0]])
    if first is None or first.group(2).strip():
        return False  # a fence naming a language opens a block
    before = [line for line in lines[: fences[0]] if line]
    if not before:
        return False
    after_end = fences[1] if len(fences) > 1 else len(lines)
    after = [line for line in lines[fences[0] + 1 : after_end] if line]
    if not after:
        return _prose_share(before) < 0.8
    return _prose_share(before) < _prose_share(after)


# Quoted e-mail (`core.mail_quotes`): the `>` marks that begin a line of a message are its
# quote depth, not its text: "- > > > > When the number of data points is odd, ..." was
# quoted (probe D). An attribution introduces quoted text and says nothing ("Carol Diaz wrote:
# > Collapse and truncate ..." was quoted as one sentence). Only in mail: in any other text a
# leading `>` is the text's own (">5 mg/kg ... is lethal" was quoted "5 mg/kg ...", and a
# REPL's `>>> import os` line fused with the next; probe W).
def _sentences(lines: list[str], drop: set[int], quoting: bool) -> list[_Sentence]:
    """The sentences of a passage's `lines` (defanged), less the lines in `drop` (a running
    header or footer); with `quoting`, leading `>` marks are read as a quote depth, a change
    of which ends a paragraph as a blank line does."""
    marked = [QUOTE_MARKS.match(raw) if quoting else None for raw in lines]
    marks = [m.group(1).strip() if m else "" for m in marked]
    bodies = [raw[m.end() :] if m else raw for raw, m in zip(lines, marked, strict=True)]
    contents = [body.strip() for body in bodies]
    depth = marks[0].count(">") if marks else 0
    closing: re.Pattern[str] | None = None  # what ends the code block the line is in
    block_depth = depth  # the quote depth of that block: a line quoted less ends it
    if _began_in_code(contents):
        closing = re.compile(r"^(`{3,}|~{3,})[ \t]*$")
    heading: frozenset[str] = frozenset()
    sentences: list[_Sentence] = []
    kept: list[int] = []  # the paragraph's lines, by index

    def flush() -> None:
        # Lines of one paragraph form one text (documents wrap sentences across lines);
        # defanged again once joined (which keeps every character's offset).
        joined = " ".join(contents[i] for i in kept)
        body = defang(joined)
        # Where each continuation line begins in `body`, and the marks it had there.
        starts: list[tuple[int, str]] = []
        offset = 0
        for i in kept:
            if offset and marks[i]:
                starts.append((offset, marks[i]))
            offset += len(contents[i]) + 1
        kept.clear()
        at = 0  # the first of `starts` not before the current sentence
        begin = 0
        ends = [(m.start(), m.end()) for m in _SENTENCE_END.finditer(body)]
        for end, after in [*ends, (len(body), len(body))]:
            piece = body[begin:end].strip()
            if len(piece) > 1:
                while at < len(starts) and starts[at][0] <= begin:
                    at += 1
                pieces: list[str] = []
                last = begin
                while at < len(starts) and starts[at][0] < end:
                    pieces.append(f"{joined[last : starts[at][0]]}{starts[at][1]} ")
                    last = starts[at][0]
                    at += 1
                verbatim = defang("".join(pieces) + joined[last:end]).strip() if pieces else piece
                terms = frozenset(_terms(piece))
                sentences.append(_Sentence(piece, terms, heading, depth, verbatim))
            begin = after

    # Code is not sentences, blank lines inside a block included (the closing fence was quoted
    # with the code's second half). A heading is not quoted: its words count for the sentences
    # under it (`os.loadavg()` names its section only in its heading).
    for index, (unmarked, line) in enumerate(zip(bodies, contents, strict=True)):
        if index in drop:
            flush()
            continue
        if marks[index].count(">") != depth:
            flush()
            depth = marks[index].count(">")
            if closing is not None and depth < block_depth:
                closing = None  # a block in a quote ends with the quote (CommonMark)
        if closing is not None:
            if closing.match(line):
                closing = None
            continue
        fence = _FENCE.match(line)
        if fence:
            flush()
            mark = fence.group(1)
            closing = re.compile(rf"^{re.escape(mark[0])}{{{len(mark)},}}[ \t]*$")
            block_depth = depth
        elif not line or (quoting and ATTRIBUTION.fullmatch(line)):
            flush()  # a blank line, or an attribution (not quoted)
        elif (
            quoting and 0 < len(kept) < 3 and is_attribution([contents[i] for i in (*kept, index)])
        ):
            # An attribution a mail client wrapped: "On ..., Bob <bob@example.org>" / "wrote:".
            kept.clear()
        elif _ATX.match(line):
            flush()
            heading = frozenset(_terms(line.lstrip("#")))
        elif _SETEXT.match(line) and kept:
            heading = frozenset(_terms(" ".join(contents[i] for i in kept)))
            kept.clear()
        elif not kept and (_INDENTED.match(unmarked) or _SETEXT.match(line)):
            continue  # indented code, or a thematic break
        else:
            kept.append(index)
    flush()
    return sentences


# A PDF's running header and footer stay in each page's text: "Apache-2.0 licence text —
# Reference Edition 2024 CONFIDENTIAL DRAFT Page 1" was quoted as a sentence, and a sentence
# cut at a page end was quoted with the footer glued on (probe A). Such a line repeats, its
# page number aside, at the top (or the bottom) of other pages of the source. Genuine lines
# repeat across pages too: a reference's summary table and its entries say "Return the median
# (middle value) of numeric data." on pages 1 and 2, in mid-page; two classes with one
# docstring end a page and begin the next with the same lines. Only a page number at the
# line's end (after a space or a separator) is set aside, not every figure: data-sheet pages
# opening "Model P-100 pumps deliver at most 40 litres per minute." and "Model P-200 ... 95
# litres per minute." are no running header (probe W). The forms: "3", "Page 3", "p. 3",
# "Page iv", "- 3 -", "3 of 12", "3/12".
_PAGE_NUMBER = re.compile(
    r"(?:^|(?<=\s)|(?<=[—–|·•]))[-–—]?\s*"
    r"(?:(?:page|pg\.?|p\.)\s*(?:\d+|[ivxlcdm]+\b)|\d+)(?:\s*(?:of|/)\s*\d+)?\s*[-–—]?$",
    re.IGNORECASE,
)
_Line = tuple[str, str, str, str]  # namespace, source, revision, text less its page number


def _running_text(line: str) -> str:
    """What `line` reads as on every page it runs on: white space normalized, less the page
    number that ends it, if one does."""
    return _PAGE_NUMBER.sub("", " ".join(line.split())).rstrip()


def _boilerplate(evidence: Sequence[EvidencePassage], lines: list[list[str]]) -> list[set[int]]:
    """Per passage, the lines (by index) that are a running header or footer: the lines of
    the run at its top (if it begins its page) or bottom whose every line repeats on another
    page of the source, each found in such a run on two pages or more, a run that begins (or
    ends) with the same line. None in a passage with no page, nor while the evidence holds
    one page of the source."""
    nonblank: list[list[int]] = []  # per passage, its lines that hold text
    keys: list[list[_Line]] = []  # and what they read as
    on_pages: dict[_Line, set[int]] = {}
    for passage, its_lines in zip(evidence, lines, strict=True):
        page = passage.location.page
        scope = (passage.namespace, passage.source_id, passage.revision)
        written = [i for i, line in enumerate(its_lines) if line.strip()]
        nonblank.append(written if page is not None else [])
        keys.append([(*scope, _running_text(its_lines[i])) for i in nonblank[-1]])
        for key in keys[-1]:
            on_pages.setdefault(key, set()).add(page or 0)

    def repeated(key: _Line) -> bool:
        return len(on_pages[key]) > 1

    # By the line and its run's first (or last): a header begins its pages alike and a footer
    # ends them alike, while the same text can end one passage and begin the next page's.
    at_top: dict[tuple[_Line, _Line], set[int]] = {}
    at_bottom: dict[tuple[_Line, _Line], set[int]] = {}
    for passage, its_keys in zip(evidence, keys, strict=True):
        head, tail = _runs(passage, its_keys, repeated, repeated)
        for found, run in ((at_top, head), (at_bottom, tail)):
            for at in run:
                page = passage.location.page or 0
                found.setdefault((its_keys[at], its_keys[run[0]]), set()).add(page)
    drop: list[set[int]] = []
    for passage, its_keys, indices in zip(evidence, keys, nonblank, strict=True):
        if not its_keys:
            drop.append(set())
            continue

        def header(key: _Line, first: _Line = its_keys[0]) -> bool:
            return len(at_top.get((key, first), ())) > 1

        def footer(key: _Line, last: _Line = its_keys[-1]) -> bool:
            return len(at_bottom.get((key, last), ())) > 1

        head, tail = _runs(passage, its_keys, header, footer)
        drop.append({indices[at] for at in (*head, *tail)})
    return drop


def _runs(
    passage: EvidencePassage,
    keys: list[_Line],
    top: Callable[[_Line], bool],
    bottom: Callable[[_Line], bool],
) -> tuple[list[int], list[int]]:
    """The positions in `keys` of the run at the passage's top (if it begins its page) whose
    every line satisfies `top`, and of the run at its bottom whose lines satisfy `bottom`."""
    starts_page = passage.location.start_line in (None, 1)
    head = [*itertools.takewhile(lambda at: top(keys[at]), range(len(keys)))] if starts_page else []
    tail = [*itertools.takewhile(lambda at: bottom(keys[at]), reversed(range(len(keys))))]
    return head, tail


# A question word found only in the heading above a sentence counts half as much as in it,
# and only when the heading holds at least half the question's words: "loadavg" is answered
# from the `os.loadavg()` section, but a question about bicycles is not answered from a
# "Troubleshooting" section because it says "troubleshooting" (probe V).
HEADING_WEIGHT = 0.5


def _rarity(question: set[str], sentences: list[_Sentence]) -> dict[str, float]:
    """Each question term's weight, `log((N + 1) / n)` over the N sentences of the evidence, n
    holding it (or under a heading that does). Two words outweigh one only when each is held
    by fewer than √(N + 1) sentences: the one sentence sharing "seccomp" beats sentences
    sharing "file" and "package" (black-box probes Q and V: other packages' changelogs were
    quoted over the message that answered)."""
    held = {t: 0 for t in question}
    for sentence in sentences:
        for term in question & (sentence.terms | sentence.heading):
            held[term] += 1
    total = len(sentences)
    return {t: math.log((total + 1) / n) if n else 0.0 for t, n in held.items()}


def _score(question: set[str], sentence: _Sentence, weight: dict[str, float]) -> float:
    shared = question & sentence.terms
    score = sum(weight[t] for t in shared)
    titled = question & sentence.heading
    if 2 * len(titled) >= len(question):
        score += HEADING_WEIGHT * sum(weight[t] for t in titled - shared)
    return score


# A quotation in a sentence is checked against the cited passage (`citations.quotes`): one that
# crossed a line whose marks were left out is not in the passage so written.
_QUOTES_CHECKED = CitationPolicy(require=False, quotes=True)


def _line(sentence: _Sentence, passage: EvidencePassage) -> str:
    """The answer's line quoting `sentence`: without the marks of the quoted lines it
    continues onto, unless the host's quote check then fails it."""
    line = f"- {sentence.text} [source:{passage.handle}]\n"
    if sentence.verbatim == sentence.text:
        return line
    try:
        check_citations(line, {passage.handle: passage}, _QUOTES_CHECKED)
    except RetrievalError:
        return f"- {sentence.verbatim} [source:{passage.handle}]\n"
    return line


class ExtractiveProvider:
    """Picks the sentences sharing the rarest terms with the question (a heading's words
    counting for the sentences under it), each cited `[source:ID]`."""

    # Usage records name this account: the calls cost nothing and leave the machine never.
    account_id = "local"
    # The one model it serves: a run naming another (a copied hosted model's name) is refused
    # rather than recorded as generated by a model that does not exist.
    models = frozenset({"extractive"})

    def __init__(self, *, max_sentences: int = 3) -> None:
        self._max = max_sentences

    @property
    def kind(self) -> str:
        return "extractive"

    def generate(
        self, request: GenerationRequest, cancel: CancelToken
    ) -> Iterator[GenerationEvent]:
        cancel.check()
        searchable = any(t.name == "search_context" for t in request.tools)
        if not request.evidence and searchable and request.step == 1:
            # Tool mode, first step: ask for the one search the question implies (once: the
            # same question again would find the same nothing).
            arguments = json.dumps({"query": request.question})
            yield ToolCallRequested(ToolCall(f"call_{request.step}", "search_context", arguments))
            yield FinishReported("stop")
            return
        question = _terms(request.question)
        evidence = request.evidence
        lines = [defang(passage.text).splitlines() for passage in evidence]
        drop = _boilerplate(evidence, lines)
        found = [
            (p_index, s_index, sentence, passage)
            for p_index, passage in enumerate(evidence)
            # `>` marks are quote marks only in a message (its location names it), elsewhere
            # the text's own.
            for s_index, sentence in enumerate(
                _sentences(lines[p_index], drop[p_index], passage.location.document_id is not None)
            )
        ]
        weight = _rarity(question, [f[2] for f in found])
        # Ties go to the passage the search ranked first (the evidence's order).
        scored = [(-_score(question, f[2], weight), *f) for f in found]
        # Neighbouring passages share their boundary sentences (the chunker's overlap), and
        # replies quote a message's sentences again: a sentence is given once, in the place
        # its best-scored occurrence ranks, from a passage where it is not quoted if there is
        # one (the message that wrote it: replies quoting it often rank above it), else from
        # the one that ranked it first.
        place: dict[str, tuple[float, int, int]] = {}
        shown: dict[str, tuple[float, int, int, _Sentence, EvidencePassage]] = {}
        for entry in sorted(scored, key=lambda e: (e[3].depth > 0, e[:3])):
            key = " ".join(entry[3].text.split()).casefold()
            place[key] = min(place.get(key, entry[:3]), entry[:3])
            shown.setdefault(key, entry)
        ranked = sorted((position, key) for key, position in place.items())
        # Only sentences that share a word with the question (or whose heading does): it
        # quoted the first sentence whatever it said ("how do I bake a chocolate cake" was
        # answered "- 4.", a list number, with a valid citation; a black-box test).
        chosen = [shown[key] for position, key in ranked if position[0] < 0][: self._max]
        # Keep the chosen sentences in document order, so the answer reads naturally.
        chosen.sort(key=lambda c: (c[1], c[2]))
        yield TextDelta(LABEL + "\n")
        if not chosen:
            yield TextDelta(DECLINED + "\n")
        for _, _, _, sentence, passage in chosen:
            cancel.check()
            yield TextDelta(_line(sentence, passage))
            cancel.progress()
        # It has no output-token limit to cut at: its answers end where it chose (at most
        # `max_sentences` quotes), so always `stop`.
        yield FinishReported("stop")
        yield UsageReported(GenerationUsage(input_tokens=0, output_tokens=0))

"""The offline `extractive` provider: answers with sentences quoted from the evidence.

No language model is involved. It exists so the whole product works on one machine with no
account, and it is labelled as extractive in every answer. Deterministic: the same evidence and
question give the same answer.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.evidence import defang
from retrieval_host.core.lexical import DEFAULT_ANALYZER, analyze
from retrieval_host.core.run_ports import (
    EvidencePassage,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallRequested,
    UsageReported,
)
from retrieval_host.core.runs_model import GenerationUsage

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
    text: str
    terms: frozenset[str]
    heading: frozenset[str]  # the terms of the heading above it in the passage, if any


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


def _sentences(passage: EvidencePassage) -> list[_Sentence]:
    # A quoted sentence must not smuggle a citation marker of its own into the answer.
    raw_lines = defang(passage.text).splitlines()
    lines = [line.strip() for line in raw_lines]
    closing: re.Pattern[str] | None = None  # what ends the code block the line is in
    if _began_in_code(lines):
        closing = re.compile(r"^(`{3,}|~{3,})[ \t]*$")
    heading: frozenset[str] = frozenset()
    sentences: list[_Sentence] = []
    kept: list[str] = []

    def flush() -> None:
        # Lines of one paragraph form one text (documents wrap sentences across lines);
        # defanged again once joined.
        body = defang(" ".join(kept))
        kept.clear()
        for piece in _SENTENCE_END.split(body):
            if len(piece.strip()) > 1:
                sentences.append(_Sentence(piece.strip(), frozenset(_terms(piece)), heading))

    # Code is not sentences, blank lines inside a block included (the closing fence was quoted
    # with the code's second half). A heading is not quoted: its words count for the sentences
    # under it (`os.loadavg()` names its section only in its heading).
    for raw, line in zip(raw_lines, lines, strict=True):
        if closing is not None:
            if closing.match(line):
                closing = None
            continue
        fence = _FENCE.match(line)
        if fence:
            flush()
            mark = fence.group(1)
            closing = re.compile(rf"^{re.escape(mark[0])}{{{len(mark)},}}[ \t]*$")
        elif not line:
            flush()
        elif _ATX.match(line):
            flush()
            heading = frozenset(_terms(line.lstrip("#")))
        elif _SETEXT.match(line) and kept:
            heading = frozenset(_terms(" ".join(kept)))
            kept.clear()
        elif not kept and (_INDENTED.match(raw) or _SETEXT.match(line)):
            continue  # indented code, or a thematic break
        else:
            kept.append(line)
    flush()
    return sentences


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
            return
        question = _terms(request.question)
        found = [
            (p_index, s_index, sentence, passage.handle)
            for p_index, passage in enumerate(request.evidence)
            for s_index, sentence in enumerate(_sentences(passage))
        ]
        weight = _rarity(question, [f[2] for f in found])
        ranked: list[tuple[float, int, int, str, str]] = []
        for p_index, s_index, sentence, handle in found:
            score = _score(question, sentence, weight)
            # Ties go to the passage the search ranked first (the evidence's order).
            ranked.append((-score, p_index, s_index, sentence.text, handle))
        ranked.sort()
        # Neighbouring passages share their boundary sentences (the chunker's overlap): a
        # sentence is quoted once, under the passage that ranked it first.
        unique: dict[str, tuple[float, int, int, str, str]] = {}
        for entry in ranked:
            unique.setdefault(" ".join(entry[3].split()).casefold(), entry)
        ranked = list(unique.values())
        # Only sentences that share a word with the question (or whose heading does): it
        # quoted the first sentence whatever it said ("how do I bake a chocolate cake" was
        # answered "- 4.", a list number, with a valid citation; a black-box test).
        chosen = [r for r in ranked if r[0] < 0][: self._max]
        # Keep the chosen sentences in document order, so the answer reads naturally.
        chosen.sort(key=lambda r: (r[1], r[2]))
        yield TextDelta(LABEL + "\n")
        if not chosen:
            yield TextDelta(DECLINED + "\n")
        for _, _, _, quoted, handle in chosen:
            cancel.check()
            yield TextDelta(f"- {quoted} [source:{handle}]\n")
            cancel.progress()
        yield UsageReported(GenerationUsage(input_tokens=0, output_tokens=0))

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


_FENCE = ("```", "~~~")


def _sentences(passage: EvidencePassage) -> list[_Sentence]:
    # A quoted sentence must not smuggle a citation marker of its own into the answer.
    text = defang(passage.text)
    lines = [line.strip() for line in text.splitlines()]
    fences = [line for line in lines if line.startswith(_FENCE)]
    # A passage cut from inside a code block starts with its closing fence: an odd count whose
    # first is bare (an opening fence usually names its language) means it began in code.
    in_code = len(fences) % 2 == 1 and fences[0].rstrip("`~") == ""
    heading: frozenset[str] = frozenset()
    sentences: list[_Sentence] = []
    # Lines of one paragraph form one text (documents wrap sentences across lines). Code
    # blocks are not sentences, blank lines inside them included (the closing fence was quoted
    # with the code's second half). A heading is not quoted: its words count for the
    # sentences under it (`os.loadavg()` names its section only in the heading).
    for paragraph in re.split(r"\n\s*\n", text):
        kept: list[str] = []
        for line in (raw.strip() for raw in paragraph.splitlines()):
            if line.startswith(_FENCE):
                in_code = not in_code
            elif in_code or not line:
                continue
            elif line.startswith("#"):
                heading = frozenset(_terms(line.lstrip("#")))
            else:
                kept.append(line)
        # Defanged again once joined: a `#` line dropped from inside `[`...`source:ID]` made
        # the two halves one marker (a black-box test).
        body = defang(" ".join(kept))
        for piece in _SENTENCE_END.split(body):
            if len(piece.strip()) > 1:
                sentences.append(_Sentence(piece.strip(), frozenset(_terms(piece)), heading))
    return sentences


# A question word found only in the heading above a sentence counts half as much as in it.
HEADING_WEIGHT = 0.5


def _rarity(question: set[str], sentences: list[_Sentence]) -> dict[str, float]:
    """Each question term's weight, `log(1 + N / n)` over the N sentences of the evidence, n
    holding it (or under a heading that does): a rare word the answer shares ("seccomp")
    outweighs two common ones another sentence shares ("file", "package"; a black-box
    test quoted other packages' changelogs over the message that answered)."""
    held = {t: 0 for t in question}
    for sentence in sentences:
        for term in question & (sentence.terms | sentence.heading):
            held[term] += 1
    total = len(sentences)
    return {t: math.log1p(total / n) if n else 0.0 for t, n in held.items()}


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
            shared = question & sentence.terms
            score = sum(weight[t] for t in shared) + sum(
                HEADING_WEIGHT * weight[t] for t in (question & sentence.heading) - shared
            )
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

"""The offline `extractive` provider: answers with sentences quoted from the evidence.

No language model is involved. It exists so the whole product works on one machine with no
account, and it is labelled as extractive in every answer. Deterministic: the same evidence and
question give the same answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.evidence import defang
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
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset(
    "a an and are as at be by can do does for from how i in is it its of on or that the this "
    "to was what when where which who why will with you your".split()
)


def _terms(text: str) -> set[str]:
    return {w for w in (m.casefold() for m in _WORD.findall(text)) if w not in _STOP and len(w) > 1}


def _sentences(passage: EvidencePassage) -> list[str]:
    # A quoted sentence must not smuggle a citation marker of its own into the answer.
    text = defang(passage.text)
    sentences: list[str] = []
    # Lines of one paragraph form one text (documents wrap sentences across lines); Markdown
    # headings and code fences are structure, not sentences to quote.
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in paragraph.splitlines()]
        if lines and lines[0].startswith("```"):
            continue
        body = " ".join(line for line in lines if line and not line.startswith("#"))
        sentences += [s.strip() for s in _SENTENCE_END.split(body) if len(s.strip()) > 1]
    return sentences


class ExtractiveProvider:
    """Picks the sentences sharing most terms with the question, each cited `[source:ID]`."""

    # Usage records name this account: the calls cost nothing and leave the machine never.
    account_id = "local"

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
        ranked: list[tuple[int, int, int, str, str]] = []
        for p_index, passage in enumerate(request.evidence):
            for s_index, sentence in enumerate(_sentences(passage)):
                overlap = len(question & _terms(sentence))
                ranked.append((-overlap, p_index, s_index, sentence, passage.handle))
        ranked.sort()
        # Neighbouring passages share their boundary sentences (the chunker's overlap): a
        # sentence is quoted once, under the passage that ranked it first.
        unique: dict[str, tuple[int, int, int, str, str]] = {}
        for entry in ranked:
            unique.setdefault(" ".join(entry[3].split()).casefold(), entry)
        ranked = list(unique.values())
        chosen = [r for r in ranked if r[0] < 0][: self._max] or ranked[:1]
        # Keep the chosen sentences in document order, so the answer reads naturally.
        chosen.sort(key=lambda r: (r[1], r[2]))
        yield TextDelta(LABEL + "\n")
        if not chosen:
            yield TextDelta("The evidence contains no sentence to quote.\n")
        for _, _, _, sentence, handle in chosen:
            cancel.check()
            yield TextDelta(f"- {sentence} [source:{handle}]\n")
            cancel.progress()
        yield UsageReported(GenerationUsage(input_tokens=0, output_tokens=0))

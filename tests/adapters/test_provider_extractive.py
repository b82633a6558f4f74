"""The offline extractive provider: what it quotes, and under which handle."""

from __future__ import annotations

from retrieval_host.adapters.provider_extractive import LABEL, ExtractiveProvider
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.models import Location
from retrieval_host.core.run_ports import EvidencePassage, GenerationRequest, TextDelta


def _passage(handle: str, text: str) -> EvidencePassage:
    return EvidencePassage(handle, "torque", "r1", "Torque", Location(start_line=1), text)


def _answer(evidence: list[EvidencePassage], question: str) -> list[str]:
    request = GenerationRequest("extractive", (), evidence=evidence, question=question)
    events = ExtractiveProvider().generate(request, CancelToken())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.startswith(LABEL + "\n")
    return text.removeprefix(LABEL + "\n").splitlines()


def test_a_sentence_two_overlapping_passages_share_is_quoted_once() -> None:
    # A black-box test: the chunker's overlap put one sentence in two passages, and the answer
    # quoted it twice under two citations (one of its three slots wasted).
    shared = "Line 27 sets the torque value 189."
    first = _passage("p-1", f"Line 26 sets the torque value 120.\n{shared}")
    second = _passage("p-2", f"{shared}\nLine 28 sets the torque value 240.")
    lines = _answer([first, second], "torque value 189 line 27")
    assert lines.count(f"- {shared} [source:p-1]") == 1
    assert not any(shared in line and "p-2" in line for line in lines)
    assert len(lines) == 3  # the slot went to another sentence

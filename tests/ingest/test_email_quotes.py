"""Quoted text a thread repeats is left out of its passages (`core.mail_quotes`): the original
keeps it, and a reply keeps what it says itself and the quotes nothing else in the file holds."""

from __future__ import annotations

from typing import Any

from retrieval_host.core.mail_quotes import repeated_quote_lines
from retrieval_host.ingest import IngestLimits, PreparedDocument, prepare_document
from tests.ingest.conftest import TokenCounter
from tests.support import ingest_documents as docs

ORIGINAL = (
    "The east quay closes for dredging from the third of March until the end of April.\n"
    "Boats of more than twelve metres berth at the west pier until then.\n"
)
# Wrapped anew by the replier's client, as clients do: the words match, the lines do not.
QUOTED = (
    "> The east quay closes for dredging from the third of March\n"
    "> until the end of April. Boats of more than twelve metres berth\n"
    "> at the west pier until then.\n"
)


def _thread(*bodies: str) -> bytes:
    return docs.mbox(
        *(
            docs.message(body, message_id=f"<m{n}@x>", subject="Quay")
            for n, body in enumerate(bodies, 1)
        )
    )


def _prepare(data: bytes, count_tokens: TokenCounter) -> PreparedDocument:
    return prepare_document(
        data,
        "application/mbox",
        source_id="quay",
        token_counter=count_tokens,
        limits=IngestLimits(),
    )


def test_a_reply_keeps_its_own_words_and_drops_the_quote_the_thread_holds(
    count_tokens: TokenCounter,
) -> None:
    reply = (
        "Will the fuel dock stay open?\n\nOn Mon, 1 Jan 2024, Ann <ann@x> wrote:\n"
        + QUOTED
        + "\nRegards,\nBob\n"
    )
    prepared = _prepare(_thread(ORIGINAL, reply), count_tokens)
    by_id: dict[str | None, list[Any]] = {}
    for chunk in prepared.chunks:
        by_id.setdefault(chunk.location.document_id, []).append(chunk)
    assert [c.text for c in by_id["<m1@x>"]] == [ORIGINAL.strip()]
    replies = by_id["<m2@x>"]
    assert all("dredging" not in c.text and "wrote:" not in c.text for c in replies)
    # Its own lines keep their numbers in the message: split around the lines left out.
    located = [(c.text, c.location.start_line, c.location.end_line) for c in replies]
    assert located == [("Will the fuel dock stay open?", 1, 1), ("Regards,\nBob", 8, 9)]
    # The text of the document, its checksum's basis, is the whole message still.
    assert prepared.source.metadata["messageCount"] == 2


def test_inline_answers_quotes_from_elsewhere_and_changed_quotes_stay(
    count_tokens: TokenCounter,
) -> None:
    inline = QUOTED + "Yes, and the fuel dock stays open throughout.\n"
    elsewhere = (
        "Forwarding what the harbour master wrote last year:\n\n"
        "> Dredging of the east quay is planned for the spring, dates to follow once the\n"
        "> contractor has confirmed its schedule with the port authority.\n"
    )
    changed = QUOTED.replace("twelve metres", "ten metres")
    prepared = _prepare(_thread(ORIGINAL, inline, elsewhere, changed), count_tokens)
    texts = {
        chunk.location.document_id: chunk.text
        for chunk in prepared.chunks
        if chunk.location.document_id != "<m1@x>"
    }
    assert "dredging" in texts["<m2@x>"] and "fuel dock" in texts["<m2@x>"]
    assert "contractor has confirmed" in texts["<m3@x>"]
    assert "ten metres" in texts["<m4@x>"]


def test_a_quote_of_a_quote_goes_and_short_quotes_go_with_a_long_one() -> None:
    original = ["Ship the spare pumps to the north depot before the audit on Friday, please."]
    done = "Done, they left this morning on the early truck to the depot."
    reply = [done, "", "> " + original[0]]
    second = [
        "Thanks!",
        "",
        ">> Ship the spare pumps to the north depot before the audit on Friday, please.",
        "> " + done,
        "",
        "> Ok?",  # too short to tell on its own: stays
    ]
    assert repeated_quote_lines([original, reply, second]) == [
        frozenset(),
        frozenset({2}),
        frozenset({2, 3}),
    ]


def test_attributions_go_with_their_quote_only() -> None:
    original = ["Ship the spare pumps to the north depot before the audit on Friday, please."]
    wrapped = ["On Mon, 1 Jan 2024 at 10:00, Ann Example", "<ann@example.org> wrote:"]
    reply = ["Sure.", "", *wrapped, "> " + original[0], "", "Bob wrote:", "", "> Ok?"]
    assert repeated_quote_lines([original, reply]) == [frozenset(), frozenset({2, 3, 4})]
    # An attribution in its own paragraph, right before the quote, goes too.
    apart = ["Sure.", "", "Ann wrote:", "", "> " + original[0]]
    assert repeated_quote_lines([original, apart])[1] == frozenset({2, 4})

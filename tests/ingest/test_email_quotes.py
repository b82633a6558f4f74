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
    # Top-posted, as Gmail and Outlook write: the reply, its signature, then the quote.
    reply = (
        "Will the fuel dock stay open?\n\nRegards,\nBob\n\n"
        "On Mon, 1 Jan 2024 at 10:00, Ann <ann@x> wrote:\n" + QUOTED
    )
    prepared = _prepare(_thread(ORIGINAL, reply), count_tokens)
    by_id: dict[str | None, list[Any]] = {}
    for chunk in prepared.chunks:
        by_id.setdefault(chunk.location.document_id, []).append(chunk)
    assert [c.text for c in by_id["<m1@x>"]] == [ORIGINAL.strip()]
    located = [(c.text, c.location.start_line, c.location.end_line) for c in by_id["<m2@x>"]]
    assert located == [("Will the fuel dock stay open?\n\nRegards,\nBob", 1, 4)]
    assert prepared.source.metadata["messageCount"] == 2


def test_quotes_the_reply_answers_or_the_thread_does_not_hold_stay(
    count_tokens: TokenCounter,
) -> None:
    # Probe V (session 36): each of these lost text said nowhere else, or its context.
    bodies = {
        "<m2@x>": QUOTED + "\nYes, and the fuel dock stays open throughout.\n",  # bottom-posted
        "<m3@x>": (  # a message not in the file
            "Forwarding what the harbour master wrote last year:\n\n"
            "> Dredging of the east quay is planned for the spring, dates to follow once the\n"
            "> contractor has confirmed its schedule with the port authority.\n"
        ),
        "<m4@x>": "Noted.\n\n" + QUOTED.replace("twelve metres", "ten metres"),  # changed
        # A short answer quoted within the quote, said only there.
        "<m5@x>": "Noted.\n\n> Bob wrote:\n"
        + QUOTED.replace("> ", ">> ")
        + "> Agreed, ship it Monday.\n",
        # A sentence of the reply's own that ends in "wrote:".
        "<m6@x>": "On the fuel dock: it stays open. For the quay, here is what Ann wrote:\n"
        + QUOTED,
    }
    prepared = _prepare(_thread(ORIGINAL, *bodies.values()), count_tokens)
    texts: dict[str | None, str] = {}
    for chunk in prepared.chunks:
        texts[chunk.location.document_id] = texts.get(chunk.location.document_id, "") + chunk.text
    assert "dredging" in texts["<m2@x>"] and "fuel dock" in texts["<m2@x>"]
    assert "contractor has confirmed" in texts["<m3@x>"]
    assert "ten metres" in texts["<m4@x>"]
    assert "ship it Monday" in texts["<m5@x>"]
    assert "fuel dock" in texts["<m6@x>"]


ORIGINAL_LINE = "Ship the spare pumps to the north depot before the audit on Friday, please."
DONE = "Done, they left this morning on the early truck to the depot."


def test_a_quote_of_a_quote_goes_and_a_lone_message_keeps_everything() -> None:
    reply = [DONE, "", "On Mon, 1 Jan 2024, Ann <ann@x> wrote:", "> " + ORIGINAL_LINE]
    second = [
        "Thanks!",
        "",
        "> " + DONE,
        ">",
        "> On Mon, 1 Jan 2024, Ann <ann@x> wrote:",
        ">> " + ORIGINAL_LINE,
    ]
    assert repeated_quote_lines([[ORIGINAL_LINE], reply, second]) == [
        frozenset(),
        frozenset({2, 3}),
        frozenset({2, 3, 4, 5}),
    ]
    assert repeated_quote_lines([reply]) == [frozenset()]


def test_only_an_attribution_that_looks_like_one_goes_with_its_quote() -> None:
    quote = "> " + ORIGINAL_LINE
    wrapped = ["On Mon, 1 Jan 2024 at 10:00, Ann Example", "<ann@example.org> wrote:"]
    assert repeated_quote_lines([[ORIGINAL_LINE], ["Sure.", "", *wrapped, quote]])[1] == frozenset(
        {2, 3, 4}
    )
    # In a paragraph of its own, right before the quote: it goes too.
    apart = ["Sure.", "", "Carol Diaz wrote:", "", quote]
    assert repeated_quote_lines([[ORIGINAL_LINE], apart])[1] == frozenset({2, 4})
    # A sentence that ends in "wrote:" is the reply's own: it and the quote it opens stay.
    for own in (
        "Our insurer, Marsh Maritime of Rotterdam, needs the dates Ann wrote:",
        "On the dock: it stays open. For the quay, here is what Ann wrote:",
    ):
        assert repeated_quote_lines([[ORIGINAL_LINE], ["Sure.", "", own, quote]])[1] == frozenset()

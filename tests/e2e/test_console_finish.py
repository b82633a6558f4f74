"""The console's Ask page says how a completed run's answer ended (`finishReason`), in a real
browser: streamed, and read back from the run's record when the address names the run (a
reload, Back from a cited passage). Session 42 added the field to every form of a run's result;
the console showed none of it, so an answer cut at the token limit read as a whole one, its
citations checked (session 43).

The host, the fake provider and the browser are those of `test_console.py` (this module starts
its own host). The fake provider ends its answer as `Endings` says:
the host meets a real `finish_reason` over HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e import test_console as base
from tests.e2e.test_console import Console, _ask, _open, _shot, _sign_in, _signed_in
from tests.e2e.test_console_outcomes import _recorded_run
from tests.support.chat_endings import Ending, Endings
from tests.support.run_records import forget_finish_reason

# The fixtures of `test_console.py`, bound here so that pytest finds them in this module.
playwright = base.playwright
console = base.console
browser = base.browser


@dataclass(frozen=True)
class Finish:
    reason: str  # the host's `finishReason`
    note: str  # the line the console shows above the answer
    warning: bool  # shown as a notice, not a quiet line


# By the `finish_reason` the fake provider sends, as OpenAI and compatible servers spell it.
FINISHES = {
    "length": Finish(
        "length",
        "The answer was cut at the token limit (length): it is incomplete, even where its "
        "citations check.",
        warning=True,
    ),
    "content_filter": Finish(
        "content-filter",
        "The answer was cut by the provider's content filter (content-filter): it may be "
        "incomplete.",
        warning=True,
    ),
    # A reason the host does not know (a compatible server's own) is `other`.
    "insufficient_system_resource": Finish(
        "other",
        "The answer ended for another reason the provider gave (other): it may be incomplete.",
        warning=True,
    ),
    "stop": Finish("stop", "Ended: the model finished its answer (stop).", warning=False),
}
NOT_RECORDED = "How the answer ended: not recorded (an earlier release)."


def _result(console: Console, run_id: str) -> dict[str, object]:
    with console.api() as api:
        response = api.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()["result"]
    return result


def _expect_finish(page: Page, note: str, *, warning: bool) -> None:
    """The line above the answer (before it: read first), a notice unless `warning` is off."""
    line = page.locator("#finish-reason")
    expect(line).to_have_text(note)
    expect(line).to_have_class("notice finish" if warning else "finish muted")
    above = page.evaluate(
        """() => Boolean(document.querySelector('#finish-reason').compareDocumentPosition(
            document.querySelector('#answer')) & Node.DOCUMENT_POSITION_FOLLOWING)"""
    )
    assert above, "the note is not above the answer"


def _opened_by_id(browser: Browser, console: Console, run_id: str) -> Page:
    """A new tab at the run's address (as a reload or a shared link opens it), signed in."""
    page, seen = _open(browser, console, address=f"#/ask?run={run_id}&corpus=library")
    _sign_in(page, console.token)
    expect(page.locator("#run-id")).to_have_text(f"run {run_id}")
    expect(page.locator("#run-phase")).to_have_text("completed", timeout=30_000)
    assert seen.errors == []
    return page


@pytest.mark.parametrize("sent", list(FINISHES))
def test_a_completed_run_says_how_its_answer_ended_streamed_and_opened_by_its_id(
    browser: Browser, console: Console, sent: str
) -> None:
    finish = FINISHES[sent]
    page, seen = _signed_in(browser, console)
    with Endings(console.fake) as endings:
        # The fake's usual answer, citing the evidence: a cut answer still passes the checks.
        endings.queue(Ending(finish=sent))
        _ask(page, base.QUESTION, provider="fake", model="gpt-cut")
        expect(page.locator("#run-phase")).to_have_text("completed", timeout=60_000)
        assert endings.served == [Ending(finish=sent)]
    run_id = page.locator("#run-id").inner_text().removeprefix("run ")
    assert _result(console, run_id)["finishReason"] == finish.reason
    _expect_finish(page, finish.note, warning=finish.warning)
    assert page.locator("#answer a.citation").count() >= 1
    expect(page.locator("#citation-check")).to_contain_text("0 invalid, 0 malformed")
    _shot(page, f"60-run-finish-{finish.reason}")

    # The same run read from its record, as the address names it.
    opened = _opened_by_id(browser, console, run_id)
    _expect_finish(opened, finish.note, warning=finish.warning)
    expect(opened.locator("#answer")).to_have_text(page.locator("#answer").inner_text())
    _shot(opened, f"61-run-finish-{finish.reason}-opened-by-id")
    opened.context.close()

    if finish.warning:
        # The next question's outcome replaces the note: a failed run has no answer to qualify.
        _ask(page, base.QUESTION, provider="refusing", model="gpt-cut")
        expect(page.locator("#run-phase")).to_have_text("failed", timeout=60_000)
        expect(page.locator("#finish-reason")).to_have_count(0)
    assert seen.errors == []
    page.context.close()


def test_a_run_recorded_before_hosts_kept_how_it_ended_says_it_is_not_recorded(
    browser: Browser, console: Console
) -> None:
    run_id, _ = _recorded_run(console, base.QUESTION)
    forget_finish_reason(console.ca.parent / "store" / "runs.db", run_id)
    assert _result(console, run_id)["finishReason"] is None
    page = _opened_by_id(browser, console, run_id)
    _expect_finish(page, NOT_RECORDED, warning=False)
    assert page.locator("#answer a.citation").count() >= 1
    _shot(page, "62-run-finish-not-recorded")
    page.context.close()

"""`LeaseKeeper` itself: renews what is live, in one call per turn; a failing store is logged,
never raised, and renewal goes on; closing hands the unfinished runs to `interrupt`."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from retrieval_host.adapters.run_leases import LeaseKeeper


def test_a_failing_renewal_is_logged_and_tried_again_and_close_interrupts_what_is_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[tuple[str, ...]] = []
    retried = threading.Event()
    interrupted: list[tuple[str, ...]] = []

    def renew(run_ids: Sequence[str], lease_s: float) -> None:
        assert lease_s == 0.2
        if tuple(run_ids) != ("run-a", "run-b"):
            return  # a turn taken while the test was still adding (a loaded machine)
        calls.append(tuple(run_ids))
        if len(calls) == 1:
            raise OSError("store unreachable")
        retried.set()

    keeper = LeaseKeeper(renew, lambda ids: interrupted.append(tuple(ids)), lease_s=0.2)
    keeper.add("run-b")
    keeper.add("run-a")
    keeper.add("run-c")
    keeper.discard("run-c")  # ended: no longer renewed
    assert retried.wait(30)  # the failed turn was logged and the next one tried again
    keeper.close()
    keeper.close()  # idempotent
    assert "run leases not renewed for 2 run(s) (OSError)" in caplog.text
    assert interrupted == [("run-a", "run-b")]


def test_a_store_that_cannot_mark_at_close_is_logged_and_closing_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refuse(run_ids: Sequence[str]) -> None:
        raise OSError("read-only")

    keeper = LeaseKeeper(lambda ids, lease_s: None, refuse, lease_s=60.0)
    keeper.add("run-a")
    keeper.close()
    assert "1 running run(s) not marked interrupted at close (OSError)" in caplog.text
    keeper.add("run-b")  # after close: nothing renews it, nothing starts
    keeper.close()
    with pytest.raises(ValueError, match="positive"):
        LeaseKeeper(lambda ids, lease_s: None, refuse, lease_s=0)

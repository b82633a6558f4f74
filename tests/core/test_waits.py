"""`core.waits`: a thread refusing waits gets `WouldWait` instead of waiting; others wait."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from retrieval_host.core.waits import WouldWait, locked, refuse_wait, refusing_waits


def test_only_the_refusing_thread_refuses_and_only_inside_the_block() -> None:
    refuse_wait("nothing")  # outside the block: no effect
    with refusing_waits():
        with pytest.raises(WouldWait, match="a model call"):
            refuse_wait("a model call")
        with ThreadPoolExecutor(1) as pool:  # another thread is not refusing
            pool.submit(refuse_wait, "elsewhere").result(timeout=30)
        with refusing_waits():
            pass
        with pytest.raises(WouldWait):  # a nested block leaves the outer one refusing
            refuse_wait("still")
    refuse_wait("after")


def test_a_lock_held_elsewhere_is_refused_on_a_refusing_thread_and_waited_for_otherwise() -> None:
    lock = threading.Lock()
    with refusing_waits(), locked(lock, "free"):  # a free lock is simply taken
        assert lock.locked()
    assert not lock.locked()
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            taken.set()
            release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(holder)
        assert taken.wait(30)
        with (
            refusing_waits(),
            pytest.raises(WouldWait, match="the index"),
            locked(lock, "the index"),
        ):
            raise AssertionError("the lock was taken while held elsewhere")
        got, started = threading.Event(), threading.Event()

        def waiter() -> None:
            started.set()
            with locked(lock, "the index"):  # not refusing: waits for the holder
                got.set()

        waited = pool.submit(waiter)
        assert started.wait(30)
        assert not got.is_set()  # it cannot have the lock while the holder keeps it
        release.set()
        held.result(timeout=30)
        waited.result(timeout=30)
    assert got.is_set()
    assert not lock.locked()


def test_code_that_handles_every_exception_does_not_swallow_a_refusal() -> None:
    # An application's authorizer that fails closed (`except Exception: deny`) must not turn
    # "this would wait" into a denial.
    def fail_closed() -> str:
        try:
            refuse_wait("a reload")
        except Exception:
            return "denied"
        return "granted"

    assert fail_closed() == "granted"
    with refusing_waits(), pytest.raises(WouldWait):
        fail_closed()

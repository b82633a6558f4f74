"""The per-thread read connections, closed with the store while another thread reads on one."""

from __future__ import annotations

import threading
from pathlib import Path

import apsw
import pytest

from retrieval_host.adapters.sqlite.catalog import Readers

WAIT_S = 60.0  # a bound for a stuck test, never a pause: each wait is on an event


def test_a_connection_in_use_is_closed_by_its_own_thread_after_the_store_closes(
    tmp_path: Path,
) -> None:
    # A black-box test closed a store while four threads searched: apsw refused to close a
    # connection another thread was running a statement on (ThreadingViolationError), the
    # close stopped there, and the store was left half closed (reads refused with an
    # AssertionError, writes still committed).
    path = tmp_path / "store.db"
    apsw.Connection(str(path)).execute("CREATE TABLE t (x)")
    readers = Readers(path)
    reading, may_finish = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold(*_: object) -> int:
        reading.set()
        assert may_finish.wait(WAIT_S)
        return 1

    def read() -> None:
        conn = readers.get()
        assert conn is not None
        conn.create_scalar_function("hold", hold, 1)
        outcome["value"] = conn.execute("SELECT hold(1)").fetchall()
        outcome["after"] = readers.get()  # the store closed meanwhile
        with pytest.raises(apsw.ConnectionClosedError):
            conn.execute("SELECT 1")
        outcome["closed"] = True

    thread = threading.Thread(target=read)
    thread.start()
    assert reading.wait(WAIT_S)
    idle = readers.get()  # this thread's own connection, not in use: closed at once
    assert idle is not None and readers.opened == 2
    readers.close()  # the other thread is inside a statement: no ThreadingViolationError
    with pytest.raises(apsw.ConnectionClosedError):
        idle.execute("SELECT 1")
    assert readers.get() is None
    may_finish.set()
    thread.join(WAIT_S)
    assert outcome == {"value": [(1,)], "after": None, "closed": True}

"""The parse worker pool: limits end a worker with a typed answer, a cancel kills it, and a
replacement serves the next document."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.ingest import ChunkingSettings, IngestLimits, PreparedDocument
from retrieval_host.ingest.chunking import Extracted
from retrieval_host.ingest.isolation import CounterRecipe, ParsePool, ParseTask
from retrieval_host.ingest.settings import MiB
from tests.support import ingest_documents as docs

GUIDE = b"# Guide\n\nBoats moor on the east quay.\n"


def task(
    data: bytes,
    media_type: str = "text/markdown",
    *,
    cpu_seconds: int = 60,
    counter: CounterRecipe | None = None,
) -> ParseTask:
    return ParseTask(
        data,
        media_type,
        "s",
        None,
        None,
        None,
        ChunkingSettings(),
        IngestLimits(),
        counter,
        cpu_seconds,
    )


@pytest.fixture
def pool() -> Iterator[ParsePool]:
    p = ParsePool(1)
    yield p
    p.close()


def slow_pdf() -> bytes:
    return docs.operator_heavy_pdf(20, 45_000)  # under every static bound, ~25 s to extract


def test_a_worker_extracts_and_is_reused(pool: ParsePool) -> None:
    for _ in range(2):
        assert isinstance(pool.parse(task(GUIDE), CancelToken()), Extracted)
    assert (pool.counters.started, pool.counters.tasks) == (1, 2)


def test_with_a_counter_recipe_the_worker_cuts_passages_too(
    pool: ParsePool, local_embedding: LocalEmbedding
) -> None:
    recipe = local_embedding.portable_token_counter()
    prepared = pool.parse(task(GUIDE, counter=recipe), CancelToken())
    assert isinstance(prepared, PreparedDocument)
    assert [c.text for c in prepared.chunks] == ["# Guide\n\nBoats moor on the east quay."]


def test_html_and_text_parse_in_the_worker_and_the_element_bound_holds_there(
    pool: ParsePool, local_embedding: LocalEmbedding
) -> None:
    recipe = local_embedding.portable_token_counter()
    page = pool.parse(task(b"<h1>Quay</h1>\n<p>Boats moor.</p>\n", "text/html", counter=recipe),
                      CancelToken())  # fmt: skip
    assert isinstance(page, PreparedDocument)
    assert [(c.text, c.location.start_line) for c in page.chunks] == [("Quay\nBoats moor.", 1)]
    text = pool.parse(task(b"Boats moor.\n", "text/plain"), CancelToken())
    assert isinstance(text, Extracted) and text.text == "Boats moor.\n"
    with pytest.raises(RetrievalError) as caught:
        pool.parse(task(b"<b>" * 200_001, "text/html"), CancelToken())
    assert (caught.value.code, caught.value.reason) == (
        ErrorCode.DOCUMENT_TOO_COMPLEX,
        "html-elements",
    )
    assert pool.counters.started == 1  # a typed refusal, not a killed worker


def test_the_cpu_limit_ends_a_parse_with_a_typed_refusal(pool: ParsePool) -> None:
    with pytest.raises(RetrievalError) as caught:
        pool.parse(task(slow_pdf(), "application/pdf", cpu_seconds=1), CancelToken())
    assert (caught.value.code, caught.value.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, "cpu-limit")
    assert isinstance(pool.parse(task(GUIDE), CancelToken()), Extracted)  # a fresh worker
    assert pool.counters.started == 2


def test_the_memory_limit_ends_a_parse_with_a_typed_refusal() -> None:
    small = ParsePool(1, memory_headroom_bytes=48 * MiB)
    try:
        big = b"# Big\n\n" + b"word " * (24 * MiB // 5)
        with pytest.raises(RetrievalError) as caught:
            small.parse(task(big), CancelToken())
        assert caught.value.code is ErrorCode.DOCUMENT_TOO_COMPLEX
        assert caught.value.reason == "memory-limit"
        assert isinstance(small.parse(task(GUIDE), CancelToken()), Extracted)
    finally:
        small.close()


def _slow_parse_running(
    pool: ParsePool, cancel: CancelToken
) -> tuple[threading.Thread, list[BaseException]]:
    """A slow parse started on a thread, returned once its worker is busy with it, and the
    list that receives what it raises."""
    outcome: list[BaseException] = []

    def parse() -> None:
        try:
            pool.parse(task(slow_pdf(), "application/pdf"), cancel)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=parse)
    caller.start()
    while pool.counters.busy == 0 and caller.is_alive():
        caller.join(0.01)
    return caller, outcome


def test_a_cancel_kills_the_worker_and_a_replacement_serves_the_next(pool: ParsePool) -> None:
    cancel = CancelToken()
    caller, outcome = _slow_parse_running(pool, cancel)
    cancel.cancel()
    caller.join(10)
    assert not caller.is_alive()
    assert isinstance(outcome[0], RetrievalError) and outcome[0].code is ErrorCode.CANCELLED
    assert pool.counters.killed == 1
    assert isinstance(pool.parse(task(GUIDE), CancelToken()), Extracted)


@pytest.mark.parametrize("cancelled", [True, False], ids=["cancelled", "alone"])
def test_a_worker_stopped_by_sigterm_is_a_cancel_when_its_caller_cancels(
    pool: ParsePool, cancelled: bool
) -> None:
    # SIGTERM to the whole process group (a service manager, `timeout`) reaches the workers
    # and the command alike: the document in flight was cancelled, not "could not be parsed".
    cancel = CancelToken()
    others = {p.pid for p in multiprocessing.active_children()}  # other tests' pools' workers
    caller, outcome = _slow_parse_running(pool, cancel)
    (worker,) = [p for p in multiprocessing.active_children() if p.pid not in others]
    os.kill(worker.pid or 0, signal.SIGTERM)
    if cancelled:
        cancel.cancel()  # as the command's own SIGTERM handler does, a moment later or sooner
    caller.join(10)
    assert not caller.is_alive()
    error = outcome[0]
    assert isinstance(error, RetrievalError)
    if cancelled:
        assert error.code is ErrorCode.CANCELLED
    else:
        assert (error.code, error.reason) == (ErrorCode.DOCUMENT_TOO_COMPLEX, "parser-exited")


def test_a_worker_whose_memory_grew_retires_and_is_replaced() -> None:
    # Any resident size counts as grown past a threshold far below zero: what is under test is
    # that the comparison retires the worker, not how the allocator returned pages (the same
    # parse twice may leave the resident size exactly where it was).
    recycling = ParsePool(1, recycle_rss_bytes=-(1 << 40))
    try:
        for _ in range(4):
            recycling.parse(task(GUIDE), CancelToken())
        # A worker's first task sets its baseline; its second finds it "grown" and retires it;
        # the next task starts a replacement.
        assert (recycling.counters.started, recycling.counters.retired) == (2, 2)
    finally:
        recycling.close()


def test_a_worker_retires_after_its_task_budget() -> None:
    budgeted = ParsePool(1, max_tasks=2)
    try:
        for _ in range(5):
            budgeted.parse(task(GUIDE), CancelToken())
        assert budgeted.counters.retired == 2
        assert budgeted.counters.started == 3
    finally:
        budgeted.close()


def test_a_ctrl_c_that_kills_the_fork_server_as_it_starts_costs_one_restart() -> None:
    # A black-box test: a Ctrl-C on the terminal 1.5-2 s into `retrieval-host ingest` killed
    # the fork server while it imported the parsers (it ignores SIGINT only after), and the
    # command ended in an EOFError traceback, exit 1, instead of its cancel.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.forkserver_interrupt"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "parsed"

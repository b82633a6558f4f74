"""The one incremental SSE decoder: any chunking gives the same events (no event loop here)."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_host_client._sse import ServerSentEvent, SSEDecoder, SSEError

STREAM = (
    b"\xef\xbb\xbf: heartbeat\r\n"
    b"\r\n"
    b"event: run.started\r\n"
    b'data: {"runId": "run_1"}\r\n'
    b"\r\n"
    b": ping\n"
    b"event: run.delta\n"
    b"data: first line\n"
    b"data:second line, no space\n"
    b"data:  two spaces keep one\n"
    b"id: 7\n"
    b"\n"
    b"data: caf\xc3\xa9 \xe2\x9c\x93\r"
    b"\r"
    b"event: run.completed\r"
    b"retry: 1500\r"
    b"unknown: ignored\r"
    b"data\r"
    b"\r\n"
)
EXPECTED = [
    ServerSentEvent("run.started", '{"runId": "run_1"}'),
    ServerSentEvent("run.delta", "first line\nsecond line, no space\n two spaces keep one", "7"),
    ServerSentEvent("message", "café ✓", "7"),
    ServerSentEvent("run.completed", "", "7", 1500),
]


def _feed_all(decoder: SSEDecoder, chunks: list[bytes]) -> list[ServerSentEvent]:
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    return events


def test_whole_stream_in_one_chunk() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(STREAM) == EXPECTED
    assert decoder.end() is False


def test_one_byte_at_a_time_splits_crlf_and_multibyte_characters() -> None:
    decoder = SSEDecoder()
    assert _feed_all(decoder, [STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED
    assert decoder.end() is False


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunk_boundaries_give_the_same_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    decoder = SSEDecoder()
    assert _feed_all(decoder, chunks) == EXPECTED
    assert decoder.end() is False


def test_a_crlf_split_between_chunks_is_one_line_ending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    # The LF completes the CRLF of the data line; only the next CRLF ends the event.
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\r\n") == [ServerSentEvent("message", "a")]


def test_comments_alone_dispatch_nothing() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": ping\n\n: ping\n\n:\n\n") == []
    assert decoder.end() is False


def test_an_event_cut_at_eof_is_discarded_and_reported() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: run.delta\ndata: {}\n\nevent: run.completed\ndata: {") == [
        ServerSentEvent("run.delta", "{}")
    ]
    assert decoder.end() is True


def test_a_last_event_without_its_blank_line_is_discarded() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: done\n") == []
    assert decoder.end() is True


def test_a_trailing_comment_without_newline_is_not_a_cut_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\n\n: ping") == [ServerSentEvent("message", "x")]
    assert decoder.end() is False


def test_lines_can_be_fed_one_by_one() -> None:
    decoder = SSEDecoder()
    lines = ["event: run.delta", "data: a", "data: b", ": ignored", ""]
    events = [e for e in (decoder.decode_line(line) for line in lines) if e is not None]
    assert events == [ServerSentEvent("run.delta", "a\nb")]


def test_an_event_type_does_not_leak_into_the_next_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: run.delta\n\ndata: x\n\n") == [ServerSentEvent("message", "x")]


def test_an_endless_line_is_refused() -> None:
    decoder = SSEDecoder(max_event_bytes=1024)
    with pytest.raises(SSEError):
        decoder.feed(b"data: " + b"x" * 2048)
    decoder = SSEDecoder(max_event_bytes=1024)
    for _ in range(10):
        decoder.feed(b"data: " + b"x" * 100 + b"\n")
    with pytest.raises(SSEError):
        decoder.feed(b"data: " + b"x" * 100 + b"\n")


def _cpu_seconds(chunks: list[bytes]) -> float:
    """The CPU time this thread spends decoding `chunks`, the least of three runs: CPU time,
    not wall time, so other processes on the machine do not count."""
    timings = []
    for _ in range(3):
        started = time.thread_time()
        _feed_all(SSEDecoder(), chunks)
        timings.append(time.thread_time() - started)
    return min(timings)


# Probe C (session 40): the decoder searched the rest of the chunk again for every line end,
# and copied the unfinished line on every chunk: a chunk cost the square of its size, a line
# the square of its length (64 KiB of bare LFs 325 ms, a 32 MiB line 16 s), and meanwhile an
# asyncio client's other tasks waited (each chunk read yields to the loop; decoding did not).
# CPU seconds measured here: four 256 KiB chunks of LFs 3.4 s before, 0.14 s in one pass; of
# comments 1.7 s, 0.07 s; a 16 MiB line in 4 KiB pieces 3.7 s, 0.12 s.


def test_a_flood_of_blank_lines_or_comments_is_decoded_in_one_pass() -> None:
    assert _cpu_seconds([b"\n" * 262144] * 4) < 1.0
    assert _cpu_seconds([b":\n" * 131072] * 4) < 0.5


def test_a_long_unfinished_line_is_kept_without_copying_it_per_chunk() -> None:
    line = b"data: " + b"x" * (16 * 1024 * 1024 - 6)
    pieces = [line[i : i + 4096] for i in range(0, len(line), 4096)]
    assert _cpu_seconds(pieces) < 1.0
    decoder = SSEDecoder()
    events = _feed_all(decoder, [*pieces, b"\n\n"])
    assert events == [ServerSentEvent("message", "x" * (16 * 1024 * 1024 - 6))]


def test_a_cr_ending_a_chunk_and_an_lf_opening_the_next_are_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"") == []  # an empty read keeps the pending CR
    assert decoder.feed(b"\n\r") == [ServerSentEvent("message", "a")]
    assert decoder.feed(b"\ndata: b\n\n") == [ServerSentEvent("message", "b")]


def test_a_retry_too_long_for_an_integer_is_ignored_not_raised() -> None:
    # `int()` refuses over 4,300 digits with a ValueError, which escaped `stream_run` untyped
    # (review V, session 40); a value that long is no delay anyone meant.
    decoder = SSEDecoder()
    events = decoder.feed(b"retry: " + b"9" * 5000 + b"\ndata: x\n\nretry: 250\ndata: y\n\n")
    assert [(e.data, e.retry) for e in events] == [("x", None), ("y", 250)]

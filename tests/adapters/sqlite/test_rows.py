"""`Rows` read in bulk gives exactly what reading row by row gives."""

from __future__ import annotations

import tracemalloc

import numpy as np

from retrieval_host.adapters.sqlite.rows import Blob, Revision, Rows
from retrieval_host.core.models import Location


def _rows() -> Rows:
    rows = Rows()
    for n in range(3):
        source = Revision(f"s{n}", f"r{n}", "0" * 64, {"n": n}, n + 1)
        rows.append(
            source,
            [
                (
                    f"s{n}#{i}-é",
                    f"passage {n}.{i} ✓".encode(),
                    Location(
                        page=None if i % 2 else i,
                        start_line=i,
                        end_line=None if i == 2 else i + 1,
                        document_id=f"doc-{n}" if (n + i) % 2 else None,
                    ),
                )
                for i in range(4)
            ],
        )
    return rows


def test_many_rows_are_the_rows_one_by_one_in_the_order_asked() -> None:
    rows = _rows()
    for asked in ([], [0], [11, 0, 5, 5, 2], list(range(len(rows)))[::-1]):
        assert rows.many(asked) == [rows[i] for i in asked]
    # Documents only where a row has one: the bulk read pairs them with the right rows.
    assert {r.location.document_id for r in rows.many(list(range(12)))} == {
        None,
        "doc-0",
        "doc-1",
        "doc-2",
    }


def test_many_strings_of_a_blob_are_its_strings_one_by_one() -> None:
    blob = Blob()
    items = [b"", b"a", "é✓".encode(), b"", b"xyz" * 50]
    blob.extend(items)
    blob.extend([b"tail"])  # a second append (the arrays grew)
    everything = [*items, b"tail"]
    order = [5, 0, 4, 1, 1, 3, 2]
    assert blob.get_many(order) == [everything[i] for i in order]
    assert blob.get_many(order) == [blob.get(i) for i in order]
    mapped = Blob(*blob.arrays())  # over arrays as a snapshot maps them
    assert mapped.get_many(np.arange(6).tolist()) == everything


def test_gathered_strings_are_the_strings_at_the_index_in_order() -> None:
    """Runs of consecutive rows (what a compaction asks), repeats, reversals, empties."""
    rng = np.random.default_rng(5)
    items = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 40, 300)]
    items[7] = items[8] = b""
    blob = Blob()
    blob.extend(items[:100])
    blob.extend(items[100:])
    kept = np.concatenate((np.arange(0, 50), np.arange(60, 61), np.arange(70, 300)))
    orders = [
        kept,
        np.arange(300)[::-1],
        np.array([5, 5, 6, 7, 8, 9, 0, 299]),
        np.array([7, 8]),
        np.array([], dtype=np.int64),
        rng.permutation(300),
    ]
    for order in orders:
        gathered = blob.gather(order.astype(np.int64))
        assert gathered.size == len(order)
        assert gathered.get_many(list(range(len(order)))) == [items[i] for i in order]
    # Gathering the gathered (a second compaction) keeps the strings too.
    again = blob.gather(kept).gather(np.arange(0, len(kept), 2, dtype=np.int64))
    assert again.get_many(list(range(again.size))) == [items[i] for i in kept[::2]]


def test_a_compaction_gather_holds_about_the_text_once_more_not_an_index_per_byte() -> None:
    """The byte-by-byte gather held ~40 bytes of index arrays per byte of text: 3.4 GB beyond
    the store to compact 300k passages, and the 1M-passage bench fill was killed for memory."""
    text = [b"x" * 700 for _ in range(6000)]  # 4.2 MB in 6,000 rows of 60 sources
    blob = Blob()
    blob.extend(text)
    kept = np.concatenate([np.arange(s * 100, s * 100 + 90) for s in range(60)])
    tracemalloc.start()
    try:
        gathered = blob.gather(kept)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert gathered.size == len(kept)
    assert peak < 2 * 700 * len(kept), peak  # the new blob itself is 700 bytes a row

"""`Rows` read in bulk gives exactly what reading row by row gives."""

from __future__ import annotations

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

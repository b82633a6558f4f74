"""A damaged index snapshot is never served: every array's bytes are checked against the CRC-32s
its header holds at open; a file that fails is not used (the index loads from SQLite), removed,
and written anew. Format 1 files (before checksums) are mapped and rewritten with them."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval_host.adapters.sqlite import snapshot, snapshot_checks
from retrieval_host.adapters.sqlite.snapshot import snapshot_path
from tests.adapters.sqlite.test_snapshot import (
    answers,
    assert_same,
    fill,
    fresh_answers,
    open_mapped,
    open_warned,
)

PREFIX = len(snapshot.MAGIC) + 8 + 4


@pytest.fixture
def path(tmp_path: Path) -> Path:
    tmp_path.chmod(0o700)
    return tmp_path / "store.db"


def layout(data: bytes) -> tuple[int, int, dict[str, Any]]:
    """A format 2 file's header length, data start and header."""
    assert data.startswith(snapshot.MAGIC)
    length = int.from_bytes(data[len(snapshot.MAGIC) : len(snapshot.MAGIC) + 8], "little")
    header = json.loads(data[PREFIX : PREFIX + length])
    return length, -(-(PREFIX + length) // snapshot.ALIGN) * snapshot.ALIGN, header


def regions(data: bytes) -> dict[str, tuple[int, int]]:
    """Where each non-empty array's written bytes lie (and the header's), by name."""
    length, start, header = layout(data)
    found = {"header": (PREFIX, PREFIX + length)}
    for name, (at, dtype, shape, _extra, _checks) in header["namespaces"]["ns"]["arrays"].items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes:
            found[name] = (start + at, start + at + nbytes)
    return found


def place(snap: Path, data: bytes) -> None:
    """The snapshot file holds `data` (private, as the store writes it)."""
    snap.unlink(missing_ok=True)
    fd = os.open(snap, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def flipped(data: bytes, at: int) -> bytes:
    damaged = bytearray(data)
    damaged[at] ^= 0x5A
    return bytes(damaged)


def written(path: Path, sources: int = 12) -> tuple[Path, bytes]:
    """A store filled and closed (`fill`): its snapshot file and the bytes the close wrote."""
    fill(path, sources=sources)
    snap = snapshot_path(path, "c1")
    return snap, snap.read_bytes()


def test_a_damaged_byte_in_any_array_is_found_and_the_file_rebuilt(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A black-box test patched each page of a snapshot: hits came back with another
    # passage's text, garbage chunk ids and raw IndexErrors, for only the header was checked.
    snap, good = written(path)
    expected = fresh_answers(path)
    spans = regions(good)
    assert {"header", "matrix", "text", "ids", "source_of", "slots", "keys"} <= set(spans)
    for name, (low, high) in spans.items():
        for at in (low, (low + high) // 2, high - 1):
            place(snap, flipped(good, at))
            with open_warned(path, caplog) as store:
                assert "not used: it is damaged" in caplog.text, (name, at)
                assert not snap.exists(), "the damaged file was left in place"
                assert_same(answers(store), expected)
            # The close wrote a good one, which the next open maps.
            assert snap.read_bytes() != flipped(good, at)
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)


def test_a_damaged_file_is_not_used_by_a_read_only_store_nor_removed(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snap, good = written(path)
    low, high = regions(good)["text"]
    damaged = flipped(good, (low + high) // 2)
    place(snap, damaged)
    with open_warned(path, caplog, read_only=True) as store:
        assert "damaged" in caplog.text and "mapped the index snapshot" not in caplog.text
        assert_same(answers(store), fresh_answers(path))
    assert snap.read_bytes() == damaged


def test_arrays_of_many_pieces_are_checked_piece_by_piece(
    path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pieces that straddle pages and end mid-array, verified by the threads.
    monkeypatch.setattr(snapshot_checks, "CHECK_BYTES", 1000 + 3)
    monkeypatch.setattr(snapshot_checks, "READ_BYTES", 100)
    snap, good = written(path, sources=40)
    _, _, header = layout(good)
    assert len(header["namespaces"]["ns"]["arrays"]["matrix"][4]) > 2
    expected = fresh_answers(path)
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)
    _, high = regions(good)["matrix"]
    place(snap, flipped(good, high - 5))  # in the last piece
    with open_warned(path, caplog) as store:
        assert "its matrix array's bytes changed" in caplog.text
        assert_same(answers(store), expected)


def as_format_1(data: bytes) -> bytes:
    """The same snapshot as the release before checksums wrote it: the magic of format 1, no
    header checksum, arrays without checks, the data at its own aligned start."""
    _, start, header = layout(data)
    header["format"] = 1
    for entry in header["namespaces"].values():
        entry["arrays"] = {name: spec[:4] for name, spec in entry["arrays"].items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    prefix = b"RHSNAP\x00\x01" + len(text).to_bytes(8, "little") + text
    old_start = -(-len(prefix) // snapshot.ALIGN) * snapshot.ALIGN
    return prefix + bytes(old_start - len(prefix)) + data[start:]


def with_header(data: bytes, change: Any) -> bytes:
    """The snapshot with its header changed by `change` (and its checksum made to match)."""
    _, start, header = layout(data)
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= start - PREFIX
    crc = zlib.crc32(text).to_bytes(4, "little")
    prefix = snapshot.MAGIC + len(text).to_bytes(8, "little") + crc + text
    return prefix + bytes(start - len(prefix)) + data[start:]


def _short_spec(header: dict[str, Any]) -> None:
    arrays = header["namespaces"]["ns"]["arrays"]
    arrays["text"] = arrays["text"][:4]  # no checks: a writer's bug or a crafted file


@pytest.mark.parametrize(
    "spoil",
    [as_format_1, lambda data: with_header(data, _short_spec)],
    ids=["format-1", "short-array-spec"],
)
def test_a_file_whose_rows_cannot_be_checked_is_not_used_and_written_anew(
    path: Path, caplog: pytest.LogCaptureFixture, spoil: Any
) -> None:
    # A black-box test: a damaged format 1 file (before checksums) was mapped unverified, and
    # its background rewrite certified the damage with fresh CRCs. Format 1 is not mapped
    # now: the first start loads the index from SQLite once and writes format 2.
    snap, good = written(path)
    place(snap, spoil(good))
    expected = fresh_answers(path)
    with open_warned(path, caplog) as store:
        assert "not used" in caplog.text and "mapped the index snapshot" not in caplog.text
        assert_same(answers(store), expected)
    assert snap.read_bytes().startswith(snapshot.MAGIC)  # the close wrote format 2
    with open_mapped(path, caplog) as store:
        assert_same(answers(store), expected)


def test_on_a_tmpfs_a_snapshot_has_no_holes_and_one_with_holes_is_not_mapped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A black-box test filled a tmpfs holding the store: mapping the snapshot's sparse room
    # then took pages the tmpfs no longer had, and the host died of SIGBUS, saying nothing.
    shm = Path("/dev/shm")
    assert snapshot.on_tmpfs(shm), "this machine's /dev/shm is a tmpfs"
    directory = Path(tempfile.mkdtemp(dir=shm))
    try:
        directory.chmod(0o700)
        path = directory / "store.db"
        snap, data = written(path)
        assert snap.stat().st_blocks * 512 >= len(data)  # every byte allocated, no hole
        store = open_mapped(path, caplog)
        store.close()
        place(snap, b"")
        with snap.open("r+b") as sparse:  # the same bytes, each page of zeros a hole again
            for at in range(0, len(data), 4096):
                if any(data[at : at + 4096]):
                    sparse.seek(at)
                    sparse.write(data[at : at + 4096])
            sparse.truncate(len(data))
        assert snap.read_bytes() == data and snap.stat().st_blocks * 512 < len(data)
        store = open_warned(path, caplog)
        store.close()
        assert "holes on a tmpfs" in caplog.text
    finally:
        shutil.rmtree(directory)

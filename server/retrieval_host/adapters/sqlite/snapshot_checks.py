"""The checksums of an index snapshot's arrays: a CRC-32 of each `CHECK_BYTES` piece, taken as
the pieces are written and compared at open from the file's bytes read with `pread` (not through
the mapping, so the pages do not join the process's resident set; two threads, zlib's CRC lets
go of the interpreter). The file format is in `snapshot`."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NamedTuple

import numpy.typing as npt

# An array's bytes are checked in pieces of this size (a CRC-32 each, and the unit of work of
# the threads that verify an open).
CHECK_BYTES: Final = 16 << 20
CHECK_THREADS: Final = 2
# Read at a time while verifying (per thread).
READ_BYTES: Final = 4 << 20


class Piece(NamedTuple):
    """A piece of the file to check: where, how long, its CRC-32 (hex) and its array's name."""

    offset: int
    length: int
    expected: str
    name: str


def placeholders(nbytes: int) -> list[str]:
    """What the header holds for an array's checks until it is written: one per piece, of a
    CRC's width (the header's length is fixed before the data)."""
    return ["00000000"] * -(-nbytes // CHECK_BYTES)


def pieces_of(name: str, offset: int, nbytes: int, checks: list[str]) -> list[Piece] | None:
    """An array's pieces, or None when it has not one check per piece."""
    if len(checks) != -(-nbytes // CHECK_BYTES):
        return None
    return [
        Piece(offset + low, min(nbytes - low, CHECK_BYTES), check, name)
        for low, check in zip(range(0, nbytes, CHECK_BYTES), checks, strict=True)
    ]


def written(out: Any, pieces: Iterable[npt.NDArray[Any]]) -> list[str]:
    """Write an array's pieces to `out`; the CRC-32 of each `CHECK_BYTES` of what was written."""
    checks: list[str] = []
    crc, filled = 0, 0
    for piece in pieces:
        if not piece.size:  # an empty view has no bytes to write (nor cast)
            continue
        data = piece.data.cast("B")
        out.write(data)
        while len(data):
            take = min(len(data), CHECK_BYTES - filled)
            crc = zlib.crc32(data[:take], crc)
            filled += take
            data = data[take:]
            if filled == CHECK_BYTES:
                checks.append(f"{crc:08x}")
                crc, filled = 0, 0
    if filled:
        checks.append(f"{crc:08x}")
    return checks


def _problem(fd: int, piece: Piece) -> str | None:
    buffer = memoryview(bytearray(min(piece.length, READ_BYTES)))
    crc, done = 0, 0
    while done < piece.length:
        got = os.preadv(fd, [buffer[: min(len(buffer), piece.length - done)]], piece.offset + done)
        if got <= 0:
            return f"its {piece.name} array is cut short"
        crc = zlib.crc32(buffer[:got], crc)
        done += got
    return None if f"{crc:08x}" == piece.expected else f"its {piece.name} array's bytes changed"


def problem(fd: int, pieces: list[Piece]) -> str | None:
    """What is wrong with the file open at `fd`, or None when every piece matches its CRC."""
    if len(pieces) > 1:
        with ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="snapshot-check") as pool:
            found = list(pool.map(lambda piece: _problem(fd, piece), pieces))
    else:
        found = [_problem(fd, piece) for piece in pieces]
    return next((p for p in found if p is not None), None)

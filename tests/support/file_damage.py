"""Ways a SQLite database file is damaged under a running host: the file-identity tests of the
vector store and of the run records apply each."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def truncate(db: Path) -> None:
    os.truncate(db, 0)


def replace_with_a_copy(db: Path) -> None:
    copy = db.with_name("copy.db")
    shutil.copyfile(db, copy)
    os.replace(copy, db)


def remove(db: Path) -> None:
    db.unlink()


DAMAGES = [truncate, replace_with_a_copy, remove]

"""Argument types the command line shares: a refused value is argparse's one-line usage error
(exit 2), never a traceback or a pydantic dump further in."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(low: int, high: int | None, what: str) -> Callable[[str], int]:
    """An argparse `type`: a whole number in `low..high` (`high` None: no upper bound), or a
    usage error that says `what` it must be."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse

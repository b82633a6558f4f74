"""Child process for the Ctrl-C tests: the real `retrieval-host ingest` entry point, whose
embedding holds the passages of files that contain `HOLD` until the test has interrupted it.

    python -m tests.support.ingest_cli_child FD MODE ARG...

ARG... are `retrieval-host` arguments. A held embedding call writes `held` to the file
descriptor FD as it starts to wait, so the test knows which files are in flight without
polling. MODE `cancellable`: it waits checking its cancel token, as the real adapter does
between slices, and raises the cancel's `CANCELLED`. MODE `stuck`: it never returns, as a
call that ignores its token would not; only a second Ctrl-C ends the run.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.ports import EmbeddingBatch
from retrieval_host.serving.cli import main

HOLD = "hold-this-file"
CANCEL_CHECK_S = 0.01  # the held call's cancel check interval (the adapter's watcher: 50 ms)


def hold_marked_files(report_fd: int, mode: str) -> None:
    embed = LocalEmbedding.embed
    never = threading.Event()

    def held_embed(
        self: LocalEmbedding, texts: Sequence[str], cancel: CancelToken
    ) -> EmbeddingBatch:
        if not any(HOLD in text for text in texts):
            return embed(self, texts, cancel)
        os.write(report_fd, b"held\n")
        if mode == "stuck":
            never.wait()
        while True:
            cancel.wait(CANCEL_CHECK_S)  # raises CANCELLED once the batch is cancelled

    LocalEmbedding.embed = held_embed  # type: ignore[method-assign]


if __name__ == "__main__":
    fd, mode, *argv = sys.argv[1:]
    hold_marked_files(int(fd), mode)
    sys.exit(main(argv))

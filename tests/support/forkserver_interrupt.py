"""Run as a script: start a parse pool while a SIGINT reaches its fork server as it starts
(as a Ctrl-C on the terminal reaches the whole process group), then parse. Prints `parsed`."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
import threading
import time
from typing import Any

from retrieval_host.core.cancel import CancelToken
from retrieval_host.ingest import ChunkingSettings, IngestLimits
from retrieval_host.ingest.isolation import ParsePool, ParseTask


def _interrupt_the_fork_server() -> None:
    server: Any = multiprocessing.forkserver._forkserver
    while server._forkserver_pid is None:  # set as soon as it is spawned
        time.sleep(0.0005)
    os.kill(server._forkserver_pid, signal.SIGINT)


def main() -> None:
    threading.Thread(target=_interrupt_the_fork_server, daemon=True).start()
    pool = ParsePool(1)
    task = ParseTask(
        b"# T\n\nHello.\n", "text/markdown", "s", None, None, None,
        ChunkingSettings(), IngestLimits(), None, 30,
    )  # fmt: skip
    pool.parse(task, CancelToken())
    pool.close()
    print("parsed")


if __name__ == "__main__":
    main()

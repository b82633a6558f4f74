"""Child process for hostile-input tests: ingest one file under a memory and time limit.

    python -m tests.support.ingest_child INPUT MEDIA_TYPE DB

Loads the real model and store and starts the parse workers (by ingesting a small document
under another id) first, then caps the address space at what it uses now plus 512 MiB and arms
a real-time alarm (SIGALRM's default action kills the process) as a guard against a hang, and
only then ingests. Prints one JSON line: the outcome (status, or error code and reason), the
seconds spent ingesting, and whether the source exists in the store afterwards.

The alarm is a hang guard, not a speed target: on a loaded machine (the suite must pass while
busy loops hold every core) a bounded parse can still take seconds of wall time. That the work
was bounded shows in the answer's reason: each hostile case must be refused by the limit that
is checked before the costly step (pages counted before any text is extracted, and so on).
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time
from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.core.errors import RetrievalError
from retrieval_host.driver import IngestRequest
from tests.support.ingest_driver import CORPUS, NAMESPACE, context, make_host

SOURCE_ID = "hostile-input"
MEMORY_HEADROOM = 512 * 1024 * 1024
TIME_LIMIT_S = 45.0
WARM_UP = b"# Warm-up\n\nStarts the parse workers before the limits are armed.\n"


def _address_space_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main(argv: list[str]) -> int:
    input_path, media_type, db = argv
    host = make_host(Path(db), LocalEmbedding(threads=1))
    data = Path(input_path).read_bytes()
    host.embedding.count_tokens(["start the tokenizer's threads before the limit"])
    host.driver.ingest_context(
        IngestRequest(CORPUS, "warm-up", "text/markdown", WARM_UP), context()
    )

    limit = _address_space_bytes() + MEMORY_HEADROOM
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    started = time.monotonic()
    outcome: dict[str, object]
    try:
        result = host.driver.ingest_context(
            IngestRequest(CORPUS, SOURCE_ID, media_type, data), context()
        )
        outcome = {"status": result.status, "chunks": result.chunk_count}
    except RetrievalError as exc:
        outcome = {"code": exc.code.value, "reason": exc.reason}
    elapsed = time.monotonic() - started
    signal.setitimer(signal.ITIMER_REAL, 0)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))

    stored = host.store.get_source(CORPUS, NAMESPACE, SOURCE_ID)
    outcome |= {"seconds": elapsed, "indexed": stored is not None}
    print(json.dumps(outcome))
    host.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

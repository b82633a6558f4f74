"""Child process for the interrupted-batch test: a batch ingest that the test may SIGKILL.

    python -m tests.support.ingest_batch_child DB JOURNAL ROOT FILE...

Prints the report as one JSON line if it gets to the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from retrieval_host.adapters.embedding_local import LocalEmbedding
from retrieval_host.batch import ingest_paths
from tests.support.ingest_driver import CORPUS, context, make_host


def main(argv: list[str]) -> int:
    db, journal, root, *files = argv
    host = make_host(Path(db), LocalEmbedding(threads=1))
    report = ingest_paths(
        host.driver,
        CORPUS,
        [Path(f) for f in files],
        context(),
        journal_path=Path(journal),
        root=Path(root),
    )
    print(json.dumps({"statuses": [item.status for item in report.items]}))
    host.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

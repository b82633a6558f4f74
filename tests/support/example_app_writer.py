"""Child process of the example application's crash trials: a writer killed with SIGKILL.

Run as `python -m tests.support.example_app_writer HOST_JSON WRITER SEED`. It builds the driver
exactly as the host and `retrieval-host ingest` do (the configured application factory: the
example application's `create_driver`), writes `ready`, then indexes new revisions of its own
sources and now and then deletes one, until it is killed. Around each operation it writes
`try <op> <source> <revision>` and, once the call has returned, `ack <op> <source> <revision>`
(or `fail <op> <source> <revision> <code>`): the parent knows what was acknowledged and what
was in flight when the kill landed.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.models import ChunkInput, DeleteRequest, IndexRequest, Location, SourceInfo
from retrieval_host.serving.factory import build_driver
from retrieval_host.settings import load_settings

CORPUS = "library"
NAMESPACE = "team"
SUBJECT = "writer"
SOURCES_PER_WRITER = 3


def sources_of(writer: int) -> list[str]:
    return [f"w{writer}-doc{k}" for k in range(SOURCES_PER_WRITER)]


def passages(source_id: str, rev: str) -> list[str]:
    """1 to 3 passages whose text names the source and revision."""
    count = 1 + sum(map(ord, rev)) % 3
    return [
        f"Field note {i} of {source_id} at revision {rev}: rotate the token, then check the "
        "battery and the backup schedule."
        for i in range(count)
    ]


def index_request(source_id: str, rev: str) -> IndexRequest:
    return IndexRequest(
        CORPUS,
        SourceInfo(source_id, rev, f"Notes {source_id}"),
        [
            ChunkInput(f"{source_id}-{i}", text, Location(page=1, start_line=i + 1, end_line=i + 1))
            for i, text in enumerate(passages(source_id, rev))
        ],
    )


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    config, writer, seed = Path(argv[1]), int(argv[2]), int(argv[3])
    driver = build_driver(load_settings(config, {}), {})  # as `serve` and `ingest` do
    assert driver is not None
    store = driver.retrieval.corpus(CORPUS).store
    context = RequestContext(subject=SUBJECT)
    chance = random.Random(seed)
    say("ready")
    step = 0
    while True:
        source_id = chance.choice(sources_of(writer))
        stored = store.get_source(CORPUS, NAMESPACE, source_id)
        current = None if stored is None else stored.revision
        if current is not None and chance.random() < 0.15:
            op, rev = "delete", current
        else:
            op, rev = "index", f"s{seed}n{step}"
        say(f"try {op} {source_id} {rev}")
        try:
            if op == "delete":
                driver.delete_context(DeleteRequest(CORPUS, source_id, rev), context)
            else:
                driver.index_context(index_request(source_id, rev), context)
        except RetrievalError as exc:  # reported, counted by the parent; the writer goes on
            say(f"fail {op} {source_id} {rev} {exc.code.value}")
        else:
            say(f"ack {op} {source_id} {rev}")
        step += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The example application's file ACL over the store's revisions (the template for real apps)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import (
    ChunkInput,
    DeleteRequest,
    IndexRequest,
    Location,
    Operation,
    SearchRequest,
    SourceInfo,
)
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.reasons import SourceConflictReason
from retrieval_host.core.service import RetrievalService
from retrieval_host.example_acl import FileAcl, acl_file_content, create_driver
from retrieval_host.settings import HostSettings, SettingsError
from tests.support.example_host import example_settings


class StoreRevisions:
    """A stand-in for `VectorStore.current_revisions` over a dict, recording each call."""

    def __init__(self, revisions: dict[str, dict[str, dict[str, str]]]) -> None:
        self.revisions = revisions
        self.calls: list[tuple[str, str, tuple[str, ...] | None]] = []

    def __call__(
        self, corpus: str, namespace: str, source_ids: Collection[str] | None
    ) -> dict[str, str]:
        self.calls.append((corpus, namespace, None if source_ids is None else tuple(source_ids)))
        current = self.revisions.get(corpus, {}).get(namespace, {})
        ids = current if source_ids is None else source_ids
        return {s: current[s] for s in ids if s in current}


@pytest.fixture
def registry() -> StoreRevisions:
    return StoreRevisions({"library": {"team": {"handbook": "r2", "minutes": "r7"}}})


def _acl(tmp_path: Path, registry: StoreRevisions, **alice: object) -> FileAcl:
    entry = {"namespace": "team", "search": [], "index": [], "delete": [], **alice}
    (tmp_path / "acl.json").write_text(json.dumps({"subjects": {"alice": entry}}))
    return FileAcl(tmp_path / "acl.json", registry)


def _ask(
    acl: FileAcl, operation: Operation, ids: tuple[str, ...] | None = None, who: str = "alice"
) -> Grant | None:
    return acl.authorize(
        AuthorizationRequest(operation, "library", ids), RequestContext(subject=who)
    )


def test_search_grants_each_allowed_source_at_its_current_revision(
    tmp_path: Path, registry: StoreRevisions
) -> None:
    acl = _acl(tmp_path, registry, search=["handbook", "not-indexed"])
    grant = _ask(acl, "search")
    assert grant is not None
    assert grant.namespace == "team"
    assert dict(grant.sources) == {"handbook": "r2"}  # minutes is not allowed, not-indexed absent
    narrowed = _ask(acl, "search", ("handbook", "minutes"))
    assert narrowed is not None and dict(narrowed.sources) == {"handbook": "r2"}
    assert _ask(acl, "search", who="mallory") is None
    assert _ask(acl, "delete") is None  # an empty list denies


def test_index_grants_any_revision_of_the_requested_sources_only(
    tmp_path: Path, registry: StoreRevisions
) -> None:
    acl = _acl(tmp_path, registry, index=["*"], delete=["minutes"])
    grant = _ask(acl, "index", ("new-doc",))
    assert grant is not None and dict(grant.sources) == {"new-doc": ANY_REVISION}
    delete = _ask(acl, "delete", ("minutes", "handbook"))
    assert delete is not None and dict(delete.sources) == {"minutes": "r7"}


def test_grants_ask_the_store_only_for_sources_the_acl_allows(
    tmp_path: Path, registry: StoreRevisions
) -> None:
    acl = _acl(tmp_path, registry, search=["handbook"], delete=["*"])
    _ask(acl, "search")
    _ask(acl, "search", ("minutes", "handbook"))
    _ask(acl, "delete")
    assert registry.calls == [
        ("library", "team", ("handbook",)),
        ("library", "team", ("handbook",)),
        ("library", "team", None),  # "*": the whole namespace
    ]


def test_editing_the_acl_file_revokes_access_without_a_restart(
    tmp_path: Path, registry: StoreRevisions
) -> None:
    acl = _acl(tmp_path, registry, search=["*"])
    assert _ask(acl, "search") is not None
    (tmp_path / "acl.json").write_text(json.dumps(acl_file_content("bob", "team")))
    assert _ask(acl, "search") is None
    bob = _ask(acl, "search", who="bob")
    assert bob is not None and dict(bob.sources) == {"handbook": "r2", "minutes": "r7"}


def test_a_replacement_of_the_same_size_and_modification_time_is_read(tmp_path: Path) -> None:
    # Deployments that normalize modification times (Nix, reproducible images, `cp -p`) rename
    # in a file whose size and mtime equal the old one's: its grants are the ones that count.
    registry = StoreRevisions({"library": {"team": {"alpha": "r1", "bravo": "r2"}}})
    acl = _acl(tmp_path, registry, search=["alpha"])
    granted = _ask(acl, "search")
    assert granted is not None and dict(granted.sources) == {"alpha": "r1"}
    path = tmp_path / "acl.json"
    before = path.stat()
    entry = {"namespace": "team", "search": ["bravo"], "index": [], "delete": []}
    replacement = tmp_path / "acl.json.new"
    replacement.write_text(json.dumps({"subjects": {"alice": entry}}))
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, path)
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    granted = _ask(acl, "search")
    assert granted is not None and dict(granted.sources) == {"bravo": "r2"}


def test_an_acl_with_a_subject_twice_is_refused_not_read_as_its_last_entry(
    tmp_path: Path, registry: StoreRevisions
) -> None:
    # An edit that left the old entry above its replacement: neither may be served.
    entry = '{"namespace": "team", "search": ["*"], "index": [], "delete": []}'
    (tmp_path / "acl.json").write_text(f'{{"subjects": {{"alice": {entry}, "alice": {entry}}}}}')
    acl = FileAcl(tmp_path / "acl.json", registry)
    with pytest.raises(SettingsError, match="appears twice"):
        acl.load()
    assert _ask(acl, "search") is None  # fails closed


def test_a_malformed_acl_is_an_error_at_load_and_no_grant_after(
    tmp_path: Path, registry: StoreRevisions
) -> None:
    (tmp_path / "acl.json").write_text(json.dumps({"subjects": {"alice": {"search": ["*"]}}}))
    acl = FileAcl(tmp_path / "acl.json", registry)
    with pytest.raises(SettingsError, match="needs a namespace"):
        acl.load()
    assert _ask(acl, "search") is None  # fails closed


def test_an_acl_file_anyone_may_write_grants_nothing_until_its_mode_is_fixed(
    open_dir: Path, registry: StoreRevisions
) -> None:
    # A black-box test started a host with its ACL at 0666: any local user could have granted
    # themselves every corpus, at once (the file is read again as it changes).
    acl = _acl(open_dir, registry, search=["handbook"])
    path = open_dir / "acl.json"
    path.chmod(0o666)
    with pytest.raises(SettingsError, match="writable by every user"):
        acl.load()
    assert _ask(acl, "search") is None
    path.chmod(0o644)
    acl.load()
    assert _ask(acl, "search") == Grant("team", {"handbook": "r2"})
    path.chmod(0o646)  # while serving: denied from the next request on
    assert _ask(acl, "search") is None
    path.chmod(0o600)
    assert _ask(acl, "search") == Grant("team", {"handbook": "r2"})


def _example_host(tmp_path: Path) -> HostSettings:
    """The quickstart's application on SQLite, in a private state directory."""
    return example_settings(tmp_path, registryFile="registry.json")


def _handbook(revision: str) -> IndexRequest:
    text = f"Rotate a token with the command line, revision {revision}."
    return IndexRequest(
        "library",
        SourceInfo("handbook", revision, "Handbook"),
        [ChunkInput(f"handbook-{revision}", text, Location(page=1, start_line=1, end_line=1))],
    )


def test_a_commit_whose_writer_died_before_the_application_heard_of_it_stays_usable(
    tmp_path: Path,
) -> None:
    """kill -9 between the store's commit and the application's own write (defect 3 of issue
    13): the store is the truth, so the source stays searchable and deletable at the revision
    the store committed, in the running host and after a restart."""
    settings = _example_host(tmp_path)
    alice = RequestContext(subject="alice")
    host = create_driver(settings, {})
    try:
        host.index_context(_handbook("r1"), alice)
        # Another writer on the same store commits r2, then dies before running any
        # application effect (its process is gone: `on_committed` never runs).
        crashed = create_driver(settings, {})
        corpus = crashed.retrieval.corpus("library")
        unaware = RetrievalService([dataclasses.replace(corpus, on_committed=None)])
        assert unaware.index_context(_handbook("r2"), alice).status == "indexed"
        crashed.retrieval.corpus("library").store.close()

        for driver in (host, create_driver(settings, {})):  # running, then restarted
            try:
                found = driver.search_context(
                    SearchRequest("library", "rotate a token", source_ids=["handbook"]), alice
                )
                assert {h.source.revision for h in found.hits} == {"r2"}
            finally:
                if driver is not host:
                    driver.close()
        with pytest.raises(RetrievalError) as stale:
            host.delete_context(DeleteRequest("library", "handbook", "r1"), alice)
        # The writer learns that another replaced it: fetch the current revision and retry.
        assert (stale.value.code, stale.value.reason) == (
            ErrorCode.SOURCE_CONFLICT,
            SourceConflictReason.STALE_REVISION,
        )
        assert (
            host.delete_context(DeleteRequest("library", "handbook", "r2"), alice).deleted_chunks
            == 1
        )
        with pytest.raises(RetrievalError) as gone:
            host.search_context(
                SearchRequest("library", "rotate a token", source_ids=["handbook"]), alice
            )
        assert gone.value.code == ErrorCode.SOURCE_UNAVAILABLE
    finally:
        host.close()


def test_corpora_given_as_one_string_is_a_configuration_error(tmp_path: Path) -> None:
    # A ValueError before: a traceback and exit 1, where every other option is one line and 2.
    with pytest.raises(SettingsError, match=r"applicationOptions\.corpora must be a list"):
        create_driver(example_settings(tmp_path, corpora="library"), {})


@pytest.mark.parametrize("corpus_id", ["my-corpus-" * 13, "c" * 200])
def test_a_corpus_id_over_128_characters_is_refused_for_its_length(
    tmp_path: Path, corpus_id: str
) -> None:
    # It was refused as secret-shaped: the long-run-of-key-material rule answered first.
    with pytest.raises(SettingsError) as refused:
        create_driver(example_settings(tmp_path, corpora=["library", corpus_id]), {})
    message = str(refused.value)
    assert message.startswith("applicationOptions.corpora: corpus id must be 1-128 characters")
    assert "secret" not in message and corpus_id not in message


@pytest.mark.parametrize(
    ("acl", "said"),
    [
        (
            {"subjects": {"alice": {"namespace": "team", "serch": ["*"]}}},
            "ACL subject 'alice': unknown key 'serch'",
        ),
        ({"subjects": {}, "subject": {}}, "unknown key 'subject'"),
    ],
)
def test_an_acl_with_an_unknown_key_is_refused(
    tmp_path: Path, registry: StoreRevisions, acl: dict[str, Any], said: str
) -> None:
    # A black-box test: a misspelled `serch` started a host that granted nothing, silently.
    (tmp_path / "acl.json").write_text(json.dumps(acl))
    refused = FileAcl(tmp_path / "acl.json", registry)
    with pytest.raises(SettingsError, match=re.escape(said)):
        refused.load()


@pytest.mark.parametrize(
    ("reranker", "said"),
    [
        ({"baseUrl": "https://rerank.example"}, "applicationOptions.reranker.model: Field"),
        (
            {"baseUrl": "https://rerank.example", "model": "m", "kind": "x"},
            "applicationOptions.reranker.kind: Extra inputs",
        ),
    ],
)
def test_a_reranker_setting_error_names_its_key(
    tmp_path: Path, reranker: dict[str, Any], said: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(said)):
        create_driver(example_settings(tmp_path, reranker=reranker), {})


def test_an_acl_nested_too_deeply_is_refused_at_load_and_denies_once_live(
    tmp_path: Path, registry: StoreRevisions, caplog: pytest.LogCaptureFixture
) -> None:
    # Probe O, session 40: `[` * 100000 escaped as a RecursionError, a traceback and exit 1 at
    # start, and a 500 INTERNAL on every request once renamed over a live ACL.
    deep = "[" * 100_000 + "]" * 100_000
    text = f'{{"subjects": {{"alice": {{"namespace": "team", "search": {deep}}}}}}}'
    (tmp_path / "acl.json").write_text(text)
    with pytest.raises(SettingsError, match="nested too deeply"):
        FileAcl(tmp_path / "acl.json", registry).load()
    live = _acl(tmp_path, registry, search=["*"])
    assert _ask(live, "search") is not None
    replacement = tmp_path / "acl.json.new"
    replacement.write_text(text)
    os.replace(replacement, tmp_path / "acl.json")
    with caplog.at_level("ERROR", logger="retrieval_host"):
        assert _ask(live, "search") is None  # denied, as any ACL the host cannot use
    [logged] = [r for r in caplog.records if "every request is denied" in r.getMessage()]
    assert "nested too deeply" in logged.getMessage()

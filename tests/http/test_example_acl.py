"""The example application's file ACL and revision registry (the template for real apps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval_host.core.context import RequestContext
from retrieval_host.core.models import Operation
from retrieval_host.core.ports import ANY_REVISION, AuthorizationRequest, Grant
from retrieval_host.core.service import CommitEvent
from retrieval_host.example_acl import FileAcl, RevisionRegistry, acl_file_content


@pytest.fixture
def registry(tmp_path: Path) -> RevisionRegistry:
    registry = RevisionRegistry(tmp_path / "registry.json")
    for source, revision in (("handbook", "r2"), ("minutes", "r7")):
        registry.record(CommitEvent("index", "library", "team", source, revision, "admin"))
    return registry


def _acl(tmp_path: Path, registry: RevisionRegistry, **alice: object) -> FileAcl:
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
    tmp_path: Path, registry: RevisionRegistry
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
    tmp_path: Path, registry: RevisionRegistry
) -> None:
    acl = _acl(tmp_path, registry, index=["*"], delete=["minutes"])
    grant = _ask(acl, "index", ("new-doc",))
    assert grant is not None and dict(grant.sources) == {"new-doc": ANY_REVISION}
    delete = _ask(acl, "delete", ("minutes", "handbook"))
    assert delete is not None and dict(delete.sources) == {"minutes": "r7"}


def test_the_registry_follows_commits_and_survives_a_restart(
    tmp_path: Path, registry: RevisionRegistry
) -> None:
    registry.record(CommitEvent("index", "library", "team", "handbook", "r3", "admin"))
    registry.record(CommitEvent("delete", "library", "team", "minutes", "r6", "admin"))  # stale
    assert registry.current("library", "team") == {"handbook": "r3", "minutes": "r7"}
    registry.record(CommitEvent("delete", "library", "team", "minutes", "r7", "admin"))
    reopened = RevisionRegistry(tmp_path / "registry.json")
    assert reopened.current("library", "team") == {"handbook": "r3"}
    assert not list(tmp_path.glob(".registry.json.*"))  # no temp files left behind


def test_editing_the_acl_file_revokes_access_without_a_restart(
    tmp_path: Path, registry: RevisionRegistry
) -> None:
    acl = _acl(tmp_path, registry, search=["*"])
    assert _ask(acl, "search") is not None
    (tmp_path / "acl.json").write_text(json.dumps(acl_file_content("bob", "team")))
    assert _ask(acl, "search") is None
    bob = _ask(acl, "search", who="bob")
    assert bob is not None and dict(bob.sources) == {"handbook": "r2", "minutes": "r7"}


def test_a_malformed_acl_is_an_error_not_a_grant(
    tmp_path: Path, registry: RevisionRegistry
) -> None:
    (tmp_path / "acl.json").write_text(json.dumps({"subjects": {"alice": {"search": ["*"]}}}))
    acl = FileAcl(tmp_path / "acl.json", registry)
    with pytest.raises(ValueError, match="namespace"):
        _ask(acl, "search")


def test_two_processes_sharing_the_registry_see_each_others_commits(tmp_path: Path) -> None:
    host = RevisionRegistry(tmp_path / "registry.json")
    cli = RevisionRegistry(tmp_path / "registry.json")  # e.g. `retrieval-host ingest`
    host.record(CommitEvent("index", "library", "team", "a", "r1", "admin"))
    cli.record(CommitEvent("index", "library", "team", "b", "r1", "ops"))
    host.record(CommitEvent("index", "library", "team", "a", "r2", "admin"))
    assert host.current("library", "team") == {"a": "r2", "b": "r1"}
    assert cli.current("library", "team") == {"a": "r2", "b": "r1"}

"""deploy/compose*.yaml: valid YAML that builds this repository and mounts paths that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from retrieval_host.serving.cli import _parser as cli_parser
from retrieval_host.serving.factory import load_factory
from retrieval_host.settings import load_settings
from tests.support.deploy import DEPLOY, REPO, yaml_documents

COMPOSE_FILES = sorted(DEPLOY.glob("compose*.yaml"))


def _compose(path: Path) -> dict[str, Any]:
    (document,) = yaml_documents(path)
    return document


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each bind mount given in short syntax (source starts with . or /)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def _header_comment(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


def test_both_compose_files_exist() -> None:
    assert [p.name for p in COMPOSE_FILES] == ["compose.scale-out.yaml", "compose.yaml"]


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_parses_and_builds_this_repository(path: Path) -> None:
    compose = _compose(path)
    builds = [s["build"] for s in compose["services"].values() if "build" in s]
    assert builds, "a host service builds the image"
    for build in builds:
        context = (path.parent / build["context"]).resolve()
        assert context == REPO
        assert (context / build["dockerfile"]).is_file()
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose.get("volumes", {}), f"undeclared volume {source}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_file_a_compose_file_mounts_exists_or_its_header_says_to_create_it(
    path: Path,
) -> None:
    compose = _compose(path)
    header = _header_comment(path)
    sources = [s for svc in compose["services"].values() for s, _ in _bind_mounts(svc)]
    sources += [secret["file"] for secret in compose.get("secrets", {}).values()]
    assert sources
    for source in sources:
        relative = PurePosixPath(source.removeprefix("./"))
        if (path.parent / relative).exists():
            continue
        assert re.search(rf"(^|\s){re.escape(str(relative))}([\s,;]|$)", header), (
            f"{path.name}: {source} neither exists nor is named in the header"
        )


def test_single_host_compose_mounts_only_existing_paths_and_publishes_on_loopback() -> None:
    compose = _compose(DEPLOY / "compose.yaml")
    (host,) = compose["services"].values()
    for source, _ in _bind_mounts(host):
        assert (DEPLOY / source).exists(), source
    assert all(port.startswith("127.0.0.1:") for port in host["ports"])
    assert host["read_only"] is True
    assert host["user"] == "10001:10001"
    assert host["cap_drop"] == ["ALL"]
    targets = [v.split(":")[1] for v in host["volumes"]]
    assert "/var/lib/retrieval-host" in targets
    assert all(v.endswith(":ro") for v in host["volumes"] if v.startswith("./"))
    # The TLS directory keeps keys out of git.
    assert (DEPLOY / "compose" / "tls" / ".gitignore").read_text().splitlines()[-2:] == [
        "*",
        "!.gitignore",
    ]


def test_single_host_configuration_is_accepted_and_points_into_the_mounts() -> None:
    compose = _compose(DEPLOY / "compose.yaml")
    (host,) = compose["services"].values()
    mounts = {PurePosixPath(t): s for s, t in _bind_mounts(host)}
    # The configuration's folder is mounted whole: an ACL replaced by a rename must reach the
    # host (a single-file mount keeps the file it found at start: a black-box test).
    config_target = PurePosixPath(host["command"][-1])
    assert config_target.parent in mounts
    folder = DEPLOY / mounts[config_target.parent]
    settings = load_settings(folder / config_target.name, {})
    assert settings.tls is not None
    # Relative paths resolve against the config file's directory, inside the container too.
    assert settings.tls.cert_file.parent.is_relative_to(folder)  # the operator puts it there
    assert settings.tls.cert_file.parent.is_dir()
    assert settings.store.sqlite_path is not None
    assert str(settings.store.sqlite_path).startswith("/var/lib/retrieval-host/")
    assert (folder / str(settings.application_options["aclFile"])).is_file()
    assert callable(load_factory(settings))


def _entrypoint() -> list[str]:
    """The Dockerfile's exec-form ENTRYPOINT."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ENTRYPOINT ")]
    words: list[str] = json.loads(line.removeprefix("ENTRYPOINT "))
    return words


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_host_command_is_accepted_by_the_real_cli(path: Path) -> None:
    # A `command` repeating the entrypoint (`retrieval-host retrieval-host serve ...`) put both
    # scale-out replicas in a restart loop (issue 20): parse what the container would run.
    assert _entrypoint() == ["retrieval-host"]
    hosts = [s for s in _compose(path)["services"].values() if "build" in s]
    assert hosts
    for service in hosts:
        argv = service.get("entrypoint", _entrypoint())[1:] + list(service["command"])
        arguments = cli_parser().parse_args(argv)
        assert arguments.command == "serve"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_no_compose_file_mounts_the_acl_as_a_single_file(path: Path) -> None:
    # A file mount keeps the file it found at start: an ACL replaced by a rename (the README's
    # way) never reached the host, and a revoked subject kept reading (probe G; probe O,
    # session 40, found the scale-out file doing it after compose.yaml was fixed). The
    # configuration's folder, where a relative `aclFile` lies, is mounted whole instead.
    hosts = [s for s in _compose(path)["services"].values() if "build" in s]
    assert hosts
    for service in hosts:
        mounts = _bind_mounts(service)
        for source, target in mounts:
            for named in (PurePosixPath(source), PurePosixPath(target)):
                assert "acl" not in named.name.lower(), f"{path.name}: {source}:{target}"
        config_target = PurePosixPath(service["command"][-1])
        assert config_target.parent in {PurePosixPath(t) for _, t in mounts}, mounts

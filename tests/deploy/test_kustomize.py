"""deploy/k8s/overlays/postgres as `kubectl kustomize` renders it: replicas on PostgreSQL with
the base's security context, probes and resources, schema-valid and admitted under Pod Security
"restricted"."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from retrieval_host.settings import load_settings
from tests.support.deploy import OVERLAYS, k8s_object, kustomize, restricted_violations

VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
RENDERED = kustomize(OVERLAYS / "postgres")


def _pod(overlay: str) -> dict[str, Any]:
    pod: dict[str, Any] = k8s_object("Deployment", "retrieval-host", overlay)["spec"]["template"][
        "spec"
    ]
    return pod


def _container(overlay: str) -> dict[str, Any]:
    (container,) = _pod(overlay)["containers"]
    assert isinstance(container, dict)
    return container


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "document", RENDERED, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in RENDERED]
)
def test_every_rendered_object_validates_against_the_kubernetes_schema(
    document: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(document, version, strict=True)


def test_the_overlay_renders_replicas_without_a_volume_claim() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in RENDERED)
    assert kinds == [
        ("ConfigMap", "retrieval-host-config"),
        ("Deployment", "retrieval-host"),
        ("Namespace", "retrieval-host"),
        ("NetworkPolicy", "retrieval-host"),
        ("PodDisruptionBudget", "retrieval-host"),
        ("Service", "retrieval-host"),
    ]
    spec = k8s_object("Deployment", "retrieval-host", "postgres")["spec"]
    assert spec["replicas"] == 2
    # A new pod is ready before an old one stops: a rollout never leaves fewer than 2 serving.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    volumes = _pod("postgres")["volumes"]
    assert not [v for v in volumes if "persistentVolumeClaim" in v]
    budget = k8s_object("PodDisruptionBudget", "retrieval-host", "postgres")["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= labels.items()


def test_replicas_keep_the_bases_security_context_probes_and_resources() -> None:
    sqlite, postgres = _container("sqlite"), _container("postgres")
    for field in (
        "image",
        "args",
        "ports",
        "securityContext",
        "startupProbe",
        "readinessProbe",
        "livenessProbe",
        "resources",
    ):
        assert postgres[field] == sqlite[field], field
    for field in ("securityContext", "terminationGracePeriodSeconds", "enableServiceLinks"):
        assert _pod("postgres")[field] == _pod("sqlite")[field], field
    assert restricted_violations(_pod("postgres")) == []
    assert restricted_violations(_pod("sqlite")) == []


def test_the_sqlite_overlay_keeps_its_index_on_the_claim_and_one_recreated_replica() -> None:
    spec = k8s_object("Deployment", "retrieval-host", "sqlite")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    (state,) = [v for v in spec["template"]["spec"]["volumes"] if v["name"] == "state"]
    assert state == {
        "name": "state",
        "persistentVolumeClaim": {"claimName": "retrieval-host-state"},
    }


def test_the_replicas_read_the_dsn_from_the_mounted_secret(tmp_path: Path) -> None:
    config = k8s_object("ConfigMap", "retrieval-host-config", "postgres")["data"]
    host = json.loads(config["host.json"])
    mounts = {m["name"]: m for m in _container("postgres")["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod("postgres")["volumes"]}
    dsn_path = PurePosixPath(host["store"]["postgresDsn"]["file"])
    secret = volumes["postgres"]["secret"]
    assert mounts["postgres"]["readOnly"] is True
    assert dsn_path.parent == PurePosixPath(mounts["postgres"]["mountPath"])
    assert [item["path"] for item in secret["items"]] == [dsn_path.name]
    assert secret["defaultMode"] == 0o440
    # No secret through the environment.
    assert "env" not in _container("postgres") and "envFrom" not in _container("postgres")

    # The configuration is one the host accepts (the DSN file and tokens taken from tmp_path).
    (tmp_path / "dsn").write_text("postgresql://u:p@db.example:5432/retrieval_host\n")
    (tmp_path / "tokens.json").write_text(
        k8s_object("Secret", "retrieval-host-tokens")["stringData"]["tokens.json"]
    )
    (tmp_path / "acl.json").write_text(config["acl.json"])
    host["store"]["postgresDsn"]["file"] = str(tmp_path / "dsn")
    host["tokensFile"] = str(tmp_path / "tokens.json")
    (tmp_path / "host.json").write_text(json.dumps(host))
    settings = load_settings(tmp_path / "host.json", {})
    assert settings.store.sqlite_path is None
    assert settings.store.postgres_dsn is not None and settings.store.hnsw is True
    # Everything but the store is the base's configuration.
    base = json.loads(
        k8s_object("ConfigMap", "retrieval-host-config", "sqlite")["data"]["host.json"]
    )
    assert {k: v for k, v in host.items() if k not in ("store", "tokensFile")} == {
        k: v for k, v in base.items() if k not in ("store", "tokensFile")
    }


def test_the_network_policy_lets_the_replicas_reach_postgres_and_dns_only() -> None:
    policy = k8s_object("NetworkPolicy", "retrieval-host", "postgres")["spec"]
    ports = sorted((p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"])
    assert ports == [(53, "TCP"), (53, "UDP"), (5432, "TCP")]
    assert (
        policy["ingress"]
        == k8s_object("NetworkPolicy", "retrieval-host", "sqlite")["spec"]["ingress"]
    )

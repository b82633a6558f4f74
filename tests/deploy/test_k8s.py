"""deploy/k8s, the SQLite overlay as `kubectl kustomize` renders it: schema-valid manifests
(offline, bundled schemas) that fit together and hold a host configuration the host accepts.
The PostgreSQL overlay: test_kustomize.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from retrieval_host.serving.factory import load_factory
from retrieval_host.settings import load_settings
from tests.support.deploy import K8S, k8s_object, k8s_objects, restricted_violations

# The oldest Kubernetes release still in common support, and the newest bundled schema.
VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
OBJECTS = k8s_objects()


def _pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = k8s_object("Deployment", "retrieval-host")["spec"]["template"]["spec"]
    return spec


def _container() -> dict[str, Any]:
    (container,) = _pod_spec()["containers"]
    assert isinstance(container, dict)
    return container


def test_the_directory_holds_every_object_the_host_needs() -> None:
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for _, doc in OBJECTS)
    assert kinds == [
        ("ConfigMap", "retrieval-host-config"),
        ("Deployment", "retrieval-host"),
        ("Namespace", "retrieval-host"),
        ("NetworkPolicy", "retrieval-host"),
        ("PersistentVolumeClaim", "retrieval-host-state"),
        ("Secret", "retrieval-host-tls"),
        ("Secret", "retrieval-host-tokens"),
        ("Service", "retrieval-host"),
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("path", "document"),
    OBJECTS,
    ids=[f"{p.name}:{d['kind']}/{d['metadata']['name']}" for p, d in OBJECTS],
)
def test_manifest_validates_against_the_kubernetes_schema(
    path: Path, document: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(document, version, strict=True)
    if document["kind"] != "Namespace":
        assert document["metadata"]["namespace"] == "retrieval-host", path


def test_schema_validation_rejects_an_unknown_field_in_the_deployment() -> None:
    broken = copy.deepcopy(k8s_object("Deployment", "retrieval-host"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_probes_use_https_on_the_health_endpoints() -> None:
    container = _container()
    expected = {
        "startupProbe": "/healthz",
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert (get["scheme"], get["path"], get["port"]) == ("HTTPS", path, "https")
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]


def test_host_container_runs_non_root_read_only_without_capabilities() -> None:
    pod = _pod_spec()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The state volume is provisioned for the pod's group, which the host trusts
    # (store.trustOwnGroup): no root init container.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 10001
    assert "initContainers" not in pod
    context = _container()["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = _container()["resources"]
    assert set(resources) == {"requests", "limits"}
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert pod["automountServiceAccountToken"] is False


def test_the_pod_meets_pod_security_restricted_and_the_namespace_enforces_it() -> None:
    assert restricted_violations(_pod_spec()) == []
    labels = k8s_object("Namespace", "retrieval-host")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_restricted_check_refuses_what_the_previous_manifest_needed() -> None:
    pod = copy.deepcopy(_pod_spec())
    # The root init container that gave the volume to uid 10001 before fsGroup was trusted.
    pod["initContainers"] = [
        {
            "name": "state-owner",
            "image": _container()["image"],
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": False,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
            },
        }
    ]
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/var/lib"}})
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    assert restricted_violations(pod) == [
        "volume host is of type ['hostPath']",
        "container state-owner does not run as non-root",
        "container state-owner runs as uid 0",
        "container state-owner adds capabilities ['CHOWN', 'FOWNER']",
        "container retrieval-host does not set allowPrivilegeEscalation: false",
    ]


def test_the_network_policy_admits_https_in_and_dns_out_only() -> None:
    policy = k8s_object("NetworkPolicy", "retrieval-host")["spec"]
    labels = k8s_object("Deployment", "retrieval-host")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [
        {"port": _container()["ports"][0]["containerPort"], "protocol": "TCP"}
    ]
    (egress,) = policy["egress"]
    assert {p["port"] for p in egress["ports"]} == {53}


def test_service_links_are_off_so_no_stray_settings_reach_the_host() -> None:
    # A Service named retrieval-host would inject RETRIEVAL_HOST_PORT=tcp://..., which the
    # settings loader reads as an (unknown, fatal) override.
    assert _pod_spec()["enableServiceLinks"] is False
    service = k8s_object("Service", "retrieval-host")
    with pytest.raises(Exception, match="unknown setting RETRIEVAL_HOST_PORT"):
        load_settings(
            None, {"RETRIEVAL_HOST_PORT": f"tcp://10.0.0.1:{service['spec']['ports'][0]['port']}"}
        )


def test_service_selects_the_pods_and_targets_the_https_port() -> None:
    service = k8s_object("Service", "retrieval-host")
    labels = k8s_object("Deployment", "retrieval-host")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "https"


def test_every_volume_and_reference_resolves() -> None:
    pod = _pod_spec()
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes
    assert k8s_object("ConfigMap", volumes["config"]["configMap"]["name"])
    tls = k8s_object("Secret", volumes["tls"]["secret"]["secretName"])
    assert tls["type"] == "kubernetes.io/tls"
    assert {i["key"] for i in volumes["tls"]["secret"]["items"]} == set(tls["stringData"])
    assert k8s_object(
        "PersistentVolumeClaim", volumes["state"]["persistentVolumeClaim"]["claimName"]
    )
    tokens = k8s_object("Secret", volumes["tokens"]["secret"]["secretName"])
    assert {i["key"] for i in volumes["tokens"]["secret"]["items"]} == set(tokens["stringData"])
    # No secret reaches the host through its environment.
    assert "env" not in _container() and "envFrom" not in _container()


def _container_paths() -> dict[str, PurePosixPath]:
    return {m["name"]: PurePosixPath(m["mountPath"]) for m in _container()["volumeMounts"]}


def test_configmap_and_token_secret_make_a_host_configuration_the_host_accepts(
    tmp_path: Path,
) -> None:
    config = k8s_object("ConfigMap", "retrieval-host-config")["data"]
    for name, text in config.items():
        json.loads(text)
        (tmp_path / name).write_text(text, encoding="utf-8")
    tokens = k8s_object("Secret", "retrieval-host-tokens")["stringData"]["tokens.json"]
    paths = _container_paths()
    host = json.loads(config["host.json"])
    assert PurePosixPath(host["tokensFile"]) == paths["tokens"] / "tokens.json"
    (tmp_path / "tokens.json").write_text(tokens, encoding="utf-8")
    (tmp_path / "host.json").write_text(
        json.dumps({**host, "tokensFile": str(tmp_path / "tokens.json")}), encoding="utf-8"
    )
    settings = load_settings(tmp_path / "host.json", {})
    assert settings.tokens and settings.tokens[0].subject == "app"
    assert settings.store.trust_own_group  # the fsGroup volume above

    args = _container()["args"]
    assert args[:2] == ["serve", "--config"]
    assert PurePosixPath(args[2]) == paths["config"] / "host.json"
    assert settings.listen.port == _container()["ports"][0]["containerPort"]
    # The TLS files are where the Secret's items land.
    assert settings.tls is not None
    (tls_volume,) = [v for v in _pod_spec()["volumes"] if v["name"] == "tls"]
    items = {i["path"] for i in tls_volume["secret"]["items"]}
    assert PurePosixPath(str(settings.tls.cert_file)).parent == paths["tls"]
    assert {
        PurePosixPath(str(settings.tls.cert_file)).name,
        PurePosixPath(str(settings.tls.key_file)).name,
    } == items
    # The index (also the example application's record of current revisions) lives on the
    # state volume.
    assert settings.store.sqlite_path is not None
    assert PurePosixPath(str(settings.store.sqlite_path)).parent == paths["state"]
    # The application factory is importable and its ACL file ships in the same ConfigMap.
    assert callable(load_factory(settings))
    acl = json.loads(config[str(settings.application_options["aclFile"])])
    assert acl["subjects"]["app"]["search"] == ["*"]


def test_the_kustomize_tree_holds_a_base_and_two_overlays() -> None:
    files = sorted(str(p.relative_to(K8S)) for p in K8S.rglob("*") if p.is_file())
    assert files == [
        "base/configmap.yaml",
        "base/deployment.yaml",
        "base/kustomization.yaml",
        "base/namespace.yaml",
        "base/networkpolicy.yaml",
        "base/secret.yaml",
        "base/service.yaml",
        "overlays/postgres/configmap.yaml",
        "overlays/postgres/deployment.yaml",
        "overlays/postgres/kustomization.yaml",
        "overlays/postgres/networkpolicy.yaml",
        "overlays/postgres/poddisruptionbudget.yaml",
        "overlays/sqlite/deployment.yaml",
        "overlays/sqlite/kustomization.yaml",
        "overlays/sqlite/pvc.yaml",
    ]

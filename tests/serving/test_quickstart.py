"""The README's first command: `retrieval-host quickstart` serves, and its curl commands work."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from retrieval_host.serving.quickstart import prepare_state
from retrieval_host.settings import SettingsError, load_settings
from retrieval_host_client import validate_source_citations
from tests.support.ports import free_port
from tests.support.quickstart import cli, serving


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _run_curl(command: str, cwd: Path) -> Any:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (command, done.stderr)
    return json.loads(done.stdout)


def _run_sse(command: str, cwd: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (command, done.stderr)
    return [
        json.loads(line.removeprefix("data:").strip())
        for line in done.stdout.splitlines()
        if line.startswith("data:")
    ]


def test_quickstart_serves_and_every_printed_curl_command_works(tmp_path: Path) -> None:
    assert shutil.which("curl"), "curl is needed to run the printed commands"
    port = free_port()
    state = tmp_path / "state"
    command = [*cli(), "quickstart", "--state-dir", "state", "--port", str(port)]
    with serving(command, tmp_path, state / "ca.pem", port) as served:
        lines, errors = served.lines, served.errors
        output = "".join(lines)
        assert "Q: How do I rotate a token?" in output
        assert "[source:" in output  # the cited passage shown before serving
        commands = [line.strip() for line in lines if line.strip().startswith(("curl ", "printf "))]
        for authorized in commands[1:]:
            # The token reaches curl on its standard input, never among its arguments (every
            # local user may read those in /proc/PID/cmdline while it runs; probe S).
            printed, _, curl = authorized.partition(" | curl ")
            assert printed.startswith("printf 'Authorization: Bearer %s\\n' ") and "-H @-" in curl
            assert "Authorization" not in curl and "state/token" not in curl
        assert "Extractive answer" in output  # the grounded run shown before serving
        assert len(commands) == 5, output

        protocol = _run_curl(commands[0], tmp_path)
        search = _run_curl(commands[1], tmp_path)
        events = _run_sse(commands[2], tmp_path)
        ingest, delete = (_run_curl(c, tmp_path) for c in commands[3:])
        assert protocol["name"] == "retrieval-host"
        assert "scoped-retrieval" in protocol["capabilities"]
        assert "grounded-runs" in protocol["capabilities"]
        assert events[0]["type"] == "run.started"
        assert events[-1]["type"] == "run.completed", events[-1]
        assert all(e["phase"] for e in events if e["type"] == "run.progress")
        result = events[-1]["result"]
        cited = validate_source_citations(
            result["text"], [s["id"] for s in result["sources"]], require_citation=True
        )
        assert cited
        assert "".join(e["text"] for e in events if e["type"] == "run.delta") == result["text"]
        assert search["hits"], search
        assert "rotate" in search["hits"][0]["text"].lower()
        assert search["hits"][0]["location"]["startLine"] >= 1
        assert ingest["status"] == "indexed", ingest
        assert ingest["source"] == {"id": "my-note", "revision": "1"}
        assert delete["deletedChunks"] == ingest["chunkCount"], delete
    assert served.code in (0, 130), "".join(errors)  # 130: the conventional exit after Ctrl+C

    assert _mode(state) == 0o700
    for secret in ("token", "ca-key.pem", "server-key.pem"):
        assert _mode(state / secret) == 0o600, secret
    token = (state / "token").read_text()
    assert token.startswith("rh_")
    assert token.strip() not in (state / "host.json").read_text()  # only its hash is stored

    again = subprocess.run(
        [*cli(), "quickstart", "--state-dir", "state", "--port", str(port), "--no-serve"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert (state / "token").read_text() == token  # reused, not replaced
    indexed = [line for line in again.stdout.splitlines() if "passages, revision" in line]
    assert len(indexed) == 3
    assert all(line.split()[0] == "unchanged" for line in indexed), again.stdout
    # Each names its source id, as `sources show` takes it (it printed the file name).
    assert all(Path(line.split()[2].strip("():")).stem == line.split()[1] for line in indexed), (
        again.stdout
    )
    # What to run to serve the state it left (a black-box test found no word of it).
    assert "Serve it later with: retrieval-host serve --config state/host.json" in again.stdout


def _listening_on_all_interfaces(port: int) -> bool:
    """Is a TCP socket listening on 0.0.0.0:`port` (Linux's /proc/net/tcp)?"""
    wanted = f"00000000:{port:04X}"
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return any(r.split()[1] == wanted and r.split()[3] == "0A" for r in rows)


def test_container_mode_serves_every_interface_with_the_operators_names(tmp_path: Path) -> None:
    port, given = free_port(), free_port()
    state = tmp_path / "state"
    environ = {
        **os.environ,
        "RETRIEVAL_HOST_TLS_NAMES": "rh.example.test, 10.9.8.7",
        # Settings from the environment, as `serve` takes them: only these Host names, and
        # the port (the commands printed named `--port`'s, a black-box test).
        "RETRIEVAL_HOST_ALLOWED_HOSTS": '["127.0.0.1", "rh.example.test"]',
        "RETRIEVAL_HOST_LISTEN__PORT": str(port),
    }
    command = [*cli(), "quickstart", "--container", "--state-dir", str(state), "--port", str(given)]
    with serving(command, tmp_path, state / "ca.pem", port, environ) as served:
        lines = served.lines
        output = "".join(lines)
        assert json.loads((state / "host.json").read_text())["listen"]["host"] == "0.0.0.0"
        assert _listening_on_all_interfaces(port)

        # The token, shown once, and the CA, as the operator copies them from the log.
        token = (state / "token").read_text().strip()
        assert [line.strip() for line in lines if line.strip().startswith("TOKEN=")] == [
            f"TOKEN={token}"
        ]
        pem = (state / "ca.pem").read_text().strip()
        assert pem in output
        (tmp_path / "ca.pem").write_text(pem + "\n")

        # The certificate names the operator's host; checked by a client that verifies it.
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="rh.example.test") as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
        wrong_host = httpx.get(
            f"https://127.0.0.1:{port}/v1/protocol",
            headers={"Host": "elsewhere.example"},
            verify=context,
            timeout=10,
        )
        assert wrong_host.status_code == 400  # RETRIEVAL_HOST_ALLOWED_HOSTS was applied

        # The printed search command works from the operator's side.
        search = next(
            line.strip() for line in lines if "/v1/retrieval/search" in line and "curl" in line
        )
        done = subprocess.run(
            ["bash", "-c", search],
            cwd=tmp_path,
            env={**os.environ, "TOKEN": token},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["hits"]

    # A restart keeps the token and does not print it again.
    again = subprocess.run(
        [*command, "--no-serve"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert "TOKEN=" not in again.stdout
    assert (state / "token").read_text().strip() == token
    assert "unchanged" in again.stdout


def test_a_rerun_keeps_the_edited_configuration_and_moves_only_its_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A black-box test: a rerun rewrote host.json, silently dropping tokens and limits the
    # operator had added, while the README says a rerun reuses everything.
    state = tmp_path / "state"
    host_file = prepare_state(state, 18001)
    config = json.loads(host_file.read_text())
    config["limits"]["maxConcurrency"] = 3
    config["tokens"].append({**config["tokens"][0], "subject": "added", "sha256": "0" * 64})
    host_file.write_text(json.dumps(config))
    again = json.loads(prepare_state(state, 18002).read_text())
    assert again["listen"] == {"host": "127.0.0.1", "port": 18002}
    assert again["limits"]["maxConcurrency"] == 3
    assert [t["subject"] for t in again["tokens"]] == [config["tokens"][0]["subject"], "added"]
    load_settings(host_file, {})  # still a valid configuration
    # One that is not a JSON object is kept aside, never lost.
    host_file.write_text("{not json")
    fresh = json.loads(prepare_state(state, 18003).read_text())
    assert (state / "host.json.bak").read_text() == "{not json"
    assert fresh["listen"]["port"] == 18003 and len(fresh["tokens"]) == 1
    assert "moved it to host.json.bak" in capsys.readouterr().err
    # A removed token file: the new token replaces the demo entry, the others stay (a review:
    # the old hash stayed, and every printed command got 401).
    config = json.loads(host_file.read_text())
    config["tokens"].append({**config["tokens"][0], "subject": "added", "sha256": "1" * 64})
    host_file.write_text(json.dumps(config))
    (state / "token").unlink()
    renewed = json.loads(prepare_state(state, 18004).read_text())
    token = (state / "token").read_text().strip()
    assert [t["subject"] for t in renewed["tokens"]] == [config["tokens"][0]["subject"], "added"]
    assert renewed["tokens"][0]["sha256"] == hashlib.sha256(token.encode()).hexdigest()


def test_a_rerun_refuses_a_configuration_with_a_key_twice_and_leaves_it(tmp_path: Path) -> None:
    # A black-box test: a second "tokens" list was read as the last one and written back,
    # deleting the operator's other entry, while `serve` refuses the same file.
    state = tmp_path / "state"
    host_file = prepare_state(state, 18011)
    text = host_file.read_text()
    doubled = text.replace('"tokens": [', '"tokens": [], "tokens": [', 1)
    assert doubled != text
    host_file.write_text(doubled)
    with pytest.raises(SettingsError, match='the key "tokens" appears twice'):
        prepare_state(state, 18012)
    assert host_file.read_text() == doubled
    assert not (state / "host.json.bak").exists()


def test_a_rerun_refuses_a_configuration_nested_too_deeply_and_leaves_it(tmp_path: Path) -> None:
    # Review V (session 40): since `serve` refuses JSON past 64 levels, the quickstart took such
    # a host.json, a valid object, for "not a JSON object", moved it aside and wrote a new one.
    state = tmp_path / "state"
    host_file = prepare_state(state, 18013)
    config = json.loads(host_file.read_text())
    config["applicationOptions"]["deep"] = json.loads("[" * 70 + "]" * 70)
    deep = json.dumps(config)
    host_file.write_text(deep)
    with pytest.raises(SettingsError, match="nested too deeply"):
        prepare_state(state, 18014)
    assert host_file.read_text() == deep
    assert not (state / "host.json.bak").exists()


def test_a_rerun_after_the_demo_token_was_rotated_says_its_commands_will_be_refused(
    tmp_path: Path,
) -> None:
    # Probe D: rotated as deploy/README says (host.json's hash replaced, the file left), the
    # rerun printed curl commands with `$(cat state/token)`, each answered 401, and no word.
    done = _quickstart("state", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "is no longer one of host.json's tokens" not in done.stdout
    host_file = tmp_path / "state" / "host.json"
    config = json.loads(host_file.read_text())
    config["tokens"][0]["sha256"] = hashlib.sha256(b"rh_rotated").hexdigest()
    host_file.write_text(json.dumps(config))
    done = _quickstart("state", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "note: state/token is no longer one of host.json's tokens (rotated?)" in done.stdout


def _quickstart(state_dir: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cli(), "quickstart", "--state-dir", state_dir, "--port", str(free_port()), "--no-serve"],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_state_dir_that_holds_other_files_or_is_a_file_is_refused_untouched(
    tmp_path: Path,
) -> None:
    # A black-box test: `--state-dir` made any existing directory 0700 (a shared 1777 one,
    # or the working directory with `--state-dir ""`), and a file gave a traceback.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "someone-elses-file").write_text("x")
    for given in (str(shared), ""):
        done = _quickstart(given, cwd=shared)
        assert done.returncode == 2, done.stderr
        assert "holds files a quickstart does not make (someone-elses-file)" in done.stderr
        assert "Traceback" not in done.stderr
    assert _mode(shared) == 0o1777
    assert sorted(p.name for p in shared.iterdir()) == ["someone-elses-file"]
    # A project directory with its own host.json is not a quickstart state either (a review).
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True)
    (project / "host.json").write_text('{"listen": {"host": "0.0.0.0", "port": 9443}}')
    done = _quickstart(str(project), cwd=tmp_path)
    assert done.returncode == 2 and "is not a quickstart state" in done.stderr
    assert json.loads((project / "host.json").read_text())["listen"]["port"] == 9443
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    for given in (str(a_file), str(a_file / "sub")):
        done = _quickstart(given, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "retrieval-host: " in done.stderr

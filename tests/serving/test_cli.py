"""The `retrieval-host` command line: token new, serve's configuration errors, the factory."""

from __future__ import annotations

import hashlib
import json
import logging
import logging.config
import shutil
import socket
import subprocess
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import trustme

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import SearchRequest
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.serving.cli import main
from retrieval_host.serving.factory import build_driver, close_driver, warn_of_idle_grants
from retrieval_host.serving.ingest_cli import plan_files
from retrieval_host.serving.workers import reuse_port_socket
from retrieval_host.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "server" / "retrieval_host" / "samples"


def test_token_new_prints_the_token_once_and_only_its_hash_for_the_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["token", "new", "--subject", "reporting", "--search", "library", "--search", "hr"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    token = next(line for line in lines if line.startswith("rh_"))
    assert len(token) > 40
    entry = json.loads(next(line for line in lines if line.startswith("{")))
    assert entry == {
        "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "subject": "reporting",
        "providers": [],
        "retrieval": {"search": ["library", "hr"], "index": [], "delete": []},
    }
    assert main(["token", "new"]) == 0
    assert token not in capsys.readouterr().out  # a fresh token every time


def test_serve_reports_a_bad_configuration_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "host.json"
    config.write_text(json.dumps({"listen": {"port": "not-a-port"}}))
    assert main(["serve", "--config", str(config)], environ={}) == 2
    error = capsys.readouterr().err
    assert error.startswith("retrieval-host: invalid configuration")
    assert "Traceback" not in error


@pytest.fixture
def example_config(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The example host file and its ACL, with the store in a private dir."""
    for name in ("host.example.json", "acl.example.json"):
        shutil.copy(REPO / "config" / name, tmp_path / name)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    environ = {
        "RETRIEVAL_HOST_STORE__SQLITE_PATH": str(state / "store" / "retrieval.sqlite"),
        "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps({"aclFile": "acl.example.json"}),
    }
    return tmp_path / "host.example.json", environ


@pytest.fixture
def example_driver(example_config: tuple[Path, dict[str, str]]) -> Iterator[Driver]:
    """The example application's driver over `example_config`, closed afterwards."""
    config, environ = example_config
    driver = build_driver(load_settings(config, environ), environ)
    assert driver is not None
    try:
        yield driver
    finally:
        close_driver(driver)


def test_the_example_application_builds_a_working_driver(example_driver: Driver) -> None:
    driver = example_driver
    alice = RequestContext(subject="alice")
    result = driver.ingest_context(
        IngestRequest(
            "library", "handbook", "text/markdown", (SAMPLES / "operator-guide.md").read_bytes()
        ),
        alice,
    )
    assert result.status == "indexed"
    store = driver.retrieval.corpus("library").store  # the record of current revisions
    assert store.current_revisions("library", "team-a") == {"handbook": result.source.revision}
    found = driver.search_context(SearchRequest("library", "rotate a token", limit=1), alice)
    assert found.hits[0].source.id == "handbook"
    with pytest.raises(RetrievalError) as denied:  # the example ACL: no such grant
        driver.ingest_context(
            IngestRequest("library", "other", "text/markdown", b"# x\n\ny\n"), alice
        )
    assert denied.value.code == ErrorCode.SOURCE_UNAVAILABLE


def test_ingest_indexes_a_folder_and_resumes_from_its_journal(
    example_config: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    config, environ = example_config
    acl = {"subjects": {"ops": {"namespace": "docs", "search": ["*"], "index": ["*"]}}}
    (config.parent / "acl.example.json").write_text(json.dumps(acl))
    journal = config.parent / "journal.jsonl"
    argv = [
        "ingest",
        str(SAMPLES),
        "--config",
        str(config),
        "--corpus",
        "library",
        "--subject",
        "ops",
        "--journal",
        str(journal),
    ]
    assert main(argv, environ=environ) == 0
    first = capsys.readouterr().out.splitlines()
    # Not a terminal: one line per file as it finishes, then the counts.
    assert [line.split()[0] for line in first[:3]] == ["indexed"] * 3
    assert first[-1].startswith("3 indexed, 0 unchanged, 0 skipped, 0 failed")
    assert len(journal.read_text().splitlines()) == 3
    assert main(argv, environ=environ) == 0
    again = capsys.readouterr().out
    assert "done in an earlier run (journal)" in again
    assert "0 indexed, 0 unchanged, 3 skipped, 0 failed" in again


def test_version_prints_the_installed_package_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"retrieval-host {version('retrieval-host')}"


def test_a_token_without_any_grant_is_made_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["token", "new", "--subject", "nobody"]) == 0
    printed = capsys.readouterr()
    assert "rh_" in printed.out  # still made: an operator may add grants in the file
    assert "warning: this token has no grant" in printed.err
    assert main(["token", "new", "--metrics"]) == 0
    assert capsys.readouterr().err == ""


def test_token_new_refuses_names_the_host_would_refuse_or_never_match(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A black-box test: an empty subject was printed and then refused by `serve`; a grant on
    # " library" was accepted and matched no request; a repeated grant was written twice.
    for argv, words in (
        (["--subject", ""], "subject must be"),
        (["--subject", "x", "--search", " library"], "without surrounding spaces"),
        (["--subject", "x", "--index", "*"], "wildcard"),
        # Probe V: the provider-name rule of `serve`, not only the identifier rule.
        (["--subject", "x", "--provider", "open ai"], "a provider name is"),
        (["--subject", "x", "--provider", "x/y"], "a provider name is"),
    ):
        assert main(["token", "new", *argv]) == 2
        printed = capsys.readouterr()
        assert words in printed.err and "rh_" not in printed.out
    assert main(["token", "new", "--index", "library", "--index", "library"]) == 0
    entry = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert entry["retrieval"]["index"] == ["library"]


def test_a_folder_walk_picks_up_text_and_html_and_sets_aside_unknown_types(
    tmp_path: Path,
) -> None:
    for name in ("a.md", "b.txt", "c.html", "d/e.htm", "f.docx", "g.png", "Makefile"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    plan = plan_files([tmp_path])
    assert plan.root == tmp_path
    assert [f.relative_to(tmp_path).as_posix() for f in plan.files] == [
        "a.md",
        "b.txt",
        "c.html",
        "d/e.htm",
    ]
    assert [(p.name, reason) for p, reason in plan.set_aside] == [
        ("Makefile", "unsupported type (no suffix)"),
        ("f.docx", "unsupported type (.docx)"),
        ("g.png", "unsupported type (.png)"),
    ]
    assert plan.missing == []


@pytest.fixture
def tls_config(
    example_config: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, dict[str, str], dict[str, object]]:
    """The example host file with a real certificate and key, and its settings as a dict.

    `serve` configures logging for the process (handlers on the stderr of the moment, here
    pytest's capture, closed after the test): left in place, a later test's background log
    line would fail to write. These tests read only the printed error line."""
    monkeypatch.setattr(logging.config, "dictConfig", lambda config: None)
    monkeypatch.setattr(logging, "captureWarnings", lambda capture: None)
    config, environ = example_config
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    tls = config.parent / "tls"
    tls.mkdir()
    leaf.cert_chain_pems[0].write_to_path(str(tls / "server.pem"))
    leaf.private_key_pem.write_to_path(str(tls / "server-key.pem"))
    return config, environ, json.loads(config.read_text())


def _serve_error(
    config: Path,
    environ: dict[str, str],
    body: dict[str, object],
    capsys: pytest.CaptureFixture[str],
) -> str:
    config.write_text(json.dumps(body))
    assert main(["serve", "--config", str(config)], environ=environ) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    [line] = [line for line in error.splitlines() if line.startswith("retrieval-host: ")]
    return line


def test_serve_refuses_a_missing_or_mismatched_certificate_in_one_line(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A black-box tester got a traceback ending in a FileNotFoundError that named no file, or
    # "PEM lib", after the stores had been opened.
    config, environ, body = tls_config
    missing = {**body, "tls": {"certFile": "tls/nope.pem", "keyFile": "tls/server-key.pem"}}
    line = _serve_error(config, environ, missing, capsys)
    assert "tls.certFile" in line and "nope.pem" in line and "No such file" in line
    other = trustme.CA().issue_cert("127.0.0.1")
    other.private_key_pem.write_to_path(str(config.parent / "tls" / "other-key.pem"))
    mismatched = {**body, "tls": {"certFile": "tls/server.pem", "keyFile": "tls/other-key.pem"}}
    line = _serve_error(config, environ, mismatched, capsys)
    assert "server.pem" in line and "other-key.pem" in line and "private key" in line
    # With worker processes too: the supervisor checks before it starts any (found by review:
    # the workers failed one by one and the supervisor exited 1).
    workers = {**missing, "listen": {**body["listen"], "workers": 2}}  # type: ignore[dict-item]
    assert "nope.pem" in _serve_error(config, environ, workers, capsys)


def test_serve_refuses_an_application_it_cannot_build_in_one_line(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config, environ, body = tls_config
    line = _serve_error(config, environ, {**body, "application": "nosuch_app:create"}, capsys)
    assert "no module named 'nosuch_app'" in line
    # A factory of the wrong signature, or one that raises: a traceback and exit 1 (a
    # black-box test); now one line, exit 2, the traceback in the log.
    (config.parent / "failing_app.py").write_text(
        "def create(settings, environ):\n    raise RuntimeError('no database today')\n"
    )
    for application, raised in (("json:dumps", "TypeError"), ("failing_app:create", "Runtime")):
        line = _serve_error(config, environ, {**body, "application": application}, capsys)
        assert f"the factory raised {raised}" in line and "traceback is in the log" in line
    # A missing ACL file: the host started, said it was ready, and answered 500 to everything.
    no_acl = {**environ, "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps({"aclFile": "no.json"})}
    line = _serve_error(config, no_acl, body, capsys)
    assert "aclFile" in line and "no.json" in line and "No such file" in line
    (config.parent / "bad.json").write_text('{"subjects": ')
    bad_acl = {**environ, "RETRIEVAL_HOST_APPLICATION_OPTIONS": json.dumps({"aclFile": "bad.json"})}
    assert "bad.json" in _serve_error(config, bad_acl, body, capsys)
    # A store that refuses to open: its reason, without the traceback around it.
    store_dir = Path(environ["RETRIEVAL_HOST_STORE__SQLITE_PATH"]).parent
    store_dir.mkdir(mode=0o700, exist_ok=True)
    store_dir.chmod(0o777)
    line = _serve_error(config, environ, body, capsys)
    assert "UNSAFE_STORE" in line and "writable by group or others" in line
    # A database the driver cannot open: its words too, not only "failed while opening the
    # store" (a black-box test, as a user SQLite could not read, could not tell why; as root
    # every file opens, so the driver's refusal is raised by the factory here).
    (config.parent / "unopenable_app.py").write_text(
        "import apsw\n"
        "from retrieval_host.adapters.sqlite.schema import translated\n"
        "def create(settings, environ):\n"
        "    with translated('opening the store'):\n"
        "        raise apsw.CantOpenError('unable to open database file')\n"
    )
    line = _serve_error(config, environ, {**body, "application": "unopenable_app:create"}, capsys)
    assert "STORE_UNAVAILABLE" in line and "opening the store" in line
    assert "(CantOpenError: unable to open database file)" in line
    # libpq's words run over two lines ("Connection refused\n\tIs the server running ..."):
    # they are joined onto the one (a black-box test).
    (config.parent / "refused_app.py").write_text(
        "import apsw\n"
        "from retrieval_host.adapters.sqlite.schema import translated\n"
        "def create(settings, environ):\n"
        "    with translated('opening the store'):\n"
        "        raise apsw.CantOpenError('refused\\n\\tIs the server running?')\n"
    )
    error = _serve_error(config, environ, {**body, "application": "refused_app:create"}, capsys)
    assert error.endswith("(CantOpenError: refused Is the server running?)")


def test_an_acl_file_broken_after_start_denies_everyone_until_it_is_fixed(
    example_config: tuple[Path, dict[str, str]], example_driver: Driver
) -> None:
    acl = example_config[0].parent / "acl.example.json"
    good = acl.read_text()
    alice = RequestContext(subject="alice")
    assert example_driver.retrieval.list_corpora(alice) != []
    acl.write_text(good + "}")  # an edit with a mistake must not leave old grants standing
    assert example_driver.retrieval.list_corpora(alice) == []
    acl.write_text(good + " ")
    assert example_driver.retrieval.list_corpora(alice) != []


@pytest.mark.parametrize("port", ["70000", "0", "https"])
def test_quickstart_refuses_a_port_before_writing_anything(
    tmp_path: Path, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A black-box tester's `--port 70000` was written into host.json, then refused by the
    # configuration: `serve` failed until quickstart ran again; `--port 0` printed `:0` URLs.
    state = tmp_path / "state"
    with pytest.raises(SystemExit) as exited:
        main(["quickstart", "--state-dir", str(state), "--port", port, "--no-serve"])
    assert exited.value.code == 2
    assert "is not a port number (1-65535)" in capsys.readouterr().err
    assert not state.exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_on_a_port_in_use_says_so_in_one_line(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
    workers: int,
) -> None:
    # uvicorn logged the bind error and exited 3 (a black-box report); with worker processes
    # the supervisor's bind raised, a traceback and exit 1 (probe U).
    config, environ, body = tls_config
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        listen = {"host": "127.0.0.1", "port": port, "workers": workers}
        line = _serve_error(config, environ, {**body, "listen": listen}, capsys)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_on_an_address_of_no_interface_here_says_so_in_one_line(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
    workers: int,
) -> None:
    config, environ, body = tls_config
    listen = {"host": "192.0.2.1", "port": 8443, "workers": workers}  # TEST-NET-1: nobody's
    line = _serve_error(config, environ, {**body, "listen": listen}, capsys)
    assert "cannot listen on 192.0.2.1:8443: Cannot assign requested address" in line


def test_a_host_with_workers_refuses_the_port_another_host_with_workers_serves(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Workers listen with SO_REUSEPORT, which any process of the same user may join: a second
    # host with workers joined a running one's port, and the kernel split the connections
    # between two stores (probe U). Here the running host is one worker's socket.
    def no_worker(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker was started on a port another host serves")

    monkeypatch.setattr(subprocess, "Popen", no_worker)
    config, environ, body = tls_config
    with reuse_port_socket("127.0.0.1", 0) as running:
        running.listen()
        port = running.getsockname()[1]
        listen = {"host": "127.0.0.1", "port": port, "workers": 2}
        line = _serve_error(config, environ, {**body, "listen": listen}, capsys)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in line


def test_a_postgres_dsn_that_cannot_be_parsed_is_one_line_that_never_shows_it(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One `:` left out: libpq's error quoted the whole string in a traceback, password and
    # all, from `serve` and from `usage` (probe U).
    config, environ, body = tls_config
    del environ["RETRIEVAL_HOST_STORE__SQLITE_PATH"]
    secret = "Sup3rSecretPW"
    body = {**body, "store": {"postgresDsn": {"env": "PG_DSN"}}, "limits": {}}
    for dsn in (
        f"postgresql//postgres:{secret}@127.0.0.1:55480/postgres",
        f"mysql://root:{secret}@127.0.0.1/library",
    ):
        with_dsn = {**environ, "PG_DSN": dsn}
        line = _serve_error(config, with_dsn, body, capsys)
        assert "STORE_UNAVAILABLE" in line and "store.postgresDsn" in line
        assert main(["usage", "--config", str(config)], environ=with_dsn) == 2
        error = capsys.readouterr().err
        assert "store.postgresDsn" in error and "Traceback" not in error
        for shown in (line, error):
            assert secret not in shown and "127.0.0.1" not in shown and "root" not in shown


def test_an_empty_dsn_is_said_so_and_a_secret_file_every_user_may_read_is_warned_of(
    tls_config: tuple[Path, dict[str, str], dict[str, object]],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # libpq took an empty DSN for the local socket: the error named a server nobody had set.
    config, environ, body = tls_config
    del environ["RETRIEVAL_HOST_STORE__SQLITE_PATH"]
    dsn = config.parent / "dsn"
    dsn.write_text("\n")
    dsn.chmod(0o644)
    store = {"postgresDsn": {"file": "dsn"}}
    reranker_key = config.parent / "rerank-key"
    reranker_key.write_text("rk\n")
    reranker_key.chmod(0o604)
    # A reranker the host can use: its options are checked before the store is opened.
    reranker = {"baseUrl": "https://rerank.example", "model": "m", "apiKey": {"file": "rerank-key"}}
    options = {"aclFile": "acl.example.json", "reranker": reranker}
    environ["RETRIEVAL_HOST_APPLICATION_OPTIONS"] = json.dumps(options)
    config.write_text(json.dumps({**body, "store": store, "limits": {}}))
    assert main(["serve", "--config", str(config)], environ=environ) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert "retrieval-host: store.postgresDsn: the secret is empty" in error, error
    warned = [r.getMessage() for r in caplog.records if "every user" in r.getMessage()]
    assert (
        f"store.postgresDsn file {dsn} is readable or writable by every user (mode 0644): "
        "chmod 0400 it" in warned
    )
    assert (
        f"applicationOptions.reranker.apiKey file {reranker_key} is readable or writable "
        "by every user (mode 0604): chmod 0400 it" in warned
    )
    caplog.clear()
    dsn.chmod(0o600)
    assert main(["serve", "--config", str(config)], environ=environ) == 2
    assert "the secret is empty" in capsys.readouterr().err
    assert not [r for r in caplog.records if "store.postgresDsn" in r.getMessage()]


def test_quickstart_on_a_port_in_use_says_so_before_indexing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = str(squatter.getsockname()[1])
        assert main(["quickstart", "--state-dir", str(state), "--port", port]) == 2
    error = capsys.readouterr().err
    assert f"retrieval-host: cannot listen on 127.0.0.1:{port}: Address already in use" in error
    assert not state.exists()  # nothing prepared, nothing indexed


def test_a_token_granting_what_the_host_lacks_is_named_at_start(
    example_config: tuple[Path, dict[str, str]],
    example_driver: Driver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A black-box test: `"providers": ["nope"]` and `"search": ["nolib"]` started silently
    # (they grant nothing: a typo fails closed, but the operator never heard of it).
    config, environ = example_config
    settings = load_settings(config, environ)
    [token] = settings.tokens
    grants = token.retrieval.model_copy(update={"search": ("library", "nolib")})
    typo = token.model_copy(update={"providers": ("nope",), "retrieval": grants})
    with caplog.at_level(logging.WARNING, logger="retrieval_host"):
        warn_of_idle_grants(settings, example_driver)
        assert caplog.records == []  # the example's grants are all the host's
        warn_of_idle_grants(settings.model_copy(update={"tokens": (typo,)}), example_driver)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "a token of subject 'alice' is granted the provider 'nope', which this host does not "
        "have: that grant allows nothing",
        "a token of subject 'alice' is granted the search corpus 'nolib', which this host does "
        "not have: that grant allows nothing",
    ]

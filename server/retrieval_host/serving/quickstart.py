"""`retrieval-host quickstart`: a working local HTTPS host in one command.

Everything lives in one state directory (default `./state`, mode 0700):

    ca.pem, ca-key.pem        a local CA (trust ca.pem in clients; the key never leaves)
    server.pem, server-key.pem  the server certificate for 127.0.0.1 and localhost
    token                     the demo bearer token (0600); host.json keeps only its hash
    host.json                 the host configuration (made once and kept, edits included;
                              each run sets only its listen address)
    acl.json                  the example application's ACL
    store/retrieval.sqlite    the index (local embedding model, SQLite); also the record of
                              each source's current revision, which the ACL's grants follow
    samples/, my-note.md      the sample documents and a note for the ingest example

Running it again reuses the certificates, token, ACL, host configuration and index; the
samples come back `unchanged` without any embedding work.

`--container` is the same host for a container image's default command
(`docker run -p 8443:8443 -v rh-state:/state IMAGE`): state in `/state`, listening on every
interface of the container, the server certificate also naming the hosts listed in
`RETRIEVAL_HOST_TLS_NAMES` (comma-separated), the token printed once when it is made (it stays
in the volume), the CA certificate printed at every start, and `RETRIEVAL_HOST_*` variables
applied over the generated configuration as for `serve`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from retrieval_host.core.context import RequestContext
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.models import Location
from retrieval_host.core.runs_model import RunRequest, RunRetrieval
from retrieval_host.driver import Driver, IngestRequest
from retrieval_host.example_acl import acl_file_content
from retrieval_host.http.auth import token_sha256
from retrieval_host.ingest import media_type_for_path
from retrieval_host.serving.factory import build_driver, close_driver
from retrieval_host.serving.server import check_listen_address, run_server
from retrieval_host.serving.tls import DEFAULT_HOSTS, ensure_local_certificates
from retrieval_host.serving.tokens import new_token, token_config_entry
from retrieval_host.settings import HostSettings, SettingsError, load_settings
from retrieval_host.unique_json import DuplicateKeyError, TooDeepError, load_unique_json
from retrieval_host_client import validate_source_citations

CORPUS: Final = "library"
SUBJECT: Final = "quickstart"
NAMESPACE: Final = "demo"
DEMO_QUESTION: Final = "How do I rotate a token?"
PROVIDER: Final = "local"
MODEL: Final = "extractive"
CONTAINER_STATE: Final = Path("/state")
# Extra names for the server certificate in `--container` mode (not a host setting).
TLS_NAMES_VARIABLE: Final = "RETRIEVAL_HOST_TLS_NAMES"
_NAME: Final = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f:.]+$"
)
NOTE: Final = """# My first note

The quickstart indexed this note through the HTTPS ingest route. Search for it with the
search command, then delete it again with the delete command: deletes name the exact revision.
"""


# A directory is a quickstart state (one it may make private again and write to) when it holds
# all of these, or nothing but what a quickstart writes (an interrupted first run). One
# `host.json` was not enough: a project directory with its own was made 0700 and its
# configuration rewritten (a review).
_STATE_FILES: Final = ("host.json", "token", "ca.pem")
_QUICKSTART_NAMES: Final = frozenset(
    {
        "acl.json", "ca-key.pem", "ca.pem", "host.json", "host.json.bak", "my-note.md",
        "samples", "server-key.pem", "server.pem", "store", "token",
    }
)  # fmt: skip


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def _private_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    path.chmod(0o600)


def _display(path: Path) -> str:
    """The path as a user should type it: relative to the working directory when inside it."""
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def _samples(state_dir: Path) -> list[Path]:
    target = state_dir / "samples"
    target.mkdir(mode=0o700, exist_ok=True)
    # The package data `retrieval_host/samples`, found from this module's file (a directory
    # listing importlib.resources cannot always give for an editable install).
    source = Path(__file__).resolve().parent.parent / "samples"
    copied = []
    for item in sorted(source.iterdir()):
        if not item.is_file() or item.name.startswith((".", "_")):
            continue
        try:
            media_type_for_path(item)
        except RetrievalError:
            continue  # only documents the ingest helpers take
        dest = target / item.name
        if not dest.exists():
            shutil.copyfile(item, dest)
        copied.append(dest)
    return copied


def tls_names(environ: Mapping[str, str], given: Sequence[str] = ()) -> tuple[str, ...]:
    """The server certificate's names: the local ones, then `given` and those listed in
    `RETRIEVAL_HOST_TLS_NAMES`; `SettingsError` for one that is no host name or address."""
    listed = re.split(r"[,\s]+", environ.get(TLS_NAMES_VARIABLE, "").strip())
    names = list(DEFAULT_HOSTS)
    for name in [*given, *listed]:
        if not name:
            continue
        if not _NAME.match(name):
            raise SettingsError(f"{name!r} is not a host name or IP address for the certificate")
        if name not in names:
            names.append(name)
    return tuple(names)


def prepare_state(
    state_dir: Path,
    port: int,
    *,
    listen: str = "127.0.0.1",
    names: tuple[str, ...] = DEFAULT_HOSTS,
) -> Path:
    """Create (or reuse) everything in `state_dir`; return the host configuration path."""
    _private_dir(state_dir)
    certs = ensure_local_certificates(state_dir, names)
    token_file = state_dir / "token"
    new_token_made = not token_file.exists()
    if new_token_made:
        token = new_token()
        _private_file(token_file, token + "\n")
    else:
        token = token_file.read_text(encoding="utf-8").strip()
    acl_file = state_dir / "acl.json"
    if not acl_file.exists():
        acl_file.write_text(json.dumps(acl_file_content(SUBJECT, NAMESPACE), indent=2) + "\n")
    note = state_dir / "my-note.md"
    if not note.exists():
        note.write_text(NOTE, encoding="utf-8")
    grants = [CORPUS]
    demo = token_config_entry(
        token, SUBJECT, search=grants, index=grants, delete=grants, providers=[PROVIDER]
    )
    config = {
        "listen": {"host": listen, "port": port},
        # Every part of a search runs in this process: one search thread per core, and a search
        # that calls no model on the event loop while such searches average at most 2 ms.
        "limits": {"searchThreads": "cores", "inlineSearchMs": 2},
        "tls": {"certFile": certs.cert_file.name, "keyFile": certs.key_file.name},
        "tokens": [demo],
        # The offline extractive provider: cited sentences from the evidence, no model account.
        "providers": {PROVIDER: {"kind": "extractive"}},
        "store": {"sqlitePath": "store/retrieval.sqlite"},
        "application": "retrieval_host.example_acl:create_driver",
        "applicationOptions": {
            "aclFile": "acl.json",
            "corpora": [CORPUS],
        },
        "allowedOrigins": [],
        # The operator console at /console/ (a browser that trusts ca.pem; paste the token).
        "console": {"enabled": True},
    }
    host_file = state_dir / "host.json"
    kept = _kept_configuration(host_file)
    if kept is not None:
        # A configuration written before, perhaps edited since (tokens added, limits, a
        # PostgreSQL store): kept whole, only its listen address follows this command.
        listening = kept.get("listen")
        kept["listen"] = {
            **(listening if isinstance(listening, dict) else {}),
            "host": listen,
            "port": port,
        }
        if new_token_made:
            # The token file was removed: the new token replaces the demo subject's entry
            # (its old hash would answer every printed command with 401).
            tokens = kept.get("tokens")
            others = [
                t
                for t in (tokens if isinstance(tokens, list) else [])
                if not (isinstance(t, dict) and t.get("subject") == SUBJECT)
            ]
            kept["tokens"] = [demo, *others]
        config = kept
    host_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return host_file


def _kept_configuration(host_file: Path) -> dict[str, Any] | None:
    """The existing `host.json` as an object, or None when there is none. One that is not a
    JSON object is moved aside to `host.json.bak` (said on stderr), never lost. An object with
    a key twice, or nested deeper than `serve` reads, is refused (`SettingsError`, the file
    left as it is), as `serve` refuses it: read as its last one and written back, an
    operator's other entry was deleted; a deep one, moved aside as "not a JSON object", was a
    valid object replaced (review V, session 40)."""
    try:
        text = host_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        loaded = load_unique_json(text)
    except (DuplicateKeyError, TooDeepError) as exc:
        raise SettingsError(f"{host_file}: {exc}") from None
    except ValueError:
        loaded = None
    if isinstance(loaded, dict):
        return loaded
    backup = host_file.with_name(host_file.name + ".bak")
    os.replace(host_file, backup)
    print(
        f"retrieval-host quickstart: {host_file.name} was not a JSON object; moved it to "
        f"{backup.name} and wrote a new one",
        file=sys.stderr,
    )
    return None


def index_samples(driver: Driver, samples: list[Path]) -> None:
    context = RequestContext(subject=SUBJECT)
    for path in samples:
        result = driver.ingest_context(
            IngestRequest(CORPUS, path.stem, media_type_for_path(path), path.read_bytes()),
            context,
        )
        # The source id, not the file name: `sources show` looks a source up by its id.
        print(
            f"  {result.status:<9} {result.source.id} ({path.name}): {result.chunk_count} "
            f"passages, revision {_short(result.source.revision)}",
            flush=True,
        )


def _index_samples_or_say_why_not(driver: Driver, samples: list[Path], host_file: Path) -> None:
    """`index_samples`, or one line (`SettingsError`, exit 2) when host.json no longer lets the
    demo subject index corpus `library`: a rerun on such a state ended in a traceback (probe H,
    session 40). Refused rather than served without samples: the demo question needs them."""
    try:
        index_samples(driver, samples)
    except RetrievalError as exc:
        if exc.code is not ErrorCode.PERMISSION_DENIED:
            raise
        raise SettingsError(
            f"the quickstart indexes its samples into corpus {CORPUS!r} as subject "
            f"{SUBJECT!r}, which {_display(host_file)} no longer configures or grants "
            f"(applicationOptions.corpora, the token's retrieval lists): add {CORPUS!r} back, "
            f"or serve that configuration with: retrieval-host serve --config "
            f"{_display(host_file)}"
        ) from None


def _check_demo_grant(settings: HostSettings, token: str, host_file: Path) -> None:
    """`SettingsError` (exit 2) when host.json still holds the demo token but no longer lets
    it do what the printed commands do (search, index and delete in corpus `library`, runs
    with provider `local`): the quickstart indexed and answered in-process (its own subject,
    not the token) and printed commands that answered 403 (probe R and review V, session 41).
    A token it no longer holds is a note above, not a refusal (rotated, as deploy/README
    says)."""
    digest = token_sha256(token)
    for entry in settings.tokens:
        if entry.sha256 != digest:
            continue
        grants = entry.retrieval
        lost = [
            f"{operation} in corpus {CORPUS!r} (retrieval.{operation})"
            for operation, corpora in (
                ("search", grants.search),
                ("index", grants.index),
                ("delete", grants.delete),
            )
            if CORPUS not in corpora
        ]
        if PROVIDER not in entry.providers:
            lost.append(f"runs with provider {PROVIDER!r} (providers)")
        if lost:
            raise SettingsError(
                f"the quickstart's demo token may no longer {', '.join(lost)} in "
                f"{_display(host_file)}, so commands it prints would answer 403: grant "
                f"them back, or serve that configuration with: retrieval-host serve "
                f"--config {_display(host_file)}"
            )


def _short(revision: str) -> str:
    return revision if len(revision) <= 20 else revision[:19] + "…"


def _where(location: Location) -> str:
    where = []
    if location.page is not None:
        where.append(f"page {location.page}")
    if location.start_line is not None:
        where.append(f"lines {location.start_line}-{location.end_line}")
    if location.document_id is not None:
        where.append(f"message {location.document_id}")
    return ", ".join(where) or "whole document"


def _answer(driver: Driver) -> None:
    """Run one grounded question with the extractive provider and print the cited answer."""
    result = driver.run(
        RunRequest(PROVIDER, MODEL, DEMO_QUESTION, RunRetrieval(CORPUS, limit=3)),
        RequestContext(subject=SUBJECT),
    )
    cited = validate_source_citations(
        result.text, [s.id for s in result.sources], require_citation=True
    )
    print(result.text.rstrip())
    print("Sources:")
    for entry in result.sources:
        if entry.id in cited:
            print(
                f"  [source:{entry.id}] {entry.source_id} (revision {_short(entry.revision)}), "
                f"{_where(entry.location)}"
            )
    print(f"({len(cited)} citation(s) checked against the run's source manifest)")


def curl_commands(state_dir: Path, port: int, *, container: bool = False) -> list[tuple[str, str]]:
    """(what, command) pairs that work verbatim in a POSIX shell from the current directory:
    the CA, token and note in `state_dir`, or, for a container's host side, `ca.pem` and
    `my-note.md` saved here and the token in `$TOKEN`. The header reaches curl on its standard
    input (`-H @-`) from the shell's own `printf`: in curl's arguments the token could be read
    by every local user in `/proc/PID/cmdline` while curl runs (probe S)."""
    if container:
        ca, bearer, note = "ca.pem", "$TOKEN", "my-note.md"
    else:
        ca = _display(state_dir / "ca.pem")
        bearer = f"$(cat {_display(state_dir / 'token')})"
        note = _display(state_dir / "my-note.md")
    base = f"https://127.0.0.1:{port}"
    header = f"printf 'Authorization: Bearer %s\\n' \"{bearer}\" | "
    auth = "-H @-"
    search = json.dumps({"corpus": CORPUS, "query": DEMO_QUESTION}, separators=(",", ":"))
    delete = json.dumps(
        {"corpus": CORPUS, "sourceId": "my-note", "revision": "1"}, separators=(",", ":")
    )
    run = json.dumps(
        {
            "provider": PROVIDER,
            "model": MODEL,
            "input": DEMO_QUESTION,
            "retrieval": {"corpus": CORPUS, "mode": "before"},
        },
        separators=(",", ":"),
    )
    json_type = "-H 'Content-Type: application/json'"
    return [
        ("Discover the protocol (no token needed)", f"curl --cacert {ca} {base}/v1/protocol"),
        (
            "Search the sample documents",
            f"{header}curl --cacert {ca} {auth} {base}/v1/retrieval/search {json_type} "
            f"-d '{search}'",
        ),
        (
            "Ask a grounded question, streamed as Server-Sent Events",
            f"{header}curl -N --cacert {ca} {auth} -H 'Accept: text/event-stream' {base}/v1/runs "
            f"{json_type} -d '{run}'",
        ),
        (
            "Ingest a document (the raw file is the body)",
            f"{header}curl --cacert {ca} {auth} -H 'Content-Type: text/markdown' "
            f"--data-binary @{note} "
            f"'{base}/v1/retrieval/ingest?corpus={CORPUS}&sourceId=my-note&revision=1'",
        ),
        (
            "Delete it again (deletes name the exact revision)",
            f"{header}curl --cacert {ca} {auth} {base}/v1/retrieval/delete {json_type} "
            f"-d '{delete}'",
        ),
    ]


def quickstart(
    state_dir: Path | None,
    *,
    port: int = 8443,
    serve: bool = True,
    environ: Mapping[str, str],
    container: bool = False,
    names: Sequence[str] = (),
) -> int:
    """Prepare the state directory, index the samples, print the commands, then serve."""
    if state_dir is None:
        state_dir = CONTAINER_STATE if container else Path("state")
    state_dir = state_dir.expanduser().absolute()
    _check_state_dir(state_dir)
    new_token_made = not (state_dir / "token").exists()
    listen = "0.0.0.0" if container else "127.0.0.1"  # noqa: S104 - inside a container
    if serve:
        check_listen_address(listen, port)  # before any indexing: a port in use is one line
    try:
        host_file = prepare_state(
            state_dir,
            port,
            listen=listen,
            names=tls_names(environ, names) if container else DEFAULT_HOSTS,
        )
        samples = _samples(state_dir)
    except OSError as exc:  # an unreadable file of an earlier state, a full disk
        raise SettingsError(
            f"the quickstart state {_display(state_dir)} cannot be used: "
            f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        ) from None
    print(f"retrieval-host quickstart: state in {_display(state_dir)}")
    print(f"  CA certificate  {_display(state_dir / 'ca.pem')}  (clients trust this)")
    print(f"  demo token      {_display(state_dir / 'token')}  (subject {SUBJECT!r}, mode 0600)")
    print(f"  host config     {_display(host_file)}")
    if container:
        _print_container_secrets(state_dir, new_token_made)
    # Only the configuration file, unless in a container (configured by its environment).
    settings = load_settings(host_file, environ if container else {})
    # What it serves on: in a container `RETRIEVAL_HOST_LISTEN__PORT` may move it (a black-box
    # test saw the commands printed with `--port` while the host listened elsewhere).
    port = settings.listen.port
    token = (state_dir / "token").read_text(encoding="utf-8").strip()
    if token_sha256(token) not in {t.sha256 for t in settings.tokens}:
        # Rotated as deploy/README says (host.json edited, the file left): every command
        # printed below answered 401 while the quickstart said nothing (a black-box test).
        print(
            f"  note: {_display(state_dir / 'token')} is no longer one of host.json's tokens "
            "(rotated?): the commands below answer 401 until it holds a token the host "
            "accepts."
        )
    print(f"Indexing the sample documents into corpus {CORPUS!r} with the local model:")
    driver = build_driver(settings, environ)
    assert driver is not None
    try:
        _index_samples_or_say_why_not(driver, samples, host_file)
        _check_demo_grant(settings, token, host_file)
        print(f"\nQ: {DEMO_QUESTION}")
        _answer(driver)
        print("\nTry it" + (" from the machine running the container:" if container else ":"))
        for what, command in curl_commands(state_dir, port, container=container):
            print(f"  # {what}")
            print(f"  {command}")
        ca = _display(state_dir / "ca.pem")
        print(f"\nConsole: https://127.0.0.1:{port}/console/ (sign in with the token)")
        print(f"  (a browser trusts the host once {ca} is imported as an authority)")
        print(flush=True)
        if serve:
            where = (
                f"every interface of the container, port {port}"
                if container
                else (f"https://127.0.0.1:{port}")
            )
            # Once it listens: a script that waits for this line and then connects was
            # refused when it came before the bind (probe R, session 41).
            run_server(
                settings,
                driver,
                environ,
                on_serving=lambda: print(f"Serving {where} (Ctrl+C stops it).", flush=True),
            )
        else:
            config = _display(state_dir / "host.json")
            print(f"Serve it later with: retrieval-host serve --config {config}", flush=True)
    finally:
        close_driver(driver)
    return 0


def _check_state_dir(state_dir: Path) -> None:
    """Refuse a path that is not a directory, and a directory that already holds other files
    than a quickstart state's: the quickstart makes its directory private (mode 0700), and
    `--state-dir /tmp` (or `""`, the working directory) locked everyone else out of it (a
    black-box test)."""
    if state_dir.exists() and not state_dir.is_dir():
        raise SettingsError(f"--state-dir {_display(state_dir)} is not a directory.")
    if not state_dir.is_dir() or all((state_dir / name).exists() for name in _STATE_FILES):
        return
    try:
        foreign = [p for p in state_dir.iterdir() if p.name not in _QUICKSTART_NAMES]
    except OSError as exc:
        raise SettingsError(
            f"--state-dir {_display(state_dir)} cannot be read: {exc.strerror}."
        ) from None
    if foreign:
        names = sorted(p.name for p in foreign)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise SettingsError(
            f"--state-dir {_display(state_dir)} already holds files a quickstart does not make "
            f"({shown}) and is not a quickstart state: name a new or an empty directory, or "
            "move those out (the quickstart makes it private, mode 0700)."
        )


def _print_container_secrets(state_dir: Path, new_token: bool) -> None:
    """What an operator outside the container needs: the token (once, when it is made) and
    the CA certificate (public; printed at every start)."""
    if new_token:
        token = (state_dir / "token").read_text(encoding="utf-8").strip()
        print(f"\nThe token for subject {SUBJECT!r}, shown this once (kept in the volume):")
        print(f"  TOKEN={token}")
    print("\nThe CA certificate clients trust (save it as ca.pem):")
    print((state_dir / "ca.pem").read_text(encoding="ascii").rstrip())

"""`retrieval-host`: serve, make tokens, ingest files, and the quickstart.

retrieval-host --version
retrieval-host serve --config host.json
retrieval-host token new [--subject S] [--search C]... [--index C]... [--delete C]...
                         [--provider NAME]... [--metrics]
retrieval-host ingest PATH... --config host.json --corpus C --subject S [--journal FILE]
                     [--idle-timeout-ms MS]
retrieval-host quickstart [--state-dir DIR] [--port N] [--no-serve] [--container [--name HOST]...]
retrieval-host corpora [--url URL] [--ca-bundle PEM] [--json]
retrieval-host sources list CORPUS [--page-size N] [--url URL] [--ca-bundle PEM] [--json]
retrieval-host sources show CORPUS SOURCE_ID [--url URL] [--ca-bundle PEM] [--json]
retrieval-host usage --config host.json [--since TIME] [--subject S] [--records] [--json]
retrieval-host runs prune --config host.json --before TIME [--usage] [--vacuum]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.validation import check_id
from retrieval_host.serving import inspect_cli, runs_cli, usage_cli
from retrieval_host.serving._args import whole_number
from retrieval_host.serving.factory import (
    build_driver,
    close_driver,
    warn_of_exposed_secrets,
    warn_of_idle_grants,
)
from retrieval_host.serving.ingest_cli import run_ingest
from retrieval_host.serving.tokens import new_token, token_config_entry
from retrieval_host.settings import PROVIDER_NAME, SettingsError, load_settings

if TYPE_CHECKING:
    from retrieval_host.serving.server import EarlyStop


def _serve(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from retrieval_host.serving.server import EarlyStop

    # A stop while the host starts waits for the step under way and then ends the start with
    # exit 0 (`EarlyStop`), a second SIGINT or SIGTERM without waiting (not in a worker: its
    # supervisor decides): before this, the signal's default action ends the process, with
    # nothing opened yet (the interpreter is still loading the host's modules).
    with EarlyStop(second_exits=args.worker is None).watching() as early:
        return _start_and_serve(args, environ, early)


def _start_and_serve(args: argparse.Namespace, environ: Mapping[str, str], early: EarlyStop) -> int:
    from retrieval_host.http.logs import configure_logging
    from retrieval_host.serving.server import check_listeners, run_server

    log = logging.getLogger("retrieval_host")
    settings = load_settings(args.config, environ)
    # JSON lines from the start: the application factory may log while it opens stores.
    # A worker's lines carry its index (`INDEX:PORT:CHANNEL`'s first part): the whole spec, a
    # string, was logged until the server configured logging again (probe D, session 37).
    index = None if args.worker is None else int(str(args.worker).split(":", 1)[0])
    configure_logging(settings.log_level, worker=index)
    if settings.tls is not None:
        # Before any worker starts or the application opens its stores: a certificate that
        # cannot be used is one line and exit 2, with nothing opened.
        from retrieval_host.serving.tls import server_context

        password = settings.tls_key_password(environ)
        server_context(
            settings.tls.cert_file,
            settings.tls.key_file,
            password.get_secret_value() if password is not None else None,
            warn=args.worker is None,  # once per start, not again in each worker
        )
        if password is not None:
            _refuse_a_password_for_a_plain_key(
                settings.tls.cert_file, settings.tls.key_file, password.get_secret_value()
            )
    if args.worker is None:  # once per start, not again in each worker
        warn_of_exposed_secrets(settings)
    worker = None
    if args.worker is not None:
        from retrieval_host.serving.workers import worker_seat

        worker = worker_seat(settings.listen.host, args.worker)
    elif settings.listen.workers > 1:
        from retrieval_host.serving.workers import supervise

        return supervise(args.config, settings, environ, early=early)
    # Before the factory opens the stores, which migrates an earlier release's (that release
    # then refuses them): a start refused for a port in use must change nothing (probe U).
    check_listeners(settings, worker)
    if early.signal is not None:
        log.info("received %s while starting: stopped before opening the stores", early.name)
        return 0
    early.step = "the stores to open"  # the application factory: a migration, a large store
    driver = build_driver(settings, environ)
    early.step = "the server to start"
    try:
        if early.signal is not None:
            log.info("received %s while starting: stopping", early.name)
        else:
            if worker is None or worker.index == 0:  # once per host, not per worker
                warn_of_idle_grants(settings, driver)
            run_server(settings, driver, environ, worker=worker, early=early)
    finally:
        # After a graceful shutdown (SIGTERM) no request is left running: close the stores.
        early.step = "the stores to close"
        close_driver(driver)
        log.info("stopped; stores closed")
        # Nothing is left to finalize, yet the interpreter's exit collects the whole heap:
        # 9-10 s from "stores closed" to exit on a loaded 2-core machine (load average ~18),
        # 1.5 s with the heap frozen out of the collector. The grace period must cover the exit.
        gc.freeze()
    return 0


def _refuse_a_password_for_a_plain_key(cert_file: Path, key_file: Path, password: str) -> None:
    """`SettingsError` when `tls.keyPassword` is set for a key that is not encrypted: OpenSSL
    asks for a password only to decrypt, so the setting did nothing, silently (probe O,
    session 40), where the host refuses every other setting that cannot take effect. The
    pair is known to load (`server_context` has just loaded it)."""
    import ssl

    asked = False

    def give() -> str:
        nonlocal asked
        asked = True
        return password

    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=give)
    if not asked:
        raise SettingsError(
            f"tls.keyPassword is set, but tls.keyFile {key_file} is not encrypted: remove "
            "keyPassword (or encrypt the key)"
        )


def _token_new(args: argparse.Namespace) -> int:
    # The identifier rule `serve` and every request apply: an entry the host refuses, or a
    # grant on " library" that no request can name, was printed as if it would work.
    try:
        check_id("subject", args.subject)
        for flag in ("search", "index", "delete", "provider"):
            for name in getattr(args, flag):
                check_id(f"--{flag} {name!r}", name)
    except RetrievalError as exc:
        print(f"retrieval-host: {exc.detail}", file=sys.stderr)
        return 2
    for name in args.provider:
        if not PROVIDER_NAME.match(name):
            # The provider-name rule `serve` applies to `providers` (probe V: `token new`
            # printed "open ai", which `serve` then refused to start with).
            print(
                f"retrieval-host: --provider {name!r}: a provider name is 1-64 letters, "
                "digits and . _ : -, the first a letter or digit.",
                file=sys.stderr,
            )
            return 2
    token = new_token()
    entry = token_config_entry(
        token,
        args.subject,
        search=list(dict.fromkeys(args.search)),
        index=list(dict.fromkeys(args.index)),
        delete=list(dict.fromkeys(args.delete)),
        providers=list(dict.fromkeys(args.provider)),
        metrics=args.metrics,
    )
    print("New token (shown once; keep it in your secret store, the host keeps only its hash):")
    print(token)
    print()
    print('Add this entry to "tokens" in the host configuration:')
    print(json.dumps(entry))
    if not (args.search or args.index or args.delete or args.provider or args.metrics):
        print(
            "retrieval-host: warning: this token has no grant, so it can do nothing; "
            "add --search/--index/--delete CORPUS, --provider NAME or --metrics.",
            file=sys.stderr,
        )
    return 0


def _version() -> str:
    try:
        return importlib.metadata.version("retrieval-host")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrieval-host", description="Authenticated retrieval over HTTPS."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the host from a configuration file")
    serve.add_argument("--config", required=True, type=Path, help="host configuration JSON")
    # INDEX:PORT:CHANNEL, given by the supervisor of `listen.workers` processes to each worker.
    serve.add_argument("--worker", help=argparse.SUPPRESS)

    token = commands.add_parser("token", help="manage bearer tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    new = token_commands.add_parser("new", help="print a new token and its configuration entry")
    new.add_argument(
        "--subject", default="app", help="the subject the token acts as (default: app)"
    )
    for operation in ("search", "index", "delete"):
        new.add_argument(
            f"--{operation}",
            action="append",
            default=[],
            metavar="CORPUS",
            help=f"grant {operation} on a corpus (repeatable; none = denied)",
        )
    new.add_argument(
        "--provider",
        action="append",
        default=[],
        metavar="NAME",
        help="allow runs with a configured provider (repeatable; none = no runs)",
    )
    new.add_argument("--metrics", action="store_true", help="allow GET /metrics")

    ingest = commands.add_parser(
        "ingest", help="index PDF, Markdown, text, HTML and e-mail files into a corpus (resumable)"
    )
    ingest.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files or folders")
    ingest.add_argument("--config", required=True, type=Path, help="host configuration JSON")
    ingest.add_argument("--corpus", required=True, help="the corpus to index into")
    ingest.add_argument(
        "--subject", required=True, help="the subject the application authorizes the writes for"
    )
    ingest.add_argument(
        "--journal",
        type=Path,
        help="progress journal (default: .retrieval-host-ingest-CORPUS.jsonl here, the corpus "
        "id percent-encoded); "
        "rerun with the same journal to resume",
    )
    ingest.add_argument(
        "--idle-timeout-ms",
        type=int,
        default=None,
        metavar="MS",
        help="fail a file that makes no progress for MS milliseconds (TIMEOUT, idle-timeout) "
        "and go on with the next; as the HTTP ingest's idleTimeoutMs",
    )

    inspect_cli.add_commands(commands)
    usage_cli.add_command(commands)
    runs_cli.add_command(commands)

    quick = commands.add_parser(
        "quickstart", help="a local HTTPS host with sample documents, in one command"
    )
    quick.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where certificates, token, config and index live (default: ./state, or /state "
        "with --container)",
    )
    quick.add_argument(
        "--port",
        # Checked before anything is written (a black-box tester's `--port 70000` was written
        # into host.json before the configuration refused it).
        type=whole_number(1, 65535, "a port number (1-65535)"),
        default=8443,
        help="HTTPS port, 1-65535 (default 8443)",
    )
    quick.add_argument(
        "--no-serve", action="store_true", help="prepare and index, print the commands, exit"
    )
    quick.add_argument(
        "--container",
        action="store_true",
        help="the image's default: listen on all interfaces, print the token once and the CA, "
        "take RETRIEVAL_HOST_* settings from the environment",
    )
    quick.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="HOST",
        help="with --container: another name for the server certificate (repeatable; also "
        "RETRIEVAL_HOST_TLS_NAMES, comma-separated)",
    )
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The `retrieval-host` entry point."""
    args = _parser().parse_args(argv)
    env = dict(os.environ) if environ is None else environ
    try:
        if args.command == "serve":
            return _serve(args, env)
        if args.command == "token":
            return _token_new(args)
        if args.command == "ingest":
            return run_ingest(args, env)
        if args.command in ("corpora", "sources"):
            return inspect_cli.run(args, env)
        if args.command == "usage":
            return usage_cli.run(args, env)
        if args.command == "runs":
            return runs_cli.run(args, env)
        from retrieval_host.serving.quickstart import quickstart

        if args.name and not args.container:
            print("retrieval-host: --name needs --container", file=sys.stderr)
            return 2
        return quickstart(
            args.state_dir,
            port=args.port,
            serve=not args.no_serve,
            environ=env,
            container=args.container,
            names=args.name,
        )
    except SettingsError as exc:
        print(f"retrieval-host: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`| head`): no traceback. Python would report the failed flush of
        # stdout at exit, so stdout becomes /dev/null first. 141 is what a shell reports for a
        # command ended by SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

"""`retrieval-host corpora` and `retrieval-host sources list|show`: inspect a running host.

They talk to a host over HTTPS with the client package (`retrieval_host_client`), as any
application would, so they show exactly what the token's subject may search. The token is read
from `RETRIEVAL_HOST_TOKEN` (never from the command line, where it would land in the shell's
history and the process list); the host's address from `--url` or `RETRIEVAL_HOST_URL`.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from retrieval_host.serving._args import whole_number
from retrieval_host_client import (
    TOKEN_ENV,
    Client,
    RetrievalHostConnectionError,
    RetrievalHostError,
)

URL_ENV = "RETRIEVAL_HOST_URL"


def add_commands(commands: Any) -> None:
    """Register `corpora` and `sources` on the CLI's subcommand parsers."""
    corpora = commands.add_parser(
        "corpora", help="list the corpora a token may search, with counts (over HTTPS)"
    )
    _connection_options(corpora)

    sources = commands.add_parser("sources", help="list or show the sources of a corpus")
    sources_commands = sources.add_subparsers(dest="sources_command", required=True)
    listing = sources_commands.add_parser(
        "list", help="every source the token may search, at the revision a delete names"
    )
    listing.add_argument("corpus")
    listing.add_argument(
        "--page-size",
        type=whole_number(1, 1000, "a whole number in 1..1000"),
        default=None,
        help="sources per request (1-1000; default 100)",
    )
    _connection_options(listing)
    show = sources_commands.add_parser("show", help="one source and all its passages")
    show.add_argument("corpus")
    show.add_argument("source_id", metavar="SOURCE_ID")
    _connection_options(show)


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"the host's https:// address (default: ${URL_ENV})")
    parser.add_argument(
        "--ca-bundle",
        type=_readable,
        help="a PEM file to trust (e.g. the quickstart's ca.pem)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def _readable(text: str) -> Path:
    path = Path(text)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror}") from None
    return path


def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Run `corpora` or `sources list|show`; 1 for an error the host answered, 2 for usage."""
    url = args.url or environ.get(URL_ENV)
    if not url:
        print(f"retrieval-host: give --url or set {URL_ENV}", file=sys.stderr)
        return 2
    token = environ.get(TOKEN_ENV)
    if not token:
        print(f"retrieval-host: set {TOKEN_ENV} to a bearer token", file=sys.stderr)
        return 2
    try:
        with Client(url, token=token, ca_bundle=args.ca_bundle) as client:
            if args.command == "corpora":
                _corpora(client, args.json)
            elif args.sources_command == "list":
                _list(client, args.corpus, args.page_size, args.json)
            else:
                _show(client, args.corpus, args.source_id, args.json)
    except RetrievalHostError as exc:
        print(f"retrieval-host: {exc}{_hint(exc, url, args.ca_bundle)}", file=sys.stderr)
        return 1
    except ValueError as exc:  # an option the client refuses before sending
        print(f"retrieval-host: {exc}", file=sys.stderr)
        return 2
    except ssl.SSLError as exc:  # `--ca-bundle` names a file that holds no certificate
        print(
            f"retrieval-host: --ca-bundle {args.ca_bundle} is not a PEM certificate file "
            f"({exc.reason or exc})",
            file=sys.stderr,
        )
        return 2
    return 0


def _hint(exc: RetrievalHostError, url: str, ca_bundle: Path | None) -> str:
    """What to try for the two connection failures a newcomer meets first (a black-box test
    read only "RemoteProtocolError" and "CERTIFICATE_VERIFY_FAILED")."""
    if not isinstance(exc, RetrievalHostConnectionError):
        return ""
    if url.lower().startswith("http://") and "ConnectError" not in str(exc):
        return "; the host serves HTTPS: give an https:// URL"
    if "CERTIFICATE_VERIFY_FAILED" in str(exc) and ca_bundle is None:
        return (
            "; pass --ca-bundle with the CA that signed the host's certificate (the "
            "quickstart's is state/ca.pem)"
        )
    return ""


def _line(model: BaseModel, **more: object) -> None:
    answer = model.model_dump(mode="json", by_alias=True)
    print(json.dumps({**answer, **more}, ensure_ascii=False))


def _corpora(client: Client, as_json: bool) -> None:
    # `--json`: one line per corpus, `writeOnly` saying which list of the host's answer it
    # came from (a write-only corpus's line has only `id` and `operations`; a script could
    # tell it only by the missing fields: probe "cli", session 43).
    for corpus in client.list_corpora():
        if as_json:
            _line(corpus, writeOnly=False)
            continue
        print(
            f"{corpus.id}  version {corpus.version}  {corpus.sources} sources  "
            f"{corpus.passages} passages  {corpus.bytes} bytes  "
            f"[{', '.join(corpus.operations)}]  {corpus.embedding.model}"
        )
    # Those it may write to but not search: a writer's token was shown nothing at all.
    for writable in client.list_write_only_corpora():
        if as_json:
            _line(writable, writeOnly=True)
            continue
        print(f"{writable.id}  [{', '.join(writable.operations)}]  (may not search)")


def _list(client: Client, corpus: str, page_size: int | None, as_json: bool) -> None:
    for source in client.list_sources(corpus, page_size=page_size):
        if as_json:
            _line(source)
            continue
        title = f"  {source.title}" if source.title else ""
        print(
            f"{source.id}  {source.revision}  {source.chunk_count} passages  "
            f"{source.bytes} bytes{title}"
        )


def _show(client: Client, corpus: str, source_id: str, as_json: bool) -> None:
    page = client.get_source(corpus, source_id, limit=1000)
    source = page.source
    if as_json:
        _line(source)
    else:
        print(f"{source.id}  revision {source.revision}  {source.title}".rstrip())
        print(f"{source.chunk_count} passages, {source.bytes} bytes")
    while True:
        for passage in page.passages:
            if as_json:
                _line(passage)
                continue
            loc = passage.location
            where = " ".join(
                f"{name} {value}"
                for name, value in (
                    ("page", loc.page),
                    ("lines", _lines(loc.start_line, loc.end_line)),
                    ("message", loc.document_id),
                )
                if value is not None
            )
            print(f"  {passage.chunk_id}  {passage.bytes} bytes  {where}".rstrip())
        if page.next_cursor is None:
            return
        page = client.get_source(corpus, source_id, limit=1000, cursor=page.next_cursor)


def _lines(start: int | None, end: int | None) -> str | None:
    if start is None:
        return None
    return f"{start}-{end}" if end is not None and end != start else str(start)

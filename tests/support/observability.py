"""The host as an operator runs it: `retrieval-host serve --config FILE` in a subprocess.

`HostProcess` writes a host file for the example application (`example_acl:create_driver`,
one SQLite store, the local model), starts the CLI, collects its stdout and stderr line by line
in reader threads, and polls `/readyz` over TLS until the host answers. `terminate` sends
SIGTERM and returns the exit code and how long the process took to exit.

Also: a parser for the Prometheus text format that returns `{(name, labels): value}`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from retrieval_host.serving.tokens import new_token, token_config_entry
from tests.support.host import TlsFiles, make_tls, wait_until
from tests.support.ports import free_port, free_ports

CORPUS = "library"
NAMESPACE = "ops"
METRICS_SCRAPER = "scraper"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def cli() -> list[str]:
    """The installed `retrieval-host` script beside this interpreter (or `-m` as a fallback)."""
    script = Path(sys.executable).with_name("retrieval-host")
    return (
        [str(script)] if script.exists() else [sys.executable, "-m", "retrieval_host.serving.cli"]
    )


def parse_metrics(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by name and label set."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@dataclass
class HostProcess:
    """A `retrieval-host serve` subprocess and what it printed."""

    directory: Path
    process: subprocess.Popen[str]
    port: int
    tls: TlsFiles
    tokens: dict[str, str]
    metrics_port: int | None
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    _readers: list[threading.Thread] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def store_path(self) -> Path:
        return self.directory / "store" / "retrieval.sqlite"

    @property
    def runs_path(self) -> Path:
        return self.directory / "store" / "runs.db"

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[token]}"} if token else {}
        # A bound for a hang, not a pace: a host process's first ingest (model load, parse
        # workers) took over 30 s under `under-load` beside a CI run (session 41).
        return httpx.Client(
            base_url=self.base_url,
            verify=self.tls.client_context(),
            timeout=120,
            headers=headers,
            **kwargs,
        )

    def log_text(self) -> str:
        return "".join(self.stderr) + "".join(self.stdout)

    def log_records(self) -> list[dict[str, Any]]:
        """Every stderr line as a JSON object (fails on a line that is not one)."""
        records = []
        for line in self.stderr:
            if line.strip():
                record = json.loads(line)
                assert isinstance(record, dict), line
                records.append(record)
        return records

    def terminate(
        self, timeout: float = 60.0, sig: signal.Signals = signal.SIGTERM
    ) -> tuple[int, float]:
        """SIGTERM (or `sig`); the exit code and the seconds until the process had exited."""
        sent = time.monotonic()
        self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout)
        return code, time.monotonic() - sent

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        for reader in self._readers:
            reader.join(timeout=10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _ready(host: HostProcess) -> bool:
    try:
        with host.client() as client:
            return client.get("/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def host_process(
    directory: Path,
    *,
    subjects: Mapping[str, Sequence[str]],
    providers: Mapping[str, dict[str, Any]] | None = None,
    limits: Mapping[str, Any] | None = None,
    metrics_port: bool | int = False,
    environ: Mapping[str, str] | None = None,
    store: Mapping[str, Any] | None = None,
    shared: Path | None = None,
    tokens: Mapping[str, str] | None = None,
    workers: int = 1,
    application: str = "retrieval_host.example_acl:create_driver",
    application_options: Mapping[str, Any] | None = None,
    wait_ready: bool = True,
    runs: Mapping[str, Any] | None = None,
) -> Iterator[HostProcess]:
    """Serve the example application from a host file in a subprocess until the block ends.

    `subjects`: token name -> the providers it may use; every token's subject (its name) may
    search, index and delete every source of `library`. A token named `scraper` gets the
    metrics grant and no retrieval grant. Replicas of one deployment pass the same `store`
    (e.g. a PostgreSQL DSN), `shared` (the directory of the application's ACL and revision
    registry) and `tokens`. `application` may name a module in `directory`, and
    `application_options` adds to its options; with `wait_ready=False` the block starts as
    soon as the process runs, ready or not; `runs` adds to the `runs` settings.
    `metrics_port`: True serves metrics on free loopback ports (worker i's at
    `metrics.port + i`), a number configures that port.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    tls = make_tls(directory / "tls")
    given = dict(tokens or {})
    tokens = {}
    entries: list[dict[str, Any]] = []
    acl: dict[str, Any] = {"subjects": {}}
    for name, allowed in subjects.items():
        tokens[name] = given.get(name) or new_token()
        grants = [] if name == METRICS_SCRAPER else [CORPUS]
        entry = token_config_entry(
            tokens[name], name, search=grants, index=grants, delete=grants, providers=allowed
        )
        if name == METRICS_SCRAPER:
            entry["metrics"] = True
        entries.append(entry)
        acl["subjects"][name] = {
            "namespace": NAMESPACE,
            "search": ["*"],
            "index": ["*"],
            "delete": ["*"],
        }
    app_dir = shared or directory
    if not (app_dir / "acl.json").exists():
        (app_dir / "acl.json").write_text(json.dumps(acl))
    loopback: int | None
    if metrics_port is True:
        # One block: the HTTPS port, then worker i's metrics port at metrics.port + i.
        port = free_ports(1 + workers)
        loopback = port + 1
    else:
        port = free_port()
        loopback = metrics_port or None
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port, "workers": workers},
        "tls": {"certFile": str(tls.cert_file), "keyFile": str(tls.key_file)},
        "tokens": entries,
        "providers": dict(providers or {}),
        "store": dict(store or {"sqlitePath": "store/retrieval.sqlite"}),
        "runs": {"heartbeatS": 0.5, **dict(runs or {})},
        "limits": dict(limits or {}),
        "application": application,
        "applicationOptions": {
            "aclFile": str(app_dir / "acl.json"),
            "registryFile": str(app_dir / "registry.json"),
            "corpora": [CORPUS],
            **dict(application_options or {}),
        },
        "logLevel": "info",
    }
    if loopback is not None:
        config["metrics"] = {"port": loopback}
    host_file = directory / "host.json"
    host_file.write_text(json.dumps(config, indent=2))
    # The host reads only its file (and the variables it names): no stray RETRIEVAL_HOST_*.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRIEVAL_HOST_")}
    env.update(environ or {})
    process = subprocess.Popen(
        [*cli(), "serve", "--config", str(host_file)],
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    host = HostProcess(directory, process, port, tls, tokens, loopback)
    for source, sink in ((process.stdout, host.stdout), (process.stderr, host.stderr)):
        assert source is not None
        reader = threading.Thread(
            target=lambda s=source, out=sink: out.extend(iter(s.readline, "")), daemon=True
        )
        reader.start()
        host._readers.append(reader)
    try:
        if wait_ready:
            wait_until(
                lambda: process.poll() is not None or _ready(host),
                timeout=90,
                what="the host subprocess to become ready",
            )
        assert process.poll() is None, host.log_text()
        yield host
    finally:
        host.close()

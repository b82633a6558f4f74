"""Host configuration: one JSON file, then environment overrides with one prefix.

The result is a frozen model passed to `create_app` and to the application factory. Nothing
else in the host reads `os.environ`: `load_settings` takes the environment as an argument.

Secrets are never inline: a secret field holds `{"file": PATH}` or `{"env": NAME}`, resolved
at load into a `SecretStr`. Token *hashes* are listed inline or in a `tokensFile` (a JSON list,
e.g. a mounted Secret; files that grant access: `access_files`); tokens are never stored.

Environment overrides: `RETRIEVAL_HOST_<FIELD>[__<FIELD>...]=VALUE`, where each field is named
in snake case or camel case, case-insensitively (`RETRIEVAL_HOST_LISTEN__PORT=9443`,
`RETRIEVAL_HOST_LIMITS__MAX_BODY_BYTES=1048576`). A value that parses as JSON is used as that
JSON value (numbers, booleans, lists), anything else as a string.

Numeric and boolean settings take JSON numbers and booleans only (`strict`): `true` or `"5"`
for a count, `"yes"` or `1` for a switch are refused (more likely a mistake than meant); an
override's value is parsed as JSON first, so `...__PORT=9443` and `...__READ_ONLY=true` are.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from retrieval_host.access_files import shared_access_file
from retrieval_host.core.errors import RetrievalError
from retrieval_host.core.validation import check_id
from retrieval_host.setting_overrides import CLIENT_VARIABLES, apply_override
from retrieval_host.unique_json import DuplicateKeyError, TooDeepError, load_unique_json

__all__ = [
    "ENV_PREFIX",
    "HostSettings",
    "LimitSettings",
    "ListenSettings",
    "MetricsSettings",
    "RerankerSettings",
    "RetrievalGrants",
    "SecretRef",
    "SettingsError",
    "StoreSettings",
    "TlsSettings",
    "TokenSettings",
    "load_settings",
]

ENV_PREFIX: Final = "RETRIEVAL_HOST_"


def _identifier(value: str) -> str:
    # The rule every request's identifiers follow: a subject or grant no request could match
    # (" alice", a control character) was accepted and then only ever answered 403.
    try:
        check_id("identifier", value)
    except RetrievalError as exc:
        raise ValueError(exc.detail) from None
    return value


Identifier = Annotated[str, AfterValidator(_identifier)]
CorpusId = Identifier
PROVIDER_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
ProviderName = Annotated[str, StringConstraints(pattern=PROVIDER_NAME.pattern)]


class SettingsError(Exception):
    """The configuration cannot be used; the message names the field, never a secret value."""


Flag = Annotated[bool, Field(strict=True)]  # a JSON boolean, nothing that reads like one


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, alias_generator=to_camel
    )


class SecretRef(_Model):
    """Where a secret lives: a file (its content, one trailing newline stripped) or an env var."""

    # One reference, not settings: an environment override replaces it whole (a `{"env": ...}`
    # merged over the file's `{"file": ...}` held both; probe V, session 37).
    replaced_whole: ClassVar[bool] = True

    file: Path | None = None
    env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_inline(cls, data: object) -> object:
        if isinstance(data, str):
            # Said as the other secret errors are, never quoting the value (pydantic said
            # "a valid dictionary or instance of SecretRef", a black-box test).
            raise ValueError(
                'a secret is {"file": PATH} or {"env": NAME}, never written inline in the '
                "configuration"
            )
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.file is None) == (self.env is None):
            raise ValueError('a secret is {"file": PATH} or {"env": NAME}, exactly one of them')
        return self

    def resolve(self, environ: Mapping[str, str], base_dir: Path) -> SecretStr:
        if self.env is not None:
            if self.env not in environ:
                raise SettingsError(f"environment variable {self.env} is not set")
            return SecretStr(environ[self.env])
        assert self.file is not None
        path = self.file if self.file.is_absolute() else base_dir / self.file
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"cannot read secret file {path}: {exc.strerror}") from exc
        return SecretStr(text.removesuffix("\n"))


class ListenSettings(_Model):
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"  # "" would be every interface
    port: Annotated[int, Field(strict=True, ge=0, le=65535)] = 8443
    # Worker processes accepting on the one listening socket (see `retrieval_host.serving.workers`).
    workers: Annotated[int, Field(strict=True, ge=1, le=64)] = 1


class TlsSettings(_Model):
    """The server certificate chain and key (PEM files). The key file is the secret; its path
    is not. `keyPassword` is a secret reference when the key is encrypted."""

    cert_file: Path
    key_file: Path
    key_password: SecretRef | None = None


class LimitSettings(_Model):
    """Limits shared by every route, timeouts in seconds. `maxBodyBytes` can only lower a
    document's own bound (`IngestLimits.max_bytes`)."""

    max_body_bytes: Annotated[int, Field(strict=True, ge=1, le=32 * 1024**2)] = 32 * 1024**2
    # The body of a JSON route (search, index, delete, runs; not a raw document to ingest),
    # also bounded by `maxBodyBytes`. Parsing JSON costs memory per value, not per byte (up to
    # ~50x the body for a body of empty objects): 8 MiB holds an index request of 10,000
    # passages of ~800 characters, and bounds what one request can make the host hold.
    # Unset, the default is lowered to `maxBodyBytes`; a larger value set is refused.
    max_json_body_bytes: Annotated[int, Field(strict=True, ge=1)] = 8 * 1024 * 1024
    # Raw document bytes all ingest uploads in flight may hold together (each upload counts
    # its Content-Length, or its bytes as they arrive): past it an upload is answered
    # HOST_BUSY at once. A document costs several times its size while it is parsed, so the
    # concurrency limit alone let 16 uploads of 31 MiB take a host past 1.5 GB (a black-box
    # test). At least `maxBodyBytes`, so that one upload of the largest size is always
    # admitted alone (unset, the default is raised to it; a smaller value set is refused).
    max_ingest_bytes_in_flight: Annotated[int, Field(strict=True, ge=1, le=2**40)] = 64 * 2**20
    max_concurrency: Annotated[int, Field(strict=True, ge=1, le=10_000)] = 16
    # Requests one subject may have in flight (of `maxConcurrency`; a larger value is lowered
    # to it): past it that subject's next request is answered HOST_BUSY (reason
    # `subject-busy`) while other subjects keep the rest. None: no share, one subject may take
    # every slot (a client holding 16 slow uploads or streams locks every other out).
    max_concurrency_per_subject: Annotated[int, Field(strict=True, ge=1, le=10_000)] | None = None
    # From the connection (or a keep-alive request's first byte) to the headers' end.
    header_timeout_s: Annotated[float, Field(strict=True, ge=0.1, le=3600)] = 10.0
    # Deadline from the request start to the last byte of the body.
    body_timeout_s: Annotated[float, Field(strict=True, ge=0.1, le=3600)] = 60.0
    # On SIGTERM: how long in-flight requests and open run streams may take to finish before
    # the host cancels them (streams then end with a final `run.failed`) and exits. Keep it
    # below the orchestrator's kill timeout (Kubernetes' default grace period is 30 s).
    shutdown_grace_s: Annotated[float, Field(strict=True, gt=0, le=3600)] = 25.0
    # One ingested document, parsing and embedding together: past it the work is stopped and
    # the answer is DOCUMENT_TOO_COMPLEX (reason `deadline`), the previous revision kept. The
    # local model embeds 5-20 passages a second on two busy cores: the default admits
    # documents of roughly 600-2,400 passages.
    ingest_deadline_s: Annotated[float, Field(strict=True, gt=0, le=86_400)] = 120.0
    # Threads that run searches, apart from the other request work (`http/policy.py`): "cores"
    # (the cores the host process may use) or a number. For hosts whose searches are CPU work
    # in this process (the local model, SQLite, an in-process authorizer, no hosted reranker):
    # more threads than cores only contend. None: searches share the request threads, as a
    # search that waits on a network service (PostgreSQL, a hosted model) should.
    search_threads: (
        Annotated[int, Field(strict=True, ge=1, le=10_000)] | Literal["cores"] | None
    ) = None
    # With `searchThreads`: a search that calls no model (lexical, or its query vector
    # cached) runs on the event loop itself, without a thread handoff, while searches of its
    # kind average at most this many milliseconds (`http/inline.py`). 0: never. Only for
    # hosts whose every search part runs in this process: a search on the loop holds every
    # other request up while it runs (the waits the host knows of it refuses).
    inline_search_ms: Annotated[float, Field(strict=True, ge=0, le=1000)] = 0.0

    @model_validator(mode="after")
    def _byte_limits_agree(self) -> LimitSettings:
        # A value the host would silently replace: an in-flight budget of 1,000 bytes served
        # as 32 MiB (a black-box test). Defaults follow `maxBodyBytes` instead.
        chosen = self.model_fields_set
        body = self.max_body_bytes
        if "max_json_body_bytes" in chosen and self.max_json_body_bytes > body:
            raise ValueError(
                f"maxJsonBodyBytes ({self.max_json_body_bytes}) must be at most maxBodyBytes "
                f"({body})"
            )
        if "max_ingest_bytes_in_flight" in chosen and self.max_ingest_bytes_in_flight < body:
            raise ValueError(
                f"maxIngestBytesInFlight ({self.max_ingest_bytes_in_flight}) must be at least "
                f"maxBodyBytes ({body}): one upload of the largest size must fit alone"
            )
        return self

    @model_validator(mode="after")
    def _inline_needs_threads(self) -> LimitSettings:
        # Without search threads it would do nothing: an operator who set it believed it on.
        if self.inline_search_ms > 0 and self.search_threads is None:
            raise ValueError("inlineSearchMs needs searchThreads (set both, or leave it 0)")
        return self


class RetrievalGrants(_Model):
    """Corpus ids a token may use per operation. An omitted or empty list denies."""

    search: tuple[CorpusId, ...] = ()
    index: tuple[CorpusId, ...] = ()
    delete: tuple[CorpusId, ...] = ()


class TokenSettings(_Model):
    """One bearer token, stored as the SHA-256 hex digest of the token string."""

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    subject: Identifier
    providers: tuple[ProviderName, ...] = ()
    retrieval: RetrievalGrants = Field(default_factory=RetrievalGrants)
    # May read `GET /metrics` (Prometheus text) on the main port.
    metrics: Flag = False


class StoreSettings(_Model):
    """Where passages and run records live: SQLite (one machine) or PostgreSQL + pgvector
    (several replicas). Exactly one of `sqlitePath` and `postgresDsn` is set."""

    sqlite_path: Path | None = None
    postgres_dsn: SecretRef | None = None
    postgres_schema: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]{0,62}$")] = (
        "retrieval_host"
    )
    hnsw: Flag = False
    ef_search: Annotated[int, Field(strict=True, ge=1, le=1000)] = 100
    pool_size: Annotated[int, Field(strict=True, ge=1, le=100)] = 4
    # SQLite: accept a store directory and files writable by the host process's own groups,
    # as a volume provisioned for a pod is (Kubernetes fsGroup, OpenShift's gid 0). Off: the
    # directory must be private (`adapters.sqlite.files`).
    trust_own_group: Flag = False
    # Open the store without writing to it (a snapshot, a hot standby): searches only; index
    # and delete answer STORE_READ_ONLY, and discovery says so. Run records need a writable
    # `runs.sqlitePath` then.
    read_only: Flag = False
    # SQLite: keep each corpus's in-memory index in a snapshot file beside the database, mapped
    # at start and shared by the worker processes (`adapters.sqlite.snapshot`). Off: every
    # start reads the whole index from SQLite, and each worker holds its own copy.
    index_snapshots: Flag = True
    # SQLite: a search allowed every live passage of a namespace of at least this many ranks
    # with an approximate graph, re-scored exactly (`adapters.sqlite.approximate`); any other
    # search scans its allowed rows exactly. 0: every search scans.
    approximate_min_rows: Annotated[int, Field(strict=True, ge=0)] = 20_000

    @model_validator(mode="after")
    def _one_store(self) -> StoreSettings:
        if self.sqlite_path is not None and self.postgres_dsn is not None:
            raise ValueError("set store.sqlitePath or store.postgresDsn, not both")
        # A key of the other store would be ignored: an operator who set `hnsw` beside
        # `sqlitePath` believed the graph was on (a black-box test).
        other = (
            _POSTGRES_ONLY
            if self.sqlite_path is not None
            else _SQLITE_ONLY
            if self.postgres_dsn is not None
            else frozenset()
        )
        stray = sorted(to_camel(name) for name in self.model_fields_set & other)
        if stray:
            which = "sqlitePath" if self.sqlite_path is not None else "postgresDsn"
            raise ValueError(
                f"store.{', store.'.join(stray)} does not apply beside store.{which}: remove it"
            )
        # Likewise ignored: only the HNSW index reads it (a black-box probe).
        if "ef_search" in self.model_fields_set and not self.hnsw:
            raise ValueError(
                "store.efSearch applies only beside store.hnsw: true: set that, or remove it"
            )
        return self


_POSTGRES_ONLY: Final = frozenset({"postgres_schema", "hnsw", "ef_search", "pool_size"})
_SQLITE_ONLY: Final = frozenset({"trust_own_group", "index_snapshots", "approximate_min_rows"})


class ExtractiveProviderSettings(_Model):
    """The offline provider: answers with cited sentences quoted from the evidence."""

    kind: Literal["extractive"]


class OpenAIProviderSettings(_Model):
    """An OpenAI-compatible chat-completions account. The key is a secret reference."""

    kind: Literal["openai"]
    base_url: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")]
    api_key: SecretRef | None = None
    ca_file: Path | None = None
    allow_plain_http: Flag = False  # the key over http:// to another machine
    timeout_s: Annotated[float, Field(strict=True, gt=0, le=3600)] = 120.0
    max_output_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    # The account the calls are billed to, as usage records name it (None: unnamed).
    account_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None


class RerankerSettings(_Model):
    """A `/rerank` endpoint for a corpus (`adapters.rerank_http`); the example application
    reads it from `applicationOptions.reranker`. `vendor`, `accountId` and `model` are pinned
    in the corpus descriptor: changing them needs a new index version."""

    base_url: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")]
    model: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    vendor: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "http"
    account_id: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "default"
    api_key: SecretRef | None = None
    ca_file: Path | None = None
    allow_plain_http: Flag = False  # the key over http:// to another machine
    timeout_s: Annotated[float, Field(strict=True, gt=0, le=3600)] = 30.0
    # The authorized top candidates of a search sent to the reranker (a search with a higher
    # limit sends limit + 1).
    candidates: Annotated[int, Field(strict=True, ge=1, le=1000)] = 40


ProviderSettings = Annotated[
    ExtractiveProviderSettings | OpenAIProviderSettings, Field(discriminator="kind")
]


class RunSettings(_Model):
    """Grounded runs: SSE heartbeat interval, the lease of a running record
    (`adapters.run_leases`) and (for SQLite) where run records live."""

    # At least 0.05 s: a tiny interval made every waiting stream a busy loop (a black-box test).
    heartbeat_s: Annotated[float, Field(strict=True, ge=0.05, le=3600)] = 15.0
    # How long a run stays `running` without its host renewing the lease (every quarter of
    # it): after a host stops mid-run, its runs read as failed, `INTERRUPTED`, within this.
    lease_s: Annotated[float, Field(strict=True, ge=1, le=3600)] = 60.0
    # Default: `runs.db` beside `store.sqlitePath`. Ignored with PostgreSQL (same database).
    sqlite_path: Path | None = None


class MetricsSettings(_Model):
    """Prometheus metrics. `GET /metrics` on the main port needs a token with `metrics: true`;
    `port` additionally serves them without a token on 127.0.0.1 only (plain HTTP, for a
    scraper or agent on the same machine)."""

    port: Annotated[int, Field(strict=True, ge=1, le=65535)] | None = None


class ConsoleSettings(_Model):
    """The operator console at `/console/` (static files, same origin as the API; see
    `http/console.py`). Off unless enabled; the quickstart enables it."""

    enabled: Flag = False


class HostSettings(_Model):
    """The whole host configuration (see `config/host.example.json`)."""

    listen: ListenSettings = Field(default_factory=ListenSettings)
    tls: TlsSettings | None = None
    # Plain HTTP is allowed only behind a TLS-terminating proxy on the same machine.
    behind_proxy: Flag = False
    limits: LimitSettings = Field(default_factory=LimitSettings)
    tokens: tuple[TokenSettings, ...] = ()
    # A JSON file holding more `tokens` entries (a mounted Secret, so that rotating tokens
    # touches neither the configuration nor the environment); read once at load.
    tokens_file: Path | None = None
    providers: dict[ProviderName, ProviderSettings] = Field(default_factory=dict)
    runs: RunSettings = Field(default_factory=RunSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    # "package.module:factory"; the factory takes these settings and returns a Driver.
    application: Annotated[str, StringConstraints(pattern=r"^[\w.]+:[\w]+$")] | None = None
    # Free-form options for the application factory (e.g. where its ACL file lives).
    application_options: dict[str, JsonValue] = Field(default_factory=dict)
    allowed_origins: tuple[str, ...] = ()
    # Host header names this host answers to (port ignored); empty accepts any (see http/hosts.py).
    allowed_hosts: tuple[str, ...] = ()
    # Directory that relative paths in this configuration are resolved against: the file's
    # own, as named (not through links); set by `load_settings`, never by the file.
    config_dir: Path = Field(default_factory=Path.cwd)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("allowed_origins")
    @classmethod
    def _origins_are_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if not re.fullmatch(r"https?://[^/\s?#]+", origin):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port])")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_host_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for host in value:
            if not re.fullmatch(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]", host):
                raise ValueError(f"{host!r} is not a host name (no scheme, port or path)")
        return value

    @model_validator(mode="after")
    def _transport_is_safe(self) -> HostSettings:
        if self.tls is None and not self.behind_proxy:
            raise ValueError(
                "tls is required (set behindProxy: true only behind a TLS-terminating "
                "proxy on this machine)"
            )
        if self.behind_proxy and not is_loopback(self.listen.host):
            # Also beside `tls`: the host trusts X-Forwarded-* from loopback, which on a
            # public listener is any local process (probe O, session 40: it was checked only
            # without tls, while deploy/README says "accepted only on a loopback address").
            raise ValueError(
                "behindProxy needs a loopback listen host (127.0.0.1 or ::1), with or without "
                "tls: it trusts the X-Forwarded-* headers of a proxy on this machine"
            )
        hashes = [t.sha256 for t in self.tokens]
        if len(set(hashes)) != len(hashes):
            raise ValueError("two tokens share one sha256")
        if (
            self.store.postgres_dsn is not None
            and self.runs.sqlite_path is not None
            and not self.store.read_only
        ):
            # Beside a read-only one it does: a hot standby records no runs (task F2).
            raise ValueError(
                "runs.sqlitePath does not apply beside a writable store.postgresDsn (run "
                "records go to the same database): remove it"
            )
        if self.limits.inline_search_ms > 0 and self.store.postgres_dsn is not None:
            # A search on the event loop waiting on the network holds every request up, and
            # only the SQLite store refuses its waits there (`core.waits`).
            raise ValueError(
                "limits.inlineSearchMs runs searches on the event loop: a PostgreSQL store's "
                "searches wait on the network; leave it 0 beside store.postgresDsn"
            )
        metrics, port = self.metrics.port, self.listen.port
        if metrics is not None and metrics <= port < metrics + self.listen.workers:
            # The metrics listener binds first and the host then failed on its own port.
            raise ValueError(
                f"metrics.port {metrics} (one port per worker, up to "
                f"{metrics + self.listen.workers - 1}) must not include listen.port {port}"
            )
        return self

    def path(self, value: str | Path) -> Path:
        """Resolve a path from this configuration against `config_dir`."""
        candidate = Path(value).expanduser()
        return candidate if candidate.is_absolute() else self.config_dir / candidate

    def tls_key_password(self, environ: Mapping[str, str]) -> SecretStr | None:
        if self.tls is None or self.tls.key_password is None:
            return None
        return self.tls.key_password.resolve(environ, self.config_dir)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings(
    path: str | Path | None, environ: Mapping[str, str], *, prefix: str = ENV_PREFIX
) -> HostSettings:
    """Read the JSON file (if any), apply `RETRIEVAL_HOST_*` overrides, validate, resolve paths."""
    data: dict[str, Any] = {}
    config_dir = Path.cwd()
    if path is not None:
        file = Path(path).expanduser().resolve()
        # Relative paths follow the file as named, not its link target: a Kubernetes
        # ConfigMap links it into a timestamped folder that the next update deletes.
        config_dir = Path(os.path.abspath(Path(path).expanduser())).parent
        if (shared := shared_access_file(file, "the configuration file")) is not None:
            raise SettingsError(shared)
        try:
            loaded = load_unique_json(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SettingsError(f"cannot read {file}: {exc.strerror}") from exc
        except (DuplicateKeyError, TooDeepError) as exc:
            raise SettingsError(f"{file}: {exc}") from None
        except ValueError as exc:
            raise SettingsError(f"{file} is not valid JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise SettingsError(f"{file} must hold a JSON object")
        data = loaded
    # Each overridden field's location -> its variable, so that an error names what to fix.
    origins: dict[str, str] = {}
    for key in sorted(environ):
        if key in CLIENT_VARIABLES:
            continue  # the client's own variables share the prefix; they configure no host
        if key.startswith(prefix) and len(key) > len(prefix):
            parts = key[len(prefix) :].split("__")
            try:
                origins[apply_override(data, HostSettings, parts, environ[key], key)] = key
            except ValueError as exc:
                raise SettingsError(str(exc)) from None
    if {"configDir", "config_dir"} & set(data):
        raise SettingsError("configDir is no setting: relative paths are relative to the file")
    data["configDir"] = str(config_dir)
    settings = _validated(data, origins)
    if settings.tokens_file is not None:
        listed = _read_tokens_file(settings.path(settings.tokens_file))
        data["tokens"] = [*(data.get("tokens") or []), *listed]
        settings = _validated(data, origins)
    return _resolved(settings)


def _validated(data: dict[str, Any], origins: Mapping[str, str]) -> HostSettings:
    try:
        return HostSettings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, origins)) from None


def _read_tokens_file(file: Path) -> list[Any]:
    """The `tokens` entries of a tokens file: a JSON list, as `retrieval-host token new`
    prints them."""
    if (shared := shared_access_file(file, "tokensFile")) is not None:
        raise SettingsError(shared)
    try:
        loaded = load_unique_json(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read tokensFile {file}: {exc.strerror}") from exc
    except (DuplicateKeyError, TooDeepError) as exc:
        raise SettingsError(f"tokensFile {file}: {exc}") from None
    except ValueError:
        raise SettingsError(f"tokensFile {file} is not valid JSON") from None
    if not isinstance(loaded, list):
        raise SettingsError(f"tokensFile {file} must hold a JSON list of token entries")
    for index, entry in enumerate(loaded):
        # Each entry checked here, so that an error names the file and its entry (merged into
        # `tokens`, it read as `tokens.N`, or as RETRIEVAL_HOST_TOKENS's: probe V).
        try:
            TokenSettings.model_validate(entry)
        except ValidationError as exc:
            said = _describe(exc, {}).removeprefix("invalid configuration: ")
            raise SettingsError(f"tokensFile {file}, entry {index}: {said}") from None
    return loaded


def _resolved(settings: HostSettings) -> HostSettings:
    updates: dict[str, Any] = {}
    if settings.tls is not None:
        updates["tls"] = settings.tls.model_copy(
            update={
                "cert_file": settings.path(settings.tls.cert_file),
                "key_file": settings.path(settings.tls.key_file),
            }
        )
    if settings.store.sqlite_path is not None:
        updates["store"] = settings.store.model_copy(
            update={"sqlite_path": settings.path(settings.store.sqlite_path)}
        )
    return settings.model_copy(update=updates)


def _describe(exc: ValidationError, origins: Mapping[str, str]) -> str:
    # Only locations and messages: input values may hold something secret-looking.
    parts = []
    for error in exc.errors(include_input=False, include_url=False)[:10]:
        loc = ".".join(str(p) for p in error["loc"]) or "(root)"
        # A location under an overridden field (`tokens.0.subject` under `tokens`) came
        # from its variable, not from the file.
        variable = next((v for o, v in origins.items() if f"{loc}.".startswith(f"{o}.")), None)
        parts.append(f"{loc}{f' (from {variable})' if variable else ''}: {error['msg']}")
    return "invalid configuration: " + "; ".join(parts)

"""Host configuration: one JSON file plus RETRIEVAL_HOST_* overrides, secrets never inline."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from retrieval_host.adapters.sqlite import SqliteRunStore, SqliteVectorStore
from retrieval_host.adapters.sqlite.approximate import DEFAULT_MIN_ROWS
from retrieval_host.adapters.sqlite.snapshot import snapshot_path
from retrieval_host.adapters.wiring import build_run_store, build_vector_store
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.ports import CapacityLimits
from retrieval_host.http.app import search_threads
from retrieval_host.ingest.settings import IngestLimits
from retrieval_host.settings import HostSettings, RerankerSettings, SettingsError, load_settings
from tests.support.sqlite_store import descriptor, revision, unit_vectors

LIMITS = CapacityLimits()

REPO = Path(__file__).resolve().parents[1]
HASH = "a" * 64


def _write(directory: Path, data: dict[str, Any]) -> Path:
    path = directory / "host.json"
    path.write_text(json.dumps(data))
    return path


def _minimal(**extra: Any) -> dict[str, Any]:
    return {"tls": {"certFile": "tls/cert.pem", "keyFile": "tls/key.pem"}, **extra}


def test_the_file_and_environment_overrides_give_one_frozen_settings_object(
    tmp_path: Path,
) -> None:
    path = _write(
        tmp_path,
        _minimal(
            limits={"maxBodyBytes": 1000},
            tokens=[{"sha256": HASH, "subject": "app", "retrieval": {"search": ["library"]}}],
        ),
    )
    settings = load_settings(
        path,
        {
            "RETRIEVAL_HOST_LISTEN__PORT": "9443",
            "RETRIEVAL_HOST_LIMITS__MAX_CONCURRENCY": "3",
            "RETRIEVAL_HOST_limits__headerTimeoutS": "2.5",
            "RETRIEVAL_HOST_ALLOWED_ORIGINS": '["https://app.example"]',
            "UNRELATED": "ignored",
        },
    )
    assert settings.listen.port == 9443
    assert settings.limits.max_body_bytes == 1000  # from the file
    assert settings.limits.max_concurrency == 3
    assert settings.limits.header_timeout_s == 2.5
    assert settings.allowed_origins == ("https://app.example",)
    assert settings.tokens[0].retrieval.search == ("library",)
    assert settings.tokens[0].retrieval.delete == ()  # omitted grants deny
    with pytest.raises(ValidationError):
        settings.listen.port = 1  # type: ignore[misc]


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    path = _write(tmp_path, _minimal(store={"sqlitePath": "data/store.sqlite"}))
    settings = load_settings(path, {})
    assert settings.tls is not None
    assert settings.tls.cert_file == tmp_path / "tls" / "cert.pem"
    assert settings.store.sqlite_path == tmp_path / "data" / "store.sqlite"
    assert settings.path("acl.json") == tmp_path / "acl.json"


def test_relative_paths_follow_a_linked_configuration_as_named(tmp_path: Path) -> None:
    # A black-box test: a Kubernetes ConfigMap volume links `host.json` to
    # `..data/host.json` and `..data` to a timestamped folder. Resolved through the links, the
    # relative `aclFile` named a file in that folder, which the next update deleted: every
    # request was then denied until a restart.
    volume = tmp_path / "config"
    first = volume / "..2026_12_06_14_00_00.1"
    first.mkdir(parents=True)
    _write(first, _minimal())
    (volume / "..data").symlink_to(first.name)
    (volume / "host.json").symlink_to("..data/host.json")
    settings = load_settings(volume / "host.json", {})
    assert settings.config_dir == volume
    assert settings.path("acl.json") == volume / "acl.json"


@pytest.mark.parametrize(
    ("data", "environ", "said"),
    [
        (_minimal(configDir="/elsewhere"), {}, "configDir is no setting"),
        (_minimal(), {"RETRIEVAL_HOST_CONFIG_DIR": "/elsewhere"}, "configDir is no setting"),
        (_minimal(listen={"host": ""}), {}, "listen.host"),
        (_minimal(), {"RETRIEVAL_HOST_LISTEN__HOST": ""}, "listen.host"),
        (_minimal(runs={"heartbeatS": 1e-9}), {}, "runs.heartbeatS"),
        (_minimal(limits={"headerTimeoutS": 1e-300}), {}, "limits.headerTimeoutS"),
        (_minimal(store={"readOnly": "yes"}), {}, "store.readOnly"),
        (_minimal(console={"enabled": 1}), {}, "console.enabled"),
        (_minimal(), {"RETRIEVAL_HOST_BEHIND_PROXY": "no"}, "behindProxy"),
        (
            _minimal(store={"postgresDsn": {"env": "DSN"}}, runs={"sqlitePath": "runs.db"}),
            {},
            "runs.sqlitePath does not apply beside a writable store.postgresDsn",
        ),
    ],
)
def test_settings_an_operator_would_not_mean_are_refused(
    tmp_path: Path, data: dict[str, Any], environ: dict[str, str], said: str
) -> None:
    # Black-box tests, each accepted before: `configDir` re-rooted every relative path, an
    # empty listen host bound every interface, a nanosecond heartbeat spun a core per stream,
    # `"yes"` read as true, and `runs.sqlitePath` was ignored beside PostgreSQL.
    with pytest.raises(SettingsError, match=said):
        load_settings(_write(tmp_path, data), environ)
    assert load_settings(_write(tmp_path, _minimal()), {"RETRIEVAL_HOST_STORE__READ_ONLY": "true"})
    # Beside a read-only PostgreSQL store (a hot standby takes no writes) run records have a
    # file of their own.
    standby = _minimal(
        store={"postgresDsn": {"env": "DSN"}, "readOnly": True}, runs={"sqlitePath": "runs.db"}
    )
    assert load_settings(_write(tmp_path, standby), {}).runs.sqlite_path is not None


def test_secrets_come_from_a_file_or_an_environment_variable(tmp_path: Path) -> None:
    (tmp_path / "key-password").write_text("s3cret\n")
    from_file = load_settings(
        _write(
            tmp_path,
            {"tls": {"certFile": "c", "keyFile": "k", "keyPassword": {"file": "key-password"}}},
        ),
        {},
    )
    password = from_file.tls_key_password({})
    assert password is not None
    assert password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(from_file) + str(password)

    from_env = load_settings(
        _write(tmp_path, {"tls": {"certFile": "c", "keyFile": "k", "keyPassword": {"env": "PW"}}}),
        {},
    )
    assert from_env.tls_key_password({"PW": "other"}).get_secret_value() == "other"  # type: ignore[union-attr]
    with pytest.raises(SettingsError, match="PW is not set"):
        from_env.tls_key_password({})


@pytest.mark.parametrize(
    "data",
    [
        {"tls": {"certFile": "c", "keyFile": "k", "keyPassword": "inline-secret"}},
        {"tls": {"certFile": "c", "keyFile": "k", "keyPassword": {"file": "a", "env": "B"}}},
        _minimal(unknownField=1),
        _minimal(tokens=[{"sha256": "not-a-hash", "subject": "s"}]),
        _minimal(tokens=[{"sha256": HASH, "subject": "a"}, {"sha256": HASH, "subject": "b"}]),
        _minimal(allowedOrigins=["https://app.example/path"]),
        _minimal(application="not an import path"),
        _minimal(listen={"workers": 0}),
        _minimal(listen={"workers": 65}),
    ],
    ids=[
        "inline-secret",
        "two-sources",
        "unknown",
        "bad-hash",
        "dup-hash",
        "origin",
        "app",
        "no-workers",
        "too-many-workers",
    ],
)
def test_invalid_configurations_are_refused_without_echoing_values(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(_write(tmp_path, data), {})
    assert "inline-secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("token", "field"),
    [
        ({"subject": " alice"}, "subject"),
        ({"subject": "ali\u0085ce"}, "subject"),
        ({"subject": "*"}, "subject"),
        ({"subject": "app", "retrieval": {"search": ["library "]}}, "search"),
        ({"subject": "app", "retrieval": {"index": ["lib\tary"]}}, "index"),
        ({"subject": "app", "providers": ["local model"]}, "providers"),
    ],
)
def test_a_token_entry_no_request_could_match_is_refused_naming_its_field(
    tmp_path: Path, token: dict[str, Any], field: str
) -> None:
    # Accepted before: every request of such a subject, or to such a corpus, was refused 403.
    with pytest.raises(SettingsError, match=field):
        load_settings(_write(tmp_path, _minimal(tokens=[{"sha256": HASH, **token}])), {})


def test_files_that_grant_access_must_not_be_writable_by_every_user(open_dir: Path) -> None:
    # A black-box test started hosts whose host.json or tokensFile was 0666.
    (open_dir / "tokens.json").write_text(json.dumps([{"sha256": HASH, "subject": "app"}]))
    path = _write(open_dir, _minimal(tokensFile="tokens.json"))
    assert load_settings(path, {}).tokens[0].subject == "app"
    for shared, mode in ((path, 0o666), (open_dir / "tokens.json", 0o622)):
        shared.chmod(mode)
        with pytest.raises(SettingsError, match=f"{shared.name} grants access.*every user"):
            load_settings(path, {})
        shared.chmod(0o644)
    (open_dir / "sub").mkdir()
    inside = _write(open_dir / "sub", _minimal())
    open_dir.chmod(0o777)  # anyone could rename `sub` away and put their own in its place
    with pytest.raises(SettingsError, match="without the sticky bit"):
        load_settings(inside, {})
    open_dir.chmod(0o1777)  # as /tmp: others cannot rename or remove the owner's entries
    assert load_settings(inside, {}).tls is not None


def test_an_inline_secret_is_told_where_secrets_go(tmp_path: Path) -> None:
    # A black-box test got "Input should be a valid dictionary or instance of SecretRef".
    data = {"tls": {"certFile": "c", "keyFile": "k", "keyPassword": "inline-secret"}}
    with pytest.raises(SettingsError) as refused:
        load_settings(_write(tmp_path, data), {})
    said = str(refused.value)
    assert "tls.keyPassword" in said and '{"file": PATH} or {"env": NAME}' in said, said
    assert "inline-secret" not in said and "SecretRef" not in said


def test_an_unknown_override_is_an_error() -> None:
    with pytest.raises(SettingsError, match="RETRIEVAL_HOST_LIMITS__MAX_BODY"):
        load_settings(
            None, {"RETRIEVAL_HOST_BEHIND_PROXY": "true", "RETRIEVAL_HOST_LIMITS__MAX_BODY": "1"}
        )


def test_a_settings_object_from_the_environment_is_merged_key_by_key(tmp_path: Path) -> None:
    # Probe D (session 37): `RETRIEVAL_HOST_LIMITS='{"maxConcurrency": 8}'` dropped the file's
    # other limits (a 6 s shutdown grace became 25 s), and `RETRIEVAL_HOST_LISTEN` with only a
    # host moved the host to port 8443.
    path = _write(
        tmp_path,
        _minimal(limits={"shutdownGraceS": 6, "maxConcurrency": 4}, listen={"port": 19833}),
    )
    env = {
        "RETRIEVAL_HOST_LIMITS": '{"maxConcurrency": 8}',
        "RETRIEVAL_HOST_LISTEN": '{"host": "127.0.0.1"}',
    }
    settings = load_settings(path, env)
    assert (settings.limits.max_concurrency, settings.limits.shutdown_grace_s) == (8, 6)
    assert (settings.listen.host, settings.listen.port) == ("127.0.0.1", 19833)
    with pytest.raises(SettingsError, match="RETRIEVAL_HOST_LIMITS 'maxBody'"):
        load_settings(path, {"RETRIEVAL_HOST_LIMITS": '{"maxBody": 1}'})
    # A secret reference is one value: replaced whole, also inside an object (probe V: the
    # environment's `env` merged over the file's `file` was refused as holding both).
    secret = _write(tmp_path, _minimal(store={"postgresDsn": {"file": "/run/secrets/dsn"}}))
    for env in (
        {"RETRIEVAL_HOST_STORE__POSTGRES_DSN": '{"env": "PG_DSN"}'},
        {"RETRIEVAL_HOST_STORE": '{"postgresDsn": {"env": "PG_DSN"}}'},
    ):
        dsn = load_settings(secret, env).store.postgres_dsn
        assert dsn is not None and (dsn.file, dsn.env) == (None, "PG_DSN")
    # `null` drops what the file sets.
    on_sqlite = _write(tmp_path, _minimal(store={"sqlitePath": "state/r.sqlite"}))
    moved = {"RETRIEVAL_HOST_STORE": '{"sqlitePath": null, "postgresDsn": {"env": "PG_DSN"}}'}
    assert load_settings(on_sqlite, moved).store.sqlite_path is None
    # Free-form objects are still replaced whole.
    options = {"RETRIEVAL_HOST_APPLICATION_OPTIONS": '{"corpora": ["a"]}'}
    with_options = _write(tmp_path, _minimal(applicationOptions={"aclFile": "acl.json"}))
    assert load_settings(with_options, options).application_options == {"corpora": ["a"]}


def test_a_bad_override_is_told_by_its_variable_and_a_bad_file_value_by_its_key(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, _minimal(limits={"maxConcurrency": "many"}))
    env = {"RETRIEVAL_HOST_LISTEN__PORT": "-1", "RETRIEVAL_HOST_TOKENS": '[{"subject": "a"}]'}
    with pytest.raises(SettingsError) as refused:
        load_settings(path, env)
    said = str(refused.value)
    assert "listen.port (from RETRIEVAL_HOST_LISTEN__PORT):" in said, said
    assert "tokens.0.sha256 (from RETRIEVAL_HOST_TOKENS):" in said, said
    assert "limits.maxConcurrency: " in said, said


def test_the_example_host_file_is_a_valid_configuration(tmp_path: Path) -> None:
    shutil.copy(REPO / "config" / "host.example.json", tmp_path / "host.json")
    settings = load_settings(tmp_path / "host.json", {})
    assert isinstance(settings, HostSettings)
    assert settings.application == "retrieval_host.example_acl:create_driver"
    assert settings.tls is not None
    assert settings.tls.cert_file == tmp_path / "tls" / "server.pem"
    assert settings.tokens[0].retrieval.search == ("library",)


def test_the_client_side_variables_are_no_host_settings(tmp_path: Path) -> None:
    # What the README tells users to export for the client and the inspection commands may
    # sit in the host's environment too (a black-box test: RETRIEVAL_HOST_URL stopped serve).
    config = tmp_path / "host.json"
    config.write_text('{"behindProxy": true}', encoding="utf-8")
    client_side = {
        "RETRIEVAL_HOST_TOKEN": "rh_client_side",
        "RETRIEVAL_HOST_URL": "https://127.0.0.1:8443",
        "RETRIEVAL_HOST_TLS_NAMES": "host.example",
    }
    settings = load_settings(config, client_side)
    assert settings.behind_proxy is True
    with pytest.raises(SettingsError, match="RETRIEVAL_HOST_URLS"):
        load_settings(config, {"RETRIEVAL_HOST_URLS": "x"})  # a near miss is still refused


@pytest.mark.parametrize(
    ("limits", "refused"),
    [
        ({"maxJsonBodyBytes": 4097}, "maxJsonBodyBytes .4097. must be at most maxBodyBytes"),
        ({"maxIngestBytesInFlight": 4095}, "maxIngestBytesInFlight .4095. must be at least"),
    ],
)
def test_a_byte_limit_set_against_max_body_bytes_is_refused_not_replaced(
    tmp_path: Path, limits: dict[str, int], refused: str
) -> None:
    # The host would serve another value than the one written (1,000 bytes ran as 32 MiB).
    path = _write(tmp_path, _minimal(limits={"maxBodyBytes": 4096, **limits}))
    with pytest.raises(SettingsError, match=refused):
        load_settings(path, {})
    # Unset, the defaults follow maxBodyBytes; at the bound, a value set is taken as it is.
    small = load_settings(_write(tmp_path, _minimal(limits={"maxBodyBytes": 4096})), {})
    assert small.limits.max_json_body_bytes > 4096  # lowered to 4096 where it is used
    edge = {"maxBodyBytes": 4096, "maxJsonBodyBytes": 4096, "maxIngestBytesInFlight": 4096}
    both = load_settings(_write(tmp_path, _minimal(limits=edge)), {}).limits
    assert (both.max_json_body_bytes, both.max_ingest_bytes_in_flight) == (4096, 4096)


def test_a_body_limit_over_a_documents_own_is_refused(tmp_path: Path) -> None:
    # A black-box test: 40 MiB was accepted and advertised, while every document over 32 MiB
    # was still read in full and then refused by the document's own bound.
    document = IngestLimits().max_bytes
    at = load_settings(_write(tmp_path, _minimal(limits={"maxBodyBytes": document})), {})
    assert at.limits.max_body_bytes == document
    with pytest.raises(SettingsError, match="maxBodyBytes"):
        load_settings(_write(tmp_path, _minimal(limits={"maxBodyBytes": document + 1})), {})
    with pytest.raises(SettingsError, match="maxIngestBytesInFlight"):
        load_settings(_write(tmp_path, _minimal(limits={"maxIngestBytesInFlight": 10**30})), {})


def test_trust_own_group_opens_both_sqlite_stores_on_a_group_volume(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    os.chown(volume, -1, os.getegid())
    volume.chmod(0o2770)  # as kubelet provisions an fsGroup volume
    path = _write(tmp_path, _minimal(store={"sqlitePath": "volume/store.sqlite"}))
    strict = load_settings(path, {})
    with pytest.raises(RetrievalError) as excinfo:
        build_vector_store(strict, {})
    assert excinfo.value.code is ErrorCode.UNSAFE_STORE
    assert excinfo.value.reason == "writable-by-others"

    trusting = load_settings(path, {"RETRIEVAL_HOST_STORE__TRUST_OWN_GROUP": "true"})
    assert trusting.store.trust_own_group
    build_vector_store(trusting, {}).close()
    runs = build_run_store(trusting, {})
    assert isinstance(runs, SqliteRunStore)
    runs.close()
    assert (volume / "store.sqlite").exists() and (volume / "runs.db").exists()


def test_index_snapshots_are_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = _write(tmp_path, _minimal(store={"sqlitePath": "store.sqlite"}))
    for environ, written in (
        ({}, True),
        ({"RETRIEVAL_HOST_STORE__INDEX_SNAPSHOTS": "false"}, False),
    ):
        for leftover in tmp_path.glob("store.sqlite*"):
            leftover.unlink()
        settings = load_settings(path, environ)
        assert settings.store.index_snapshots is written
        store = build_vector_store(settings, {})
        store.open_corpus(descriptor("c1"))
        source, chunks = revision("a", "r1", unit_vectors(np.random.default_rng(1), 2))
        store.replace_source("c1", "ns", source, chunks, expected_revision=None, limits=LIMITS)
        store.close()
        assert snapshot_path(tmp_path / "store.sqlite", "c1").exists() is written


def test_the_run_lease_reaches_the_run_store_within_its_bounds(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = _write(tmp_path, _minimal(store={"sqlitePath": "store.sqlite"}))
    assert load_settings(path, {}).runs.lease_s == 60.0
    settings = load_settings(path, {"RETRIEVAL_HOST_RUNS__LEASE_S": "5"})
    store = build_run_store(settings, {})
    assert isinstance(store, SqliteRunStore)
    assert store._leases.lease_s == 5.0
    store.close()
    for refused in ("0.5", "3601"):
        with pytest.raises(SettingsError, match="leaseS"):
            load_settings(path, {"RETRIEVAL_HOST_RUNS__LEASE_S": refused})


def test_approximate_search_threshold_reaches_the_store(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = _write(tmp_path, _minimal(store={"sqlitePath": "store.sqlite"}))
    assert load_settings(path, {}).store.approximate_min_rows == DEFAULT_MIN_ROWS
    for value in ("0", "5000"):
        settings = load_settings(path, {"RETRIEVAL_HOST_STORE__APPROXIMATE_MIN_ROWS": value})
        store = build_vector_store(settings, {})
        assert isinstance(store, SqliteVectorStore)
        assert store._approximate_min_rows == int(value)
        store.close()
    with pytest.raises(SettingsError, match="approximateMinRows"):
        load_settings(path, {"RETRIEVAL_HOST_STORE__APPROXIMATE_MIN_ROWS": "-1"})


def test_tokens_can_come_from_a_mounted_file(tmp_path: Path) -> None:
    listed = [{"sha256": "b" * 64, "subject": "ops", "retrieval": {"search": ["library"]}}]
    (tmp_path / "tokens.json").write_text(json.dumps(listed))
    inline = {"sha256": HASH, "subject": "app"}
    path = _write(tmp_path, _minimal(tokens=[inline], tokensFile="tokens.json"))
    settings = load_settings(path, {})
    assert [t.subject for t in settings.tokens] == ["app", "ops"]
    assert settings.tokens[1].retrieval.search == ("library",)

    (tmp_path / "tokens.json").write_text(json.dumps([{**inline, "subject": "twin"}]))
    with pytest.raises(SettingsError, match="two tokens share one sha256"):
        load_settings(path, {})
    (tmp_path / "tokens.json").write_text('{"sha256": "x"}')
    with pytest.raises(SettingsError, match="JSON list"):
        load_settings(path, {})
    # A bad entry is named by the file and its place there, never by a variable that set
    # `tokens` (probe V: "tokens.1.subject (from RETRIEVAL_HOST_TOKENS)").
    (tmp_path / "tokens.json").write_text(json.dumps([{**listed[0], "subject": " eve"}]))
    env = {"RETRIEVAL_HOST_TOKENS": json.dumps([inline])}
    with pytest.raises(SettingsError) as refused:
        load_settings(path, env)
    said = str(refused.value)
    assert f"tokensFile {tmp_path / 'tokens.json'}, entry 0: subject: " in said, said
    assert "RETRIEVAL_HOST_TOKENS" not in said
    (tmp_path / "tokens.json").unlink()
    with pytest.raises(SettingsError, match="cannot read tokensFile"):
        load_settings(path, {})
    (tmp_path / "mounted.json").write_text(json.dumps(listed))
    overridden = load_settings(
        _write(tmp_path, _minimal()), {"RETRIEVAL_HOST_TOKENS_FILE": str(tmp_path / "mounted.json")}
    )
    assert [t.subject for t in overridden.tokens] == ["ops"]


def test_search_threads_are_a_number_or_cores(tmp_path: Path) -> None:
    path = _write(tmp_path, _minimal())
    assert load_settings(path, {}).limits.search_threads is None  # searches share the pool
    assert search_threads(None) is None
    for value, threads in (("2", 2), ("cores", len(os.sched_getaffinity(0)))):
        settings = load_settings(path, {"RETRIEVAL_HOST_LIMITS__SEARCH_THREADS": value})
        assert search_threads(settings.limits.search_threads) == threads
    for bad in ("0", "all"):
        with pytest.raises(SettingsError, match="searchThreads"):
            load_settings(path, {"RETRIEVAL_HOST_LIMITS__SEARCH_THREADS": bad})


def test_the_inline_search_budget_is_off_by_default_and_bounded(tmp_path: Path) -> None:
    path = _write(tmp_path, _minimal(limits={"searchThreads": 1}))
    assert load_settings(path, {}).limits.inline_search_ms == 0
    for value, budget in (("0", 0.0), ("2.5", 2.5), ("1000", 1000.0)):
        settings = load_settings(path, {"RETRIEVAL_HOST_LIMITS__INLINE_SEARCH_MS": value})
        assert settings.limits.inline_search_ms == budget
    for bad in ("-1", "1000.5", "fast"):
        with pytest.raises(SettingsError, match="inlineSearchMs"):
            load_settings(path, {"RETRIEVAL_HOST_LIMITS__INLINE_SEARCH_MS": bad})


def test_an_inline_search_budget_needs_search_threads_and_a_sqlite_store(
    tmp_path: Path,
) -> None:
    # Either way it would do nothing or hold every request up: refused at load, by name.
    alone = _write(tmp_path, _minimal(limits={"inlineSearchMs": 2}))
    with pytest.raises(SettingsError, match="inlineSearchMs needs searchThreads"):
        load_settings(alone, {})
    assert load_settings(alone, {"RETRIEVAL_HOST_LIMITS__INLINE_SEARCH_MS": "0"})
    pg = _minimal(
        limits={"searchThreads": 1, "inlineSearchMs": 2}, store={"postgresDsn": {"env": "DSN"}}
    )
    with pytest.raises(SettingsError, match=r"inlineSearchMs .*PostgreSQL"):
        load_settings(_write(tmp_path, pg), {"DSN": "postgresql://x"})
    sqlite = _minimal(
        limits={"searchThreads": 1, "inlineSearchMs": 2}, store={"sqlitePath": "s.sqlite"}
    )
    assert load_settings(_write(tmp_path, sqlite), {}).limits.inline_search_ms == 2


@pytest.mark.parametrize(
    ("section", "name", "value"),
    [
        ("limits", "maxConcurrency", True),
        ("limits", "maxConcurrency", "16"),
        ("limits", "headerTimeoutS", False),
        ("limits", "headerTimeoutS", "2.5"),
        ("runs", "leaseS", True),
        ("listen", "port", "8443"),
        ("limits", "searchThreads", True),
    ],
)
def test_a_numeric_setting_takes_a_json_number_not_a_boolean_or_a_string(
    tmp_path: Path, section: str, name: str, value: object
) -> None:
    data = _minimal()
    data[section] = {**data.get(section, {}), name: value}
    with pytest.raises(SettingsError, match=name):
        load_settings(_write(tmp_path, data), {})


def test_a_numeric_setting_from_the_environment_is_parsed_as_json_first(tmp_path: Path) -> None:
    path = _write(tmp_path, _minimal())
    environ = {"RETRIEVAL_HOST_LIMITS__MAX_CONCURRENCY": "7", "RETRIEVAL_HOST_RUNS__LEASE_S": "2"}
    settings = load_settings(path, environ)
    assert settings.limits.max_concurrency == 7
    assert settings.runs.lease_s == 2.0  # an integer where a float is asked is a number too
    with pytest.raises(SettingsError, match="maxConcurrency"):
        load_settings(path, {"RETRIEVAL_HOST_LIMITS__MAX_CONCURRENCY": "true"})


def test_providers_without_an_application_are_reported_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from retrieval_host.serving.factory import build_driver

    with_providers = load_settings(
        _write(tmp_path, _minimal(providers={"local": {"kind": "extractive"}})), {}
    )
    with caplog.at_level("WARNING", logger="retrieval_host.serving"):
        assert build_driver(with_providers, {}) is None
    assert "no application is configured" in caplog.text
    caplog.clear()
    bare = load_settings(_write(tmp_path, _minimal()), {})
    with caplog.at_level("WARNING", logger="retrieval_host.serving"):
        assert build_driver(bare, {}) is None
    assert caplog.text == ""  # discovery only, as asked: nothing to warn about


@pytest.mark.parametrize(
    ("content", "reason"), [(None, "No such file"), (b"not a pem\n", "CERTIFICATE")]
)
def test_a_provider_ca_file_that_cannot_be_used_is_one_settings_error(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    """A missing or non-PEM `caFile` crashed `serve` with a traceback and exit 1."""
    from retrieval_host.adapters.wiring import build_providers

    if content is not None:
        (tmp_path / "ca.pem").write_bytes(content)
    provider = {"kind": "openai", "baseUrl": "https://models.example.test/v1", "caFile": "ca.pem"}
    settings = load_settings(_write(tmp_path, _minimal(providers={"hosted": provider})), {})
    with pytest.raises(
        SettingsError, match=f"caFile: cannot use .*ca.pem as a CA bundle: .*{reason}"
    ):
        build_providers(settings, {})


def test_a_key_is_sent_over_plain_http_only_to_loopback_or_when_allowed(tmp_path: Path) -> None:
    """An `openai` provider at `http://` on another machine was accepted: its key would travel
    in clear (a black-box test); the client already refused exactly that."""
    from retrieval_host.adapters.wiring import build_providers, build_reranker

    (tmp_path / "key").write_text("sk-test\n")
    key = {"file": "key"}

    def providers(base_url: str, **extra: object) -> Mapping[str, object]:
        provider = {"kind": "openai", "baseUrl": base_url, "apiKey": key, **extra}
        return build_providers(
            load_settings(_write(tmp_path, _minimal(providers={"hosted": provider})), {}), {}
        )

    with pytest.raises(SettingsError, match=r"baseUrl: http://10\.1\.2\.3 would receive the API"):
        providers("http://10.1.2.3:8000/v1")
    for url in ("https://10.1.2.3/v1", "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1"):
        assert set(providers(url)) == {"hosted"}
    assert set(providers("http://10.1.2.3:8000/v1", allowPlainHttp=True)) == {"hosted"}
    # Without a key nothing secret travels.
    bare = {"kind": "openai", "baseUrl": "http://10.1.2.3/v1"}
    settings = load_settings(_write(tmp_path, _minimal(providers={"hosted": bare})), {})
    assert set(build_providers(settings, {})) == {"hosted"}
    # The reranker's key, the same way.
    settings = load_settings(_write(tmp_path, _minimal()), {})
    reranker = RerankerSettings.model_validate(
        {"baseUrl": "http://rerank.internal/v1", "model": "m", "apiKey": key}
    )
    with pytest.raises(SettingsError, match="would receive the API key in clear"):
        build_reranker(settings, reranker, {})
    allowed = reranker.model_copy(update={"allow_plain_http": True})
    build_reranker(settings, allowed, {}).close()


@pytest.mark.parametrize("content", ["sk-test\n\n", "sk test\n", "\n", "sk-\ttest"])
def test_a_key_no_request_could_send_is_refused_at_start(tmp_path: Path, content: str) -> None:
    # A black-box test: a key file ending in a blank line started a healthy host whose every
    # run then failed `api-key-unavailable`.
    from retrieval_host.adapters.wiring import build_providers

    (tmp_path / "key").write_text(content)
    provider = {"kind": "openai", "baseUrl": "https://llm.example/v1", "apiKey": {"file": "key"}}
    settings = load_settings(_write(tmp_path, _minimal(providers={"hosted": provider})), {})
    with pytest.raises(SettingsError, match=r"apiKey of https://llm\.example/v1: the key is empty"):
        build_providers(settings, {})


@pytest.mark.parametrize(
    ("listen", "workers", "refused"),
    [(9100, 1, True), (9101, 2, True), (9102, 2, False), (9099, 1, False)],
)
def test_metrics_ports_must_not_include_the_listen_port(
    tmp_path: Path, listen: int, workers: int, refused: bool
) -> None:
    """The metrics listener bound first and the host died on its own port (exit 3)."""
    data = _minimal(listen={"port": listen, "workers": workers}, metrics={"port": 9100})
    path = _write(tmp_path, data)
    if refused:
        with pytest.raises(SettingsError, match=r"must not include listen\.port"):
            load_settings(path, {})
    else:
        assert load_settings(path, {}).listen.port == listen


@pytest.mark.parametrize(
    ("store", "stray"),
    [
        ({"sqlitePath": "s.db", "hnsw": True}, "store.hnsw"),
        ({"sqlitePath": "s.db", "efSearch": 400, "postgresSchema": "x"}, "store.efSearch"),
        ({"postgresDsn": {"env": "DSN"}, "indexSnapshots": False}, "store.indexSnapshots"),
        ({"postgresDsn": {"env": "DSN"}, "trustOwnGroup": True}, "store.trustOwnGroup"),
        ({"postgresDsn": {"env": "DSN"}, "approximateMinRows": 5}, "store.approximateMinRows"),
    ],
)
def test_a_key_of_the_other_store_is_refused(
    tmp_path: Path, store: dict[str, Any], stray: str
) -> None:
    """They were accepted and ignored: `hnsw` beside `sqlitePath` looked on (a black-box test)."""
    with pytest.raises(SettingsError, match=f"{stray}.* does not apply beside"):
        load_settings(_write(tmp_path, _minimal(store=store)), {})


def test_the_keys_of_the_store_in_use_are_accepted(tmp_path: Path) -> None:
    pg = {"postgresDsn": {"env": "DSN"}, "postgresSchema": "x", "hnsw": True, "efSearch": 50}
    assert load_settings(_write(tmp_path, _minimal(store=pg)), {}).store.hnsw
    sqlite = {"sqlitePath": "s.db", "trustOwnGroup": True, "approximateMinRows": 0}
    assert load_settings(_write(tmp_path, _minimal(store=sqlite)), {}).store.trust_own_group


@pytest.mark.parametrize(
    ("text", "key"),
    [
        # An edit that left a stale key above its replacement: json kept the last one.
        ('{"logLevel": "info", "behindProxy": true, "logLevel": "debug"}', "logLevel"),
        ('{"behindProxy": true, "listen": {"port": 9443, "host": "::1", "port": 8443}}', "port"),
        (
            '{"behindProxy": true, "store": {"postgresDsn": {"env": "A", "env": "B"}}}',
            "env",
        ),
        ('{"behindProxy": true, "tokens": [{"subject": "a", "subject": "b"}]}', "subject"),
    ],
)
def test_a_configuration_file_with_a_key_twice_is_refused_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    (tmp_path / "host.json").write_text(text)
    with pytest.raises(SettingsError) as refused:
        load_settings(tmp_path / "host.json", {})
    message = str(refused.value)
    assert f'the key "{key}" appears twice' in message and "host.json" in message
    assert "debug" not in message and "8443" not in message  # no value is shown


def test_a_key_twice_in_a_tokens_file_or_an_override_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokens.json").write_text(f'[{{"sha256": "{HASH}", "sha256": "{"b" * 64}"}}]')
    path = _write(tmp_path, _minimal(tokensFile="tokens.json"))
    with pytest.raises(SettingsError, match=r'tokensFile .*the key "sha256" appears twice'):
        load_settings(path, {})
    override = {"RETRIEVAL_HOST_APPLICATION_OPTIONS": '{"aclFile": "a.json", "aclFile": "b"}'}
    with pytest.raises(SettingsError, match='APPLICATION_OPTIONS: the key "aclFile" appears'):
        load_settings(_write(tmp_path, _minimal()), override)

"""Loading the application factory the configuration names (`application`: `module:function`)
and calling it: the one place a host configuration becomes a Driver."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from retrieval_host.core.errors import RetrievalError
from retrieval_host.driver import Driver
from retrieval_host.serving.tls import warn_if_exposed
from retrieval_host.settings import HostSettings, SettingsError

_log = logging.getLogger("retrieval_host.serving")


@contextlib.contextmanager
def _importable(directory: Path) -> Iterator[None]:
    # The config file's directory is importable while the factory loads, so an application
    # module can sit beside its config (appended: it never shadows an installed module).
    added = str(directory) not in sys.path
    if added:
        sys.path.append(str(directory))
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(directory))


def load_factory(
    settings: HostSettings,
) -> Callable[[HostSettings, Mapping[str, str]], Driver] | None:
    """Import the `module:function` named by `application` (None when there is none)."""
    if settings.application is None:
        return None
    module_name, _, attribute = settings.application.partition(":")
    with _importable(settings.config_dir):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (
                module_name == exc.name or module_name.startswith(exc.name + ".")
            ):
                raise  # the application's module exists; an import inside it failed
            raise SettingsError(
                f"application {settings.application}: no module named {exc.name!r} "
                "(next to the configuration file or installed)"
            ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise SettingsError(f"application {settings.application} is not a callable")
    return factory  # type: ignore[no-any-return]


def build_driver(settings: HostSettings, environ: Mapping[str, str]) -> Driver | None:
    """Call the application factory: `factory(settings, environ)` (the environment is passed
    so secrets named in the configuration can be resolved; nothing else reads os.environ)."""
    factory = load_factory(settings)
    if factory is None:
        if settings.providers:
            # The application factory builds the driver that runs use: without one the host
            # serves discovery only, whatever else the file configures.
            _log.warning(
                "no application is configured: providers and runs are ignored and the host "
                "serves discovery only (/v1/protocol lists no capabilities); set `application`"
            )
        return None
    try:
        driver = factory(settings, environ)
    except RetrievalError as exc:
        # A store that refuses to open (unsafe permissions, unreachable, a descriptor that
        # does not match): the reason in one line, not a traceback around it. The driver's
        # own words go with it (callers never see them; the operator starting the host needs
        # "unable to open database file" or the PostgreSQL host and port that refused).
        cause = exc.__cause__
        # One line: libpq's text runs over two ("Connection refused\n\tIs the server running
        # ...", a black-box test).
        words = " ".join(str(cause).split()) if cause is not None else ""
        said = f" ({type(cause).__name__}: {words})" if words else ""
        raise SettingsError(f"application {settings.application}: {exc}{said}") from None
    except SettingsError:
        raise  # the factory's own word on its options, already one line
    except Exception as exc:
        # The application's own failure (a wrong signature, its bug): the host cannot start
        # with it, so exit 2 like any configuration it cannot use (it was a traceback and
        # exit 1, which means "a worker died"); the traceback goes to the log, at error.
        _log.error("the application factory %s failed", settings.application, exc_info=True)
        raise SettingsError(
            f"application {settings.application}: the factory raised {type(exc).__name__} "
            "(its traceback is in the log above)"
        ) from None
    if not isinstance(driver, Driver):
        raise SettingsError(f"application {settings.application} did not return a Driver")
    return driver


def warn_of_idle_grants(settings: HostSettings, driver: Driver | None) -> None:
    """Log each token grant naming a provider or corpus this host does not have: it grants
    nothing (a typo fails closed), and a host started so said nothing (a black-box test)."""
    corpora = set(driver.retrieval.corpora) if driver is not None else set()
    for token in settings.tokens:
        named = [("provider", name, name in settings.providers) for name in token.providers]
        for operation in ("search", "index", "delete"):
            named += [
                (f"{operation} corpus", corpus, corpus in corpora)
                for corpus in getattr(token.retrieval, operation)
            ]
        for what, name, known in named:
            if not known:
                _log.warning(
                    "a token of subject %r is granted the %s %r, which this host does not "
                    "have: that grant allows nothing",
                    token.subject,
                    what,
                    name,
                )


def warn_of_exposed_secrets(settings: HostSettings) -> None:
    """Log each secret file (`{"file": PATH}`: the PostgreSQL DSN, the TLS key's password, a
    provider's key, the example application's reranker key) that every user may read, as the
    TLS key itself is (`serving.tls.warn_if_exposed`)."""
    named = [
        ("store.postgresDsn", settings.store.postgres_dsn),
        ("tls.keyPassword", settings.tls.key_password if settings.tls is not None else None),
        *(
            (f"providers.{n}.apiKey", getattr(p, "api_key", None))
            for n, p in settings.providers.items()
        ),
    ]
    files = [(field, s.file) for field, s in named if s is not None and s.file is not None]
    # The example application's reranker key, in its free-form options (probe V).
    reranker = settings.application_options.get("reranker")
    key = reranker.get("apiKey") if isinstance(reranker, dict) else None
    file = key.get("file") if isinstance(key, dict) else None
    if isinstance(file, str):
        files.append(("applicationOptions.reranker.apiKey", Path(file)))
    for field, named_file in files:
        warn_if_exposed(f"{field} file", settings.path(named_file))


def close_driver(driver: Driver | None) -> None:
    """Close what the factory opened (stores, run records, providers)."""
    if driver is not None:
        driver.close()

"""What the parse workers' fork server loads before it forks a worker (`ingest.isolation`).

`ParsePool` names this module as the fork server's only preload, and starts the fork server
when the pool starts. Every worker is a fork of that process, so it runs the code the fork
server read then, whatever has changed on disk since. Probe I, session 42: after a new release
was written into the venv under a running host (deploy/README, "Upgrading", step 2), each new
worker re-read the host's code from disk, failed at import on a mix of old and new modules,
and every later ingest was refused as the document's fault until a restart. So this module

- imports the worker (`ingest.isolation`, which imports every parser) and then the modules the
  parsers import on first use rather than at import: pypdf imports its filters, codecs, XMP
  reader and crypto providers inside functions, and fontTools' CFF reader to read a font;
- keeps a worker from running the host's `__main__` again. multiprocessing prepares each child
  of a fork server as a spawned process: it executes the parent's main script (or module) once
  more, as `__mp_main__`, from disk. `retrieval-host`'s script imports the whole package; an
  application's script that embeds the host (`examples/in_process.py`) does whatever it does
  at import. A worker needs nothing from `__main__` (its target, arguments and tasks are
  classes of importable modules; `counter_recipe` keeps a recipe of a script out), so for
  processes named `WORKER_NAME` the preparation leaves it out.

Why not the preload `'__main__'` that multiprocessing offers: up to CPython 3.13.7 the fork
server never receives the main path (a key renamed in 2013, python/cpython#126631), so
children still run the script; where it works, it runs the host's script in the fork server.
Why a hook on `multiprocessing.spawn.prepare` installed here: only a fork server's children call
it, as they start, so the host's own state is never touched (no swap of `sys.modules` under
its threads), and children of the same fork server that other code starts keep their
`__main__`. Not loaded here: a counter recipe's module (`adapters.embedding_local` imports
onnxruntime, which starts threads at import, and a fork server must stay single-threaded);
a worker imports it with its first task, and a failure there is answered as the host's
(`HOST_BUSY` / `parse-worker-unavailable`), not the document's.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from collections.abc import Mapping
from multiprocessing import spawn
from typing import Any, Final

from retrieval_host.ingest.isolation import WORKER_NAME

# Packages whose modules the parsers may import on first use: every module of each.
LAZY_PACKAGES: Final = (
    "retrieval_host.ingest",
    "pypdf",
    "bs4",
    "charset_normalizer",
    "webencodings",
)
# Modules of packages too large to load whole that the parsers import on first use.
LAZY_MODULES: Final = ("fontTools.cffLib", "_strptime")
# What makes `prepare` execute the parent's `__main__` (`multiprocessing.spawn`).
_MAIN_KEYS: Final = frozenset({"init_main_from_path", "init_main_from_name"})


def _import_lazy_modules() -> None:
    names = list(LAZY_MODULES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fork server's stderr is the host's log stream
        for package in LAZY_PACKAGES:
            path = importlib.import_module(package).__path__
            names += (
                info.name
                for info in pkgutil.walk_packages(path, f"{package}.", onerror=lambda _: None)
                if not info.name.endswith(".__main__")
            )
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: S112 - an optional backend (pycryptodome, lxml) that is
                continue  # not installed; anything else is imported on first use, as before


_prepare = spawn.prepare


def _prepare_without_main(data: Mapping[str, Any]) -> None:
    if data.get("name") == WORKER_NAME:
        data = {key: value for key, value in data.items() if key not in _MAIN_KEYS}
    _prepare(data)


_import_lazy_modules()
setattr(spawn, "prepare", _prepare_without_main)  # noqa: B010 - typeshed: not assignable

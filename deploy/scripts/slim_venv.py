"""Build time only (the Dockerfile's build stage): leave in the image's venv what the host runs.

    /opt/retrieval-host/bin/python -I slim_venv.py /opt/retrieval-host

1. Imports every module of `retrieval_host` and `retrieval_host_client` (and the server modules
   uvicorn loads by name), so that what the host can import is known.
2. Uninstalls, with pip, the distributions the host never imports: setuptools (old, and only
   needed to build packages) and the Hugging Face download client that `tokenizers` declares,
   with what only it requires (the model file is in the image and nothing is downloaded at run
   time). Stops the build if one of them turned out to be imported.
3. Deletes the test suites that packages ship inside themselves (`tests` directories from which
   nothing was imported).
4. Strips the symbol tables from the extension modules (`strip --strip-unneeded`; the
   libraries auditwheel vendored under `*.libs/` are left alone), and deletes onnxruntime's
   C-API library, which its Python module does not link (it carries the runtime itself; the
   ELF dependencies are checked before the file goes).
5. Byte-compiles exactly the imported modules (unchecked-hash .pyc: the image never changes), so
   a start reads compiled code, and nothing else: a module imported later compiles in memory.

Prints the megabytes each step saved.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

# The Hugging Face client and what only it needs (the model is in the image), and setuptools.
UNUSED = (
    "setuptools",
    "huggingface-hub",
    "hf-xet",
    "fsspec",
    "filelock",
    "httpx2",
    "httpcore2",
    "truststore",
)
# Imported by name at run time: by uvicorn from a string at start (its loop, HTTP protocol and
# lifespan), and by the store when it first needs it.
LOADED_BY_NAME = (
    "uvicorn.loops.auto",
    "uvicorn.loops.uvloop",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.lifespan.on",
    # The SQLite store's approximate search graphs, loaded when the first one is built (after
    # onnxruntime, which the host modules above import: see `approximate.usearch_index`).
    "usearch.index",
)


def _megabytes(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def _import_everything() -> None:
    for package_name in ("retrieval_host", "retrieval_host_client"):
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if not module.name.endswith(".__main__"):
                importlib.import_module(module.name)
    for name in LOADED_BY_NAME:
        importlib.import_module(name)


def _imported_files(site_packages: Path) -> set[Path]:
    files = set()
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)
        if origin and origin.endswith(".py"):
            path = Path(origin).resolve()
            if path.is_relative_to(site_packages) and path.is_file():
                files.add(path)
    return files


def _top_level_names(distribution: str) -> set[str]:
    files = importlib.metadata.distribution(distribution).files or []
    return {f.parts[0].removesuffix(".py") for f in files if not f.parts[0].endswith(".dist-info")}


def main(venv: Path) -> None:
    site_packages = next(venv.glob("lib/python3*/site-packages")).resolve()
    before = _megabytes(venv)
    _import_everything()
    imported_top = {name.partition(".")[0] for name in sys.modules}

    installed = [d for d in UNUSED if _installed(d)]
    for distribution in installed:
        used = _top_level_names(distribution) & imported_top - {"_distutils_hack"}
        if used:
            sys.exit(f"slim_venv: {distribution} is imported by the host ({sorted(used)})")
    if installed:
        subprocess.run(
            [str(venv / "bin/python"), "-m", "pip", "uninstall", "--yes", "--quiet", *installed],
            check=True,
        )
    after_uninstall = _megabytes(venv)

    imported = _imported_files(site_packages)
    for tests in sorted(site_packages.glob("*/**/tests")):
        if tests.is_dir() and not any(f.is_relative_to(tests) for f in imported):
            shutil.rmtree(tests)
    after_tests = _megabytes(venv)

    _strip_extension_modules(site_packages)
    _drop_unlinked_onnxruntime_library(site_packages)
    after_binaries = _megabytes(venv)

    for cache in list(site_packages.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    for source in sorted(imported):
        py_compile.compile(
            str(source),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
    after = _megabytes(venv)
    print(
        f"slim_venv: {before:.0f} MB -> {after:.0f} MB (uninstalled {', '.join(installed)}:"
        f" {before - after_uninstall:.0f} MB; test suites: {after_uninstall - after_tests:.0f}"
        f" MB; binaries: {after_tests - after_binaries:.0f} MB;"
        f" {len(imported)} imported modules compiled)"
    )


def _strip_extension_modules(site_packages: Path) -> None:
    modules = [
        p
        for pattern in ("*.cpython-*.so", "*.abi3.so")
        for p in site_packages.rglob(pattern)
        if not any(part.endswith(".libs") for part in p.relative_to(site_packages).parts)
    ]
    subprocess.run(["strip", "--strip-unneeded", *map(str, sorted(modules))], check=True)


def _drop_unlinked_onnxruntime_library(site_packages: Path) -> None:
    capi = site_packages / "onnxruntime" / "capi"
    (module,) = capi.glob("onnxruntime_pybind11_state*.so")
    dynamic = subprocess.run(
        ["readelf", "--dynamic", str(module)], check=True, capture_output=True, text=True
    ).stdout
    if "libonnxruntime" in dynamic:
        return  # this build links it: keep it
    for library in capi.glob("libonnxruntime.so*"):
        library.unlink()


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main(Path(sys.argv[1]))

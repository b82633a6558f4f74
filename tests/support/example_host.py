"""The quickstart's application (`example_acl:create_driver`) on SQLite in a private state
directory, configured but never served: for tests that build its driver in-process."""

from __future__ import annotations

import json
from pathlib import Path

from retrieval_host.example_acl import acl_file_content
from retrieval_host.settings import HostSettings, load_settings


def example_settings(tmp_path: Path, **options: object) -> HostSettings:
    """Its settings, `options` laid over `{"aclFile": "acl.json"}` (alice in team)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "acl.json").write_text(json.dumps(acl_file_content("alice", "team")))
    config = state / "host.json"
    config.write_text(
        json.dumps(
            {
                "listen": {"host": "127.0.0.1", "port": 8443},
                "behindProxy": True,  # never served here: no certificate needed
                "store": {"sqlitePath": "store/retrieval.sqlite"},
                "application": "retrieval_host.example_acl:create_driver",
                "applicationOptions": {"aclFile": "acl.json", **options},
            }
        )
    )
    return load_settings(config, {})

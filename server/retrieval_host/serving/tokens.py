"""Bearer tokens: a fresh token and its entry in the host configuration (only its hash)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Final

from retrieval_host.http.auth import token_sha256

TOKEN_PREFIX: Final = "rh_"  # noqa: S105 - a prefix, not a secret


def new_token() -> str:
    """A fresh bearer token: 256 random bits, URL-safe, with a recognisable prefix."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_config_entry(
    token: str,
    subject: str,
    *,
    search: Sequence[str] = (),
    index: Sequence[str] = (),
    delete: Sequence[str] = (),
    providers: Sequence[str] = (),
    metrics: bool = False,
) -> dict[str, object]:
    """The `tokens` entry of the host configuration for a token (its hash, never the token)."""
    entry: dict[str, object] = {
        "sha256": token_sha256(token),
        "subject": subject,
        "providers": list(providers),
        "retrieval": {"search": list(search), "index": list(index), "delete": list(delete)},
    }
    if metrics:
        entry["metrics"] = True
    return entry

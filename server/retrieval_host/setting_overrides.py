"""`RETRIEVAL_HOST_<FIELD>[__<FIELD>...]` environment overrides, applied to the configuration
file's JSON before it is validated (`settings.load_settings`)."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel

from retrieval_host.unique_json import DuplicateKeyError, load_unique_json

__all__ = ["CLIENT_VARIABLES", "apply_override"]


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def apply_override(
    data: dict[str, Any], model: type[BaseModel], path: list[str], raw: str, variable: str
) -> str:
    """Set the field of `model` that `path` names (snake or camel case, any case) in `data`
    from `raw`: its JSON value, or the string itself if it is not JSON. Returns the field's
    location as validation errors spell it; ValueError when no field has that name."""
    fields = {_norm(name): (name, info) for name, info in model.model_fields.items()}
    key = _norm(path[0])
    if key not in fields:
        raise ValueError(f"unknown setting {variable}")
    name, info = fields[key]
    alias = info.alias or name
    if len(path) == 1:
        try:
            data[alias] = load_unique_json(raw)
        except DuplicateKeyError as exc:
            raise ValueError(f"setting {variable}: {exc}") from None
        except ValueError:
            data[alias] = raw
        return alias
    nested = info.annotation
    # Optional nested models (`tls`) are declared as `X | None`: find the model class.
    candidates = [nested, *getattr(nested, "__args__", ())]
    sub = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if sub is None:
        raise ValueError(f"setting {variable}: {path[0]} has no nested fields")
    current = data.get(alias)
    if current is None:
        current = data.get(name)
    target: dict[str, Any] = dict(current) if isinstance(current, dict) else {}
    inner = apply_override(target, sub, path[1:], raw, variable)
    data.pop(name, None)
    data[alias] = target
    return f"{alias}.{inner}"


# Variables with the prefix that are no host setting: the client's token and the inspection
# commands' address (`retrieval-host corpora|sources`), and the extra certificate names of
# `quickstart --container`.
CLIENT_VARIABLES: Final = frozenset(
    {"RETRIEVAL_HOST_TOKEN", "RETRIEVAL_HOST_URL", "RETRIEVAL_HOST_TLS_NAMES"}
)

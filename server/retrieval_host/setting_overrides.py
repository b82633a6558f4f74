"""`RETRIEVAL_HOST_<FIELD>[__<FIELD>...]` environment overrides, applied to the configuration
file's JSON before it is validated (`settings.load_settings`)."""

from __future__ import annotations

import json
import types
from typing import Any, Final, Union, get_args, get_origin

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
    nested = info.annotation
    # Optional nested models (`tls`) are declared as `X | None`: find the model class.
    candidates = [nested, *getattr(nested, "__args__", ())]
    sub = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if len(path) == 1:
        try:
            value: Any = load_unique_json(raw)
        except DuplicateKeyError as exc:
            raise ValueError(f"setting {variable}: {exc}") from None
        except ValueError:
            value = raw
        if not (isinstance(value, dict) and _settings_object(nested)):
            data[alias] = value
            return alias
        # A settings object (`limits`, `listen`, ...) given whole is merged key by key, each
        # key as its own `__KEY` override: `RETRIEVAL_HOST_LIMITS='{"maxConcurrency": 8}'`
        # dropped the file's other limits (probe D, session 37). The free-form objects
        # (`applicationOptions`, `providers`, `tokens`) are no model: replaced whole.
        for inner_key, inner_value in value.items():
            apply_override(
                data,
                model,
                [path[0], inner_key],
                json.dumps(inner_value),
                f"{variable} {inner_key!r}",
            )
        return alias
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


def _settings_object(annotation: Any) -> bool:
    """Whether a field holds one settings model (`X`, `X | None`), not a free-form mapping
    nor a model that is one value (`SecretRef`: `replaced_whole`)."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    return any(
        isinstance(arg, type)
        and issubclass(arg, BaseModel)
        and not getattr(arg, "replaced_whole", False)
        for arg in (annotation, *args)
    )


# Variables with the prefix that are no host setting: the client's token and the inspection
# commands' address (`retrieval-host corpora|sources`), and the extra certificate names of
# `quickstart --container`.
CLIENT_VARIABLES: Final = frozenset(
    {"RETRIEVAL_HOST_TOKEN", "RETRIEVAL_HOST_URL", "RETRIEVAL_HOST_TLS_NAMES"}
)

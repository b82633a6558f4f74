"""Requests that could be read two ways are refused, never guessed at.

Each rule answers 400 `INVALID_REQUEST` with its own `reason`:

- `duplicate-authorization`: two `Authorization` headers (which one is the caller?);
- `invalid-utf8`: a query parameter that is not UTF-8 once percent-decoded (decoding with
  replacement would make two different source ids one);
- `duplicate-parameter`: a query parameter given twice;
- `duplicate-key`: a JSON object with a key twice, at any depth (JSON parsers disagree on
  which one wins).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_origin
from urllib.parse import unquote_to_bytes

from pydantic import BaseModel

from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import InvalidRequestReason

__all__ = [
    "InvalidRequest",
    "KeyNames",
    "authorization_header",
    "check_unique_keys",
    "key_names",
    "no_query_params",
    "query_pairs",
    "refuse_non_json_constants",
    "utf8_query_params",
]


class InvalidRequest(RetrievalError):
    """A malformed request; `status` is 400 for one that cannot be read unambiguously (not
    JSON, a repeated key, header or parameter, not UTF-8), 422 for a wrong shape."""

    def __init__(self, detail: str, status: int = 422, reason: str | None = None) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, detail, reason=reason)
        self._status = status

    @property
    def status(self) -> int:
        return self._status


def authorization_header(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The one `Authorization` header of an ASGI request (names arrive lower-cased), or None."""
    found: bytes | None = None
    for name, value in headers:
        if name == b"authorization":
            if found is not None:
                raise InvalidRequest(
                    "Send one Authorization header.", status=400, reason="duplicate-authorization"
                )
            found = value
    return None if found is None else found.decode("latin-1")


def query_pairs(query_string: bytes) -> list[tuple[bytes, bytes]]:
    """Name/value pairs, percent-decoded with `+` as a space, as bytes (nothing is lost)."""
    pairs = []
    for part in query_string.split(b"&"):
        if not part:
            continue
        name, _, value = part.replace(b"+", b" ").partition(b"=")
        pairs.append((unquote_to_bytes(name), unquote_to_bytes(value)))
    return pairs


def utf8_query_params(query_string: bytes) -> dict[str, str]:
    """The query parameters as text: each name once, names and values UTF-8."""
    params: dict[str, str] = {}
    for raw_name, raw_value in query_pairs(query_string):
        try:
            name, value = raw_name.decode("utf-8"), raw_value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(
                "Query parameters must be UTF-8 once percent-decoded.",
                status=400,
                reason="invalid-utf8",
            ) from None
        if name in params:
            raise InvalidRequest(
                "Each query parameter may appear once.", status=400, reason="duplicate-parameter"
            )
        params[name] = value
    return params


@dataclass(frozen=True, slots=True)
class KeyNames:
    """The object keys a request model can hold, as they appear quoted in JSON text."""

    fixed: tuple[bytes, ...]  # field names (wire aliases) of the model and its nested models
    free: tuple[bytes, ...]  # fields that hold free-form objects (filters, metadata)

    def rule_out_duplicates(self, raw: bytes) -> bool:
        """True when `raw`, a document the model accepted, certainly repeats no key.

        The model forbids unknown keys, so every key is one of `fixed` or sits in a free-form
        object. Without a backslash a key has one spelling, so a key repeated in any object
        shows as its quoted name twice in the text; a free-form object could repeat any key.
        A few `bytes.count` calls (about 1 us for a search body, less than validating it): the
        search hot path never parses a body twice.
        """
        # Plain loops: generator expressions cost more than the searches themselves here.
        if b"\\" in raw:
            return False
        for name in self.free:
            if name in raw:
                return False
        for name in self.fixed:  # noqa: SIM110 (measured: the loop is cheaper than all())
            if raw.count(name) > 1:
                return False
        return True


@functools.cache
def key_names(model: type[BaseModel]) -> KeyNames:
    """The `KeyNames` of a request model (computed once per model)."""
    fixed: set[bytes] = set()
    free: set[bytes] = set()

    def walk_model(m: type[BaseModel]) -> None:
        for name, field in m.model_fields.items():
            quoted = json.dumps(field.alias or name).encode()
            fixed.add(quoted)
            walk_type(field.annotation, quoted)

    def walk_type(annotation: Any, quoted: bytes) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            walk_model(annotation)
            return
        origin = get_origin(annotation)
        if origin is dict or (isinstance(origin, type) and issubclass(origin, Mapping)):
            free.add(quoted)
        for arg in get_args(annotation):
            walk_type(arg, quoted)

    walk_model(model)
    return KeyNames(tuple(sorted(fixed)), tuple(sorted(free)))


def check_unique_keys(raw: bytes) -> None:
    """Refuse a JSON document in which some object holds a key twice, at any depth.

    Parses the document (C scanner, a hook per object): callers first ask
    `KeyNames.rule_out_duplicates`, which settles the common case without parsing. A
    document that is not JSON passes here; the model's parser reports it.
    """
    try:
        json.loads(raw, object_pairs_hook=_unique_object)
    except _DuplicateKey:
        raise InvalidRequest(
            "Each key of a JSON object may appear once.", status=400, reason="duplicate-key"
        ) from None
    except RecursionError:
        # Deeper than the interpreter's stack allows (~1,000 levels); the model's parser
        # refuses past ~200 first, so this answers the same as it does.
        raise InvalidRequest(
            "The JSON document nests too deeply.",
            status=400,
            reason=InvalidRequestReason.JSON_DEPTH,
        ) from None
    except ValueError:
        return  # not JSON (or not UTF-8): the model's own parser says so, with its status


def refuse_non_json_constants(raw: bytes) -> None:
    """Refuse `NaN`, `Infinity` and `-Infinity` outside strings: the model's parser reads
    them as numbers, but they are not JSON (RFC 8259), so such a body is malformed (400), not
    a body with a wrong value (422). A byte search first: only a body naming one is parsed."""
    if b"NaN" not in raw and b"Infinity" not in raw:
        return
    try:
        json.loads(raw, parse_constant=_not_json)
    except _NotJson:
        raise InvalidRequest(
            "The body is not valid JSON (NaN and Infinity are not JSON numbers).", status=400
        ) from None
    except ValueError:
        return  # not JSON for another reason: the model's own parser says so


class _NotJson(Exception):
    pass


def _not_json(constant: str) -> object:
    raise _NotJson(constant)


class _DuplicateKey(Exception):
    pass


def _unique_object(pairs: Sequence[tuple[str, object]]) -> None:
    # Nothing is kept: only the check matters, and a dict per object would cost ~100 bytes
    # for each (a body of empty objects would make several times its size in dicts).
    if len({key for key, _ in pairs}) != len(pairs):
        raise _DuplicateKey


def no_query_params(query_string: bytes) -> None:
    """A GET route that reads no parameter refuses one (422), as the others refuse a name they
    do not know: `/v1/corpora?limit=5` answered every corpus, silently (probe A, session 37)."""
    if utf8_query_params(query_string):
        raise InvalidRequest("This route takes no query parameters.")

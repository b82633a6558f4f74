"""Every public error `reason` is a member of its code's enum in `core.reasons`, and every member
is emitted somewhere.

The product's reasons are derived from its source with `ast`: `reason=` keyword arguments of
error constructors (`RetrievalError(ErrorCode.X, ..., reason=...)` and subclasses such as
`InvalidRequest`); the reason arguments of factories, found as functions that pass one of
their parameters on as `reason=` with a fixed code (`too_large`, `_fail`, `_unsafe`, ...) or a
code that is also a parameter (batch ingest's per-file `_failed`), wherever they are called
from; and `(code, detail, reason)` triples such as a parse worker sends to its parent. A
literal or a member of another code's enum fails; so does a member nobody emits. A reason
passed on from a variable is checked where its literal or member is written.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pytest

import retrieval_host
from retrieval_host.core import reasons as reasons_module
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import REASONS, InvalidRequestReason, reasons_of

PACKAGE = Path(retrieval_host.__file__).parent
ENUMS_BY_NAME: Mapping[str, type[StrEnum]] = {enum.__name__: enum for enum in REASONS.values()}


@dataclass(frozen=True, slots=True)
class Emitted:
    """One reason written at a call site: its code (None when the site does not tell), and
    either a literal or an enum member (`enum` names the member's class)."""

    where: str
    code: ErrorCode | None
    value: str
    enum: str | None


@dataclass(frozen=True, slots=True)
class _Factory:
    code: ErrorCode | None  # None: the code is an argument too, at `code_index`
    index: int  # the reason's position among the call's positional arguments
    keyword: str
    code_index: int = -1


def _sources() -> dict[str, str]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[module] = path.read_text(encoding="utf-8")
    return found


def _code_of_expr(node: ast.expr | None) -> ErrorCode | None:
    """`ErrorCode.X` or `ErrorCode.X.value` as the code, anything else as unknown."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ErrorCode"
    ):
        return ErrorCode[node.attr]
    return None


def _code_of(call: ast.Call) -> ErrorCode | None:
    return _code_of_expr(call.args[0] if call.args else None)


def _code_parameter(call: ast.Call, params: list[str]) -> int:
    """The position among `params` of the parameter a call passes on as its code, or -1."""
    candidates = [kw.value for kw in call.keywords if kw.arg in ("code", "error_code")]
    candidates += call.args[:1]
    for node in candidates:
        if isinstance(node, ast.Name) and node.id in params:
            return params.index(node.id)
    return -1


def _reason_keyword(call: ast.Call) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == "reason"), None)


def _factories(trees: Mapping[str, ast.Module]) -> dict[tuple[str, str], _Factory]:
    """Functions (and classes, by their `__init__`) that build an error of one code from a
    reason parameter, keyed by (module, name)."""
    found: dict[tuple[str, str], _Factory] = {}
    for module, tree in trees.items():
        owners: list[tuple[str, ast.FunctionDef, int]] = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                owners.append((node.name, node, 0))
            elif isinstance(node, ast.ClassDef):
                owners += [
                    (node.name, item, 1)  # skip `self`
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__"
                ]
        for name, function, skip in owners:
            params = [a.arg for a in function.args.posonlyargs + function.args.args][skip:]
            keywords = params + [a.arg for a in function.args.kwonlyargs]
            for call in ast.walk(function):
                value = _reason_keyword(call) if isinstance(call, ast.Call) else None
                if not isinstance(value, ast.Name) or value.id not in keywords:
                    continue
                assert isinstance(call, ast.Call)
                code = _code_of(call)
                code_index = -1 if code is not None else _code_parameter(call, params)
                if code is not None or code_index >= 0:
                    index = params.index(value.id) if value.id in params else -1
                    found[module, name] = _Factory(code, index, value.id, code_index)
    return found


def _imported_names(tree: ast.Module) -> dict[str, tuple[str, str]]:
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def _value(node: ast.expr) -> tuple[str, str | None] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, None
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        enum = ENUMS_BY_NAME.get(node.value.id)
        if enum is not None:
            return str(enum[node.attr]), enum.__name__
    return None  # passed on from a variable: checked where it is written


def emitted_reasons(sources: Mapping[str, str]) -> list[Emitted]:
    """Every reason written at a call site of an error constructor or factory."""
    trees = {module: ast.parse(source) for module, source in sources.items()}
    factories = _factories(trees)
    found = []
    for module, tree in trees.items():
        imported = _imported_names(tree)
        for call in ast.walk(tree):
            if isinstance(call, ast.Tuple) and len(call.elts) >= 2:
                triple_code = _code_of_expr(call.elts[0])
                value = _value(call.elts[-1])
                if triple_code is not None and value is not None:
                    where = f"{module}:{call.lineno}"
                    found.append(Emitted(where, triple_code, value[0], value[1]))
            if not isinstance(call, ast.Call):
                continue
            factory = None
            if isinstance(call.func, ast.Name):
                key = imported.get(call.func.id, (module, call.func.id))
                factory = factories.get(key)
            code = _code_of(call) or (factory.code if factory else None)
            if code is None and factory is not None and 0 <= factory.code_index < len(call.args):
                code = _code_of_expr(call.args[factory.code_index])
            node = _reason_keyword(call)
            if node is None and factory is not None and 0 <= factory.index < len(call.args):
                node = call.args[factory.index]
            if node is None and factory is not None:
                node = next((k.value for k in call.keywords if k.arg == factory.keyword), None)
            value = None if node is None else _value(node)
            if value is not None:
                where = f"{module}:{call.lineno}"
                found.append(Emitted(where, code, value[0], value[1]))
    return found


def _misfits(found: list[Emitted]) -> list[str]:
    misfits = []
    for item in found:
        enum = REASONS.get(item.code) if item.code is not None else None
        if item.code is None:
            misfits.append(f"{item.where}: reason {item.value!r} of an error whose code is unknown")
        elif enum is None:
            misfits.append(f"{item.where}: {item.code} has no reasons, but {item.value!r} is given")
        elif item.value not in {member.value for member in enum}:
            misfits.append(f"{item.where}: {item.value!r} is not a member of {enum.__name__}")
        elif item.enum is not None and item.enum != enum.__name__:
            misfits.append(f"{item.where}: {item.code} given a member of {item.enum}")
    return misfits


@pytest.fixture(scope="module")
def emitted() -> list[Emitted]:
    return emitted_reasons(_sources())


def test_every_reason_the_product_emits_is_a_member_of_its_codes_enum(
    emitted: list[Emitted],
) -> None:
    assert len(emitted) >= 140  # the scan found the call sites, not a fraction of them
    assert _misfits(emitted) == []


def test_every_listed_reason_is_emitted_somewhere(emitted: list[Emitted]) -> None:
    used = {(item.code, item.value) for item in emitted}
    listed = {(code, value) for code in REASONS for value in reasons_of(code)}
    assert sorted(listed - used) == []


def test_call_sites_outside_the_edge_use_the_members_not_literals(
    emitted: list[Emitted],
) -> None:
    inner = ("retrieval_host.core.", "retrieval_host.adapters.", "retrieval_host.wire.")
    literals = [e.where for e in emitted if e.enum is None and e.where.startswith(inner)]
    assert literals == []


def test_the_scan_catches_an_unlisted_reason_a_foreign_member_and_an_unknown_code() -> None:
    source = """
from retrieval_host.core.errors import ErrorCode, RetrievalError
from retrieval_host.core.reasons import HostBusyReason


def _fail(detail, reason):
    return RetrievalError(ErrorCode.EMBEDDING_FAILED, detail, reason=reason)


def _report(name, code, reason):
    return Item(name, error_code=code, reason=reason)


def bad():
    RetrievalError(ErrorCode.HOST_BUSY, "d", reason="very-busy")
    RetrievalError(ErrorCode.INVALID_REQUEST, "d", reason=HostBusyReason.BUSY)
    RetrievalError(ErrorCode.INTERNAL, "d", reason="oops")
    _fail("d", "gone-fishing")
    make(reason="mystery")
    _report("f", ErrorCode.INVALID_REQUEST.value, "unreadable-ish")
    return (ErrorCode.CANCELLED.value, "d", "sigh")


def good():
    _report("f", ErrorCode.INVALID_REQUEST.value, "unreadable")
    return (ErrorCode.HOST_BUSY, "d", HostBusyReason.BUSY.value)
"""
    found = emitted_reasons({"example": source})
    assert {(ErrorCode.INVALID_REQUEST, "unreadable"), (ErrorCode.HOST_BUSY, "busy")} <= {
        (e.code, e.value) for e in found
    }
    misfits = _misfits(found)
    assert len(misfits) == 7
    for expected in ("'very-busy' is not a member of HostBusyReason", "a member of HostBusyReason",
                     "INTERNAL has no reasons", "'gone-fishing' is not a member of Embedding",
                     "'mystery' of an error whose code is unknown",
                     "'unreadable-ish' is not a member of InvalidRequest",
                     "'sigh' is not a member of CancelledReason"):  # fmt: skip
        assert any(expected in misfit for misfit in misfits), expected


def test_reasons_are_kebab_case_unique_per_code_and_only_for_known_codes() -> None:
    assert set(REASONS) <= set(ErrorCode)
    for code, enum in REASONS.items():
        values = reasons_of(code)
        assert len(values) == len(set(values)) >= 1, code
        assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", value) for value in values), code
        assert enum.__name__.endswith("Reason")
    exported = {name for name in reasons_module.__all__ if name.endswith("Reason")}
    assert exported == set(ENUMS_BY_NAME)
    assert reasons_of(ErrorCode.INTERNAL) == ()


def test_a_member_reaches_the_error_as_the_plain_wire_string() -> None:
    error = RetrievalError(
        ErrorCode.INVALID_REQUEST, "d", reason=InvalidRequestReason.IDEMPOTENCY_KEY_REUSED
    )
    assert error.reason == "idempotency-key-reused"
    assert type(error.reason) is str

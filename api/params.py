"""The HTTP apps' side of the contract in ``platform/common/http_contract.py``: derived from it, never restated.

* Request bodies are decoded by msgspec against the contract's Structs (:func:`json_body`, strict: unknown fields
  refused, a JSON ``"5"`` is not an int) and documented by the JSON schema msgspec emits for them
  (:func:`install_bodies` puts it in the app's OpenAPI document).
* Path and query parameters are validated by FastAPI, so they need pydantic annotations: :class:`Declared`
  derives one from a contract type (its ``msgspec.Meta`` constraints and description, mechanically).

A value that breaks a declared constraint is answered with the code its type names (``Meta.extra["error"]``:
TOPIC_ILLEGAL, GROUP_ILLEGAL, QUEUE_ID_ILLEGAL, OFFSET_ILLEGAL, ...; INVALID_ARGUMENT when it names none): for a
parameter :func:`coded` re-types the pydantic error with the code's name and
:func:`sparkmq.api.errors.install_error_handlers` answers that code; for a body :func:`body_error` makes the
error.  Values of the wrong type (a string for an integer), missing and unknown fields stay INVALID_ARGUMENT.
"""
from __future__ import annotations

import enum
import functools
import json
import re
import types
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import Field, GetCoreSchemaHandler, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError, core_schema

from ..platform.common import http_contract as contract
from ..platform.common.errors import ErrorCode, SparkMQError
from ..platform.common.validation import error_code_of
from .errors import amend_openapi

__all__ = [
    "coded",
    "Declared",
    "pydantic_annotation",
    "json_body",
    "decode_body",
    "body_error",
    "install_bodies",
    "TopicName",
    "GroupName",
    "ClientId",
    "QueueId",
    "Offset",
    "EpochMs",
    "NonNegative",
    "WaitMs",
    "PullMax",
    "DlqMax",
    "QueryMax",
    "AlertLimit",
    "DelayMs",
    "DelayLevel",
    "NonEmpty",
    "MsgId",
    "FilterType",
    "ClusterName",
]

S = TypeVar("S", bound=msgspec.Struct)

# The pydantic error types of a broken constraint (as opposed to a wrong type, which stays INVALID_ARGUMENT).
_CONSTRAINT_ERRORS = frozenset({"string_pattern_mismatch", "string_too_short", "string_too_long", "greater_than",
                                "greater_than_equal", "less_than", "less_than_equal", "literal_error", "enum",
                                "too_short", "too_long", "multiple_of"})
# The constraints of a msgspec Meta that pydantic's Field takes under the same names.
_CONSTRAINTS = ("ge", "gt", "le", "lt", "multiple_of", "min_length", "max_length", "pattern")


def coded(code: ErrorCode, rule: str) -> WrapValidator:
    """A validator that answers a broken constraint of the value it wraps as ``code`` (``rule`` says the limit).

    The pydantic error's type becomes ``code.name``; the app's error handler maps it back to ``code``.
    """
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if not any(err["type"] in _CONSTRAINT_ERRORS for err in exc.errors()):
                raise
            raise PydanticCustomError(code.name, "{rule}, got {value}", {"rule": rule, "value": repr(value)[:80]}
                                      ) from None
    return WrapValidator(check)


# -- contract types as pydantic annotations ------------------------------------------------------------------

def _rule(base: Any, limits: dict[str, Any], description: str | None) -> str:
    """The limit in words, for error messages."""
    if base is int and "ge" in limits and "le" in limits:
        bounds = f"an integer in {limits['ge']}..{limits['le']}"
        return f"{bounds} ({description})" if description else bounds
    if description:
        return description
    return ", ".join(f"{name} {value}" for name, value in limits.items())


@functools.cache
def pydantic_annotation(tp: Any) -> Any:
    """The pydantic annotation of the msgspec type ``tp``: the same type with each ``Meta`` constraint as a
    pydantic ``Field`` constraint, its description, a :func:`coded` answer with the type's code, and enums
    accepted by value (strict mode would want instances)."""
    if get_origin(tp) is Annotated:
        base = tp.__origin__
        metas = [m for m in tp.__metadata__ if isinstance(m, msgspec.Meta)]
        limits = {name: getattr(m, name) for m in metas for name in _CONSTRAINTS if getattr(m, name) is not None}
        description = next((m.description for m in reversed(metas) if m.description), None)
        extra: list[Any] = []
        if limits:
            extra += [Field(**limits), coded(error_code_of(tp) or ErrorCode.INVALID_ARGUMENT,
                                             _rule(base, limits, description))]
        if description:
            extra.append(Field(description=description))
        return Annotated[(pydantic_annotation(base), *extra)] if extra else pydantic_annotation(base)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return Union[tuple(pydantic_annotation(a) for a in args)]  # noqa: UP007  # built from a tuple
    if origin is list:
        return list[pydantic_annotation(args[0])]  # type: ignore[misc]
    if origin is dict:
        return dict[pydantic_annotation(args[0]), pydantic_annotation(args[1])]  # type: ignore[misc]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return Annotated[tp, Field(strict=False)]
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        raise TypeError(f"{tp.__name__} is a body: decode it with json_body, not as a parameter")
    return tp


class Declared:
    """Pydantic metadata validating and documenting a value as the contract type ``tp`` says.

    Written after the bare type, which type checkers read: ``Annotated[str, Declared(contract.TopicName)]``
    (construction fails when that type is not the contract type's).
    """

    def __init__(self, tp: Any) -> None:
        self.tp = tp

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        bare = _bare(self.tp)
        if _bare(source) != bare:
            raise TypeError(f"Declared({self.tp}) annotates {bare}, not {source}")
        return handler.generate_schema(pydantic_annotation(self.tp))


def _bare(tp: Any) -> Any:
    """``tp`` without its constraints (``Annotated[int, Meta(...)] | None`` -> ``int | None``)."""
    if get_origin(tp) in (Union, types.UnionType):
        return Union[tuple(_bare(a) for a in get_args(tp))]  # noqa: UP007  # built from a tuple
    return _bare(tp.__origin__) if get_origin(tp) is Annotated else tp


# The parameter types of the apps (each the contract's, in pydantic's terms).
TopicName = Annotated[str, Declared(contract.TopicName)]
GroupName = Annotated[str, Declared(contract.GroupName)]
ClientId = Annotated[str, Declared(contract.ClientId)]
ClusterName = Annotated[str, Declared(contract.ClusterName)]
QueueId = Annotated[int, Declared(contract.QueueId)]
Offset = Annotated[int, Declared(contract.Offset)]
EpochMs = Annotated[int, Declared(contract.EpochMs)]
NonNegative = Annotated[int, Declared(contract.NonNegative)]
WaitMs = Annotated[int, Declared(contract.WaitMs)]
PullMax = Annotated[int, Declared(contract.PullMax)]
DlqMax = Annotated[int, Declared(contract.DlqMax)]
QueryMax = Annotated[int, Declared(contract.QueryMax)]
AlertLimit = Annotated[int, Declared(contract.AlertLimit)]
DelayMs = Annotated[int, Declared(contract.DelayMs)]
DelayLevel = Annotated[int, Declared(contract.DelayLevel)]
NonEmpty = Annotated[str, Declared(contract.NonEmpty)]
MsgId = Annotated[str, Declared(contract.MsgId)]
FilterType = Annotated[str, Declared(contract.FilterType)]


# -- bodies -------------------------------------------------------------------------------------------------

_AT = re.compile(r" - at `(?:(key)` in `)?\$([^`]*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")


def _type_at(kind: Any, path: str, key: bool) -> Any:
    """The declared type of the value at msgspec's error ``path`` (``.offsets[0].queue_id``) under ``kind``; a
    dict's key type with ``key``; None when the path leaves the declared types."""
    tp = kind
    steps = [m.group(1) or m.group(2) for m in _STEP.finditer(path)]
    for step in steps:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            fields = {f.encode_name: f.type for f in msgspec.structs.fields(tp)}
            if step not in fields:
                return None
            tp = fields[step]
        elif get_origin(tp) is list and (step.isdigit()):
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict and step == "...":
            tp = get_args(tp)[1]
        else:
            return None
    if key:
        tp = _unwrap(tp)
        return get_args(tp)[0] if get_origin(tp) is dict else None
    return tp


def _unwrap(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and ``| None``: the container or struct underneath."""
    while True:
        if get_origin(tp) is Annotated:
            tp = tp.__origin__
        elif get_origin(tp) in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


def body_error(kind: type[msgspec.Struct], exc: msgspec.ValidationError) -> SparkMQError:
    """The error for a body msgspec refused as ``kind``: a value of the right type beyond a declared limit is
    answered with its type's code; anything else (a wrong type, a missing or an unknown field) is
    INVALID_ARGUMENT."""
    message = str(exc)
    at = _AT.search(message)
    head = message[:at.start()] if at else message
    if at and head.startswith("Expected `") and ", got `" not in head:  # a limit, not a type
        declared = _type_at(kind, at.group(2), bool(at.group(1)))
        code = error_code_of(declared) if declared is not None else None
        if code is not None:
            return SparkMQError(code, f"{message}: {_describe(declared)}")
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, message)


def _describe(tp: Any) -> str:
    tp = next((a for a in get_args(tp) if a is not type(None)), tp) if get_origin(tp) in (
        Union, types.UnionType) else tp
    metas = [m for m in getattr(tp, "__metadata__", ()) if isinstance(m, msgspec.Meta)]
    return next((m.description for m in reversed(metas) if m.description), "the declared limit")


@functools.cache
def _decoder(kind: type[msgspec.Struct]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind)


def decode_body(kind: type[S], raw: bytes) -> S:
    """``raw`` (a JSON request body) as the contract body ``kind``; :func:`body_error` when it is not one."""
    try:
        return _decoder(kind).decode(raw)
    except msgspec.ValidationError as exc:
        raise body_error(kind, exc) from None
    except msgspec.DecodeError as exc:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, _malformed(raw, exc)) from None


def _malformed(raw: bytes, exc: msgspec.DecodeError) -> str:
    """Where JSON that does not parse breaks, in the words FastAPI's answers used (``malformed JSON at position
    N: ...``); msgspec's own message when Python's reader takes it."""
    try:
        json.loads(raw)
    except (ValueError, UnicodeDecodeError) as bad:
        if isinstance(bad, json.JSONDecodeError):
            return f"malformed JSON at position {bad.pos}: {bad.msg}"
        return f"malformed JSON: {bad}"
    return f"malformed JSON: {exc}"


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True  # as FastAPI: no declared type is read as JSON
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


@functools.cache
def json_body(kind: type[S]) -> Callable[[Request], Any]:
    """A FastAPI dependency giving the request's JSON body decoded as ``kind``
    (``body: Annotated[SendMessageBody, Depends(json_body(SendMessageBody))]``); :func:`install_bodies`
    documents it."""
    async def body(request: Request) -> S:
        if not _is_json(request.headers.get("content-type")):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"the body must be JSON, not {request.headers.get('content-type')}")
        return decode_body(kind, await request.body())
    body.__body_kind__ = kind  # type: ignore[attr-defined]  # read by install_bodies
    return body


def _bodies_of(route: APIRoute) -> Iterable[type[msgspec.Struct]]:
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        kind = getattr(dep.call, "__body_kind__", None)
        if kind is not None:
            yield kind
        stack.extend(dep.dependencies)


def install_bodies(app: FastAPI, *extra: type[msgspec.Struct]) -> None:
    """State in ``app``'s OpenAPI document the request body of every route that decodes one with
    :func:`json_body` -- the JSON schema msgspec emits for the contract's Struct, as a component -- and the
    components of ``extra`` bodies (ones a route reads itself and refers to in its ``openapi_extra``)."""

    def amend(schema: dict[str, Any]) -> None:
        kinds: list[type[msgspec.Struct]] = list(extra)
        for context in iter_route_contexts(app.routes):  # included routers' routes too, with their prefixes
            route = context.original_route
            if not isinstance(route, APIRoute):
                continue
            for kind in _bodies_of(route):
                kinds.append(kind)
                for method in route.methods or ():
                    operation = schema["paths"][context.path_format][method.lower()]
                    operation["requestBody"] = {"required": True, "content": {"application/json": {
                        "schema": {"$ref": f"#/components/schemas/{kind.__name__}"}}}}
        _, components = msgspec.json.schema_components(sorted(set(kinds), key=lambda k: k.__name__),
                                                       ref_template="#/components/schemas/{name}")
        schema.setdefault("components", {}).setdefault("schemas", {}).update(components)

    amend_openapi(app, amend)

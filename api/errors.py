"""Errors as every sparkmq HTTP app answers them, mapped once.

Every error is ``{"code": CODE, "message": ...}`` with the code's HTTP status
(:class:`~sparkmq.platform.common.errors.ErrorCode`); a request whose shape is wrong
(missing field, wrong type, malformed JSON) is ``INVALID_ARGUMENT``, and a value that breaks a constraint
declared in the schema answers the code its type names (``platform/common/http_contract.py``, applied by
``api/params.py``: TOPIC_ILLEGAL for a bad topic, ...);
anything unexpected is ``INTERNAL_ERROR`` (and logged).  Apps call :func:`install_error_handlers`, which also
documents these answers in the app's OpenAPI schema (an ``Error`` body on every operation's error statuses,
in place of FastAPI's 422, which no sparkmq app answers).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from ..platform.common.errors import ErrorCode, SparkMQError

__all__ = ["ErrorBody", "error_response", "validation_code", "validation_message",
           "install_error_handlers", "document_errors", "amend_openapi"]


class ErrorBody(BaseModel):
    """What every error answers."""

    code: str
    message: str


def error_response(code: ErrorCode, message: str) -> JSONResponse:
    """The JSON error response of ``code``."""
    return JSONResponse({"code": code.name, "message": message}, status_code=code.http_status)


def validation_message(errors: Iterable[Mapping[str, Any]]) -> str:
    """One readable line for pydantic/FastAPI validation errors (at most five of them)."""
    parts = []
    for i, err in enumerate(errors):
        if i == 5:
            break
        if err.get("type") == "json_invalid":
            # FastAPI's loc is ("body", position), pydantic's own is empty; say it in words.
            loc = tuple(err.get("loc") or ())
            where = f" at position {loc[-1]}" if loc else ""
            parts.append(f"malformed JSON{where}: {err.get('ctx', {}).get('error', 'decode error')}")
            continue
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return "; ".join(parts) or "invalid request"


def validation_code(errors: Iterable[Mapping[str, Any]]) -> ErrorCode:
    """The code of validation errors: the first one typed with a code's name (a constraint of
    ``api/params.py``), else INVALID_ARGUMENT (a missing field, a wrong type, malformed JSON)."""
    for err in errors:
        code = ErrorCode.__members__.get(str(err.get("type")))
        if code is not None:
            return code
    return ErrorCode.INVALID_ARGUMENT


def amend_openapi(app: FastAPI, amend: Callable[[dict[str, Any]], None]) -> None:
    """Have ``app``'s OpenAPI document pass through ``amend`` once each time FastAPI generates it (it caches the
    document; an amendment stacks on the ones installed before it)."""
    generate: Callable[[], dict[str, Any]] = app.openapi
    done: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        schema = generate()
        if not (done and done[0] is schema):
            amend(schema)
            done[:] = [schema]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def document_errors(app: FastAPI) -> None:
    """Declare in ``app``'s OpenAPI schema the error answers of every operation: each HTTP status an
    :class:`ErrorCode` maps to, with the codes it carries and the ``Error`` body (FastAPI's 422 removed)."""
    by_status: dict[int, list[str]] = {}
    for code in ErrorCode:
        by_status.setdefault(code.http_status, []).append(code.name)
    answers = {str(status): {"description": "error: " + ", ".join(names),
                             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
               for status, names in sorted(by_status.items())}

    def amend(schema: dict[str, Any]) -> None:
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                for status, answer in answers.items():
                    responses.setdefault(status, answer)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Error"] = ErrorBody.model_json_schema()
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)

    amend_openapi(app, amend)


def install_error_handlers(app: FastAPI, log: logging.Logger) -> None:
    """Answer SparkMQError, request validation errors and anything unexpected (logged on ``log``) as JSON errors."""

    async def sparkmq_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SparkMQError)
        return error_response(exc.code, exc.message)

    async def request_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        return error_response(validation_code(errors), validation_message(errors))

    async def http_error(request: Request, exc: Exception) -> Any:
        # FastAPI's own 400 (a body it cannot parse: not UTF-8, a broken form) is a shape error like any other;
        # other statuses (an unknown path, a wrong method) keep FastAPI's answer.
        assert isinstance(exc, HTTPException)
        if exc.status_code == 400:
            return error_response(ErrorCode.INVALID_ARGUMENT, str(exc.detail))
        return await http_exception_handler(request, exc)

    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    app.add_exception_handler(SparkMQError, sparkmq_error)
    app.add_exception_handler(RequestValidationError, request_validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    document_errors(app)

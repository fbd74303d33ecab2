"""Errors as every sparkmq HTTP app answers them, mapped once.

Every error is ``{"code": CODE, "message": ...}`` with the code's HTTP status
(:class:`~sparkmq.platform.common.errors.ErrorCode`); a request whose shape is wrong
(missing field, wrong type, malformed JSON) is ``INVALID_ARGUMENT``; anything
unexpected is ``INTERNAL_ERROR`` (and logged).  Apps call :func:`install_error_handlers`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from ..platform.common.errors import ErrorCode, SparkMQError

__all__ = ["error_response", "validation_message", "invalid_argument", "install_error_handlers"]


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


def invalid_argument(exc: ValidationError) -> SparkMQError:
    """INVALID_ARGUMENT for a pydantic error raised while parsing a body by hand."""
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, validation_message(exc.errors()))


def install_error_handlers(app: FastAPI, log: logging.Logger) -> None:
    """Answer SparkMQError, request validation errors and anything unexpected (logged on ``log``) as JSON errors."""

    async def sparkmq_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SparkMQError)
        return error_response(exc.code, exc.message)

    async def request_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(ErrorCode.INVALID_ARGUMENT, validation_message(exc.errors()))

    async def unexpected_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return error_response(ErrorCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    app.add_exception_handler(SparkMQError, sparkmq_error)
    app.add_exception_handler(RequestValidationError, request_validation_error)
    app.add_exception_handler(Exception, unexpected_error)

"""Errors of the lake layer (table specs, Delta tables).

They subclass :class:`~sparkmq.platform.common.errors.SparkMQError`, so the API layer
maps them like every other error (``str()`` gives ``CODE: message``).  There is no
lake-specific stable code yet: bad arguments use ``INVALID_ARGUMENT``, a table in a
state the lake cannot handle uses ``INTERNAL_ERROR``.
"""
from __future__ import annotations

from sparkmq.platform.common.errors import ErrorCode, SparkMQError

__all__ = ["LakeError", "SchemaMismatchError", "UnknownTableError"]


class LakeError(SparkMQError):
    """Base of every lake error."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL_ERROR) -> None:
        super().__init__(code, message)


class UnknownTableError(LakeError):
    """A table name that ``pipelines.tables`` does not define."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.INVALID_ARGUMENT)


class SchemaMismatchError(LakeError):
    """An existing table's schema or partitioning differs from its spec in ``pipelines.tables``."""

"""Errors of the lake layer (table specs, Delta reads and writes).

They subclass :class:`~sparkmq.platform.common.errors.SparkMQError`, so the API layer
maps them like every other error (``str()`` gives ``CODE: message``).  There is no
lake-specific stable code yet: bad arguments use ``INVALID_ARGUMENT``, a table in a
state the lake cannot handle uses ``INTERNAL_ERROR``.
"""
from __future__ import annotations

from sparkmq.platform.common.errors import ErrorCode, SparkMQError

__all__ = ["LakeError", "SchemaMismatchError", "TableNotFound", "UnknownTableError", "UnsupportedTableError"]


class LakeError(SparkMQError):
    """Base of every lake error."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INTERNAL_ERROR) -> None:
        super().__init__(code, message)


class UnknownTableError(LakeError):
    """A table name that ``pipelines.tables`` does not define."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.INVALID_ARGUMENT)


class TableNotFound(LakeError):
    """No Delta table at the path (create it with ``tables.ensure_table`` first)."""


class SchemaMismatchError(LakeError):
    """An existing table's schema or partitioning differs from its spec in ``pipelines.tables``."""


class UnsupportedTableError(LakeError):
    """A table that the snapshot reader cannot read correctly as plain Parquet.

    Column mapping renames columns in the Parquet files and deletion vectors hide
    rows outside them: a plain Parquet read would silently return NULL columns or
    deleted rows, so such tables are refused instead.
    """

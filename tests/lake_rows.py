"""Test helper: rows appended to a lake table the way the jobs write them (delta-spark, once per version)."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from sparkmq.pipelines import tables
from sparkmq.pipelines.dispatch import append_once

__all__ = ["append_rows"]


def append_rows(spark: SparkSession, lake: str | os.PathLike[str], name: str,
                rows: Iterable[Mapping[str, Any]] | pa.Table, version: int, app_id: str = "test") -> None:
    """Create table ``name`` under ``lake`` if needed and append ``rows`` (dicts by column, or an Arrow table of
    the spec's schema) with delta-spark as ``(app_id, version)``."""
    spec = tables.get_spec(name)
    tables.ensure_table(spark, lake, name)
    data = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(
        [{f.name: r.get(f.name) for f in spec.schema} for r in rows], schema=spec.schema)
    append_once(spark.createDataFrame(data, schema=tables.spark_schema(spec)), lake, name, app_id, version)

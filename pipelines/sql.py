"""SQL over the lake: every existing table as a Spark temporary view.

Views are built with the snapshot reader (:func:`delta_io.read_delta`) and the
schemas of :mod:`pipelines.tables`, so ``SELECT ... FROM messages`` works without the
delta-spark jars.  A view reads the table version current when it was registered:
call :func:`register_tables` again (or use :func:`run_sql`, which does) to see newer
commits.

Example::

    from sparkmq.pipelines.sql import run_sql
    run_sql(spark, "/data/lake", "SELECT topic, count(*) FROM messages GROUP BY topic").show()
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from deltalake import DeltaTable

from . import tables
from .delta_io import read_delta

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["register_tables", "run_sql"]


def register_tables(spark: SparkSession, lake_root: str | os.PathLike[str],
                    names: Iterable[str] | None = None) -> list[str]:
    """Create or replace a temporary view named after each table of ``names`` (default all) that exists.

    Returns the names of the views registered, in :data:`tables.TABLES` order.  Tables
    not yet created under ``lake_root`` are skipped (a fresh lake has few), and a view
    left from an earlier call for such a table is dropped so it cannot show stale data
    from another lake root.  Each view has the table's spec schema (all columns
    nullable, see :func:`read_delta`).
    """
    wanted = list(tables.TABLES) if names is None else [tables.get_spec(n).name for n in names]
    registered: list[str] = []
    for name in wanted:
        spec = tables.get_spec(name)
        path = spec.path(lake_root)
        if not DeltaTable.is_deltatable(path):
            spark.catalog.dropTempView(name)
            continue
        read_delta(spark, path, schema=tables.spark_schema(spec)).createOrReplaceTempView(name)
        registered.append(name)
    return registered


def run_sql(spark: SparkSession, lake_root: str | os.PathLike[str], query: str) -> DataFrame:
    """Register every table of ``lake_root`` as a view (refreshing existing views), then run ``query``.

    >>> run_sql(spark, "/data/lake", "SELECT count(*) AS n FROM message_keys").first().n   # doctest: +SKIP
    12
    """
    register_tables(spark, lake_root)
    return spark.sql(query)

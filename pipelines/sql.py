"""SQL over the lake: every table through Spark's catalog, as ``sparkmq.<table>``.

The tables are Delta tables registered under the database ``sparkmq``
(:func:`.tables.register_tables`), so plain Spark SQL works on them: ``SELECT ... FROM
sparkmq.messages``, ``DESCRIBE HISTORY sparkmq.messages``, ``SELECT ... FROM sparkmq.messages
VERSION AS OF 3``.  :func:`run_sql` (what ``sparkmq sql`` runs) also resolves the short names
(``FROM messages``): it plans the query with ``sparkmq`` as the current database.  Every query
reads the table's latest version (Delta resolves it when the query is planned).

Example::

    from sparkmq.pipelines.sql import run_sql
    run_sql(spark, "/data/lake", "SELECT topic, count(*) FROM messages GROUP BY topic").show()
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import tables

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_sql"]


def run_sql(spark: SparkSession, lake_root: str | os.PathLike[str], query: str) -> DataFrame:
    """Register the tables of ``lake_root`` as ``sparkmq.<table>`` and plan ``query`` with ``sparkmq`` as the
    current database (the session's own current database is back when this returns).

    >>> run_sql(spark, "/data/lake", "SELECT count(*) AS n FROM message_keys").first().n   # doctest: +SKIP
    12
    """
    tables.register_tables(spark, lake_root)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {tables.DATABASE}")
    previous = spark.catalog.currentDatabase()
    spark.catalog.setCurrentDatabase(tables.DATABASE)
    try:
        return spark.sql(query)  # analysed here: the names are resolved before the database is switched back
    finally:
        spark.catalog.setCurrentDatabase(previous)

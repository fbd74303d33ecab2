"""Schemas of the lake tables that ``platform/`` itself writes (with delta-rs, never Spark).

``pipelines/tables.py`` names every lake table, but the broker may not import
``pipelines`` (imports flow ``pipelines`` -> ``platform.common``, never back, so a
broker runs without Spark).  A table written by the broker therefore has its schema here,
in a neutral module both sides import, so it is defined exactly once.

Convention shared with ``pipelines/tables.py``: a table lives in the directory named
after it directly under the lake root (``<lake_root>/consumer_offsets``).

Nothing here imports PySpark.
"""
from __future__ import annotations

import pyarrow as pa

__all__ = ["CONSUMER_OFFSETS_DESCRIPTION", "CONSUMER_OFFSETS_SCHEMA", "CONSUMER_OFFSETS_TABLE", "PINNED_PROPERTIES"]

#: The Delta protocol and features of every lake table, given when it is created (by delta-spark in
#: ``pipelines/tables.py``, by delta-rs for ``consumer_offsets`` here): reader 1 / writer 2 with no table
#: features, so both libraries read and write every table.  Deletion vectors, column mapping and v2
#: checkpoints are named off explicitly: delta-rs writes no deletion vectors, and tables that carry
#: features it cannot write (rowTracking, inCommitTimestamp, clustering, ...) would lock the broker out.
PINNED_PROPERTIES: dict[str, str] = {
    "delta.minReaderVersion": "1",
    "delta.minWriterVersion": "2",
    "delta.enableDeletionVectors": "false",
    "delta.columnMapping.mode": "none",
    "delta.checkpointPolicy": "classic",
}

#: The table's name (its directory under the lake root, and its Delta metadata name).
CONSUMER_OFFSETS_TABLE = "consumer_offsets"

#: The Delta metadata description of ``consumer_offsets``.
CONSUMER_OFFSETS_DESCRIPTION = "consumer offsets per broker, group, topic and queue (sparkmq)"

#: The Arrow schema of ``consumer_offsets``; every column is required.  One row per
#: (broker, group, topic, queue_id): the broker upserts it with a delta-rs MERGE.
CONSUMER_OFFSETS_SCHEMA = pa.schema([
    pa.field("broker", pa.string(), nullable=False),
    pa.field("group", pa.string(), nullable=False),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("queue_id", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
])

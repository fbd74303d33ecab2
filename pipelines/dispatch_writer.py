"""The dispatch job's Spark tasks: pull queue ranges and write the lake's data files where they run.

A micro-batch of the dispatch job is planned like any ``sparkmq`` stream (same offsets,
admission control, checkpoint), but its tasks do not hand messages to Spark: each task
pulls its queue ranges from the brokers (Arrow, stored form), turns them into rows of
``consume_queue``, ``messages`` and ``message_keys`` (:func:`build_tables`) and writes
those as Parquet data files into the tables' directories (:mod:`.delta_files`).  What a
task returns to Spark is one small row per file (:data:`FILES_SCHEMA`); the job's driver
commits them, once per batch and table (:mod:`.dispatch`).

This is Delta's own write protocol (executors write files, the driver commits) and keeps
the messages out of the JVM and the driver: no row conversion, no collect.  Uncommitted
files (a failed task, a replayed batch) are invisible and vacuumed.

The format is internal to the job (``sparkmq-dispatch``)::

    spark.readStream.format("sparkmq-dispatch")
         .option("lakeRoot", "/data/lake").option("tasks", 2)
         .options(**dispatch_source_options(...))      # the sparkmq source's options
"""
from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, InputPartition
from pyspark.sql.types import ArrayType, LongType, MapType, StringType, StructField, StructType

from sparkmq.platform.common.message import PROPERTY_KEYS
from sparkmq.platform.common.record_columns import map_value

from . import tables
from .cluster_io import OptionError
from .delta_files import DataFile, write_data_files
from .source import (
    QueueRange,
    SourceOptions,
    SparkMQStreamReader,
    _int,
    read_range,
)

__all__ = [
    "DISPATCH_FORMAT",
    "DISPATCH_TABLES",
    "FILES_SCHEMA",
    "DispatchDataSource",
    "DispatchTask",
    "build_tables",
    "file_of_row",
    "group_ranges",
    "merge_percentiles",
    "plan_tasks",
    "register_dispatch",
    "write_dispatch_files",
]

DISPATCH_FORMAT = "sparkmq-dispatch"

#: The tables a dispatch batch writes, in commit order.
DISPATCH_TABLES = (tables.CONSUME_QUEUE, tables.MESSAGES, tables.MESSAGE_KEYS)

#: One row per data file a task wrote.  ``store_ms_percentiles`` (``consume_queue`` files only):
#: the 0th..100th percentiles of the file's store timestamps (epoch ms), for the batch's lag figures.
FILES_SCHEMA = StructType([
    StructField("table", StringType(), False),
    StructField("path", StringType(), False),
    StructField("size", LongType(), False),
    StructField("partition_values", MapType(StringType(), StringType()), False),
    StructField("modification_time", LongType(), False),
    StructField("num_records", LongType(), False),
    StructField("stats", StringType(), False),
    StructField("store_ms_percentiles", ArrayType(LongType(), containsNull=False), True),
])

#: A task writes its files when it holds this many messages, and goes on with new ones:
#: bounds a task's memory whatever the batch size (about 100 MB at 300 bytes a message).
ROLL_MESSAGES = 300_000

#: Default number of tasks per batch (the broker's own lake runs local[1]: one).
DEFAULT_TASKS = 2

_TS = pa.timestamp("us", tz="UTC")


# -- rows to tables ----------------------------------------------------------------------------------

def _col(t: pa.Table, name: str) -> pa.Array:
    return t.column(name).combine_chunks()


def build_tables(rows: pa.Table) -> dict[str, pa.Table]:
    """The ``consume_queue``, ``messages`` and ``message_keys`` rows of source rows read with ``raw``.

    ``rows`` has the source's columns (``SOURCE_SCHEMA``); the result follows the specs in
    :mod:`.tables` exactly.  ``message_keys`` gets one row for the unique id and one per key.
    """
    topic, broker, qid, qoff = (_col(rows, c) for c in ("topic", "broker", "queue_id", "queue_offset"))
    clog, size, store_ts = _col(rows, "commitlog_offset"), _col(rows, "store_size"), _col(rows, "store_timestamp")
    store_ts = store_ts.cast(_TS)
    tags = _col(rows, "tags")
    # The consume queue's tag hash (codec.tag_hash: CRC-32 of the tag, 0 for none); Arrow has no CRC kernel.
    tag_hash = pa.array([zlib.crc32(t.encode("utf-8")) if t else 0 for t in tags.to_pylist()], type=pa.int64())
    cq = tables.get_spec(tables.CONSUME_QUEUE).schema
    consume_queue = pa.Table.from_arrays([topic, broker, qid, qoff, clog, size, tag_hash, store_ts], schema=cq)

    props = _col(rows, "properties")
    raw_keys = map_value(props, PROPERTY_KEYS)
    ms = tables.get_spec(tables.MESSAGES).schema
    messages = pa.Table.from_arrays([
        topic, broker, qid, qoff, clog, size, _col(rows, "msg_id"), _col(rows, "offset_msg_id"), tags, raw_keys,
        _col(rows, "body"), props.cast(ms.field("properties").type), _col(rows, "born_timestamp").cast(_TS),
        _col(rows, "born_host"), store_ts, _col(rows, "store_host"), _col(rows, "reconsume_times"),
        _col(rows, "sys_flag"), store_ts.cast(pa.date32()),
    ], schema=ms)

    # message_keys: the unique id of every message that has one, then each key.
    msg_id = _col(rows, "msg_id")
    has_id = pc.not_equal(msg_id, "")
    keys = _col(rows, "keys")
    offs = keys.offsets.to_numpy(zero_copy_only=False)
    parents = pa.array(np.repeat(np.arange(len(keys)), np.diff(offs)))
    key_values = keys.values.slice(offs[0], offs[-1] - offs[0]).cast(pa.string())
    location = [topic, broker, qid, qoff, clog, store_ts]
    ids = pc.filter(msg_id, has_id)
    id_rows = [ids, pa.array(["msg_id"] * len(ids), pa.string())] + [pc.filter(c, has_id) for c in location]
    key_rows = [key_values, pa.array(["key"] * len(key_values), pa.string())] + [pc.take(c, parents) for c in location]
    mk = tables.get_spec(tables.MESSAGE_KEYS).schema
    message_keys = pa.Table.from_arrays(  # two chunks each: the id rows, then the key rows (no copy)
        [pa.chunked_array([a.cast(f.type), b.cast(f.type)]) for a, b, f in zip(id_rows, key_rows, mk, strict=True)],
        schema=mk)
    return {tables.CONSUME_QUEUE: consume_queue, tables.MESSAGES: messages, tables.MESSAGE_KEYS: message_keys}


def store_ms_percentiles(store_ts: pa.Array | pa.ChunkedArray) -> list[int]:
    """The 0th..100th percentiles of store timestamps, epoch ms (empty for no rows)."""
    if len(store_ts) == 0:
        return []
    micros = pc.cast(store_ts, _TS).cast(pa.int64()).to_numpy(zero_copy_only=False)
    return [int(v) // 1000 for v in np.percentile(micros, np.arange(101), method="lower")]


def write_dispatch_files(lake_root: str, rows: pa.Table) -> list[tuple[str, DataFile, list[int] | None]]:
    """Write the three tables' data files of ``rows`` (``raw`` source rows), uncommitted.

    Returns ``(table, file, store_ms_percentiles)`` per file, the percentiles on
    ``consume_queue`` files only.
    """
    out: list[tuple[str, DataFile, list[int] | None]] = []
    for name, data in build_tables(rows).items():
        spec = tables.get_spec(name)
        percentiles = store_ms_percentiles(data.column("store_ts")) if name == tables.CONSUME_QUEUE else None
        out.extend((name, f, percentiles) for f in write_data_files(tables.table_path(lake_root, name), spec, data))
    return out


# -- planning ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DispatchTask(InputPartition):
    """One Spark task of a dispatch batch: queue ranges pulled one after the other."""

    ranges: tuple[QueueRange, ...]

    @property
    def messages(self) -> int:
        """How many queue offsets the task covers."""
        return sum(r.end - r.start for r in self.ranges)


def group_ranges(ranges: Iterable[QueueRange], tasks: int) -> list[DispatchTask]:
    """``ranges`` spread over at most ``tasks`` tasks of about equal size (largest first onto the lightest)."""
    groups: list[list[QueueRange]] = [[] for _ in range(max(1, tasks))]
    loads = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: (-(r.end - r.start), r.label)):
        lightest = loads.index(min(loads))
        groups[lightest].append(r)
        loads[lightest] += r.end - r.start
    return [DispatchTask(tuple(g)) for g in groups if g]


def plan_tasks(ranges: Sequence[QueueRange], tasks: int) -> list[DispatchTask]:
    """The tasks of a batch: :func:`group_ranges`, empty when there is nothing to read."""
    return group_ranges(ranges, tasks) if ranges else []


def _file_rows(written: Iterable[tuple[str, DataFile, list[int] | None]]) -> Iterator[tuple[Any, ...]]:
    for name, f, percentiles in written:
        yield (name, f.path, f.size, dict(f.partition_values), f.modification_time, f.num_records, f.stats,
               percentiles)


def file_of_row(row: Any) -> tuple[str, DataFile, list[int] | None]:
    """``(table, file, store_ms_percentiles)`` of one collected :data:`FILES_SCHEMA` row."""
    return (row.table, DataFile(row.path, row.size, row.partition_values, row.modification_time, row.num_records,
                                row.stats), row.store_ms_percentiles)


def run_task(task: DispatchTask, reader: SparkMQStreamReader, lake_root: str) -> Iterator[tuple[Any, ...]]:
    """Pull every range of ``task`` and write the tables' files, rolling at :data:`ROLL_MESSAGES`."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for part in task.ranges:
        for batch in read_range(part, reader.settings):
            pending.append(batch)
            held += batch.num_rows
            if held >= ROLL_MESSAGES:
                yield from _file_rows(write_dispatch_files(lake_root, pa.Table.from_batches(pending)))
                pending, held = [], 0
    if held:
        yield from _file_rows(write_dispatch_files(lake_root, pa.Table.from_batches(pending)))


# -- the data source ---------------------------------------------------------------------------------

class DispatchStreamReader(SparkMQStreamReader):
    """The ``sparkmq`` stream reader whose tasks write the lake's files and return their descriptions."""

    def __init__(self, options: SourceOptions, lake_root: str, tasks: int) -> None:
        super().__init__(options)
        self.lake_root = lake_root
        self.tasks = tasks

    def partitions(self, start: dict, end: dict) -> list[DispatchTask]:  # type: ignore[override]
        """The batch's queue ranges grouped into at most ``tasks`` tasks."""
        return plan_tasks(super().partitions(start, end), self.tasks)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        """Pull the task's ranges and write their files (on an executor); one row per file."""
        assert isinstance(partition, DispatchTask)
        return run_task(partition, self, self.lake_root)


class DispatchDataSource(DataSource):
    """The ``sparkmq-dispatch`` format (streaming only): the dispatch job's reader.

    Options: ``lakeRoot`` (required), ``tasks`` (tasks per batch, default 2) and the
    ``sparkmq`` source's options.
    """

    @classmethod
    def name(cls) -> str:
        """``"sparkmq-dispatch"``."""
        return DISPATCH_FORMAT

    def schema(self) -> StructType:
        """One row per written file (:data:`FILES_SCHEMA`)."""
        return FILES_SCHEMA

    def streamReader(self, schema: StructType) -> DispatchStreamReader:
        """The stream reader."""
        own = {k.lower(): v for k, v in self.options.items() if k.lower() in ("lakeroot", "tasks")}
        rest = {k: v for k, v in self.options.items() if k.lower() not in own}
        lake_root = (own.get("lakeroot") or "").strip()
        if not lake_root:
            raise OptionError("lakeRoot", "the dispatch reader needs the lake root it writes to")
        tasks = _int({"tasks": own["tasks"]} if "tasks" in own else {}, "tasks", 1, 1024) or DEFAULT_TASKS
        return DispatchStreamReader(SourceOptions.parse(rest, streaming=True), lake_root, tasks)


def register_dispatch(spark: Any) -> None:
    """Register the ``sparkmq-dispatch`` format with ``spark``; idempotent per session."""
    spark.dataSource.register(DispatchDataSource)


def merge_percentiles(parts: Iterable[tuple[Sequence[int], int]]) -> np.ndarray:
    """Approximate samples of the union of several data sets given their percentile lists and sizes.

    Each list stands for its rows in equal shares; the result (epoch ms values, weighted by
    repetition) gives the union's percentiles to within one percentile step of each part.
    """
    samples = [np.repeat(np.asarray(p, dtype=np.int64), max(1, round(n / len(p))))
               for p, n in parts if len(p)]
    return np.concatenate(samples) if samples else np.array([], dtype=np.int64)


"""Delta's split of work, without delta-spark: tasks write data files, the driver commits them once.

This is how Delta's own Spark writer works, done with pyarrow and delta-rs:

* :func:`write_data_files` runs where the rows are (a Spark task on an executor): it writes
  Parquet files into the table's directory -- one per partition value, Hive-style paths --
  and describes each as a :class:`DataFile` (path, size, partition values, statistics);
* :func:`commit_data_files` runs on the driver with every task's descriptions: one Delta
  commit per table, carrying the app transaction ``(app_id, version)`` and skipped when the
  table already records that version (:func:`.delta_io.commit_once`).

Files of a task that failed, or of a batch that was replayed, are never committed; they
are invisible to readers and vacuum deletes them.  The rows never pass through the driver,
which is what lets one micro-batch carry hundreds of thousands of messages.

Example::

    files = write_data_files(tables.table_path(root, "messages"), tables.get_spec("messages"), arrow_table)
    commit_data_files(tables.table_path(root, "messages"), files, app_id="dispatch-a-messages", version=7)
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction

from .delta_io import commit_once
from .tables import TableSpec

__all__ = ["DataFile", "commit_data_files", "file_statistics", "write_data_files"]

#: Parquet compression of data files: what delta-rs writes by default.
_COMPRESSION = "snappy"
#: Strings longer than this get no min/max statistics (Delta readers skip columns without them).
_MAX_STAT_STRING = 64


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written into a Delta table's directory, not yet committed.

    ``path`` is relative to the table root (POSIX separators); ``stats`` is the Delta
    ``add.stats`` JSON (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``).
    """

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    modification_time: int            # epoch ms
    num_records: int
    stats: str

    def add_action(self) -> AddAction:
        """The Delta ``add`` action that commits this file."""
        return AddAction(self.path, self.size, dict(self.partition_values), self.modification_time, True, self.stats)


def _filesystem(table_root: str) -> tuple[pafs.FileSystem, str]:
    if "://" in table_root and not table_root.startswith("file://"):
        return pafs.FileSystem.from_uri(table_root)
    return pafs.LocalFileSystem(), table_root.removeprefix("file://")


def _stat_value(value: object) -> object:
    """A statistics value as Delta's JSON writes it (timestamps to the millisecond, in UTC)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, date):
        return value.isoformat()
    return value


def _ms_bound(column: pa.Array, which: str) -> datetime:
    """The min (floored) or max (ceiled) of a timestamp column at millisecond precision, as a UTC datetime."""
    micros = pc.min_max(column.cast(pa.int64()))[which].as_py()
    ms = micros // 1000 if which == "min" else math.ceil(micros / 1000)
    return datetime.fromtimestamp(ms // 1000, tz=UTC).replace(microsecond=ms % 1000 * 1000)


def file_statistics(data: pa.Table, columns: Iterable[str]) -> dict[str, object]:
    """Delta statistics of ``data`` over ``columns``: row count, null counts, min/max of comparable values.

    Binary and nested columns get a null count only; strings longer than 64 characters and
    all-null columns get no min/max -- a missing bound only disables file skipping.
    """
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        column = data.column(name)
        kind = column.type
        if pa.types.is_nested(kind):
            continue
        nulls[name] = column.null_count
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or column.null_count == len(column):
            continue
        if pa.types.is_timestamp(kind):
            minimum[name], maximum[name] = _ms_bound(column, "min"), _ms_bound(column, "max")
        else:
            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if pa.types.is_string(kind) and max(len(low), len(high)) > _MAX_STAT_STRING:
                continue
            minimum[name], maximum[name] = low, high
    return {"numRecords": data.num_rows, "minValues": {k: _stat_value(v) for k, v in minimum.items()},
            "maxValues": {k: _stat_value(v) for k, v in maximum.items()}, "nullCount": nulls}


def _partition_text(value: object) -> str | None:
    return None if value is None else value.isoformat() if isinstance(value, date) else str(value)


def _partitions(data: pa.Table, partition_by: Sequence[str]) -> list[tuple[dict[str, str | None], pa.Table]]:
    """``data`` split by the values of ``partition_by`` (the columns dropped), in first-seen order."""
    if not partition_by:
        return [({}, data)]
    values = data.select(list(partition_by)).group_by(list(partition_by)).aggregate([])
    if values.num_rows == 1:  # the usual case (one day per batch): no filtering, no copy
        row = values.to_pylist()[0]
        return [({name: _partition_text(row[name]) for name in partition_by}, data.drop_columns(list(partition_by)))]
    out = []
    for row in values.to_pylist():
        mask = None
        for name in partition_by:
            column = data.column(name)
            match = pc.is_null(column) if row[name] is None else pc.equal(column, pa.scalar(row[name], column.type))
            mask = match if mask is None else pc.and_(mask, match)
        part = data.filter(mask).drop_columns(list(partition_by))
        out.append(({name: _partition_text(row[name]) for name in partition_by}, part))
    return out


def _hive_dir(values: Mapping[str, str | None]) -> str:
    # Partition values here are dates and integers: no characters that need escaping.
    return "/".join(f"{k}={'__HIVE_DEFAULT_PARTITION__' if v is None else v}" for k, v in values.items())


def write_data_files(table_root: str, spec: TableSpec, data: pa.Table) -> list[DataFile]:
    """Write ``data`` (rows of ``spec``'s table) as new Parquet files under ``table_root``; describe them.

    One file per partition value; nothing is committed (see :func:`commit_data_files`).
    ``data`` is cast to the spec's schema first, so a column of the wrong type fails here,
    before anything is written.  An empty ``data`` writes nothing.
    """
    if data.num_rows == 0:
        return []
    data = data.select(spec.schema.names).cast(spec.schema)
    fs, root = _filesystem(table_root)
    stat_columns = [name for name in spec.schema.names if name not in spec.partition_by]
    files = []
    for values, part in _partitions(data, spec.partition_by):
        directory = _hive_dir(values)
        name = f"part-{uuid.uuid4()}-c000.{_COMPRESSION}.parquet"
        relative = f"{directory}/{name}" if directory else name
        full = f"{root.rstrip('/')}/{relative}"
        if directory:
            fs.create_dir(f"{root.rstrip('/')}/{directory}", recursive=True)
        with fs.open_output_stream(full) as sink:
            pq.write_table(part, sink, compression=_COMPRESSION)
        size = fs.get_file_info(full).size
        stats = json.dumps(file_statistics(part, stat_columns), separators=(",", ":"))
        files.append(DataFile(relative, size, values, int(time.time() * 1000), part.num_rows, stats))
    return files


def commit_data_files(table_path: str | os.PathLike[str], files: Sequence[DataFile], app_id: str,
                      version: int, partition_by: Sequence[str] = ()) -> bool:
    """Commit ``files`` to the table at ``table_path`` once per ``(app_id, version)``; return whether it did.

    The same guard as :func:`.delta_io.append_exactly_once`: skipped when the table already
    records ``transaction_version(app_id) >= version``.  Empty ``files`` still commits, recording
    the version as done.
    """
    actions = [f.add_action() for f in files]

    def commit(table: DeltaTable) -> None:
        table.create_write_transaction(actions, "append", table.schema(), list(partition_by) or None,
                                       commit_properties=CommitProperties(app_transactions=[Transaction(app_id,
                                                                                                        version)]))

    return commit_once(table_path, app_id, version, commit)

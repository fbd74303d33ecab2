"""Delta I/O without the delta-spark jars: exactly-once appends, snapshot reads, maintenance.

Spark runs without the delta-spark JVM jars (they are no dependency of this project), so

* every write goes through delta-rs (``deltalake.write_deltalake``), guarded by an
  app-transaction version that this module checks itself (delta-rs does not refuse a
  repeated or stale version);
* Spark reads a table through a *snapshot*: delta-rs resolves the log to a file list
  and Spark reads those Parquet files with an explicit schema.  That is only correct
  for tables whose Parquet files hold the rows and columns as the log describes them,
  so tables with column mapping or deletion vectors are refused with
  :class:`UnsupportedTableError`;
* maintenance (compaction, vacuum, checkpoints) is delta-rs too.

Where a cluster does have delta-spark, ``spark.read.format("delta").load(path)`` reads
the same tables.

Example::

    from sparkmq.pipelines import delta_io
    wrote = delta_io.append_exactly_once(path, arrow_batch, app_id="sparkmq.dispatch/broker-a", version=batch_id)
    df = delta_io.read_delta(spark, path)          # a Spark DataFrame of the latest version
    delta_io.maintain(path)                        # compact, vacuum (7 days), checkpoint
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from sparkmq.platform.common.errors import ErrorCode

from .errors import LakeError, TableNotFound, UnsupportedTableError

if TYPE_CHECKING:  # keep pyspark out of the import path of non-Spark users (broker-side maintenance)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "DEFAULT_VACUUM_RETENTION_HOURS",
    "MIN_SAFE_VACUUM_RETENTION_HOURS",
    "Snapshot",
    "append_exactly_once",
    "commit_once",
    "maintain",
    "read_delta",
    "snapshot",
]

log = logging.getLogger(__name__)

#: Vacuum keeps removed files this long by default: Delta's own default (7 days).
DEFAULT_VACUUM_RETENTION_HOURS = 168
#: The shortest retention :func:`maintain` accepts without ``allow_unsafe_retention``.
#: Removed files must outlive every reader that still holds an older file list: SQL
#: views registered hours ago, long Spark scans, time travel.  Zero breaks all of them.
MIN_SAFE_VACUUM_RETENTION_HOURS = 24

#: How often append_exactly_once re-checks and retries after losing a commit race.
_APPEND_ATTEMPTS = 8

#: Reader features under which a table's Parquet files still hold exactly its rows and
#: columns (they change only how the log is stored or which types exist).
_PLAIN_PARQUET_READER_FEATURES = frozenset({
    "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "variantType", "variantType-preview",
})

#: Partition column types whose values Spark parses back exactly from delta-rs's Hive-style
#: directory names.  Strings are safe only when ASCII (checked per value): Spark decodes
#: each %XX escape as one character, delta-rs writes UTF-8 bytes, so 'ü' comes back as 'Ã¼'.
_PATH_SAFE_TYPES = (pa.types.is_date32, pa.types.is_integer, pa.types.is_boolean)
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


# -- snapshots --------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """One version of a Delta table as the snapshot reader sees it.

    ``files`` are the data files of that version (absolute paths or URIs, as delta-rs
    gives them); ``partition_values`` has one ``{column: value}`` dict per file, in the
    same order.  ``table`` is the delta-rs handle loaded at ``version``.
    """

    path: str
    version: int
    files: tuple[str, ...]
    partition_values: tuple[Mapping[str, Any], ...]
    schema: pa.Schema
    schema_json: str                       # the Delta schema (Spark's StructType JSON dialect)
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str | None]
    reader_features: tuple[str, ...]
    table: DeltaTable = field(repr=False, compare=False)

    def unsupported_reason(self) -> str | None:
        """Why a plain Parquet read of this snapshot would be wrong, or None when it is correct."""
        mode = (self.configuration.get("delta.columnMapping.mode") or "none").lower()
        if mode != "none":
            return (f"column mapping (delta.columnMapping.mode={mode}): its Parquet files name columns by "
                    "physical ids, so a plain read would return NULLs")
        features = set(self.reader_features)
        dv_enabled = (self.configuration.get("delta.enableDeletionVectors") or "false").lower() == "true"
        if "deletionVectors" in features or dv_enabled:
            # Conservative: with the feature on, any file may carry a vector that hides rows.
            return "deletion vectors: rows they delete are still in the Parquet files, so a plain read returns them"
        if "columnMapping" in features:
            return "the columnMapping reader feature"
        unknown = sorted(features - _PLAIN_PARQUET_READER_FEATURES)
        if unknown:
            return f"reader features {unknown}, which a plain Parquet read does not honour"
        return None

    def check_plain_parquet(self) -> None:
        """Raise :class:`UnsupportedTableError` unless Spark may read the files as plain Parquet."""
        reason = self.unsupported_reason()
        if reason is not None:
            raise UnsupportedTableError(
                f"cannot read the Delta table at {self.path} (version {self.version}) with the snapshot reader: "
                f"it uses {reason}. Read it with delta-spark (spark.read.format('delta')) where that is installed, "
                "or rewrite it without that feature.")

    def spark_schema(self) -> StructType:
        """The table's own schema as a Spark ``StructType``."""
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.schema_json))


def _open(path: str | os.PathLike[str], version: int | None = None) -> DeltaTable:
    path = os.fspath(path)
    try:
        table = DeltaTable(path)
    except TableNotFoundError:
        raise TableNotFound(f"no Delta table at {path} (create it with pipelines.tables.ensure_table)") from None
    if version is None:
        return table
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= table.version():
        raise LakeError(f"the Delta table at {path} has versions 0..{table.version()}, not {version!r}",
                        ErrorCode.INVALID_ARGUMENT)
    try:
        table.load_as_version(version)
    except DeltaError as exc:  # e.g. the log entries of that version were cleaned up
        raise LakeError(f"cannot load version {version} of the Delta table at {path}: {exc}",
                        ErrorCode.INVALID_ARGUMENT) from None
    return table


def snapshot(path: str | os.PathLike[str], version: int | None = None) -> Snapshot:
    """The table at ``path`` as of ``version`` (default: the latest): its files, schema and settings.

    Raises :class:`TableNotFound` when there is no table, :class:`LakeError`
    (INVALID_ARGUMENT) for a version the table does not have.

    >>> snap = snapshot("/data/lake/messages")          # doctest: +SKIP
    >>> snap.version, len(snap.files)                    # doctest: +SKIP
    (42, 7)
    """
    table = _open(path, version)
    files = tuple(table.file_uris())
    metadata, protocol = table.metadata(), table.protocol()
    partition_columns = tuple(metadata.partition_columns)
    partition_values: tuple[Mapping[str, Any], ...] = tuple({} for _ in files)
    if partition_columns and files:
        actions = pa.table(table.get_add_actions(flatten=False))
        rel_paths = actions.column("path").to_pylist()
        parts = actions.column("partition").to_pylist()
        # file_uris() and the add actions come from the same file list, in the same order;
        # the log stores URL-encoded paths.  Verify instead of trusting the order.
        if len(rel_paths) != len(files) or not all(
                f.endswith("/" + unquote(p)) for f, p in zip(files, rel_paths, strict=True)):
            raise LakeError(f"delta-rs returned the files and add actions of {path} out of step")
        partition_values = tuple(parts)
    return Snapshot(
        path=table.table_uri, version=table.version(), files=files, partition_values=partition_values,
        schema=pa.schema(table.schema().to_arrow()), schema_json=table.schema().to_json(),
        partition_columns=partition_columns, configuration=dict(metadata.configuration),
        reader_features=tuple(protocol.reader_features or ()), table=table,
    )


# -- exactly-once appends ---------------------------------------------------------------

def append_exactly_once(path: str | os.PathLike[str], data: pa.Table | pa.RecordBatch, app_id: str,
                        version: int) -> bool:
    """Append ``data`` to the table at ``path`` once per ``(app_id, version)``; return whether it wrote.

    The write carries the Delta app transaction ``(app_id, version)``.  It is skipped when
    the table already records ``transaction_version(app_id) >= version`` -- a replayed
    Spark micro-batch (``version = batch_id``, which starts at 0) or a stale writer.  The
    check and the write use the *same* table snapshot, so if another writer commits the
    same app id in between, delta-rs refuses the commit ("Concurrent transaction
    failed"); then, as after any lost commit race, the table is reloaded and the check
    repeated.  Writers with different app ids append concurrently without conflict.

    An empty ``data`` still commits, recording the version as done.  The table must
    exist (:class:`TableNotFound`); ``data`` must fit its schema (columns in any order,
    nullable Arrow fields allowed if they hold no NULLs for required columns).

    >>> append_exactly_once(path, batch, "sparkmq.dispatch/broker-a", 7)   # doctest: +SKIP
    True
    >>> append_exactly_once(path, batch, "sparkmq.dispatch/broker-a", 7)   # doctest: +SKIP
    False
    """
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    def append(table: DeltaTable) -> None:
        # The DeltaTable, not the path: the path would load a newer snapshot and the
        # conflict check would no longer cover the transaction_version read by commit_once.
        write_deltalake(table, data, mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]))

    return commit_once(path, app_id, version, append)


def commit_once(path: str | os.PathLike[str], app_id: str, version: int,
                commit: Callable[[DeltaTable], None]) -> bool:
    """Run ``commit(table)`` unless the table at ``path`` already records ``(app_id, version)``.

    The guard of every exactly-once write (:func:`append_exactly_once`,
    :func:`.delta_files.commit_data_files`): ``commit`` must write through the given
    ``DeltaTable`` and carry the app transaction ``(app_id, version)``.  The check and the
    commit use the same snapshot, so a concurrent writer of the same app id makes delta-rs
    refuse the commit; then, as after any lost commit race, the table is reloaded and the
    check repeated.  Returns whether ``commit`` ran and succeeded.
    """
    if not isinstance(app_id, str) or not app_id:
        raise LakeError(f"app_id must be a non-empty string, got {app_id!r}", ErrorCode.INVALID_ARGUMENT)
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 2**63:
        raise LakeError(f"version must be an integer >= 0, got {version!r}", ErrorCode.INVALID_ARGUMENT)
    for attempt in range(1, _APPEND_ATTEMPTS + 1):
        table = _open(path)
        done = table.transaction_version(app_id)
        if done is not None and done >= version:
            log.debug("skip commit to %s: %s is at version %d >= %d", path, app_id, done, version)
            return False
        try:
            commit(table)
        except CommitFailedError as exc:
            if attempt == _APPEND_ATTEMPTS:
                raise LakeError(f"commit to {path} as {app_id} v{version} lost {attempt} races: {exc}") from exc
            log.info("commit to %s as %s v%d lost a race (%s); re-checking", path, app_id, version, exc)
            time.sleep(0.01 * attempt)  # let the winner finish before reloading
            continue
        return True
    raise AssertionError("unreachable")  # pragma: no cover


# -- reading with Spark -----------------------------------------------------------------

def _nullable_type(data_type: dict | str) -> dict | str:
    if not isinstance(data_type, dict):
        return data_type
    t = dict(data_type)
    if t.get("type") == "struct":
        t["fields"] = [{**f, "nullable": True, "type": _nullable_type(f["type"])} for f in t["fields"]]
    elif t.get("type") == "array":
        t.update(containsNull=True, elementType=_nullable_type(t["elementType"]))
    elif t.get("type") == "map":
        t.update(valueContainsNull=True, keyType=_nullable_type(t["keyType"]),
                 valueType=_nullable_type(t["valueType"]))
    return t


def _as_nullable(schema: StructType) -> StructType:
    """``schema`` with every field nullable, as Spark's file sources report it."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(_nullable_type(schema.jsonValue()))


def _partitions_path_safe(snap: Snapshot, wanted: set[str]) -> bool:
    """Whether Spark's parsing of partition directory names gives back the exact values."""
    for col in snap.partition_columns:
        if col not in wanted:
            continue
        arrow_type = snap.schema.field(col).type
        if any(check(arrow_type) for check in _PATH_SAFE_TYPES):
            continue
        if not pa.types.is_string(arrow_type) and not pa.types.is_large_string(arrow_type):
            return False
        for values in snap.partition_values:
            v = values.get(col)
            if v is not None and (not v or not v.isascii() or v == _HIVE_NULL):
                return False
    return True


def read_delta(spark: SparkSession, path: str | os.PathLike[str], schema: StructType | None = None,
               version: int | None = None) -> DataFrame:
    """A Spark DataFrame of the Delta table at ``path`` (``version``: time travel; default latest).

    Spark reads the snapshot's Parquet files with an explicit schema: ``schema`` if
    given (a subset or reordering of the table's columns), else the table's own.
    Columns come in the schema's order, partition columns included; an empty table
    gives 0 rows with that schema.  Every column is *nullable* in the result, because
    Spark's file sources relax nullability (writers enforce NOT NULL, not readers).

    The file list is fixed when this is called: the DataFrame (or a view over it) keeps
    reading that version until read again.  Tables using column mapping, deletion
    vectors or unknown reader features raise :class:`UnsupportedTableError`.

    >>> df = read_delta(spark, "/data/lake/messages", version=3)   # doctest: +SKIP
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    snap = snapshot(path, version)
    snap.check_plain_parquet()
    read_schema: StructType = schema if schema is not None else snap.spark_schema()
    names = read_schema.fieldNames()
    if not snap.files:
        return spark.createDataFrame([], _as_nullable(read_schema))

    if _partitions_path_safe(snap, set(names)):
        # Fast path: one scan; Spark takes partition values from the directory names
        # (typed by the explicit schema) and can prune partitions on filters.
        df = spark.read.schema(read_schema).option("basePath", snap.path).parquet(*snap.files)
        return df.select(*names)

    # Partition values Spark would mangle (non-ASCII strings, timestamps, decimals, ...):
    # read each partition's files without path parsing and add its values from the log.
    partition_fields = {f.name: f for f in read_schema.fields if f.name in snap.partition_columns}
    data_schema = StructType([f for f in read_schema.fields if f.name not in partition_fields])
    groups: dict[tuple, list[str]] = {}
    for file, values in zip(snap.files, snap.partition_values, strict=True):
        key = tuple(values.get(c) for c in partition_fields)
        groups.setdefault(key, []).append(file)
    parts = []
    for key, files in groups.items():
        part = spark.read.schema(data_schema).option("recursiveFileLookup", "true").parquet(*files)
        for (col, fld), value in zip(partition_fields.items(), key, strict=True):
            part = part.withColumn(col, F.lit(value).cast(fld.dataType))
        parts.append(part.select(*names))
    return functools.reduce(lambda a, b: a.unionByName(b), parts)


# -- maintenance ------------------------------------------------------------------------

def maintain(path: str | os.PathLike[str], *, compact: bool = True,
             vacuum_retention_hours: float | None = DEFAULT_VACUUM_RETENTION_HOURS, checkpoint: bool = True,
             allow_unsafe_retention: bool = False) -> dict[str, Any]:
    """Keep a table fast after many small commits: compact, vacuum, checkpoint; return what was done.

    * ``compact``: ``optimize.compact()`` rewrites small files into few large ones (same rows);
    * vacuum: deletes files removed from the table more than ``vacuum_retention_hours``
      ago (None: no vacuum).  Below :data:`MIN_SAFE_VACUUM_RETENTION_HOURS` it refuses
      unless ``allow_unsafe_retention`` (tests only): readers holding an older file
      list and time travel to older versions would break;
    * ``checkpoint``: writes a checkpoint of the latest version (readers then replay few
      JSON log entries) and drops log entries older than ``delta.logRetentionDuration``.

    Appends may run concurrently.  The result has ``version_before``/``version_after``,
    ``files_before``/``files_after`` and per step ``compact`` (delta-rs metrics),
    ``vacuumed`` (files deleted) and ``checkpoint_version`` -- None for skipped steps.

    >>> maintain("/data/lake/consume_queue")["files_after"]          # doctest: +SKIP
    1
    """
    if vacuum_retention_hours is not None:
        if isinstance(vacuum_retention_hours, bool) or not isinstance(vacuum_retention_hours, int | float) \
                or vacuum_retention_hours < 0:
            raise LakeError(f"vacuum_retention_hours must be a number >= 0 or None, got {vacuum_retention_hours!r}",
                            ErrorCode.INVALID_ARGUMENT)
        if vacuum_retention_hours < MIN_SAFE_VACUUM_RETENTION_HOURS and not allow_unsafe_retention:
            raise LakeError(f"vacuum_retention_hours={vacuum_retention_hours} is below the safe minimum of "
                            f"{MIN_SAFE_VACUUM_RETENTION_HOURS} h: readers holding older file lists and time travel "
                            "would fail; pass allow_unsafe_retention=True only in tests",
                            ErrorCode.INVALID_ARGUMENT)
    table = _open(path)
    result: dict[str, Any] = {
        "path": table.table_uri, "version_before": table.version(), "files_before": len(table.file_uris()),
        "compact": None, "vacuumed": None, "checkpoint_version": None,
    }
    if compact:
        result["compact"] = table.optimize.compact()
    if vacuum_retention_hours is not None:
        # delta-rs's own check compares with the table's deletedFileRetentionDuration (7 days);
        # our floor above is the guard, so its check is turned off.  dry_run defaults to True!
        deleted = table.vacuum(retention_hours=math.ceil(vacuum_retention_hours), dry_run=False,
                               enforce_retention_duration=False)
        result["vacuumed"] = len(deleted)
    if checkpoint:
        table = _open(path)  # the latest version, including commits made while compacting
        table.create_checkpoint()
        table.cleanup_metadata()
        result["checkpoint_version"] = table.version()
    latest = _open(path)
    result["version_after"] = latest.version()
    result["files_after"] = len(latest.file_uris())
    return result

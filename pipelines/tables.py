"""Every lake table, named once: its location under the lake root, schema, partitioning, catalog name.

A lake is a directory (the *lake root*) holding one Delta table per derived data set, written and
read by delta-spark.  Jobs, SQL, maintenance and the admin CLI find tables only through this module,
so a table's schema and place are defined exactly once.  The one exception is ``consumer_offsets``:
the broker writes it with delta-rs and may not import ``pipelines``, so its schema lives in
:mod:`sparkmq.platform.common.lake_tables` and is imported here.

Conventions for every table:

* a table lives in ``<lake_root>/<name>`` (``TableSpec.location == name``) and is registered in
  Spark's catalog as ``sparkmq.<name>`` (:func:`register_tables`), an external table over that path;
* it is created with :data:`~sparkmq.platform.common.lake_tables.PINNED_PROPERTIES` (Delta protocol
  reader 1 / writer 2, no deletion vectors, no column mapping), so the broker's delta-rs reads every
  table and writes ``consumer_offsets``;
* timestamps are ``timestamp[us, tz=UTC]`` (Spark ``TimestampType``, Delta ``timestamp``);
* store-side coordinates are ``broker`` (broker name), ``queue_id`` int32,
  ``queue_offset`` / ``commitlog_offset`` int64, as in the wire format;
* only the tables that grow with traffic are partitioned, by a *date* column, so retention can drop
  whole days;
* Delta collects file statistics only on the columns readers filter by (``stats_columns``): they
  are what data skipping uses (by Spark and by the broker's delta-rs lookups: producer msgIds grow with
  time, so their min/max skip files), and statistics on bodies and properties cost the writer time for
  nothing;
* columns whose values rarely repeat (bodies, unique ids, keys: ``plain_columns``) are written without
  Parquet dictionary encoding, which for them only costs the writer a hash lookup per value before it
  falls back (a table property Delta hands to the Parquet writer, ``parquet.enable.dictionary#<column>``).

Example::

    from sparkmq.pipelines import tables
    tables.ensure_table(spark, "/data/lake", tables.MESSAGES)   # 'sparkmq.messages'
    tables.register_tables(spark, "/data/lake")                  # every table that exists, as sparkmq.<name>
    spark.table("sparkmq.messages").count()
    tables.table_path("/data/lake", "messages")                  # '/data/lake/messages'
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING

import pyarrow as pa

from sparkmq.platform.common.backoff import Backoff, call_with_retries
from sparkmq.platform.common.lake_tables import (
    CONSUMER_OFFSETS_DESCRIPTION,
    CONSUMER_OFFSETS_SCHEMA,
    CONSUMER_OFFSETS_TABLE,
    PINNED_PROPERTIES,
)

from .errors import LakeError, SchemaMismatchError, UnknownTableError

if TYPE_CHECKING:  # pyspark is needed only by the Spark functions; keep the import cheap for the CLI
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "ALERTS",
    "CONSUMER_OFFSETS",
    "CONSUME_QUEUE",
    "DATABASE",
    "DEAD_LETTERS",
    "GROUP_STATS",
    "MESSAGES",
    "MESSAGE_KEYS",
    "MESSAGE_TRACE",
    "TABLES",
    "TOPIC_STATS",
    "TableSpec",
    "ensure_table",
    "ensure_tables",
    "get_spec",
    "is_table",
    "register_tables",
    "spark_schema",
    "table_path",
]

log = logging.getLogger(__name__)

#: The catalog database every session the project configures registers the tables under.
DATABASE = "sparkmq"

# -- table names ------------------------------------------------------------------------

CONSUME_QUEUE = "consume_queue"
MESSAGES = "messages"
MESSAGE_KEYS = "message_keys"
CONSUMER_OFFSETS = CONSUMER_OFFSETS_TABLE
MESSAGE_TRACE = "message_trace"
DEAD_LETTERS = "dead_letters"
TOPIC_STATS = "topic_stats"
GROUP_STATS = "group_stats"
ALERTS = "alerts"

# -- column types -----------------------------------------------------------------------

_TS = pa.timestamp("us", tz="UTC")
_PROPERTIES = pa.map_(pa.string(), pa.string())


def _req(name: str, type_: pa.DataType) -> pa.Field:
    """A required (NOT NULL) column."""
    return pa.field(name, type_, nullable=False)


def _opt(name: str, type_: pa.DataType) -> pa.Field:
    """An optional (nullable) column."""
    return pa.field(name, type_, nullable=True)


# -- the spec type ----------------------------------------------------------------------

@dataclass(frozen=True)
class TableSpec:
    """One lake table: where it lives under the lake root, its schema, partitioning and statistics columns.

    ``schema`` is the Arrow schema of the table (the Spark schema is derived from it, :func:`spark_schema`;
    delta-rs readers on the broker get exactly it).  ``stats_columns``: the columns Delta keeps min/max
    statistics of (empty: Delta's default, the first 32 columns).  ``plain_columns``: columns written
    without Parquet dictionary encoding (values that rarely repeat).
    """

    name: str
    location: str                     # relative, POSIX-style, under the lake root
    schema: pa.Schema
    partition_by: tuple[str, ...]
    description: str                  # one line; also the Delta table description
    stats_columns: tuple[str, ...] = ()
    plain_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        loc = PurePosixPath(self.location)
        if not self.location or loc.is_absolute() or ".." in loc.parts:
            raise ValueError(f"table {self.name!r}: location must be relative to the lake root, got {self.location!r}")
        missing = [c for c in (*self.partition_by, *self.stats_columns, *self.plain_columns)
                   if c not in self.schema.names]
        if missing:
            raise ValueError(f"table {self.name!r}: partition, statistics or plain columns {missing} are not in "
                             "the schema")

    def path(self, lake_root: str | os.PathLike[str]) -> str:
        """The table's location under ``lake_root`` (see :func:`table_path`)."""
        return _join(lake_root, self.location)

    @property
    def qualified_name(self) -> str:
        """The table's name in Spark's catalog: ``sparkmq.<name>``."""
        return f"{DATABASE}.{self.name}"

    @property
    def properties(self) -> dict[str, str]:
        """The Delta table properties it is created with: the pinned protocol, statistics and plain columns."""
        props = dict(PINNED_PROPERTIES)
        if self.stats_columns:
            props["delta.dataSkippingStatsColumns"] = ",".join(self.stats_columns)
        props.update({f"{_NO_DICTIONARY}#{c}": "false" for c in self.plain_columns})
        return props


#: The Parquet writer's per-column switch (Delta passes table properties to the Parquet writer).
_NO_DICTIONARY = "parquet.enable.dictionary"


def _spec(name: str, description: str, fields: Iterable[pa.Field], partition_by: tuple[str, ...] = (),
          stats_columns: tuple[str, ...] = (), plain_columns: tuple[str, ...] = ()) -> TableSpec:
    return TableSpec(name=name, location=name, schema=pa.schema(list(fields)), partition_by=partition_by,
                     description=description, stats_columns=stats_columns, plain_columns=plain_columns)


#: Where a message is: the statistics columns of the tables that hold one row per message.
_LOCATION_STATS = ("topic", "broker", "queue_id", "queue_offset", "commitlog_offset", "store_ts")


# -- the tables -------------------------------------------------------------------------
# Column order is the order Spark views show; partition columns go last because that
# is where Spark puts them anyway.

_CONSUME_QUEUE = _spec(CONSUME_QUEUE, "one row per stored message: where it is in its queue and the commit log", [
    _req("topic", pa.string()),
    _req("broker", pa.string()),
    _req("queue_id", pa.int32()),
    _req("queue_offset", pa.int64()),
    _req("commitlog_offset", pa.int64()),
    _req("size", pa.int32()),            # the record's size in the commit log, bytes
    _req("tag_hash", pa.int64()),
    _req("store_ts", _TS),
], stats_columns=_LOCATION_STATS)

_MESSAGES = _spec(MESSAGES, "every stored message in full (the lake tier serves pulls below log retention)", [
    _req("topic", pa.string()),
    _req("broker", pa.string()),
    _req("queue_id", pa.int32()),
    _req("queue_offset", pa.int64()),
    _req("commitlog_offset", pa.int64()),
    _req("size", pa.int32()),            # the record's size in the commit log, bytes
    _req("msg_id", pa.string()),         # the producer's unique id (UNIQ_KEY)
    _req("offset_msg_id", pa.string()),  # store host + commit-log offset
    _opt("tags", pa.string()),
    _opt("keys", pa.string()),           # the raw KEYS property: keys separated by spaces
    # The body exactly as stored: zlib-compressed when sys_flag has COMPRESSED, as on
    # the wire, so a pull served from the lake tier is byte-identical to one from the log.
    _req("body", pa.binary()),
    _opt("properties", _PROPERTIES),
    _req("born_ts", _TS),
    _req("born_host", pa.string()),
    _req("store_ts", _TS),
    _req("store_host", pa.string()),
    _req("reconsume_times", pa.int32()),
    _req("sys_flag", pa.int32()),
    _req("store_date", pa.date32()),     # UTC date of store_ts; the partition column
], partition_by=("store_date",), stats_columns=(*_LOCATION_STATS, "msg_id"),
   plain_columns=("msg_id", "offset_msg_id", "keys", "body"))

_MESSAGE_KEYS = _spec(MESSAGE_KEYS, "the index: every message's unique id and each of its keys -> its location", [
    _req("key", pa.string()),
    _req("key_type", pa.string()),       # 'msg_id' (the unique id) or 'key' (one of the KEYS)
    _req("topic", pa.string()),
    _req("broker", pa.string()),
    _req("queue_id", pa.int32()),
    _req("queue_offset", pa.int64()),
    _req("commitlog_offset", pa.int64()),
    _req("store_ts", _TS),
], stats_columns=("key", "key_type", *_LOCATION_STATS), plain_columns=("key",))

_CONSUMER_OFFSETS = TableSpec(
    name=CONSUMER_OFFSETS, location=CONSUMER_OFFSETS, schema=CONSUMER_OFFSETS_SCHEMA, partition_by=(),
    description=CONSUMER_OFFSETS_DESCRIPTION)

_MESSAGE_TRACE = _spec(MESSAGE_TRACE, "trace events: send, store, deliver, consume, retry, dlq, transaction", [
    _req("trace_id", pa.string()),       # id of the trace context (one send, one consume attempt, ...)
    _req("msg_id", pa.string()),
    _req("topic", pa.string()),
    _opt("group", pa.string()),          # producer or consumer group
    _opt("client_id", pa.string()),
    _req("event_type", pa.string()),     # send | store | deliver | consume | retry | dlq | transaction
    _req("status", pa.string()),         # e.g. SEND_OK, CONSUME_SUCCESS, RECONSUME_LATER, COMMIT
    _opt("cost_ms", pa.int64()),
    _req("event_ts", _TS),               # when the event happened
    _opt("born_ts", _TS),
    _opt("store_ts", _TS),
    _opt("broker", pa.string()),
    _opt("queue_id", pa.int32()),
    _opt("queue_offset", pa.int64()),
    _opt("reconsume_times", pa.int32()),
    _opt("tags", pa.string()),
    _opt("keys", pa.string()),
    _opt("detail", pa.string()),         # free text: error message, transaction state, ...
    _req("event_date", pa.date32()),     # UTC date of event_ts; the partition column
], partition_by=("event_date",),
   stats_columns=("msg_id", "topic", "event_type", "event_ts", "broker", "queue_id", "queue_offset"),
   plain_columns=("trace_id", "msg_id"))

_DEAD_LETTERS = _spec(DEAD_LETTERS, "messages moved to a %DLQ% topic after too many failed consumption attempts", [
    _req("group", pa.string()),
    _req("original_topic", pa.string()),
    _req("msg_id", pa.string()),
    _req("reconsume_times", pa.int32()),
    _opt("reason", pa.string()),
    _req("dlq_ts", _TS),                 # when it was stored in the DLQ topic
    _req("broker", pa.string()),
    _req("dlq_topic", pa.string()),      # %DLQ%<group>
    _req("dlq_queue_id", pa.int32()),
    _req("dlq_offset", pa.int64()),      # queue offset in the DLQ topic (for re-drive)
    _opt("tags", pa.string()),
    _opt("keys", pa.string()),
    _opt("properties", _PROPERTIES),
    _req("body", pa.binary()),
], plain_columns=("msg_id", "body"))

_TOPIC_STATS = _spec(TOPIC_STATS, "per minute and topic on each broker: messages and bytes in and out, TPS", [
    _req("window_start", _TS),           # minute windows: [window_start, window_start + 60 s)
    _req("topic", pa.string()),
    _req("broker", pa.string()),
    _req("messages_in", pa.int64()),
    _req("bytes_in", pa.int64()),
    _req("messages_out", pa.int64()),
    _req("bytes_out", pa.int64()),
    _req("tps_in", pa.float64()),
    _req("tps_out", pa.float64()),
])

_GROUP_STATS = _spec(GROUP_STATS, "per minute and consumer group on each queue: consumed messages, TPS and lag", [
    _req("window_start", _TS),
    _req("group", pa.string()),
    _req("topic", pa.string()),
    _req("broker", pa.string()),
    _req("queue_id", pa.int32()),
    _req("messages_in", pa.int64()),     # stored on the queue during the window
    _req("messages_out", pa.int64()),    # consumed by the group during the window
    _req("bytes_out", pa.int64()),
    _req("tps_out", pa.float64()),
    _opt("committed_offset", pa.int64()),  # NULL while the group has never committed on the queue
    _req("max_offset", pa.int64()),
    _req("lag", pa.int64()),             # at the end of the window
])

_ALERTS = _spec(ALERTS, "alerts raised by the report rules; resolved_at is NULL while an alert is open", [
    _req("alert_id", pa.string()),       # stable id: the key a resolve updates
    _req("rule", pa.string()),
    _req("subject", pa.string()),        # what the rule fired on, e.g. 'group=g1 topic=t1'
    _req("severity", pa.string()),       # info | warning | critical
    _opt("value", pa.float64()),
    _opt("threshold", pa.float64()),
    _req("raised_at", _TS),
    _opt("resolved_at", _TS),
    _opt("detail", pa.string()),
])

#: Every lake table by name, in a stable order.
TABLES: Mapping[str, TableSpec] = MappingProxyType({s.name: s for s in (
    _CONSUME_QUEUE, _MESSAGES, _MESSAGE_KEYS, _CONSUMER_OFFSETS, _MESSAGE_TRACE, _DEAD_LETTERS,
    _TOPIC_STATS, _GROUP_STATS, _ALERTS,
)})


# -- lookups ----------------------------------------------------------------------------

def get_spec(name: str) -> TableSpec:
    """The spec of table ``name``; :class:`UnknownTableError` (INVALID_ARGUMENT) names the known tables."""
    try:
        return TABLES[name]
    except (KeyError, TypeError):
        raise UnknownTableError(f"no lake table named {name!r}; the tables are {', '.join(TABLES)}") from None


def _join(lake_root: str | os.PathLike[str], location: str) -> str:
    root = os.fspath(lake_root)
    if "://" in root:  # an object-store URI (s3://, abfss://, ...): join as text
        return root.rstrip("/") + "/" + location
    # Absolute, so Spark and delta-rs agree on the path whatever the working directory.
    return str(Path(root).absolute() / location)


def table_path(lake_root: str | os.PathLike[str], name: str) -> str:
    """Where table ``name`` lives under ``lake_root``: an absolute local path, or a URI under a URI root.

    >>> table_path("/data/lake", "messages")
    '/data/lake/messages'
    """
    return get_spec(name).path(lake_root)


def spark_schema(spec: TableSpec | str) -> StructType:
    """The Spark ``StructType`` of a table (a spec or a table name), converted from its Arrow schema.

    Nullability carries over; timestamps become ``TimestampType`` (UTC instants) and
    the properties maps ``MapType(string, string, valueContainsNull=True)``.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    if isinstance(spec, str):
        spec = get_spec(spec)
    return from_arrow_schema(spec.schema)


# -- creation and the catalog ---------------------------------------------------------------

#: Serialises creation and registration in this process (jobs start on several threads).
_lock = threading.RLock()
#: What this process registered: (Spark application, table) -> location, so a repeated registration
#: of the same lake costs no catalog round trip.
_registered: dict[tuple[str, str], str] = {}
#: Creating a table is tried five times, 50, 100, 150 and 200 ms apart.
_CREATE_ATTEMPTS = 5
_CREATE_RETRY = Backoff(initial_s=0.05, max_s=0.2, factor=1.0, increment_s=0.05)


def _sql_string(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _app(spark: SparkSession) -> str:
    try:
        return spark.sparkContext.applicationId
    except Exception:  # Spark Connect has no SparkContext  # noqa: BLE001
        return str(id(spark))


def is_table(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` holds a Delta table (a local path is checked without Spark: it has ``_delta_log``)."""
    if "://" not in path or path.startswith("file:"):
        log_dir = Path(path.removeprefix("file:")) / "_delta_log"
        return log_dir.is_dir() and any(log_dir.glob("*.json"))
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, path)


def _field_text(field_: object) -> str:
    return f"{field_.name} {field_.dataType.simpleString()}{'' if field_.nullable else ' NOT NULL'}"  # type: ignore[attr-defined]


def _check_matches(spark: SparkSession, spec: TableSpec, path: str) -> None:
    """Raise SchemaMismatchError unless the table at ``path`` has the spec's schema and partitioning."""
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    want, have = spark_schema(spec), table.toDF().schema
    if [_field_text(f) for f in want.fields] != [_field_text(f) for f in have.fields]:
        want_f = {f.name: _field_text(f) for f in want.fields}
        have_f = {f.name: _field_text(f) for f in have.fields}
        diff = sorted(n for n in want_f.keys() | have_f.keys() if want_f.get(n) != have_f.get(n))
        raise SchemaMismatchError(f"the table at {path} does not have the schema of {spec.name!r} "
                                  f"(columns that differ: {', '.join(diff) or 'order only'}); "
                                  "migrate or move it away before using this lake root")
    partitions = _partition_columns(spark, path)
    if partitions != spec.partition_by:
        raise SchemaMismatchError(f"the table at {path} is partitioned by {list(partitions)}, "
                                  f"but {spec.name!r} is partitioned by {list(spec.partition_by)}")


def _partition_columns(spark: SparkSession, path: str) -> tuple[str, ...]:
    """The partition columns of the Delta table at ``path``, in order.

    From ``DESCRIBE TABLE``, which reads the table's metadata only: ``DESCRIBE DETAIL`` also counts the table's
    files, a Spark job over its whole state (2.5 s a table on a cold driver of a loaded 2-core machine, where every
    lake start checks five tables).
    """
    rows = spark.sql(f"DESCRIBE TABLE delta.`{path.replace('`', '``')}`").collect()
    names = [row.col_name for row in rows]
    if "# Partition Information" not in names:
        return ()
    start = names.index("# Partition Information") + 2     # past the "# col_name" heading
    partitions: list[str] = []
    for name in names[start:]:
        if not name or name.startswith("#"):                # the end of the section
            break
        partitions.append(name)
    return tuple(partitions)


def _create(spark: SparkSession, spec: TableSpec, path: str) -> None:
    """Create the table at ``path`` (by path: its catalog name is :func:`register_tables`' business)."""
    from delta.tables import DeltaTable

    builder = (DeltaTable.createIfNotExists(spark).location(path).addColumns(spark_schema(spec))
               .comment(spec.description))
    if spec.partition_by:
        builder = builder.partitionedBy(*spec.partition_by)
    for key, value in spec.properties.items():
        builder = builder.property(key, value)
    builder.execute()


def ensure_table(spark: SparkSession, lake_root: str | os.PathLike[str], name: str) -> str:
    """Create table ``name`` under ``lake_root`` with delta-spark if it does not exist, register it under
    ``sparkmq``; return its catalog name (``sparkmq.<name>``).

    Idempotent, and safe under concurrent creators (threads here, other processes: Delta's log admits one
    version 0).  An existing table must match the spec (schema, nullability, partitioning), else
    :class:`SchemaMismatchError`; a directory that is not a Delta table gives :class:`LakeError`.
    """
    spec = get_spec(name)
    path = spec.path(lake_root)

    def create_if_missing() -> None:
        if is_table(spark, path):
            return
        if Path(path).is_dir() and any(p.name != "_delta_log" for p in Path(path).iterdir()):
            raise LakeError(f"could not create the table {spec.name!r} at {path}: the path exists and is "
                            "not a Delta table")
        _create(spark, spec, path)

    with _lock:
        try:
            # A failed create is most likely a concurrent creator that committed version 0 first: look again.
            call_with_retries(create_if_missing, _CREATE_RETRY, attempts=_CREATE_ATTEMPTS,
                              retry_if=lambda exc: not isinstance(exc, LakeError))
        except LakeError:
            raise
        except Exception as exc:
            raise LakeError(f"could not create the table {spec.name!r} at {path}: {exc}") from exc
        _check_matches(spark, spec, path)
        _register(spark, spec, path)
        return spec.qualified_name


def ensure_tables(spark: SparkSession, lake_root: str | os.PathLike[str],
                  names: Iterable[str] | None = None) -> dict[str, str]:
    """:func:`ensure_table` for each of ``names`` (default: every table); their catalog names by table."""
    return {name: ensure_table(spark, lake_root, name) for name in (TABLES if names is None else names)}


def _register(spark: SparkSession, spec: TableSpec, path: str) -> None:
    """``sparkmq.<name>`` as an external table over ``path`` (re-pointed when it named another path)."""
    key = (_app(spark), spec.name)
    if _registered.get(key) == path:
        return
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    if spark.catalog.tableExists(spec.qualified_name):
        # External: DROP TABLE forgets the name and keeps the files.
        spark.sql(f"DROP TABLE {spec.qualified_name}")
    spark.sql(f"CREATE TABLE {spec.qualified_name} USING DELTA LOCATION {_sql_string(path)}")
    _registered[key] = path


def register_tables(spark: SparkSession, lake_root: str | os.PathLike[str],
                    names: Iterable[str] | None = None) -> list[str]:
    """Register every table of ``names`` (default all) that exists under ``lake_root`` as ``sparkmq.<name>``.

    What a session needs for ``spark.table("sparkmq.messages")``, ``DESCRIBE HISTORY sparkmq.messages`` and
    time travel.  The catalog is Spark's in-memory one unless the session has Hive support, so every
    session registers again (this does, cheaply, when the names already point at ``lake_root``).  A table
    not (yet) created under ``lake_root`` is left unregistered, and a name left from another lake root is
    dropped, so it cannot show that lake's data.  Returns the table names registered, in
    :data:`TABLES` order.

    >>> register_tables(spark, "/data/lake")                        # doctest: +SKIP
    ['consume_queue', 'messages', 'message_keys', 'consumer_offsets']
    """
    wanted = list(TABLES) if names is None else [get_spec(n).name for n in names]
    registered = []
    with _lock:
        for name in wanted:
            spec = get_spec(name)
            path = spec.path(lake_root)
            if is_table(spark, path):
                _register(spark, spec, path)
                registered.append(name)
            elif _registered.pop((_app(spark), name), None) is not None or (
                    spark.catalog.databaseExists(DATABASE) and spark.catalog.tableExists(spec.qualified_name)):
                spark.sql(f"DROP TABLE IF EXISTS {spec.qualified_name}")
    return registered

"""Every lake table, named once: its location under the lake root, schema, partitioning.

A lake is a directory (the *lake root*) holding one Delta table per derived data set.
Jobs, the SQL views, maintenance and the admin CLI find tables only through this
module, so a table's schema and place are defined exactly once.
The one exception is ``consumer_offsets``: the broker writes it and may not import
``pipelines``, so its schema lives in :mod:`sparkmq.platform.common.lake_tables` and is
imported here.

Conventions for every table:

* a table lives in ``<lake_root>/<name>`` (``TableSpec.location == name``);
* timestamps are ``timestamp[us, tz=UTC]`` (Spark ``TimestampType``, Delta ``timestamp``);
* store-side coordinates are ``broker`` (broker name), ``queue_id`` int32,
  ``queue_offset`` / ``commitlog_offset`` int64, as in the wire format;
* only the tables that grow with traffic are partitioned, by a *date* column: date
  partition values survive the Hive path encoding that Spark parses (non-ASCII strings
  would not, see ``delta_io.read_delta``) and let retention drop whole days.

Example::

    from sparkmq.pipelines import tables
    dt = tables.ensure_table("/data/lake", tables.MESSAGES)   # deltalake.DeltaTable
    tables.table_path("/data/lake", "messages")                # '/data/lake/messages'
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import DeltaError

from sparkmq.platform.common.lake_tables import (
    CONSUMER_OFFSETS_DESCRIPTION,
    CONSUMER_OFFSETS_SCHEMA,
    CONSUMER_OFFSETS_TABLE,
)

from .errors import LakeError, SchemaMismatchError, UnknownTableError

if TYPE_CHECKING:  # pyspark is needed only by spark_schema(); keep the import cheap for the CLI
    from pyspark.sql.types import StructType

__all__ = [
    "ALERTS",
    "CONSUMER_OFFSETS",
    "CONSUME_QUEUE",
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
    "spark_schema",
    "table_path",
]

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
    """One lake table: where it lives under the lake root, its schema and its partitioning.

    ``schema`` is the Arrow schema writers must produce (delta-rs accepts columns in any
    order and nullable Arrow fields without nulls, e.g. from ``DataFrame.toArrow()``).
    """

    name: str
    location: str                     # relative, POSIX-style, under the lake root
    schema: pa.Schema
    partition_by: tuple[str, ...]
    description: str                  # one line; also the Delta table description

    def __post_init__(self) -> None:
        loc = PurePosixPath(self.location)
        if not self.location or loc.is_absolute() or ".." in loc.parts:
            raise ValueError(f"table {self.name!r}: location must be relative to the lake root, got {self.location!r}")
        missing = [c for c in self.partition_by if c not in self.schema.names]
        if missing:
            raise ValueError(f"table {self.name!r}: partition columns {missing} are not in the schema")

    def path(self, lake_root: str | os.PathLike[str]) -> str:
        """The table's location under ``lake_root`` (see :func:`table_path`)."""
        return _join(lake_root, self.location)


def _spec(name: str, description: str, fields: Iterable[pa.Field], partition_by: tuple[str, ...] = ()) -> TableSpec:
    return TableSpec(name=name, location=name, schema=pa.schema(list(fields)), partition_by=partition_by,
                     description=description)


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
])

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
], partition_by=("store_date",))

_MESSAGE_KEYS = _spec(MESSAGE_KEYS, "the index: every message's unique id and each of its keys -> its location", [
    _req("key", pa.string()),
    _req("key_type", pa.string()),       # 'msg_id' (the unique id) or 'key' (one of the KEYS)
    _req("topic", pa.string()),
    _req("broker", pa.string()),
    _req("queue_id", pa.int32()),
    _req("queue_offset", pa.int64()),
    _req("commitlog_offset", pa.int64()),
    _req("store_ts", _TS),
])

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
], partition_by=("event_date",))

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
])

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


# -- creation ---------------------------------------------------------------------------

def _delta_schema_json(schema: pa.Schema) -> dict:
    return json.loads(Schema.from_arrow(schema).to_json())


def _check_matches(spec: TableSpec, table: DeltaTable, path: str) -> None:
    """Raise SchemaMismatchError unless the table at ``path`` has the spec's schema and partitioning."""
    want, have = _delta_schema_json(spec.schema), json.loads(table.schema().to_json())
    if want != have:
        want_f = {f["name"]: f for f in want["fields"]}
        have_f = {f["name"]: f for f in have["fields"]}
        diff = sorted(n for n in want_f.keys() | have_f.keys() if want_f.get(n) != have_f.get(n))
        raise SchemaMismatchError(f"the table at {path} does not have the schema of {spec.name!r} "
                                  f"(columns that differ: {', '.join(diff) or 'order only'}); "
                                  "migrate or move it away before using this lake root")
    partitions = tuple(table.metadata().partition_columns)
    if partitions != spec.partition_by:
        raise SchemaMismatchError(f"the table at {path} is partitioned by {list(partitions)}, "
                                  f"but {spec.name!r} is partitioned by {list(spec.partition_by)}")


def _create(spec: TableSpec, path: str) -> None:
    kwargs = {"partition_by": list(spec.partition_by) or None, "name": spec.name, "description": spec.description}
    if "://" in path:
        # Object stores have no atomic directory rename; delta-rs's put-if-absent on the
        # first log entry is the only guard.  A racing creator may still commit a second
        # CREATE as version 1 (same schema, so harmless); _check_matches catches the rest.
        DeltaTable.create(path, spec.schema, mode="ignore", **kwargs)
        return
    # Local disk: racing DeltaTable.create(mode="ignore") calls were seen to commit the
    # CREATE twice (versions 0 and 1) or fail with "protocol changed".  Instead build the
    # table in a private directory and rename it into place: rename(2) is atomic and
    # fails when the target already holds a table, so exactly one creator wins.
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.creating-{uuid.uuid4().hex}"
    try:
        DeltaTable.create(str(staging), spec.schema, mode="error", **kwargs)
        try:
            os.rename(staging, target)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # Lost the race (or the directory holds something else): the caller re-opens.
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_table(lake_root: str | os.PathLike[str], name: str) -> DeltaTable:
    """Create table ``name`` under ``lake_root`` if it does not exist; return it opened.

    Idempotent and safe under concurrent creators (processes or threads): exactly one
    CREATE is committed on a local disk.  An existing table must match the spec
    (schema, nullability, partitioning), else :class:`SchemaMismatchError`.
    """
    spec = get_spec(name)
    path = spec.path(lake_root)
    last_error: Exception | None = None
    for _ in range(3):
        if not DeltaTable.is_deltatable(path):
            try:
                _create(spec, path)
            except (DeltaError, OSError) as exc:
                last_error = exc  # most likely a concurrent creator; re-check below
        if DeltaTable.is_deltatable(path):
            table = DeltaTable(path)
            _check_matches(spec, table, path)
            return table
    raise LakeError(f"could not create the table {spec.name!r} at {path}: "
                    f"{last_error or 'the path exists and is not a Delta table'}")


def ensure_tables(lake_root: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, DeltaTable]:
    """:func:`ensure_table` for each of ``names`` (default: every table); returns them by name."""
    return {name: ensure_table(lake_root, name) for name in (TABLES if names is None else names)}

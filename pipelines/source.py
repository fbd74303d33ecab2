"""The ``sparkmq`` Spark data source: batch and streaming reads of topics, Kafka style.

Register it once per SparkSession, then read::

    from sparkmq.pipelines.source import register
    register(spark)
    df = (spark.readStream.format("sparkmq")
          .option("namesrv", "127.0.0.1:9876")
          .option("subscribe", "orders,payments")
          .option("startingOffsets", "earliest")
          .option("maxMessagesPerTrigger", 10000)
          .load())

The driver plans through the name servers' and brokers' HTTP API; executors pull over the
brokers' binary remoting protocol where a broker's route names a remoting endpoint (the stored
records, decoded in bulk into Arrow), else over HTTP with Arrow pulls.  So it works from any
Spark cluster that reaches the brokers.  The same format name writes, see :mod:`.sink`.

Columns (:data:`SOURCE_SCHEMA`; one row per message)
====================  =====================  ===============================================
column                type                   meaning
====================  =====================  ===============================================
topic                 string                 the topic
broker                string                 the broker name that stores it
queue_id              int                    the queue on that broker
queue_offset          bigint                 the message's offset in its queue
msg_id                string                 the producer's unique id (UNIQ_KEY)
offset_msg_id         string                 store host + commit-log offset (RocketMQ's offsetMsgId)
keys                  array<string>          the message keys (empty when none)
tags                  string                 the tag, NULL when none
body                  binary                 the body, inflated (as stored when ``raw``)
properties            map<string,string>     user properties (all of them when ``raw``)
born_timestamp        timestamp (UTC)        when the producer made it
store_timestamp       timestamp (UTC)        when the broker stored it
born_host             string                 producer address
store_host            string                 broker address
reconsume_times       int                    delivery attempts before this copy (retry topics)
commitlog_offset      bigint                 the record's commit-log offset on its broker
store_size            int                    the record's size in the commit log, bytes
sys_flag              int                    the stored sys flag (bit 0x1: body stored compressed)
====================  =====================  ===============================================

Options (names are case-insensitive; an unknown option is an error that names it)
* ``namesrv`` ("host:port;host:port") or ``brokers`` ("brokerName=host:port,...", a cluster
  without name servers) -- exactly one.
* ``subscribe`` (comma list of topics) | ``subscribePattern`` (regex, full match, over the
  cluster's topic list) | ``assign`` (JSON ``{"topic": ["brokerName/0", ...]}`` or
  ``{"topic": {"brokerName/0": ...}}``) -- exactly one.  Patterns leave out reserved topics
  (``%RETRY%``, ``%DLQ%``, ``RMQ_SYS_*``, schedule, timer, ``TBW102``) unless
  ``includeSystemTopics`` is true.
* ``startingOffsets``: ``earliest`` | ``latest`` | JSON ``{"topic": {"brokerName/queueId": offset}}``
  (-2 earliest, -1 latest; queues left out start at earliest).  Default: ``latest`` for streams,
  ``earliest`` for batch.  Streams use it only when a query starts without a checkpoint.
* ``startingTimestamp`` (epoch ms): start each queue at the first message stored at or after it.
* ``endingOffsets`` (batch only): ``latest`` (default) | JSON (-1 latest; queues left out: latest).
* ``maxMessagesPerTrigger`` (streams): admission control -- a micro-batch spans at most this
  many queue offsets, shared among queues in proportion to their backlog.
* ``failOnDataLoss`` (default true): a range that is no longer in the log (retention deleted
  it, or a broker lost an unflushed tail) fails the query with a clear error; false skips it.
* ``tags``: broker-side tag filter (``A || B``); ``pullBatchSize`` (messages per pull, 1..16384,
  default 8192; tag-filtered pulls take at most 1024); ``maxMessagesPerPartition`` (split big
  queue ranges into several tasks).
* ``group``: after each batch, commit the read offsets to this consumer group on the brokers,
  so ``GET /consumers/{group}/lag`` shows how far the query is behind.  Progress itself lives in
  the checkpoint, as with Kafka; the group's offsets are only a view of it.
* ``raw`` (default false): the stored form -- body as stored (zlib-compressed when ``sys_flag``
  has 0x1) and every property including TAGS, KEYS and UNIQ_KEY.  The dispatch job reads this.
* ``requestTimeoutMs`` (default 30000): timeout of each request (HTTP or remoting pull).
* ``accessKey`` and ``secretKey`` (together): sign every request, the driver's and the executors'
  (brokers and name servers with ACL on, ``docs/security.md``).  The user needs ``Sub`` and ``Get`` on
  the topics (``Get``: the queue bounds the driver plans with), and ``Sub`` on ``group`` when that
  option is set.  Without them a broker with ACL on refuses the query with AUTHENTICATION_FAILED,
  naming these options.

Offsets (checkpoints, ``startingOffsets``) are ``{"topic": {"brokerName/queueId": nextOffset}}``
with topics, broker names and queue ids in sorted order.  A queue that appears while a stream
runs (a topic gains queues, a broker joins, a pattern matches a new topic) first shows up in a
batch's end offset at its minimum offset and is read from the next batch on -- deterministic
offsets, one trigger of delay.

Delivery: every message once per checkpoint (Spark replays a failed batch from the same offsets).
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.client import MessageQueue
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.filtering import parse_tags
from sparkmq.platform.common.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQUE_ID
from sparkmq.platform.common.protocol import MAX_BULK_PULL_BATCH, MAX_PULL_BATCH
from sparkmq.platform.common.sysflag import COMPRESSED
from sparkmq.platform.common.system_topics import is_system_topic
from sparkmq.platform.common.validation import validate_group, validate_topic
from sparkmq.platform.common.wire import inflate

from .cluster_io import (
    CREDENTIAL_OPTIONS,
    ClusterView,
    Endpoints,
    OptionError,
    QueueBounds,
    credentials_option,
    pull_arrow,
    queue_sort_key,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

__all__ = [
    "FORMAT",
    "SOURCE_OPTIONS",
    "SOURCE_SCHEMA",
    "SOURCE_SCHEMA_DDL",
    "DataLossError",
    "QueueRange",
    "ReadSettings",
    "SourceOptions",
    "SparkMQBatchReader",
    "SparkMQDataSource",
    "SparkMQStreamReader",
    "admit",
    "canonical_options",
    "is_reserved_topic",
    "offsets_from_json",
    "offsets_to_json",
    "plan_ranges",
    "read_range",
    "register",
    "source_arrow_schema",
    "to_source_batch",
]

log = logging.getLogger(__name__)

#: The format name: ``spark.read.format(FORMAT)``.
FORMAT = "sparkmq"

#: The source's columns as a Spark ``StructType`` (see the module docstring for their meaning).
SOURCE_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("broker", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("msg_id", StringType(), False),
    StructField("offset_msg_id", StringType(), False),
    StructField("keys", ArrayType(StringType(), containsNull=False), False),
    StructField("tags", StringType(), True),
    StructField("body", BinaryType(), False),
    StructField("properties", MapType(StringType(), StringType()), False),
    StructField("born_timestamp", TimestampType(), False),
    StructField("store_timestamp", TimestampType(), False),
    StructField("born_host", StringType(), False),
    StructField("store_host", StringType(), False),
    StructField("reconsume_times", IntegerType(), False),
    StructField("commitlog_offset", LongType(), False),
    StructField("store_size", IntegerType(), False),
    StructField("sys_flag", IntegerType(), False),
])

#: The same as DDL (``simpleString`` form), e.g. for ``from_json``-style declarations and docs.
SOURCE_SCHEMA_DDL = ", ".join(f"{f.name} {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                              for f in SOURCE_SCHEMA.fields)

#: Reserved topics that exist on every broker but are not something a subscriber reads
#: (RocketMQ's auto-create template topic; the rest is ``is_system_topic``).
_TEMPLATE_TOPICS = frozenset({"TBW102"})


@cache
def _hidden_properties(raw: bool) -> pa.Array:
    """Properties left out of ``properties``: none when ``raw``, else those the source shows as columns.

    Built on first use, not at import: ``pa.array`` of a list imports pandas (pyarrow checks lists for pandas
    objects), 0.4 s here that Spark's planner and stream-runner workers, which never read rows, need not pay.
    """
    return pa.array([] if raw else [PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQUE_ID], type=pa.string())


#: Pull statuses (docs/http-api.md).
_FOUND, _NO_NEW, _NO_MATCHED = "FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG"
_TOO_SMALL, _OVERFLOW, _NO_QUEUE = "OFFSET_TOO_SMALL", "OFFSET_OVERFLOW", "NO_MATCHED_QUEUE"

#: The broker's caps on one pull: a tag-filtered one (MAX_PULL_BATCH) and a bulk one (an HTTP
#: Arrow pull, or a remoting pull without a group: MAX_BULK_PULL_BATCH), and the default: big
#: pulls spread each request's fixed cost.
_MAX_FILTERED_PULL = MAX_PULL_BATCH
_MAX_PULL = MAX_BULK_PULL_BATCH
_DEFAULT_PULL = 8192

EARLIEST, LATEST = -2, -1


def register(spark: SparkSession) -> None:
    """Register the ``sparkmq`` format (source and sink) with ``spark``; idempotent per session."""
    spark.dataSource.register(SparkMQDataSource)


def is_reserved_topic(topic: str) -> bool:
    """Whether a pattern subscription leaves ``topic`` out unless ``includeSystemTopics`` is set."""
    return is_system_topic(topic) or topic in _TEMPLATE_TOPICS


# -- options ----------------------------------------------------------------------------------------

#: Every option the source knows (canonical spelling), for the unknown-option check.
SOURCE_OPTIONS = (
    "namesrv", "brokers", "subscribe", "subscribePattern", "assign", "includeSystemTopics", "startingOffsets",
    "startingTimestamp", "endingOffsets", "maxMessagesPerTrigger", "failOnDataLoss", "tags", "pullBatchSize",
    "maxMessagesPerPartition", "group", "raw", "requestTimeoutMs", *CREDENTIAL_OPTIONS,
)


def canonical_options(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """``options`` under their canonical names; :class:`OptionError` naming any unknown option.

    Spark hands data sources a case-insensitive mapping whose keys may be lower-cased.
    """
    by_lower = {k.lower(): k for k in known}
    out: dict[str, str] = {}
    for key, value in options.items():
        name = by_lower.get(key.lower())
        if name is None:
            raise OptionError(key, f"unknown option of the sparkmq {what}; the options are {', '.join(known)}")
        out[name] = str(value)
    return out


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None:
        return default
    if text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    raise OptionError(name, f"expected true or false, got {text!r}")


def _int(opts: Mapping[str, str], name: str, low: int, high: int = 2**63 - 1) -> int | None:
    text = opts.get(name)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(name, f"expected an integer, got {text!r}") from None
    if not low <= value <= high:
        raise OptionError(name, f"must be between {low} and {high}, got {value}")
    return value


def _queue_key(option: str, topic: str, key: object) -> MessageQueue:
    """``"brokerName/queueId"`` of ``topic`` as a queue."""
    if isinstance(key, str):
        broker, sep, qid = key.rpartition("/")
        if sep and broker and qid.isdigit():
            return MessageQueue(topic, broker, int(qid))
    raise OptionError(option, f"queue keys look like 'brokerName/queueId', got {key!r} in topic {topic!r}")


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(option, f"not valid JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise OptionError(option, f"expected a JSON object keyed by topic, got {text!r}")
    return value


def _offsets_option(option: str, text: str, allowed: tuple[int, ...]) -> dict[MessageQueue, int]:
    """A JSON ``{"topic": {"brokerName/queueId": offset}}`` option; ``allowed`` are the negative specials."""
    out: dict[MessageQueue, int] = {}
    for topic, queues in _json_object(option, text).items():
        _topic(option, topic)
        if not isinstance(queues, dict):
            raise OptionError(option, f"topic {topic!r}: expected {{\"brokerName/queueId\": offset}}, "
                                      f"got {json.dumps(queues)}")
        for key, offset in queues.items():
            mq = _queue_key(option, topic, key)
            if isinstance(offset, bool) or not isinstance(offset, int) or (offset < 0 and offset not in allowed):
                accepted = " or ".join([">= 0", *(str(a) for a in allowed)])
                raise OptionError(option, f"{topic} {key}: expected an offset {accepted}, got {json.dumps(offset)}")
            out[mq] = offset
    return out


def _topic(option: str, topic: object) -> str:
    try:
        return validate_topic(topic)
    except SparkMQError as exc:
        raise OptionError(option, exc.message) from None


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed and checked (see the module docstring).  Picklable."""

    endpoints: Endpoints
    streaming: bool
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[MessageQueue, ...] = ()
    include_system_topics: bool = False
    #: "earliest", "latest" or explicit offsets (EARLIEST / LATEST allowed as values)
    starting: str | Mapping[MessageQueue, int] = "latest"
    starting_timestamp: int | None = None
    #: "latest" or explicit offsets (LATEST allowed)
    ending: str | Mapping[MessageQueue, int] = "latest"
    max_messages_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    tags: str = "*"
    pull_batch_size: int = _DEFAULT_PULL
    max_messages_per_partition: int | None = None
    group: str | None = None
    raw: bool = False
    request_timeout_s: float = 30.0
    #: Signs every request (brokers with ACL on); travels to the executors with the plan.
    credentials: Credentials | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        """Parse Spark's option mapping; :class:`OptionError` (INVALID_ARGUMENT) names the bad option."""
        opts = canonical_options(options, SOURCE_OPTIONS, "source")
        endpoints = Endpoints.parse(opts.get("namesrv"), opts.get("brokers"))
        kw: dict[str, Any] = {}

        chosen = [n for n in ("subscribe", "subscribePattern", "assign") if opts.get(n, "").strip()]
        if len(chosen) != 1:
            raise OptionError(chosen[1] if len(chosen) > 1 else "subscribe",
                              "give exactly one of 'subscribe', 'subscribePattern' or 'assign'"
                              + (f", not {' and '.join(chosen)}" if chosen else ""))
        if "subscribe" in chosen:
            kw["subscribe"] = tuple(sorted({_topic("subscribe", t.strip())
                                            for t in opts["subscribe"].split(",") if t.strip()}))
        elif "subscribePattern" in chosen:
            try:
                re.compile(opts["subscribePattern"])
            except re.error as exc:
                raise OptionError("subscribePattern", f"not a valid regular expression: {exc}") from None
            kw["subscribe_pattern"] = opts["subscribePattern"]
        else:
            queues: set[MessageQueue] = set()
            for topic, spec in _json_object("assign", opts["assign"]).items():
                _topic("assign", topic)
                keys = list(spec) if isinstance(spec, dict | list) else None
                if not keys:
                    raise OptionError("assign", f"topic {topic!r}: expected a non-empty list of "
                                                f"'brokerName/queueId' (or an object keyed by them)")
                queues.update(_queue_key("assign", topic, k) for k in keys)
            kw["assign"] = tuple(sorted(queues, key=queue_sort_key))
        kw["include_system_topics"] = _bool(opts, "includeSystemTopics", False)

        starting = opts.get("startingOffsets")
        if starting is not None and opts.get("startingTimestamp") is not None:
            raise OptionError("startingTimestamp", "give either 'startingOffsets' or 'startingTimestamp', not both")
        kw["starting_timestamp"] = _int(opts, "startingTimestamp", 0)
        if starting is None:
            kw["starting"] = "latest" if streaming else "earliest"
        elif starting.strip().lower() in ("earliest", "latest"):
            kw["starting"] = starting.strip().lower()
            if kw["starting"] == "latest" and not streaming:
                raise OptionError("startingOffsets", "'latest' makes no sense for a batch query (it reads nothing); "
                                                     "use earliest, JSON offsets or startingTimestamp")
        else:
            kw["starting"] = _offsets_option("startingOffsets", starting, (EARLIEST, LATEST))

        ending = opts.get("endingOffsets")
        if ending is not None:
            if streaming:
                raise OptionError("endingOffsets", "only batch queries have an end; streams read on")
            if ending.strip().lower() == "latest":
                kw["ending"] = "latest"
            elif ending.strip().lower() == "earliest":
                raise OptionError("endingOffsets", "'earliest' as an end reads nothing; use latest or JSON offsets")
            else:
                kw["ending"] = _offsets_option("endingOffsets", ending, (LATEST,))

        limit = _int(opts, "maxMessagesPerTrigger", 1)
        if limit is not None and not streaming:
            raise OptionError("maxMessagesPerTrigger", "only streaming queries have triggers")
        kw["max_messages_per_trigger"] = limit
        kw["fail_on_data_loss"] = _bool(opts, "failOnDataLoss", True)
        tags = opts.get("tags", "*")
        try:
            parse_tags(tags)
        except SparkMQError as exc:
            raise OptionError("tags", exc.message) from None
        kw["tags"] = tags.strip() or "*"
        kw["pull_batch_size"] = _int(opts, "pullBatchSize", 1, _MAX_PULL) or _DEFAULT_PULL
        kw["max_messages_per_partition"] = _int(opts, "maxMessagesPerPartition", 1)
        if opts.get("group") is not None:
            try:
                kw["group"] = validate_group(opts["group"].strip())
            except SparkMQError as exc:
                raise OptionError("group", exc.message) from None
        kw["raw"] = _bool(opts, "raw", False)
        kw["request_timeout_s"] = (_int(opts, "requestTimeoutMs", 1, 3_600_000) or 30_000) / 1000
        kw["credentials"] = credentials_option(opts)
        options_obj = cls(endpoints=endpoints, streaming=streaming, **kw)
        options_obj._check_offsets_cover_subscription()
        return options_obj

    def _check_offsets_cover_subscription(self) -> None:
        topics = set(self.subscribe) | {q.topic for q in self.assign}
        for option, offsets in (("startingOffsets", self.starting), ("endingOffsets", self.ending)):
            if not isinstance(offsets, Mapping):
                continue
            for q in offsets:
                if self.subscribe and q.topic not in topics:
                    raise OptionError(option, f"topic {q.topic!r} is not subscribed ({', '.join(self.subscribe)})")
                if self.assign and q not in self.assign:
                    raise OptionError(option, f"queue {q.topic} {q.key} is not among the assigned queues")
                if self.subscribe_pattern and not re.fullmatch(self.subscribe_pattern, q.topic):
                    raise OptionError(option, f"topic {q.topic!r} does not match subscribePattern")

    def wants_topic(self, topic: str) -> bool:
        """Whether a pattern subscription reads ``topic``."""
        assert self.subscribe_pattern is not None
        if not self.include_system_topics and is_reserved_topic(topic):
            return False
        return re.fullmatch(self.subscribe_pattern, topic) is not None


# -- offsets ----------------------------------------------------------------------------------------

def offsets_to_json(positions: Mapping[MessageQueue, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"brokerName/queueId": offset}}`` with a stable key order (sorted)."""
    out: dict[str, dict[str, int]] = {}
    for q in sorted(positions, key=queue_sort_key):
        out.setdefault(q.topic, {})[q.key] = int(positions[q])
    return out


def offsets_from_json(offsets: Mapping[str, Mapping[str, int]]) -> dict[MessageQueue, int]:
    """Inverse of :func:`offsets_to_json`."""
    return {_queue_key("offsets", topic, key): int(offset)
            for topic, queues in offsets.items() for key, offset in queues.items()}


# -- Arrow conversion -------------------------------------------------------------------------------

@cache
def source_arrow_schema() -> pa.Schema:
    """The Arrow schema ``read()`` must yield: :data:`SOURCE_SCHEMA` as Spark converts it (UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")


def _filtered_offsets(offsets: pa.Array, keep: pa.Array) -> pa.Array:
    """List offsets (from 0) after keeping the child values ``keep`` (a mask over the lists' values in order)."""
    offs = offsets.to_numpy(zero_copy_only=False)
    kept = np.zeros(len(keep) + 1, dtype=np.int32)  # values kept before each position
    np.cumsum(keep.to_numpy(zero_copy_only=False), dtype=np.int32, out=kept[1:])
    return pa.array(kept[offs - offs[0]], type=pa.int32())


def _child(values: pa.Array, offsets: pa.Array) -> pa.Array:
    # .values / .keys / .items ignore a slice of the parent array; cut them to its offsets.
    lo, hi = offsets[0].as_py(), offsets[-1].as_py()
    return values.slice(lo, hi - lo)


def _split_keys(raw: pa.Array) -> pa.Array:
    """The space-separated KEYS strings as lists (empty list when none)."""
    lists = pc.split_pattern(pc.fill_null(raw, ""), KEY_SEPARATOR)
    values = _child(lists.values, lists.offsets)
    keep = pc.not_equal(values, "")
    return pa.ListArray.from_arrays(_filtered_offsets(lists.offsets, keep), pc.filter(values, keep))


def _properties(props: pa.MapArray, drop: pa.Array) -> pa.MapArray:
    """``props`` without the entries whose key is in ``drop``, and without NULL maps (empty instead)."""
    if len(drop) == 0 and props.null_count == 0:
        return props
    keys, items = _child(props.keys, props.offsets), _child(props.items, props.offsets)
    keep = pc.invert(pc.is_in(keys, value_set=drop))
    return pa.MapArray.from_arrays(_filtered_offsets(props.offsets, keep), pc.filter(keys, keep),
                                   pc.filter(items, keep))


def _millis_to_ts(col: pa.Array) -> pa.Array:
    return pc.multiply(col.cast(pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))


def to_source_batch(pulled: pa.Table, raw: bool = False) -> pa.RecordBatch:
    """Rows of a pull (``PULL_SCHEMA``) as a record batch of exactly :func:`source_arrow_schema`.

    Vectorised except for compressed bodies, which are inflated one by one (unless ``raw``).
    """
    target = source_arrow_schema()
    n = pulled.num_rows

    def col(name: str) -> pa.Array:
        column = pulled.column(name)
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # one chunk: no copy

    body, sys_flag, props = col("body"), col("sys_flag"), col("properties")
    if not raw:
        compressed = pc.not_equal(pc.bit_wise_and(sys_flag, COMPRESSED), 0)
        if n and pc.any(compressed).as_py():
            body = pa.array([inflate(b, f) for b, f in zip(body.to_pylist(), sys_flag.to_pylist(), strict=True)],
                            type=pa.binary())
    props = _properties(props, _hidden_properties(raw))
    columns = {
        "topic": col("topic"), "broker": col("broker_name"), "queue_id": col("queue_id"),
        "queue_offset": col("queue_offset"), "msg_id": col("msg_id"), "offset_msg_id": col("offset_msg_id"),
        "keys": _split_keys(col("keys")), "tags": col("tags"), "body": body, "properties": props,
        "born_timestamp": _millis_to_ts(col("born_timestamp")),
        "store_timestamp": _millis_to_ts(col("store_timestamp")),
        "born_host": col("born_host"), "store_host": col("store_host"), "reconsume_times": col("reconsume_times"),
        "commitlog_offset": col("commitlog_offset"), "store_size": col("store_size"), "sys_flag": sys_flag,
    }
    # cast() to the exact target types: list child names ("item" vs "element") and map
    # field names must match what Spark declared, or Spark refuses the batch.
    arrays = [columns[f.name].cast(f.type) for f in target]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


# -- partitions and reading -------------------------------------------------------------------------

@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one queue, pulled from the broker at ``addr``.

    ``remoting_addr`` is that broker's remoting endpoint when it serves one: executors pull over
    it (and fall back to ``addr``, HTTP, when it cannot be reached).  The driver learnt it from
    the routes, so executors in other processes need no discovery.
    """

    topic: str
    broker: str
    queue_id: int
    addr: str
    start: int
    end: int
    remoting_addr: str | None = None

    @property
    def label(self) -> str:
        """``topic broker/queueId [start, end)`` for messages."""
        return f"{self.topic} {self.broker}/{self.queue_id} [{self.start}, {self.end})"


@dataclass(frozen=True)
class ReadSettings:
    """What ``read()`` needs on the executors (picklable, small)."""

    tags: str = "*"
    pull_batch_size: int = _DEFAULT_PULL
    fail_on_data_loss: bool = True
    raw: bool = False
    request_timeout_s: float = 30.0
    credentials: Credentials | None = None

    @classmethod
    def of(cls, o: SourceOptions) -> ReadSettings:
        """The read settings of parsed options."""
        return cls(o.tags, o.pull_batch_size, o.fail_on_data_loss, o.raw, o.request_timeout_s, o.credentials)


class DataLossError(SparkMQError):
    """Messages the query should read are no longer in the log (raised when ``failOnDataLoss`` is true)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OFFSET_ILLEGAL, message + ". Set the option failOnDataLoss=false to skip "
                                                             "the missing range and go on.")


def read_range(part: QueueRange, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Pull ``part`` page by page (Arrow) and yield it as record batches of the source schema."""
    offset = part.start
    filtered = settings.tags != "*"
    batch_size = min(settings.pull_batch_size, _MAX_FILTERED_PULL) if filtered else settings.pull_batch_size
    while offset < part.end:
        want = min(batch_size, part.end - offset)
        page = pull_arrow(part.addr, part.topic, part.queue_id, offset, want, tags=settings.tags,
                          timeout_s=settings.request_timeout_s, broker_name=part.broker,
                          remoting_addr=part.remoting_addr, prefetch_until=part.end,
                          credentials=settings.credentials)
        if page.status == _FOUND:
            table = page.table
            if filtered:  # the broker skips non-matching messages and may run past the range's end
                table = table.filter(pc.less(table.column("queue_offset"), part.end))
            if table.num_rows:
                yield to_source_batch(table, settings.raw)
            nxt = page.next_offset
        elif page.status == _NO_MATCHED:
            nxt = page.next_offset
        elif page.status == _TOO_SMALL:
            gone = f"{part.topic} {part.broker}/{part.queue_id}: offsets [{offset}, {page.min_offset}) are gone " \
                   f"from the log (retention deleted them before they were read)"
            if settings.fail_on_data_loss:
                raise DataLossError(gone)
            log.warning("%s; skipping them (failOnDataLoss=false)", gone)
            nxt = max(page.min_offset, page.next_offset)
        elif page.status in (_NO_NEW, _OVERFLOW, _NO_QUEUE):
            lost = f"{part.topic} {part.broker}/{part.queue_id} ends at offset {page.max_offset}, but the batch " \
                   f"planned to read up to {part.end} (the broker lost messages, e.g. an unflushed tail)"
            if settings.fail_on_data_loss:
                raise DataLossError(lost)
            log.warning("%s; skipping (failOnDataLoss=false)", lost)
            return
        else:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"unknown pull status {page.status!r} from {part.addr}")
        if nxt <= offset:
            raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"{part.label}: a pull at {offset} did not advance "
                                                         f"({page.status}, next {nxt})")
        offset = nxt


def plan_ranges(start: Mapping[MessageQueue, int], end: Mapping[MessageQueue, int], addrs: Mapping[str, str],
                max_per_partition: int | None, remoting: Mapping[str, str] | None = None) -> list[QueueRange]:
    """One :class:`QueueRange` per queue with ``end > start`` (split at ``max_per_partition``), sorted.

    ``addrs`` and ``remoting`` (optional) give each broker name's HTTP address and remoting endpoint.
    """
    out: list[QueueRange] = []
    for q in sorted(end, key=queue_sort_key):
        lo, hi = start.get(q), end[q]
        if lo is None or hi <= lo:
            continue
        addr = addrs.get(q.broker_name)
        if addr is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"no address known for broker {q.broker_name!r} "
                                                                f"(is it registered with the name servers?)")
        step = max_per_partition or (hi - lo)
        endpoint = (remoting or {}).get(q.broker_name)
        for s in range(lo, hi, step):
            out.append(QueueRange(q.topic, q.broker_name, q.queue_id, addr, s, min(s + step, hi), endpoint))
    return out


# -- planning (driver) --------------------------------------------------------------------------------

class _Planner:
    """The driver-side half shared by the batch and stream readers: discovery and positions."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.settings = ReadSettings.of(options)
        self._view: ClusterView | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Readers are pickled to the executors; the view (sockets, threads) stays on the driver.
        state = dict(self.__dict__)
        state["_view"] = None
        return state

    @property
    def view(self) -> ClusterView:
        """The cluster view, made on first use."""
        if self._view is None:
            self._view = ClusterView(self.options.endpoints, self.options.request_timeout_s,
                                     credentials=self.options.credentials)
        return self._view

    def close_view(self) -> None:
        """Close the view's connections (a new one is made when needed again)."""
        if self._view is not None:
            self._view.close()
            self._view = None

    def discover(self) -> list[MessageQueue]:
        """The queues to read now, sorted: from the subscription's routes, or the assigned ones."""
        o = self.options
        if o.assign:
            self.view.routes({q.topic for q in o.assign})  # learn the brokers' addresses
            return list(o.assign)
        topics = o.subscribe or [t for t in self.view.topic_names() if o.wants_topic(t)]
        queues = [q for route in self.view.routes(topics).values() for q in route.read_queues]
        return sorted(queues, key=queue_sort_key)

    def all_bounds(self, queues: list[MessageQueue]) -> dict[MessageQueue, QueueBounds]:
        """The bounds of every one of ``queues``; SERVICE_NOT_AVAILABLE naming those whose broker did not answer."""
        bounds = self.view.bounds(queues)
        missing = sorted(set(queues) - set(bounds), key=queue_sort_key)
        if missing:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "cannot read the offsets of "
                               + ", ".join(f"{q.topic} {q.key}" for q in missing) + " (broker unreachable?)")
        return bounds

    def addrs(self, queues: list[MessageQueue]) -> dict[str, str]:
        """Read addresses of the brokers of ``queues`` that have one."""
        return {name: addr for name in {q.broker_name for q in queues} if (addr := self.view.addr_of(name))}

    def remoting_addrs(self, queues: list[MessageQueue]) -> dict[str, str]:
        """Remoting endpoints of the brokers of ``queues`` that serve one (the others are read over HTTP)."""
        return {name: endpoint for name in {q.broker_name for q in queues}
                if (endpoint := self.view.remoting_addr_of(name))}

    def starting_positions(self, queues: list[MessageQueue],
                           bounds: Mapping[MessageQueue, QueueBounds]) -> dict[MessageQueue, int]:
        """Where a new query starts on each queue with known bounds (``startingOffsets`` / ``startingTimestamp``)."""
        o = self.options
        known = [q for q in queues if q in bounds]
        if o.starting_timestamp is not None:
            return self.view.offsets_for_time(known, o.starting_timestamp)
        out: dict[MessageQueue, int] = {}
        explicit = o.starting if isinstance(o.starting, Mapping) else {}
        for q in known:
            spec = explicit.get(q, LATEST if o.starting == "latest" else EARLIEST)
            b = bounds[q]
            out[q] = b.min_offset if spec == EARLIEST else b.max_offset if spec == LATEST else spec
        missing = sorted(set(explicit) - set(known), key=queue_sort_key)
        if missing:
            log.warning("startingOffsets names queues that are not readable now: %s",
                        ", ".join(f"{q.topic} {q.key}" for q in missing))
        return out


class SparkMQBatchReader(_Planner, DataSourceReader):
    """``spark.read.format("sparkmq")``: the range ``startingOffsets`` .. ``endingOffsets`` of every queue."""

    def partitions(self) -> list[QueueRange]:
        """Plan one range per queue (split by ``maxMessagesPerPartition``) between the start and end offsets."""
        try:
            queues = self.discover()
            bounds = self.all_bounds(queues)
            start = self.starting_positions(queues, bounds)
            ending = self.options.ending
            end: dict[MessageQueue, int] = {}
            for q in queues:
                spec = ending.get(q, LATEST) if isinstance(ending, Mapping) else LATEST
                end[q] = bounds[q].max_offset if spec == LATEST else spec
            return plan_ranges(start, end, self.addrs(queues), self.options.max_messages_per_partition,
                               self.remoting_addrs(queues))
        finally:
            self.close_view()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Pull one planned range (on an executor)."""
        assert isinstance(partition, QueueRange)
        return read_range(partition, self.settings)


def admit(start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int], max_rows: int
          ) -> dict[MessageQueue, int]:
    """End offsets that admit at most ``max_rows`` offsets beyond ``start``, shared by backlog.

    Each queue gets ``floor(max_rows * backlog / total)``; what rounding leaves goes one by one
    to queues that still have backlog, in queue order -- deterministic, and every trigger
    makes progress while ``max_rows >= 1``.

    >>> a, b = MessageQueue("t", "a", 0), MessageQueue("t", "b", 0)
    >>> sorted(admit({a: 0, b: 0}, {a: 90, b: 10}, 10).values())
    [1, 9]
    """
    backlog = {q: latest[q] - start.get(q, latest[q]) for q in latest}
    total = sum(v for v in backlog.values() if v > 0)
    if total <= max_rows:
        return dict(latest)
    end = dict(latest)
    grant = {q: (max_rows * v) // total if v > 0 else 0 for q, v in backlog.items()}
    left = max_rows - sum(grant.values())
    for q in sorted(grant, key=queue_sort_key):
        if left <= 0:
            break
        if grant[q] < backlog[q]:
            grant[q] += 1
            left -= 1
    for q, v in backlog.items():
        if v > 0:
            end[q] = start[q] + grant[q]
    return end


@dataclass
class _StreamState:
    """What the stream reader keeps between triggers (driver only)."""

    target: dict[MessageQueue, int] | None = None          # Trigger.AvailableNow cap
    reported: dict[str, dict[str, int]] | None = None       # latest offsets for the progress report
    group_committed: dict[MessageQueue, int] = field(default_factory=dict)


class SparkMQStreamReader(_Planner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("sparkmq")``: micro-batches over every subscribed queue.

    Implements admission control (``latestOffset(start, limit)``, ``getDefaultReadLimit``:
    ``ReadMaxRows(maxMessagesPerTrigger)``) and ``Trigger.AvailableNow``.
    """

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._state = _StreamState()

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts: ``startingOffsets`` / ``startingTimestamp`` per queue."""
        queues = self.discover()
        # Strict: a queue left out now would later be read from earliest, whatever startingOffsets says.
        positions = self.starting_positions(queues, self.all_bounds(queues))
        if self._state.target is not None:
            positions = {q: min(v, self._state.target.get(q, v)) for q, v in positions.items()}
        return offsets_to_json(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxMessagesPerTrigger)`` when that option is set, else read all available."""
        limit = self.options.max_messages_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target of ``Trigger.AvailableNow``: every queue's max offset now; later data waits."""
        queues = self.discover()
        self._state.target = {q: b.max_offset for q, b in self.view.bounds(queues).items()}

    def _latest(self, start: Mapping[MessageQueue, int]) -> dict[MessageQueue, int]:
        """Every queue's end offset now, without a limit (new queues at their min offset)."""
        try:
            queues = self.discover()
        except SparkMQError as exc:  # name servers down: keep reading the queues we know
            log.warning("queue discovery failed, keeping the known queues: %s", exc)
            queues = []
        state = self._state
        if state.target is not None:  # AvailableNow: nothing that appeared after the target was fixed
            queues = [q for q in queues if q in state.target]
        every = sorted(set(queues) | set(start), key=queue_sort_key)
        bounds = self.view.bounds(every)
        latest: dict[MessageQueue, int] = {}
        for q in every:
            b = bounds.get(q)
            if q not in start:
                if b is not None:  # a new queue: registered at its min offset, read from the next batch
                    latest[q] = b.min_offset if state.target is None else min(b.min_offset, state.target[q])
                continue
            pos = start[q]
            if b is None:  # broker unreachable or topic gone: no progress on this queue for now
                latest[q] = pos
            elif b.max_offset < pos:
                lost = (f"{q.topic} {q.key} now ends at offset {b.max_offset}, but the query has read up to {pos} "
                        "(the broker lost messages or the queue was recreated)")
                if self.options.fail_on_data_loss:
                    raise DataLossError(lost)
                log.warning("%s; continuing from %d (failOnDataLoss=false)", lost, b.max_offset)
                latest[q] = b.max_offset
            else:
                cap = b.max_offset if state.target is None else state.target.get(q, pos)
                latest[q] = max(pos, min(b.max_offset, cap))
        return latest

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch: every queue's max offset, cut to ``limit``.

        ``start`` is the end of a batch Spark has finished (or the initial offset), so the
        ``group`` offsets are committed from it here too: ``commit()`` of the last batch comes
        only when a next batch is planned, and a query at rest must still show zero lag.
        """
        positions = offsets_from_json(start)
        self._commit_group(positions)
        latest = self._latest(positions)
        self._state.reported = offsets_to_json(latest)
        if isinstance(limit, ReadMaxRows):
            end = admit(positions, latest, limit.max_rows)
        elif isinstance(limit, ReadMinRows):
            backlog = sum(max(0, latest[q] - positions.get(q, latest[q])) for q in latest)
            new_queues = set(latest) - set(positions)
            end = latest if backlog >= limit.min_rows or new_queues else dict(positions)
        else:
            end = latest
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets seen by the last ``latestOffset`` call (before the limit), for progress."""
        return self._state.reported

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        """One range per queue that moved between ``start`` and ``end``."""
        lo, hi = offsets_from_json(start), offsets_from_json(end)
        moved = [q for q in hi if q in lo and hi[q] > lo[q]]
        addrs = self.addrs(moved)
        if len(addrs) < len({q.broker_name for q in moved}):  # a restarted query: learn addresses first
            self.discover()
            addrs = self.addrs(moved)
        return plan_ranges(lo, hi, addrs, self.options.max_messages_per_partition, self.remoting_addrs(moved))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Pull one planned range (on an executor)."""
        assert isinstance(partition, QueueRange)
        return read_range(partition, self.settings)

    def commit(self, end: dict) -> None:
        """Spark finished every batch up to ``end``: commit it to ``group`` (when set)."""
        self._commit_group(offsets_from_json(end))

    def _commit_group(self, positions: Mapping[MessageQueue, int]) -> None:
        group = self.options.group
        if group is None:
            return
        done = self._state.group_committed
        changed = {q: v for q, v in positions.items() if done.get(q) != v}
        if not changed:
            return
        try:
            self.view.commit_group(group, changed)
        except SparkMQError as exc:  # the group's offsets are a view of progress; never fail the query
            log.warning("committing group %s failed: %s", group, exc)
            return
        done.update(changed)

    def stop(self) -> None:
        """Close connections (Spark does not always call this; nothing depends on it)."""
        self.close_view()


# -- the data source --------------------------------------------------------------------------------

class SparkMQDataSource(DataSource):
    """The ``sparkmq`` format: topics as a source (batch and streaming) and a sink.

    Options are checked when the reader or writer is made: an unknown option, malformed JSON
    offsets or a bad combination raise an error that names the option.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, ``"sparkmq"``."""
        return FORMAT

    def schema(self) -> StructType:
        """The source's columns (:data:`SOURCE_SCHEMA`)."""
        return SOURCE_SCHEMA

    def _check_schema(self, schema: StructType) -> None:
        if schema != SOURCE_SCHEMA:
            raise OptionError("schema", "the sparkmq source has a fixed schema; do not pass one with .schema()")

    def reader(self, schema: StructType) -> SparkMQBatchReader:
        """A batch reader (``spark.read``)."""
        self._check_schema(schema)
        return SparkMQBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> SparkMQStreamReader:
        """A stream reader (``spark.readStream``)."""
        self._check_schema(schema)
        return SparkMQStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (``df.write``): rows become messages, see :mod:`.sink`."""
        from .sink import SinkOptions, SparkMQWriter

        return SparkMQWriter(SinkOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A stream writer (``df.writeStream``): rows become messages, see :mod:`.sink`."""
        from .sink import SinkOptions, SparkMQStreamWriter

        return SparkMQStreamWriter(SinkOptions.parse(self.options, schema))


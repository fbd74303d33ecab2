"""The trace job: ``RMQ_SYS_TRACE_TOPIC`` into the Delta table ``message_trace``.

Brokers store trace events (their own ``store`` / ``deliver`` / ``retry`` / ``dlq`` /
``transaction`` and the clients' ``send`` / ``consume``) as JSON-lines messages of the trace
topic (:mod:`sparkmq.platform.common.trace`).  This Structured Streaming query reads that topic
through the ``sparkmq`` source and, per micro-batch (``foreachBatch``), decodes the bodies and
appends one row per event with delta-spark.

Packed batches (remoting batch sends, pulls answered with the stored records) reach the trace
topic as one :class:`~sparkmq.platform.common.trace.TraceBatch` each -- queue, offset range,
time, group, client -- because the broker must not spend CPU per message on tracing.  The job
expands them here, off the broker's hot path (:func:`expand_batches`): it reads each queue's
range back from its broker once per micro-batch (:func:`~.cluster_io.pull_queue_range`: bulk
pulls of stored records, decoded to Arrow on this side) and builds, column by column, exactly
the rows the per-message events would have given (msg id, tags, keys, born time, reconsume
count from the records; the batch's time, group and client).  A range retention deleted before
the job read it is logged and its rows are missing, as with ``failOnDataLoss=false``::

    query = start_trace_job(spark, "127.0.0.1:9876", "/data/lake", "/data/checkpoints/trace")
    trace_stats(query).last             # DispatchBatch: events written, lag from store to commit

Exactly once, as in :mod:`.dispatch`: each append carries Delta's ``txnAppId = trace-{job}`` and
``txnVersion = batch_id``, so a replayed batch adds nothing, and a checkpoint behind the table is
refused.  A line that is not a trace event is logged, counted and skipped: one bad
message must not stop the table for good.

The lookup by msgId (``GET /trace/{msg_id}``) is :class:`sparkmq.platform.broker.trace.TraceLookup`;
SQL works on ``sparkmq.message_trace`` (:func:`.sql.run_sql`).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.common.codec import tag_hash
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.system_topics import TRACE_TOPIC
from sparkmq.platform.common.trace import TraceBatch, TraceEvent, decode_trace

from . import tables
from .cluster_io import ClusterView, Endpoints, pull_queue_range
from .dispatch import (
    DEFAULT_MAX_MESSAGES_PER_TRIGGER,
    DEFAULT_TRIGGER,
    DispatchBatch,
    DispatchStats,
    _endpoint_options,
    append_once,
    check_checkpoint,
    job_name_of,
    with_credentials,
)
from .source import FORMAT, register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "BrokerRangeReader",
    "RangeReader",
    "events_table",
    "decode_bodies",
    "expand_batches",
    "start_trace_job",
    "trace_app_id",
    "trace_batch",
    "trace_source_options",
    "trace_stats",
]

log = logging.getLogger(__name__)

_TS = pa.timestamp("us", tz="UTC")
_TIMES = ("event_ts", "born_ts", "store_ts")

_stats: dict[str, DispatchStats] = {}


def trace_app_id(job: str) -> str:
    """The Delta app id of ``job``'s appends to ``message_trace``: ``trace-{job}``."""
    return f"trace-{job}"


def trace_stats(query: StreamingQuery) -> DispatchStats | None:
    """The statistics of a query started by :func:`start_trace_job` (rows = events written)."""
    return _stats.get(str(query.id))


def decode_bodies(bodies: Iterable[bytes | None]) -> tuple[list[TraceEvent], list[TraceBatch], int]:
    """The events and batch records of trace-message bodies, and how many lines were skipped as neither."""
    decoded: list[TraceEvent | TraceBatch] = []
    bad = 0
    for body in bodies:
        if not body:
            continue
        try:
            decoded.extend(decode_trace(body))
            continue
        except (SparkMQError, UnicodeDecodeError):
            pass
        for line in body.splitlines():  # salvage the good lines of a damaged body
            try:
                decoded.extend(decode_trace(line))
            except (SparkMQError, UnicodeDecodeError):
                bad += 1
    events = [e for e in decoded if isinstance(e, TraceEvent)]
    batches = [e for e in decoded if isinstance(e, TraceBatch)]
    # A row must fit the table's NOT NULL columns; anything else is a malformed event.
    good = [e for e in events if isinstance(e.msg_id, str) and e.msg_id and isinstance(e.topic, str)
            and isinstance(e.status, str) and isinstance(e.event_ts, int) and not isinstance(e.event_ts, bool)]
    return good, batches, bad + len(events) - len(good)


def events_table(events: Sequence[TraceEvent]) -> pa.Table:
    """``message_trace`` rows (the spec's schema exactly) for ``events``; times are epoch ms in the events."""
    schema = tables.get_spec(tables.MESSAGE_TRACE).schema
    columns: list[pa.Array] = []
    for f in schema:
        if f.name == "event_date":
            columns.append(columns[schema.get_field_index("event_ts")].cast(pa.date32()))
        elif f.name in _TIMES:
            millis = [getattr(e, f.name) for e in events]
            columns.append(pa.array([None if v is None else v * 1000 for v in millis], pa.int64()).cast(_TS))
        else:
            columns.append(pa.array([getattr(e, f.name) for e in events], f.type))
    return pa.Table.from_arrays(columns, schema=schema)


#: ``read(broker, topic, queue_id, start, end)``: the messages at queue offsets ``[start, end)`` (``PULL_SCHEMA``
#: columns, offset order) and the sub-ranges the broker no longer has.
RangeReader = Callable[[str, str, int, int, int], tuple[pa.Table, list[tuple[int, int]]]]


class BrokerRangeReader:
    """The :data:`RangeReader` of a cluster: brokers resolved like the source does, ranges pulled in bulk.

    Each broker's HTTP address and remoting endpoint come from a :class:`~.cluster_io.ClusterView`
    (the route of the topic read), so the ranges go over remoting where the broker serves it.
    Made per micro-batch (a fresh view of the brokers each time); :meth:`close` it.
    """

    def __init__(self, endpoints: Endpoints, timeout_s: float = 30.0, *,
                 credentials: Credentials | None = None) -> None:
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        #: Sign every request (brokers with ACL on).
        self.credentials = credentials
        self._view: ClusterView | None = None
        self._routed: set[str] = set()
        self._lock = threading.Lock()  # expand_batches reads on several threads

    def addrs_of(self, broker: str, topic: str) -> tuple[str, str | None]:
        """``broker``'s HTTP address and remoting endpoint (None: HTTP only), learnt from ``topic``'s route."""
        with self._lock:
            if self._view is None:
                self._view = ClusterView(self.endpoints, self.timeout_s, credentials=self.credentials)
            if topic not in self._routed:
                self._view.routes([topic])
                self._routed.add(topic)
            view = self._view
        addr = view.addr_of(broker) or dict(self.endpoints.brokers).get(broker)
        if addr is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"no address known for broker {broker!r}")
        return addr, view.remoting_addr_of(broker)

    def __call__(self, broker: str, topic: str, queue_id: int, start: int,
                 end: int) -> tuple[pa.Table, list[tuple[int, int]]]:
        addr, remoting = self.addrs_of(broker, topic)
        return pull_queue_range(addr, topic, queue_id, start, end, broker_name=broker, timeout_s=self.timeout_s,
                                remoting_addr=remoting, credentials=self.credentials)

    def close(self) -> None:
        """Close the view's connections, if one was made."""
        if self._view is not None:
            self._view.close()
            self._view = None


def _spans(batches: Sequence[TraceBatch]) -> list[tuple[int, int]]:
    """The union of the batches' offset ranges as disjoint ``[start, end)`` spans, ascending."""
    spans: list[tuple[int, int]] = []
    for b in sorted(batches, key=lambda b: b.first_offset):
        if spans and b.first_offset <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b.end_offset))
        else:
            spans.append((b.first_offset, b.end_offset))
    return spans


def _normalized_keys(raw: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The KEYS property as the per-message events write it: keys joined by one space, NULL when none."""
    joined = pc.utf8_trim(pc.replace_substring_regex(raw, " {2,}", " "), " ")
    return pc.if_else(pc.equal(joined, ""), pa.scalar(None, pa.string()), joined)


def _tag_hashes(tags: pa.Array) -> np.ndarray:
    """The consume-queue tag hash of every row (``codec.tag_hash``), computed once per distinct tag."""
    encoded = pc.dictionary_encode(tags)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    per_value = np.array([tag_hash(v) for v in encoded.dictionary.to_pylist()] + [0], dtype=np.int64)
    index = pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    return per_value[index]


def _expand_queue(batches: Sequence[TraceBatch], found: pa.Table) -> tuple[dict[str, pa.Array], np.ndarray]:
    """The rows of one queue's ``batches`` over ``found`` (that queue's messages, offset order), as columns,
    and how many rows each batch got."""
    offsets = found.column("queue_offset").to_numpy()
    firsts = np.array([b.first_offset for b in batches], dtype=np.int64)
    ends = np.array([b.end_offset for b in batches], dtype=np.int64)
    lo = np.searchsorted(offsets, firsts, side="left")
    hi = np.searchsorted(offsets, ends, side="left")
    lengths = hi - lo
    owner = np.repeat(np.arange(len(batches)), lengths)           # the batch of each row
    starts = np.cumsum(lengths) - lengths
    index = np.repeat(lo - starts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    rows = found.take(pa.array(index))
    keep = pc.not_equal(rows.column("msg_id"), "").to_numpy(zero_copy_only=False)
    filters = {tuple(b.filter_tags) for b in batches if b.filter_tags is not None}
    if filters:  # the store's tag filter: the consume queue's hash, never the tag string
        hashes = _tag_hashes(rows.column("tags"))
        for tags_ in filters:
            wanted = np.array(sorted({tag_hash(t) for t in tags_}), dtype=np.int64)
            of_filter = np.array([b.filter_tags is not None and tuple(b.filter_tags) == tags_ for b in batches])
            keep &= ~of_filter[owner] | np.isin(hashes, wanted)
    rows, owner = rows.filter(pa.array(keep)), owner[keep]
    is_store = np.array([b.event_type == "store_batch" for b in batches])[owner]
    store_ts = rows.column("store_timestamp").to_numpy()
    batch_ts = np.array([b.event_ts for b in batches], dtype=np.int64)[owner]
    # store: the record's store time (as PutResult.store_timestamp); deliver: the pull's time
    event_ts = np.where(is_store & (store_ts != 0), store_ts, batch_ts)
    take = pa.array(owner)

    def per_batch(values: list[Any], type_: pa.DataType) -> pa.Array:
        return pa.array(values, type_).take(take)

    event_type = per_batch([b.expands_to for b in batches], pa.string())
    msg_id = rows.column("msg_id").combine_chunks()
    columns: dict[str, pa.Array] = {
        "trace_id": pc.binary_join_element_wise(msg_id, event_type, pa.array(event_ts).cast(pa.string()), ":"),
        "msg_id": msg_id,
        "topic": per_batch([b.topic for b in batches], pa.string()),
        "group": per_batch([b.group for b in batches], pa.string()),
        "client_id": per_batch([b.client_id for b in batches], pa.string()),
        "event_type": event_type,
        "status": per_batch([b.status for b in batches], pa.string()),
        "cost_ms": pa.nulls(len(owner), pa.int64()),
        "event_ts": pa.array(event_ts),
        "born_ts": rows.column("born_timestamp").combine_chunks(),
        "store_ts": pa.array(store_ts),
        "broker": per_batch([b.broker for b in batches], pa.string()),
        "queue_id": per_batch([b.queue_id for b in batches], pa.int32()),
        "queue_offset": rows.column("queue_offset").combine_chunks(),
        # a store event has no reconsume count (the per-message store event leaves it out)
        "reconsume_times": pc.if_else(pa.array(is_store), pa.scalar(None, pa.int32()),
                                      rows.column("reconsume_times").combine_chunks()),
        "tags": rows.column("tags").combine_chunks(),
        "keys": _normalized_keys(rows.column("keys").combine_chunks()),
        "detail": per_batch([b.detail for b in batches], pa.string()),
    }
    return columns, np.bincount(owner, minlength=len(batches))


def expand_batches(batches: Sequence[TraceBatch], read: RangeReader, *, parallel: int = 4) -> pa.Table:
    """``message_trace`` rows for batch records: one per message of each batch, as its per-message event gives.

    Each queue's ranges are merged and read once through ``read`` (a store batch and the pulls
    that delivered it share one read), on up to ``parallel`` threads; rows are cut out with
    numpy and Arrow kernels, never a Python object per message.  A deliver batch with
    ``filter_tags`` keeps the range's messages whose tag hash matches (the store's filter).
    Messages without a msg id give no row (as per message); rows a broker no longer has are
    logged.  Raises what ``read`` raises (a broker that cannot be reached fails the micro-batch,
    which Spark retries).
    """
    schema = tables.get_spec(tables.MESSAGE_TRACE).schema
    if not batches:
        return schema.empty_table()
    by_queue: dict[tuple[str, str, int], list[TraceBatch]] = {}
    for b in batches:
        by_queue.setdefault((b.broker, b.source_topic, b.queue_id), []).append(b)
    reads = [(key, span) for key, group in by_queue.items() for span in _spans(group)]

    def one(item: tuple[tuple[str, str, int], tuple[int, int]]) -> tuple[pa.Table, list[tuple[int, int]]]:
        (broker, topic, queue_id), (start, end) = item
        return read(broker, topic, queue_id, start, end)

    if len(reads) > 1 and parallel > 1:
        with concurrent.futures.ThreadPoolExecutor(min(parallel, len(reads)),
                                                   thread_name_prefix="sparkmq-trace-expand") as pool:
            answers = list(pool.map(one, reads))
    else:
        answers = [one(item) for item in reads]
    found: dict[tuple[str, str, int], list[pa.Table]] = {}
    for (key, _span), (table, missing) in zip(reads, answers, strict=True):
        found.setdefault(key, []).append(table.select(_READ_COLUMNS))
        for start, end in missing:
            log.warning("trace: %s %s/%d offsets [%d, %d) are gone from the broker; their store/deliver rows "
                        "are missing", key[1], key[0], key[2], start, end)
    parts: list[pa.Table] = []
    for key, group in by_queue.items():
        columns, counts = _expand_queue(group, pa.concat_tables(found[key]).sort_by("queue_offset"))
        short = sum(b.count - int(n) for b, n in zip(group, counts, strict=True) if n < b.count)
        if short:
            log.warning("trace: %d messages of %d batch records on %s %s/%d were not found", short, len(group),
                        key[1], key[0], key[2])
        parts.append(_as_trace_table(columns, schema))
    return pa.concat_tables(parts)


#: What the expansion reads of a pulled message.
_READ_COLUMNS = ["queue_offset", "msg_id", "tags", "keys", "born_timestamp", "store_timestamp", "reconsume_times"]


def _as_trace_table(columns: Mapping[str, pa.Array], schema: pa.Schema) -> pa.Table:
    """Columns by name (times in epoch ms) as a table of ``schema`` (``message_trace``'s)."""
    arrays: list[pa.Array] = []
    for f in schema:
        if f.name == "event_date":
            arrays.append(arrays[schema.get_field_index("event_ts")].cast(pa.date32()))
        elif f.name in _TIMES:
            arrays.append(pc.multiply(columns[f.name].cast(pa.int64()), 1000).cast(_TS))
        else:
            arrays.append(columns[f.name].cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _lags(store_ms: np.ndarray, now_s: float) -> tuple[float | None, float | None, float | None]:
    """Max, p50 and p99 of ``now - store time`` in ms over store times in epoch ms (Nones when empty)."""
    if store_ms.size == 0:
        return None, None, None
    lag = now_s * 1000.0 - store_ms.astype(np.float64)
    p50, p99 = np.percentile(lag, [50, 99])
    return float(lag.max()), float(p50), float(p99)


def trace_rows(rows: pa.Table, *, read: RangeReader | None = None, where: str = "trace") -> pa.Table:
    """The ``message_trace`` rows of trace-topic messages (a table with their ``body`` column).

    ``read`` fetches the messages of batch records (:class:`BrokerRangeReader`); batch records
    without one are INVALID_ARGUMENT (they cannot become rows).  Lines that are not trace events
    are logged (``where`` names the batch) and skipped.
    """
    events, batches, bad = decode_bodies(rows.column("body").to_pylist())
    if bad:
        log.warning("%s: skipped %d lines that are not trace events", where, bad)
    table = events_table(events)
    if batches:
        if read is None:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{where}: {len(batches)} batch records need a reader "
                                                           "of the brokers' queues")
        table = pa.concat_tables([table, expand_batches(batches, read)])
    return table


def trace_batch(spark: SparkSession, rows: pa.Table, batch_id: int, lake_root: str | os.PathLike[str], job: str,
                *, read: RangeReader | None = None) -> DispatchBatch:
    """Write one micro-batch (source rows with ``body`` and ``store_timestamp``) once per ``(job, batch_id)``.

    The body of the job's ``foreachBatch``; public so a batch can be re-run (Delta then skips it).
    The rows are decoded here (:func:`trace_rows`) and appended with delta-spark.
    """
    begin = time.time()
    count = 0
    if rows.num_rows:
        table = trace_rows(rows, read=read, where=f"trace {job} batch {batch_id}")
        count = table.num_rows
        if count:
            frame = spark.createDataFrame(table, schema=tables.spark_schema(tables.MESSAGE_TRACE))
            append_once(frame, lake_root, tables.MESSAGE_TRACE, trace_app_id(job), batch_id)
    committed = time.time()
    store_ms = pc.cast(rows.column("store_timestamp"), _TS).cast(pa.int64()).to_numpy(zero_copy_only=False) / 1000
    lag_max, lag_p50, lag_p99 = _lags(store_ms, committed)
    return DispatchBatch(batch_id, count, lag_max, lag_p50, lag_p99, committed, committed - begin)


def trace_source_options(namesrv_or_brokers: str | Mapping[str, str],
                         max_messages_per_trigger: int | None = DEFAULT_MAX_MESSAGES_PER_TRIGGER) -> dict[str, str]:
    """The ``sparkmq`` source options of the job: the trace topic, from the start, data loss tolerated."""
    options, _ = _endpoint_options(namesrv_or_brokers)
    options.update({"subscribe": TRACE_TOPIC, "includeSystemTopics": "true", "startingOffsets": "earliest",
                    # Retention may remove trace messages a stopped job never read: go on without them.
                    "failOnDataLoss": "false"})
    if max_messages_per_trigger is not None:
        options["maxMessagesPerTrigger"] = str(max_messages_per_trigger)
    return options


def _check_checkpoint(checkpoint_dir: str, lake_root: str, job: str) -> None:
    check_checkpoint(checkpoint_dir, lake_root, {tables.MESSAGE_TRACE: trace_app_id(job)})

def start_trace_job(spark: SparkSession, namesrv_or_brokers: str | Mapping[str, str],
                    lake_root: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str],
                    trigger: Mapping[str, Any] | None = None, *, job_name: str | None = None,
                    max_messages_per_trigger: int | None = DEFAULT_MAX_MESSAGES_PER_TRIGGER,
                    query_name: str | None = None, credentials: Credentials | None = None) -> StreamingQuery:
    """Start the trace query and return it (running; stop it with ``query.stop()``).

    Arguments as :func:`.dispatch.start_dispatch`: name servers or ``{"broker-a": "host:port"}``,
    ``trigger`` keyword arguments (default ``{"processingTime": "1 second"}``; ``{"availableNow":
    True}`` catches up and stops), ``job_name`` names the app id ``trace-{job_name}`` (default: the
    broker's name for one broker, else ``cluster``).  Creates ``message_trace`` if needed; raises
    :class:`LakeError` when the checkpoint is behind the table.
    """
    source_options = with_credentials(trace_source_options(namesrv_or_brokers, max_messages_per_trigger),
                                      credentials)
    _, endpoints = _endpoint_options(namesrv_or_brokers)
    job = job_name_of(namesrv_or_brokers, job_name)
    lake_root = os.fspath(lake_root)
    checkpoint = os.fspath(checkpoint_dir)
    tables.ensure_table(spark, lake_root, tables.MESSAGE_TRACE)
    _check_checkpoint(checkpoint, lake_root, job)
    register(spark)
    stats = DispatchStats(job)

    def run_batch(df: DataFrame, batch_id: int) -> None:
        reader = BrokerRangeReader(endpoints, credentials=credentials)
        try:
            result = trace_batch(spark, df.select("body", "store_timestamp").toArrow(), batch_id, lake_root, job,
                                 read=reader)
        except BaseException as exc:
            stats.fail(exc)
            raise
        finally:
            reader.close()
        stats.record(result)
        if result.rows:
            log.info("trace %s batch %d: %d events, lag max %.0f ms, %.3f s", job, batch_id, result.rows,
                     result.lag_ms_max or 0.0, result.duration_s)

    reader = spark.readStream.format(FORMAT)
    for key, value in source_options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream
             .queryName(query_name or f"sparkmq-trace-{job}")
             .option("checkpointLocation", checkpoint)
             .foreachBatch(run_batch)
             .trigger(**dict(trigger or DEFAULT_TRIGGER))
             .start())
    _stats[str(query.id)] = stats
    return query

"""The trace job: ``RMQ_SYS_TRACE_TOPIC`` into the Delta table ``message_trace``.

Brokers store trace events (their own ``store`` / ``deliver`` / ``retry`` / ``dlq`` /
``transaction`` and the clients' ``send`` / ``consume``) as JSON-lines messages of the trace
topic (:mod:`sparkmq.platform.common.trace`).  This Structured Streaming query reads that topic
through the ``sparkmq`` source and, per micro-batch (``foreachBatch``), decodes the bodies and
appends one row per event with delta-rs::

    query = start_trace_job(spark, "127.0.0.1:9876", "/data/lake", "/data/checkpoints/trace")
    trace_stats(query).last             # DispatchBatch: events written, lag from store to commit

Exactly once, as in :mod:`.dispatch`: each append carries the Delta app transaction
``(f"trace-{job}", batch_id)``, so a replayed batch adds nothing, and a checkpoint behind the
table is refused.  A line that is not a trace event is logged, counted and skipped: one bad
message must not stop the table for good.

The lookup by msgId (``GET /trace/{msg_id}``) is :class:`sparkmq.platform.broker.trace.TraceLookup`;
SQL works on the ``message_trace`` view (:func:`.sql.run_sql`).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sparkmq.platform.common.errors import SparkMQError
from sparkmq.platform.common.system_topics import TRACE_TOPIC
from sparkmq.platform.common.trace import TraceEvent, decode_events

from . import tables
from .delta_io import append_exactly_once
from .dispatch import (
    DEFAULT_MAX_MESSAGES_PER_TRIGGER,
    DEFAULT_TRIGGER,
    DispatchBatch,
    DispatchStats,
    _endpoint_options,
    _lag_ms,
    check_checkpoint,
)
from .source import FORMAT, register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "events_table",
    "decode_bodies",
    "start_trace_job",
    "trace_app_id",
    "trace_arrow",
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


def decode_bodies(bodies: Iterable[bytes | None]) -> tuple[list[TraceEvent], int]:
    """The events of trace-message bodies, and how many lines were skipped as not events."""
    events: list[TraceEvent] = []
    bad = 0
    for body in bodies:
        if not body:
            continue
        try:
            events.extend(decode_events(body))
            continue
        except (SparkMQError, UnicodeDecodeError):
            pass
        for line in body.splitlines():  # salvage the good lines of a damaged body
            try:
                events.extend(decode_events(line))
            except (SparkMQError, UnicodeDecodeError):
                bad += 1
    # A row must fit the table's NOT NULL columns; anything else is a malformed event.
    good = [e for e in events if isinstance(e.msg_id, str) and e.msg_id and isinstance(e.topic, str)
            and isinstance(e.status, str) and isinstance(e.event_ts, int) and not isinstance(e.event_ts, bool)]
    return good, bad + len(events) - len(good)


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


def trace_arrow(rows: pa.Table, batch_id: int, lake_root: str | os.PathLike[str], job: str) -> DispatchBatch:
    """Write one micro-batch (source rows with ``body`` and ``store_timestamp``) once per ``(job, batch_id)``.

    The body of the job's ``foreachBatch``; public so a batch can be re-run (it then writes nothing).
    """
    begin = time.time()
    written = False
    count = 0
    if rows.num_rows:
        events, bad = decode_bodies(rows.column("body").to_pylist())
        if bad:
            log.warning("trace %s batch %d: skipped %d lines that are not trace events", job, batch_id, bad)
        count = len(events)
        if events:
            written = append_exactly_once(tables.table_path(lake_root, tables.MESSAGE_TRACE), events_table(events),
                                          app_id=trace_app_id(job), version=batch_id)
    committed = time.time()
    lag_max, lag_p50, lag_p99 = _lag_ms(rows.column("store_timestamp"), committed)
    return DispatchBatch(batch_id, count, {tables.MESSAGE_TRACE: written}, lag_max, lag_p50, lag_p99, committed,
                         committed - begin)


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
                    query_name: str | None = None) -> StreamingQuery:
    """Start the trace query and return it (running; stop it with ``query.stop()``).

    Arguments as :func:`.dispatch.start_dispatch`: name servers or ``{"broker-a": "host:port"}``,
    ``trigger`` keyword arguments (default ``{"processingTime": "1 second"}``; ``{"availableNow":
    True}`` catches up and stops), ``job_name`` names the app id ``trace-{job_name}`` (default: the
    broker's name for one broker, else ``cluster``).  Creates ``message_trace`` if needed; raises
    :class:`LakeError` when the checkpoint is behind the table.
    """
    source_options = trace_source_options(namesrv_or_brokers, max_messages_per_trigger)
    _, endpoints = _endpoint_options(namesrv_or_brokers)
    job = job_name or (endpoints.brokers[0][0] if len(endpoints.brokers) == 1 else "cluster")
    lake_root = os.fspath(lake_root)
    checkpoint = os.fspath(checkpoint_dir)
    tables.ensure_table(lake_root, tables.MESSAGE_TRACE)
    _check_checkpoint(checkpoint, lake_root, job)
    register(spark)
    stats = DispatchStats(job)

    def run_batch(df: DataFrame, batch_id: int) -> None:
        try:
            result = trace_arrow(df.select("body", "store_timestamp").toArrow(), batch_id, lake_root, job)
        except BaseException as exc:
            stats.fail(exc)
            raise
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

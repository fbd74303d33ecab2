"""The dispatch job: the commit log into the Delta tables ``messages``, ``consume_queue`` and ``message_keys``.

A Structured Streaming query reads every dispatched topic through the ``sparkmq`` source in stored form
(``raw``: bodies as stored, all properties).  Per micro-batch (``foreachBatch``) the batch is kept in
memory once (``persist``) and appended to the three tables with delta-spark, each write a Spark job whose
tasks write the Parquet files on the executors and whose driver commits them -- Delta's own write path::

    query = start_dispatch(spark, "127.0.0.1:9876", "/data/lake", "/data/checkpoints/dispatch",
                           trigger={"processingTime": "1 second"})
    dispatch_stats(query).last          # DispatchBatch: rows, lag from store to commit, ...
    spark.table("sparkmq.messages")     # the tables are registered under the database sparkmq

Exactly once: every append carries Delta's idempotent-write options ``txnAppId =
dispatch-{job}-{table}`` and ``txnVersion = batch_id``.  Delta records the pair in the commit and skips a
later write with a version it has already seen, so a batch Spark replays after a crash (its offsets were
logged, its commit in the checkpoint was not) adds nothing to a table that already holds it and
completes the tables that do not.  The checkpoint and the tables belong together: :func:`start_dispatch`
refuses a checkpoint that is behind the tables (a lost or swapped checkpoint would silently skip batches).

Visibility: Delta has no transaction over several tables, so the three commits of a batch are made in a
fixed order, :data:`DISPATCH_TABLES`: ``messages`` first, then ``consume_queue`` and ``message_keys``.  A
reader that sees a ``consume_queue`` or ``message_keys`` row can therefore always find its message in
``messages``; a crash between the commits leaves only ``messages`` ahead, and the replay of the batch
writes the rest (``docs/lake.md``).

What is dispatched: every user topic, ``%RETRY%`` and ``%DLQ%`` topics (trace events have their own job).
Left out are the broker's bookkeeping topics whose messages reach the lake when they are
delivered to their real topic (delay-level schedule, timer wheel, transaction half and op
topics) and the ``TBW102`` template.

Lag: for every batch the job measures commit time of ``messages`` minus each message's store time (max,
p50, p99, in ms) -- how fresh the lake is.  It is logged and kept in :func:`dispatch_stats`.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable as RustDeltaTable

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.common.system_topics import (
    POP_REVIVE_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRACE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)

from . import tables
from .cluster_io import Endpoints
from .errors import LakeError
from .source import FORMAT, register

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "DISPATCH_PATTERN",
    "DISPATCH_TABLES",
    "DispatchBatch",
    "DispatchStats",
    "append_once",
    "check_checkpoint",
    "dispatch_app_id",
    "dispatch_frames",
    "dispatch_source_options",
    "dispatch_stats",
    "start_dispatch",
    "write_batch",
]

log = logging.getLogger(__name__)

#: Topics whose messages are the broker's bookkeeping; they reach the lake via their real topic
#: (and the trace topic through the trace job, into message_trace).
_NOT_DISPATCHED = (SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRACE_TOPIC, POP_REVIVE_TOPIC,
                   "TBW102")
#: Every topic except those (the source's includeSystemTopics lets %RETRY% and %DLQ% through).
DISPATCH_PATTERN = "(?!(?:" + "|".join(re.escape(t) for t in _NOT_DISPATCHED) + ")$).+"

#: The tables a dispatch batch writes, in commit order: ``messages`` first, so that no reader sees an
#: index row (``consume_queue``, ``message_keys``) whose message is not in ``messages``.
DISPATCH_TABLES = (tables.MESSAGES, tables.CONSUME_QUEUE, tables.MESSAGE_KEYS)

#: Upper bound of one micro-batch (the batch is held in the executors' memory while it is written).
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 500_000
DEFAULT_TRIGGER: Mapping[str, Any] = {"processingTime": "1 second"}


def dispatch_app_id(job: str, table: str) -> str:
    """The Delta ``txnAppId`` of ``job``'s appends to ``table``: ``dispatch-{job}-{table}``."""
    return f"dispatch-{job}-{table}"


# -- per-batch statistics ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DispatchBatch:
    """One dispatched micro-batch: how many messages, and how fresh the lake was."""

    batch_id: int
    rows: int
    #: commit time of the first table minus store time over the batch's messages, in ms (None when empty)
    lag_ms_max: float | None
    lag_ms_p50: float | None
    lag_ms_p99: float | None
    committed_at: float                  # epoch seconds, when the first table (``messages``) committed
    duration_s: float                    # the whole batch: every table written


@dataclass
class DispatchStats:
    """What a streaming job has done: the last batches, totals and the last error.  Thread-safe."""

    job: str
    batches: int = 0
    rows: int = 0
    last_error: str | None = None
    history: deque[DispatchBatch] = field(default_factory=lambda: deque(maxlen=100))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def last(self) -> DispatchBatch | None:
        """The last dispatched batch, if any."""
        with self._lock:
            return self.history[-1] if self.history else None

    def record(self, batch: DispatchBatch) -> None:
        """Add one batch."""
        with self._lock:
            self.history.append(batch)
            self.batches += 1
            self.rows += batch.rows
            self.last_error = None

    def fail(self, error: BaseException) -> None:
        """Remember a failed batch's error."""
        with self._lock:
            self.last_error = f"{type(error).__name__}: {error}"


_stats_lock = threading.Lock()
_stats: dict[str, DispatchStats] = {}


def dispatch_stats(query: StreamingQuery) -> DispatchStats | None:
    """The statistics of a query started by :func:`start_dispatch` (None for other queries)."""
    with _stats_lock:
        return _stats.get(str(query.id))


def _keep_stats(query: StreamingQuery, stats: DispatchStats) -> None:
    with _stats_lock:
        _stats[str(query.id)] = stats


def store_profile(df: DataFrame, store_ts: str) -> tuple[int, int | None, list[int]]:
    """Rows of ``df``, and the min and the 1st and 50th percentiles of its ``store_ts`` (epoch ms), in one job.

    Run on a persisted batch it reads the cache (no second read from the brokers).
    """
    from pyspark.sql import functions as F

    ms = F.unix_millis(F.col(store_ts))
    row = df.agg(F.count(F.lit(1)).alias("n"), F.min(ms).alias("low"),
                 F.percentile_approx(ms, [0.01, 0.5], 1000).alias("p")).first()
    assert row is not None  # an aggregate without grouping has exactly one row
    return int(row.n), row.low, list(row.p or [])


def lags_ms(profile: tuple[int, int | None, list[int]], committed_s: float
            ) -> tuple[float | None, float | None, float | None]:
    """Max, p50 and p99 of ``commit - store time`` in ms from a :func:`store_profile` (Nones when empty)."""
    _, low, percentiles = profile
    if low is None or len(percentiles) != 2:
        return None, None, None
    now_ms = committed_s * 1000.0
    return now_ms - low, now_ms - percentiles[1], now_ms - percentiles[0]


# -- writing a batch ---------------------------------------------------------------------------------

def append_once(frame: DataFrame, lake_root: str | os.PathLike[str], table: str, app_id: str, version: int) -> None:
    """Append ``frame`` to ``table`` with delta-spark, once per ``(app_id, version)``.

    Delta's idempotent writes: the commit records ``txnAppId``/``txnVersion``, and Delta skips the write
    when the table already holds that app id at this version or a later one.  ``version`` is a streaming
    batch id (or another number that only grows, e.g. a report window).
    """
    (frame.write.format("delta").mode("append")
     .option("txnAppId", app_id).option("txnVersion", str(version))
     .save(tables.table_path(lake_root, table)))


def _tag_hash(tags: Column) -> Column:
    """The consume queue's tag hash (``codec.tag_hash``: CRC-32 of the tag's UTF-8 bytes, 0 for none)."""
    from pyspark.sql import functions as F

    return F.when(tags.isNull() | (tags == ""), F.lit(0)).otherwise(F.crc32(F.encode(tags, "UTF-8")))


def _utc_date(ts: Column) -> Column:
    """The UTC date of a timestamp, whatever the session's time zone."""
    from pyspark.sql import functions as F

    return F.date_from_unix_date(F.floor(F.unix_micros(ts) / 86_400_000_000).cast("int"))


def dispatch_frames(rows: DataFrame) -> dict[str, DataFrame]:
    """The ``messages``, ``consume_queue`` and ``message_keys`` rows of source rows read with ``raw``.

    Spark column expressions only (no Python per row): ``rows`` has the source's columns
    (``SOURCE_SCHEMA``); each result has its table's columns (:mod:`.tables`) in order.
    ``message_keys`` gets one row for the unique id (when there is one) and one per key.
    """
    from pyspark.sql import functions as F

    from sparkmq.platform.common.message import PROPERTY_KEYS

    c = F.col
    store_ts, size = c("store_timestamp").alias("store_ts"), c("store_size").alias("size")
    place = [c("topic"), c("broker"), c("queue_id"), c("queue_offset"), c("commitlog_offset")]
    messages = rows.select(
        *place, size, c("msg_id"), c("offset_msg_id"), c("tags"), c("properties")[PROPERTY_KEYS].alias("keys"),
        c("body"), c("properties"), c("born_timestamp").alias("born_ts"), c("born_host"), store_ts,
        c("store_host"), c("reconsume_times"), c("sys_flag"), _utc_date(c("store_timestamp")).alias("store_date"))
    consume_queue = rows.select(*place, size, _tag_hash(c("tags")).alias("tag_hash"), store_ts)
    location = [*place, store_ts]
    ids = rows.where(c("msg_id") != "").select(c("msg_id").alias("key"), F.lit("msg_id").alias("key_type"),
                                               *location)
    keys = rows.select(F.explode(c("keys")).alias("key"), F.lit("key").alias("key_type"), *location)
    return {tables.MESSAGES: messages, tables.CONSUME_QUEUE: consume_queue,
            tables.MESSAGE_KEYS: ids.unionByName(keys)}


def write_batch(rows: DataFrame, batch_id: int, lake_root: str | os.PathLike[str], job: str) -> DispatchBatch:
    """Write one batch of ``raw`` source rows to the three tables, ``messages`` first, once per ``(job, batch_id)``.

    The body of the job's ``foreachBatch``; public so a batch can be re-run by hand (the tables that
    hold it skip it).  The batch is read from the brokers once: the ``messages`` write fills the cache the
    others read.  ``consume_queue`` and ``message_keys`` are written concurrently (two Spark jobs, two
    commits, both after ``messages``), so the batch takes one commit's latency less.
    """
    begin = time.time()
    rows = rows.persist()
    try:
        frames = dispatch_frames(rows)
        first, *rest = DISPATCH_TABLES
        append_once(frames[first], lake_root, first, dispatch_app_id(job, first), batch_id)
        committed = time.time()
        with concurrent.futures.ThreadPoolExecutor(len(rest), thread_name_prefix="sparkmq-dispatch") as pool:
            writes = [pool.submit(append_once, frames[name], lake_root, name, dispatch_app_id(job, name), batch_id)
                      for name in rest]
            profile = store_profile(rows, "store_timestamp")   # from the cache, while the index tables are written
            for write in writes:
                write.result()
    finally:
        rows.unpersist()
    lag_max, lag_p50, lag_p99 = lags_ms(profile, committed)
    return DispatchBatch(batch_id, profile[0], lag_max, lag_p50, lag_p99, committed, time.time() - begin)


# -- the query -----------------------------------------------------------------------------------------

def _endpoint_options(namesrv_or_brokers: str | Mapping[str, str]) -> tuple[dict[str, str], Endpoints]:
    if isinstance(namesrv_or_brokers, Mapping):
        text = ",".join(f"{n}={a}" for n, a in namesrv_or_brokers.items())
        return {"brokers": text}, Endpoints.parse(brokers=text)
    if "=" in namesrv_or_brokers:
        return {"brokers": namesrv_or_brokers}, Endpoints.parse(brokers=namesrv_or_brokers)
    return {"namesrv": namesrv_or_brokers}, Endpoints.parse(namesrv=namesrv_or_brokers)


def job_name_of(namesrv_or_brokers: str | Mapping[str, str], job_name: str | None) -> str:
    """A job's name: ``job_name``, else the broker's name when one broker is read, else ``cluster``."""
    _, endpoints = _endpoint_options(namesrv_or_brokers)
    return job_name or (endpoints.brokers[0][0] if len(endpoints.brokers) == 1 else "cluster")


def with_credentials(options: dict[str, str], credentials: Credentials | None) -> dict[str, str]:
    """``options`` plus the source's ``accessKey`` / ``secretKey`` when ``credentials`` are given (brokers with
    ACL on); the same dict."""
    if credentials is not None:
        options.update({"accessKey": credentials.access_key, "secretKey": credentials.secret_key})
    return options


def dispatch_source_options(namesrv_or_brokers: str | Mapping[str, str],
                            max_messages_per_trigger: int | None = DEFAULT_MAX_MESSAGES_PER_TRIGGER
                            ) -> dict[str, str]:
    """The ``sparkmq`` source options the job reads with (every dispatched topic, stored form, from the start)."""
    options, _ = _endpoint_options(namesrv_or_brokers)
    options.update({"subscribePattern": DISPATCH_PATTERN, "includeSystemTopics": "true", "raw": "true",
                    "startingOffsets": "earliest",
                    # Retention may delete a range before it was dispatched (a lake stopped for days):
                    # log it and go on rather than stop dispatching for good.
                    "failOnDataLoss": "false"})
    if max_messages_per_trigger is not None:
        options["maxMessagesPerTrigger"] = str(max_messages_per_trigger)
    return options


def _latest_checkpoint_batch(checkpoint_dir: str) -> int | None:
    """The newest batch id in the checkpoint's offset log (None when it has none, or is not local)."""
    if "://" in checkpoint_dir and not checkpoint_dir.startswith("file:"):
        return None
    offsets = Path(checkpoint_dir.removeprefix("file:")) / "offsets"
    ids = [int(p.name) for p in offsets.iterdir() if p.name.isdigit()] if offsets.is_dir() else []
    return max(ids, default=-1)


def check_checkpoint(checkpoint_dir: str, lake_root: str | os.PathLike[str],
                     app_ids: Mapping[str, str]) -> None:
    """Refuse a checkpoint that is behind its tables (``app_ids``: table -> ``txnAppId`` of its appends).

    Such a checkpoint (lost or replaced) would replay batch ids the tables already hold, and Delta
    would skip them as written: data silently missing.  The tables' app-transaction versions are read
    from their logs with delta-rs (a read of the log only; delta-spark has no API for it).
    """
    latest = _latest_checkpoint_batch(checkpoint_dir)
    if latest is None:
        return
    for name, app_id in app_ids.items():
        done = RustDeltaTable(tables.table_path(lake_root, name)).transaction_version(app_id)
        if done is not None and done > latest:
            raise LakeError(
                f"the table {name} already holds batch {done} of {app_id}, but the checkpoint "
                f"{checkpoint_dir} only reaches batch {latest}: it is not this job's checkpoint (lost or replaced?). "
                "Its batches would be skipped as written. Restore the checkpoint, or start with a new job name "
                "on fresh tables.")


def _default_parallelism(spark: SparkSession) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext  # noqa: BLE001
        return 2


def start_dispatch(spark: SparkSession, namesrv_or_brokers: str | Mapping[str, str],
                   lake_root: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str],
                   trigger: Mapping[str, Any] | None = None, *, job_name: str | None = None,
                   max_messages_per_trigger: int | None = DEFAULT_MAX_MESSAGES_PER_TRIGGER,
                   query_name: str | None = None, tasks: int | None = None,
                   credentials: Credentials | None = None) -> StreamingQuery:
    """Start the dispatch query and return it (running; stop it with ``query.stop()``).

    ``namesrv_or_brokers``: name servers ``"host:port;host:port"`` (a whole cluster), or brokers
    ``"broker-a=host:port,..."`` / ``{"broker-a": "host:port"}`` (a broker's own job reads itself).
    ``trigger``: keyword arguments of ``DataStreamWriter.trigger`` (default
    ``{"processingTime": "1 second"}``; ``{"availableNow": True}`` catches up and stops).
    ``job_name`` names the app ids ``dispatch-{job_name}-{table}`` (default: the broker's name
    when one broker is given, else ``cluster``); it must stay the same for a checkpoint.
    ``tasks``: Spark tasks (and so data files per table) per micro-batch (default: the session's
    default parallelism).  ``credentials``: sign every read (brokers with ACL on; the user needs
    ``Sub`` and ``Get`` on the topics).

    Creates the three tables if needed and registers them as ``sparkmq.<table>``; raises
    :class:`LakeError` when the checkpoint is behind them.
    """
    source_options = with_credentials(dispatch_source_options(namesrv_or_brokers, max_messages_per_trigger),
                                      credentials)
    job = job_name_of(namesrv_or_brokers, job_name)
    lake_root = os.fspath(lake_root)
    checkpoint = os.fspath(checkpoint_dir)
    tables.ensure_tables(spark, lake_root, DISPATCH_TABLES)
    check_checkpoint(checkpoint, lake_root, {name: dispatch_app_id(job, name) for name in DISPATCH_TABLES})
    register(spark)
    stats = DispatchStats(job)
    parallelism = tasks or _default_parallelism(spark)

    def run_batch(df: DataFrame, batch_id: int) -> None:
        try:
            # One task per core writes the batch: one data file per table and task, not one per queue.
            result = write_batch(df.coalesce(parallelism), batch_id, lake_root, job)
        except BaseException as exc:
            stats.fail(exc)
            raise
        stats.record(result)
        if result.rows:
            log.info("dispatch %s batch %d: %d messages, lag max %.0f ms p99 %.0f ms, %.3f s", job, batch_id,
                     result.rows, result.lag_ms_max, result.lag_ms_p99, result.duration_s)

    reader = spark.readStream.format(FORMAT)
    for key, value in source_options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream
             .queryName(query_name or f"sparkmq-dispatch-{job}")
             .option("checkpointLocation", checkpoint)
             .foreachBatch(run_batch)
             .trigger(**dict(trigger or DEFAULT_TRIGGER))
             .start())
    _keep_stats(query, stats)
    return query

"""The dispatch job: the commit log into the Delta tables ``consume_queue``, ``messages`` and ``message_keys``.

A Structured Streaming query plans micro-batches over every topic like the ``sparkmq``
source (same offsets, admission control and checkpoint).  Its Spark tasks pull their queue
ranges in stored form (``raw``: bodies as stored, all properties) and write the three
tables' Parquet files themselves (:mod:`.dispatch_writer`); per micro-batch
(``foreachBatch``) the driver gathers the files' descriptions and commits them with
delta-rs, one commit per table -- Delta's own protocol, with no message passing through
the JVM or the driver::

    query = start_dispatch(spark, "127.0.0.1:9876", "/data/lake", "/data/checkpoints/dispatch",
                           trigger={"processingTime": "1 second"})
    dispatch_stats(query).last          # DispatchBatch: rows, lag from store to commit, ...

Exactly once: each table's commit carries the Delta app transaction
``(f"dispatch-{job}-{table}", batch_id)`` (:func:`~.delta_files.commit_data_files`), so a batch
Spark replays after a failure -- or a batch id run again by hand -- never adds rows twice,
and a crash between the three commits is repaired by the replay.  Files of a failed or
replayed task are never committed (vacuum removes them).  The checkpoint and the
tables belong together: :func:`start_dispatch` refuses a checkpoint that is behind the tables
(a lost or swapped checkpoint would silently skip batches).

What is dispatched: every user topic, ``%RETRY%`` and ``%DLQ%`` topics (trace events have their own job).
Left out are the broker's bookkeeping topics whose messages reach the lake when they are
delivered to their real topic (delay-level schedule, timer wheel, transaction half and op
topics) and the ``TBW102`` template.

Lag: for every batch the job measures commit time minus each message's store time (max,
p50, p99, in ms) -- how fresh the index is.  It is logged and kept in :func:`dispatch_stats`.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

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
from .delta_files import DataFile, commit_data_files
from .dispatch_writer import (
    DEFAULT_TASKS,
    DISPATCH_FORMAT,
    DISPATCH_TABLES,
    build_tables,
    file_of_row,
    merge_percentiles,
    register_dispatch,
    write_dispatch_files,
)
from .errors import LakeError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "DISPATCH_TABLES",
    "DispatchBatch",
    "DispatchStats",
    "build_tables",
    "commit_batch",
    "dispatch_app_id",
    "dispatch_arrow",
    "dispatch_source_options",
    "dispatch_stats",
    "check_checkpoint",
    "start_dispatch",
]

log = logging.getLogger(__name__)

#: Topics whose messages are the broker's bookkeeping; they reach the lake via their real topic
#: (and the trace topic through the trace job, into message_trace).
_NOT_DISPATCHED = (SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, TRACE_TOPIC, POP_REVIVE_TOPIC,
                   "TBW102")
#: Every topic except those (the source's includeSystemTopics lets %RETRY% and %DLQ% through).
DISPATCH_PATTERN = "(?!(?:" + "|".join(re.escape(t) for t in _NOT_DISPATCHED) + ")$).+"

#: Upper bound of one micro-batch (its tasks hold it in memory while they write the files).
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 500_000
DEFAULT_TRIGGER: Mapping[str, Any] = {"processingTime": "1 second"}

_TS = pa.timestamp("us", tz="UTC")


def dispatch_app_id(job: str, table: str) -> str:
    """The Delta app id of ``job``'s appends to ``table``: ``dispatch-{job}-{table}``."""
    return f"dispatch-{job}-{table}"


# -- per-batch statistics ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DispatchBatch:
    """One dispatched micro-batch: what was written and how fresh it was."""

    batch_id: int
    rows: int
    #: table -> True when this run appended, False when the table already had the batch
    written: Mapping[str, bool]
    #: commit time minus store time over the batch's messages, in ms (None for an empty batch)
    lag_ms_max: float | None
    lag_ms_p50: float | None
    lag_ms_p99: float | None
    committed_at: float                  # epoch seconds
    duration_s: float


@dataclass
class DispatchStats:
    """What a dispatch query has done: the last batches, totals and the last error.  Thread-safe."""

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


# -- committing a batch -------------------------------------------------------------------------------

def _lags(store_ms: np.ndarray, now_s: float) -> tuple[float | None, float | None, float | None]:
    """Max, p50 and p99 of ``now - store time`` in ms over store times in epoch ms (Nones when empty)."""
    if store_ms.size == 0:
        return None, None, None
    lag = now_s * 1000.0 - store_ms.astype(np.float64)
    p50, p99 = np.percentile(lag, [50, 99])
    return float(lag.max()), float(p50), float(p99)


def _lag_ms(store_ts: pa.ChunkedArray | pa.Array, now_s: float) -> tuple[float | None, float | None, float | None]:
    micros = pc.cast(store_ts, _TS).cast(pa.int64()).to_numpy(zero_copy_only=False)
    return _lags(micros / 1000.0, now_s)


def commit_batch(files: Sequence[tuple[str, DataFile, Sequence[int] | None]], batch_id: int,
                 lake_root: str | os.PathLike[str], job: str, begin: float | None = None) -> DispatchBatch:
    """Commit one micro-batch's data files (``(table, file, percentiles)``), once per ``(job, batch_id)``.

    Every table gets a commit (with no files when the batch had none for it) so all three
    record the batch as done.  A batch without files commits nothing.
    """
    begin = time.time() if begin is None else begin
    written: dict[str, bool] = dict.fromkeys(DISPATCH_TABLES, False)
    rows = sum(f.num_records for name, f, _ in files if name == tables.CONSUME_QUEUE)
    if files:
        for name in DISPATCH_TABLES:
            mine = [f for table, f, _ in files if table == name]
            written[name] = commit_data_files(tables.table_path(lake_root, name), mine, dispatch_app_id(job, name),
                                              batch_id, tables.get_spec(name).partition_by)
    committed = time.time()
    samples = merge_percentiles((p, f.num_records) for name, f, p in files if name == tables.CONSUME_QUEUE and p)
    lag_max, lag_p50, lag_p99 = _lags(samples, committed)
    return DispatchBatch(batch_id, rows, written, lag_max, lag_p50, lag_p99, committed, committed - begin)


def dispatch_arrow(rows: pa.Table, batch_id: int, lake_root: str | os.PathLike[str], job: str) -> DispatchBatch:
    """Write one batch of ``raw`` source rows to the three tables here, once per ``(job, batch_id)``.

    What the job's tasks and driver do, in one process; public so a batch can be re-run by
    hand (it then commits nothing).
    """
    begin = time.time()
    files = write_dispatch_files(os.fspath(lake_root), rows) if rows.num_rows else []
    return commit_batch(files, batch_id, lake_root, job, begin)


# -- the query -----------------------------------------------------------------------------------------

def _endpoint_options(namesrv_or_brokers: str | Mapping[str, str]) -> tuple[dict[str, str], Endpoints]:
    if isinstance(namesrv_or_brokers, Mapping):
        text = ",".join(f"{n}={a}" for n, a in namesrv_or_brokers.items())
        return {"brokers": text}, Endpoints.parse(brokers=text)
    if "=" in namesrv_or_brokers:
        return {"brokers": namesrv_or_brokers}, Endpoints.parse(brokers=namesrv_or_brokers)
    return {"namesrv": namesrv_or_brokers}, Endpoints.parse(namesrv=namesrv_or_brokers)


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
    """Refuse a checkpoint that is behind its tables (``app_ids``: table -> app id of its appends).

    Such a checkpoint (lost or replaced) would replay batch ids the tables already hold,
    and the exactly-once guard would skip them as written: data silently missing.
    """
    latest = _latest_checkpoint_batch(checkpoint_dir)
    if latest is None:
        return
    for name, app_id in app_ids.items():
        done = DeltaTable(tables.table_path(lake_root, name)).transaction_version(app_id)
        if done is not None and done > latest:
            raise LakeError(
                f"the table {name} already holds batch {done} of {app_id}, but the checkpoint "
                f"{checkpoint_dir} only reaches batch {latest}: it is not this job's checkpoint (lost or replaced?). "
                "Its batches would be skipped as written. Restore the checkpoint, or start with a new job name "
                "on fresh tables.")


def _check_checkpoint(checkpoint_dir: str, lake_root: str | os.PathLike[str], job: str) -> None:
    check_checkpoint(checkpoint_dir, lake_root, {name: dispatch_app_id(job, name) for name in DISPATCH_TABLES})


def _default_parallelism(spark: SparkSession) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext  # noqa: BLE001
        return DEFAULT_TASKS


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
    ``tasks``: Spark tasks per micro-batch (default: the session's default parallelism).
    ``credentials``: sign every read (brokers with ACL on; the user needs ``Sub`` and ``Get`` on the topics).

    Creates the three tables if needed; raises :class:`LakeError` when the checkpoint is behind them.
    """
    source_options = with_credentials(dispatch_source_options(namesrv_or_brokers, max_messages_per_trigger),
                                      credentials)
    _, endpoints = _endpoint_options(namesrv_or_brokers)
    job = job_name or (endpoints.brokers[0][0] if len(endpoints.brokers) == 1 else "cluster")
    lake_root = os.fspath(lake_root)
    checkpoint = os.fspath(checkpoint_dir)
    tables.ensure_tables(lake_root, DISPATCH_TABLES)
    _check_checkpoint(checkpoint, lake_root, job)
    register_dispatch(spark)
    stats = DispatchStats(job)

    def run_batch(df: DataFrame, batch_id: int) -> None:
        begin = time.time()
        try:
            result = commit_batch([file_of_row(r) for r in df.collect()], batch_id, lake_root, job, begin)
        except BaseException as exc:
            stats.fail(exc)
            raise
        stats.record(result)
        if result.rows:
            log.info("dispatch %s batch %d: %d messages, written %s, lag max %.0f ms p99 %.0f ms, %.3f s", job,
                     batch_id, result.rows, [t for t, w in result.written.items() if w], result.lag_ms_max,
                     result.lag_ms_p99, result.duration_s)

    reader = (spark.readStream.format(DISPATCH_FORMAT).option("lakeRoot", lake_root)
              .option("tasks", str(tasks or _default_parallelism(spark))))
    for key, value in source_options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream
             .queryName(query_name or f"sparkmq-dispatch-{job}")
             .option("checkpointLocation", checkpoint)
             .foreachBatch(run_batch)
             .trigger(**dict(trigger or DEFAULT_TRIGGER))
             .start())
    with _stats_lock:
        _stats[str(query.id)] = stats
    return query

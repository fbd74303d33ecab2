"""Per-minute reports: ``topic_stats`` and ``group_stats`` (issue 5, item 7).

Once a minute the lake service calls :meth:`Reporter.run` (or the stateless
:func:`run_report`).  Every *closed* minute window ``[t, t + 60 s)`` not yet reported
is computed and appended:

* ``topic_stats`` per (window, topic, broker): ``messages_in`` / ``bytes_in`` are the
  ``consume_queue`` rows whose ``store_ts`` falls in the window (``size`` = bytes);
  ``messages_out`` / ``bytes_out`` are what consumer groups consumed in the window
  (the sum over groups of their ``group_stats`` rows); TPS = count / 60.
* ``group_stats`` per (window, group, topic, broker, queue): ``messages_in`` (stored on
  the queue in the window), ``messages_out`` (advance of the committed offset since the
  group's previous row), ``bytes_out`` (``size`` of the ``consume_queue`` rows of the
  consumed offsets), ``tps_out``, and the broker's ``committed_offset``, ``max_offset``
  and ``lag``.

Where the numbers come from, and why:

* *In* counts come from ``consume_queue`` (the dispatch job's table), so they are exact
  once dispatch has caught up: a window is reported only ``grace_s`` (default 15 s,
  well above the dispatch freshness target of 3 s) after it closed.
* Committed and max offsets exist only on the brokers, as *current* values: they are
  sampled (``GET /consumers/{group}/lag`` on every master) when a run reports the most
  recent closed window, and that sample is what the window's ``group_stats`` rows
  carry.  The previous sample is the group's previous row *in the table*, so a restart
  continues where the last run stopped.  When a run catches up several windows (after
  downtime) only the newest gets ``group_stats`` rows; the consumption since the
  previous sample is then attributed to it and ``tps_out`` divides by the whole span.
* A queue whose offset was never committed counts from ``max_offset - lag`` (the
  broker counts its lag from the oldest stored message); an offset reset backwards
  gives ``messages_out = 0``, never a negative count.
* Groups sampled = groups with members on any master (``GET /consumers``) + groups with
  a ``group_stats`` row in the last ``group_lookback_minutes`` (so a group whose
  consumers all died keeps being reported -- that is exactly the stuck group an alert
  should catch) + ``extra_groups``.

Spark does the work: consume_queue is read with delta-spark, which skips the files whose
``store_ts`` statistics lie outside the windows (dispatch appends in store order, so a minute's
rows sit in a few files), and the GROUP BY and the bytes-out range join (ranges broadcast) run
on the executors.  The rows it writes -- a few hundred a minute -- are appended with delta-spark.

Exactly once: both tables are appended with Delta's ``txnAppId = report-{job}`` and ``txnVersion =``
the window start in minutes since the epoch; several catch-up windows go in one commit whose version
is the newest window, so re-running any of them adds nothing.

Example (what the lake service does, from its own thread, every 60 s)::

    reporter = Reporter("/data/lake", offsets_source("127.0.0.1:9876"), spark=spark,
                        alerts=load_alert_config(conf))
    result = reporter.run()            # ReportResult(windows=[...], topic_rows=..., ...)
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable

from sparkmq.platform.auth import Credentials
from sparkmq.platform.client import AdminClient, BrokerClient, ClientConfig
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.protocol import (
    MAX_REPORT_ROWS,
    REPORT_KINDS,
    ReportPoint,
    ReportSeries,
    report_range,
)
from sparkmq.platform.common.validation import check_int, validate_group, validate_topic

from . import tables
from .dispatch import append_once

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from .alerts import AlertConfig, AlertResult

__all__ = [
    "BrokerOffsets",
    "OffsetsSource",
    "QueueSample",
    "ReportResult",
    "Reporter",
    "offsets_source",
    "read_report_series",
    "report_app_id",
    "run_report",
]

log = logging.getLogger("sparkmq.lake.reports")

UTC = dt.UTC
WINDOW = dt.timedelta(minutes=1)
_TS = pa.timestamp("us", tz="UTC")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)

#: Wait this long after a window closed before reporting it: rows stored near its end
#: reach consume_queue with the dispatch job's lag (target p99 <= 3 s).
DEFAULT_GRACE_S = 15.0
#: A lake with no report yet starts this many windows back.
DEFAULT_BACKFILL_MINUTES = 60
#: At most this many windows per run (one day), so catching up after long downtime stays bounded.
MAX_WINDOWS_PER_RUN = 1440
#: How far back group_stats is read for previous samples and sticky groups.
DEFAULT_GROUP_LOOKBACK_MINUTES = 60


def report_app_id(job: str) -> str:
    """The Delta app id of the report writes (``report-<job>``), the same for both tables."""
    return f"report-{job}"


def window_version(window_start: dt.datetime) -> int:
    """The app-transaction version of a window: its start in whole minutes since the epoch."""
    return int((window_start - _EPOCH).total_seconds()) // 60


def version_window(version: int) -> dt.datetime:
    """The window start of an app-transaction version (inverse of :func:`window_version`)."""
    return _EPOCH + dt.timedelta(minutes=version)


def _floor_minute(ts: dt.datetime) -> dt.datetime:
    if ts.tzinfo is None:
        raise ValueError(f"timestamps must be timezone-aware (UTC), got {ts!r}")
    ts = ts.astimezone(UTC)
    return ts.replace(second=0, microsecond=0)


# -- offsets from the brokers ---------------------------------------------------------------

@dataclass(frozen=True)
class QueueSample:
    """One group's position on one queue, as a broker answered it at sample time."""

    group: str
    topic: str
    broker: str
    queue_id: int
    committed_offset: int | None   # None: the group never committed on this queue
    max_offset: int
    lag: int


class OffsetsSource(Protocol):
    """Where committed and max offsets come from (real brokers, or a test double)."""

    def sample(self, known_groups: Iterable[str]) -> list[QueueSample]:
        """Every queue of every group (live ones and ``known_groups``) with its offsets, now.

        A broker that does not answer is left out (its queues get no rows this window);
        it must not be reported as lag 0.
        """
        ...


class BrokerOffsets:
    """Offsets from real brokers over HTTP: name servers (all masters) or brokers named directly.

    For each master: ``GET /consumers`` (groups with members) and ``GET /consumers/{group}/lag``
    for those and the ``known_groups`` -- what :meth:`AdminClient.group_lag` does, per broker so
    that a broker without name servers (the embedded lake) works too.
    """

    def __init__(self, *, namesrv: str | None = None, brokers: Mapping[str, str] | None = None,
                 timeout_s: float = 5.0, credentials: Credentials | None = None) -> None:
        """Exactly one of ``namesrv`` (``"host:port;host:port"``) and ``brokers`` (name -> host:port);
        ``credentials`` sign every request (name servers and brokers with ACL on: ``Get`` on the groups)."""
        if (namesrv is None) == (brokers is None):
            raise ValueError("give exactly one of namesrv and brokers")
        keys: dict[str, Any] = {} if credentials is None else {
            "access_key": credentials.access_key, "secret_key": credentials.secret_key}
        self._admin = AdminClient(ClientConfig(namesrv_addrs=namesrv, **keys)) if namesrv else None
        self._fixed = dict(brokers or {})
        self._timeout_s = timeout_s
        self._credentials = credentials
        self._clients: dict[str, BrokerClient] = {}
        self._lock = threading.Lock()

    def _client(self, addr: str) -> BrokerClient:
        with self._lock:
            client = self._clients.get(addr)
            if client is None:
                client = self._clients[addr] = BrokerClient(addr, self._timeout_s, credentials=self._credentials)
            return client

    def masters(self) -> dict[str, str]:
        """Broker name -> address of every master to ask."""
        return self._admin.masters() if self._admin is not None else dict(self._fixed)

    def sample(self, known_groups: Iterable[str]) -> list[QueueSample]:
        """See :meth:`OffsetsSource.sample`."""
        known = set(known_groups)
        out: list[QueueSample] = []
        for name, addr in sorted(self.masters().items()):
            client = self._client(addr)
            try:
                groups = sorted(set(client.consumer_groups()) | known)
                answers = [client.group_lag(g) for g in groups]
            except SparkMQError as exc:
                log.warning("report: broker %s (%s) did not answer the offsets sample: %s", name, addr, exc)
                continue
            for group, answer in zip(groups, answers, strict=True):
                for q in answer.get("queues") or ():
                    committed = int(q["consumer_offset"])
                    out.append(QueueSample(group, str(q["topic"]), name, int(q["queue_id"]),
                                           committed if committed >= 0 else None, int(q["broker_offset"]),
                                           int(q["lag"])))
        return out

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
        if self._admin is not None:
            self._admin.close()


def offsets_source(namesrv_or_brokers: str | Mapping[str, str], timeout_s: float = 5.0, *,
                   credentials: Credentials | None = None) -> BrokerOffsets:
    """A :class:`BrokerOffsets` from what the lake service holds: a name-server string or name -> address
    (``credentials``: what it signs its requests with)."""
    if isinstance(namesrv_or_brokers, str):
        return BrokerOffsets(namesrv=namesrv_or_brokers, timeout_s=timeout_s, credentials=credentials)
    return BrokerOffsets(brokers=namesrv_or_brokers, timeout_s=timeout_s, credentials=credentials)


# -- results ---------------------------------------------------------------------------------

@dataclass
class ReportResult:
    """What one run did."""

    windows: list[dt.datetime] = field(default_factory=list)   # window starts reported now (oldest first)
    topic_rows: int = 0
    group_rows: int = 0
    wrote: bool = False                 # False when there was nothing to do or another run had done it
    sampled: bool = False               # whether broker offsets were sampled (group_stats written)
    last_window: dt.datetime | None = None   # the newest window reported so far (by any run)
    alerts: AlertResult | None = None


# -- aggregation over consume_queue ------------------------------------------------------------

_IN_SCHEMA = pa.schema([("window_start", _TS), ("topic", pa.string()), ("broker", pa.string()),
                        ("queue_id", pa.int32()), ("messages", pa.int64()), ("bytes", pa.int64())])
_RANGE_SCHEMA = pa.schema([("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32()),
                           ("lo", pa.int64()), ("hi", pa.int64())])
_OUT_SCHEMA = pa.schema([("topic", pa.string()), ("broker", pa.string()), ("queue_id", pa.int32()),
                         ("lo", pa.int64()), ("hi", pa.int64()), ("bytes", pa.int64())])
_CQ_COLUMNS = ["topic", "broker", "queue_id", "queue_offset", "size", "store_ts"]


def _delta(spark: SparkSession, lake_root: str, name: str) -> DataFrame:
    """A lake table read by delta-spark (by path: the job's own lake root, whatever the catalog names)."""
    return spark.read.format("delta").load(tables.table_path(lake_root, name))


def _in_counts(spark: SparkSession, lake_root: str, start: dt.datetime, end: dt.datetime,
               brokers: frozenset[str] | None) -> pa.Table:
    """Messages and bytes stored per (window, topic, broker, queue) in ``[start, end)``, from consume_queue.

    Delta skips the files whose ``store_ts`` statistics lie outside the range: dispatch appends in store
    order, so a run reads the few files of its minutes.
    """
    from pyspark.sql import functions as F

    df = _delta(spark, lake_root, tables.CONSUME_QUEUE).where(
        (F.col("store_ts") >= F.lit(start)) & (F.col("store_ts") < F.lit(end)))
    if brokers is not None:
        df = df.where(F.col("broker").isin(sorted(brokers)))
    agg = (df.groupBy(F.date_trunc("minute", "store_ts").alias("window_start"), "topic", "broker", "queue_id")
           .agg(F.count(F.lit(1)).alias("messages"), F.sum(F.col("size").cast("long")).alias("bytes")))
    return _conform(agg.toArrow(), _IN_SCHEMA)


def _out_bytes(spark: SparkSession, lake_root: str, ranges: pa.Table) -> pa.Table:
    """Sum of ``size`` over the consume_queue rows with ``lo <= queue_offset < hi`` of each range's queue."""
    from pyspark.sql import functions as F

    if ranges.num_rows == 0:
        return _OUT_SCHEMA.empty_table()
    topics = sorted(set(ranges["topic"].to_pylist()))
    min_lo = pc.min(ranges["lo"]).as_py()
    df = _delta(spark, lake_root, tables.CONSUME_QUEUE).where(
        F.col("topic").isin(topics) & (F.col("queue_offset") >= F.lit(min_lo)))
    r = spark.createDataFrame(ranges)
    # A few hundred ranges at most: broadcast them, so the join never shuffles consume_queue.
    joined = df.join(F.broadcast(r), ["topic", "broker", "queue_id"]).where(
        (F.col("queue_offset") >= F.col("lo")) & (F.col("queue_offset") < F.col("hi")))
    agg = (joined.groupBy("topic", "broker", "queue_id", "lo", "hi")
           .agg(F.sum(F.col("size").cast("long")).alias("bytes")))
    return _conform(agg.toArrow(), _OUT_SCHEMA)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Spark's Arrow (nullable fields, its own tz spelling) cast to ``schema``."""
    return pa.table([table[f.name].cast(f.type) for f in schema], schema=schema)


def _window_rows(spark: SparkSession, lake_root: str, name: str, columns: list[str], start: dt.datetime,
                 end: dt.datetime) -> pa.Table:
    """``columns`` of a report table's rows with ``start <= window_start < end``."""
    from pyspark.sql import functions as F

    df = _delta(spark, lake_root, name).where((F.col("window_start") >= F.lit(start))
                                              & (F.col("window_start") < F.lit(end)))
    spec = tables.get_spec(name).schema
    return _conform(df.select(*columns).toArrow(), pa.schema([spec.field(c) for c in columns]))


# -- state kept in group_stats -----------------------------------------------------------------

_GroupKey = tuple[str, str, str, int]   # group, topic, broker, queue_id


def _previous_rows(spark: SparkSession, lake_root: str, since: dt.datetime,
                   before: dt.datetime) -> dict[_GroupKey, dict[str, Any]]:
    """The latest group_stats row per (group, topic, broker, queue) with ``since <= window_start < before``."""
    rows = _window_rows(spark, lake_root, tables.GROUP_STATS,
                        ["window_start", "group", "topic", "broker", "queue_id", "committed_offset", "max_offset",
                         "lag"], since, before)
    out: dict[_GroupKey, dict[str, Any]] = {}
    for row in rows.sort_by("window_start").to_pylist():
        out[(row["group"], row["topic"], row["broker"], row["queue_id"])] = row
    return out


def _effective_committed(committed: int | None, max_offset: int, lag: int) -> int:
    """Where the group stands: the committed offset, or where the broker counts its lag from."""
    return committed if committed is not None else max(0, max_offset - lag)


# -- the report step ---------------------------------------------------------------------------

def _txn_version(lake_root: str, name: str, app_id: str) -> int | None:
    """The newest ``txnVersion`` of ``app_id`` in a table's log (read with delta-rs: delta-spark has no API)."""
    return DeltaTable(tables.table_path(lake_root, name)).transaction_version(app_id)


def _append(spark: SparkSession, lake_root: str, name: str, rows: pa.Table, app_id: str, version: int) -> None:
    """Append report rows (built here, a few hundred a minute) with delta-spark, once per ``(app_id, version)``."""
    append_once(spark.createDataFrame(rows, schema=tables.spark_schema(name)), lake_root, name, app_id, version)


def run_report(spark: SparkSession, lake_root: str | os.PathLike[str], now: dt.datetime | None,
               sources: OffsetsSource | None, *, job: str = "cluster", brokers: Iterable[str] | None = None,
               grace_s: float = DEFAULT_GRACE_S, backfill_minutes: int = DEFAULT_BACKFILL_MINUTES,
               group_lookback_minutes: int = DEFAULT_GROUP_LOOKBACK_MINUTES,
               extra_groups: Iterable[str] = ()) -> ReportResult:
    """Report every closed minute window not yet in ``topic_stats`` / ``group_stats``; exactly once per window.

    ``now`` (default: the clock) decides which windows are closed: those ending at least
    ``grace_s`` before it.  ``sources`` gives the brokers' offsets (None: no group_stats,
    and topic_stats count only what came in).  ``brokers`` limits the report to those
    broker names (an embedded lake reporting only its own broker; the app id then should
    name the job, ``job=<broker name>``).  ``spark`` reads the tables and writes the reports
    (delta-spark).  Stateless: what is done and the previous offsets sample are read from the
    tables, so any process may run it after any other.
    """
    check_int("backfill_minutes", backfill_minutes, 1, error=ValueError)
    lake_root = os.fspath(lake_root)
    now = (now or dt.datetime.now(UTC)).astimezone(UTC)
    broker_set = frozenset(brokers) if brokers is not None else None
    app_id = report_app_id(job)
    tables.ensure_tables(spark, lake_root, [tables.CONSUME_QUEUE, tables.TOPIC_STATS, tables.GROUP_STATS])

    last_closed = _floor_minute(now - dt.timedelta(seconds=grace_s)) - WINDOW
    done = _txn_version(lake_root, tables.TOPIC_STATS, app_id)
    first = (version_window(done) + WINDOW) if done is not None else last_closed - WINDOW * (backfill_minutes - 1)
    result = ReportResult(last_window=version_window(done) if done is not None else None)
    if first > last_closed:
        return result
    last = min(last_closed, first + WINDOW * (MAX_WINDOWS_PER_RUN - 1))
    windows = [first + WINDOW * i for i in range(int((last - first) / WINDOW) + 1)]
    version = window_version(last)
    end = last + WINDOW

    # 1. messages in, per queue and window, from consume_queue.
    in_rows = _in_counts(spark, lake_root, first, end, broker_set).to_pylist()

    # 2. group_stats of the newest window, from a fresh offsets sample -- only when this run
    #    reaches the newest closed window (a sample taken now describes now, not an old window).
    group_done = _txn_version(lake_root, tables.GROUP_STATS, app_id)
    if sources is not None and last == last_closed and (group_done is None or group_done < version):
        since = last - dt.timedelta(minutes=group_lookback_minutes)
        previous = _previous_rows(spark, lake_root, since, last)
        known = {k[0] for k in previous} | set(extra_groups)
        samples = [s for s in sources.sample(sorted(known)) if broker_set is None or s.broker in broker_set]
        group_table = _group_rows(spark, lake_root, last, samples, previous, in_rows)
        result.sampled = True
        _append(spark, lake_root, tables.GROUP_STATS, group_table, app_id, version)
        result.group_rows = group_table.num_rows

    # 3. topic_stats: in from consume_queue; out from the group_stats rows now in the table for
    #    these windows (not from this run's sample: after a crash between the two appends the
    #    re-run must use what was written).
    out_rows = _group_out_by_topic(spark, lake_root, first, end, broker_set)
    topic_table = _topic_rows(windows, in_rows, out_rows)
    _append(spark, lake_root, tables.TOPIC_STATS, topic_table, app_id, version)
    result.wrote = True
    result.windows = windows
    result.topic_rows = topic_table.num_rows
    result.last_window = last
    return result


def _group_rows(spark: SparkSession, lake_root: str, window: dt.datetime, samples: Sequence[QueueSample],
                previous: Mapping[_GroupKey, Mapping[str, Any]], in_rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    in_by_queue: dict[tuple[str, str, int], int] = {}
    for r in in_rows:
        if r["window_start"] == window:
            key = (r["topic"], r["broker"], r["queue_id"])
            in_by_queue[key] = in_by_queue.get(key, 0) + r["messages"]
    rows: list[dict[str, Any]] = []
    ranges: set[tuple[str, str, int, int, int]] = set()
    for s in samples:
        eff = _effective_committed(s.committed_offset, s.max_offset, s.lag)
        prev = previous.get((s.group, s.topic, s.broker, s.queue_id))
        out, span, consumed = 0, 1, None
        if prev is not None:
            prev_eff = _effective_committed(prev["committed_offset"], prev["max_offset"], prev["lag"])
            out = max(0, eff - prev_eff)        # a reset backwards consumed nothing
            span = max(1, round((window - prev["window_start"]) / WINDOW))
            if out:
                consumed = (s.topic, s.broker, s.queue_id, prev_eff, eff)
                ranges.add(consumed)
        rows.append({"window_start": window, "group": s.group, "topic": s.topic, "broker": s.broker,
                     "queue_id": s.queue_id, "messages_in": in_by_queue.get((s.topic, s.broker, s.queue_id), 0),
                     "messages_out": out, "tps_out": out / (60.0 * span), "committed_offset": s.committed_offset,
                     "max_offset": s.max_offset, "lag": s.lag, "_consumed": consumed})
    # bytes_out: the sizes of the consumed offsets, one pass over consume_queue for every range.
    range_table = pa.Table.from_pylist([dict(zip(_RANGE_SCHEMA.names, r, strict=True)) for r in sorted(ranges)],
                                       schema=_RANGE_SCHEMA)
    sizes = _out_bytes(spark, lake_root, range_table)
    by_range = {(r["topic"], r["broker"], r["queue_id"], r["lo"], r["hi"]): r["bytes"] for r in sizes.to_pylist()}
    for row in rows:
        consumed = row.pop("_consumed")
        row["bytes_out"] = by_range.get(consumed, 0) if consumed is not None else 0
    return pa.Table.from_pylist(rows, schema=tables.get_spec(tables.GROUP_STATS).schema)


def _group_out_by_topic(spark: SparkSession, lake_root: str, start: dt.datetime, end: dt.datetime,
                        brokers: frozenset[str] | None) -> dict[tuple, tuple[int, int, float]]:
    """(window, topic, broker) -> (messages_out, bytes_out, tps_out) summed over groups and queues.

    Only ``brokers`` (None: all): another job's rows for its own brokers are its business.
    """
    rows = _window_rows(spark, lake_root, tables.GROUP_STATS,
                        ["window_start", "topic", "broker", "messages_out", "bytes_out", "tps_out"], start, end)
    out: dict[tuple, tuple[int, int, float]] = {}
    for r in rows.to_pylist():
        if brokers is not None and r["broker"] not in brokers:
            continue
        key = (r["window_start"], r["topic"], r["broker"])
        m, b, t = out.get(key, (0, 0, 0.0))
        out[key] = (m + r["messages_out"], b + r["bytes_out"], t + r["tps_out"])
    return out


def _topic_rows(windows: Sequence[dt.datetime], in_rows: Sequence[Mapping[str, Any]],
                out_rows: Mapping[tuple, tuple[int, int, float]]) -> pa.Table:
    wanted = set(windows)
    acc: dict[tuple, list] = {}
    for r in in_rows:
        if r["window_start"] not in wanted:
            continue
        key = (r["window_start"], r["topic"], r["broker"])
        a = acc.setdefault(key, [0, 0])
        a[0] += r["messages"]
        a[1] += r["bytes"]
    keys = sorted((set(acc) | {k for k in out_rows if k[0] in wanted}), key=lambda k: (k[0], k[1], k[2]))
    rows = []
    for key in keys:
        m_in, b_in = acc.get(key, (0, 0))
        m_out, b_out, tps_out = out_rows.get(key, (0, 0, 0.0))
        rows.append({"window_start": key[0], "topic": key[1], "broker": key[2], "messages_in": m_in,
                     "bytes_in": b_in, "messages_out": m_out, "bytes_out": b_out, "tps_in": m_in / 60.0,
                     "tps_out": tps_out})
    return pa.Table.from_pylist(rows, schema=tables.get_spec(tables.TOPIC_STATS).schema)


# -- the stateful runner the lake service keeps ------------------------------------------------

class Reporter:
    """Runs :func:`run_report` (then the alert rules) once a minute; keeps the last reported window.

    Thread-safe: :meth:`run` holds a lock, so a slow run and the next tick never overlap.
    The state is only a cache -- the tables hold the truth -- so a new Reporter (a restart)
    continues where the old one stopped.
    """

    def __init__(self, lake_root: str | os.PathLike[str], sources: OffsetsSource | None, *,
                 spark: SparkSession, job: str = "cluster", brokers: Iterable[str] | None = None,
                 grace_s: float = DEFAULT_GRACE_S, backfill_minutes: int = DEFAULT_BACKFILL_MINUTES,
                 extra_groups: Iterable[str] = (), alerts: AlertConfig | Mapping[str, Any] | None = None,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        """``spark`` reads and writes the tables; ``alerts``: an :class:`~.alerts.AlertConfig` or the
        ``[alerts]`` conf mapping (None: no rules)."""
        from .alerts import AlertConfig, AlertEngine

        self.lake_root = os.fspath(lake_root)
        self.sources = sources
        self.spark = spark
        self.job = job
        self.brokers = frozenset(brokers) if brokers is not None else None
        self.grace_s = grace_s
        self.backfill_minutes = backfill_minutes
        self.extra_groups = tuple(extra_groups)
        config = alerts if isinstance(alerts, AlertConfig) or alerts is None else AlertConfig.from_mapping(alerts)
        self.alert_engine = (AlertEngine(spark, self.lake_root, config) if config is not None and config.rules
                             else None)
        self._clock = clock or (lambda: dt.datetime.now(UTC))
        self._lock = threading.Lock()
        self.last_window: dt.datetime | None = None
        self.last_result: ReportResult | None = None
        self.last_error: str | None = None

    def run(self, now: dt.datetime | None = None) -> ReportResult:
        """Report the closed windows, then evaluate the alert rules on the newest one; never overlaps itself."""
        with self._lock:
            now = now or self._clock()
            try:
                result = run_report(self.spark, self.lake_root, now, self.sources, job=self.job,
                                    brokers=self.brokers, grace_s=self.grace_s,
                                    backfill_minutes=self.backfill_minutes, extra_groups=self.extra_groups)
                if self.alert_engine is not None and result.last_window is not None:
                    # Evaluated every run (not only when a window was written): a webhook that
                    # failed is retried, and a rerun after a crash still raises what it should.
                    result.alerts = self.alert_engine.evaluate(result.last_window, now)
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                raise
            self.last_error = None
            self.last_window = result.last_window
            self.last_result = result
            return result

    def loop(self, stop: threading.Event, interval_s: float = 60.0) -> None:
        """Run every ``interval_s`` until ``stop`` is set -- the body of the lake service's report thread.

        Each run is timed to ``grace_s`` + 1 s past a minute boundary, just after a window
        becomes reportable.  Errors (a broker down, a commit race lost eight times, Spark
        restarting) are logged and kept in :meth:`status`; the next tick retries, and since
        every window not yet reported is caught up, nothing is lost.
        """
        while not stop.is_set():
            try:
                self.run()
            except Exception:
                log.exception("report run failed; retrying in %.0f s", interval_s)
            now = self._clock()
            since_boundary = (now - _floor_minute(now)).total_seconds()
            offset = (self.grace_s + 1.0) % interval_s
            stop.wait((offset - since_boundary) % interval_s or interval_s)

    def status(self) -> dict[str, Any]:
        """For /health and ``sparkmq admin lake status``."""
        last = self.last_result
        return {"last_window": self.last_window.isoformat() if self.last_window else None,
                "last_topic_rows": last.topic_rows if last else None,
                "last_group_rows": last.group_rows if last else None,
                "last_error": self.last_error}


# -- reading the reports back (the broker's GET /reports/..., for charts) --------------------------

def read_report_series(lake_root: str | os.PathLike[str], kind: str, name: str, range_name: str, *,
                       broker: str | None = None, now: dt.datetime | None = None,
                       max_rows: int = MAX_REPORT_ROWS) -> ReportSeries:
    """One topic's (``topic_stats``) or group's (``group_stats``) rows of the last ``range_name`` (``"1h"``,
    ``"6h"``, ``"24h"``, ``"7d"``), summed per bucket of :data:`~sparkmq.platform.common.protocol.REPORT_RANGES`.

    ``broker``: only that broker's rows (a broker answers for its own queues, also in a lake it shares).
    A group's ``lag`` is its lag over every queue at the end of the bucket's last window.  At most
    ``max_rows`` rows are scanned (then ``truncated``).  No table yet: no points.  INVALID_ARGUMENT for an
    unknown kind or range, TOPIC_ILLEGAL / GROUP_ILLEGAL for a bad name.  delta-rs only, no Spark.

    Example::

        series = read_report_series("/data/broker/lake", "group", "orders-cg", "6h", broker="broker-a")
        [(p.t, p.tps_out, p.lag) for p in series.points]
    """
    seconds, step = report_range(range_name)
    if kind not in REPORT_KINDS:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"kind must be one of {list(REPORT_KINDS)}, got {kind!r}")
    (validate_topic if kind == "topic" else validate_group)(name)
    check_int("max_rows", max_rows, 1)
    empty = ReportSeries(kind, name, range_name, step)
    path = tables.table_path(lake_root, tables.TOPIC_STATS if kind == "topic" else tables.GROUP_STATS)
    if not DeltaTable.is_deltatable(path):
        return empty
    start = (now or dt.datetime.now(UTC)) - dt.timedelta(seconds=seconds)
    columns = ["window_start", "messages_in", "messages_out"] + (["lag"] if kind == "group" else [])
    cond = (pads.field("window_start") >= pa.scalar(start, _TS)) & (pads.field(kind) == name)
    if broker is not None:
        cond &= pads.field("broker") == broker
    dataset = DeltaTable(path).to_pyarrow_dataset(file_pruning_predicate=[("window_start", ">=", start)])
    per_window: dict[int, list[int]] = {}  # epoch s -> [messages_in, messages_out, lag]
    scanned, truncated = 0, False
    for batch in dataset.to_batches(columns=columns, filter=cond):
        if scanned + batch.num_rows > max_rows:
            batch, truncated = batch.slice(0, max_rows - scanned), True
        scanned += batch.num_rows
        sums = pa.Table.from_batches([batch]).group_by("window_start").aggregate(
            [(c, "sum") for c in columns[1:]])
        for row in sums.to_pylist():
            acc = per_window.setdefault(int(row["window_start"].timestamp()), [0, 0, 0])
            for i, c in enumerate(columns[1:]):
                acc[i] += row[f"{c}_sum"] or 0
        if truncated:
            break
    buckets: dict[int, list[int]] = {}  # bucket start -> [in, out, lag, window the lag is of]
    for window, (n_in, n_out, lag) in sorted(per_window.items()):
        acc = buckets.setdefault(window - window % step, [0, 0, 0, window])
        acc[0] += n_in
        acc[1] += n_out
        acc[2], acc[3] = lag, window  # windows come in order: the bucket's last one wins
    newest_end = max(per_window, default=0) + 60
    points = []
    for t, (n_in, n_out, lag, _) in sorted(buckets.items()):
        span = min(step, newest_end - t)  # the newest bucket may not be complete yet: its rate is over what is
        points.append(ReportPoint(t, n_in, n_out, n_in / span, n_out / span, lag if kind == "group" else None))
    return ReportSeries(kind, name, range_name, step, points, truncated)

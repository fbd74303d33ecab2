"""Table maintenance by delta-spark: keep the lake's Delta tables fast after days of one-commit-per-batch writes.

Every streaming job commits once per micro-batch, so a table gathers small Parquet files and one JSON
log entry per trigger (86,400 a day at 1 s).  Readers list every file and replay the log since the last
checkpoint, so both must be bounded.  :func:`run_maintenance` does, for each table that had at least
``min_commits_between`` commits since it was last compacted (:func:`maintain`):

* **compaction** -- ``OPTIMIZE``: small files rewritten into few large ones (same rows, a commit with
  ``dataChange = false``, so streaming readers of the table skip it);
* **vacuum** -- ``VACUUM``: files removed from the table more than ``vacuum_retention_hours`` ago are
  deleted (default 7 days, Delta's own; below :data:`MIN_SAFE_VACUUM_RETENTION_HOURS` it refuses:
  readers holding an older snapshot, and time travel inside the retention, must keep working);
* **checkpoint** -- of the latest version (Delta also writes one every ``delta.checkpointInterval``
  commits), so readers replay few log entries; log entries older than ``delta.logRetentionDuration``
  are cleaned up when Delta checkpoints.

``consumer_offsets`` is not compacted: the broker's delta-rs MERGE keeps it compact, and an
``OPTIMIZE`` racing a broker's MERGE would make one of them retry; it is vacuumed and checkpointed.

:class:`Maintainer` runs it periodically on a thread (the lake service: hourly)::

    maintainer = Maintainer(spark, "/data/lake", interval_s=3600).start()
    maintainer.status()          # last run, per-table results, last error
    maintainer.stop()

Appends from the jobs may run concurrently: Delta's conflict checks let an append commit while
``OPTIMIZE`` rewrites files it did not touch.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import Meta

from sparkmq.platform.common.errors import ErrorCode
from sparkmq.platform.common.validation import check, check_int

from . import tables as lake_tables
from .errors import LakeError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_VACUUM_RETENTION_HOURS",
    "MIN_SAFE_VACUUM_RETENTION_HOURS",
    "Maintainer",
    "commits_since_compaction",
    "maintain",
    "run_maintenance",
]

log = logging.getLogger(__name__)

#: How often the lake service maintains its tables.
DEFAULT_INTERVAL_S = 3600.0
DEFAULT_MIN_COMMITS_BETWEEN = 50
#: Vacuum keeps removed files this long by default: Delta's own default (``delta.deletedFileRetentionDuration``).
DEFAULT_VACUUM_RETENTION_HOURS = 168
#: The shortest retention :func:`maintain` accepts without ``allow_unsafe_retention``.  Removed files must
#: outlive every reader that still holds an older snapshot: long scans, streaming readers, time travel.
MIN_SAFE_VACUUM_RETENTION_HOURS = 24
#: Tables whose writer keeps them compact (the broker's MERGE): vacuumed and checkpointed, never OPTIMIZEd.
_SELF_COMPACTING = frozenset({lake_tables.CONSUMER_OFFSETS})
#: The operations maintenance itself commits (VACUUM logs a start and an end).
_MAINTENANCE_OPERATIONS = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
#: Delta's guard against a VACUUM retention below the table's; sparkmq's own floor above replaces it.
_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_retention_lock = threading.Lock()


def _table(spark: SparkSession, path: str) -> Any:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path)


def _version_and_files(spark: SparkSession, path: str) -> tuple[int, int]:
    table = _table(spark, path)
    return int(table.history(1).first().version), int(table.detail().first().numFiles)


def commits_since_compaction(spark: SparkSession, path: str, limit: int) -> int:
    """Writes after the table's last ``OPTIMIZE`` (its whole history when none), counting at most ``limit``.

    Maintenance's own commits (``OPTIMIZE``, ``VACUUM START`` / ``END``) do not count, so a table nobody
    writes to is not maintained again.  Reads only the newest ``limit`` history entries plus those
    maintenance commits, so the cost stays bounded on long logs.
    """
    history = _table(spark, path).history(limit + 3).select("version", "operation").collect()
    writes = 0
    for entry in history:  # newest first
        if entry.operation == "OPTIMIZE":
            break
        if entry.operation not in _MAINTENANCE_OPERATIONS:
            writes += 1
    return min(writes, limit)


def _checkpoint(spark: SparkSession, path: str) -> None:
    """A checkpoint of the table's latest version, by delta-spark (its ``DeltaLog``; no Python API exists)."""
    jvm = spark._jvm  # noqa: SLF001 -- the session's own gateway
    if jvm is None:
        raise RuntimeError("a Delta checkpoint needs a classic SparkSession (with a JVM)")
    jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).checkpoint()  # noqa: SLF001


def _check_retention(hours: float | None, allow_unsafe: bool) -> None:
    if hours is None:
        return
    check("vacuum_retention_hours", hours, Annotated[float, Meta(ge=0)],
          lambda message: LakeError(message, ErrorCode.INVALID_ARGUMENT))
    if hours < MIN_SAFE_VACUUM_RETENTION_HOURS and not allow_unsafe:
        raise LakeError(f"vacuum_retention_hours={hours} is below the safe minimum of "
                        f"{MIN_SAFE_VACUUM_RETENTION_HOURS} h: readers holding older snapshots and time travel "
                        "would fail; pass allow_unsafe_retention=True only in tests",
                        ErrorCode.INVALID_ARGUMENT)


def _vacuum(spark: SparkSession, path: str, hours: float) -> None:
    table = _table(spark, path)
    if hours >= DEFAULT_VACUUM_RETENTION_HOURS:
        table.vacuum(hours)
        return
    # Shorter than the table's own retention: Delta refuses unless its check is off for the call.
    with _retention_lock:
        spark.conf.set(_RETENTION_CHECK, "false")
        try:
            table.vacuum(hours)
        finally:
            spark.conf.unset(_RETENTION_CHECK)


def maintain(spark: SparkSession, path: str | os.PathLike[str], *, compact: bool = True,
             vacuum_retention_hours: float | None = DEFAULT_VACUUM_RETENTION_HOURS, checkpoint: bool = True,
             allow_unsafe_retention: bool = False) -> dict[str, Any]:
    """``OPTIMIZE``, ``VACUUM`` and checkpoint the Delta table at ``path``; return what was done.

    * ``compact``: ``DeltaTable.optimize().executeCompaction()`` rewrites small files into few large ones;
    * vacuum: ``DeltaTable.vacuum(vacuum_retention_hours)`` deletes files removed from the table more than
      that long ago (None: no vacuum).  Below :data:`MIN_SAFE_VACUUM_RETENTION_HOURS` it refuses unless
      ``allow_unsafe_retention`` (tests only);
    * ``checkpoint``: a checkpoint of the latest version.

    Appends may run concurrently.  The result has ``version_before``/``version_after``,
    ``files_before``/``files_after``, ``compacted`` (files removed and added by OPTIMIZE, or None),
    ``vacuumed`` (whether VACUUM ran) and ``checkpoint_version`` -- None for skipped steps.

    >>> maintain(spark, "/data/lake/consume_queue")["files_after"]          # doctest: +SKIP
    1
    """
    _check_retention(vacuum_retention_hours, allow_unsafe_retention)
    path = os.fspath(path)
    version, files = _version_and_files(spark, path)
    result: dict[str, Any] = {"path": path, "version_before": version, "files_before": files,
                              "compacted": None, "vacuumed": None, "checkpoint_version": None}
    if compact:
        metrics = _table(spark, path).optimize().executeCompaction().first().metrics
        result["compacted"] = {"removed": int(metrics.numFilesRemoved), "added": int(metrics.numFilesAdded)}
    if vacuum_retention_hours is not None:
        _vacuum(spark, path, vacuum_retention_hours)
        result["vacuumed"] = True
    if checkpoint:
        _checkpoint(spark, path)
        result["checkpoint_version"] = _version_and_files(spark, path)[0]
    result["version_after"], result["files_after"] = _version_and_files(spark, path)
    return result


def run_maintenance(spark: SparkSession, lake_root: str | os.PathLike[str], tables: Iterable[str] | None = None, *,
                    vacuum_retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
                    min_commits_between: int = DEFAULT_MIN_COMMITS_BETWEEN,
                    allow_unsafe_retention: bool = False) -> dict[str, Any]:
    """:func:`maintain` each of ``tables`` (default: every lake table) that changed enough.

    A table is maintained when it has at least ``min_commits_between`` commits since its last
    compaction; a missing table is left alone.  Returns, per table, the :func:`maintain` result, or
    ``{"skipped": reason}``, or ``{"error": text}`` (one table failing does not stop the others).

    >>> run_maintenance(spark, "/data/lake")["messages"]["files_after"]          # doctest: +SKIP
    1
    """
    check_int("min_commits_between", min_commits_between, 1, error=ValueError)
    _check_retention(vacuum_retention_hours, allow_unsafe_retention)
    names = list(lake_tables.TABLES if tables is None else tables)
    out: dict[str, Any] = {}
    for name in names:
        path = lake_tables.table_path(lake_root, name)
        if not lake_tables.is_table(spark, path):
            out[name] = {"skipped": "no table"}
            continue
        try:
            pending = commits_since_compaction(spark, path, min_commits_between)
            if pending < min_commits_between:
                out[name] = {"skipped": f"{pending} commits since the last compaction (< {min_commits_between})"}
                continue
            started = time.monotonic()
            result = maintain(spark, path, compact=name not in _SELF_COMPACTING,
                              vacuum_retention_hours=vacuum_retention_hours,
                              allow_unsafe_retention=allow_unsafe_retention)
            result["seconds"] = round(time.monotonic() - started, 3)
            out[name] = result
            log.info("maintained %s: %d -> %d files, version %d -> %d, %.1f s", name, result["files_before"],
                     result["files_after"], result["version_before"], result["version_after"], result["seconds"])
        except Exception as exc:  # one table's failure must not stop the others
            log.warning("maintenance of %s failed: %s", name, exc)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


class Maintainer:
    """:func:`run_maintenance` every ``interval_s`` on a daemon thread; thread-safe status.

    The first run happens ``first_delay_s`` after :meth:`start` (default: one interval), so a
    starting service does not compete with its jobs' catch-up.
    """

    def __init__(self, spark: SparkSession, lake_root: str | os.PathLike[str], *,
                 interval_s: float = DEFAULT_INTERVAL_S, tables: Iterable[str] | None = None,
                 vacuum_retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
                 min_commits_between: int = DEFAULT_MIN_COMMITS_BETWEEN, first_delay_s: float | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        _check_retention(vacuum_retention_hours, False)
        self.spark = spark
        self.lake_root = os.fspath(lake_root)
        self.interval_s = float(interval_s)
        self.first_delay_s = self.interval_s if first_delay_s is None else float(first_delay_s)
        self.tables = None if tables is None else list(tables)
        self.vacuum_retention_hours = vacuum_retention_hours
        self.min_commits_between = min_commits_between
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._runs = 0
        self._last_run: float | None = None
        self._last_result: dict[str, Any] = {}
        self._last_error: str | None = None

    def run_once(self) -> dict[str, Any]:
        """One maintenance pass now (also what the thread runs); its result."""
        try:
            result = run_maintenance(self.spark, self.lake_root, self.tables,
                                     vacuum_retention_hours=self.vacuum_retention_hours,
                                     min_commits_between=self.min_commits_between)
        except Exception as exc:
            with self._lock:
                self._last_error = f"{type(exc).__name__}: {exc}"
            raise
        errors = [f"{t}: {r['error']}" for t, r in result.items() if "error" in r]
        with self._lock:
            self._runs += 1
            self._last_run = time.time()
            self._last_result = result
            self._last_error = "; ".join(errors) or None
        return result

    def _loop(self) -> None:
        delay = self.first_delay_s
        while not self._stop.wait(delay):
            try:
                self.run_once()
            except Exception:
                log.exception("table maintenance failed")
            delay = self.interval_s

    def start(self) -> Maintainer:
        """Start the thread (idempotent); returns self."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._loop, name="sparkmq-lake-maintenance", daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the thread; a pass under way finishes first (up to ``timeout_s``)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def status(self) -> dict[str, Any]:
        """``{"state", "runs", "last_run", "last_error", "tables"}`` for /health and the CLI."""
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            return {"state": "running" if alive else "stopped", "runs": self._runs, "last_run": self._last_run,
                    "last_error": self._last_error, "interval_s": self.interval_s,
                    "tables": {t: {k: r.get(k) for k in ("files_before", "files_after", "version_after", "skipped",
                                                          "error") if k in r}
                               for t, r in self._last_result.items()}}

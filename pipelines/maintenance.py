"""Table maintenance: keep the lake's Delta tables fast after days of one-commit-per-batch writes.

Every streaming job commits once per micro-batch, so a table gathers one small Parquet file
and one JSON log entry per trigger (86,400 a day at 1 s).  Readers list every file and replay
the log since the last checkpoint, so both must be bounded.  :func:`run_maintenance` does, for
each table that had at least ``min_commits_between`` commits since it was last compacted:

* **compaction** -- small files rewritten into few large ones (same rows; an ``OPTIMIZE`` commit);
* **vacuum** -- files removed from the table more than ``vacuum_retention_hours`` ago are
  deleted (default 7 days; below ``delta_io.MIN_SAFE_VACUUM_RETENTION_HOURS`` it refuses: readers
  holding an older file list, and time travel inside the retention, must keep working);
* **checkpoint** -- of the latest version, so readers replay few log entries.

:class:`Maintainer` runs it periodically on a thread (the lake service: hourly)::

    maintainer = Maintainer("/data/lake", interval_s=3600).start()
    maintainer.status()          # last run, per-table results, last error
    maintainer.stop()

Appends from the jobs may run concurrently (compaction only removes files it rewrote).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from . import tables as lake_tables
from .delta_io import DEFAULT_VACUUM_RETENTION_HOURS, maintain

__all__ = ["DEFAULT_INTERVAL_S", "Maintainer", "commits_since_compaction", "run_maintenance"]

log = logging.getLogger(__name__)

#: How often the lake service maintains its tables.
DEFAULT_INTERVAL_S = 3600.0
DEFAULT_MIN_COMMITS_BETWEEN = 50


def commits_since_compaction(table: DeltaTable, limit: int) -> int:
    """Commits after the table's last ``OPTIMIZE`` (its whole history when none), counting at most ``limit``.

    Reads only the newest ``limit`` history entries, so the cost stays bounded on long logs.
    """
    version = table.version()
    for entry in table.history(limit):
        if entry.get("operation") == "OPTIMIZE":
            return version - int(entry.get("version", version))
    return min(version + 1, limit)


def run_maintenance(lake_root: str | os.PathLike[str], tables: Iterable[str] | None = None, *,
                    vacuum_retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
                    min_commits_between: int = DEFAULT_MIN_COMMITS_BETWEEN) -> dict[str, Any]:
    """Compact, vacuum and checkpoint each of ``tables`` (default: every lake table) that changed enough.

    A table is maintained when it has at least ``min_commits_between`` commits since its
    last compaction; a missing table is left alone.  Returns, per table, the
    ``delta_io.maintain`` result, or ``{"skipped": reason}``, or ``{"error": text}`` (one
    table failing does not stop the others).

    >>> run_maintenance("/data/lake")["messages"]["files_after"]          # doctest: +SKIP
    1
    """
    if isinstance(min_commits_between, bool) or not isinstance(min_commits_between, int) or min_commits_between < 1:
        raise ValueError(f"min_commits_between must be an integer >= 1, got {min_commits_between!r}")
    names = list(lake_tables.TABLES if tables is None else tables)
    out: dict[str, Any] = {}
    for name in names:
        path = lake_tables.table_path(lake_root, name)
        try:
            table = DeltaTable(path)
        except TableNotFoundError:
            out[name] = {"skipped": "no table"}
            continue
        try:
            pending = commits_since_compaction(table, min_commits_between)
            if pending < min_commits_between:
                out[name] = {"skipped": f"{pending} commits since the last compaction (< {min_commits_between})"}
                continue
            started = time.monotonic()
            result = maintain(path, vacuum_retention_hours=vacuum_retention_hours)
            result["seconds"] = round(time.monotonic() - started, 3)
            out[name] = result
            log.info("maintained %s: %d -> %d files, version %d -> %d, %d vacuumed, %.1f s", name,
                     result["files_before"], result["files_after"], result["version_before"],
                     result["version_after"], result["vacuumed"] or 0, result["seconds"])
        except Exception as exc:  # one table's failure must not stop the others
            log.warning("maintenance of %s failed: %s", name, exc)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


class Maintainer:
    """:func:`run_maintenance` every ``interval_s`` on a daemon thread; thread-safe status.

    The first run happens ``first_delay_s`` after :meth:`start` (default: one interval), so a
    starting service does not compete with its jobs' catch-up.
    """

    def __init__(self, lake_root: str | os.PathLike[str], *, interval_s: float = DEFAULT_INTERVAL_S,
                 tables: Iterable[str] | None = None,
                 vacuum_retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
                 min_commits_between: int = DEFAULT_MIN_COMMITS_BETWEEN, first_delay_s: float | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
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
            result = run_maintenance(self.lake_root, self.tables, vacuum_retention_hours=self.vacuum_retention_hours,
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

"""Keeps a broker's (or ``sparkmq lake``'s) streaming jobs running.

Each job is a name and a function that starts a Structured Streaming query.  The
supervisor starts every job, watches the queries from one thread, and restarts a
query that failed after an exponential backoff (1 s, 2 s, 4 s … capped), so a
transient failure (a broker restarting, a Delta commit conflict) heals without a
person.  Its :meth:`Supervisor.status` — state, last batch, rows, lag, restarts, last
error — is what ``/health``, ``/metrics`` and ``sparkmq admin lake status`` show.

Delivery never waits for any of this: the jobs only derive tables from what the brokers stored.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkmq.platform.common.backoff import Backoff

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["JobSpec", "JobStatus", "Supervisor"]

log = logging.getLogger("sparkmq.lake")


@dataclass(frozen=True)
class JobSpec:
    """A streaming job: ``start()`` returns a running query (it owns its checkpoint and sink)."""

    name: str
    start: Callable[[], StreamingQuery]
    #: Extra figures for the status (e.g. the dispatch job's store-to-table lag), from the live query.
    describe: Callable[[StreamingQuery], Mapping[str, Any]] | None = None


@dataclass
class JobStatus:
    """What a job is doing, as reported by :meth:`Supervisor.status`."""

    name: str
    state: str = "starting"  # starting | running | restarting | failed-waiting | stopped
    restarts: int = 0
    last_batch_id: int | None = None
    last_batch_rows: int | None = None
    last_progress_ts: str | None = None
    last_error: str | None = None
    next_restart_in_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"name": self.name, "state": self.state, "restarts": self.restarts,
                "last_batch_id": self.last_batch_id, "last_batch_rows": self.last_batch_rows,
                "last_progress_ts": self.last_progress_ts, "last_error": self.last_error,
                "next_restart_in_s": self.next_restart_in_s, **self.extra}


class Supervisor:
    """Start, watch, restart with backoff, and stop a set of streaming jobs."""

    def __init__(self, jobs: list[JobSpec], *, poll_interval_s: float = 1.0, backoff_initial_s: float = 1.0,
                 backoff_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        names = [j.name for j in jobs]
        if len(set(names)) != len(names):
            raise ValueError(f"job names must be unique, got {names}")
        self.jobs = {j.name: j for j in jobs}
        self._poll_interval_s = poll_interval_s
        #: The pause before restart n of a job (n = its restarts so far; never reset).
        self._backoff = Backoff(initial_s=backoff_initial_s, max_s=backoff_max_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._queries: dict[str, StreamingQuery | None] = {name: None for name in self.jobs}
        self._status = {name: JobStatus(name) for name in self.jobs}
        self._retry_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> Supervisor:
        """Start every job now and the watch thread."""
        for name in self.jobs:
            self._start_job(name)
        self._thread = threading.Thread(target=self._watch, name="sparkmq-lake-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the watch thread, then every query (each finishes its batch in flight)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for name, query in list(self._queries.items()):
            if query is not None:
                try:
                    query.stop()
                except Exception as exc:  # a query that died while stopping is stopped all the same
                    log.warning("stopping lake job %s: %s", name, exc)
            with self._lock:
                self._status[name].state = "stopped"
                self._queries[name] = None

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- status -----------------------------------------------------------------------
    def status(self) -> dict[str, dict[str, Any]]:
        """Every job's :class:`JobStatus` as JSON, by name (fresh figures from the live queries)."""
        for name in self.jobs:
            self._refresh(name)
        with self._lock:
            return {name: s.to_dict() for name, s in self._status.items()}

    def healthy(self) -> bool:
        """Whether every job is running."""
        return all(s["state"] == "running" for s in self.status().values())

    def query(self, name: str) -> StreamingQuery | None:
        """The live query of job ``name`` (None while it is restarting)."""
        return self._queries.get(name)

    # -- internals --------------------------------------------------------------------
    def _start_job(self, name: str) -> None:
        spec = self.jobs[name]
        try:
            query = spec.start()
        except Exception as exc:
            self._failed(name, exc)
            return
        with self._lock:
            self._queries[name] = query
            status = self._status[name]
            status.state = "running"
            status.next_restart_in_s = None
            self._retry_at.pop(name, None)
        log.info("lake job %s running (query %s)", name, query.id)

    def _failed(self, name: str, exc: BaseException | str) -> None:
        with self._lock:
            status = self._status[name]
            status.last_error = str(exc)[:2000]
            backoff = self._backoff.delay_s(status.restarts)
            status.restarts += 1
            status.state = "failed-waiting"
            status.next_restart_in_s = backoff
            self._retry_at[name] = self._clock() + backoff
            self._queries[name] = None
        log.warning("lake job %s failed (restart %d in %.1f s): %s", name, status.restarts, backoff,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def _refresh(self, name: str) -> None:
        query = self._queries.get(name)
        if query is None:
            return
        progress = query.lastProgress
        extra: dict[str, Any] = {}
        describe = self.jobs[name].describe
        if describe is not None:
            try:
                extra = dict(describe(query))
            except Exception as exc:  # a status figure must never take the job down
                extra = {"describe_error": str(exc)}
        with self._lock:
            status = self._status[name]
            if progress:
                status.last_batch_id = progress.get("batchId")
                status.last_batch_rows = progress.get("numInputRows")
                status.last_progress_ts = progress.get("timestamp")
            status.extra = extra

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_interval_s):
            for name in self.jobs:
                query = self._queries.get(name)
                if query is not None:
                    if not query.isActive:
                        error = query.exception()
                        self._failed(name, error if error is not None else "the query stopped")
                    continue
                with self._lock:
                    due = self._retry_at.get(name)
                    if due is not None:
                        self._status[name].next_restart_in_s = max(0.0, due - self._clock())
                if due is not None and self._clock() >= due:
                    with self._lock:
                        self._status[name].state = "restarting"
                    self._start_job(name)

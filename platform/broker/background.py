"""The thread behind the broker's periodic services (delay levels, timers, transaction checks)."""
from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod

from ..common.errors import ErrorCode
from ..common.failure_log import FailureLog

__all__ = ["PeriodicService", "RETRY_LATER_CODES", "RETRY_LATER_MS"]

log = logging.getLogger("sparkmq.broker")

#: A due message whose re-put is refused with one of these is tried again later, never skipped: the store
#: refuses writes while its disk is past the warning ratio, or the broker is stopping.
RETRY_LATER_CODES = frozenset({ErrorCode.DISK_FULL, ErrorCode.SERVICE_NOT_AVAILABLE})
#: How long a service waits before trying such a re-put again.
RETRY_LATER_MS = 1000


class PeriodicService(ABC):
    """Calls :meth:`tick` in a daemon thread, sleeping until the next due work, and persists regularly.

    Subclasses implement :meth:`tick` (do what is due; answer the milliseconds until the
    next known due work, or -1) and :meth:`persist`.  :meth:`wake` cuts a sleep short
    (new work arrived); :meth:`stop` joins the thread and persists one last time.
    """

    thread_name = "sparkmq-service"

    def __init__(self, persist_interval_s: float, max_idle_wait_s: float) -> None:
        self._persist_interval_s = persist_interval_s
        self._max_idle_wait_s = max_idle_wait_s
        self._wake_event = threading.Event()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        # A pass that fails keeps failing on its next rounds (a full disk): logged quietly.
        self._pass_failures = FailureLog(log, f"{self.thread_name} pass")
        self._persist_failures = FailureLog(log, f"{self.thread_name} persisting its progress")

    @abstractmethod
    def tick(self) -> int:
        """Do the work that is due; return ms until the next due work (-1 = none known)."""

    @abstractmethod
    def persist(self) -> None:
        """Write progress durably."""

    def needed_offsets(self) -> list[tuple[str, int, int]]:
        """(topic, queue_id, queue offset) of each queue this service still has to read from that offset on:
        early deletion under disk pressure keeps them (the store's retention floor).  None by default."""
        return []

    def wake(self) -> None:
        """Run the next tick now."""
        self._wake_event.set()

    def start(self) -> PeriodicService:
        """Start the thread; returns self."""
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and persist progress."""
        self._stop_event.set()
        self._wake_event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pass_failures.flush()
        self._persist_failures.flush()
        self.persist()

    def _run(self) -> None:
        last_persist = time.monotonic()
        while not self._stop_event.is_set():
            try:
                wait_ms = self.tick()
            except Exception as exc:  # keep going: one bad pass must not strand every pending message
                self._pass_failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
                wait_ms = 1000
            else:
                self._pass_failures.success()
            if time.monotonic() - last_persist >= self._persist_interval_s:
                try:
                    self.persist()
                except OSError as exc:
                    self._persist_failures.failure("%s", exc, exc_info=True)
                else:
                    self._persist_failures.success()
                last_persist = time.monotonic()
            timeout = self._max_idle_wait_s if wait_ms < 0 else min(wait_ms / 1000, self._max_idle_wait_s)
            self._wake_event.wait(timeout)
            self._wake_event.clear()

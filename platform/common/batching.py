"""A bounded buffer that many threads fill and one daemon thread drains in batches.

The shape behind the broker's trace recorder and the clients' trace dispatcher: the hot path
only appends (and is refused, never blocked, when the buffer is full); the drain thread hands
everything buffered to ``deliver`` every ``interval_s`` or as soon as ``batch_size`` units wait.
``stop`` joins the thread and delivers what is left.

Example::

    buffer = BatchBuffer("trace", lambda items: len(items), interval_s=0.2, batch_size=256, max_buffered=65_536)
    buffer.start()
    buffer.offer(event)          # False (and counted in ``dropped``) when full
    buffer.stop()
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from .failure_log import FailureLog

__all__ = ["BatchBuffer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class BatchBuffer(Generic[T]):
    """Items offered by any thread, delivered in batches by one daemon thread.  Thread-safe.

    ``deliver(items)`` gets the items in offer order and returns a count (what it delivered);
    one delivery runs at a time, so batches never overtake each other.  Sizes are in *units*:
    an item may stand for several (e.g. a batch of events built later).
    """

    def __init__(self, name: str, deliver: Callable[[list[T]], int], *, interval_s: float, batch_size: int,
                 max_buffered: int) -> None:
        if interval_s <= 0 or batch_size < 1 or max_buffered < 1:
            raise ValueError("interval_s must be > 0, batch_size and max_buffered >= 1")
        self.name = name
        self._deliver = deliver
        self.interval_s = interval_s
        self.batch_size = batch_size
        self.max_buffered = max_buffered
        self._items: list[T] = []
        self._units = 0
        self._cond = threading.Condition()
        self._deliver_lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: units accepted / refused because the buffer was full
        self.offered = self.dropped = 0
        self._failures = FailureLog(log, f"{name}: delivering a batch")

    @property
    def buffered(self) -> int:
        """Units waiting for the next delivery."""
        with self._cond:
            return self._units

    def offer(self, item: T, units: int = 1) -> bool:
        """Buffer ``item`` (worth ``units``); False, counted in ``dropped``, when it would overflow the buffer."""
        with self._cond:
            if self._units + units > self.max_buffered:
                self.dropped += units
                return False
            self._items.append(item)
            self._units += units
            self.offered += units
            if self._units >= self.batch_size:
                self._cond.notify()
        return True

    def start(self) -> None:
        """Start the drain thread (idempotent)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the drain thread, then deliver what is buffered."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.flush()

    def flush(self) -> int:
        """Deliver everything buffered now; what ``deliver`` returned (0 when nothing waited)."""
        with self._deliver_lock:
            with self._cond:
                items, self._items, self._units = self._items, [], 0
            return self._deliver(items) if items else 0

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and self._units < self.batch_size:
                    self._cond.wait(self.interval_s)
                if self._stopping:
                    return
            try:
                self.flush()
            except Exception as exc:  # keep the thread alive: the next round delivers again
                self._failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
            else:
                self._failures.success()

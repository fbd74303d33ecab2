"""Client-side message trace: producers record ``send``, push consumers ``consume`` events.

Events are buffered per broker address and posted in batches (``POST /trace``) by one daemon
thread every ``flush_interval_s`` (200 ms) or as soon as ``batch_size`` (256) wait, so tracing
adds no request to a send or a listener call.  The buffer is bounded: when it is full, or a
broker cannot be reached, events are dropped and counted -- tracing never slows or fails
messaging.  Off with ``ClientConfig(trace_enabled=False)``.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict

from ..common.errors import SparkMQError
from ..common.trace import TraceEvent
from .remoting import BrokerClientPool

__all__ = ["TraceDispatcher"]

log = logging.getLogger("sparkmq.client.trace")


_FIELDS = tuple(TraceEvent.__dataclass_fields__)


def _as_dict(event: TraceEvent) -> dict[str, object]:
    # TraceEvent.to_dict's result without dataclasses.asdict's deep copy (~10x cheaper per event).
    return {name: value for name in _FIELDS if (value := getattr(event, name)) is not None}


class TraceDispatcher:
    """Buffers trace events and posts them to brokers in batches.  Thread-safe."""

    def __init__(self, brokers: BrokerClientPool, name: str, *, flush_interval_s: float = 0.2,
                 batch_size: int = 256, max_buffered: int = 16_384) -> None:
        self._brokers = brokers
        self.name = name
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.max_buffered = max_buffered
        self._pending: dict[str, list[TraceEvent]] = defaultdict(list)
        self._count = 0
        self._cond = threading.Condition()
        self._flush_lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.recorded = self.dropped = self.posted = 0

    def start(self) -> None:
        """Start the posting thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"sparkmq-trace-{self.name}", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Post what is buffered and stop the thread (call before the broker connections close)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.flush()

    def record(self, addr: str | None, event: TraceEvent) -> None:
        """Buffer ``event`` for the broker at ``addr`` (dropped when ``addr`` is None or the buffer is full)."""
        with self._cond:
            if addr is None or self._count >= self.max_buffered:
                self.dropped += 1
                return
            self._pending[addr].append(event)
            self._count += 1
            self.recorded += 1
            if self._count >= self.batch_size:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and self._count < self.batch_size:
                    self._cond.wait(self.flush_interval_s)
                if self._stopping:
                    return
            try:
                self.flush()
            except Exception:  # keep the thread alive; the next round posts again
                log.exception("posting trace events failed")

    def flush(self) -> int:
        """Post every buffered event now; returns how many brokers accepted."""
        with self._flush_lock:
            with self._cond:
                pending, self._pending = self._pending, defaultdict(list)
                self._count = 0
            posted = 0
            for addr, events in pending.items():
                try:
                    answer = self._brokers.get(addr).post_trace([_as_dict(e) for e in events])
                except SparkMQError as exc:
                    self.dropped += len(events)
                    log.debug("posting %d trace events to %s failed: %s", len(events), addr, exc)
                    continue
                posted += int(answer.get("accepted", 0))
            self.posted += posted
            return posted

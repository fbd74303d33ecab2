"""Client-side message trace: producers record ``send``, push consumers ``consume`` events.

Events are buffered per broker address and posted in batches (``POST /trace``) by one daemon
thread every ``flush_interval_s`` (200 ms) or as soon as ``batch_size`` (256) wait, so tracing
adds no request to a send or a listener call.  The buffer is bounded: when it is full, or a
broker cannot be reached, events are dropped and counted -- tracing never slows or fails
messaging.  Off with ``ClientConfig(trace_enabled=False)``.
"""
from __future__ import annotations

import logging
from collections import defaultdict

from ..common.batching import BatchBuffer
from ..common.errors import SparkMQError
from ..common.trace import TraceEvent
from .remoting import BrokerClientPool

__all__ = ["TraceDispatcher"]

log = logging.getLogger("sparkmq.client.trace")


class TraceDispatcher:
    """Buffers trace events and posts them to brokers in batches.  Thread-safe."""

    def __init__(self, brokers: BrokerClientPool, name: str, *, flush_interval_s: float = 0.2,
                 batch_size: int = 256, max_buffered: int = 16_384) -> None:
        self._brokers = brokers
        self.name = name
        self._buffer: BatchBuffer[tuple[str, TraceEvent]] = BatchBuffer(
            f"sparkmq-trace-{name}", self._post, interval_s=flush_interval_s, batch_size=batch_size,
            max_buffered=max_buffered)
        self._unaddressed = self._failed = 0
        self.posted = 0

    @property
    def recorded(self) -> int:
        """Events accepted into the buffer."""
        return self._buffer.offered

    @property
    def dropped(self) -> int:
        """Events lost: no broker address, the buffer full, or the broker not taking them."""
        return self._buffer.dropped + self._unaddressed + self._failed

    def start(self) -> None:
        """Start the posting thread (idempotent)."""
        self._buffer.start()

    def shutdown(self) -> None:
        """Post what is buffered and stop the thread (call before the broker connections close)."""
        self._buffer.stop()

    def record(self, addr: str | None, event: TraceEvent) -> None:
        """Buffer ``event`` for the broker at ``addr`` (dropped when ``addr`` is None or the buffer is full)."""
        if addr is None:
            self._unaddressed += 1
            return
        self._buffer.offer((addr, event))

    def flush(self) -> int:
        """Post every buffered event now; returns how many brokers accepted."""
        return self._buffer.flush()

    def _post(self, items: list[tuple[str, TraceEvent]]) -> int:
        by_broker: dict[str, list[TraceEvent]] = defaultdict(list)
        for addr, event in items:
            by_broker[addr].append(event)
        posted = 0
        for addr, events in by_broker.items():
            try:
                answer = self._brokers.get(addr).post_trace([e.to_dict() for e in events])
            except SparkMQError as exc:
                self._failed += len(events)
                log.debug("posting %d trace events to %s failed: %s", len(events), addr, exc)
                continue
            posted += int(answer.get("accepted", 0))
        self.posted += posted
        return posted

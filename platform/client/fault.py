"""Latency fault tolerance: producers avoid slow or failing brokers for a while (RocketMQ's ``MQFaultStrategy``).

After every send the producer reports the broker name and the latency.  The latency's
class gives a time the broker counts as *not available*:

=================  ====  =====  ======  ======  =======  =======  ========
latency >= (ms)    50    100    550     1000    2000     3000     15000
not available (ms) 0     0      30000   60000   120000   180000   600000
=================  ====  =====  ======  ======  =======  =======  ========

A failed send counts as a latency of 30000 ms (the *isolation* class: 10 minutes).  Like
RocketMQ 5's detector, a broker isolated because it could not be reached is marked
unreachable and may be probed (:meth:`LatencyFaultTolerance.unreachable_brokers`); a
successful probe lifts the isolation early, so a restarted broker gets traffic again.

:class:`QueueSelector` picks the next write queue round-robin, skipping brokers that are
not available (and the broker the previous attempt failed on), and falls back to any
queue when every broker is marked, because trying is better than not sending at all.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .allocation import MessageQueue

__all__ = [
    "LATENCY_MAX_MS",
    "NOT_AVAILABLE_DURATION_MS",
    "ISOLATION_LATENCY_MS",
    "not_available_duration_ms",
    "FaultItem",
    "LatencyFaultTolerance",
    "QueueSelector",
]

#: Latency class bounds (RocketMQ ``latencyMax``).
LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
#: Not-available time of each class (RocketMQ ``notAvailableDuration``).
NOT_AVAILABLE_DURATION_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
#: The latency a failed send is reported as.
ISOLATION_LATENCY_MS = 30000


def not_available_duration_ms(latency_ms: float) -> int:
    """How long a broker answering in ``latency_ms`` counts as not available.

    Example::

        >>> [not_available_duration_ms(x) for x in (10, 99, 550, 2500, 30000)]
        [0, 0, 30000, 120000, 600000]
    """
    for bound, duration in zip(reversed(LATENCY_MAX_MS), reversed(NOT_AVAILABLE_DURATION_MS), strict=True):
        if latency_ms >= bound:
            return duration
    return 0


@dataclass(slots=True)
class FaultItem:
    """What is known about one broker name: last latency and when it becomes available again."""

    broker_name: str
    latency_ms: float
    available_at: float
    reachable: bool = True

    def is_available(self, now: float) -> bool:
        """Whether the not-available time has passed."""
        return now >= self.available_at


class LatencyFaultTolerance:
    """Per broker name, when it may be used again; thread-safe.

    ``clock`` returns seconds (``time.monotonic`` by default) so tests can move time.

    Example::

        >>> now = [0.0]
        >>> ft = LatencyFaultTolerance(clock=lambda: now[0])
        >>> ft.update("a", 600)          # the 550 ms class: 30 s
        >>> ft.is_available("a"), ft.is_available("b")
        (False, True)
        >>> now[0] = 30.0
        >>> ft.is_available("a")
        True
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._items: dict[str, FaultItem] = {}
        self._lock = threading.Lock()

    def update(self, broker_name: str, latency_ms: float, *, isolation: bool = False, reachable: bool = True) -> None:
        """Record a send to ``broker_name`` that took ``latency_ms`` (or failed, with ``isolation``)."""
        latency = ISOLATION_LATENCY_MS if isolation else latency_ms
        duration_s = not_available_duration_ms(latency) / 1000
        with self._lock:
            self._items[broker_name] = FaultItem(broker_name, latency, self._clock() + duration_s, reachable)

    def is_available(self, broker_name: str) -> bool:
        """Whether ``broker_name`` may be used now (brokers never reported are available)."""
        with self._lock:
            item = self._items.get(broker_name)
            return item is None or item.is_available(self._clock())

    def remove(self, broker_name: str) -> None:
        """Forget ``broker_name`` (it is available again)."""
        with self._lock:
            self._items.pop(broker_name, None)

    def unreachable_brokers(self) -> list[str]:
        """Broker names isolated because they could not be reached and still not available (to probe)."""
        now = self._clock()
        with self._lock:
            return sorted(n for n, i in self._items.items() if not i.reachable and not i.is_available(now))

    def items(self) -> list[FaultItem]:
        """A snapshot of every item, by broker name."""
        with self._lock:
            return [FaultItem(i.broker_name, i.latency_ms, i.available_at, i.reachable)
                    for _, i in sorted(self._items.items())]


class QueueSelector:
    """Round-robin over write queues that skips unavailable brokers and the last failed one.

    Example::

        >>> qs = [MessageQueue("t", b, i) for b in ("a", "b") for i in range(2)]
        >>> ft = LatencyFaultTolerance()
        >>> ft.update("a", 0, isolation=True)
        >>> sel = QueueSelector(ft)
        >>> {sel.select(qs).broker_name for _ in range(4)}
        {'b'}
    """

    def __init__(self, fault: LatencyFaultTolerance | None, start: int = 0) -> None:
        self._fault = fault
        self._counter = itertools.count(start)
        self._lock = threading.Lock()

    def _next(self) -> int:
        with self._lock:
            return next(self._counter)

    def select(self, queues: Sequence[MessageQueue], last_broker: str | None = None) -> MessageQueue:
        """The next queue to send to; ``last_broker`` is the broker the previous attempt of this send failed on.

        Preference: an available broker other than ``last_broker``; then any broker other than
        ``last_broker``; then any queue.  Raises ``ValueError`` for an empty list.
        """
        if not queues:
            raise ValueError("no queue to select from")
        start = self._next()
        n = len(queues)
        order = [queues[(start + i) % n] for i in range(n)]
        if self._fault is not None:
            for mq in order:
                if mq.broker_name != last_broker and self._fault.is_available(mq.broker_name):
                    return mq
        for mq in order:
            if mq.broker_name != last_broker:
                return mq
        return order[0]

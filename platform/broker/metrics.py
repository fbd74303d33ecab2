"""The broker's Prometheus metrics, in a registry of its own (several brokers may share a process).

Counted on the hot path: messages and bytes sent per topic, pulled per (topic, group),
send/pull latency histograms, send errors per code; and :class:`BrokerStats`, the broker-wide totals and rates
RocketMQ's tools read (``mqadmin clusterList`` / ``brokerStatus``: GET_BROKER_RUNTIME_INFO).  Computed at scrape
time by a
custom collector (no work between scrapes): the commit log's max offset, every
queue's max offset and every group's lag per topic.
"""
from __future__ import annotations

import datetime as _dt
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BrokerMetrics", "BrokerStats", "CONTENT_TYPE", "TPS_WINDOWS_S"]

#: The media type of :meth:`BrokerMetrics.render`.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Latency buckets in seconds: sub-millisecond sends up to multi-second SYNC_FLUSH waits.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _ComponentCollector(Collector):
    """Gauges of a component (e.g. the lake's jobs), read when Prometheus scrapes."""

    def __init__(self, prefix: str, rows: Callable[[], Iterable[tuple[str, Mapping[str, float | None]]]]) -> None:
        self._prefix = prefix
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        """One gauge family per figure, one sample per named row."""
        families: dict[str, GaugeMetricFamily] = {}
        try:
            rows = list(self._rows())
        except Exception:  # a broken component must not break the scrape
            return iter(())
        for name, figures in rows:
            for figure, value in figures.items():
                if value is None:
                    continue
                family = families.get(figure)
                if family is None:
                    family = families[figure] = GaugeMetricFamily(
                        f"sparkmq_{self._prefix}_{figure}", f"{self._prefix} {figure.replace('_', ' ')}",
                        labels=["name"])
                family.add_metric([name], float(value))
        return iter(families.values())


class _ScrapeCollector(Collector):
    """Gauges read from the store and offsets when Prometheus scrapes."""

    def __init__(self, commitlog_max: Callable[[], int], queue_max: Callable[[], Iterable[tuple[str, int, int]]],
                 group_lag: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self._commitlog_max = commitlog_max
        self._queue_max = queue_max
        self._group_lag = group_lag

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("sparkmq_commitlog_max_offset", "Commit-log offset the next record is written at"),
                GaugeMetricFamily("sparkmq_queue_max_offset", "Queue offset the next message of a queue gets",
                                  labels=["topic", "queue_id"]),
                GaugeMetricFamily("sparkmq_group_lag", "Messages a consumer group has yet to consume, per topic",
                                  labels=["group", "topic"]))

    def describe(self) -> Iterator[Metric]:
        """The metric names (so the registry can refuse duplicates) without reading anything."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        """Read the gauges now."""
        clog, queues, lag = self._families()
        clog.add_metric([], self._commitlog_max())
        for topic, queue_id, offset in self._queue_max():
            queues.add_metric([topic, str(queue_id)], offset)
        for group, topic, value in self._group_lag():
            lag.add_metric([group, topic], value)
        yield from (clog, queues, lag)


#: The windows of RocketMQ's TPS figures (``putTps`` is "<10 s> <1 min> <10 min>").
TPS_WINDOWS_S = (10, 60, 600)


class BrokerStats:
    """Messages put and got by this broker since it started, their rates, and the totals at the start of today
    and of yesterday (local time): RocketMQ's ``BrokerStats`` / ``StoreStatsService`` figures.

    One counter pair behind a lock, and a per-second history of the totals (the last 10 minutes) for the rates.
    ``clock`` (epoch seconds) is injectable for tests.

    Example::

        >>> stats = BrokerStats(clock=lambda: 1000.0)
        >>> stats.put(5); stats.totals()
        (5, 0)
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._put = 0
        self._got = 0
        #: (second, put total, got total) at the end of each second something was counted or asked in
        self._history: deque[tuple[int, int, int]] = deque(maxlen=max(TPS_WINDOWS_S) + 2)
        self._second = int(clock())
        self._history.append((self._second - 1, 0, 0))  # nothing was counted before the broker started
        self._day = self._day_of(clock())
        self._today_morning = (0, 0)
        self._yesterday_morning = (0, 0)

    @staticmethod
    def _day_of(now: float) -> _dt.date:
        return _dt.datetime.fromtimestamp(now).date()

    def _roll(self, now: float) -> None:
        # Caller holds the lock.  Closes the seconds that passed; a new day moves the morning totals.
        second = int(now)
        if second != self._second:
            self._history.append((self._second, self._put, self._got))
            self._second = second
            day = self._day_of(now)
            if day != self._day:
                self._yesterday_morning = self._today_morning if (day - self._day).days == 1 else (self._put,
                                                                                                   self._got)
                self._today_morning = (self._put, self._got)
                self._day = day

    def put(self, messages: int) -> None:
        """Count messages stored by a send."""
        with self._lock:
            self._roll(self._clock())
            self._put += messages

    def got(self, messages: int) -> None:
        """Count messages answered to pulls."""
        with self._lock:
            self._roll(self._clock())
            self._got += messages

    def totals(self) -> tuple[int, int]:
        """(messages put, messages got) since the broker started."""
        with self._lock:
            return self._put, self._got

    def mornings(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((put, got) at the start of yesterday, (put, got) at the start of today); (0, 0) before the broker ran."""
        with self._lock:
            self._roll(self._clock())
            return self._yesterday_morning, self._today_morning

    def tps(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(put, got) messages per second over each of :data:`TPS_WINDOWS_S`, from the closed seconds."""
        with self._lock:
            now = self._clock()
            self._roll(now)
            history = list(self._history)
            open_second = self._second
        puts: list[float] = []
        gots: list[float] = []
        # the current second is open: rates use the closed ones, whose totals are the last entry's (entries are
        # written only for seconds in which something was counted)
        last_second = open_second - 1
        _, closed_put, closed_got = history[-1]
        for window in TPS_WINDOWS_S:
            # the totals at the end of the second before the window's first one; a broker younger than the
            # window counts from its start (the first entry: nothing counted before it)
            start = last_second - window
            base_second, base_put, base_got = next((h for h in reversed(history) if h[0] <= start), history[0])
            span = max(last_second - base_second, 1)
            puts.append((closed_put - base_put) / span)
            gots.append((closed_got - base_got) / span)
        return tuple(puts), tuple(gots)


class BrokerMetrics:
    """Counters and histograms of one broker, plus scrape-time gauges."""

    def __init__(self, commitlog_max: Callable[[], int] = lambda: 0,
                 queue_max: Callable[[], Iterable[tuple[str, int, int]]] = tuple,
                 group_lag: Callable[[], Iterable[tuple[str, str, int]]] = tuple) -> None:
        """The callables feed the scrape-time gauges (a broker passes its store and offsets)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages_sent = Counter("sparkmq_messages_sent", "Messages stored by sends", ["topic"], registry=r)
        self.bytes_sent = Counter("sparkmq_bytes_sent", "Body bytes stored by sends", ["topic"], registry=r)
        self.messages_pulled = Counter("sparkmq_messages_pulled", "Messages answered to pulls", ["topic", "group"],
                                       registry=r)
        self.bytes_pulled = Counter("sparkmq_bytes_pulled", "Body bytes answered to pulls", ["topic", "group"],
                                    registry=r)
        self.send_errors = Counter("sparkmq_send_errors", "Sends refused, by error code", ["code"], registry=r)
        self.system_busy = Counter("sparkmq_system_busy", "Requests answered SYSTEM_BUSY at once (overload), by "
                                   "reason (platform/broker/overload.py)", ["reason"], registry=r)
        self.send_latency = Histogram("sparkmq_send_latency_seconds", "Time to store a send (one message or a batch)",
                                      buckets=_BUCKETS, registry=r)
        self.pull_latency = Histogram("sparkmq_pull_latency_seconds",
                                      "Time to read a pull from the store (long-polling holds excluded)",
                                      buckets=_BUCKETS, registry=r)
        r.register(_ScrapeCollector(commitlog_max, queue_max, group_lag))
        # Labelled children by label values: ``labels()`` costs more than the increment it serves, on
        # every send and pull.
        self._sent_children: dict[str, tuple[Any, Any]] = {}
        self._pulled_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        #: Broker-wide totals and rates (GET_BROKER_RUNTIME_INFO).
        self.stats = BrokerStats()

    def sent(self, topic: str, messages: int, body_bytes: int, seconds: float) -> None:
        """Count a successful send."""
        children = self._sent_children.get(topic)
        if children is None:
            children = self._sent_children[topic] = (self.messages_sent.labels(topic), self.bytes_sent.labels(topic))
        children[0].inc(messages)
        children[1].inc(body_bytes)
        self.stats.put(messages)
        self.send_latency.observe(seconds)

    def send_failed(self, code: str) -> None:
        """Count a refused send."""
        self.send_errors.labels(code).inc()

    def busy(self, reason: str) -> None:
        """Count a request answered SYSTEM_BUSY for ``reason`` (one of ``overload.BUSY_REASONS``)."""
        self.system_busy.labels(reason).inc()

    def pulled(self, topic: str, group: str | None, messages: int, body_bytes: int, seconds: float) -> None:
        """Count a pull's read (``group`` "" when the puller named none)."""
        if messages:
            key = (topic, group or "")
            children = self._pulled_children.get(key)
            if children is None:
                children = self._pulled_children[key] = (self.messages_pulled.labels(*key),
                                                          self.bytes_pulled.labels(*key))
            children[0].inc(messages)
            children[1].inc(body_bytes)
            self.stats.got(messages)
        self.pull_latency.observe(seconds)

    def add_component_gauges(self, prefix: str,
                             rows: Callable[[], Iterable[tuple[str, Mapping[str, float | None]]]]) -> None:
        """Expose a component's figures at scrape time: ``rows()`` yields (name, {figure: value}) and
        each figure becomes the gauge ``sparkmq_<prefix>_<figure>{name=...}`` (e.g. the lake's jobs)."""
        self.registry.register(_ComponentCollector(prefix, rows))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

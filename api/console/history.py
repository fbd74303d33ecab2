"""The console's live series: samples of admin-API numbers kept in memory, for the charts.

A :class:`Sampler` thread reads, every ``interval_s``, each master's commit-log end (bytes written) and the
offsets of the topics and groups someone looked at in the last :data:`WATCH_S` seconds (a group's lag and
consumed offsets, a topic's stored offsets).  :class:`SeriesStore` keeps the last :data:`KEEP_S` seconds of
each series; rates (TPS) are derived when a chart asks.  Nothing here computes admin state: every number
comes from :class:`~sparkmq.platform.client.admin.AdminClient`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...platform.client.admin import AdminClient
from ...platform.common.errors import SparkMQError

__all__ = ["SeriesStore", "Sampler", "KEEP_S", "WATCH_S"]

log = logging.getLogger("sparkmq.console")

#: How long samples are kept (the longest range the charts offer).
KEEP_S = 3600.0
#: A topic or group is sampled while someone looked at it this recently.
WATCH_S = 600.0


class SeriesStore:
    """Named series of ``(epoch seconds, value)``, each trimmed to the last :data:`KEEP_S` seconds.  Thread-safe."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self._keep_s = keep_s
        self._series: dict[str, deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, value: float, ts: float | None = None) -> None:
        """Append one sample (now unless ``ts`` is given)."""
        ts = time.time() if ts is None else ts
        with self._lock:
            points = self._series.setdefault(name, deque())
            points.append((ts, float(value)))
            while points and points[0][0] < ts - self._keep_s:
                points.popleft()

    def points(self, name: str, range_s: float) -> list[tuple[float, float]]:
        """The samples of the last ``range_s`` seconds, oldest first."""
        since = time.time() - range_s
        with self._lock:
            return [p for p in self._series.get(name, ()) if p[0] >= since]

    def rate(self, name: str, range_s: float) -> list[tuple[float, float]]:
        """Per-second increase of a counter series between samples (a restart's drop counts as 0)."""
        points = self.points(name, range_s)
        return [(t1, max(0.0, (v1 - v0) / (t1 - t0))) for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False)
                if t1 > t0]

    def latest_rate(self, name: str) -> float | None:
        """The newest rate of a counter series, None before two samples."""
        rates = self.rate(name, self._keep_s)
        return rates[-1][1] if rates else None


class Sampler:
    """Samples the cluster into a :class:`SeriesStore` every ``interval_s`` on a daemon thread."""

    def __init__(self, admin: AdminClient, store: SeriesStore, interval_s: float = 2.0) -> None:
        self.admin = admin
        self.store = store
        self.interval_s = interval_s
        self._watched: dict[tuple[str, str], float] = {}  # ("group"|"topic", name) -> last looked at (monotonic)
        # With ACL on, whose client samples what: the last signed-in user who looked (the unsigned one is refused).
        self._admins: dict[tuple[str, str], AdminClient] = {}
        self._broker_admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, kind: str, name: str, admin: AdminClient | None = None) -> None:
        """Keep sampling group or topic ``name`` (``kind`` "group" or "topic") for the next :data:`WATCH_S` s,
        with ``admin`` (a signed-in user's client) instead of the console's own when given."""
        with self._lock:
            first = (kind, name) not in self._watched
            self._watched[(kind, name)] = time.monotonic()
            if admin is not None:
                self._admins[(kind, name)] = admin
        if first:  # the chart gets its first point now, not one interval later
            self._sample_one(kind, name)

    def use_for_brokers(self, admin: AdminClient) -> None:
        """Sample the masters' commit logs with ``admin`` (a signed-in user's client: ACL is on)."""
        self._broker_admin = admin

    def forget(self, admin: AdminClient) -> None:
        """Stop using ``admin`` (its session ended); what it sampled goes back to the console's own client."""
        with self._lock:
            for key in [k for k, a in self._admins.items() if a is admin]:
                del self._admins[key]
            if self._broker_admin is admin:
                self._broker_admin = None

    def _admin_for(self, key: tuple[str, str] | None) -> AdminClient:
        with self._lock:
            found = self._broker_admin if key is None else self._admins.get(key)
        return found or self.admin

    def start(self) -> Sampler:
        """Start the sampling thread."""
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (waits for a sample in progress)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        """One round: every master's commit-log end, then every watched topic and group."""
        self._guard("brokers", self._sample_brokers)
        now = time.monotonic()
        with self._lock:
            for key, seen in list(self._watched.items()):
                if now - seen > WATCH_S:
                    del self._watched[key]
                    self._admins.pop(key, None)
            watched = list(self._watched)
        for kind, name in watched:
            self._sample_one(kind, name)

    def _sample_one(self, kind: str, name: str) -> None:
        if kind == "group":
            self._guard(f"group {name}", lambda: self._sample_group(name))
        else:
            self._guard(f"topic {name}", lambda: self._sample_topic(name))

    def _sample_brokers(self) -> None:
        admin = self._admin_for(None)
        for name, addr in admin.masters().items():
            commitlog = admin.broker_info(addr).get("commitlog") or {}
            if commitlog.get("max_offset") is not None:
                self.store.add(f"broker:{name}:bytes", commitlog["max_offset"])

    def _sample_group(self, group: str) -> None:
        lag = self._admin_for(("group", group)).group_lag(group)
        now = time.time()
        self.store.add(f"group:{group}:lag", lag.total_lag, now)
        self.store.add(f"group:{group}:consumed", sum(q.consumer_offset for q in lag.queues), now)

    def _sample_topic(self, topic: str) -> None:
        stats = self._admin_for(("topic", topic)).topic_stats(topic)
        self.store.add(f"topic:{topic}:stored", sum(q.max_offset for q in stats))

    @staticmethod
    def _guard(what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except SparkMQError as exc:  # a broker away for a moment: the chart shows a gap, sampling goes on
            log.debug("sampling %s failed: %s", what, exc)
        except Exception:
            log.exception("sampling %s failed", what)

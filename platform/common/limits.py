"""Limits that keep one caller from taking a service down, defined once for every listener.

* Connections per source address, on the remoting and HTTP ports: beyond the limit a new connection is
  closed at once (the others from that address, and every other address, are served as before).
* Requests in flight per remoting connection: beyond the limit the server stops reading that connection
  until answers go out (backpressure, not errors: a well-behaved pipelining client only slows down).
* Bytes of remoting requests read and not answered yet, per connection and per server: a request beyond
  either is answered SYSTEM_BUSY at once (the client backs off and retries), so memory stays bounded.
* Idle and slow connections: a remoting connection silent for its idle timeout is closed; an HTTP client
  must finish a request's head within ``http_header_timeout_s`` (a "slowloris" trickling header bytes is
  dropped) and an idle keep-alive connection is closed after ``http_keep_alive_s``.
* Refused connections are logged once per address and interval (:class:`RefusalLog`), never per byte.

Frame and request sizes are limited where they are decoded (``max_frame_bytes``, ``max_request_bytes``).
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from .validation import Positive, Seconds, check_fields

__all__ = ["CLIENT_KEEPALIVE_EXPIRY_S", "ConnectionLimits", "PerAddressCounter", "RefusalLog", "client_pool_limits"]


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-listener limits (ValueError naming the bad value at construction).

    Example::

        >>> ConnectionLimits().max_connections_per_ip
        1000
    """

    #: Open connections one source IP may hold on one port (remoting, HTTP).
    max_connections_per_ip: Positive = 1000
    #: Requests one remoting connection may have waiting for their answers before it is no longer read.
    max_inflight_per_connection: Positive = 65_536
    #: An HTTP request's head (request line and headers) must arrive within this many seconds.
    http_header_timeout_s: Seconds = 10.0
    #: An idle HTTP keep-alive connection is closed after this many seconds (uvicorn's ``timeout_keep_alive``).
    http_keep_alive_s: Seconds = 5.0
    #: Connections plus requests an HTTP port serves at once; beyond it uvicorn answers 503 at once.
    http_max_concurrency: Positive = 10_000
    #: Bytes of requests one remoting connection may have read and not answered yet; a request beyond it is
    #: answered SYSTEM_BUSY at once (a request alone, and one of at most 4 KiB, is always taken).
    max_unanswered_bytes_per_connection: Positive = 64 << 20
    #: The same for all connections of one remoting server together.
    max_unanswered_bytes: Positive = 512 << 20

    def __post_init__(self) -> None:
        check_fields(self)


#: How long an HTTP client keeps an idle pooled connection: well under the servers' keep-alive
#: (``http_keep_alive_s``).  With equal times the server's close and the client's next request on that
#: connection cross on the wire, and the request fails with "connection reset by peer".
CLIENT_KEEPALIVE_EXPIRY_S = 2.0


def client_pool_limits(max_connections: int | None = 100, max_keepalive_connections: int | None = 20) -> httpx.Limits:
    """The connection pool limits of every HTTP client calling a sparkmq server (idle connections expire after
    :data:`CLIENT_KEEPALIVE_EXPIRY_S`); the counts default to httpx's own."""
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive_connections,
                        keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S)


class PerAddressCounter:
    """Open connections by source IP, for one listener (its event loop's thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    def admit(self, ip: str) -> bool:
        """Count one more connection from ``ip``; False (and nothing counted) when it already holds ``limit``."""
        if self._open[ip] >= self.limit:
            return False
        self._open[ip] += 1
        return True

    def release(self, ip: str) -> None:
        """One connection from ``ip`` (admitted before) closed."""
        left = self._open[ip] - 1
        if left > 0:
            self._open[ip] = left
        else:
            del self._open[ip]

    def __getitem__(self, ip: str) -> int:
        return self._open.get(ip, 0)


class RefusalLog:
    """Logs refused connections once per address and ``interval_s``: the first refusal at WARNING, the rest
    counted and reported in one line when the next interval starts."""

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = 60.0) -> None:
        self._log = logger
        self._what = what
        self._interval_s = interval_s
        self._window: dict[str, tuple[float, int]] = {}  # ip -> (interval start, refusals not logged)
        #: Every refusal, by reason (for stats).
        self.refused: Counter[str] = Counter()

    def refused_one(self, ip: str, reason: str) -> None:
        """Record one refusal of a connection from ``ip``."""
        self.refused[reason] += 1
        now = time.monotonic()
        started, quiet = self._window.get(ip, (-math.inf, 0))
        if now - started < self._interval_s:
            self._window[ip] = (started, quiet + 1)
            return
        if quiet:
            self._log.warning("%s: refused %d more connections from %s in the last %.0f s", self._what, quiet, ip,
                              now - started)
        self._log.warning("%s: refusing connections from %s: %s (further refusals reported once a minute)",
                          self._what, ip, reason)
        self._window[ip] = (now, 0)
        if len(self._window) > 10_000:  # many addresses: forget the oldest windows rather than grow for ever
            for key in sorted(self._window, key=lambda k: self._window[k][0])[:5_000]:
                del self._window[key]

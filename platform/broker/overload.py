"""Fast failure under overload, as RocketMQ's broker does it: answer SYSTEM_BUSY at once instead of queueing.

A RocketMQ broker answers a request SYSTEM_BUSY (response code 2) when it

* waited in the send (or pull) thread pool's queue longer than ``waitTimeMillsInSendQueue`` (200 ms;
  ``waitTimeMillsInPullQueue``, 5 s, for pulls): ``[TIMEOUT_CLEAN_QUEUE]broker busy``;
* arrives while the commit log has been busy -- an append holding its lock, i.e. the page cache stalled on
  the disk -- for longer than ``osPageCacheBusyTimeOutMills`` (1 s): ``[PC_SYNCHRONIZED]broker busy``.

Its clients back off and retry.  sparkmq's broker answers requests on one event loop, so its "queues" are:

* the frames one read of a connection delivered (a request waits while the loop answers the ones before it)
  and the worker threads some requests need (a cold pull's disk read, a half message): the time from the
  frame's decoding to its handling is its wait (:meth:`OverloadGuard.check_waited`);
* the sends stored and waiting for their disk sync (SYNC_FLUSH): while the oldest of them has waited longer
  than the page-cache-busy time with no sync completing, the disk is behind and every new send is refused
  before it is stored (:meth:`OverloadGuard.check_send`), so waiting sends and dirty pages stay bounded;
* an append that itself took longer than the page-cache-busy time (the loop's write into the page cache stalled
  on the disk, ASYNC_FLUSH's slow disk): sends are refused for that long after it (:meth:`OverloadGuard.stored`).

Memory is bounded by count, too: sends waiting for their sync (``max_pending_acks``), pulls held by long
polling (``max_held_pulls``); and by bytes in the remoting server (``max_unanswered_bytes_per_connection``,
``max_unanswered_bytes``: requests read but not answered yet, platform/common/limits.py).

Every SYSTEM_BUSY answer counts in ``sparkmq_system_busy_total{reason=...}`` on ``/metrics``.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..common.errors import ErrorCode, SparkMQError

__all__ = ["OverloadGuard", "BUSY_REASONS"]

#: The reasons a request is answered SYSTEM_BUSY (the metric's ``reason`` label; the message's prefix).
BUSY_REASONS = ("TIMEOUT_CLEAN_QUEUE", "PC_SYNCHRONIZED", "PENDING_ACKS_FULL", "HELD_PULLS_FULL",
                "UNANSWERED_BYTES_FULL")


class OverloadGuard:
    """One broker's overload rules and counters (safe from any thread).

    ``send_wait_s`` / ``pull_wait_s``: the longest a send / pull may wait in the broker before it is handled;
    ``busy_s``: how long the oldest send may wait for its disk sync before the disk counts as busy;
    ``max_pending_acks`` / ``max_held_pulls``: the most sends waiting for a sync and pulls held at once.
    ``on_busy(reason)`` is called for each SYSTEM_BUSY answer (the broker counts it in its metrics).

    Example::

        >>> guard = OverloadGuard(send_wait_s=0.2, pull_wait_s=5.0, busy_s=1.0, max_pending_acks=10,
        ...                       max_held_pulls=10)
        >>> guard.check_waited(0.05, pull=False)   # answered in time: nothing happens
        >>> try:
        ...     guard.check_waited(0.5, pull=False)
        ... except SparkMQError as exc:
        ...     print(exc.code.name, exc.message[:32])
        SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE]broker busy
        >>> guard.busy_answers["TIMEOUT_CLEAN_QUEUE"]
        1
    """

    def __init__(self, *, send_wait_s: float, pull_wait_s: float, busy_s: float, max_pending_acks: int,
                 max_held_pulls: int, on_busy: Callable[[str], None] | None = None) -> None:
        self.send_wait_s = send_wait_s
        self.pull_wait_s = pull_wait_s
        self.busy_s = busy_s
        self.max_pending_acks = max_pending_acks
        self.max_held_pulls = max_held_pulls
        self._on_busy = on_busy
        self._lock = threading.Lock()
        #: Sends stored and waiting for their disk sync, and when the wait of the oldest one began or a sync
        #: last answered some (time.monotonic()).
        self._pending_acks = 0
        self._progress_at = 0.0
        #: Until when (time.monotonic()) sends are refused after a store took longer than ``busy_s`` (the page
        #: cache stalled on the disk while the loop appended: ASYNC_FLUSH's slow disk).
        self._slow_append_until = 0.0
        #: SYSTEM_BUSY answers by reason.
        self.busy_answers: dict[str, int] = dict.fromkeys(BUSY_REASONS, 0)

    # -- refusing ---------------------------------------------------------------------------------
    def busy(self, reason: str, detail: str) -> SparkMQError:
        """Count one SYSTEM_BUSY answer for ``reason`` and return the error to raise (RocketMQ's wording)."""
        with self._lock:
            self.busy_answers[reason] = self.busy_answers.get(reason, 0) + 1
        if self._on_busy is not None:
            self._on_busy(reason)
        return SparkMQError(ErrorCode.SYSTEM_BUSY, f"[{reason}]broker busy, start flow control for a while, {detail}")

    def check_waited(self, waited_s: float, *, pull: bool) -> None:
        """SYSTEM_BUSY when a request waited ``waited_s`` in the broker before being handled, longer than allowed."""
        limit = self.pull_wait_s if pull else self.send_wait_s
        if waited_s > limit:
            setting = "wait_time_ms_in_pull_queue" if pull else "wait_time_ms_in_send_queue"
            raise self.busy("TIMEOUT_CLEAN_QUEUE", f"the request waited {waited_s * 1000:.0f} ms in the broker "
                                                   f"({setting} is {limit * 1000:.0f} ms)")

    def check_send(self) -> None:
        """Before a send is stored: SYSTEM_BUSY while ``max_pending_acks`` sends wait for their sync, or while the
        page cache is busy (:meth:`page_cache_refusal`)."""
        pending = self._pending_acks
        if not pending and not self._slow_append_until:  # the common case: two attribute reads
            return
        if pending >= self.max_pending_acks:
            raise self.busy("PENDING_ACKS_FULL", f"{pending} sends wait for their disk sync "
                                                 f"(max_pending_acks is {self.max_pending_acks})")
        now = time.monotonic()
        if self._slow_append_until and now >= self._slow_append_until:
            self._slow_append_until = 0.0
        refusal = self.page_cache_refusal(now)
        if refusal is not None:
            raise self.busy("PC_SYNCHRONIZED", refusal)

    def page_cache_refusal(self, now: float | None = None) -> str | None:
        """Why sends are refused for a busy page cache at ``now`` (monotonic; default: now), or None: the oldest
        send waiting for its sync has waited longer than ``busy_s`` without a sync answering any, or a send took
        longer than ``busy_s`` to store less than ``busy_s`` ago (:meth:`stored`).  The one statement of the rule,
        for :meth:`check_send` and :attr:`page_cache_busy`."""
        now = time.monotonic() if now is None else now
        if self._pending_acks:
            stalled = now - self._progress_at
            if stalled > self.busy_s:
                return (f"no disk sync answered the waiting sends for {stalled * 1000:.0f} ms "
                        f"(os_page_cache_busy_timeout_ms is {self.busy_s * 1000:.0f} ms)")
        left = self._slow_append_until - now
        if left > 0:
            return (f"a send took longer than os_page_cache_busy_timeout_ms ({self.busy_s * 1000:.0f} ms) to store; "
                    f"sends resume in {left * 1000:.0f} ms")
        return None

    def stored(self, seconds: float) -> None:
        """A send was stored in ``seconds``: when that is longer than ``busy_s`` (the append stalled on the page
        cache), further sends are refused for ``busy_s`` (RocketMQ refuses while the commit log's lock is held that
        long; here the append runs on the loop, so what it can do is refuse after it)."""
        if seconds > self.busy_s:
            self._slow_append_until = time.monotonic() + self.busy_s

    def check_hold(self, held: int) -> None:
        """Before a pull is held by long polling: SYSTEM_BUSY when ``held`` pulls already are."""
        if held >= self.max_held_pulls:
            raise self.busy("HELD_PULLS_FULL", f"{held} pulls are held (max_held_pulls is {self.max_held_pulls})")

    @property
    def page_cache_busy(self) -> bool:
        """Whether sends are refused now because the disk is behind (:meth:`page_cache_refusal`)."""
        return self.page_cache_refusal() is not None

    # -- sends waiting for their sync -------------------------------------------------------------
    def ack_waiting(self) -> None:
        """A stored send starts waiting for its disk sync (call :meth:`ack_done` once it is answered)."""
        with self._lock:
            if not self._pending_acks:
                self._progress_at = time.monotonic()
            self._pending_acks += 1

    def ack_done(self, _future: Any = None) -> None:
        """A send's disk sync answered it (or timed it out); usable as a future's done callback."""
        with self._lock:
            self._pending_acks -= 1
            self._progress_at = time.monotonic()

    @property
    def pending_acks(self) -> int:
        """Sends stored and waiting for their disk sync."""
        return self._pending_acks

    def status(self) -> dict[str, Any]:
        """The settings, the pending sends and the SYSTEM_BUSY answers by reason (``/health``, ``/metrics``)."""
        return {"pending_acks": self._pending_acks, "page_cache_busy": self.page_cache_busy,
                "busy_answers": dict(self.busy_answers), "wait_time_ms_in_send_queue": round(self.send_wait_s * 1000),
                "wait_time_ms_in_pull_queue": round(self.pull_wait_s * 1000),
                "os_page_cache_busy_timeout_ms": round(self.busy_s * 1000), "max_pending_acks": self.max_pending_acks,
                "max_held_pulls": self.max_held_pulls}

"""Timer messages: any delivery time, kept in a time-bucketed index until due, recallable.

A timer message is stored (durably, like any send) in queue 0 of ``rmq_sys_wheel_timer``
with its real topic and queue in properties and its due time in the consume-queue
unit's tag-hash field.  This service indexes that queue into buckets of one second
(a dict of second → entries, plus a heap of the seconds that have entries: the
wheel's slots without a fixed horizon), delivers a bucket's entries when their time
comes by re-putting them to their topic, and lets a pending timer be recalled by its
message id.

Durability: the timer queue is the source of truth.  The service persists a
*watermark* (every timer below it was delivered or recalled) and the done ones above
it (:class:`~.progress.DoneTracker`); after a restart it re-indexes from the watermark and skips the
done ones, so pending timers survive a kill -9 and a recalled timer never fires.
Deliveries since the last persist may repeat (at-least-once).
"""
from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import FailureLog
from ..common.message import Message, StoredMessage
from ..common.system_topics import (
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    TIMER_TOPIC,
)
from ..store import MessageStore, PutResult
from .background import RETRY_LATER_CODES, RETRY_LATER_MS, PeriodicService
from .progress import DoneTracker
from .schedule import park_properties, restore_parked

__all__ = ["TimerService", "DEFAULT_TIMER_MAX_DELAY_S"]

log = logging.getLogger("sparkmq.broker.timer")

#: RocketMQ's default: a timer may be at most 3 days ahead.
DEFAULT_TIMER_MAX_DELAY_S = 3 * 24 * 3600


class TimerService(PeriodicService):
    """Index, deliver and recall timer messages of one broker."""

    thread_name = "sparkmq-timer"

    def __init__(self, store: MessageStore, progress_path: Path,
                 deliver: Callable[[Message, int, StoredMessage], object],
                 max_delay_s: float = DEFAULT_TIMER_MAX_DELAY_S, persist_interval_s: float = 1.0,
                 max_idle_wait_s: float = 0.2) -> None:
        """``deliver(message, queue_id, parked)`` re-puts a due message through the broker's put path."""
        super().__init__(persist_interval_s, max_idle_wait_s)
        self.store = store
        self.progress_path = progress_path
        self.max_delay_s = max_delay_s
        self._deliver = deliver
        self._lock = threading.Lock()
        self._index_lock = threading.Lock()  # one indexer at a time (the thread, or a recall)
        self._buckets: dict[int, list[tuple[int, int]]] = {}  # second -> [(due_ms, timer offset)]
        self._seconds: list[int] = []  # heap of bucket seconds
        self._pending_ids: dict[str, int] = {}  # msg id -> timer offset, for recall
        self._progress = DoneTracker(progress_path)
        self._indexed = self._progress.watermark
        self.delivered = 0
        self.recalled = 0
        self._failures = FailureLog(log, "delivering timer messages")

    # -- progress ---------------------------------------------------------------------
    @property
    def watermark(self) -> int:
        """Every timer below this offset of the timer queue was delivered or recalled."""
        return self._progress.watermark

    def persist(self) -> None:
        """Write the watermark and the done set above it, atomically."""
        self._progress.persist()

    def needed_offsets(self) -> list[tuple[str, int, int]]:
        """The timer queue from the watermark (timers above it may still be pending)."""
        return [(TIMER_TOPIC, 0, self._progress.watermark)]

    # -- send side --------------------------------------------------------------------
    def due_time(self, properties: dict[str, str], now_ms: int) -> int | None:
        """The due time a message asks for (TIMER_DELIVER_MS, TIMER_DELAY_SEC or TIMER_DELAY_MS), None if none.

        INVALID_ARGUMENT when it is not a number or beyond the maximum delay.
        """
        raw_at = properties.get(PROPERTY_TIMER_DELIVER_MS)
        raw_delay = properties.get(PROPERTY_TIMER_DELAY_SEC)
        raw_delay_ms = properties.get(PROPERTY_TIMER_DELAY_MS)
        if raw_at is None and raw_delay is None and raw_delay_ms is None:
            return None
        try:
            if raw_at is not None:
                due = int(raw_at)
            elif raw_delay is not None:
                due = now_ms + int(float(raw_delay) * 1000)
            else:
                due = now_ms + int(raw_delay_ms)  # type: ignore[arg-type]
        except ValueError:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "timer delivery time must be a number, got "
                                                           f"{raw_at or raw_delay or raw_delay_ms!r}") from None
        if due - now_ms > self.max_delay_s * 1000:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"the delivery time is {(due - now_ms) / 1000:.0f} s ahead; "
                               f"the maximum is {self.max_delay_s:.0f} s")
        return due

    def park(self, msg: Message, queue_id: int, due_ms: int, **put_args: object) -> PutResult:
        """Store ``msg`` in the timer topic, due at ``due_ms``; returns the store's PutResult."""
        props = park_properties(msg, queue_id, {PROPERTY_TIMER_DELIVER_MS: str(due_ms)})
        parked = Message(TIMER_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props, flag=msg.flag)
        result = self.store.put(parked, 0, cq_tag_hash=due_ms, **put_args)  # type: ignore[arg-type]
        self.wake()
        return result

    def recall(self, msg_id: str) -> bool:
        """Cancel a pending timer by its message id; False when none is pending (fired, recalled or unknown)."""
        self.index()
        with self._lock:
            offset = self._pending_ids.pop(msg_id, None)
        if offset is None or not self._progress.mark_done(offset):
            return False
        self.recalled += 1
        return True

    def pending_count(self) -> int:
        """Timers indexed and not yet delivered or recalled."""
        with self._lock:
            return len(self._pending_ids)

    # -- indexing and delivery --------------------------------------------------------
    def index(self) -> int:
        """Index timer entries stored since the last call; returns how many were added."""
        with self._index_lock:
            return self._index_new()

    def _index_new(self) -> int:
        added = 0
        with self._lock:
            start = max(self._indexed, self.store.min_offset(TIMER_TOPIC, 0))
            end = self.store.max_offset(TIMER_TOPIC, 0)
        for offset in range(start, end):
            clog_offset, _size, due = self.store.queue_unit(TIMER_TOPIC, 0, offset)
            if self._progress.is_done(offset):
                continue
            msg_id = self.store.read_message(clog_offset).msg_id
            with self._lock:
                second = due // 1000
                bucket = self._buckets.get(second)
                if bucket is None:
                    self._buckets[second] = bucket = []
                    heapq.heappush(self._seconds, second)
                bucket.append((due, offset))
                self._pending_ids[msg_id] = offset
                added += 1
        with self._lock:
            self._indexed = max(self._indexed, end)
        return added

    def run_once(self, now_ms: int | None = None) -> int:
        """Index, then deliver every due timer; returns ms until the next due one (-1 if none)."""
        self.index()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        while True:
            with self._lock:
                if not self._seconds:
                    return -1
                second = self._seconds[0]
                bucket = self._buckets[second]
                due_now = [entry for entry in bucket if entry[0] <= now]
                if not due_now:
                    return max(1, min(entry[0] for entry in bucket) - now)
                later = [entry for entry in bucket if entry[0] > now]
                if later:
                    self._buckets[second] = later
                else:
                    heapq.heappop(self._seconds)
                    del self._buckets[second]
            waiting = sorted(due_now)
            for at, (_due, offset) in enumerate(waiting):
                if not self._fire(offset):  # the store refuses writes for now: these wait
                    self._requeue(now + RETRY_LATER_MS, waiting[at:])
                    return RETRY_LATER_MS

    def _requeue(self, due_ms: int, entries: list[tuple[int, int]]) -> None:
        """Put due timers back into the index, due again at ``due_ms``."""
        second = due_ms // 1000
        with self._lock:
            bucket = self._buckets.get(second)
            if bucket is None:
                self._buckets[second] = bucket = []
                heapq.heappush(self._seconds, second)
            bucket.extend((due_ms, offset) for _due, offset in entries)

    def _fire(self, offset: int) -> bool:
        """Deliver one due timer; False when the store refused it for now (it stays pending)."""
        if self._progress.is_done(offset):
            return True  # recalled meanwhile
        try:
            parked = self.store.read_queue_message(TIMER_TOPIC, 0, offset)
            message, queue_id = restore_parked(parked, (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC))
            self._deliver(message, queue_id, parked)
            self.delivered += 1
            self._failures.success()
        except SparkMQError as exc:
            if exc.code in RETRY_LATER_CODES:
                self._failures.failure("timer at offset %d waits: %s", offset, exc)
                return False
            self._failures.failure("timer at offset %d skipped: %s", offset, exc)
            parked = None
        if parked is not None:
            with self._lock:
                self._pending_ids.pop(parked.msg_id, None)
        self._progress.mark_done(offset)
        return True

    def tick(self) -> int:
        """Index and deliver what is due (the thread's step)."""
        return self.run_once()

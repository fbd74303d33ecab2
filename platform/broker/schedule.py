"""Delay levels: messages parked in ``SCHEDULE_TOPIC_XXXX`` until due, then re-put to their topic.

A send with delay level L (1-based) is stored in queue L-1 of the schedule topic with
its real topic and queue in properties, and its *delivery time* in the consume-queue
unit's tag-hash field (as RocketMQ does), so this service reads due times from the
20-byte units without decoding records.  Every message of a level has the same delay,
so each level's queue is ordered by due time: one cursor per level walks it, re-puts
each message whose time has come, and sleeps until the next one is due.

Progress (the next offset per level) is persisted atomically to a JSON file every
``persist_interval_s`` and on stop.  A crash re-delivers at most what was delivered
since the last persist (at-least-once, like RocketMQ).
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import FailureLog
from ..common.message import Message, StoredMessage
from ..common.system_topics import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_TOPIC,
)
from ..common.validation import check_int
from ..store import MessageStore, PutResult
from .background import RETRY_LATER_CODES, RETRY_LATER_MS, PeriodicService

__all__ = ["DEFAULT_DELAY_LEVELS", "parse_delay_levels", "ScheduleService", "restore_parked", "park_properties"]

log = logging.getLogger("sparkmq.broker.schedule")

#: RocketMQ's 18 levels.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """Milliseconds of each level of a space-separated list like ``"1s 5s 1m 2h"`` (``ms`` allowed).

    Example::

        >>> parse_delay_levels("100ms 1s 2m")
        (100, 1000, 120000)
    """
    levels = []
    for part in text.split():
        match = _LEVEL.match(part)
        if match is None or int(match.group(1)) <= 0:
            raise ValueError(f"bad delay level {part!r}: write a positive number with ms, s, m, h or d")
        levels.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    if not levels:
        raise ValueError("at least one delay level is needed")
    return tuple(levels)


def park_properties(msg: Message, queue_id: int, extra: dict[str, str]) -> dict[str, str]:
    """The properties of a message parked in a system topic: its own plus where it really goes."""
    return {**msg.properties, PROPERTY_REAL_TOPIC: msg.topic, PROPERTY_REAL_QUEUE_ID: str(queue_id), **extra}


def restore_parked(stored: StoredMessage, drop: tuple[str, ...]) -> tuple[Message, int]:
    """The message a parked record stands for, and its real queue id (``drop``: properties to remove)."""
    props = dict(stored.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, None)
    queue = props.pop(PROPERTY_REAL_QUEUE_ID, None)
    if topic is None or queue is None:
        raise SparkMQError(ErrorCode.STORE_CORRUPT,
                           f"parked message at commit-log offset {stored.commitlog_offset} has no real topic/queue")
    for name in drop:
        props.pop(name, None)
    tags = props.pop("TAGS", None)
    keys = tuple(k for k in props.pop("KEYS", "").split(" ") if k)
    return Message(topic, stored.body, tags=tags, keys=keys, properties=props, flag=stored.flag), int(queue)


class ScheduleService(PeriodicService):
    """One cursor thread over every delay level's queue of the schedule topic."""

    thread_name = "sparkmq-schedule"

    def __init__(self, store: MessageStore, levels_ms: tuple[int, ...], progress_path: Path,
                 deliver: Callable[[Message, int, StoredMessage], object], persist_interval_s: float = 1.0,
                 max_idle_wait_s: float = 0.1) -> None:
        """``deliver(message, queue_id, parked)`` re-puts a due message (the broker's put path,
        so metrics, long polling and traces see it like any send)."""
        super().__init__(persist_interval_s, max_idle_wait_s)
        self.store = store
        self.levels_ms = levels_ms
        self.progress_path = progress_path
        self._deliver = deliver
        self._offsets: dict[int, int] = self._load()
        self._lock = threading.Lock()
        self.delivered = 0
        self._skips = FailureLog(log, "delivering delay-level messages")

    # -- progress ---------------------------------------------------------------------
    def _load(self) -> dict[int, int]:
        try:
            data = json.loads(self.progress_path.read_text())
        except FileNotFoundError:
            return {}
        return {int(level): int(offset) for level, offset in data.get("offsets", {}).items()}

    def persist(self) -> None:
        """Write the per-level offsets atomically."""
        with self._lock:
            data = {"offsets": {str(k): v for k, v in sorted(self._offsets.items())}}
        self.progress_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.progress_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.progress_path)

    def offsets(self) -> dict[int, int]:
        """Next offset to deliver per level (1-based levels)."""
        with self._lock:
            return dict(self._offsets)

    def needed_offsets(self) -> list[tuple[str, int, int]]:
        """Each level's queue of the schedule topic from its next offset to deliver."""
        with self._lock:
            return [(SCHEDULE_TOPIC, level - 1, self._offsets.get(level, 0))
                    for level in range(1, len(self.levels_ms) + 1)]

    # -- send side --------------------------------------------------------------------
    def level_delay_ms(self, level: int) -> int:
        """The delay of ``level`` (1-based); INVALID_ARGUMENT outside 1..len(levels)."""
        return self.levels_ms[check_int("delay level", level, 1, len(self.levels_ms)) - 1]

    def park(self, msg: Message, queue_id: int, level: int, **put_args: object) -> PutResult:
        """Store ``msg`` in the schedule topic for ``level``; returns the store's PutResult."""
        due = int(time.time() * 1000) + self.level_delay_ms(level)
        props = park_properties(msg, queue_id, {PROPERTY_DELAY_LEVEL: str(level)})
        parked = Message(SCHEDULE_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props, flag=msg.flag)
        result = self.store.put(parked, level - 1, cq_tag_hash=due, **put_args)  # type: ignore[arg-type]
        self.wake()
        return result

    # -- delivery ---------------------------------------------------------------------
    def run_once(self, now_ms: int | None = None) -> int:
        """Deliver everything due now; returns the milliseconds until the next due message (or -1 if none)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        next_due = -1
        for level in range(1, len(self.levels_ms) + 1):
            queue_id = level - 1
            end = self.store.max_offset(SCHEDULE_TOPIC, queue_id)
            with self._lock:
                offset = max(self._offsets.get(level, 0), self.store.min_offset(SCHEDULE_TOPIC, queue_id))
            while offset < end and not self._stop_event.is_set():
                clog_offset, _size, due = self.store.queue_unit(SCHEDULE_TOPIC, queue_id, offset)
                if due > now:
                    wait = due - now
                    next_due = wait if next_due < 0 else min(next_due, wait)
                    break
                try:
                    parked = self.store.read_message(clog_offset)
                    # DELAY stays, as on RocketMQ's delivered copy: a Java consumer's getDelayTimeLevel() reads the
                    # level the producer set (redeliver puts it straight to the store: it is not parked again)
                    message, queue_id = restore_parked(parked, ())
                    self._deliver(message, queue_id, parked)
                    self.delivered += 1
                except SparkMQError as exc:
                    if exc.code in RETRY_LATER_CODES:  # the store refuses writes for now: this level waits
                        self._skips.failure("level %d offset %d waits: %s", level, offset, exc)
                        next_due = RETRY_LATER_MS if next_due < 0 else min(next_due, RETRY_LATER_MS)
                        break
                    # A message that cannot be re-put (its topic deleted, say) must not block the level.
                    self._skips.failure("level %d offset %d skipped: %s", level, offset, exc)
                else:
                    self._skips.success()
                offset += 1
                with self._lock:
                    self._offsets[level] = offset
        return next_due

    def tick(self) -> int:
        """Deliver what is due (the thread's step)."""
        return self.run_once()

"""Broker-side queue locks for orderly consumption (RocketMQ's ``RebalanceLockManager``).

An orderly consumer locks the queues allocated to it so that, during a rebalance, two
clients of one group never consume a queue at the same time.  A lock belongs to
(group, client id) and expires ``expiry_s`` (60 s) after it was last taken or renewed;
locking a queue one already holds renews it.  Only the holder can unlock.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..common.errors import ErrorCode, SparkMQError
from ..common.validation import check_int, validate_group, validate_topic

__all__ = ["QueueLockManager", "QueueRef"]

#: (topic, queue_id)
QueueRef = tuple[str, int]


@dataclass
class _Lock:
    client_id: str
    last_locked: float


def _check_queues(queues: Iterable[QueueRef]) -> list[QueueRef]:
    out: list[QueueRef] = []
    for item in queues:
        try:
            topic, queue_id = item
        except (TypeError, ValueError):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"a queue is (topic, queue_id), got {item!r}") from None
        validate_topic(topic)
        check_int("queue id", queue_id, 0, 65535, ErrorCode.QUEUE_ID_ILLEGAL)
        if (topic, queue_id) not in out:
            out.append((topic, queue_id))
    return out


def _check_client(client_id: object) -> str:
    if not isinstance(client_id, str) or not client_id:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"the client id must be a non-empty string, got {client_id!r}")
    return client_id


class QueueLockManager:
    """Exclusive, expiring locks on (topic, queue_id) per consumer group."""

    def __init__(self, expiry_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock`` is injectable so tests control expiry without sleeping."""
        self.expiry_s = float(expiry_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._locks: dict[str, dict[QueueRef, _Lock]] = {}

    def _held_by(self, lock: _Lock | None, client_id: str, now: float) -> bool:
        return lock is not None and lock.client_id == client_id and now - lock.last_locked <= self.expiry_s

    def _free(self, lock: _Lock | None, now: float) -> bool:
        return lock is None or now - lock.last_locked > self.expiry_s

    def lock(self, group: str, client_id: str, queues: Iterable[QueueRef], *,
             now: float | None = None) -> list[QueueRef]:
        """Take or renew the locks that are free, expired or already ``client_id``'s; returns those now held."""
        validate_group(group)
        _check_client(client_id)
        wanted = _check_queues(queues)
        now = self._clock() if now is None else now
        got: list[QueueRef] = []
        with self._lock:
            table = self._locks.setdefault(group, {})
            for ref in wanted:
                current = table.get(ref)
                if self._free(current, now) or self._held_by(current, client_id, now):
                    table[ref] = _Lock(client_id, now)
                    got.append(ref)
        return got

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> list[QueueRef]:
        """Release the named locks that ``client_id`` holds; returns those released (others' locks stay)."""
        validate_group(group)
        _check_client(client_id)
        refs = _check_queues(queues)
        released: list[QueueRef] = []
        with self._lock:
            table = self._locks.get(group, {})
            for ref in refs:
                current = table.get(ref)
                if current is not None and current.client_id == client_id:
                    del table[ref]
                    released.append(ref)
            if not table:
                self._locks.pop(group, None)
        return released

    def unlock_client(self, group: str, client_id: str) -> int:
        """Release every lock ``client_id`` holds in ``group`` (it left the group); returns how many."""
        with self._lock:
            table = self._locks.get(group, {})
            refs = [r for r, lk in table.items() if lk.client_id == client_id]
            for ref in refs:
                del table[ref]
            if not table:
                self._locks.pop(group, None)
            return len(refs)

    def owner(self, group: str, topic: str, queue_id: int, *, now: float | None = None) -> str | None:
        """The client holding the lock on (topic, queue_id) in ``group``, or None when free or expired."""
        now = self._clock() if now is None else now
        with self._lock:
            current = self._locks.get(group, {}).get((topic, queue_id))
            return None if self._free(current, now) else current.client_id  # type: ignore[union-attr]

    def is_locked_by(self, group: str, topic: str, queue_id: int, client_id: str, *, now: float | None = None) -> bool:
        """Whether ``client_id`` holds a live lock on (topic, queue_id) in ``group``."""
        return self.owner(group, topic, queue_id, now=now) == client_id

"""Transactional messages: half messages, commit / rollback, and check-backs.

1. The producer sends a *half* message: it is stored in queue 0 of
   ``RMQ_SYS_TRANS_HALF_TOPIC`` (with its real topic and queue in properties and the
   PREPARED sys flag), so consumers cannot see it.  Its transaction id is its unique id.
2. The producer runs its local transaction and ends it: COMMIT re-puts the message to
   its real topic (now visible); ROLLBACK does not.  Either way an *op record* (body =
   the half's queue offset, tag ``COMMIT`` / ``ROLLBACK`` / ``DISCARD``) is appended to
   ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` — the durable proof the half is settled.
3. A half left open is *checked back*: first after ``first_check_s`` (6 s, or the
   message's ``CHECK_IMMUNITY_TIME_IN_SECONDS``), then every ``check_interval_s`` (30 s),
   at most ``max_checks`` (15) times; then it is discarded and a DISCARD op records it.
   A check is handed to ``check_sink`` (the broker's long-poll channel to a live producer
   of the group), whose answer comes back through :meth:`TransactionService.end`.

Progress: a :class:`~.progress.DoneTracker` over half-queue offsets, persisted with the
op queue's end offset and the check counts.  After a restart the ops written since
the last persist are replayed, so nothing settled is checked again and nothing open
is forgotten.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..common.errors import ErrorCode, SparkMQError
from ..common.message import Message, StoredMessage
from ..common.sysflag import TRANSACTION_PREPARED
from ..common.system_topics import (
    PROPERTY_CHECK_IMMUNITY_S,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from ..store import MessageStore, PutResult
from .background import PeriodicService
from .progress import DoneTracker
from .schedule import park_properties, restore_parked

__all__ = ["TransactionService", "CheckRequest", "COMMIT", "ROLLBACK", "UNKNOWN", "DISCARD"]

log = logging.getLogger("sparkmq.broker.transaction")

COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
UNKNOWN = "UNKNOWN"
DISCARD = "DISCARD"


@dataclass(frozen=True)
class CheckRequest:
    """Ask a producer of ``producer_group``: what became of this transaction?"""

    producer_group: str
    transaction_id: str
    topic: str
    check_times: int
    half_offset_msg_id: str
    body: bytes
    properties: dict[str, str]


@dataclass
class _Half:
    offset: int
    transaction_id: str
    group: str
    next_check_ms: int
    checks: int = 0


class TransactionService(PeriodicService):
    """Half messages of one broker: prepare, end, check back, discard."""

    thread_name = "sparkmq-transactions"

    def __init__(self, store: MessageStore, progress_path: Path,
                 deliver: Callable[[Message, int, StoredMessage], PutResult],
                 check_sink: Callable[[CheckRequest], bool], *, first_check_s: float = 6.0,
                 check_interval_s: float = 30.0, max_checks: int = 15, scan_interval_s: float = 1.0,
                 persist_interval_s: float = 1.0) -> None:
        """``deliver`` re-puts a committed message through the broker's put path; ``check_sink``
        hands a check to a live producer (False when none of the group is connected: the
        attempt still counts, as in RocketMQ)."""
        super().__init__(persist_interval_s, scan_interval_s)
        self.store = store
        self._deliver = deliver
        self._check_sink = check_sink
        self.first_check_s = first_check_s
        self.check_interval_s = check_interval_s
        self.max_checks = max_checks
        self._lock = threading.RLock()
        self._progress = DoneTracker(progress_path)
        self._open: dict[str, _Half] = {}  # transaction id -> half
        self._indexed = self._progress.watermark
        self.committed = self.rolled_back = self.discarded = self.checks_sent = 0
        self._replay_ops(int(self._progress.extra.get("op_offset", 0)))

    # -- recovery ---------------------------------------------------------------------
    def _replay_ops(self, from_offset: int) -> None:
        start = max(from_offset, self.store.min_offset(TRANS_OP_HALF_TOPIC, 0))
        for offset in range(start, self.store.max_offset(TRANS_OP_HALF_TOPIC, 0)):
            op = self.store.read_queue_message(TRANS_OP_HALF_TOPIC, 0, offset)
            self._progress.mark_done(int(op.body))

    def needed_offsets(self) -> list[tuple[str, int, int]]:
        """The half queue from the watermark (halves above it may be open), and the op queue from the position
        a restart replays it from."""
        return [(TRANS_HALF_TOPIC, 0, self._progress.watermark),
                (TRANS_OP_HALF_TOPIC, 0, int(self._progress.extra.get("op_offset", 0)))]

    def persist(self) -> None:
        """Persist settled halves, the op queue position and the open halves' check counts."""
        with self._lock:
            op_offset = self.store.max_offset(TRANS_OP_HALF_TOPIC, 0)
            checks = {str(h.offset): h.checks for h in self._open.values() if h.checks}
            self._progress.persist({"op_offset": op_offset, "checks": checks})

    # -- producer side ----------------------------------------------------------------
    def prepare(self, msg: Message, queue_id: int, producer_group: str, **put_args: object) -> PutResult:
        """Store ``msg`` as a half message; its ``msg_id`` is the transaction id."""
        props = park_properties(msg, queue_id, {PROPERTY_TRANSACTION_PREPARED: "true",
                                                PROPERTY_PRODUCER_GROUP: producer_group})
        half = Message(TRANS_HALF_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props, flag=msg.flag)
        result = self.store.put(half, 0, sys_flag=TRANSACTION_PREPARED, **put_args)  # type: ignore[arg-type]
        self.index()
        return result

    def end(self, transaction_id: str, producer_group: str, action: str) -> PutResult | None:
        """COMMIT (returns the visible message's PutResult) or ROLLBACK (returns None) an open transaction.

        TRANSACTION_NOT_FOUND when no open half has that id for that group; INVALID_ARGUMENT for
        another action.  UNKNOWN changes nothing (the check-backs go on).
        """
        if action not in (COMMIT, ROLLBACK, UNKNOWN):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"a transaction ends with COMMIT, ROLLBACK or UNKNOWN, got {action!r}")
        self.index()
        with self._lock:
            half = self._open.get(transaction_id)
            if half is None or half.group != producer_group:
                raise SparkMQError(ErrorCode.TRANSACTION_NOT_FOUND,
                                   f"no open transaction {transaction_id!r} for producer group {producer_group!r}")
            if action == UNKNOWN:
                return None
            stored = self._read_half(half.offset)
            result = None
            if action == COMMIT:
                message, queue_id = restore_parked(stored, (PROPERTY_TRANSACTION_PREPARED, PROPERTY_PRODUCER_GROUP,
                                                            PROPERTY_CHECK_IMMUNITY_S))
                result = self._deliver(message, queue_id, stored)
                self.committed += 1
            else:
                self.rolled_back += 1
            self._settle(half, action)
            return result

    # -- internals --------------------------------------------------------------------
    def _read_half(self, offset: int) -> StoredMessage:
        return self.store.read_queue_message(TRANS_HALF_TOPIC, 0, offset)

    def _settle(self, half: _Half, action: str) -> None:
        # The op record is what makes the outcome durable; the tracker is the fast index of it.
        self.store.put(Message(TRANS_OP_HALF_TOPIC, str(half.offset).encode(), tags=action), 0)
        self._progress.mark_done(half.offset)
        self._open.pop(half.transaction_id, None)

    def index(self) -> int:
        """Index half messages stored since the last call; returns how many opened."""
        with self._lock:
            checks = self._progress.extra.get("checks", {})
            opened = 0
            start = max(self._indexed, self.store.min_offset(TRANS_HALF_TOPIC, 0))
            end = self.store.max_offset(TRANS_HALF_TOPIC, 0)
            for offset in range(start, end):
                if self._progress.is_done(offset):
                    continue
                stored = self.store.read_queue_message(TRANS_HALF_TOPIC, 0, offset)
                immunity = stored.properties.get(PROPERTY_CHECK_IMMUNITY_S)
                try:
                    first = float(immunity) if immunity is not None else self.first_check_s
                except ValueError:
                    first = self.first_check_s
                self._open[stored.msg_id] = _Half(
                    offset, stored.msg_id, stored.properties.get(PROPERTY_PRODUCER_GROUP, ""),
                    stored.store_timestamp + int(first * 1000), int(checks.get(str(offset), 0)))
                opened += 1
            self._indexed = end
            return opened

    def open_transactions(self) -> list[str]:
        """Ids of the halves still open."""
        self.index()
        with self._lock:
            return sorted(self._open)

    def run_once(self, now_ms: int | None = None) -> int:
        """Send due check-backs and discard halves past the max checks; returns checks sent."""
        self.index()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        sent = 0
        with self._lock:
            due = [h for h in self._open.values() if h.next_check_ms <= now]
        for half in due:
            with self._lock:
                if half.transaction_id not in self._open:
                    continue  # ended meanwhile
                if half.checks >= self.max_checks:
                    log.warning("discarding transaction %s of %s after %d checks", half.transaction_id, half.group,
                                half.checks)
                    self._settle(half, DISCARD)
                    self.discarded += 1
                    continue
                half.checks += 1
                half.next_check_ms = now + int(self.check_interval_s * 1000)
                stored = self._read_half(half.offset)
            request = CheckRequest(half.group, half.transaction_id, stored.properties.get("REAL_TOPIC", ""),
                                   half.checks, stored.offset_msg_id, stored.body, dict(stored.properties))
            self._check_sink(request)
            self.checks_sent += 1
            sent += 1
        return sent

    def tick(self) -> int:
        """Send due check-backs (the thread's step); the thread then sleeps one scan interval."""
        self.run_once()
        return -1

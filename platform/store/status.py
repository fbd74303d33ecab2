"""Status values of the hot path (returned, not raised), and the result objects."""
from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..common.message import Message, StoredMessage

__all__ = ["PutStatus", "GetStatus", "PutResult", "PackedPutResult", "GetResult", "PackedGetResult", "AppendNote",
           "AppendEvent", "AppendGate", "LogOffsets"]


class PutStatus(enum.StrEnum):
    """Outcome of a put; anything but PUT_OK still means the message is in the log."""

    PUT_OK = "PUT_OK"
    #: SYNC_FLUSH: stored, but no fdatasync covered it within sync_flush_timeout_ms.
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


class GetStatus(enum.StrEnum):
    """Outcome of a get (RocketMQ's GetMessageStatus, named for readers of both)."""

    FOUND = "FOUND"
    #: The offset is the queue's end: nothing new yet (long polling waits here).
    NO_NEW_MSG = "NO_NEW_MSG"
    #: Messages were examined but none matched the filter; next_offset moves past them.
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    #: The queue has never been written.
    NO_MATCHED_QUEUE = "NO_MATCHED_QUEUE"
    #: Below the oldest retained message; next_offset is the queue's min offset.
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    #: Past the queue's end; next_offset is the queue's max offset.
    OFFSET_OVERFLOW = "OFFSET_OVERFLOW"


@dataclass(frozen=True, slots=True)
class PutResult:
    """Where a put landed."""

    status: PutStatus
    msg_id: str
    offset_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_timestamp: int
    store_size: int


@dataclass(frozen=True, slots=True)
class PackedPutResult:
    """Where a packed batch landed: one queue, consecutive offsets, no object per message."""

    status: PutStatus
    topic: str
    queue_id: int
    first_queue_offset: int
    count: int
    store_timestamp: int
    #: The log offset just past the last record (what a SYNC_FLUSH waiter waits for).
    end_offset: int
    #: ``count`` little-endian int64 commit-log offsets, one per message.
    offsets: bytes


@dataclass(frozen=True, slots=True)
class GetResult:
    """What a get found, and where the next get should start."""

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PackedGetResult:
    """What a packed get found: the records back to back (``data``), ``count`` of them."""

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    count: int = 0
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class AppendNote:
    """What an append is, for the listeners that care (the broker's trace): passed through untouched.

    ``kind`` names the origin (e.g. ``"send"``, ``"redeliver"``, ``"half"``); ``topic`` is the
    topic the producer addressed when the record went elsewhere (a parked or half message);
    ``status`` and ``detail`` are free text for the trace.
    """

    kind: str
    topic: str | None = None
    status: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class AppendEvent:
    """One append, as the store tells its listeners once the records are readable (before any flush wait).

    A slave's replicated append (:meth:`MessageStore.append_replicated`) gives one event per queue it
    wrote to, with ``replicated`` True and nothing else: no results, messages, note or packed result
    (the master told its own listeners about them; the trace records nothing for a note-less event).
    """

    topic: str
    queue_id: int
    #: One per message; empty for a packed append (see ``packed``).
    results: Sequence[PutResult]
    #: The messages as appended (None for a packed append, which has no message objects).
    messages: Sequence[Message] | None
    born_timestamp: int | None
    note: AppendNote | None = None
    #: A packed append's result (offsets packed), with ``data`` the packed batch as sent.
    packed: PackedPutResult | None = None
    data: bytes | memoryview | None = None
    #: Records a slave copied from its master: the queue has new messages, nothing more is said.
    replicated: bool = False


@dataclass(frozen=True, slots=True)
class LogOffsets:
    """The commit log's bounds: the oldest retained byte, the end, and how far it is flushed; and the
    visibility limit of consumer reads (a Raft group's commit index, ``MessageStore.set_visible_offset``)."""

    min_offset: int
    max_offset: int
    flushed_offset: int
    #: Consumers see the records below it; None: no limit (the whole log).
    visible_offset: int | None = None


class AppendGate(Protocol):
    """Who may append to a store, and who is told where each append ended (a DLedger member's Raft log).

    With a gate set (:meth:`MessageStore.set_append_gate`) every local append (``put``, ``put_batch``,
    ``put_packed``) runs holding ``lock``: ``admit()`` first (it raises ``SparkMQError`` to refuse, and
    returns a token), then the append, then ``appended(token, end_offset)``.  So appends are told in log
    order, and whoever else takes ``lock`` (a follower's replicated append or truncation) never runs
    beside one.
    """

    #: Held around admit, append and appended; re-entrant, so the gate may append while holding it.
    lock: threading.RLock

    def admit(self) -> int:
        """Allow one append (a token, e.g. the Raft term it belongs to) or raise ``SparkMQError``."""
        ...

    def appended(self, token: int, end_offset: int) -> None:
        """The admitted append ended at log offset ``end_offset``."""
        ...

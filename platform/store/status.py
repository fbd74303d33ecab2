"""Status values of the hot path (returned, not raised), and the result objects."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..common.message import StoredMessage

__all__ = ["PutStatus", "GetStatus", "PutResult", "GetResult"]


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
    #: Set by the broker, never by the store: an admin reset the pulling group's offset on this queue;
    #: next_offset is the new offset, where the consumer restarts (nothing was read).
    OFFSET_RESET = "OFFSET_RESET"


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
class GetResult:
    """What a get found, and where the next get should start."""

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = field(default_factory=list)

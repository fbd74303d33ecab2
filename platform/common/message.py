"""The message model: what producers send and what the store hands back."""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Any

from .codec import decode_properties, unpack_host
from .errors import ErrorCode, SparkMQError
from .ids import encode_offset_msg_id
from .validation import check_int

__all__ = ["Message", "MessageQueue", "StoredMessage", "SendResult", "SendStatus", "send_status", "PROPERTY_TAGS",
           "PROPERTY_KEYS", "PROPERTY_UNIQUE_ID", "KEY_SEPARATOR", "BODY_TYPES"]

#: Reserved property names (RocketMQ's spelling, so its users recognise them).
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQUE_ID = "UNIQ_KEY"
#: KEYS holds several keys separated by spaces.
KEY_SEPARATOR = " "
#: What a message body may be (a tuple: ``isinstance`` with it is cheaper than with a ``|`` union made per call).
BODY_TYPES = (bytes, bytearray, memoryview)


class SendStatus(enum.StrEnum):
    """A stored send's outcome (RocketMQ's ``SendStatus``); the message is stored in all four cases."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(slots=True)
class Message:
    """A message to send: a topic, a body, and optional tag, keys and user properties."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0


@dataclass(slots=True)
class StoredMessage:
    """A message as stored: the sent fields plus where and when it was stored."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_size: int
    body: bytes
    properties: dict[str, str]
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_offset: int
    tag_hash: int
    body_crc: int

    @classmethod
    def from_decoded(cls, decoded: tuple) -> StoredMessage:
        """Build from ``storage_native.decode_record``'s tuple."""
        (total, crc, queue_id, flag, queue_offset, clog, sys_flag, born_ts, born_host, store_ts,
         store_host, reconsume, prepared, tag_hash, body, topic, props) = decoded
        return cls(topic=topic, queue_id=queue_id, queue_offset=queue_offset, commitlog_offset=clog,
                   store_size=total, body=body, properties=decode_properties(props), flag=flag,
                   sys_flag=sys_flag, born_timestamp=born_ts, born_host=unpack_host(born_host),
                   store_timestamp=store_ts, store_host=unpack_host(store_host), reconsume_times=reconsume,
                   prepared_offset=prepared, tag_hash=tag_hash, body_crc=crc)

    @property
    def tags(self) -> str | None:
        """The message's tag, if any."""
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        """The message's keys (space-separated in the KEYS property)."""
        raw = self.properties.get(PROPERTY_KEYS, "")
        return tuple(k for k in raw.split(KEY_SEPARATOR) if k)

    @property
    def msg_id(self) -> str:
        """The unique id given by the producer (or by the store when the producer gave none)."""
        return self.properties.get(PROPERTY_UNIQUE_ID, "")

    @property
    def offset_msg_id(self) -> str:
        """The id that decodes to this message's store host and commit-log offset."""
        return encode_offset_msg_id(self.store_host or "0.0.0.0:0", self.commitlog_offset)


def _invalid_queue(message: str) -> SparkMQError:
    return SparkMQError(ErrorCode.INVALID_ARGUMENT, message)


@total_ordering
@dataclass(frozen=True)
class MessageQueue:
    """One queue of a topic on one broker; immutable, hashable and ordered.

    Ordering is by ``(broker_name, queue_id, topic)`` rather than field order, so the
    sorted view groups each broker's queues together in queue-id order (contiguous
    blocks in ``averagely`` then stay on as few brokers as possible).

    Example:
        >>> q = MessageQueue("orders", "broker-b", 0)
        >>> q.key
        'broker-b/0'
        >>> sorted([q, MessageQueue("orders", "broker-a", 3)])[0].broker_name
        'broker-a'
    """

    topic: str
    broker_name: str
    queue_id: int

    def __post_init__(self) -> None:
        # Queues come from name server routes and HTTP bodies; reject junk early so a
        # bad view fails loudly instead of producing a silently different assignment.
        if not isinstance(self.topic, str) or not self.topic:
            raise _invalid_queue(f"topic must be a non-empty string, got {self.topic!r}")
        if not isinstance(self.broker_name, str) or not self.broker_name:
            raise _invalid_queue(f"broker_name must be a non-empty string, got {self.broker_name!r}")
        check_int("queue_id", self.queue_id, 0)

    @property
    def key(self) -> str:
        """``"broker/queue_id"``, e.g. ``"broker-a/3"``."""
        return f"{self.broker_name}/{self.queue_id}"

    def _sort_key(self) -> tuple[str, int, str]:
        return (self.broker_name, self.queue_id, self.topic)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageQueue):
            return NotImplemented
        return self._sort_key() < other._sort_key()


@dataclass(slots=True)
class SendResult:
    """Where one sent message was stored and under which ids (the broker's answer and the producer's result).

    Read-only by convention; not frozen, because a batch makes one per message and a frozen dataclass
    costs three times as much to build.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    store_timestamp: int = 0
    #: The record's commit-log offset on its broker (the broker knows it; not on the wire: -1 at clients).
    commitlog_offset: int = -1

    @property
    def message_queue(self) -> MessageQueue:
        """The queue the message went to."""
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of ``POST /topics/{topic}/messages``."""
        return {"status": str(self.status), "msg_id": self.msg_id, "offset_msg_id": self.offset_msg_id,
                "topic": self.topic, "broker_name": self.broker_name, "queue_id": self.queue_id,
                "queue_offset": self.queue_offset, "store_timestamp": self.store_timestamp}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SendResult:
        """From a broker's send answer; INTERNAL_ERROR for a status this client does not know."""
        return cls(send_status(data.get("status")), str(data.get("msg_id", "")), str(data.get("offset_msg_id", "")),
                   str(data["topic"]), str(data["broker_name"]), int(data["queue_id"]), int(data["queue_offset"]),
                   int(data.get("store_timestamp") or 0))


def send_status(value: object) -> SendStatus:
    """A send status from the wire; INTERNAL_ERROR when unknown."""
    try:
        return SendStatus(str(value))
    except ValueError:
        raise SparkMQError(ErrorCode.INTERNAL_ERROR, f"unknown send status {value!r}") from None

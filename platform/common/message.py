"""The message model: what producers send and what the store hands back."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .codec import decode_properties, unpack_host
from .ids import encode_offset_msg_id

__all__ = ["Message", "StoredMessage", "SendStatus", "PROPERTY_TAGS", "PROPERTY_KEYS", "PROPERTY_UNIQUE_ID",
           "KEY_SEPARATOR"]

#: Reserved property names (RocketMQ's spelling, so its users recognise them).
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQUE_ID = "UNIQ_KEY"
#: KEYS holds several keys separated by spaces.
KEY_SEPARATOR = " "


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

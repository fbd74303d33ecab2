"""How messages travel over HTTP: JSON objects and Arrow IPC streams.

Both the broker (which encodes) and the client and Spark source (which decode) use
this module, so the two sides cannot drift.  The contract is written down in
``docs/http-api.md``.

* JSON: bodies are base64 (``body``); every other field is plain JSON.
* Arrow: ``application/vnd.apache.arrow.stream``; pulls answer :data:`PULL_SCHEMA`,
  batch sends accept :data:`SEND_SCHEMA`.  Pull metadata (status, next/min/max
  offsets) travels in the ``X-Pull-*`` response headers.

A body the producer compressed (``sys_flag & COMPRESSED``) stays compressed on the
wire; :func:`received_from_json` and :func:`received_from_arrow` inflate it.
"""
from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .errors import ErrorCode, SparkMQError
from .message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, StoredMessage
from .sysflag import COMPRESSED
from .system_topics import PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC, RETRY_PREFIX

__all__ = [
    "ARROW_STREAM",
    "PULL_SCHEMA",
    "SEND_SCHEMA",
    "PULL_HEADERS",
    "ReceivedMessage",
    "SendRow",
    "encode_body",
    "decode_body",
    "inflate",
    "stored_to_json",
    "received_from_json",
    "stored_to_arrow",
    "received_from_arrow",
    "send_rows_to_arrow",
    "send_rows_from_arrow",
    "to_ipc",
    "from_ipc",
]

#: The media type of Arrow IPC streams in both directions.
ARROW_STREAM = "application/vnd.apache.arrow.stream"

#: Response headers that carry a pull's metadata when the body is Arrow.
PULL_HEADERS = {
    "status": "X-Pull-Status",
    "next_offset": "X-Pull-Next-Offset",
    "min_offset": "X-Pull-Min-Offset",
    "max_offset": "X-Pull-Max-Offset",
    # "records" (RECORDS_SCHEMA: stored records, for the reader to decode) or "rows" (PULL_SCHEMA)
    "form": "X-Pull-Form",
}

_PROPERTIES = pa.map_(pa.string(), pa.string())

#: One row per pulled message.  ``keys`` is the raw space-separated KEYS property.
PULL_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("broker_name", pa.string(), nullable=False),
    pa.field("queue_id", pa.int32(), nullable=False),
    pa.field("queue_offset", pa.int64(), nullable=False),
    pa.field("msg_id", pa.string(), nullable=False),
    pa.field("offset_msg_id", pa.string(), nullable=False),
    pa.field("commitlog_offset", pa.int64(), nullable=False),
    pa.field("store_size", pa.int32(), nullable=False),
    pa.field("body", pa.binary(), nullable=False),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.string()),
    pa.field("properties", _PROPERTIES),
    pa.field("born_timestamp", pa.int64(), nullable=False),
    pa.field("born_host", pa.string(), nullable=False),
    pa.field("store_timestamp", pa.int64(), nullable=False),
    pa.field("store_host", pa.string(), nullable=False),
    pa.field("reconsume_times", pa.int32(), nullable=False),
    pa.field("sys_flag", pa.int32(), nullable=False),
])

#: One row per message of an Arrow batch send.  ``keys`` is space-separated.
SEND_SCHEMA = pa.schema([
    pa.field("body", pa.binary(), nullable=False),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.string()),
    pa.field("properties", _PROPERTIES),
])


@dataclass(slots=True)
class ReceivedMessage:
    """A message as a consumer sees it: the body inflated, the location and ids attached."""

    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    msg_id: str
    offset_msg_id: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    sys_flag: int = 0
    commitlog_offset: int = 0
    store_size: int = 0

    @property
    def user_properties(self) -> dict[str, str]:
        """Properties without the reserved ones the fields above already show."""
        return {k: v for k, v in self.properties.items() if k not in _RESERVED}

    def restore_retry_origin(self) -> None:
        """Show a message read from ``%RETRY%<group>`` with its original topic and reconsume count (what a
        consumer's listener sees, as in RocketMQ); other messages are left as they are."""
        if self.topic.startswith(RETRY_PREFIX):
            real = self.properties.get(PROPERTY_RETRY_TOPIC)
            if real:
                self.topic = real
        if not self.reconsume_times:
            text = self.properties.get(PROPERTY_RECONSUME_TIME)
            if text and text.isdigit():
                self.reconsume_times = int(text)


_RESERVED = frozenset({PROPERTY_TAGS, PROPERTY_KEYS, "UNIQ_KEY"})


@dataclass(slots=True)
class SendRow:
    """One message of a batch send as it arrives over the wire (before validation)."""

    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)


# -- bodies -----------------------------------------------------------------------------

def encode_body(body: bytes) -> str:
    """Base64 text of ``body`` for a JSON field."""
    return base64.b64encode(body).decode("ascii")


def decode_body(text: object, encoding: str = "base64") -> bytes:
    """Bytes of a JSON ``body`` field in ``encoding`` ("base64" or "utf8"); MESSAGE_ILLEGAL if it is not."""
    if not isinstance(text, str):
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the body must be a string, got {type(text).__name__}")
    if encoding == "utf8":
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the body is not valid Unicode: {exc.reason}") from None
    if encoding != "base64":
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"body_encoding must be 'utf8' or 'base64', got {encoding!r}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the body is not valid base64: {exc}") from None


def inflate(body: bytes, sys_flag: int) -> bytes:
    """The body as the producer gave it: zlib-inflated when COMPRESSED is set."""
    if sys_flag & COMPRESSED:
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"a compressed body does not inflate: {exc}") from None
    return body


def _split_keys(raw: str | None) -> tuple[str, ...]:
    return tuple(k for k in raw.split(KEY_SEPARATOR) if k) if raw else ()


# -- pulls: JSON ------------------------------------------------------------------------

def stored_to_json(message: StoredMessage, broker_name: str) -> dict[str, Any]:
    """The JSON object a pull returns for one stored message (body base64, still compressed if it was)."""
    props = message.properties
    return {
        "topic": message.topic, "broker_name": broker_name, "queue_id": message.queue_id,
        "queue_offset": message.queue_offset, "msg_id": message.msg_id, "offset_msg_id": message.offset_msg_id,
        "commitlog_offset": message.commitlog_offset, "store_size": message.store_size,
        "body": encode_body(message.body), "tags": props.get(PROPERTY_TAGS), "keys": list(message.keys),
        "properties": dict(props), "born_timestamp": message.born_timestamp, "born_host": message.born_host,
        "store_timestamp": message.store_timestamp, "store_host": message.store_host,
        "reconsume_times": message.reconsume_times, "sys_flag": message.sys_flag,
    }


def received_from_json(obj: Mapping[str, Any]) -> ReceivedMessage:
    """Inverse of :func:`stored_to_json`, with the body inflated."""
    sys_flag = int(obj.get("sys_flag", 0))
    return ReceivedMessage(
        topic=obj["topic"], broker_name=obj["broker_name"], queue_id=int(obj["queue_id"]),
        queue_offset=int(obj["queue_offset"]), msg_id=obj.get("msg_id", ""),
        offset_msg_id=obj.get("offset_msg_id", ""), body=inflate(decode_body(obj["body"]), sys_flag),
        tags=obj.get("tags"), keys=tuple(obj.get("keys") or ()), properties=dict(obj.get("properties") or {}),
        born_timestamp=int(obj.get("born_timestamp", 0)), born_host=obj.get("born_host", ""),
        store_timestamp=int(obj.get("store_timestamp", 0)), store_host=obj.get("store_host", ""),
        reconsume_times=int(obj.get("reconsume_times", 0)), sys_flag=sys_flag,
        commitlog_offset=int(obj.get("commitlog_offset", 0)), store_size=int(obj.get("store_size", 0)))


# -- pulls: Arrow -----------------------------------------------------------------------

def stored_to_arrow(messages: Sequence[StoredMessage], broker_name: str) -> pa.RecordBatch:
    """One record batch of :data:`PULL_SCHEMA` for ``messages`` (possibly empty)."""
    props = [m.properties for m in messages]
    columns = [
        [m.topic for m in messages], [broker_name] * len(messages), [m.queue_id for m in messages],
        [m.queue_offset for m in messages], [p.get("UNIQ_KEY", "") for p in props],
        [m.offset_msg_id for m in messages], [m.commitlog_offset for m in messages],
        [m.store_size for m in messages], [m.body for m in messages], [p.get(PROPERTY_TAGS) for p in props],
        [p.get(PROPERTY_KEYS) for p in props], [list(p.items()) for p in props],
        [m.born_timestamp for m in messages], [m.born_host for m in messages],
        [m.store_timestamp for m in messages], [m.store_host for m in messages],
        [m.reconsume_times for m in messages], [m.sys_flag for m in messages],
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, PULL_SCHEMA, strict=True)], schema=PULL_SCHEMA)


#: The PULL_SCHEMA columns in the order of ReceivedMessage's fields (what decode_records' factory is given).
_RECEIVED_ORDER = ("topic", "broker_name", "queue_id", "queue_offset", "msg_id", "offset_msg_id", "body", "tags",
                   "keys", "properties", "born_timestamp", "born_host", "store_timestamp", "store_host",
                   "reconsume_times", "sys_flag", "commitlog_offset", "store_size")
assert sorted(_RECEIVED_ORDER) == sorted(PULL_SCHEMA.names)


def received_from_arrow(table: pa.Table | pa.RecordBatch) -> list[ReceivedMessage]:
    """The messages of a pull answered in Arrow, bodies inflated.

    Converted column by column (one ``to_pylist`` a column, not a dict a row): the rows of
    ``record_columns.decode_records`` come back as the messages ``storage_native.decode_records``
    makes of the same records (a test holds it).
    """
    columns = [table.column(name).to_pylist() for name in _RECEIVED_ORDER]
    return [ReceivedMessage(topic, broker_name, queue_id, queue_offset, msg_id, offset_msg_id,
                            inflate(body, sys_flag) if sys_flag & COMPRESSED else body, tags, _split_keys(keys),
                            dict(properties) if properties else {}, born_ts, born_host, store_ts, store_host,
                            reconsume, sys_flag, clog_offset, store_size)
            for (topic, broker_name, queue_id, queue_offset, msg_id, offset_msg_id, body, tags, keys, properties,
                 born_ts, born_host, store_ts, store_host, reconsume, sys_flag, clog_offset, store_size)
            in zip(*columns, strict=True)]


# -- batch sends: Arrow -----------------------------------------------------------------

def send_rows_to_arrow(rows: Iterable[SendRow]) -> pa.RecordBatch:
    """A record batch of :data:`SEND_SCHEMA` for a batch send."""
    rows = list(rows)
    return pa.RecordBatch.from_arrays([
        pa.array([r.body for r in rows], type=pa.binary()),
        pa.array([r.tags for r in rows], type=pa.string()),
        pa.array([KEY_SEPARATOR.join(r.keys) if r.keys else None for r in rows], type=pa.string()),
        pa.array([list(r.properties.items()) for r in rows], type=_PROPERTIES),
    ], schema=SEND_SCHEMA)


def send_rows_from_arrow(table: pa.Table) -> list[SendRow]:
    """Rows of an Arrow batch send; MESSAGE_ILLEGAL when a required column is missing or mistyped.

    Only ``body`` is required; ``tags``, ``keys`` and ``properties`` may be absent.
    ``body`` may be binary or string (UTF-8).
    """
    try:  # every buffer, offset and UTF-8 string checked: a mutated stream reads "fine" and fails in to_pylist
        table.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the Arrow batch is malformed: {exc}") from None
    names = set(table.column_names)
    if "body" not in names:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                           f"the Arrow batch has no 'body' column (columns: {sorted(names)})")
    unknown = names - set(SEND_SCHEMA.names)
    if unknown:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"unknown columns in the Arrow batch: {sorted(unknown)}")
    body_type = table.schema.field("body").type
    if not (pa.types.is_binary(body_type) or pa.types.is_large_binary(body_type)
            or pa.types.is_string(body_type) or pa.types.is_large_string(body_type)):
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the 'body' column must be binary or string, not {body_type}")
    for name in ("tags", "keys"):
        if name in names and not pa.types.is_string(table.schema.field(name).type):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the {name!r} column must be string")
    if "properties" in names and not pa.types.is_map(table.schema.field("properties").type):
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the 'properties' column must be map<string, string>")
    rows: list[SendRow] = []
    for i, row in enumerate(table.to_pylist()):
        body = row["body"]
        if body is None:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"message {i}: the body is null")
        if isinstance(body, str):
            body = body.encode("utf-8")
        rows.append(SendRow(body=body, tags=row.get("tags"), keys=_split_keys(row.get("keys")),
                            properties=dict(row.get("properties") or ())))
    return rows


# -- IPC --------------------------------------------------------------------------------

def to_ipc(batch: pa.RecordBatch | pa.Table) -> bytes:
    """An Arrow IPC stream holding ``batch``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    """The table in an Arrow IPC stream; MESSAGE_ILLEGAL when ``data`` is not one."""
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the body is not an Arrow IPC stream: {exc}") from None

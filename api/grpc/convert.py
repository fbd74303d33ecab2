"""Conversions between RocketMQ v2 protobuf messages and sparkmq's message model.

One mapping each way, so a message sent over gRPC looks the same to every other consumer (remoting,
HTTP, the lake) and the other way round:

=====================  ==========================================================
v2 (SystemProperties)   sparkmq record
=====================  ==========================================================
tag                     ``TAGS`` (the message's tag)
keys                    ``KEYS`` (space-separated)
message_id              ``UNIQ_KEY`` (the producer's id)
message_group           ``SHARDING_KEY`` (and the queue: a stable hash of it)
delivery_timestamp      a timer message (``TIMER_DELIVER_MS`` while parked)
born_timestamp / host   the record's born timestamp / host
user_properties         the record's other properties, as they are
=====================  ==========================================================

Namespaces (``x-mq-namespace``) wrap names as RocketMQ does: ``<namespace>%<name>``.
"""
from __future__ import annotations

import base64
import hashlib
import ipaddress
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from ...platform.broker.processors import OutgoingMessage
from ...platform.broker.transaction import CheckRequest
from ...platform.common import message as _message
from ...platform.common import system_topics as _system
from ...platform.common.errors import ErrorCode, SparkMQError
from ...platform.common.ids import UniqueIdGenerator
from ...platform.common.message import KEY_SEPARATOR, PROPERTY_UNIQUE_ID, StoredMessage
from ...platform.common.sysflag import COMPRESSED
from ...platform.common.validation import split_addr
from ...storage_native import StoreError, encode_batch, pack_v2_send, v2_send_summary
from ._pb import Code, MessageType, definition

__all__ = ["ProtocolError", "status_ok", "status_of", "code_of", "wrap", "unwrap", "to_outgoing", "SendPlan",
           "PackedSend", "pack_plain", "pack_request",
           "to_v2_message", "check_to_v2_message", "endpoints_of", "millis_of", "duration_ms", "timestamp_of",
           "duration_of", "SYSTEM_PROPERTIES", "ALL_MESSAGE_TYPES"]

#: Message types a sparkmq topic accepts (topics carry no type: each is RocketMQ's MIXED).
ALL_MESSAGE_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)

#: Property names the platform sets itself: never user properties on the way out, refused on the way in.
SYSTEM_PROPERTIES = frozenset(
    getattr(module, name) for module in (_message, _system) for name in module.__all__ if name.startswith("PROPERTY_"))

#: The namespace separator RocketMQ's NamespaceUtil uses.
_NAMESPACE_SEPARATOR = "%"

#: Each stable sparkmq error code as a v2 status code (one table; anything else is INTERNAL_ERROR).
_CODES: dict[ErrorCode, int] = {
    ErrorCode.INVALID_ARGUMENT: Code.BAD_REQUEST,
    ErrorCode.TOPIC_ILLEGAL: Code.ILLEGAL_TOPIC,
    ErrorCode.GROUP_ILLEGAL: Code.ILLEGAL_CONSUMER_GROUP,
    ErrorCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ErrorCode.MESSAGE_TOO_LARGE: Code.MESSAGE_BODY_TOO_LARGE,
    ErrorCode.PROPERTIES_TOO_LARGE: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    ErrorCode.QUEUE_ID_ILLEGAL: Code.BAD_REQUEST,
    ErrorCode.OFFSET_ILLEGAL: Code.ILLEGAL_OFFSET,
    ErrorCode.MESSAGE_ID_ILLEGAL: Code.ILLEGAL_MESSAGE_ID,
    ErrorCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ErrorCode.MESSAGE_NOT_FOUND: Code.MESSAGE_NOT_FOUND,
    ErrorCode.NO_PERMISSION: Code.FORBIDDEN,
    ErrorCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ErrorCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    ErrorCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ErrorCode.FILTER_EXPRESSION_ILLEGAL: Code.ILLEGAL_FILTER_EXPRESSION,
    ErrorCode.TRANSACTION_NOT_FOUND: Code.INVALID_TRANSACTION_ID,
    ErrorCode.GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    # Overloaded (platform/broker/overload.py): RocketMQ's proxy answers its SYSTEM_BUSY so, and its v5 clients
    # back off and retry it.
    ErrorCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
}
# The POP codes (helper-17's section of errors.py) when present.
for _name, _code in (("INVALID_RECEIPT_HANDLE", Code.INVALID_RECEIPT_HANDLE),
                     ("INVISIBLE_TIME_ILLEGAL", Code.ILLEGAL_INVISIBLE_TIME)):
    if hasattr(ErrorCode, _name):
        _CODES[ErrorCode[_name]] = _code


class ProtocolError(Exception):
    """A request the v2 protocol refuses with a code of its own (no sparkmq equivalent), e.g.
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE; answered in the response's status like a SparkMQError."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


def code_of(exc: BaseException) -> int:
    """The v2 status code answering ``exc``."""
    if isinstance(exc, ProtocolError):
        return exc.code
    if isinstance(exc, SparkMQError):
        return _CODES.get(exc.code, Code.INTERNAL_ERROR)
    return Code.INTERNAL_ERROR


def status_ok() -> definition.Status:
    """Status OK (20000)."""
    return definition.Status(code=Code.OK, message="OK")


def status_of(exc: BaseException) -> definition.Status:
    """The v2 status of a refused request: its code and a message naming what was wrong."""
    if isinstance(exc, ProtocolError | SparkMQError):
        text = exc.message if isinstance(exc, ProtocolError) else str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    return definition.Status(code=code_of(exc), message=text)


# -- names ---------------------------------------------------------------------------------------------
def wrap(namespace: str, name: str) -> str:
    """``name`` inside ``namespace`` (RocketMQ's ``namespace%name``); unchanged without a namespace."""
    if not namespace or name.startswith(namespace + _NAMESPACE_SEPARATOR):
        return name
    return f"{namespace}{_NAMESPACE_SEPARATOR}{name}"


def unwrap(namespace: str, name: str) -> str:
    """``name`` without its ``namespace%`` prefix (what a client of that namespace calls it)."""
    prefix = namespace + _NAMESPACE_SEPARATOR
    return name[len(prefix):] if namespace and name.startswith(prefix) else name


# -- recall handles -----------------------------------------------------------------------------------
def recall_handle(broker_name: str, msg_id: str) -> str:
    """The handle a DELAY message's send answers: names the broker holding the timer and the message."""
    return base64.urlsafe_b64encode(f"{broker_name}\n{msg_id}".encode()).decode()


def parse_recall_handle(handle: str) -> tuple[str, str]:
    """(broker name, msg id) of a recall handle; BAD_REQUEST when it is not one this broker wrote."""
    try:
        broker_name, msg_id = base64.urlsafe_b64decode(handle.encode()).decode().split("\n")
    except (ValueError, UnicodeError):
        raise ProtocolError(Code.BAD_REQUEST, "malformed recall handle") from None
    if not broker_name or not msg_id:
        raise ProtocolError(Code.BAD_REQUEST, "malformed recall handle")
    return broker_name, msg_id


# -- time ------------------------------------------------------------------------------------------------
def millis_of(ts: Timestamp) -> int:
    """Epoch milliseconds of a protobuf Timestamp."""
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def duration_ms(d: Duration) -> int:
    """Milliseconds of a protobuf Duration."""
    return d.seconds * 1000 + d.nanos // 1_000_000


def timestamp_of(ms: int) -> Timestamp:
    """A protobuf Timestamp of epoch milliseconds."""
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_of(ms: int) -> Duration:
    """A protobuf Duration of milliseconds."""
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def endpoints_of(addr: str) -> definition.Endpoints:
    """``host:port`` as v2 Endpoints (IPv4/IPv6 for IP literals, else DOMAIN_NAME)."""
    host, port = split_addr(addr)
    try:
        scheme = (definition.AddressScheme.IPv6 if ipaddress.ip_address(host).version == 6
                  else definition.AddressScheme.IPv4)
    except ValueError:
        scheme = definition.AddressScheme.DOMAIN_NAME
    return definition.Endpoints(scheme=scheme, addresses=[definition.Address(host=host, port=port)])


# -- into sparkmq ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SendPlan:
    """One v2 message as the send processor takes it."""

    topic: str
    message: OutgoingMessage
    message_type: int
    #: FIFO: the message group (queue = a stable hash of it).
    message_group: str | None
    #: DELAY: when to deliver (epoch ms).
    deliver_at_ms: int | None
    born_timestamp: int | None


def _message_type(sp: definition.SystemProperties) -> int:
    """The declared type, checked against the properties that make a type (a client derives it from them)."""
    has_group = sp.HasField("message_group") and bool(sp.message_group)
    has_delivery = sp.HasField("delivery_timestamp")
    declared = sp.message_type
    if declared == MessageType.MESSAGE_TYPE_UNSPECIFIED:
        declared = MessageType.FIFO if has_group else MessageType.DELAY if has_delivery else MessageType.NORMAL
    if declared not in ALL_MESSAGE_TYPES:
        raise ProtocolError(Code.UNSUPPORTED, f"message type {MessageType.Name(declared)} is not supported")
    wanted = {MessageType.FIFO: (True, False), MessageType.DELAY: (False, True)}.get(declared, (False, False))
    if (has_group, has_delivery) != wanted:
        raise ProtocolError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                            f"a {MessageType.Name(declared)} message "
                            f"{'needs' if wanted[0] else 'cannot have'} a message_group and "
                            f"{'needs' if wanted[1] else 'cannot have'} a delivery_timestamp")
    return declared


def _body(msg: definition.Message, max_body: int) -> bytes:
    body = msg.body
    encoding = msg.system_properties.body_encoding
    if encoding == definition.Encoding.GZIP:
        try:
            body = zlib.decompressobj(wbits=31).decompress(body, max_body + 1)  # gzip; never past the limit
        except zlib.error as exc:
            raise ProtocolError(Code.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {exc}") from None
    elif encoding not in (definition.Encoding.IDENTITY, definition.Encoding.ENCODING_UNSPECIFIED):
        raise ProtocolError(Code.UNSUPPORTED, f"body encoding {encoding} is not supported")
    if not body:
        raise ProtocolError(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    if len(body) > max_body:
        raise ProtocolError(Code.MESSAGE_BODY_TOO_LARGE, f"the body is over the limit of {max_body} bytes")
    return body


def to_outgoing(msg: definition.Message, namespace: str, max_body: int) -> SendPlan:
    """A v2 message as a :class:`SendPlan` (ProtocolError / SparkMQError naming what is wrong)."""
    sp = msg.system_properties
    if not msg.topic.name:
        raise ProtocolError(Code.ILLEGAL_TOPIC, "the message names no topic")
    message_type = _message_type(sp)
    properties = dict(msg.user_properties)
    for key in properties:
        if key in SYSTEM_PROPERTIES:
            raise ProtocolError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {key!r} is a reserved name")
    for key in sp.keys:
        if not key or any(c.isspace() for c in key):
            raise ProtocolError(Code.ILLEGAL_MESSAGE_KEY, f"message key {key!r} is empty or has white space")
    group = sp.message_group if message_type == MessageType.FIFO else None
    if group is not None:
        properties[_system.PROPERTY_SHARDING_KEY] = group
    outgoing = OutgoingMessage(_body(msg, max_body), sp.tag if sp.HasField("tag") and sp.tag else None,
                               tuple(sp.keys), properties, sp.message_id or None)
    deliver = millis_of(sp.delivery_timestamp) if message_type == MessageType.DELAY else None
    born = millis_of(sp.born_timestamp) if sp.HasField("born_timestamp") else None
    return SendPlan(wrap(namespace, msg.topic.name), outgoing, message_type, group, deliver, born or None)


# -- into sparkmq, packed (the hot path) ----------------------------------------------------------------
#: Declared types and body encodings :func:`pack_plain` takes (anything else goes through :func:`to_outgoing`).
_PLAIN_TYPES = frozenset((MessageType.MESSAGE_TYPE_UNSPECIFIED, MessageType.NORMAL))
_PLAIN_ENCODINGS = frozenset((definition.Encoding.ENCODING_UNSPECIFIED, definition.Encoding.IDENTITY))


class _Packable(NamedTuple):
    """What ``encode_batch`` reads of a message (its attributes), without a dataclass per message."""

    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    flag: int


@dataclass(frozen=True, slots=True)
class PackedSend:
    """A request's NORMAL messages of one topic, packed for ``SendProcessor.send_packed`` (docs/remoting.md)."""

    topic: str
    data: bytes
    #: The messages' ids in order (the producer's, or made here when it sent none).
    msg_ids: list[str]


def _bad_key(key: str) -> bool:
    return not key or any(c.isspace() for c in key)


def pack_plain(messages: Sequence[definition.Message], namespace: str, max_body: int,
               ids: UniqueIdGenerator) -> PackedSend | None:
    """``messages`` packed in one native call when each is a plain NORMAL message of the first's topic
    that :func:`to_outgoing` would take unchanged; None otherwise (another type, topic or encoding, or
    anything to refuse): the caller then takes the per-message path, which names what is wrong.

    Why: one Python object per message (SendPlan, OutgoingMessage, the store's Message) cost more than
    the gRPC transport itself; this reads each protobuf once and lets the native encoder and the
    store's packed append do the rest, as remoting's SEND_BATCH does.  The properties are the same as
    :func:`to_outgoing`'s (TAGS, KEYS, UNIQ_KEY, the user's); every entry's born timestamp is the first
    message's, as the per-message batch path stores it.
    """
    first = messages[0]
    name, resource_ns = first.topic.name, first.topic.resource_namespace
    if not name:
        return None
    wire: list[_Packable] = []
    append = wire.append
    # Why the guards before dict()/tuple(): converting an empty protobuf map or list costs as much as the rest.
    for msg in messages:
        topic = msg.topic
        sp = msg.system_properties
        if (topic.name != name or topic.resource_namespace != resource_ns or sp.message_type not in _PLAIN_TYPES
                or sp.body_encoding not in _PLAIN_ENCODINGS or sp.HasField("message_group")
                or sp.HasField("delivery_timestamp")):
            return None
        body = msg.body
        if not body or len(body) > max_body:
            return None
        user = msg.user_properties
        properties = dict(user) if user else {}
        if properties and not SYSTEM_PROPERTIES.isdisjoint(properties):
            return None
        keys = sp.keys
        keys = tuple(keys) if keys else ()
        if keys and any(_bad_key(k) for k in keys):
            return None
        msg_id = sp.message_id
        if msg_id:
            properties[PROPERTY_UNIQUE_ID] = msg_id
        append(_Packable(body, sp.tag or None, keys, properties, 0))
    born = millis_of(first.system_properties.born_timestamp) or int(time.time() * 1000)
    if born < 0:
        return None
    try:
        data, msg_ids, _ = ids.with_state(born, lambda prefix, month, counter: encode_batch(
            wire, prefix, month, counter, born))
    except (StoreError, OverflowError):  # the per-message path refuses it with the v2 code and message
        return None
    return PackedSend(wrap(namespace or resource_ns, name), data, msg_ids)


#: The reserved property names as pack_v2_send takes them (NUL-separated UTF-8).
_RESERVED_NAMES = b"\0".join(sorted(name.encode() for name in SYSTEM_PROPERTIES))


def pack_request(raw: bytes, namespace: str, max_body: int, ids: UniqueIdGenerator) -> PackedSend | None:
    """:func:`pack_plain` straight from a serialized SendMessageRequest, in C (no protobuf objects at all).

    None when the C extension is not in use, for a single message (its trace is a per-message ``store``
    record), and for anything :func:`pack_plain` would not take or that C leaves to it (non-ASCII keys, a
    repeated property name, a malformed request): the caller then parses the request and goes on as before.
    """
    if pack_v2_send is None or v2_send_summary is None:
        return None
    count, born = v2_send_summary(raw)
    if count < 2:
        return None
    born = born or int(time.time() * 1000)
    if born < 0:
        return None
    packed = ids.with_state(born, lambda prefix, month, counter: pack_v2_send(
        raw, max_body, _RESERVED_NAMES, prefix, month, counter, born))
    if packed[0] is None:
        return None
    name, resource_ns, data, msg_ids, _ = packed
    return PackedSend(wrap(namespace or resource_ns, name), data, msg_ids)


# -- out of sparkmq --------------------------------------------------------------------------------------
def _type_of(properties: Mapping[str, str]) -> int:
    if properties.get(_system.PROPERTY_TRANSACTION_PREPARED) == "true":
        return MessageType.TRANSACTION
    if properties.get(_system.PROPERTY_SHARDING_KEY):
        return MessageType.FIFO
    if _system.PROPERTY_TIMER_DELIVER_MS in properties:
        return MessageType.DELAY
    return MessageType.NORMAL


def _fill(out: definition.Message, topic: str, namespace: str, body: bytes, properties: Mapping[str, str],
          message_id: str) -> None:
    out.topic.name = unwrap(namespace, topic)
    out.topic.resource_namespace = namespace
    out.body = body
    sp = out.system_properties
    tag = properties.get(_message.PROPERTY_TAGS)
    if tag:
        sp.tag = tag
    sp.keys.extend(k for k in properties.get(_message.PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k)
    sp.message_id = message_id
    sp.body_digest.type = definition.DigestType.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()  # noqa: S324  (a checksum, as the proxy)
    sp.body_encoding = definition.Encoding.IDENTITY
    sp.message_type = _type_of(properties)
    group = properties.get(_system.PROPERTY_SHARDING_KEY)
    if group:
        sp.message_group = group
    deliver = properties.get(_system.PROPERTY_TIMER_DELIVER_MS)
    if deliver and deliver.isdigit():
        sp.delivery_timestamp.CopyFrom(timestamp_of(int(deliver)))
    for key, value in properties.items():
        if key not in SYSTEM_PROPERTIES:
            out.user_properties[key] = value


def to_v2_message(stored: StoredMessage, namespace: str = "", *, receipt_handle: str | None = None,
                  delivery_attempt: int | None = None, invisible_ms: int | None = None) -> definition.Message:
    """A stored message as a v2 Message (a received message carries its receipt handle and attempt)."""
    out = definition.Message()
    body = zlib.decompress(stored.body) if stored.sys_flag & COMPRESSED else stored.body
    _fill(out, stored.topic, namespace, body, stored.properties, stored.msg_id or stored.offset_msg_id)
    sp = out.system_properties
    sp.born_timestamp.CopyFrom(timestamp_of(stored.born_timestamp))
    sp.born_host = stored.born_host
    sp.store_timestamp.CopyFrom(timestamp_of(stored.store_timestamp))
    sp.store_host = stored.store_host
    sp.queue_id = stored.queue_id
    sp.queue_offset = stored.queue_offset
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms is not None:
        sp.invisible_duration.CopyFrom(duration_of(invisible_ms))
    return out


def check_to_v2_message(check: CheckRequest, namespace: str = "") -> definition.Message:
    """A transaction check-back's half message as the v2 Message of a RecoverOrphanedTransactionCommand."""
    out = definition.Message()
    properties = dict(check.properties)
    message_id = properties.get(_message.PROPERTY_UNIQUE_ID) or check.transaction_id
    _fill(out, check.topic, namespace, check.body, properties, message_id)
    out.system_properties.message_type = MessageType.TRANSACTION
    return out

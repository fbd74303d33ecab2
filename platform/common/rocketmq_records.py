"""RocketMQ's stored-message encoding read back into messages (``storage_native/layout.py``, "RocketMQ's encodings").

A RocketMQ broker answers QUERY_MESSAGE and VIEW_MESSAGE_BY_ID, and pushes CHECK_TRANSACTION_STATE, with the
messages in this encoding (sparkmq's broker writes it with ``storage_native.encode_rocketmq_records``);
:func:`decode_rocketmq_records` is the reading side for sparkmq's client, into the one message type that holds
every stored field (:class:`~sparkmq.platform.common.message.StoredMessage`): rare answers, so plain Python.
A pull's answer is decoded natively instead (sparkmq's own SPARKMQ_PULL_PACKED, ``decode_records``).

Example::

    >>> from sparkmq.storage_native import encode_rocketmq_records
    >>> [m.topic for m in decode_rocketmq_records(encode_rocketmq_records(stored_records))]  # doctest: +SKIP
    ['orders', 'orders']
"""
from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Callable

from ...storage_native.layout import (
    RMQ_BORNHOST_V6,
    RMQ_MAGIC_V1,
    RMQ_MAGIC_V2,
    RMQ_STOREHOST_V6,
)
from .codec import decode_properties
from .errors import ErrorCode, SparkMQError
from .message import StoredMessage
from .sysflag import COMPRESSED

__all__ = ["decode_rocketmq_records"]

# TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP
_HEAD = struct.Struct(">iIiiiqqiq")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
# RECONSUMETIMES, PREPARED_TX_OFFSET, body length
_TAIL = struct.Struct(">iqi")
_I16 = struct.Struct(">h")
#: SYSFLAG bits 8-10: the compression of a COMPRESSED body (0 and 3: zlib, 1: LZ4, 2: ZSTD).
_COMPRESSION_SHIFT = 8
_ZLIB_TYPES = (0, 3)


def _illegal(at: int, what: str) -> SparkMQError:
    return SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the RocketMQ message at byte {at} is malformed: {what}")


def _host(view: memoryview, at: int, v6: bool) -> tuple[str, int]:
    """(``codec.unpack_host``'s text: "" for 0.0.0.0:0, "a.b.c.d:port", "[v6]:port"; the position after it)."""
    size = 16 if v6 else 4
    raw = bytes(view[at:at + size])
    port = _I32.unpack_from(view, at + size)[0]
    end = at + size + 4
    if v6:
        ip = ipaddress.IPv6Address(raw)
        return (f"{ip.ipv4_mapped}:{port}" if ip.ipv4_mapped is not None else f"[{ip}]:{port}"), end
    if raw == bytes(4) and port == 0:
        return "", end
    return f"{ipaddress.IPv4Address(raw)}:{port}", end


def decode_rocketmq_records(body: bytes | bytearray | memoryview,
                            inflate: Callable[[bytes], bytes] = zlib.decompress) -> list[StoredMessage]:
    """Every message of RocketMQ stored messages back to back (as ``MessageDecoder.decodes`` reads them).

    Every field is kept (``flag``, ``body_crc`` as stored, ``prepared_offset``; ``tag_hash`` is 0: RocketMQ's
    records do not carry one); hosts are ``codec.unpack_host`` texts ("" for 0.0.0.0:0), so ``msg_id`` (the
    UNIQ_KEY) and ``offset_msg_id`` are the sender's.  A COMPRESSED zlib body is ``inflate``-d (``sys_flag``
    stays as stored).  MESSAGE_ILLEGAL naming the byte position for a message that does not parse (a bad
    magic, lengths past the data, a topic or properties that are not UTF-8) or an LZ4 / ZSTD body (sparkmq
    reads zlib only).

    Example::

        >>> decode_rocketmq_records(b"")
        []
    """
    view = memoryview(body).cast("B")
    size = len(view)
    out: list[StoredMessage] = []
    at = 0
    while at < size:
        try:
            message, total = _decode_one(view, at, inflate)
        except (struct.error, IndexError):
            raise _illegal(at, "its lengths run past the data") from None
        out.append(message)
        at += total
    return out


def _decode_one(view: memoryview, at: int, inflate: Callable[[bytes], bytes]) -> tuple[StoredMessage, int]:
    (total, magic, body_crc, queue_id, flag, queue_offset, clog_offset, sys_flag,
     born_ts) = _HEAD.unpack_from(view, at)
    if magic not in (RMQ_MAGIC_V1, RMQ_MAGIC_V2):
        raise _illegal(at, f"bad magic 0x{magic:08x}")
    if total < _HEAD.size or at + total > len(view):
        raise _illegal(at, f"TOTALSIZE {total} runs past the {len(view) - at} bytes left")
    end = at + total
    record = view[:end]  # nothing of this message is read past its TOTALSIZE
    pos = at + _HEAD.size
    born_host, pos = _host(record, pos, bool(sys_flag & RMQ_BORNHOST_V6))
    store_ts = _I64.unpack_from(record, pos)[0]
    store_host, pos = _host(record, pos + 8, bool(sys_flag & RMQ_STOREHOST_V6))
    reconsume, prepared, body_len = _TAIL.unpack_from(record, pos)
    pos += _TAIL.size
    if body_len < 0 or pos + body_len > end:
        raise _illegal(at, f"the body length {body_len} runs past the message")
    data = bytes(record[pos:pos + body_len])
    pos += body_len
    if magic == RMQ_MAGIC_V2:
        topic_len = _I16.unpack_from(record, pos)[0]
        pos += 2
    else:
        topic_len = record[pos]
        pos += 1
    props_len = _I16.unpack_from(record, pos + topic_len)[0]
    if topic_len < 0 or props_len < 0 or pos + topic_len + 2 + props_len != end:
        raise _illegal(at, "the topic and properties lengths do not add up to TOTALSIZE")
    try:
        topic = str(record[pos:pos + topic_len], "utf-8")
        properties = decode_properties(bytes(record[end - props_len:end]))
    except UnicodeDecodeError:
        raise _illegal(at, "its topic or properties are not UTF-8") from None
    if sys_flag & COMPRESSED:
        kind = (sys_flag >> _COMPRESSION_SHIFT) & 0x7
        if kind not in _ZLIB_TYPES:
            raise _illegal(at, f"its body is compressed with type {kind} (LZ4 or ZSTD); sparkmq reads zlib only")
        data = inflate(data)
    message = StoredMessage(
        topic=topic, queue_id=queue_id, queue_offset=queue_offset, commitlog_offset=clog_offset, store_size=total,
        body=data, properties=properties, flag=flag, sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
        store_timestamp=store_ts, store_host=store_host, reconsume_times=reconsume, prepared_offset=prepared,
        tag_hash=0, body_crc=body_crc)
    return message, total

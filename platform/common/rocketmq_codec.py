"""RocketMQ's message encodings on the wire, as the remoting adapters and the client call them.

* :func:`encode_rocketmq_records` -- sparkmq's stored records (``storage_native/layout.py``) back to back, re-encoded
  as RocketMQ's stored-message records (what ``MessageDecoder`` reads: PULL_MESSAGE, QUERY_MESSAGE,
  VIEW_MESSAGE_BY_ID and CHECK_TRANSACTION_STATE bodies);
* :func:`decode_rocketmq_records` -- RocketMQ stored-message records back to :class:`StoredMessage` s;
* :func:`decode_rocketmq_batch` -- SEND_BATCH_MESSAGE's body (RocketMQ's batch encoding) as sparkmq's packed batch
  (``docs/remoting.md``), for ``SendProcessor.send_packed``.

The native core provides them (``sparkmq.storage_native``: the same names, in C); until a build has them, the
pure-Python forms below stand in (slower, same bytes).  The formats (big-endian, ``facts/rocketmq-remoting.md`` §4)::

    stored record: TOTALSIZE i32 | MAGIC i32 (0xDAA320A7: topic length i8; 0xDAA320AB: i16) | BODYCRC i32 (CRC-32
        of the body & 0x7FFFFFFF; sparkmq's own record CRC covers the whole record, so it is computed afresh) |
        QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 | PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 |
        BORNHOST ip(4, or 16 with sysFlag 0x10) + port i32 | STORETIMESTAMP i64 | STOREHOST ip (16 with 0x20) + port |
        RECONSUMETIMES i32 | PREPARED_TX_OFFSET i64 | i32 + body | topic length + topic | i16 + properties
    batch entry:   TOTALSIZE i32 | MAGIC i32 | BODYCRC i32 | FLAG i32 | i32 + body | i16 + properties
"""
from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Callable
from typing import Any

from ... import storage_native as _native
from .codec import decode_properties
from .errors import ErrorCode, SparkMQError
from .message import StoredMessage

__all__ = ["encode_rocketmq_records", "decode_rocketmq_records", "decode_rocketmq_batch", "MAGIC_V1", "MAGIC_V2",
           "BORNHOST_V6_FLAG", "STOREHOST_V6_FLAG"]

#: RocketMQ's stored-message magic codes: V1 carries a one-byte topic length, V2 two bytes.
MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
#: sysFlag bits saying the born / store host is IPv6 (16-byte address instead of 4).
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20

# sparkmq's record header (storage_native/layout.py, little-endian): total, magic, crc, queue id, flag, queue offset,
# commit-log offset, sys flag, born ts, born host, store ts, store host, reconsume, prepared, tag hash, body length.
_OURS = struct.Struct("<IIIiiqqiq20sq20siqqI")
_HEAD = struct.Struct(">iIiiiqqiq")   # TOTALSIZE .. BORNTIMESTAMP
_BATCH_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGIC, BODYCRC, FLAG, body length
_PACKED_HEAD = struct.Struct("<IHiq")  # sparkmq's packed entry: body length, properties length, flag, born ts
_V4_MAPPED = bytes(10) + b"\xff\xff"


def _host(raw: bytes) -> tuple[bytes, int, bool]:
    """(address bytes as RocketMQ writes them, port, is IPv6) of sparkmq's 20-byte host field."""
    port = int.from_bytes(raw[16:20], "little")
    if raw[:12] == _V4_MAPPED or not any(raw[:16]):
        return raw[12:16], port, False
    return raw[:16], port, True


def _py_encode_records(records: bytes | memoryview) -> bytes:
    data = memoryview(records)
    out: list[bytes] = []
    pos = 0
    end = len(data)
    while pos < end:
        (total, _magic, _crc, queue_id, flag, queue_offset, clog, sys_flag, born_ts, born_host, store_ts, store_host,
         reconsume, prepared, _tag_hash, body_len) = _OURS.unpack_from(data, pos)
        if total < _OURS.size or pos + total > end:
            raise SparkMQError(ErrorCode.STORE_CORRUPT, f"record at {pos} runs past the data ({total} bytes)")
        body_at = pos + _OURS.size
        body = bytes(data[body_at: body_at + body_len])
        topic_len = data[body_at + body_len]
        topic = bytes(data[body_at + body_len + 1: body_at + body_len + 1 + topic_len])
        props_at = body_at + body_len + 1 + topic_len
        props_len = int.from_bytes(data[props_at: props_at + 2], "little")
        props = bytes(data[props_at + 2: props_at + 2 + props_len])
        born_ip, born_port, born_v6 = _host(born_host)
        store_ip, store_port, store_v6 = _host(store_host)
        sys_flag = (sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)) | (BORNHOST_V6_FLAG if born_v6 else 0) \
            | (STOREHOST_V6_FLAG if store_v6 else 0)
        magic = MAGIC_V1 if len(topic) <= 127 else MAGIC_V2
        topic_field = (struct.pack(">b", len(topic)) if magic == MAGIC_V1 else struct.pack(">h", len(topic))) + topic
        tail = (born_ip + struct.pack(">iq", born_port, store_ts) + store_ip
                + struct.pack(">iiqi", store_port, reconsume, prepared, len(body)) + body + topic_field
                + struct.pack(">h", len(props)) + props)
        size = _HEAD.size + len(tail)
        # sparkmq's CRC covers the whole record after it; RocketMQ's BODYCRC the body alone.
        body_crc = zlib.crc32(body) & 0x7FFFFFFF
        out.append(_HEAD.pack(size, magic, body_crc, queue_id, flag, queue_offset, clog, sys_flag, born_ts))
        out.append(tail)
        pos += total
    return b"".join(out)


def _py_decode_records(body: bytes | memoryview) -> list[StoredMessage]:
    data = memoryview(body)
    out: list[StoredMessage] = []
    pos = 0
    try:
        while pos < len(data):
            total, magic, crc, queue_id, flag, queue_offset, clog, sys_flag, born_ts = _HEAD.unpack_from(data, pos)
            if magic not in (MAGIC_V1, MAGIC_V2) or total < _HEAD.size or pos + total > len(data):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"bad RocketMQ record at byte {pos}")
            at = pos + _HEAD.size
            born_len = 16 if sys_flag & BORNHOST_V6_FLAG else 4
            born_ip = bytes(data[at: at + born_len])
            born_port, store_ts = struct.unpack_from(">iq", data, at + born_len)
            at += born_len + 12
            store_len = 16 if sys_flag & STOREHOST_V6_FLAG else 4
            store_ip = bytes(data[at: at + store_len])
            store_port, reconsume, prepared, body_len = struct.unpack_from(">iiqi", data, at + store_len)
            at += store_len + 20
            payload = bytes(data[at: at + body_len])
            at += body_len
            if magic == MAGIC_V1:
                topic_len = data[at]
                at += 1
            else:
                (topic_len,) = struct.unpack_from(">h", data, at)
                at += 2
            topic = bytes(data[at: at + topic_len]).decode()
            at += topic_len
            (props_len,) = struct.unpack_from(">h", data, at)
            props = decode_properties(bytes(data[at + 2: at + 2 + props_len]))
            out.append(StoredMessage(
                topic=topic, queue_id=queue_id, queue_offset=queue_offset, commitlog_offset=clog, store_size=total,
                body=payload, properties=props, flag=flag, sys_flag=sys_flag, born_timestamp=born_ts,
                born_host=_text_host(born_ip, born_port), store_timestamp=store_ts,
                store_host=_text_host(store_ip, store_port), reconsume_times=reconsume, prepared_offset=prepared,
                tag_hash=0, body_crc=crc))
            pos += total
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"bad RocketMQ record at byte {pos}: {exc}") from None
    return out


def _text_host(ip: bytes, port: int) -> str:
    address = ipaddress.ip_address(ip)
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def _py_decode_batch(body: bytes | memoryview, born_timestamp: int) -> tuple[bytes, int]:
    data = memoryview(body)
    out: list[bytes] = []
    pos = count = 0
    while pos < len(data):
        if pos + _BATCH_HEAD.size > len(data):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"batch entry {count} is cut short")
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
        at = pos + _BATCH_HEAD.size
        if total < _BATCH_HEAD.size + 2 or body_len < 0 or pos + total > len(data) \
                or at + body_len + 2 > pos + total:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"batch entry {count}: sizes disagree "
                                                          f"(total {total}, body {body_len})")
        payload = bytes(data[at: at + body_len])
        (props_len,) = struct.unpack_from(">h", data, at + body_len)
        if props_len < 0 or at + body_len + 2 + props_len != pos + total:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"batch entry {count}: properties length {props_len} "
                                                          f"disagrees with its total size {total}")
        props = bytes(data[at + body_len + 2: pos + total])
        out.append(_PACKED_HEAD.pack(len(payload), len(props), flag, born_timestamp) + payload + props)
        pos += total
        count += 1
    if not count:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the batch is empty")
    return b"".join(out), count


def _resolve(name: str, fallback: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(_native, name, None) or fallback


#: ``encode_rocketmq_records(records) -> bytes``: sparkmq's stored records re-encoded as RocketMQ's.
encode_rocketmq_records: Callable[[bytes | memoryview], bytes] = _resolve("encode_rocketmq_records",
                                                                         _py_encode_records)
#: ``decode_rocketmq_records(body) -> list``: RocketMQ stored-message records as messages.
decode_rocketmq_records: Callable[[bytes | memoryview], list[Any]] = _resolve("decode_rocketmq_records",
                                                                             _py_decode_records)


def decode_rocketmq_batch(body: bytes | memoryview, born_timestamp: int) -> tuple[bytes, int]:
    """SEND_BATCH_MESSAGE's body as sparkmq's packed batch and its message count; MESSAGE_ILLEGAL naming the entry
    when it is malformed."""
    native = getattr(_native, "decode_rocketmq_batch", None)
    if native is None:
        return _py_decode_batch(body, born_timestamp)
    try:
        return native(body, born_timestamp)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, str(exc)) from None

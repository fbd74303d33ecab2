"""Pure-Python twin of the C storage core (``_commitlog.c``).

Same contract (``_commitlog.pyi``), same files (``layout.py``), same errors
(``errors.py``).  It is the readable reference of the algorithms and the fallback
where the extension cannot be built; ``SPARKMQ_STORE_IMPL=python`` forces it.
It appends 4-5x slower than the C core (``store.native_vs_python``) and keeps no RSS budget of its own.
"""
from __future__ import annotations

import errno
import ipaddress
import mmap
import operator
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Sequence

from .errors import (
    CLOSED,
    CORRUPT_RECORD,
    CORRUPT_STORE,
    DISK_FULL,
    INVALID_ARGUMENT,
    IO_ERROR,
    MESSAGE_ILLEGAL,
    MESSAGE_TOO_LARGE,
    OFFSET_ILLEGAL,
    OFFSET_MISMATCH,
    OFFSET_OVERFLOW,
    OFFSET_TOO_SMALL,
    PROPERTIES_TOO_LARGE,
    StoreError,
)
from .layout import (
    BLANK_MAGIC,
    BLANK_MARKER_SIZE,
    BODY_LENGTH_AT,
    CQ_UNIT,
    CQ_UNIT_SIZE,
    DEFAULT_CQ_UNITS_PER_FILE,
    DEFAULT_SEGMENT_SIZE,
    FORMAT_VERSION,
    HOST_SIZE,
    MAX_PROPERTIES_BYTES,
    MAX_QUEUE_ID,
    MAX_TOPIC_BYTES,
    MAX_UNIQ_KEY_BYTES,
    MIN_RECORD_SIZE,
    MIN_SEGMENT_SIZE,
    PACKED_ENTRY,
    PACKED_ENTRY_SIZE,
    QUEUE_ID_AT,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    RMQ_BATCH_HEAD,
    RMQ_BORNHOST_V6,
    RMQ_MAGIC_V1,
    RMQ_MAGIC_V2,
    RMQ_STOREHOST_V6,
    RMQ_V1_MAX_TOPIC,
    STORE_TIMESTAMP_AT,
    SYS_FLAG_COMPRESSED,
    segment_file_name,
)

__all__ = ["CommitLog", "ConsumeQueue", "decode_record", "decode_batch", "encode_batch", "decode_records",
           "encode_rocketmq_records", "decode_rocketmq_batch", "FORMAT_VERSION"]

_NAME = re.compile(r"^\d{20}$")
_TMP_SUFFIX = ".tmp"
_STALE_TMP = re.compile(r"^\d{20}\.tmp$")
_ZERO_HOST = bytes(HOST_SIZE)
_PAGE = 4096
#: release_page_cache works in steps of at least this (as the native log's CL_RELEASE_STEP).
_RELEASE_STEP = 16 << 20
_GET_MAX_EXAMINED = 16384
_SIZE_MAGIC = struct.Struct("<II")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_TOPIC_LEN_MAX = MAX_TOPIC_BYTES
#: ``CommitLog._visible`` when no visibility limit is set (cl_store.h CL_NO_LIMIT).
_NO_LIMIT = (1 << 63) - 1


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _err(code: str, message: str) -> StoreError:
    return StoreError(code, message)


def _io_error(what: str, exc: OSError) -> StoreError:
    if exc.errno == errno.ENOSPC:
        return StoreError(DISK_FULL, f"{what}: {os.strerror(exc.errno)}")
    return StoreError(IO_ERROR, f"{what}: {os.strerror(exc.errno or 0)}")


def _int(value: object) -> int:
    """Any object the caller passed: a TypeError for non-integers is the contract, as in the C core."""
    return operator.index(value)  # type: ignore[arg-type]  # checked here, at run time


def _buffer(value: object) -> bytes:
    """A copy of any bytes-like object the caller passed: a TypeError for others, as in the C core."""
    return bytes(memoryview(value))  # type: ignore[arg-type]  # checked here, at run time


def _bounded(value: object, bits: int) -> int:
    """A signed integer of ``bits`` bits; OverflowError beyond, as the C core."""
    number = _int(value)
    if not -(1 << (bits - 1)) <= number < (1 << (bits - 1)):
        raise OverflowError(f"{number} does not fit in a signed {bits}-bit integer")
    return number


class _MappedFile:
    """One fixed-size file mapped read/write; the unit of both segments and queue files."""

    __slots__ = ("start", "path", "size", "mm", "_fd")

    def __init__(self, path: str, start: int, size: int, create: bool) -> None:
        self.start = start
        self.path = path
        self.size = size
        # A new file is built under a temporary name and renamed into place, so a
        # crash mid-creation never leaves a short file with a 20-digit name.
        target = path + _TMP_SUFFIX if create else path
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if create else 0)
        try:
            self._fd = os.open(target, flags, 0o644)
        except OSError as exc:
            raise _io_error(f"{'create' if create else 'open'} {path}", exc) from None
        try:
            if create:
                try:
                    os.posix_fallocate(self._fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
                    os.ftruncate(self._fd, size)
            self.mm = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if create:
                os.rename(target, path)
        except OSError as exc:
            os.close(self._fd)
            if create:
                os.unlink(target)
            raise _io_error(f"create {path}", exc) from None

    def sync(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            raise _io_error(f"fdatasync {self.path}", exc) from None

    def close(self) -> None:
        self.mm.close()
        os.close(self._fd)

    def delete(self) -> None:
        self.close()
        os.unlink(self.path)


def _list_names(directory: str) -> list[str]:
    """The 20-digit file names of ``directory`` sorted by value, after removing
    the ``.tmp`` leftovers of a creation a crash interrupted."""
    names = os.listdir(directory)
    for name in names:
        if _STALE_TMP.match(name):
            os.unlink(os.path.join(directory, name))
    return sorted((n for n in names if _NAME.match(n)), key=int)


def _zero_tail(f: _MappedFile, pos: int) -> bool:
    """Zero [pos, …) page by page until a page (from ``pos`` on) is already all zero.

    Returns True when a non-zero byte was met.  Stopping at the first zero page
    avoids touching (and allocating) the untouched rest of a 1 GiB segment.
    """
    met_non_zero = False
    start = pos
    while start < f.size:
        page_end = min((start // _PAGE + 1) * _PAGE, f.size)
        if not f.mm[start:page_end].strip(b"\0"):
            break
        f.mm[start:page_end] = bytes(page_end - start)
        met_non_zero = True
        start = page_end
    return met_non_zero


def decode_record(buf, verify_crc: bool = False) -> tuple:
    """Decode one whole record; see ``_commitlog.pyi``."""
    mv = memoryview(buf)
    decoded = _decode_at(mv, 0, mv.nbytes, True)
    if verify_crc and zlib.crc32(mv[12:]) != decoded[1]:
        raise _err(CORRUPT_RECORD, "record fails its CRC check")
    return decoded


def _frame_record(mv: memoryview, pos: int, left: int, whole: bool = False) -> tuple[tuple, int, int]:
    """(the fixed header's fields, topic length position, properties length position) of the record at ``pos``
    with ``left`` bytes left (``whole``: the record must be all of them); the framing errors of
    ``decode_record`` and ``decode_records``."""
    if left < RECORD_HEADER_SIZE:
        raise _err(CORRUPT_RECORD, "record is malformed: buffer shorter than the header")
    header = RECORD_HEADER.unpack_from(mv, pos)
    total, magic = header[0], header[1]
    if magic != RECORD_MAGIC:
        raise _err(CORRUPT_RECORD, f"record is malformed: bad magic 0x{magic:08x}")
    if (total != left) if whole else (total < RECORD_HEADER_SIZE or total > left):
        raise _err(CORRUPT_RECORD, f"record is malformed: total_size {total} != buffer length {left}")
    tpos = RECORD_HEADER_SIZE + header[-1]
    if tpos + 1 > total:
        raise _err(CORRUPT_RECORD, "record is malformed: lengths overrun the record")
    ppos = tpos + 1 + mv[pos + tpos]
    if ppos + 2 > total:
        raise _err(CORRUPT_RECORD, "record is malformed: lengths overrun the record")
    if ppos + 2 + _U16.unpack_from(mv, pos + ppos)[0] != total:
        raise _err(CORRUPT_RECORD, "record is malformed: lengths overrun the record")
    return header, tpos, ppos


def _decode_at(mv: memoryview, pos: int, left: int, whole: bool) -> tuple:
    """``decode_record``'s tuple of the record at ``pos`` (the one decoding of a record's bytes), unchecked CRC."""
    header, tpos, ppos = _frame_record(mv, pos, left, whole)
    (total, _magic, crc, queue_id, flag, queue_offset, clog_offset, sys_flag, born_ts, born_host,
     store_ts, store_host, reconsume, prepared, tag_hash, _body_len) = header
    try:
        topic = str(mv[pos + tpos + 1:pos + ppos], "utf-8")
    except UnicodeDecodeError:
        raise _err(CORRUPT_RECORD, "record is malformed: topic is not UTF-8") from None
    return (total, crc, queue_id, flag, queue_offset, clog_offset, sys_flag, born_ts, born_host,
            store_ts, store_host, reconsume, prepared, tag_hash,
            bytes(mv[pos + RECORD_HEADER_SIZE:pos + tpos]), topic, bytes(mv[pos + ppos + 2:pos + total]))


# -- packed batches and records (docs/remoting.md) ------------------------------------------
_ASCII_SPACE = b" \t\n\x0b\x0c\r"
_MAPPED_V4 = bytes(10) + b"\xff\xff"
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_MAX_RESERVED_KEY = 255
_SPECIAL = ("TAGS", "KEYS", "UNIQ_KEY")
_FLAG_TEXT = "the flag must be an int in [-2147483648, 2147483647], got "


def _packed_frame(mv: memoryview, count: int) -> list[tuple[int, int, int, int, int]]:
    """(position, body_length, properties_length, flag, born_timestamp) of each entry; framing errors."""
    if count < 1:
        raise _err(MESSAGE_ILLEGAL, f"batch count must be >= 1, got {count}")
    size = mv.nbytes
    pos = 0
    entries = []
    for i in range(count):
        left = size - pos
        if left == 0:
            raise _err(MESSAGE_ILLEGAL, f"the batch holds {i} messages, the count says {count}")
        if left < PACKED_ENTRY_SIZE:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: the entry header is truncated ({left} bytes left)")
        body_len, props_len, flag, born = PACKED_ENTRY.unpack_from(mv, pos)
        need = PACKED_ENTRY_SIZE + body_len + props_len
        if need > left:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: the entry needs {need} bytes, {left} are left")
        entries.append((pos, body_len, props_len, flag, born))
        pos += need
    if pos < size:
        raise _err(MESSAGE_ILLEGAL, f"the batch has {size - pos} bytes after its {count} messages")
    return entries


def _tag_ok(value: bytes) -> bool:
    return (bool(value) and value[0] not in _ASCII_SPACE and value[-1] not in _ASCII_SPACE
            and b"||" not in value)


def _keys_ok(value: bytes) -> bool:
    return bool(value) and value[0] != 0x20 and value[-1] != 0x20 and b"  " not in value


def _uniq_ok(value: bytes) -> bool:
    return 0 < len(value) <= MAX_UNIQ_KEY_BYTES and all(0x21 <= c <= 0x7E for c in value)


def _check_packed_props(i: int, props: bytes, reserved: frozenset[bytes]) -> int:
    """The property rules of entry ``i``; returns its tag hash (CRC-32 of TAGS, 0 without)."""
    try:
        props.decode("utf-8")
    except UnicodeDecodeError:
        raise _err(MESSAGE_ILLEGAL, f"message {i}: the properties are not valid UTF-8") from None
    tag_hash = 0
    seen: set[bytes] = set()
    pos = 0
    pair = 0
    while pos < len(props):
        end = props.find(b"\x02", pos)
        if end < 0:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: property {pair} is not terminated by \\x02")
        sep = props.find(b"\x01", pos, end)
        if sep < 0:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: property {pair} has no \\x01 between name and value")
        if sep == pos:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: property {pair} has an empty name")
        if props.find(b"\x01", sep + 1, end) >= 0:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: property {pair} has more than one \\x01")
        key = props[pos:sep]
        value = props[sep + 1:end]
        if key in reserved:
            raise _err(MESSAGE_ILLEGAL, f"message {i}: the property {key.decode('utf-8')} is reserved")
        if key in (b"TAGS", b"KEYS", b"UNIQ_KEY"):
            if key in seen:
                raise _err(MESSAGE_ILLEGAL, f"message {i}: property {key.decode('ascii')} appears twice")
            seen.add(key)
            if key == b"TAGS":
                if not _tag_ok(value):
                    raise _err(MESSAGE_ILLEGAL,
                               f"message {i}: the TAGS value is empty, padded with whitespace or has '||'")
                tag_hash = zlib.crc32(value)
            elif key == b"KEYS":
                if not _keys_ok(value):
                    raise _err(MESSAGE_ILLEGAL, f"message {i}: the KEYS value is empty or has an empty key")
            elif not _uniq_ok(value):
                raise _err(MESSAGE_ILLEGAL, f"message {i}: the UNIQ_KEY must be 1 to 128 printable ASCII "
                                            "characters without spaces")
        pos = end + 1
        pair += 1
    if b"UNIQ_KEY" not in seen:
        raise _err(MESSAGE_ILLEGAL, f"message {i}: the properties have no UNIQ_KEY")
    return tag_hash


def _check_packed_entry(i: int, body: bytes, props: bytes, max_body: int, max_props: int, compressed: bool,
                        reserved: frozenset[bytes], topic_len: int, segment_size: int) -> int:
    """Every rule of one framed entry, in the contract's order; returns its tag hash."""
    if not body:
        raise _err(MESSAGE_ILLEGAL, f"message {i}: the body is empty")
    if len(body) > max_body:
        raise _err(MESSAGE_TOO_LARGE, f"message {i}: the body is {len(body)} bytes, the limit is {max_body}")
    if len(props) > max_props:
        raise _err(PROPERTIES_TOO_LARGE,
                   f"message {i}: the properties are {len(props)} bytes, the limit is {max_props}")
    if compressed and (len(body) < 2 or body[0] & 0x0F != 8 or (body[0] << 8 | body[1]) % 31):
        raise _err(MESSAGE_ILLEGAL, f"message {i}: the batch is compressed but the body is not zlib data")
    tag_hash = _check_packed_props(i, props, reserved)
    size = RECORD_HEADER_SIZE + len(body) + 1 + topic_len + 2 + len(props)
    if size > segment_size - BLANK_MARKER_SIZE or size > 0xFFFFFFFF:
        raise _err(INVALID_ARGUMENT,
                   f"message {i}: record of {size} bytes does not fit in a segment of {segment_size} bytes")
    return tag_hash


def _reserved_arg(reserved_keys: object) -> frozenset[bytes]:
    if not isinstance(reserved_keys, tuple) or not all(isinstance(k, str) for k in reserved_keys):
        raise TypeError("reserved_keys must be a tuple of str")
    out = []
    for i, key in enumerate(reserved_keys):
        raw = key.encode("utf-8")
        if len(raw) > _MAX_RESERVED_KEY:
            raise _err(INVALID_ARGUMENT, f"reserved key {i} is {len(raw)} bytes, the limit is {_MAX_RESERVED_KEY}")
        out.append(raw)
    return frozenset(out)


def decode_batch(data, count: int) -> list[tuple[bytes, bytes, int, int]]:
    """The entries of a packed batch; see ``_commitlog.pyi``."""
    n = _bounded(count, 64)
    mv = memoryview(data).cast("B")
    out = []
    for pos, body_len, props_len, flag, born in _packed_frame(mv, n):
        start = pos + PACKED_ENTRY_SIZE
        out.append((bytes(mv[start:start + body_len]), bytes(mv[start + body_len:start + body_len + props_len]),
                    flag, born))
    return out


def _illegal(i: int, text: str) -> StoreError:
    return _err(MESSAGE_ILLEGAL, f"message {i}: {text}")


def _prop_text(i: int, text: str, name: str) -> bytes:
    """UTF-8 of a property name or value: encodable and without separators."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise _illegal(i, f"property {name!r} is not valid Unicode") from None
    if b"\x01" in raw or b"\x02" in raw:
        raise _illegal(i, f"property {name!r} contains a reserved control character (\\x01 or \\x02)")
    return raw


def _attr_keys(i: int, keys: object) -> list[str]:
    if isinstance(keys, str):
        found = [keys] if keys else []
    elif isinstance(keys, (list, tuple)):
        found = list(keys)
    else:
        raise _illegal(i, f"keys must be a tuple of strings, got {type(keys).__name__}")
    for key in found:
        if not isinstance(key, str) or not key or " " in key:
            raise _illegal(i, "keys must be non-empty strings without spaces")
        _prop_text(i, key, "KEYS")
    return found


def encode_batch(messages, id_prefix: str, month_start_ms: int, counter: int,
                 born_timestamp: int) -> tuple[bytes, list[str], int]:
    """Validate messages and pack them (the client's encoder); see ``_commitlog.pyi``."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError("messages must be a list or tuple")
    if not (isinstance(id_prefix, str) and len(id_prefix) == 20 and id_prefix.isascii()
            and all(c in _HEX_DIGITS for c in id_prefix)):
        raise _err(INVALID_ARGUMENT, f"id_prefix must be 20 hexadecimal digits, got {id_prefix!r}")
    month = _bounded(month_start_ms, 64)
    count = operator.index(counter) & 0xFFFF
    born = _bounded(born_timestamp, 64)
    items = tuple(messages)
    if not items:
        raise _err(MESSAGE_ILLEGAL, "the batch is empty")
    since = (born - month) & 0xFFFFFFFF
    entries: list[bytes] = []
    msg_ids: list[str] = []
    for i, msg in enumerate(items):
        body, tags, keys, props, flag = msg.body, msg.tags, msg.keys, msg.properties, msg.flag
        if isinstance(body, str):
            raise _illegal(i, "the body must be bytes, got str")
        try:
            mv = memoryview(body)
        except TypeError:
            raise _illegal(i, f"the body must be bytes, got {type(body).__name__}") from None
        if not mv.c_contiguous:
            raise BufferError("the body is not a contiguous buffer")
        if mv.nbytes == 0:
            raise _illegal(i, "the body must not be empty")
        if mv.nbytes > 0xFFFFFFFF:
            raise _err(MESSAGE_TOO_LARGE, f"message {i}: the body is {mv.nbytes} bytes, the limit is 4294967295")
        if tags is not None and not isinstance(tags, str):
            raise _illegal(i, f"the tag must be a str, got {type(tags).__name__}")
        key_list = _attr_keys(i, keys)
        if not isinstance(props, dict):
            raise _illegal(i, f"properties must be a dict, got {type(props).__name__}")
        prop_tags = prop_keys = prop_id = None
        for key, value in props.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise _illegal(i, f"property {key!r} must map a string to a string")
            if not key:
                raise _illegal(i, "property names must not be empty")
            _prop_text(i, key, key)
            _prop_text(i, value, key)
            if key == "TAGS":
                prop_tags = value
            elif key == "KEYS":
                prop_keys = value
            elif key == "UNIQ_KEY":
                prop_id = value
        if not isinstance(flag, int) or not -(1 << 31) <= flag < (1 << 31):
            raise _illegal(i, f"{_FLAG_TEXT}{flag!r}")
        tag = tags
        if prop_tags is not None:
            if tag is not None and tag != prop_tags:
                raise _illegal(i, f"tags {tag!r} disagree with property TAGS {prop_tags!r}")
            tag = prop_tags
        parts: list[bytes] = []
        if tag is not None:
            raw_tag = _prop_text(i, tag, "TAGS")
            if not _tag_ok(raw_tag):
                raise _illegal(i, "the TAGS value is empty, padded with whitespace or has '||'")
            parts += (b"TAGS\x01", raw_tag, b"\x02")
        if prop_keys is not None:
            from_props = [k for k in prop_keys.split(" ") if k]
            if key_list:
                if key_list != from_props:
                    raise _illegal(i, f"keys {key_list!r} disagree with property KEYS")
            else:
                key_list = from_props
        if prop_id is not None:
            if not _uniq_ok(prop_id.encode("utf-8")):
                raise _illegal(i, "the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces")
            msg_id = prop_id
        else:
            count = (count + 1) & 0xFFFF
            msg_id = f"{id_prefix}{since:08X}{count:04X}"
        if key_list:
            parts += (b"KEYS\x01", " ".join(key_list).encode("utf-8"), b"\x02")
        parts += (b"UNIQ_KEY\x01", msg_id.encode("utf-8"), b"\x02")
        for key, value in props.items():
            if key not in _SPECIAL:
                parts += (key.encode("utf-8"), b"\x01", value.encode("utf-8"), b"\x02")
        raw_props = b"".join(parts)
        if len(raw_props) > MAX_PROPERTIES_BYTES:
            raise _err(PROPERTIES_TOO_LARGE,
                       f"message {i}: the properties are {len(raw_props)} bytes, the limit is {MAX_PROPERTIES_BYTES}")
        entries += (PACKED_ENTRY.pack(mv.nbytes, len(raw_props), flag, born), mv.tobytes(), raw_props)
        msg_ids.append(msg_id)
    return b"".join(entries), msg_ids, count


def _host_text(raw: bytes) -> str:
    """platform.common.codec.unpack_host."""
    if not any(raw):
        return ""
    ip = ipaddress.IPv6Address(raw[:16])
    port = int.from_bytes(raw[16:20], "little")
    if ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}:{port}"
    return f"[{ip}]:{port}"


def _offset_id_prefix(raw: bytes) -> str:
    """ids.offset_msg_id_prefix of the host; all zero counts as 0.0.0.0:0."""
    if not any(raw):
        return "0" * 16
    address = raw[12:16] if raw[:12] == _MAPPED_V4 else raw[:16]
    return (address + raw[16:20][::-1]).hex().upper()


def decode_records(data, broker_name: str, factory, inflate) -> list:
    """``factory(...)`` of every record of concatenated stored records; see ``_commitlog.pyi``."""
    mv = memoryview(data).cast("B")
    size = mv.nbytes
    pos = 0
    out = []
    hosts: dict[bytes, tuple[str, str]] = {}
    while pos < size:
        (total, _crc, queue_id, _flag, queue_offset, clog_offset, sys_flag, born_ts, born_host, store_ts,
         store_host, reconsume, _prepared, _tag_hash, body, topic, raw_props) = _decode_at(mv, pos, size - pos, False)
        try:
            text = raw_props.decode("utf-8")
        except UnicodeDecodeError:
            raise _err(CORRUPT_RECORD, "record is malformed: properties are not UTF-8") from None
        props: dict[str, str] = {}
        for pair in text.split("\x02"):
            if pair:
                key, _, value = pair.partition("\x01")
                props[key] = value
        for host in (born_host, store_host):
            if host not in hosts:
                hosts[host] = (_host_text(host), _offset_id_prefix(host))
        keys = props.get("KEYS")
        if sys_flag & SYS_FLAG_COMPRESSED:
            body = inflate(body)
        store_text, id_prefix = hosts[store_host]
        out.append(factory(topic, broker_name, queue_id, queue_offset, props.get("UNIQ_KEY", ""),
                           f"{id_prefix}{clog_offset:016X}", body, props.get("TAGS"),
                           tuple(k for k in keys.split(" ") if k) if keys is not None else (), props, born_ts,
                           hosts[born_host][0], store_ts, store_text, reconsume, sys_flag, clog_offset, total))
        pos += total
    return out


# -- RocketMQ's encodings (layout.py, "RocketMQ's encodings"; rmq_codec.c) ------------------------------
# everything of a stored RocketMQ message up to BORNHOST; then the born host, STORETIMESTAMP, the store
# host, and the tail (RECONSUMETIMES, PREPARED_TX_OFFSET, body length)
_RMQ_HEAD = struct.Struct(">iIiiiqqiq")
_RMQ_I64 = struct.Struct(">q")
_RMQ_TAIL = struct.Struct(">iqi")
_RMQ_PORT = struct.Struct(">i")
_RMQ_BATCH = struct.Struct(">iiiii")
_RMQ_I16 = struct.Struct(">h")
_RMQ_FIXED = _RMQ_HEAD.size + _RMQ_I64.size + _RMQ_TAIL.size + 2
_ZERO_IP = bytes(16)


def _rmq_host(raw: bytes) -> tuple[bytes, bool]:
    """A 20-byte host as RocketMQ writes it (ip + big-endian port) and whether it is IPv6."""
    v4 = raw[:12] == _MAPPED_V4 or raw[:16] == _ZERO_IP
    ip = raw[12:16] if v4 else raw[:16]
    return ip + _RMQ_PORT.pack(int.from_bytes(raw[16:20], "little", signed=True)), not v4


def encode_rocketmq_records(records, /) -> bytes:
    """Stored records re-encoded as RocketMQ's stored messages; see ``_commitlog.pyi``."""
    mv = memoryview(records).cast("B")
    size = mv.nbytes
    pos = 0
    out: list[bytes | memoryview] = []
    while pos < size:
        header, tpos, ppos = _frame_record(mv, pos, size - pos)
        (total, _m, _crc, queue_id, flag, queue_offset, clog_offset, sys_flag, born_ts, born_host, store_ts,
         store_host, reconsume, prepared, _tag, body_len) = header
        born, born6 = _rmq_host(born_host)
        store, store6 = _rmq_host(store_host)
        topic = mv[pos + tpos + 1:pos + ppos]
        props = mv[pos + ppos + 2:pos + total]
        body = mv[pos + RECORD_HEADER_SIZE:pos + tpos]
        long_topic = len(topic) > RMQ_V1_MAX_TOPIC
        length = _RMQ_FIXED + len(born) + len(store) + body_len + (2 if long_topic else 1) + len(topic) + len(props)
        if length > 0x7FFFFFFF:
            raise _err(CORRUPT_RECORD, f"record is malformed: {length} bytes do not fit RocketMQ's encoding")
        sys_flag = (sys_flag & ~(RMQ_BORNHOST_V6 | RMQ_STOREHOST_V6)) \
            | (RMQ_BORNHOST_V6 if born6 else 0) | (RMQ_STOREHOST_V6 if store6 else 0)
        out += (_RMQ_HEAD.pack(length, RMQ_MAGIC_V2 if long_topic else RMQ_MAGIC_V1,
                               zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset, clog_offset,
                               sys_flag, born_ts),
                born, _RMQ_I64.pack(store_ts), store, _RMQ_TAIL.pack(reconsume, prepared, body_len), body,
                len(topic).to_bytes(2 if long_topic else 1, "big"), topic, len(props).to_bytes(2, "big"), props)
        pos += total
    return b"".join(out)


def decode_rocketmq_batch(body, born_timestamp: int, /) -> tuple[bytes, int]:
    """A SEND_BATCH_MESSAGE body as a packed batch and its count; see ``_commitlog.pyi``."""
    born = _bounded(born_timestamp, 64)
    mv = memoryview(body).cast("B")
    size = mv.nbytes
    if size == 0:
        raise _err(MESSAGE_ILLEGAL, "the batch is empty")
    pos = 0
    i = 0
    out: list[bytes | memoryview] = []
    while pos < size:
        left = size - pos
        if left < RMQ_BATCH_HEAD:
            raise _illegal(i, f"the entry header is truncated ({left} bytes left)")
        total, _magic, _crc, flag, body_len = _RMQ_BATCH.unpack_from(mv, pos)
        if body_len < 0:
            raise _illegal(i, f"the body length {body_len} is negative")
        need = RMQ_BATCH_HEAD + body_len + 2
        if need > left:
            raise _illegal(i, f"the entry needs {need} bytes, {left} are left")
        props_len = _RMQ_I16.unpack_from(mv, pos + RMQ_BATCH_HEAD + body_len)[0]
        if props_len < 0:
            raise _illegal(i, f"the properties length {props_len} is negative")
        need += props_len
        if need > left:
            raise _illegal(i, f"the entry needs {need} bytes, {left} are left")
        if total != need:
            raise _illegal(i, f"TOTALSIZE {total} does not match the entry's {need} bytes")
        props = mv[pos + need - props_len:pos + need]
        try:
            str(props, "utf-8")
        except UnicodeDecodeError:
            raise _illegal(i, "the properties are not valid UTF-8") from None
        start = pos + RMQ_BATCH_HEAD
        out += (PACKED_ENTRY.pack(body_len, props_len, flag, born), mv[start:start + body_len], props)
        pos += need
        i += 1
    return b"".join(out), i


def _check_topic(topic: object) -> bytes:
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, not {type(topic).__name__}")
    raw = topic.encode("utf-8")
    if not raw:
        raise _err(INVALID_ARGUMENT, "topic must not be empty")
    if len(raw) > _TOPIC_LEN_MAX:
        raise _err(INVALID_ARGUMENT, f"topic is {len(raw)} bytes, the limit is {_TOPIC_LEN_MAX}")
    if b"/" in raw or b"\0" in raw or raw in (b".", b".."):
        raise _err(INVALID_ARGUMENT, "topic contains a character not allowed in a file name")
    return raw


def _check_queue_id(queue_id: object) -> int:
    qid = _int(queue_id)
    if not 0 <= qid <= MAX_QUEUE_ID:
        raise _err(INVALID_ARGUMENT, f"queue_id must be in [0, {MAX_QUEUE_ID}], got {qid}")
    return qid


def _check_host(host: object, name: str, prefix: str = "") -> bytes:
    if host is None:
        return _ZERO_HOST
    raw = _buffer(host)
    if len(raw) != HOST_SIZE:
        raise _err(INVALID_ARGUMENT, f"{prefix}{name} must be {HOST_SIZE} bytes, got {len(raw)}")
    return raw


class _Replicated:
    """One entry of a replicated run: ``size`` bytes of the data from ``at``, for log offset ``pos``;
    for a record its queue (``key``), queue offset and tag hash, for a blank marker ``key`` None."""

    __slots__ = ("pos", "at", "size", "key", "queue_offset", "tag_hash")

    def __init__(self, pos: int, at: int, size: int, key: tuple[str, int] | None = None, queue_offset: int = 0,
                 tag_hash: int = 0) -> None:
        self.pos = pos
        self.at = at
        self.size = size
        self.key = key
        self.queue_offset = queue_offset
        self.tag_hash = tag_hash


def _split_replicated(data: bytes, offset: int, segment_size: int) -> list[_Replicated]:
    """The entries of ``data``, the master's bytes from ``offset`` on, each checked as recovery would accept
    it and stricter (the placement rule of appends, a topic and queue id ``append`` would take); cl_store.c
    repl_split, with the same errors in the same order."""
    out: list[_Replicated] = []
    at = 0
    pos = offset
    while at < len(data):
        avail = len(data) - at
        left = segment_size - pos % segment_size
        if avail < BLANK_MARKER_SIZE:
            raise _err(CORRUPT_RECORD, f"the data ends inside the record at offset {pos} ({avail} bytes left)")
        total, magic = _SIZE_MAGIC.unpack_from(data, at)
        if magic == BLANK_MAGIC:
            if total != left or total < BLANK_MARKER_SIZE:
                raise _err(CORRUPT_RECORD,
                           f"blank marker at offset {pos} has size {total}, its segment has {left} bytes left")
            if avail < total:
                raise _err(CORRUPT_RECORD, f"the data ends inside the record at offset {pos} ({avail} bytes left)")
            out.append(_Replicated(pos, at, total))
        elif magic == RECORD_MAGIC:
            # fits exactly or leaves room for a blank marker, as _place does
            if total < MIN_RECORD_SIZE or (total != left and total + BLANK_MARKER_SIZE > left):
                raise _err(CORRUPT_RECORD,
                           f"record at offset {pos} has an impossible size {total} ({left} bytes left in its segment)")
            if avail < total:
                raise _err(CORRUPT_RECORD, f"the data ends inside the record at offset {pos} ({avail} bytes left)")
            record = memoryview(data)[at:at + total]
            (_total, _magic, crc, queue_id, _flag, queue_offset, clog_offset, _sys, _bts, _bh, _sts, _sh, _rc,
             _prep, tag_hash, body_len) = RECORD_HEADER.unpack_from(record, 0)
            if zlib.crc32(record[12:]) != crc:
                raise _err(CORRUPT_RECORD, f"record at offset {pos} fails its CRC check")
            tpos = RECORD_HEADER_SIZE + body_len
            framed = tpos + 1 <= total
            if framed:
                ppos = tpos + 1 + record[tpos]
                framed = ppos + 2 <= total and ppos + 2 + int.from_bytes(record[ppos:ppos + 2], "little") == total
            if not framed:
                raise _err(CORRUPT_RECORD, f"record at offset {pos} is malformed: lengths overrun the record")
            raw_topic = bytes(record[tpos + 1:ppos])
            try:
                topic = raw_topic.decode("utf-8")
            except UnicodeDecodeError:
                raise _err(CORRUPT_RECORD, f"record at offset {pos} is malformed: topic is not UTF-8") from None
            if not raw_topic or b"/" in raw_topic or b"\0" in raw_topic or raw_topic in (b".", b".."):
                raise _err(CORRUPT_RECORD, f"record at offset {pos} is malformed: topic is not a valid file name")
            if not 0 <= queue_id <= MAX_QUEUE_ID:
                raise _err(CORRUPT_RECORD, f"record at offset {pos} is malformed: queue_id {queue_id} is out of range")
            # recovery ends the log at a record whose stored offset is not its own
            if clog_offset != pos:
                raise _err(OFFSET_MISMATCH, f"record at offset {pos} says it is at offset {clog_offset}")
            out.append(_Replicated(pos, at, total, (topic, queue_id), queue_offset, tag_hash))
        else:
            raise _err(CORRUPT_RECORD, f"bad magic 0x{magic:08x} at offset {pos}")
        at += total
        pos += total
    return out


class _Encoded:
    """A validated record waiting for its offsets (the parts that do not depend on them)."""

    __slots__ = ("size", "queue_id", "flag", "sys_flag", "born_ts", "born_host",
                 "reconsume", "prepared", "tag_hash", "body", "tail")

    def __init__(self, raw_topic: bytes, queue_id: int, body: object, properties: object, tag_hash: object,
                 flag: object, sys_flag: object, born_ts: object, born_host: object, reconsume: object,
                 prepared: object, segment_size: int, prefix: str = "") -> None:
        self.body = _buffer(body)
        props = _buffer(properties)
        self.tag_hash = _bounded(tag_hash, 64)
        self.flag = _bounded(flag, 32)
        self.sys_flag = _bounded(sys_flag, 32)
        self.born_ts = _bounded(born_ts, 64)
        self.reconsume = _bounded(reconsume, 32)
        self.prepared = _bounded(prepared, 64)
        self.born_host = _check_host(born_host, "born_host", prefix)
        if len(props) > MAX_PROPERTIES_BYTES:
            raise _err(INVALID_ARGUMENT,
                       f"{prefix}properties are {len(props)} bytes, the limit is {MAX_PROPERTIES_BYTES}")
        self.queue_id = queue_id
        self.tail = (bytes((len(raw_topic),)) + raw_topic + len(props).to_bytes(2, "little") + props)
        self.size = RECORD_HEADER_SIZE + len(self.body) + len(self.tail)
        if self.size > segment_size - BLANK_MARKER_SIZE:
            raise _err(INVALID_ARGUMENT,
                       f"{prefix}record of {self.size} bytes does not fit in a segment of {segment_size} bytes")

    def to_bytes(self, queue_offset: int, clog_offset: int, store_ts: int, store_host: bytes) -> bytes:
        header = RECORD_HEADER.pack(
            self.size, RECORD_MAGIC, 0, self.queue_id, self.flag, queue_offset, clog_offset, self.sys_flag,
            self.born_ts, self.born_host, store_ts, store_host, self.reconsume, self.prepared, self.tag_hash,
            len(self.body))
        record = bytearray(header)
        record += self.body
        record += self.tail
        crc = zlib.crc32(memoryview(record)[12:])
        record[8:12] = crc.to_bytes(4, "little")
        return bytes(record)


class ConsumeQueue:
    """The 20-byte-unit index of one (topic, queue_id); see ``_commitlog.pyi``."""

    def __init__(self, log: CommitLog, topic: str, queue_id: int, directory: str) -> None:
        self._log = log
        self._topic = topic
        self._queue_id = queue_id
        self._dir = directory
        self._files: list[_MappedFile] = []
        self._min = 0
        self._max = 0
        self._dirty: set[_MappedFile] = set()

    # -- properties ---------------------------------------------------------
    @property
    def topic(self) -> str:
        return self._topic

    @property
    def queue_id(self) -> int:
        return self._queue_id

    @property
    def min_offset(self) -> int:
        with self._log._lock:
            return self._min

    @property
    def max_offset(self) -> int:
        with self._log._lock:
            return self._max

    @property
    def visible_max_offset(self) -> int:
        """One past the last unit pointing below the log's ``visible_offset`` (``max_offset`` without a limit)."""
        with self._log._lock:
            return self._visible_max()

    def _visible_max(self) -> int:
        """cl_store.c cl_queue_visible_max_locked (lock held): the units are in log order."""
        visible = self._log._visible
        if visible == _NO_LIMIT or self._max <= self._min:
            return self._max
        if self._unit_or_zero(self._max - 1)[0] < visible:  # the usual case: all of it is committed
            return self._max
        lo, hi = self._min, self._max - 1  # the first invisible unit is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if self._unit_or_zero(mid)[0] < visible:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- loading ------------------------------------------------------------
    def _load(self, log_min_offset: int) -> None:
        per_file = self._log._cq_units_per_file
        file_size = per_file * CQ_UNIT_SIZE
        names = _list_names(self._dir)
        for name in names:
            path = os.path.join(self._dir, name)
            actual = os.path.getsize(path)
            if actual != file_size:
                raise _err(CORRUPT_STORE,
                           f"queue file {self._topic}/{self._queue_id}/{name}: size {actual} != {file_size}")
            self._files.append(_MappedFile(path, int(name), file_size, create=False))
        if not self._files:
            return
        first_index = self._files[0].start // CQ_UNIT_SIZE
        # max: one past the last unit with size > 0 (scan the newest files backwards)
        self._max = first_index
        for f in reversed(self._files):
            base = f.start // CQ_UNIT_SIZE
            last = self._last_written_in(f)
            if last >= 0:
                self._max = base + last + 1
                break
        # min: the first unit pointing at or above the log's minimum offset
        self._min = first_index
        while self._min < self._max:
            clog, _size, _tag = self._unit(self._min)
            if clog >= log_min_offset:
                break
            self._min += 1

    def _last_written_in(self, f: _MappedFile) -> int:
        """Index of the last unit with size > 0 in ``f``, or -1."""
        used = len(f.mm[:].rstrip(b"\0"))
        for i in range((used - 1) // CQ_UNIT_SIZE, -1, -1):
            if CQ_UNIT.unpack_from(f.mm, i * CQ_UNIT_SIZE)[1] > 0:
                return i
        return -1

    # -- unit access (lock held by the caller) ---------------------------------
    def _locate(self, index: int, create: bool) -> tuple[_MappedFile, int]:
        per_file = self._log._cq_units_per_file
        file_start = (index // per_file) * per_file * CQ_UNIT_SIZE
        for f in reversed(self._files):
            if f.start == file_start:
                return f, (index % per_file) * CQ_UNIT_SIZE
            if f.start < file_start:
                break
        if not create:
            raise KeyError(index)
        os.makedirs(self._dir, exist_ok=True)
        f = _MappedFile(os.path.join(self._dir, segment_file_name(file_start)), file_start,
                        per_file * CQ_UNIT_SIZE, create=True)
        self._files.append(f)
        self._files.sort(key=lambda x: x.start)
        return f, (index % per_file) * CQ_UNIT_SIZE

    def _unit(self, index: int) -> tuple[int, int, int]:
        f, pos = self._locate(index, create=False)
        return CQ_UNIT.unpack_from(f.mm, pos)

    def _unit_or_zero(self, index: int) -> tuple[int, int, int]:
        """``_unit``, a unit of a missing file reading as zeros (as cl_queue_unit_locked)."""
        try:
            return self._unit(index)
        except KeyError:
            return 0, 0, 0

    def _write(self, index: int, clog: int, size: int, tag_hash: int) -> None:
        f, pos = self._locate(index, create=True)
        CQ_UNIT.pack_into(f.mm, pos, clog, size, tag_hash)
        self._dirty.add(f)

    def _check_offset(self, queue_offset: object, allow_max: bool) -> int:
        off = _int(queue_offset)
        if off < 0:
            raise _err(INVALID_ARGUMENT, f"queue offset must be >= 0, got {off}")
        if off < self._min:
            raise _err(OFFSET_TOO_SMALL, f"queue offset {off} is below the minimum queue offset {self._min}")
        if off > self._max or (off == self._max and not allow_max):
            raise _err(OFFSET_OVERFLOW, f"queue offset {off} is at or past the maximum queue offset {self._max}")
        return off

    # -- public -------------------------------------------------------------
    def unit(self, queue_offset: int) -> tuple[int, int, int]:
        """(commitlog_offset, size, tag_hash) of one unit."""
        with self._log._lock:
            self._log._check_open()
            return self._unit(self._check_offset(queue_offset, allow_max=False))

    def units(self, queue_offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Up to ``max_count`` units from ``queue_offset``."""
        with self._log._lock:
            self._log._check_open()
            off = self._check_offset(queue_offset, allow_max=True)
            count = _int(max_count)
            if count < 1:
                raise _err(INVALID_ARGUMENT, f"max_count must be >= 1, got {count}")
            return [self._unit(i) for i in range(off, min(self._max, off + count))]

    def truncate(self, max_queue_offset: int) -> None:
        """Drop every unit at or above ``max_queue_offset``."""
        with self._log._lock:
            self._log._check_open()
            off = _int(max_queue_offset)
            if off < 0:
                raise _err(INVALID_ARGUMENT, f"queue offset must be >= 0, got {off}")
            if off < self._min:
                raise _err(OFFSET_TOO_SMALL, f"queue offset {off} is below the minimum queue offset {self._min}")
            self._truncate(off)

    def _truncate(self, off: int) -> int:
        if off >= self._max:
            return 0
        dropped = self._max - off
        per_file = self._log._cq_units_per_file
        keep: list[_MappedFile] = []
        for f in self._files:
            first = f.start // CQ_UNIT_SIZE
            if first >= off and f is not self._files[0]:
                self._dirty.discard(f)
                f.delete()
                continue
            keep.append(f)
            if first + per_file > off:
                lo = max(off - first, 0) * CQ_UNIT_SIZE
                hi = min(self._max - first, per_file) * CQ_UNIT_SIZE
                if hi > lo:
                    f.mm[lo:hi] = bytes(hi - lo)
                    self._dirty.add(f)
        self._files = keep
        self._max = off
        return dropped

    def _cut_at(self, end: int) -> None:
        """A log truncation to ``end`` (cl_store.c cq_cut_at): the units pointing at or past it go, and empty
        ones among them; a queue left without any unit from queue offset 0 is dropped."""
        cut = self._max
        while cut > self._min:
            clog, size, _tag = self._unit_or_zero(cut - 1)
            if clog < end and size > 0:
                break
            cut -= 1
        if cut == 0 and self._files:
            self._drop()
        else:
            self._truncate(cut)

    def _drop(self) -> None:
        """Every file and the directory (and the topic's, when empty) go: as if never written."""
        for f in self._files:
            self._dirty.discard(f)
            f.delete()
        self._files = []
        self._min = self._max = 0
        for directory in (self._dir, os.path.dirname(self._dir)):
            try:
                os.rmdir(directory)
            except OSError:
                break

    def _correct_min(self, log_min_offset: int) -> None:
        while self._min < self._max and self._unit(self._min)[0] < log_min_offset:
            self._min += 1
        per_file = self._log._cq_units_per_file
        while len(self._files) > 1 and (self._files[0].start // CQ_UNIT_SIZE) + per_file <= self._min:
            f = self._files.pop(0)
            self._dirty.discard(f)
            f.delete()

    def _sync(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for f in dirty:
            f.sync()

    def _close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []


class CommitLog:
    """Append-only log of mmap'd segments plus its consume queues; see ``_commitlog.pyi``."""

    def __init__(self, root: str, segment_size: int = DEFAULT_SEGMENT_SIZE,
                 cq_units_per_file: int = DEFAULT_CQ_UNITS_PER_FILE, check_from: int = 0) -> None:
        segment_size = _int(segment_size)
        cq_units_per_file = _int(cq_units_per_file)
        check_from = _int(check_from)
        if segment_size < MIN_SEGMENT_SIZE or segment_size % MIN_SEGMENT_SIZE:
            raise _err(INVALID_ARGUMENT,
                       f"segment_size must be a multiple of 4096 and at least 4096, got {segment_size}")
        if cq_units_per_file < 1:
            raise _err(INVALID_ARGUMENT, f"cq_units_per_file must be positive, got {cq_units_per_file}")
        if check_from < 0:
            raise _err(INVALID_ARGUMENT, f"check_from must be >= 0, got {check_from}")
        self._root = os.fspath(root)
        self._segment_size = segment_size
        self._cq_units_per_file = cq_units_per_file
        self._lock = threading.Lock()
        self._closed = False
        self._segments: list[_MappedFile] = []
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._dirty_segments: set[_MappedFile] = set()
        self._visible = _NO_LIMIT
        self._released = 0  # release_page_cache: log pages below it were dropped
        #: As the native log's; this implementation has no pre-fault thread, so it changes nothing.
        self.prefault_readahead = False
        self._clog_dir = os.path.join(self._root, "commitlog")
        self._cq_dir = os.path.join(self._root, "consumequeue")
        try:
            os.makedirs(self._clog_dir, exist_ok=True)
            os.makedirs(self._cq_dir, exist_ok=True)
        except OSError as exc:
            raise _io_error(f"mkdir {self._root}", exc) from None
        try:
            self._load_segments()
            self._recovery = self._recover(check_from)
        except BaseException:
            self._release()
            raise

    # -- opening --------------------------------------------------------------
    def _load_segments(self) -> None:
        names = _list_names(self._clog_dir)
        prev: str | None = None
        for name in names:
            path = os.path.join(self._clog_dir, name)
            actual = os.path.getsize(path)
            start = int(name)
            if actual != self._segment_size:
                raise _err(CORRUPT_STORE, f"segment {name}: size {actual} != segment_size {self._segment_size}")
            if start % self._segment_size:
                raise _err(CORRUPT_STORE, f"segment {name} is not aligned to segment_size {self._segment_size}")
            if prev is not None and start != int(prev) + self._segment_size:
                raise _err(CORRUPT_STORE, f"segment {name} does not follow {prev}")
            self._segments.append(_MappedFile(path, start, self._segment_size, create=False))
            prev = name

    def _load_queues(self, log_min_offset: int) -> None:
        for topic in sorted(os.listdir(self._cq_dir)):
            tdir = os.path.join(self._cq_dir, topic)
            if not os.path.isdir(tdir):
                continue
            for qname in sorted(os.listdir(tdir)):
                qdir = os.path.join(tdir, qname)
                if not (qname.isdigit() and os.path.isdir(qdir)):
                    continue
                cq = ConsumeQueue(self, topic, int(qname), qdir)
                cq._load(log_min_offset)
                if cq._files:
                    self._queues[(topic, int(qname))] = cq

    def _files_end(self) -> int:
        return self._segments[-1].start + self._segment_size if self._segments else 0

    def _valid_record_at(self, pos: int) -> tuple[int, bytes] | None:
        """(size, record) when a CRC-valid record starts at ``pos``, else None; size -1 = blank."""
        seg = self._segment_for(pos)
        rel = pos - seg.start
        left = self._segment_size - rel
        if left < BLANK_MARKER_SIZE:
            return None
        total, magic = _SIZE_MAGIC.unpack_from(seg.mm, rel)
        if magic == BLANK_MAGIC and total == left:
            return -1, b""
        if magic != RECORD_MAGIC or total < MIN_RECORD_SIZE or total > left:
            return None
        record = seg.mm[rel:rel + total]
        if zlib.crc32(memoryview(record)[12:]) != int.from_bytes(record[8:12], "little"):
            return None
        try:
            decoded = decode_record(record)
        except StoreError:
            return None
        if decoded[5] != pos:
            return None
        return total, record

    def _recover(self, check_from: int) -> dict[str, int]:
        min_offset = self._segments[0].start if self._segments else 0
        files_end = self._files_end()
        if check_from > files_end:
            raise _err(CORRUPT_STORE, f"check_from {check_from} is past the end of the log files ({files_end})")
        pos = max(check_from, min_offset)
        stats = {"check_from": pos, "end_offset": 0, "records_checked": 0, "torn": 0,
                 "discarded_segments": 0, "cq_units_truncated": 0, "cq_units_redone": 0}
        scanned: list[tuple[int, bytes]] = []
        while pos < files_end:
            found = self._valid_record_at(pos)
            if found is None:
                break
            size, record = found
            if size < 0:
                pos = (pos // self._segment_size + 1) * self._segment_size
                continue
            scanned.append((pos, record))
            stats["records_checked"] += 1
            pos += size
        end = pos
        stats["end_offset"] = end
        # cut the tail: zero what follows the end, drop later segments
        if end < files_end:
            seg = self._segment_for(end)
            if _zero_tail(seg, end - seg.start):
                stats["torn"] = 1
            self._dirty_segments.add(seg)
            while self._segments and self._segments[-1].start > seg.start:
                self._segments.pop().delete()
                stats["discarded_segments"] += 1
                stats["torn"] = 1
        self._max = end
        self._load_queues(self._segments[0].start if self._segments else 0)
        for cq in self._queues.values():
            cut = cq._max
            # units past the end go, and empty (lost) ones among them: see cl_store.c truncate_queues
            while cut > cq._min:
                clog, size, _tag = cq._unit(cut - 1)
                if clog < end and size > 0:
                    break
                cut -= 1
            stats["cq_units_truncated"] += cq._truncate(cut)
        for offset, record in scanned:
            (total, _crc, queue_id, _flag, queue_offset, _clog, _sys, _bts, _bh, _sts, _sh, _rc, _prep,
             tag_hash, _body, topic, _props) = decode_record(record)
            cq = self._queue(topic, queue_id)
            expected = (offset, total, tag_hash)
            if queue_offset < cq._max and queue_offset >= cq._min:
                if cq._unit(queue_offset) == expected:
                    continue
            elif queue_offset < cq._min:
                continue
            cq._write(queue_offset, offset, total, tag_hash)
            cq._max = max(cq._max, queue_offset + 1)
            stats["cq_units_redone"] += 1
        self._flushed = self._log_flushed = 0
        self._sync_all()
        self._flushed = self._log_flushed = end
        self._released = end  # release_page_cache: what was there before is the OS's business
        return stats

    # -- helpers (lock held) ----------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise _err(CLOSED, "commit log is closed")

    def _segment_for(self, offset: int) -> _MappedFile:
        index = (offset - self._segments[0].start) // self._segment_size
        return self._segments[index]

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self, topic, queue_id, os.path.join(self._cq_dir, topic, str(queue_id)))
            self._queues[(topic, queue_id)] = cq
        return cq

    def _check_read_offset(self, offset: object, allow_max: bool = False) -> int:
        off = _int(offset)
        if off < 0:
            raise _err(INVALID_ARGUMENT, f"offset must be >= 0, got {off}")
        min_offset = self._segments[0].start if self._segments else 0
        if off < min_offset:
            raise _err(OFFSET_TOO_SMALL, f"offset {off} is below the minimum offset {min_offset}")
        if off > self._max or (off == self._max and not allow_max):
            raise _err(OFFSET_OVERFLOW, f"offset {off} is at or past the maximum offset {self._max}")
        return off

    def _record_bounds(self, off: int) -> tuple[_MappedFile, int, int]:
        """(segment, position, total_size) of the record at ``off``; OFFSET_ILLEGAL if none starts there."""
        seg = self._segment_for(off)
        rel = off - seg.start
        left = self._segment_size - rel
        if left >= BLANK_MARKER_SIZE:
            total, magic = _SIZE_MAGIC.unpack_from(seg.mm, rel)
            if (magic == RECORD_MAGIC and MIN_RECORD_SIZE <= total <= left
                    and int.from_bytes(seg.mm[rel + 28:rel + 36], "little", signed=True) == off):
                return seg, rel, total
        raise _err(OFFSET_ILLEGAL, f"no record starts at offset {off}")

    def _roll(self) -> _MappedFile:
        start = self._files_end()
        seg = _MappedFile(os.path.join(self._clog_dir, segment_file_name(start)), start,
                          self._segment_size, create=True)
        self._segments.append(seg)
        return seg

    def _place(self, size: int) -> tuple[_MappedFile, int]:
        """Segment and position for a record of ``size`` bytes, closing the segment if needed."""
        if not self._segments or self._max >= self._files_end():
            seg = self._roll()
            self._max = seg.start
            return seg, 0
        seg = self._segment_for(self._max)
        rel = self._max - seg.start
        left = self._segment_size - rel
        if size == left or size <= left - BLANK_MARKER_SIZE:
            return seg, rel
        _SIZE_MAGIC.pack_into(seg.mm, rel, left, BLANK_MAGIC)
        self._dirty_segments.add(seg)
        seg = self._roll()
        self._max = seg.start
        return seg, 0

    def _write_one(self, topic: str, enc: _Encoded, queue_offset: int, store_ts: int, store_host: bytes) -> int:
        seg, rel = self._place(enc.size)
        offset = seg.start + rel
        record = enc.to_bytes(queue_offset, offset, store_ts, store_host)
        # size last: a kill -9 mid-copy leaves a zero size, never a plausible record
        seg.mm[rel + 4:rel + enc.size] = record[4:]
        seg.mm[rel:rel + 4] = record[:4]
        self._dirty_segments.add(seg)
        self._max = offset + enc.size
        cq = self._queue(topic, enc.queue_id)
        cq._write(queue_offset, offset, enc.size, enc.tag_hash)
        cq._max = queue_offset + 1
        return offset

    # -- properties ---------------------------------------------------------
    @property
    def root(self) -> str:
        return self._root

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def cq_units_per_file(self) -> int:
        return self._cq_units_per_file

    @property
    def min_offset(self) -> int:
        with self._lock:
            return self._segments[0].start if self._segments else 0

    @property
    def max_offset(self) -> int:
        with self._lock:
            return self._max

    @property
    def flushed_offset(self) -> int:
        with self._lock:
            return self._flushed

    @property
    def log_flushed_offset(self) -> int:
        with self._lock:
            return self._log_flushed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def recovery(self) -> dict[str, int]:
        return dict(self._recovery)

    # -- writing ------------------------------------------------------------
    def append(self, topic: str, queue_id: int, body, properties=b"", tag_hash: int = 0, flag: int = 0,
               sys_flag: int = 0, born_timestamp: int = 0, born_host: bytes | None = None,
               store_timestamp: int = 0, store_host: bytes | None = None, reconsume_times: int = 0,
               prepared_offset: int = 0) -> tuple[int, int, int]:
        """Append one record and its unit; returns (commitlog_offset, queue_offset, store_timestamp)."""
        with self._lock:
            self._check_open()
            raw_topic = _check_topic(topic)
            qid = _check_queue_id(queue_id)
            _check_host(born_host, "born_host")
            host = _check_host(store_host, "store_host")
            enc = _Encoded(raw_topic, qid, body, properties, tag_hash, flag, sys_flag, born_timestamp,
                           born_host, reconsume_times, prepared_offset, self._segment_size)
            store_ts = _bounded(store_timestamp, 64) or _now_ms()
            queue_offset = self._queue(topic, qid)._max
            offset = self._write_one(topic, enc, queue_offset, store_ts, host)
            return offset, queue_offset, store_ts

    def append_batch(self, topic: str, queue_id: int, messages: Sequence[tuple], store_timestamp: int = 0,
                     store_host: bytes | None = None) -> tuple[int, int, list[int]]:
        """Append records to one queue at once; returns (first_queue_offset, store_timestamp, offsets)."""
        with self._lock:
            self._check_open()
            raw_topic = _check_topic(topic)
            qid = _check_queue_id(queue_id)
            host = _check_host(store_host, "store_host")
            store_ts = _bounded(store_timestamp, 64) or _now_ms()
            if not isinstance(messages, (list, tuple)):
                raise TypeError("messages must be a list or tuple")
            if not messages:
                raise _err(INVALID_ARGUMENT, "batch is empty")
            encoded = []
            for i, item in enumerate(messages):
                if not isinstance(item, tuple):
                    raise TypeError(f"message {i} must be a tuple")
                if len(item) != 9:
                    raise _err(INVALID_ARGUMENT, f"message {i}: expected 9 fields, got {len(item)}")
                body, properties, tag_hash, flag, sys_flag, born_ts, born_host, reconsume, prepared = item
                encoded.append(_Encoded(raw_topic, qid, body, properties, tag_hash, flag, sys_flag, born_ts, born_host,
                                        reconsume, prepared, self._segment_size, prefix=f"message {i}: "))
            first = self._queue(topic, qid)._max
            offsets = [self._write_one(topic, enc, first + i, store_ts, host) for i, enc in enumerate(encoded)]
            return first, store_ts, offsets

    def append_packed(self, topic: str, queue_id: int, data, count: int, *, sys_flag: int = 0,
                      born_host: bytes | None = None, store_host: bytes | None = None, store_timestamp: int = 0,
                      max_body: int = 4194304, max_properties: int = 32767,
                      reserved_keys: tuple[str, ...] = ()) -> tuple[int, int, int, bytes]:
        """Validate a packed batch and append it to one queue; see ``_commitlog.pyi``."""
        with self._lock:
            self._check_open()
            raw_topic = _check_topic(topic)
            qid = _check_queue_id(queue_id)
            bhost = _check_host(born_host, "born_host")
            host = _check_host(store_host, "store_host")
            store_ts = _bounded(store_timestamp, 64) or _now_ms()
            flag_bits = _bounded(sys_flag, 32)
            max_b = _bounded(max_body, 64)
            max_p = _bounded(max_properties, 64)
            reserved = _reserved_arg(reserved_keys)
            n = _bounded(count, 64)
            mv = memoryview(data).cast("B")
            encoded = []
            for i, (pos, body_len, props_len, flag, born) in enumerate(_packed_frame(mv, n)):
                start = pos + PACKED_ENTRY_SIZE
                body = bytes(mv[start:start + body_len])
                props = bytes(mv[start + body_len:start + body_len + props_len])
                tag_hash = _check_packed_entry(i, body, props, max_b, max_p, bool(flag_bits & SYS_FLAG_COMPRESSED),
                                               reserved, len(raw_topic), self._segment_size)
                encoded.append(_Encoded(raw_topic, qid, body, props, tag_hash, flag, flag_bits, born, bhost, 0, 0,
                                        self._segment_size))
            first = self._queue(topic, qid)._max
            offsets = [self._write_one(topic, enc, first + i, store_ts, host) for i, enc in enumerate(encoded)]
            return first, store_ts, offsets[-1] + encoded[-1].size, struct.pack(f"<{n}q", *offsets)

    # -- replication ----------------------------------------------------------
    def _check_replication_end(self, offset: int) -> None:
        if offset < 0:
            raise _err(INVALID_ARGUMENT, f"offset must be >= 0, got {offset}")
        if offset != self._max:
            raise _err(OFFSET_MISMATCH, f"replicated data starts at offset {offset}, the log ends at {self._max}")

    def append_replicated(self, offset: int, data) -> int:
        """Append a run of the master's whole entries at ``offset`` (== ``max_offset``), byte for byte;
        returns the new ``max_offset``.  See ``_commitlog.pyi``."""
        with self._lock:
            self._check_open()
            off = _int(offset)
            raw = bytes(memoryview(data).cast("B"))  # a private copy: what is checked is what is written
            self._check_replication_end(off)
            entries = _split_replicated(raw, off, self._segment_size)
            # a slave never numbers messages itself: each record's queue offset is the next of its queue
            expected: dict[tuple[str, int], int] = {}
            for ent in entries:
                if ent.key is None:
                    continue
                want = expected.get(ent.key)
                if want is None:
                    cq = self._queues.get(ent.key)
                    want = cq._max if cq is not None else 0
                if ent.queue_offset != want:
                    topic, qid = ent.key
                    raise _err(OFFSET_MISMATCH, f"record at offset {ent.pos} has queue offset {ent.queue_offset}, "
                                                f"queue {topic}/{qid} expects {want}")
                expected[ent.key] = want + 1
            for ent in entries:
                cq = None
                if ent.key is not None:
                    # the queue file first: a failure then leaves no record without its unit
                    cq = self._queue(*ent.key)
                    cq._locate(ent.queue_offset, create=True)
                # ent.pos == max: in the segment holding it, or at the end of the files (a new segment)
                seg = self._segment_for(self._max) if self._segments and self._max < self._files_end() else self._roll()
                rel = ent.pos - seg.start
                # size last, as _write_one: a kill -9 mid-copy leaves no plausible record
                seg.mm[rel + 4:rel + ent.size] = raw[ent.at + 4:ent.at + ent.size]
                seg.mm[rel:rel + 4] = raw[ent.at:ent.at + 4]
                self._dirty_segments.add(seg)
                self._max = ent.pos + ent.size
                if cq is not None:
                    cq._write(ent.queue_offset, ent.pos, ent.size, ent.tag_hash)
                    cq._max = ent.queue_offset + 1
            return self._max

    def read_replication(self, offset: int, max_bytes: int) -> bytes:
        """Whole entries (records, blank markers with their padding) from the boundary ``offset`` up to
        ``max_bytes`` (at least one), on into the next segment after a blank marker.  See ``_commitlog.pyi``."""
        with self._lock:
            self._check_open()
            off = _int(offset)
            limit = _int(max_bytes)
            off = self._check_read_offset(off, allow_max=True)
            if limit < 1:
                raise _err(INVALID_ARGUMENT, f"max_bytes must be >= 1, got {limit}")
            parts: list[bytes] = []
            used = 0
            while off < self._max:
                seg = self._segment_for(off)
                rel = off - seg.start
                left = self._segment_size - rel
                if left >= BLANK_MARKER_SIZE and _SIZE_MAGIC.unpack_from(seg.mm, rel) == (left, BLANK_MAGIC):
                    total = left  # the blank marker ships whole: the slave's segment ends as the master's
                else:
                    seg, rel, total = self._record_bounds(off)
                if used and used + total > limit:
                    break
                parts.append(seg.mm[rel:rel + total])
                used += total
                off += total
            return b"".join(parts)

    # -- Raft ---------------------------------------------------------------------
    def _entry_at(self, off: int) -> tuple[_MappedFile, int, int, bool]:
        """(segment, position, size, is a blank marker) of the entry starting at ``off`` (< max);
        OFFSET_ILLEGAL when none does."""
        seg = self._segment_for(off)
        rel = off - seg.start
        left = self._segment_size - rel
        if left >= BLANK_MARKER_SIZE and _SIZE_MAGIC.unpack_from(seg.mm, rel) == (left, BLANK_MAGIC):
            return seg, rel, left, True
        seg, rel, total = self._record_bounds(off)
        return seg, rel, total, False

    def truncate(self, offset: int) -> int:
        """Cut the log back to the entry boundary ``offset``; returns the new ``max_offset`` (``offset``).
        See ``_commitlog.pyi``."""
        off = _int(offset)
        with self._lock:
            self._check_open()
            off = self._check_read_offset(off, allow_max=True)
            if off < self._max:
                self._entry_at(off)  # a record or a blank marker must start there
            old_max = self._max
            for cq in self._queues.values():
                cq._cut_at(off)
            keep = len(self._segments)
            while keep and self._segments[keep - 1].start >= off:
                keep -= 1
            if not keep and off > 0 and self._segments:
                keep = 1  # the oldest segment stays, zeroed: it holds min_offset
            if keep:
                seg = self._segments[keep - 1]
                hi = min(old_max, seg.start + self._segment_size)
                if off < hi:  # zeroed, so recovery can never bring the cut records back
                    seg.mm[off - seg.start:hi - seg.start] = bytes(hi - off)
                    self._dirty_segments.add(seg)
            while len(self._segments) > keep:
                seg = self._segments.pop()
                self._dirty_segments.discard(seg)
                seg.delete()
            self._max = off
            self._flushed = min(self._flushed, off)
            self._log_flushed = min(self._log_flushed, off)
            self._released = min(self._released, off)
            if self._visible != _NO_LIMIT:
                self._visible = min(self._visible, off)
            return off

    @property
    def visible_offset(self) -> int | None:
        """The visibility limit of the queue readers (``get``, ``read_packed``, ``visible_max_offset``), or None."""
        with self._lock:
            return None if self._visible == _NO_LIMIT else self._visible

    def set_visible_offset(self, offset: int | None) -> None:
        """Set (or with None remove) the visibility limit; see ``_commitlog.pyi``."""
        value = _NO_LIMIT if offset is None else _bounded(offset, 64)
        if value < 0:
            raise _err(INVALID_ARGUMENT, f"visible offset must be >= 0, got {value}")
        with self._lock:
            self._check_open()
            self._visible = value

    def queues_in_range(self, start: int, end: int) -> list[tuple[str, int]]:
        """(topic, queue_id) of the records starting in [start, end), in order of first appearance; see
        ``_commitlog.pyi``."""
        lo = _int(start)
        hi = _int(end)
        with self._lock:
            self._check_open()
            if lo < 0:
                raise _err(INVALID_ARGUMENT, f"start must be >= 0, got {lo}")
            if hi < 0:
                raise _err(INVALID_ARGUMENT, f"end must be >= 0, got {hi}")
            pos = max(lo, self._segments[0].start if self._segments else 0)
            hi = min(hi, self._max)
            seen: dict[tuple[str, int], None] = {}
            while pos < hi:
                seg, rel, total, blank = self._entry_at(pos)
                if not blank:
                    tpos = rel + RECORD_HEADER_SIZE + _U32.unpack_from(seg.mm, rel + BODY_LENGTH_AT)[0]
                    topic = seg.mm[tpos + 1:tpos + 1 + seg.mm[tpos]].decode("utf-8", "surrogateescape")
                    qid = int.from_bytes(seg.mm[rel + QUEUE_ID_AT:rel + QUEUE_ID_AT + 4], "little", signed=True)
                    if (topic, qid) in self._queues:
                        seen.setdefault((topic, qid))
                pos += total
            return list(seen)

    # -- reading ------------------------------------------------------------
    def read(self, offset: int) -> bytes:
        """The whole record starting at ``offset`` (a copy)."""
        with self._lock:
            self._check_open()
            seg, rel, total = self._record_bounds(self._check_read_offset(offset))
            return seg.mm[rel:rel + total]

    def read_view(self, offset: int) -> memoryview:
        """The record at ``offset`` as a read-only view (the twin copies, the C core does not)."""
        return memoryview(self.read(offset))

    def store_timestamp_at(self, offset: int) -> int:
        """store_timestamp of the record at ``offset``."""
        with self._lock:
            self._check_open()
            seg, rel, _total = self._record_bounds(self._check_read_offset(offset))
            return int.from_bytes(seg.mm[rel + STORE_TIMESTAMP_AT:rel + STORE_TIMESTAMP_AT + 8], "little", signed=True)

    def scan(self, offset: int, max_count: int = 1024, max_bytes: int = 4 << 20) -> tuple[int, list]:
        """Records in log order from ``offset``: (next_offset, [(offset, record)])."""
        with self._lock:
            self._check_open()
            off = self._check_read_offset(offset, allow_max=True)
            count = _int(max_count)
            limit = _int(max_bytes)
            if count < 1:
                raise _err(INVALID_ARGUMENT, f"max_count must be >= 1, got {count}")
            out: list[tuple[int, bytes]] = []
            used = 0
            while off < self._max and len(out) < count:
                seg = self._segment_for(off)
                rel = off - seg.start
                if self._segment_size - rel < BLANK_MARKER_SIZE:
                    raise _err(OFFSET_ILLEGAL, f"no record starts at offset {off}")
                total, magic = _SIZE_MAGIC.unpack_from(seg.mm, rel)
                if magic == BLANK_MAGIC:
                    off = seg.start + self._segment_size
                    continue
                seg, rel, total = self._record_bounds(off)
                if out and used + total > limit:
                    break
                out.append((off, seg.mm[rel:rel + total]))
                used += total
                off += total
            return off, out

    def read_raw(self, offset: int, length: int) -> bytes:
        """Raw bytes from ``offset``, clipped to the end of the log and of its segment."""
        with self._lock:
            self._check_open()
            off = _int(offset)
            n = _int(length)
            if off < 0:
                raise _err(INVALID_ARGUMENT, f"offset must be >= 0, got {off}")
            if n < 0:
                raise _err(INVALID_ARGUMENT, f"length must be >= 0, got {n}")
            off = self._check_read_offset(off, allow_max=True)
            if off == self._max or n == 0:
                return b""
            seg = self._segment_for(off)
            end = min(off + n, self._max, seg.start + self._segment_size)
            return seg.mm[off - seg.start:end - seg.start]

    def get(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
            tag_hashes=None, max_bytes: int = 0) -> tuple[int, list[tuple[int, int, bytes]]]:
        """Read through the consume queue: (next_queue_offset, [(queue_offset, commitlog_offset, record)])."""
        with self._lock:
            return self._get(topic, queue_id, queue_offset, max_count, tag_hashes, max_bytes)

    def read_packed(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
                    tag_hashes=None, max_bytes: int = 0) -> tuple[int, int, bytes]:
        """Like ``get`` with the records concatenated: (next_queue_offset, count, data)."""
        with self._lock:
            nxt, found = self._get(topic, queue_id, queue_offset, max_count, tag_hashes, max_bytes)
            return nxt, len(found), b"".join(record for _q, _o, record in found)

    def _get(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
             tag_hashes, max_bytes: int) -> tuple[int, list[tuple[int, int, bytes]]]:
        """``get`` with the lock held."""
        self._check_open()
        off = _int(queue_offset)
        count = _int(max_count)
        limit = _int(max_bytes)
        qid = _int(queue_id)
        if tag_hashes is not None and not isinstance(tag_hashes, (set, frozenset)):
            raise TypeError("tag_hashes must be a set or frozenset")
        if off < 0:
            raise _err(INVALID_ARGUMENT, f"queue offset must be >= 0, got {off}")
        if count < 1:
            raise _err(INVALID_ARGUMENT, f"max_count must be >= 1, got {count}")
        cq = self._queues.get((topic, qid))
        if cq is None or off >= cq._max:
            return off, []
        if off < cq._min:
            raise _err(OFFSET_TOO_SMALL, f"queue offset {off} is below the minimum queue offset {cq._min}")
        min_offset = self._segments[0].start if self._segments else 0
        visible = self._visible
        out: list[tuple[int, int, bytes]] = []
        used = 0
        end = min(cq._max, off + _GET_MAX_EXAMINED)
        index = off
        while index < end and len(out) < count:
            clog, size, tag = cq._unit(index)
            if clog >= visible:  # not committed yet: the queue ends here for its readers
                break
            if clog < min_offset or (tag_hashes is not None and tag not in tag_hashes):
                index += 1
                continue
            if limit > 0 and out and used + size > limit:
                break
            seg = self._segment_for(clog)
            rel = clog - seg.start
            out.append((index, clog, seg.mm[rel:rel + size]))
            used += size
            index += 1
        return index, out

    # -- queues and segments --------------------------------------------------------
    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's index, or None when nothing was ever appended to it."""
        with self._lock:
            self._check_open()
            cq = self._queues.get((topic, _int(queue_id)))
            return cq if cq is not None and cq._files else None  # one truncated away is no queue

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) with a consume queue, sorted."""
        with self._lock:
            self._check_open()
            return sorted(key for key, cq in self._queues.items() if cq._files)

    def segments(self) -> list[tuple[int, str]]:
        """(start_offset, path) of every segment, oldest first."""
        with self._lock:
            self._check_open()
            return [(s.start, s.path) for s in self._segments]

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole segments ending at or before ``offset`` (never the newest); returns how many."""
        with self._lock:
            self._check_open()
            off = _int(offset)
            deleted = 0
            while len(self._segments) > 1 and self._segments[0].start + self._segment_size <= off:
                seg = self._segments.pop(0)
                self._dirty_segments.discard(seg)
                seg.delete()
                deleted += 1
            if deleted:
                new_min = self._segments[0].start
                for cq in self._queues.values():
                    cq._correct_min(new_min)
            return deleted

    # -- durability and lifetime ------------------------------------------------------
    def _sync_segments(self) -> None:
        dirty, self._dirty_segments = self._dirty_segments, set()
        for seg in dirty:
            seg.sync()

    def _sync_all(self) -> None:
        self._sync_segments()  # the log before the queues that point into it
        for cq in self._queues.values():
            cq._sync()

    def flush(self) -> int:
        """fdatasync the log and its queues up to the current end; returns ``flushed_offset``."""
        with self._lock:
            self._check_open()
            end = self._max
            self._sync_all()
            self._flushed = max(self._flushed, end)
            self._log_flushed = max(self._log_flushed, self._flushed)
            return self._flushed

    def flush_log(self) -> int:
        """fdatasync the log alone up to the current end; returns ``log_flushed_offset``.

        The queues are left to ``flush``: recovery rewrites their units from the log past the
        checkpoint, which only ever holds a ``flushed_offset``.
        """
        with self._lock:
            self._check_open()
            end = self._max
            self._sync_segments()
            self._log_flushed = max(self._log_flushed, end)
            return self._log_flushed

    def release_page_cache(self, keep: int) -> None:
        """Drop the log's durable pages more than ``keep`` bytes behind the end from the page cache, in steps
        of at least 16 MiB; ``keep`` <= 0: nothing (as the native log)."""
        with self._lock:
            if self._closed or keep <= 0:
                return
            upto = min(self._log_flushed, self._max - keep) & ~(_PAGE - 1)
            start = max(self._released, self._segments[0].start if self._segments else 0)
            if upto - start < _RELEASE_STEP:
                return
            for seg in self._segments:
                lo, hi = max(start, seg.start) - seg.start, min(upto, seg.start + seg.size) - seg.start
                lo = (lo + _PAGE - 1) & ~(_PAGE - 1)
                if hi > lo:
                    seg.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)  # a mapped page is never dropped
                    os.posix_fadvise(seg._fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
            self._released = upto

    def _release(self) -> None:
        for cq in self._queues.values():
            cq._close()
        for seg in self._segments:
            seg.close()
        self._segments = []
        self._queues = {}

    def close(self) -> None:
        """Flush and unmap everything; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._sync_all()
            self._flushed = self._log_flushed = self._max
            self._closed = True
            self._release()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

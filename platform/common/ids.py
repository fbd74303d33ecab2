"""Message ids.

- The *unique id* (``UNIQ_KEY``, what users call the msgId) is made by the
  producer: 16 bytes / 32 hex digits = IPv4 (4) + pid (2) + random per process (4)
  + milliseconds since the start of the month (4) + counter (2), as in RocketMQ.
- The *offsetMsgId* is made by the store and decodes to the physical location:
  store IPv4 (4) + port (4) + commit-log offset (8) = 32 hex digits, or for an
  IPv6 store host IPv6 (16) + port (4) + offset (8) = 56 hex digits.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import operator
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import ErrorCode, SparkMQError

_T = TypeVar("_T", bound=tuple)

__all__ = [
    "UniqueIdGenerator",
    "OffsetMessageId",
    "offset_msg_id_prefix",
    "encode_offset_msg_id",
    "decode_offset_msg_id",
]


def _local_ipv4() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return socket.inet_aton("127.0.0.1")


class UniqueIdGenerator:
    """Thread-safe generator of 32-hex-digit unique message ids."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prefix = (_local_ipv4() + (os.getpid() & 0xFFFF).to_bytes(2, "big")
                        + secrets.token_bytes(4)).hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _roll_month(self, now_ms: int) -> None:
        now = _dt.datetime.fromtimestamp(now_ms / 1000, _dt.UTC)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (start + _dt.timedelta(days=32)).replace(day=1)
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def _month_for(self, now_ms: int) -> None:
        if now_ms >= self._next_month_ms or now_ms < self._month_start_ms:
            self._roll_month(now_ms)

    def next_id(self, now_ms: int) -> str:
        """A new id; ``now_ms`` is the caller's clock (the born timestamp)."""
        with self._lock:
            self._month_for(now_ms)
            self._counter = (self._counter + 1) & 0xFFFF
            since = (now_ms - self._month_start_ms) & 0xFFFFFFFF
            return f"{self._prefix}{since:08X}{self._counter:04X}"

    def with_state(self, now_ms: int, encode: Callable[[str, int, int], _T]) -> _T:
        """Run ``encode(prefix, month_start_ms, counter)`` under the generator's lock and keep its counter.

        For encoders that make many ids at once in native code (``storage_native.encode_batch``):
        ``encode`` returns a tuple whose last item is the counter after its last id, which becomes
        the generator's, so ids made here and by ``next_id`` never repeat.  ``now_ms`` is the born
        timestamp the ids are made for.  Nothing is kept when ``encode`` raises.

        Example::

            data, ids, _ = gen.with_state(now, lambda p, m, c: encode_batch(msgs, p, m, c, now))
        """
        with self._lock:
            self._month_for(now_ms)
            result = encode(self._prefix, self._month_start_ms, self._counter)
            self._counter = operator.index(result[-1]) & 0xFFFF
            return result


@dataclass(frozen=True, slots=True)
class OffsetMessageId:
    """A decoded offsetMsgId: where a message is stored."""

    store_host: str
    commitlog_offset: int


def offset_msg_id_prefix(store_host: str) -> str:
    """The hex digits every offsetMsgId of ``store_host`` ("ip:port") starts with."""
    host, _, port = store_host.rpartition(":")
    ip = ipaddress.ip_address(host.strip("[]"))
    return (ip.packed + int(port).to_bytes(4, "big")).hex().upper()


def encode_offset_msg_id(store_host: str, commitlog_offset: int, prefix: str | None = None) -> str:
    """The offsetMsgId of a message stored on ``store_host`` ("ip:port") at ``commitlog_offset``.

    Pass ``offset_msg_id_prefix(store_host)`` as ``prefix`` on hot paths to skip parsing the host.
    """
    return (prefix or offset_msg_id_prefix(store_host)) + f"{commitlog_offset:016X}"


def decode_offset_msg_id(msg_id: str) -> OffsetMessageId:
    """Inverse of ``encode_offset_msg_id``; MESSAGE_ID_ILLEGAL when it is not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except (ValueError, TypeError):
        raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, f"{msg_id!r} is not hexadecimal") from None
    if len(raw) == 16:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[:4])
        host = str(ip)
        rest = raw[4:]
    elif len(raw) == 28:
        host = f"[{ipaddress.IPv6Address(raw[:16])}]"
        rest = raw[16:]
    else:
        raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL,
                           f"an offsetMsgId has 32 or 56 hex digits, got {len(msg_id)}")
    port = int.from_bytes(rest[:4], "big")
    offset = int.from_bytes(rest[4:], "big", signed=True)
    if offset < 0:
        raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, f"{msg_id!r} encodes a negative offset")
    return OffsetMessageId(f"{host}:{port}", offset)

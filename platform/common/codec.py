"""Encodings shared by every component: message properties, tag hashes, hosts.

Properties travel as ``key\\x01value\\x02`` pairs (RocketMQ's layout), so neither
separator may appear in a key or a value.  Hosts are 20 bytes: a 16-byte IPv6
address (IPv4-mapped for IPv4) and a 4-byte little-endian port.
"""
from __future__ import annotations

import functools
import ipaddress
import zlib
from collections.abc import Mapping

from .errors import ErrorCode, SparkMQError
from .validation import split_addr

__all__ = [
    "NAME_SEPARATOR",
    "PAIR_SEPARATOR",
    "encode_properties",
    "decode_properties",
    "tag_hash",
    "pack_host",
    "unpack_host",
]

NAME_SEPARATOR = "\x01"
PAIR_SEPARATOR = "\x02"
_HOST_SIZE = 20


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode a str→str mapping; MESSAGE_ILLEGAL for separators, empty keys or non-strings."""
    parts: list[str] = []
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"property {key!r} must map a string to a string")
        if not key:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "property names must not be empty")
        if NAME_SEPARATOR in key or PAIR_SEPARATOR in key or NAME_SEPARATOR in value or PAIR_SEPARATOR in value:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                               f"property {key!r} contains a reserved control character (\\x01 or \\x02)")
        parts.append(key)
        parts.append(NAME_SEPARATOR)
        parts.append(value)
        parts.append(PAIR_SEPARATOR)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"properties are not valid Unicode: {exc.reason}") from None


def decode_properties(raw: bytes) -> dict[str, str]:
    """Inverse of ``encode_properties``."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for pair in raw.decode("utf-8").split(PAIR_SEPARATOR):
        if pair:
            key, _, value = pair.partition(NAME_SEPARATOR)
            out[key] = value
    return out


def tag_hash(tag: str | None) -> int:
    """The consume-queue hash of a tag: CRC-32 of its UTF-8 bytes; 0 for no tag.

    Filtering matches hashes on the broker and re-checks the tag string, so a
    collision costs a skipped message, never a wrong delivery.
    """
    if not tag:
        return 0
    return zlib.crc32(tag.encode("utf-8"))


@functools.lru_cache(maxsize=4096)
def pack_host(address: str | None) -> bytes:
    """"ip:port" → the 20-byte host field; None or "" → all zero.

    Cached: it runs on every put, and parsing an address costs microseconds.
    """
    if not address:
        return bytes(_HOST_SIZE)
    host, port = split_addr(address, "store host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"{host!r} is not an IP address") from None
    packed = ip.packed if ip.version == 6 else ipaddress.IPv6Address(f"::ffff:{ip}").packed
    return packed + port.to_bytes(4, "little")


@functools.lru_cache(maxsize=4096)
def unpack_host(raw: bytes) -> str:
    """The 20-byte host field → "ip:port" ("[v6]:port" for IPv6); "" when all zero.

    Cached: a store sees few distinct hosts, and parsing one costs microseconds per message.
    """
    if not any(raw):
        return ""
    ip = ipaddress.IPv6Address(bytes(raw[:16]))
    port = int.from_bytes(raw[16:20], "little")
    if ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}:{port}"
    return f"[{ip}]:{port}"

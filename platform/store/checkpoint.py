"""The store checkpoint: the commit-log offset below which everything is flushed.

Layout (32 bytes, little-endian)::

    0  4  magic  b"SMCK"
    4  2  format version (1)
    6  2  reserved (0)
    8  8  flushed_offset   log and consume queues are durable below this offset
   16  8  timestamp_ms     when it was written
   24  4  crc32 of bytes [0, 24)
   28  4  reserved (0)

It is replaced atomically (write a temporary file, fsync, rename), so a reader
sees the old or the new one; any decode failure reads as "no checkpoint" and
recovery falls back to a full scan.

Only a full flush's offset (``CommitLog.flushed_offset``) may be written here,
never ``log_flushed_offset``: recovery trusts the consume-queue units below the
checkpoint and rebuilds those of the records past it from the log, which is what
lets SYNC_FLUSH's group commit sync the log alone.
"""
from __future__ import annotations

import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Checkpoint", "read_checkpoint", "write_checkpoint"]

_MAGIC = b"SMCK"
_VERSION = 1
_LAYOUT = struct.Struct("<4sHHqqII")


@dataclass(frozen=True)
class Checkpoint:
    """A decoded checkpoint."""

    flushed_offset: int
    timestamp_ms: int


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint at ``path``, or None when missing or corrupt."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) != _LAYOUT.size:
        return None
    magic, version, _r, flushed, ts, crc, _r2 = _LAYOUT.unpack(raw)
    if magic != _MAGIC or version != _VERSION or crc != zlib.crc32(raw[:24]) or flushed < 0:
        return None
    return Checkpoint(flushed, ts)


def write_checkpoint(path: Path, flushed_offset: int) -> None:
    """Atomically replace the checkpoint at ``path`` (``flushed_offset``: from a full flush, see above)."""
    ts = time.time_ns() // 1_000_000
    head = struct.pack("<4sHHqq", _MAGIC, _VERSION, 0, flushed_offset, ts)
    raw = head + struct.pack("<II", zlib.crc32(head), 0)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, raw)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)

"""Offline integrity check of a store directory: every record's CRC, and every queue unit.

Reads the files directly (read-only), so it works on a store no process has open
(or alongside one, on what is already written).  After a bad record it resyncs
on the next offset that holds a record whose stored commitlog_offset equals its
own position, so one flipped byte costs one report, not the rest of the log.

    python -m sparkmq.platform.store.verify /data/store [--json]
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import struct
import sys
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...storage_native.layout import (
    BLANK_MAGIC,
    BLANK_MARKER_SIZE,
    CQ_UNIT,
    CQ_UNIT_SIZE,
    MIN_RECORD_SIZE,
    RECORD_HEADER,
    RECORD_MAGIC,
)
from .paths import StorePaths

__all__ = ["Problem", "VerifyReport", "verify_store", "main"]

_NAME = re.compile(r"^\d{20}$")
_SIZE_MAGIC = struct.Struct("<II")
_MAGIC_BYTES = RECORD_MAGIC.to_bytes(4, "little")


@dataclass(frozen=True)
class Problem:
    """One damaged place: a commit-log offset (or a queue unit) and what is wrong there."""

    offset: int
    reason: str
    where: str = "commitlog"


@dataclass
class VerifyReport:
    """What ``verify_store`` found."""

    segments: int = 0
    records_ok: int = 0
    bytes_scanned: int = 0
    end_offset: int = 0
    queue_units_checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is damaged."""
        return not self.problems


def _segments(paths: StorePaths) -> list[tuple[int, Path]]:
    if not paths.commitlog.is_dir():
        return []
    return sorted((int(p.name), p) for p in paths.commitlog.iterdir() if _NAME.match(p.name))


def _check_record(buf: mmap.mmap, rel: int, left: int, offset: int) -> tuple[int | None, str]:
    """(size, "") for a valid record at ``rel``, (None, reason) otherwise; size -1 = blank marker."""
    if left < BLANK_MARKER_SIZE:
        return None, "segment tail too short for a record"
    total, magic = _SIZE_MAGIC.unpack_from(buf, rel)
    if magic == BLANK_MAGIC and total == left:
        return -1, ""
    if magic != RECORD_MAGIC:
        return None, f"bad magic 0x{magic:08x}"
    if not MIN_RECORD_SIZE <= total <= left:
        return None, f"total_size {total} out of range"
    header = RECORD_HEADER.unpack_from(buf, rel)
    if header[6] != offset:
        return None, f"stored commitlog_offset {header[6]} != position"
    if zlib.crc32(memoryview(buf)[rel + 12:rel + total]) != header[2]:
        return None, "CRC mismatch"
    return total, ""


def _resync(buf: mmap.mmap, rel: int, base: int) -> int | None:
    """Next position after ``rel`` where a record plausibly starts (its stored offset matches)."""
    pos = rel + 1
    while True:
        hit = buf.find(_MAGIC_BYTES, pos + 4)
        if hit < 0:
            return None
        start = hit - 4
        if start + RECORD_HEADER.size <= len(buf):
            if RECORD_HEADER.unpack_from(buf, start)[6] == base + start:
                return start
        pos = hit - 3


def _scan_segment(base: int, buf: mmap.mmap, report: VerifyReport, sizes: dict[int, int]) -> None:
    """Walk one segment's records, noting each valid record's size and each problem."""
    rel = 0
    size = len(buf)
    while rel < size:
        total, reason = _check_record(buf, rel, size - rel, base + rel)
        if total == -1:
            return
        if total is not None:
            sizes[base + rel] = total
            report.records_ok += 1
            rel += total
            report.end_offset = base + rel
            continue
        if not buf[rel:min(size, rel + 4096)].strip(b"\0"):
            return  # the written part of the log ends here
        report.problems.append(Problem(base + rel, reason))
        nxt = _resync(buf, rel, base)
        if nxt is None:
            return
        rel = nxt


def verify_store(root: str | os.PathLike[str], check_queues: bool = True) -> VerifyReport:
    """Scan every segment (and, with ``check_queues``, every consume-queue unit) of a store."""
    paths = StorePaths(Path(root))
    report = VerifyReport()
    sizes: dict[int, int] = {}
    for base, path in _segments(paths):
        report.segments += 1
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            if length == 0:
                report.problems.append(Problem(base, "empty segment file"))
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                _scan_segment(base, buf, report, sizes)
            report.bytes_scanned += length
    if check_queues:
        _check_queues(paths, report, sizes)
    return report


def _check_queues(paths: StorePaths, report: VerifyReport, sizes: dict[int, int]) -> None:
    if not paths.consumequeue.is_dir():
        return
    min_offset = min(sizes) if sizes else 0
    for qdir in sorted(p for p in paths.consumequeue.glob("*/*") if p.is_dir()):
        where = f"consumequeue/{qdir.parent.name}/{qdir.name}"
        for path in sorted(p for p in qdir.iterdir() if _NAME.match(p.name)):
            first_unit = int(path.name) // CQ_UNIT_SIZE
            data = path.read_bytes()
            used = len(data.rstrip(b"\0"))
            for i in range((used + CQ_UNIT_SIZE - 1) // CQ_UNIT_SIZE):
                clog, size, _tag = CQ_UNIT.unpack_from(data, i * CQ_UNIT_SIZE)
                if size <= 0 or clog < min_offset:
                    continue  # an empty unit, or one below retention
                report.queue_units_checked += 1
                if sizes.get(clog) != size:
                    report.problems.append(
                        Problem(clog, f"queue unit {first_unit + i} points at no valid record of size {size}", where))


def main(argv: list[str] | None = None) -> int:
    """Command line: exit 0 when the store is intact, 1 when damage was found."""
    parser = argparse.ArgumentParser(prog="sparkmq-verify", description=__doc__.splitlines()[0])
    parser.add_argument("root", help="store directory (holds commitlog/ and consumequeue/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-queues", action="store_true", help="skip the consume-queue check")
    args = parser.parse_args(argv)
    report = verify_store(args.root, check_queues=not args.no_queues)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}))
    else:
        print(f"segments={report.segments} records_ok={report.records_ok} bytes={report.bytes_scanned} "
              f"end_offset={report.end_offset} queue_units={report.queue_units_checked} "
              f"problems={len(report.problems)}")
        for p in report.problems:
            print(f"  {p.where} offset={p.offset}: {p.reason}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

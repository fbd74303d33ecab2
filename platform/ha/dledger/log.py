"""The Raft log as the consensus core sees it (:class:`RaftLog`), and a file-backed one (:class:`FileRaftLog`).

Positions are **byte offsets**, as in the commit log: an entry is one batch of bytes appended by one
leader in one term, occupying ``[start, end)``; the next entry starts where it ends.  An entry is
named by where it ends: ``term_at(end)`` is its term.  Two facts make byte positions as good as Raft's
indexes:

* A leader appends the entries of its term at strictly increasing ends and never rewrites its own
  log, and every entry of term T in any log was made by the one leader of T.  So *one* entry of term
  T ends at a given offset: "an entry of term T ends at e" names the same entry in every log, which is
  what Raft's consistency check ("the entry before ``prev_offset`` has term ``prev_term``") needs.
* Entries are never empty, so no two entries end at the same offset.

The empty prefix before the first entry ends at the log's start (offset 0) with term 0: a leader
sending from the start sends ``prev_offset = 0, prev_term = 0``, which every log matches.

:class:`FileRaftLog` keeps two files in its directory; integers are little-endian::

    raft.data    the entries' bytes, back to back (entry [start, end) is at file position start)
    raft.index   one 32-byte record per entry:
                 start i64 | end i64 | term i64 | CRC-32 of the data u32 | CRC-32 of the 28 bytes before u32

An append writes the data first and the index record second, so a process killed between them
leaves data without an index record, and a torn index record fails its CRC.  Opening the log walks
the index and keeps the longest prefix of records that are whole, contiguous (each starts where the
previous one ended), in non-decreasing term order, and whose data is present with a matching CRC;
everything after it (both files) is cut.  With ``fsync=True`` an append is on disk when it returns
(data, then index), so it also survives a machine crash; with ``fsync=False`` it survives kill -9
(the page cache keeps it) but a machine crash may cut the tail, which Raft tolerates only if fewer
than a majority lose the same entries -- keep fsync on outside tests.
"""
from __future__ import annotations

import bisect
import os
import struct
import zlib
from pathlib import Path
from typing import Protocol, runtime_checkable

from ...common.errors import ErrorCode, SparkMQError

__all__ = ["DATA_FILE", "INDEX_FILE", "INDEX_RECORD", "EntryIndex", "FileRaftLog", "RaftLog"]

#: One index record: start, end, term, CRC-32 of the entry's data, CRC-32 of the preceding 28 bytes.
INDEX_RECORD = struct.Struct("<qqqII")
_RECORD_BODY = INDEX_RECORD.size - 4
DATA_FILE = "raft.data"
INDEX_FILE = "raft.index"
#: Data read per system call while verifying the log at open.
_VERIFY_CHUNK = 8 << 20


@runtime_checkable
class RaftLog(Protocol):
    """What the Raft core needs from a log whose positions are byte offsets (the commit log).

    All methods are called on the node's event loop thread, one at a time.  Offsets given to
    :meth:`entries_from` and :meth:`truncate` are entry boundaries (ends of entries, or the log's start).
    """

    def last(self) -> tuple[int, int]:
        """``(end offset, term of the last entry)``; ``(0, 0)`` for an empty log."""
        ...

    def append(self, term: int, data: bytes) -> tuple[int, int]:
        """Leader: append ``data`` (non-empty; one batch of records) as one entry of ``term``; its ``(start, end)``."""
        ...

    def append_at(self, start: int, term: int, data: bytes) -> None:
        """Follower: append one entry at ``start``, which must equal the current end (else ``ValueError``)."""
        ...

    def entries_from(self, offset: int, max_bytes: int) -> list[tuple[int, int, bytes]]:
        """Whole entries ``(start, term, data)`` from boundary ``offset``, at most ``max_bytes`` of data.

        At least one entry when ``offset`` is below the end (even one larger than ``max_bytes``, so a
        big batch still moves); ``[]`` at the end.
        """
        ...

    def term_at(self, offset: int) -> int | None:
        """The term of the entry that ENDS at ``offset``; 0 at the log's start; None when no entry ends there.

        None means: ``offset`` is inside an entry or beyond the end.
        """
        ...

    def entry_boundary(self, offset: int) -> int:
        """The greatest entry boundary at or below ``offset`` (the log's end when ``offset`` is beyond it)."""
        ...

    def truncate(self, offset: int) -> None:
        """Drop every entry from boundary ``offset`` on (a follower's conflicting, uncommitted tail)."""
        ...


class EntryIndex:
    """Where each entry of a Raft log starts and ends and its term, in memory and in an index file.

    The file holds one :data:`INDEX_RECORD` per entry (``start | end | term | data CRC | record CRC``).
    Opening it keeps the longest prefix of records that are whole, contiguous (each starts where the
    previous one ended, the first at 0), never empty and in non-decreasing term order; the rest is cut.
    Not thread-safe: its owner serializes calls.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.terms: list[int] = []
        #: The data CRC of each entry as recorded (0 when the log's records carry their own CRCs).
        self.data_crcs: list[int] = []
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        index = _read_all(self._fd)
        prev_end = prev_term = 0
        for pos in range(0, len(index) - INDEX_RECORD.size + 1, INDEX_RECORD.size):
            start, end, term, data_crc, record_crc = INDEX_RECORD.unpack_from(index, pos)
            if (zlib.crc32(index[pos:pos + _RECORD_BODY]) != record_crc or start != prev_end or end <= start
                    or term < prev_term):
                break
            self.starts.append(start)
            self.ends.append(end)
            self.terms.append(term)
            self.data_crcs.append(data_crc)
            prev_end, prev_term = end, term
        if len(index) != len(self.ends) * INDEX_RECORD.size:
            self.cut(len(self.ends))

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def end(self) -> int:
        """Where the last entry ends (0 when there is none)."""
        return self.ends[-1] if self.ends else 0

    def last(self) -> tuple[int, int]:
        """``(end offset, last term)``; ``(0, 0)`` when empty."""
        if not self.ends:
            return 0, 0
        return self.ends[-1], self.terms[-1]

    def add(self, start: int, end: int, term: int, data_crc: int = 0) -> None:
        """Record the entry ``[start, end)`` of ``term``, after the last one (``ValueError`` otherwise)."""
        if start != self.end or end <= start:
            raise ValueError(f"entry {start}..{end} does not follow the log's end {self.end}")
        last_term = self.terms[-1] if self.terms else 0
        if term < last_term:
            raise ValueError(f"term {term} below the last entry's term {last_term}")
        body = struct.pack("<qqqI", start, end, term, data_crc)
        _pwrite_all(self._fd, body + struct.pack("<I", zlib.crc32(body)), len(self.ends) * INDEX_RECORD.size)
        if self.fsync:
            os.fdatasync(self._fd)
        self.starts.append(start)
        self.ends.append(end)
        self.terms.append(term)
        self.data_crcs.append(data_crc)

    def cut(self, keep: int) -> None:
        """Keep the first ``keep`` entries only (file first, then memory)."""
        os.ftruncate(self._fd, keep * INDEX_RECORD.size)
        if self.fsync:
            os.fsync(self._fd)
        del self.starts[keep:], self.ends[keep:], self.terms[keep:], self.data_crcs[keep:]

    def term_at(self, offset: int) -> int | None:
        """The term of the entry ending at ``offset``; 0 at offset 0; None when no entry ends there."""
        if offset == 0:
            return 0
        i = bisect.bisect_left(self.ends, offset)
        if i < len(self.ends) and self.ends[i] == offset:
            return self.terms[i]
        return None

    def entry_boundary(self, offset: int) -> int:
        """The greatest entry end at or below ``offset`` (0 when none)."""
        i = bisect.bisect_right(self.ends, offset)
        return self.ends[i - 1] if i else 0

    def span_from(self, offset: int, max_bytes: int) -> range:
        """Indexes of the whole entries from boundary ``offset``: at least one below the end, then more while
        the span stays within ``max_bytes``; empty at the end.  ``ValueError`` for a non-boundary offset."""
        i = bisect.bisect_left(self.starts, offset)
        if i == len(self.starts):
            if offset != self.end:
                raise ValueError(f"offset {offset} is beyond the log's end")
            return range(i, i)
        if self.starts[i] != offset:
            raise ValueError(f"offset {offset} is not an entry boundary")
        j = i + 1
        while j < len(self.ends) and self.ends[j] - offset <= max_bytes:
            j += 1
        return range(i, j)

    def keep_count(self, offset: int) -> int:
        """How many entries end at or below ``offset`` (what a truncation to ``offset`` keeps)."""
        return bisect.bisect_right(self.ends, offset)

    def entries(self, start: int = 0, end: int | None = None) -> list[tuple[int, int, int]]:
        """The ``(start, end, term)`` of every entry within ``[start, end)``."""
        stop = len(self.ends) if end is None else bisect.bisect_right(self.ends, end)
        first = bisect.bisect_left(self.starts, start)
        return [(self.starts[k], self.ends[k], self.terms[k]) for k in range(first, stop)]


class FileRaftLog:
    """A :class:`RaftLog` in two files (``raft.data``, ``raft.index``) under ``directory``.

    Not thread-safe: one event loop uses it.  ``recovered_cut_bytes`` says how much data the last open
    cut from a torn tail.
    """

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._data_fd = os.open(self.directory / DATA_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        self._index: EntryIndex | None = None
        #: Data bytes cut from a torn tail when the log was opened.
        self.recovered_cut_bytes = 0
        try:
            self._index = EntryIndex(self.directory / INDEX_FILE, fsync=fsync)
            self._recover()
        except BaseException:
            self.close()
            raise

    @property
    def index(self) -> EntryIndex:
        """The entries' positions and terms."""
        assert self._index is not None
        return self._index

    # -- open and close -------------------------------------------------------------------------
    def _recover(self) -> None:
        data_size = os.fstat(self._data_fd).st_size
        index = self.index
        # Entries past the data, then the first whose data does not match its CRC, end the log.
        good = index.keep_count(data_size)
        good = self._verify_data(good)
        if good != len(index):
            index.cut(good)
        end = index.end
        if data_size != end:
            self.recovered_cut_bytes = data_size - end
            os.ftruncate(self._data_fd, end)
            if self.fsync:
                os.fsync(self._data_fd)

    def _verify_data(self, count: int) -> int:
        """How many of the first ``count`` indexed entries have data matching their CRC (one sequential pass)."""
        index = self.index
        chunk_start = 0
        chunk = b""
        for i in range(count):
            start, end = index.starts[i], index.ends[i]
            if end > chunk_start + len(chunk):
                chunk_start = start
                chunk = os.pread(self._data_fd, max(_VERIFY_CHUNK, end - start), start)
            if zlib.crc32(chunk[start - chunk_start:end - chunk_start]) != index.data_crcs[i]:
                return i
        return count

    def close(self) -> None:
        """Close both files (idempotent)."""
        if self._index is not None:
            self._index.close()
        if self._data_fd >= 0:
            os.close(self._data_fd)
            self._data_fd = -1

    # -- RaftLog ---------------------------------------------------------------------------------
    def last(self) -> tuple[int, int]:
        """``(end offset, last term)``; ``(0, 0)`` when empty."""
        return self.index.last()

    def append(self, term: int, data: bytes) -> tuple[int, int]:
        """Append one entry at the end; ``(start, end)``."""
        start = self.index.end
        self._write(start, term, data)
        return start, start + len(data)

    def append_at(self, start: int, term: int, data: bytes) -> None:
        """Append one entry at ``start``, which must be the current end."""
        if start != self.index.end:
            raise ValueError(f"append at {start}, but the log ends at {self.index.end}")
        self._write(start, term, data)

    def _write(self, start: int, term: int, data: bytes) -> None:
        if not data:
            raise ValueError("an entry cannot be empty (entries are named by where they end)")
        last_term = self.index.last()[1]
        if term < last_term:
            raise ValueError(f"term {term} below the last entry's term {last_term}")
        _pwrite_all(self._data_fd, data, start)
        if self.fsync:
            os.fdatasync(self._data_fd)
        self.index.add(start, start + len(data), term, zlib.crc32(data))  # data first: see the module docstring

    def entries_from(self, offset: int, max_bytes: int) -> list[tuple[int, int, bytes]]:
        """Whole entries from boundary ``offset``: at least one below the end, at most ``max_bytes`` beyond it."""
        index = self.index
        span = index.span_from(offset, max_bytes)
        if not span:
            return []
        blob = os.pread(self._data_fd, index.ends[span[-1]] - offset, offset)
        return [(index.starts[k], index.terms[k], blob[index.starts[k] - offset:index.ends[k] - offset])
                for k in span]

    def term_at(self, offset: int) -> int | None:
        """The term of the entry ending at ``offset``; 0 at offset 0; None when no entry ends there."""
        return self.index.term_at(offset)

    def entry_boundary(self, offset: int) -> int:
        """The greatest entry end at or below ``offset`` (0 when none)."""
        return self.index.entry_boundary(offset)

    def truncate(self, offset: int) -> None:
        """Drop every entry from boundary ``offset`` on (the index first: a crash in between leaves data to cut)."""
        if self.term_at(offset) is None:
            raise ValueError(f"truncate at {offset}: not an entry boundary of this log")
        self.index.cut(self.index.keep_count(offset))
        os.ftruncate(self._data_fd, offset)
        if self.fsync:
            os.fsync(self._data_fd)

    # -- reading (tests, tools) -------------------------------------------------------------------
    def read(self, start: int, end: int) -> bytes:
        """The raw bytes ``[start, end)`` of the log (any offsets within it)."""
        log_end = self.index.end
        if not 0 <= start <= end <= log_end:
            raise SparkMQError(ErrorCode.OFFSET_ILLEGAL, f"range {start}..{end} outside the log 0..{log_end}")
        return os.pread(self._data_fd, end - start, start) if end > start else b""

    def entries(self, start: int = 0, end: int | None = None) -> list[tuple[int, int, int]]:
        """The ``(start, end, term)`` of every entry within ``[start, end)``."""
        return self.index.entries(start, end)

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        end, term = self.last()
        return f"FileRaftLog({str(self.directory)!r}, entries={len(self.index)}, end={end}, last_term={term})"


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written

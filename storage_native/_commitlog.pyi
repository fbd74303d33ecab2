"""Typed contract of the storage core.

Implemented twice with the same behaviour: by the C extension
``sparkmq.storage_native._commitlog`` and by the pure-Python twin
``sparkmq.storage_native.pycommitlog``.  The byte formats are in ``layout.py``;
errors are ``StoreError(code, message)`` from ``errors.py`` and both
implementations produce the same code *and* the same message text (the texts are
quoted below).  Every method is thread-safe.

Errors common to every method of an open log: a closed log raises
``CLOSED: commit log is closed``; an OS failure raises ``IO_ERROR: <what>: <strerror>``;
no space for a new file raises ``DISK_FULL``.
"""
from collections.abc import Sequence

FORMAT_VERSION: int

#: The decoded record, in this order:
#: (total_size, crc32, queue_id, flag, queue_offset, commitlog_offset, sys_flag,
#:  born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
#:  prepared_offset, tag_hash, body, topic, properties)
#: hosts, body and properties are ``bytes``; topic is ``str``.
DecodedRecord = tuple[int, int, int, int, int, int, int, int, bytes, int, bytes, int, int, int, bytes, str, bytes]

#: One message of a batch: (body, properties, tag_hash, flag, sys_flag,
#: born_timestamp, born_host, reconsume_times, prepared_offset); born_host is
#: ``None`` (all zero) or 20 bytes.
BatchItem = tuple[bytes, bytes, int, int, int, int, bytes | None, int, int]


def decode_record(buf: bytes | memoryview, verify_crc: bool = False) -> DecodedRecord:
    """Decode one whole record (as returned by ``CommitLog.read``).

    Errors (``CORRUPT_RECORD``), checked in this order:
    ``record is malformed: buffer shorter than the header`` (len < 120),
    ``record is malformed: bad magic 0x%08x``,
    ``record is malformed: total_size %u != buffer length %u``,
    ``record is malformed: lengths overrun the record`` (body/topic/properties
    lengths do not add up to total_size exactly),
    ``record is malformed: topic is not UTF-8``,
    ``record fails its CRC check`` (only with ``verify_crc``).
    """


class ConsumeQueue:
    """The 20-byte-unit index of one (topic, queue_id); obtained from ``CommitLog.consume_queue``."""

    @property
    def topic(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def min_offset(self) -> int:
        """Smallest queue offset still served (advanced by retention)."""
    @property
    def max_offset(self) -> int:
        """Queue offset the next appended record will get (units are [min, max))."""

    def unit(self, queue_offset: int) -> tuple[int, int, int]:
        """(commitlog_offset, size, tag_hash) of one unit.

        ``INVALID_ARGUMENT: queue offset must be >= 0, got %d``;
        ``OFFSET_TOO_SMALL: queue offset %d is below the minimum queue offset %d``;
        ``OFFSET_OVERFLOW: queue offset %d is at or past the maximum queue offset %d``.
        """

    def units(self, queue_offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Up to ``max_count`` units from ``queue_offset``; [] when ``queue_offset == max_offset``.

        Same errors as ``unit`` (except that ``max_offset`` itself is allowed) plus
        ``INVALID_ARGUMENT: max_count must be >= 1, got %d``.
        """

    def truncate(self, max_queue_offset: int) -> None:
        """Drop (zero) every unit at or above ``max_queue_offset``; later appends continue from there.

        No-op when ``max_queue_offset >= max_offset``.
        ``INVALID_ARGUMENT: queue offset must be >= 0, got %d``;
        ``OFFSET_TOO_SMALL: queue offset %d is below the minimum queue offset %d``.
        """


class CommitLog:
    """Append-only log of mmap'd segments plus the consume queues its appends write.

    Opening recovers: segments are loaded (files in commitlog/ named by exactly 20
    digits; others are ignored) and checked:
    ``CORRUPT_STORE: segment %s: size %d != segment_size %d``,
    ``CORRUPT_STORE: segment %s is not aligned to segment_size %d``,
    ``CORRUPT_STORE: segment %s does not follow %s`` (%s = 20-digit names);
    queue files likewise with ``queue file %s/%d/%s: size %d != %d`` (topic,
    queue_id, name, actual, expected); then records are scanned from
    ``check_from`` (clamped up to ``min_offset``) validating magic, size, CRC and the
    stored commitlog_offset; the first record that fails (or a total_size of 0) is
    the end of the log.  Bytes after the end are zeroed up to the first 4096-byte
    page (pages aligned within the segment, starting with the page that holds the
    end) that is already all zero; later segments are deleted.  Consume-queue units
    pointing at or past the end are truncated; for every scanned record, the unit
    at its stored queue_offset is (re)written when it is missing or differs
    (commitlog_offset, total_size, tag_hash from the record header).  ``check_from`` must be a record
    boundary the caller knows to be durable (the store's checkpoint); 0 means a full
    scan.  A ``check_from`` beyond the end of the segment files raises
    ``CORRUPT_STORE: check_from %d is past the end of the log files (%d)``.

    Constructor errors: ``INVALID_ARGUMENT: segment_size must be a multiple of 4096
    and at least 4096, got %d``; ``INVALID_ARGUMENT: cq_units_per_file must be
    positive, got %d``; ``INVALID_ARGUMENT: check_from must be >= 0, got %d``.
    """

    def __init__(
        self,
        root: str,
        segment_size: int = 1 << 30,
        cq_units_per_file: int = 300_000,
        check_from: int = 0,
    ) -> None: ...

    @property
    def root(self) -> str: ...
    @property
    def segment_size(self) -> int: ...
    @property
    def cq_units_per_file(self) -> int: ...
    @property
    def min_offset(self) -> int:
        """Start offset of the oldest segment (0 for an empty log)."""
    @property
    def max_offset(self) -> int:
        """End of the last record: where the next append starts (before any roll)."""
    @property
    def flushed_offset(self) -> int:
        """Everything below this offset (log and queues) has been fdatasync'ed."""
    @property
    def closed(self) -> bool: ...
    @property
    def recovery(self) -> dict[str, int]:
        """What opening found: check_from (after clamping), end_offset,
        records_checked (valid records scanned), torn (1 if zeroing the tail met a
        non-zero byte or a later segment was discarded, else 0),
        discarded_segments, cq_units_truncated, cq_units_redone."""

    def append(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: bytes = b"",
        tag_hash: int = 0,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: bytes | None = None,
        store_timestamp: int = 0,
        store_host: bytes | None = None,
        reconsume_times: int = 0,
        prepared_offset: int = 0,
    ) -> tuple[int, int, int]:
        """Append one record and its consume-queue unit; returns
        (commitlog_offset, queue_offset, store_timestamp).

        ``store_timestamp`` 0 means "now" (ms).  body/properties accept any
        bytes-like object.  Validation happens before anything is written, in this
        order (all ``INVALID_ARGUMENT``):
        ``topic must not be empty``;
        ``topic is %d bytes, the limit is 255``;
        ``topic contains a character not allowed in a file name`` ('/', NUL, or the
        whole topic is '.' or '..');
        ``queue_id must be in [0, 65535], got %d``;
        ``born_host must be 20 bytes, got %d`` / ``store_host must be 20 bytes, got %d``;
        ``properties are %d bytes, the limit is 65535``;
        ``record of %d bytes does not fit in a segment of %d bytes`` (a record must
        satisfy size <= segment_size - 8).
        """

    def append_batch(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[BatchItem],
        store_timestamp: int = 0,
        store_host: bytes | None = None,
    ) -> tuple[int, int, list[int]]:
        """Append records to one queue in one lock hold; returns
        (first_queue_offset, store_timestamp, [commitlog_offset of each]).

        Queue offsets are consecutive from the first.  All items are validated
        before anything is written.  ``messages`` must be a list or tuple
        (else TypeError), each item a tuple (else TypeError).
        ``INVALID_ARGUMENT: batch is empty``;
        ``INVALID_ARGUMENT: message %d: expected 9 fields, got %d``;
        item errors are the ``append`` messages prefixed with ``message %d: ``.
        Topic/queue/store_host errors are reported without a prefix, before items.
        """

    def read(self, offset: int) -> bytes:
        """The whole record starting at ``offset`` (a copy).  No CRC check.

        ``INVALID_ARGUMENT: offset must be >= 0, got %d``;
        ``OFFSET_TOO_SMALL: offset %d is below the minimum offset %d``;
        ``OFFSET_OVERFLOW: offset %d is at or past the maximum offset %d``;
        ``OFFSET_ILLEGAL: no record starts at offset %d`` (wrong magic - a blank
        marker included -, total_size out of range, or a stored commitlog_offset
        that differs).
        """

    def read_view(self, offset: int) -> memoryview:
        """Like ``read`` but zero-copy: a read-only view into the mapped segment,
        which stays mapped while the view lives."""

    def store_timestamp_at(self, offset: int) -> int:
        """store_timestamp of the record at ``offset``; errors as ``read``."""

    def scan(self, offset: int, max_count: int = 1024, max_bytes: int = 4 << 20) -> tuple[int, list[tuple[int, bytes]]]:
        """Records in log order from the record boundary ``offset``: (next_offset, [(offset, record)]).

        Blank markers are skipped (the scan continues in the next segment).  Stops
        after ``max_count`` records or before passing ``max_bytes`` (but returns at
        least one record when one exists).  ``offset == max_offset`` gives
        (max_offset, []).  Errors as ``read`` (OFFSET_OVERFLOW only past max_offset),
        plus ``INVALID_ARGUMENT: max_count must be >= 1, got %d``.
        """

    def read_raw(self, offset: int, length: int) -> bytes:
        """Raw bytes [offset, offset + length) clipped to ``max_offset`` and to the
        end of the segment holding ``offset`` (for replication).  b"" at max_offset.
        ``INVALID_ARGUMENT: offset must be >= 0, got %d``;
        ``INVALID_ARGUMENT: length must be >= 0, got %d``; OFFSET_TOO_SMALL and
        OFFSET_OVERFLOW (past max_offset) as ``read``."""

    def get(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        tag_hashes: set[int] | frozenset[int] | None = None,
        max_bytes: int = 0,
    ) -> tuple[int, list[tuple[int, int, bytes]]]:
        """Read through the consume queue: (next_queue_offset, [(queue_offset, commitlog_offset, record)]).

        Examines units from ``queue_offset`` until ``max_count`` records matched,
        16384 units were examined, the queue ends, or ``max_bytes`` (> 0) would be
        passed (at least one record is returned when one matches).  Units whose
        tag_hash is not in ``tag_hashes`` (when given) and units pointing below the
        log's ``min_offset`` are skipped.  ``next_queue_offset`` is one past the last
        unit examined.  An unknown queue or ``queue_offset >= max_offset`` gives
        (queue_offset, []).  ``tag_hashes`` must be a set or frozenset (else TypeError).
        ``INVALID_ARGUMENT: queue offset must be >= 0, got %d``;
        ``INVALID_ARGUMENT: max_count must be >= 1, got %d``;
        ``OFFSET_TOO_SMALL: queue offset %d is below the minimum queue offset %d``.
        """

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's index, or None when nothing was ever appended to it."""

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) with a consume queue, sorted."""

    def segments(self) -> list[tuple[int, str]]:
        """(start_offset, file path) of every segment, oldest first."""

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole segments that end at or before ``offset``, never the newest
        one; returns how many.  Then every consume queue's ``min_offset`` moves to
        its first unit at or above the new ``min_offset`` and queue files wholly
        below it (never a queue's newest file) are deleted."""

    def flush(self) -> int:
        """fdatasync the log and every consume queue up to the current end; returns
        the new ``flushed_offset``.  Appends may run while it syncs (group commit)."""

    def close(self) -> None:
        """Flush and unmap everything; idempotent."""

    def __enter__(self) -> CommitLog: ...
    def __exit__(self, *exc: object) -> None: ...

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
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

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


#: One entry of a packed batch as ``decode_batch`` returns it: (body, properties, flag, born_timestamp).
PackedEntry = tuple[bytes, bytes, int, int]

_M = TypeVar("_M")


class OutgoingMessage(Protocol):
    """What ``encode_batch`` reads of a message (``platform.common.message.Message``)."""

    body: bytes | bytearray | memoryview
    tags: str | None
    keys: tuple[str, ...] | list[str] | str
    properties: dict[str, str]
    flag: int


def decode_batch(buf: bytes | bytearray | memoryview, count: int) -> list[PackedEntry]:
    """The ``count`` entries of a packed batch (docs/remoting.md "Packed batch").

    Checks the framing only, none of the rules ``CommitLog.append_packed`` adds:
    the broker's slow path (delayed batches).  ``count`` beyond int64 raises
    OverflowError.  Framing errors (shared with ``append_packed``; all
    ``MESSAGE_ILLEGAL``, checked over the whole buffer before any entry's content):
    ``batch count must be >= 1, got %d``;
    ``the batch holds %d messages, the count says %d`` (the data ends early);
    ``message %d: the entry header is truncated (%d bytes left)`` (fewer than 18 bytes);
    ``message %d: the entry needs %d bytes, %d are left`` (its lengths overrun the data);
    ``the batch has %d bytes after its %d messages`` (trailing bytes).
    """


def encode_batch(
    messages: Sequence[OutgoingMessage],
    id_prefix: str,
    month_start_ms: int,
    counter: int,
    born_timestamp: int,
) -> tuple[bytes, list[str], int]:
    """Validate messages and pack them into a packed batch: (data, msg_ids, next_counter).

    Each entry's properties are TAGS (``.tags``), KEYS (``.keys`` joined by one
    space; a str is one key, "" or () none), UNIQ_KEY, then ``.properties`` in dict
    order.  ``.properties`` may hold TAGS / KEYS / UNIQ_KEY: TAGS is the tag when
    ``.tags`` is None (else it must equal it), KEYS gives the keys (split on spaces)
    when ``.keys`` is empty (else it must equal them); a UNIQ_KEY is kept as the
    message's id.  Every other message gets ``id_prefix`` + 8 upper-hex digits of
    ``(born_timestamp - month_start_ms) & 0xFFFFFFFF`` + 4 upper-hex digits of the
    counter, ``counter = (counter + 1) & 0xFFFF`` before each id
    (``UniqueIdGenerator.next_id``'s format); ``next_counter`` is the counter after
    the last such id (``counter & 0xFFFF`` when none was made).  Every entry's
    born_timestamp is ``born_timestamp``.  See ``UniqueIdGenerator.with_state``.

    ``messages`` must be a list or tuple (else TypeError).  Argument errors:
    ``INVALID_ARGUMENT: id_prefix must be 20 hexadecimal digits, got %r``;
    month_start_ms / born_timestamp beyond int64 raise OverflowError;
    ``MESSAGE_ILLEGAL: the batch is empty``.
    Message errors, each prefixed with ``message %d: ``, checked in this order
    (``MESSAGE_ILLEGAL`` unless said otherwise; %r is Python's repr):
    ``the body must be bytes, got %s`` (str or no buffer; %s the type's name);
    ``the body must not be empty``;
    ``MESSAGE_TOO_LARGE``: ``the body is %d bytes, the limit is 4294967295``;
    ``the tag must be a str, got %s``;
    ``keys must be a tuple of strings, got %s``;
    ``keys must be non-empty strings without spaces``;
    ``property 'KEYS' is not valid Unicode``;
    ``property 'KEYS' contains a reserved control character (\\x01 or \\x02)``;
    ``properties must be a dict, got %s``;
    then for each (name, value) in dict order:
    ``property %r must map a string to a string``;
    ``property names must not be empty``;
    ``property %r is not valid Unicode`` (name or value cannot be UTF-8 encoded);
    ``property %r contains a reserved control character (\\x01 or \\x02)``;
    then ``the flag must be an int in [-2147483648, 2147483647], got %r``;
    ``tags %r disagree with property TAGS %r``;
    the tag as a property value (``property 'TAGS' ...``, the two texts above), then
    ``the TAGS value is empty, padded with whitespace or has '||'``;
    ``keys %r disagree with property KEYS`` (%r the list of ``.keys``);
    ``the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces``;
    ``PROPERTIES_TOO_LARGE``: ``the properties are %d bytes, the limit is 65535``.
    """


def gc_untrack(obj: object, /) -> None:
    """Take a container out of the garbage collector's lists (see ``storage_native.gc_untrack``)."""

def gc_track(obj: object, /) -> None:
    """Put a container back in the garbage collector's lists."""

def decode_records(
    buf: bytes | bytearray | memoryview,
    broker_name: str,
    factory: Callable[..., _M],
    inflate: Callable[[bytes], Any],
) -> list[_M]:
    """Build a message of every record of concatenated stored records (a pull's packed records).

    Calls ``factory(topic, broker_name, queue_id, queue_offset, msg_id,
    offset_msg_id, body, tags, keys, properties, born_timestamp, born_host,
    store_timestamp, store_host, reconsume_times, sys_flag, commitlog_offset,
    store_size)`` positionally (``platform.common.wire.ReceivedMessage``'s fields):
    msg_id is the UNIQ_KEY property ("" without), tags the TAGS property or None,
    keys the tuple of the KEYS property's space-separated keys, properties every
    property (``codec.decode_properties``: split on \\x02, empty pairs skipped, the
    name up to the first \\x01, the last of a repeated name wins); hosts are
    ``codec.unpack_host`` texts ("" all zero, "a.b.c.d:port", "[v6]:port");
    offset_msg_id is ``ids.encode_offset_msg_id(store_host or "0.0.0.0:0",
    commitlog_offset)``.  A COMPRESSED record's body (sys_flag bit 0) is
    ``inflate(body)``; ``inflate`` is not called for others.  Exceptions of
    ``factory`` and ``inflate`` propagate.  The CRC is not checked.

    Errors (``CORRUPT_RECORD``) for the record at each position, in this order:
    ``record is malformed: buffer shorter than the header`` (fewer than 120 bytes left),
    ``record is malformed: bad magic 0x%08x``,
    ``record is malformed: total_size %u != buffer length %u`` (total_size below 120
    or past the bytes left; the bytes left are shown),
    ``record is malformed: lengths overrun the record``,
    ``record is malformed: topic is not UTF-8``,
    ``record is malformed: properties are not UTF-8``.
    """


def encode_rocketmq_records(records: bytes | bytearray | memoryview, /) -> bytes:
    """Stored records back to back (a pull's packed records) re-encoded, back to back, as RocketMQ's stored
    messages (``layout.py``, "RocketMQ's encodings"): what RocketMQ's PULL_MESSAGE, QUERY_MESSAGE and
    VIEW_MESSAGE_BY_ID answer carry and ``MessageDecoder`` reads.

    Every field is carried over; BODYCRC is the CRC-32 of the body & 0x7FFFFFFF; MAGIC is V2 for topics
    longer than 127 bytes; a host that is IPv4-mapped (or all zero) is written as IPv4, any other as IPv6
    with its SYSFLAG bit (0x10 born, 0x20 store), the bits of the stored sys_flag cleared.  One pass of
    framing and one of copying, both with the GIL released for inputs of 64 KiB and more.

    Errors (``CORRUPT_RECORD``) for the record at each position: the framing errors of ``decode_records``
    (``record is malformed: buffer shorter than the header``, ``... bad magic 0x%08x``,
    ``... total_size %u != buffer length %u``, ``... lengths overrun the record``), then
    ``record is malformed: %d bytes do not fit RocketMQ's encoding`` (past 2**31 - 1).  The topic and the
    properties are copied as they are (not checked for UTF-8).
    """


def decode_rocketmq_batch(body: bytes | bytearray | memoryview, born_timestamp: int, /) -> tuple[bytes, int]:
    """A SEND_BATCH_MESSAGE body (``layout.py``, "RocketMQ's encodings") as a packed batch (docs/remoting.md
    "Packed batch") and its count: each entry's flag, body and properties, every entry born at
    ``born_timestamp`` (the request header's).  MAGIC and BODYCRC are ignored (0 from the Java client).

    Only what the conversion needs is checked here; the packed batch's rules (empty bodies, limits, the
    property pairs, TAGS / KEYS / UNIQ_KEY) are ``CommitLog.append_packed``'s, naming the same entry index.
    ``born_timestamp`` beyond int64 raises OverflowError.  Errors (``MESSAGE_ILLEGAL``), in this order:
    ``the batch is empty``; then per entry, prefixed with ``message %d: ``:
    ``the entry header is truncated (%d bytes left)`` (fewer than 20 bytes);
    ``the body length %d is negative``;
    ``the entry needs %d bytes, %d are left`` (the body and the properties length overrun the data);
    ``the properties length %d is negative`` (over 32767 bytes, as a Java short);
    ``the entry needs %d bytes, %d are left`` (the properties overrun the data);
    ``TOTALSIZE %d does not match the entry's %d bytes``;
    ``the properties are not valid UTF-8``.
    Framing and copying run with the GIL released for bodies of 64 KiB and more.
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
    @property
    def visible_max_offset(self) -> int:
        """What a consumer sees as ``max_offset``: one past the last unit whose commit-log offset is below
        the log's ``visible_offset`` (``max_offset`` when no limit is set; then it costs one comparison).
        Units are in log order, so it is found by a binary search (after one look at the last unit)."""

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
    pointing at or past the end are truncated, from each queue's tail back to its
    last unit that points below the end with a size > 0 (so empty units between
    them go too: lost queue pages); for every scanned record, the unit
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
        """Everything below this offset, log AND consume queues, has been fdatasync'ed
        (advanced by ``flush`` and ``close``; the end of the log after opening).  The only
        offset a caller may record as a recovery ``check_from``."""
    @property
    def log_flushed_offset(self) -> int:
        """Every log byte below this offset has been fdatasync'ed; the queue units of the
        records in [flushed_offset, log_flushed_offset) may not be, and recovery from a
        ``check_from`` at or below ``flushed_offset`` rewrites them from the log.  Advanced
        by ``flush_log``, ``flush`` and ``close``; always ``flushed_offset <=
        log_flushed_offset <= max_offset``."""
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

    def append_packed(
        self,
        topic: str,
        queue_id: int,
        data: bytes | bytearray | memoryview,
        count: int,
        *,
        sys_flag: int = 0,
        born_host: bytes | None = None,
        store_host: bytes | None = None,
        store_timestamp: int = 0,
        max_body: int = 4194304,
        max_properties: int = 32767,
        reserved_keys: tuple[str, ...] = (),
    ) -> tuple[int, int, int, bytes]:
        """Validate a packed batch (docs/remoting.md "Packed batch") and append its
        ``count`` messages to one queue in one lock hold; returns
        (first_queue_offset, store_timestamp, end_offset, offsets).

        Queue offsets are consecutive from the first; ``end_offset`` is the log
        offset just past the last record (what a SYNC_FLUSH waiter waits for);
        ``offsets`` is ``count`` little-endian int64 commit-log offsets.  Each record
        gets the entry's flag and born_timestamp, ``sys_flag``, ``born_host``,
        reconsume_times 0, prepared_offset 0 and as tag hash the CRC-32 of its TAGS
        value (0 without), as ``platform.common.codec.tag_hash``.  Validation and
        copying run with the GIL released.  Nothing is written unless every entry
        passes.

        Argument errors first, in this order: topic, queue_id, born_host and
        store_host as ``append``; sys_flag beyond int32 and store_timestamp,
        max_body, max_properties, count beyond int64 raise OverflowError;
        ``reserved_keys`` must be a tuple of str (else TypeError),
        ``INVALID_ARGUMENT: reserved key %d is %d bytes, the limit is 255``.
        Then the framing (the errors of ``decode_batch``), then each entry in order,
        prefixed with ``message %d: `` (``MESSAGE_ILLEGAL`` unless said otherwise):
        ``the body is empty``;
        ``MESSAGE_TOO_LARGE``: ``the body is %d bytes, the limit is %d`` (> max_body);
        ``PROPERTIES_TOO_LARGE``: ``the properties are %d bytes, the limit is %d`` (> max_properties);
        ``the batch is compressed but the body is not zlib data`` (sys_flag bit 0 set
        and the body does not start with a zlib header: byte0 & 0x0F == 8 and
        (byte0 << 8 | byte1) % 31 == 0);
        ``the properties are not valid UTF-8``;
        then each "name\\x01value\\x02" pair (%d its index):
        ``property %d is not terminated by \\x02``;
        ``property %d has no \\x01 between name and value``;
        ``property %d has an empty name``;
        ``property %d has more than one \\x01``;
        ``the property %s is reserved`` (its name is in ``reserved_keys``);
        ``property %s appears twice`` (TAGS, KEYS or UNIQ_KEY);
        ``the TAGS value is empty, padded with whitespace or has '||'`` (ASCII
        whitespace: space, \\t, \\n, \\v, \\f, \\r);
        ``the KEYS value is empty or has an empty key`` (leading, trailing or double space);
        ``the UNIQ_KEY must be 1 to 128 printable ASCII characters without spaces`` (0x21..0x7E);
        then ``the properties have no UNIQ_KEY``;
        ``INVALID_ARGUMENT``: ``record of %d bytes does not fit in a segment of %d bytes``.
        The C core validates and copies without the GIL; should another thread
        resize-free rewrite a bytearray ``data`` meanwhile so that the lengths no
        longer fit, it raises ``MESSAGE_ILLEGAL: the batch changed while it was
        being read`` instead of reading past the buffer.
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
        which stays mapped while the view lives (a later ``truncate`` that cuts the
        record zeroes or rewrites what the view shows)."""

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
        end of the segment holding ``offset`` (no record boundaries: replication uses
        ``read_replication``).  b"" at max_offset.
        ``INVALID_ARGUMENT: offset must be >= 0, got %d``;
        ``INVALID_ARGUMENT: length must be >= 0, got %d``; OFFSET_TOO_SMALL and
        OFFSET_OVERFLOW (past max_offset) as ``read``."""

    def read_replication(self, offset: int, max_bytes: int) -> bytes:
        """What a master ships to a slave (``append_replicated``): the log's bytes from the
        entry boundary ``offset``, whole entries only, up to ``max_bytes``.

        An entry is a record or a blank marker; a blank marker comes whole, its padding to
        the segment end included, and the run goes on at the start of the next segment, so
        the answer is exactly the log's bytes [offset, offset + len(answer)).  Stops before
        passing ``max_bytes`` but returns at least one entry when one exists; b"" when
        ``offset == max_offset``.  No CRC check (the slave checks).  The walk runs with the
        log lock held and the GIL released, the copy with the GIL released when large.

        ``INVALID_ARGUMENT: offset must be >= 0, got %d``;
        ``OFFSET_TOO_SMALL: offset %d is below the minimum offset %d``;
        ``OFFSET_OVERFLOW: offset %d is at or past the maximum offset %d`` (past max_offset);
        ``INVALID_ARGUMENT: max_bytes must be >= 1, got %d``;
        ``OFFSET_ILLEGAL: no record starts at offset %d`` (neither a record as ``read``
        finds one nor a blank marker whose size is the rest of its segment).
        """

    def append_replicated(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """A slave's append: write ``data``, a run of whole entries of its master's log (what
        the master's ``read_replication(offset, ...)`` returned), at the same offsets, and
        index each record in its consume queue at the queue offset the record holds; returns
        the new ``max_offset`` (``offset + len(data)``).

        The slave's log must have the master's ``segment_size``; it then ends up byte for
        byte equal to the master's over the replicated range (queue files included), and
        recovers like it after a crash.  The slave never assigns queue offsets itself.
        Everything is checked before anything is written; any fault raises and leaves the
        log unchanged.  Empty ``data`` writes nothing and returns ``max_offset``.  Like
        ``append_packed``: one lock hold for the writes, the C core checks (CRCs included)
        and copies with the GIL released; a buffer other than ``bytes`` is copied first.

        Errors, in this order: ``CLOSED``; offset beyond int64 as any offset;
        ``INVALID_ARGUMENT: offset must be >= 0, got %d``;
        ``OFFSET_MISMATCH: replicated data starts at offset %d, the log ends at %d``
        (``offset != max_offset``: the slave must report its ``max_offset`` and fetch from
        there).  Then each entry at log offset %d, in order (``CORRUPT_RECORD`` unless said
        otherwise; the data was damaged on the way or the segment sizes differ):
        ``the data ends inside the record at offset %d (%d bytes left)`` (a trailing
        partial entry: the master ships whole ones only);
        ``blank marker at offset %d has size %d, its segment has %d bytes left``;
        ``record at offset %d has an impossible size %d (%d bytes left in its segment)``
        (below the minimum record, past the segment end, or leaving 1..7 bytes: no room
        for a blank marker);
        ``record at offset %d fails its CRC check``;
        ``record at offset %d is malformed: lengths overrun the record``;
        ``record at offset %d is malformed: topic is not UTF-8``;
        ``record at offset %d is malformed: topic is not a valid file name`` (empty, '/',
        NUL, '.' or '..');
        ``record at offset %d is malformed: queue_id %d is out of range`` (not in [0, 65535]);
        ``OFFSET_MISMATCH: record at offset %d says it is at offset %d`` (its stored
        commitlog_offset);
        ``bad magic 0x%08x at offset %d``.
        Then the queues: ``OFFSET_MISMATCH: record at offset %d has queue offset %d, queue
        %s/%d expects %d`` (the queue's ``max_offset``, 0 for a new queue, plus the records
        of the same queue earlier in the run).  An I/O failure while writing (``DISK_FULL``,
        ``IO_ERROR``) may leave a prefix of whole entries written, each record with its
        unit; ``max_offset`` says how far.
        """

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

        Under a visibility limit (``set_visible_offset``) a unit whose commit-log offset is at or past it
        ends the read: that unit and the ones after it are not examined, ``next_queue_offset`` is its
        queue offset (so the answer is what it would be if the queue ended there).
        """

    def read_packed(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int,
        tag_hashes: set[int] | frozenset[int] | None = None,
        max_bytes: int = 0,
    ) -> tuple[int, int, bytes]:
        """``get`` with the matched records concatenated: (next_queue_offset, count, data).

        The same units are examined and matched, with the same errors, as ``get``;
        ``data`` is the records back to back (docs/remoting.md "Packed records"),
        copied in one bytes object (with the GIL released when large, as ``get``).
        """

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue's index, or None when nothing was ever appended to it (or ``truncate`` took every unit
        it had from queue offset 0 on: its files are gone; a ``ConsumeQueue`` obtained before still works
        and sees the queue grow again)."""

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) with a consume queue, sorted (not one ``truncate`` took away)."""

    def segments(self) -> list[tuple[int, str]]:
        """(start_offset, file path) of every segment, oldest first."""

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole segments that end at or before ``offset``, never the newest
        one; returns how many.  Then every consume queue's ``min_offset`` moves to
        its first unit at or above the new ``min_offset`` and queue files wholly
        below it (never a queue's newest file) are deleted."""

    def truncate(self, offset: int) -> int:
        """Cut an uncommitted tail off (a Raft log): everything from ``offset`` on goes; returns the new
        ``max_offset``, which is ``offset``.

        ``offset`` must be an entry boundary as ``read_replication`` takes one: a record's start, the
        start of a blank marker closing its segment, or ``max_offset`` (a no-op but for the lowering
        below).  Then, in one lock hold (the GIL released): every consume queue loses its units pointing
        at or past ``offset`` (and empty ones among them, as recovery), so its ``max_offset`` is one past
        its last kept unit and its next append gets that queue offset; a queue left without any unit from
        queue offset 0 loses its files and directory (the topic's too when empty) and leaves ``queues()``;
        the files of the others keep their first file (zeroed past the cut) as ``ConsumeQueue.truncate``.
        Segments starting at or past ``offset`` are deleted (the oldest one stays, zeroed, when
        ``offset`` is its start and above 0: it holds ``min_offset``); the written bytes of the segment
        holding ``offset`` from ``offset`` on are zeroed, so recovery stops there.  The bytes below
        ``offset`` are untouched (a blank marker closing the segment before it stays), so the log equals,
        file for file, one that replicated only [min_offset, offset) of it, and appends, packed appends
        and ``append_replicated(offset, ...)`` go on from ``offset``.  ``flushed_offset``,
        ``log_flushed_offset`` and ``visible_offset`` (when set) are lowered to ``offset``; a ``flush``
        or ``flush_log`` that was syncing meanwhile publishes nothing.  The zeroes and deletions are
        durable after the next ``flush`` (the caller lowers its checkpoint to ``offset`` or below first:
        a ``check_from`` past the new end would make recovery keep zeroed bytes as log).  Concurrent
        readers never return bytes it changed (the C core copies outside the lock and reads again when
        a truncation began meanwhile); a ``read_view`` of a cut record is no copy and shows the change.

        Errors (nothing changes): ``CLOSED``; offsets beyond int64 as ``read``;
        ``INVALID_ARGUMENT: offset must be >= 0, got %d``;
        ``OFFSET_TOO_SMALL: offset %d is below the minimum offset %d``;
        ``OFFSET_OVERFLOW: offset %d is at or past the maximum offset %d`` (past max_offset);
        ``OFFSET_ILLEGAL: no record starts at offset %d``.  A failure to delete a file (``IO_ERROR``) is
        raised after everything else was done.
        """

    prefault_readahead: bool
    """Whether the thread that faults in the active segment ahead of the appends leaves readahead on (False
    by default).  On, the page cache fills with large folios a readahead window at a time, about half the
    kernel time per byte; but a sync writes back whole folios, so a log synced after every few appends
    (SYNC_FLUSH) keeps it off.  ``CLOSED`` after ``close``."""

    @property
    def visible_offset(self) -> int | None:
        """The visibility limit of the consume-queue readers (a Raft commit index), None when unset."""

    def set_visible_offset(self, offset: int | None) -> None:
        """Set the visibility limit (None removes it; the default): ``get``, ``read_packed`` and
        ``ConsumeQueue.visible_max_offset`` treat units whose commit-log offset is at or past it as not
        there yet.  Nothing else is limited: ``read``, ``scan``, ``read_raw``, ``read_replication``,
        ``append_replicated``, ``ConsumeQueue.unit(s)``/``max_offset``, recovery and retention see the
        whole log.  Any value: it may go down, lie beyond ``max_offset`` or inside a record (the
        ``MessageStore`` keeps it monotonic).  Not persisted.  ``truncate`` lowers it to its offset.
        ``offset`` beyond int64 raises OverflowError;
        ``INVALID_ARGUMENT: visible offset must be >= 0, got %d``; then ``CLOSED``.
        """

    def queues_in_range(self, start: int, end: int) -> list[tuple[str, int]]:
        """(topic, queue_id) of every record starting in the log range [start, end), each once, in order of
        first appearance (only queues ``queues()`` lists).

        The range is clamped to [min_offset, max_offset]; [] when it is empty.  The clamped ``start`` must
        be an entry boundary (as ``truncate``) when the range is not empty.  Walks the record headers with
        the log lock held 4096 records at a time (the GIL released); a ``truncate`` between two chunks
        ends the walk (the cut records are gone).  Errors: ``CLOSED``;
        ``INVALID_ARGUMENT: start must be >= 0, got %d``; ``INVALID_ARGUMENT: end must be >= 0, got %d``;
        ``OFFSET_ILLEGAL: no record starts at offset %d``.
        """

    def flush(self) -> int:
        """fdatasync the log and every consume queue up to the current end; returns
        the new ``flushed_offset`` (``log_flushed_offset`` moves with it).  Appends may
        run while it syncs (group commit).  ``flush``, ``flush_log`` and ``close`` run
        one at a time."""

    def flush_log(self) -> int:
        """fdatasync the log alone (the segments written since the last sync, and the new
        entry of a rolled segment in commitlog/) up to the current end; returns the new
        ``log_flushed_offset``; ``flushed_offset`` does not move.  The SYNC_FLUSH group
        commit: consume queues are derived data that recovery rebuilds from the log.
        Appends may run while it syncs; a second call with no append in between syncs
        nothing and returns the same offset.  ``CLOSED`` after ``close``."""

    # The group-commit syncer (native only; the Python twin has none and its flush service syncs on a
    # Python thread).
    def start_syncer(self) -> None:
        """Start the group-commit thread: while a ``request_sync`` asks for an offset past what a started sync
        covers, it runs ``flush_log`` back to back, with no Python and no GIL, then wakes the threads blocked
        in ``wait_log_flushed`` and writes 1 to every eventfd registered with ``add_sync_notifier``.
        It may be started again after ``stop_syncer``.  ``INVALID_ARGUMENT`` while it runs; ``CLOSED`` after
        ``close``."""

    def stop_syncer(self) -> None:
        """Stop and join the group-commit thread (idempotent; ``close`` stops it too); blocked
        ``wait_log_flushed`` calls return at once."""

    def request_sync(self, offset: int) -> None:
        """Ask the group-commit thread for a sync covering ``offset`` (the end of a record already
        appended); a no-op before ``start_syncer`` and after ``stop_syncer``."""

    def wait_log_flushed(self, offset: int, timeout_s: float) -> bool:
        """Block, the GIL released, until ``log_flushed_offset`` >= ``offset``: True; False at the timeout,
        or once the group-commit thread stopped (or never started) with the offset not synced."""

    def add_sync_notifier(self, fd: int) -> None:
        """After each sync of the group-commit thread, write 1 (8 bytes) to the eventfd ``fd``: an event
        loop's wake-up.  At most 64; ``INVALID_ARGUMENT`` past that, or before ``start_syncer``."""

    def remove_sync_notifier(self, fd: int) -> None:
        """Stop writing to ``fd``: once this returns the descriptor may be closed."""

    def syncer_state(self) -> tuple[int, int, str]:
        """(syncs completed, syncs failed, the last failure's text or '') of the group-commit thread."""

    def release_page_cache(self, keep: int) -> None:
        """Drop from the page cache the log's pages that are durable (below ``log_flushed_offset``) and more
        than ``keep`` bytes behind ``max_offset``, once at least 16 MiB of them are not dropped yet; ``keep``
        <= 0 does nothing.  The flush service calls it after each full flush (``StoreConfig.page_cache_keep``):
        a log written faster than it is read would otherwise fill the page cache with pages only a lagging
        reader wants, and the writer pays far more for a new page than for a recycled one.  A reader of the
        dropped bytes reads them from the disk; nothing is lost.  Runs with the GIL released; a closed log
        does nothing."""

    def close(self) -> None:
        """Flush and unmap everything; idempotent."""

    def __enter__(self) -> CommitLog: ...
    def __exit__(self, *exc: object) -> None: ...

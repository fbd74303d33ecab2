"""Commit-log records as Arrow columns: what bulk pulls carry, decoded in bulk.

A bulk reader (the Spark source, the dispatch job) asks a broker for the *records* of a
queue range as they are stored (:func:`records_array`: one binary column, one record per
row -- the broker only copies bytes) and decodes them itself (:func:`decode_records`), the
way Kafka clients decode the record batches a broker sends as they are on disk.  That
moves the decoding off the broker, whose one process also takes every send, onto the
reader's machine.  :func:`records_to_arrow` does both in one step (the broker's own
columnar pulls).  A remoting pull answers the records back to back in one frame body;
:func:`packed_records_array` makes that body the binary column without copying it.

The result has ``wire.PULL_SCHEMA`` and the same rows as ``wire.stored_to_arrow`` over
the decoded messages.  The record layout is ``storage_native.layout``.

Variable-length parts are cut out of the records through Arrow *view* arrays (a length and
an offset per value) cast to plain binary/string arrays, so Arrow copies each value with one
``memcpy``; numpy only computes positions and lengths.
"""
from __future__ import annotations

import re
import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...storage_native.layout import RECORD_FIELDS, RECORD_HEADER, RECORD_HEADER_SIZE, RECORD_MAGIC
from .codec import unpack_host
from .errors import ErrorCode, SparkMQError
from .ids import offset_msg_id_prefix
from .message import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQUE_ID
from .wire import PULL_SCHEMA

__all__ = ["EMPTY_PULL_BATCH", "RECORDS_SCHEMA", "decode_records", "map_value", "map_values", "packed_records_array",
           "records_array", "records_to_arrow"]

#: A bulk pull's answer in records form: one stored record per row, in queue order.
RECORDS_SCHEMA = pa.schema([pa.field("record", pa.binary(), nullable=False)])

#: numpy's spelling of the struct codes of layout.RECORD_HEADER (a "20s" host: 20 raw bytes).
_NUMPY_CODES = {"I": "<u4", "i": "<i4", "q": "<i8"}
#: The fixed record header (layout.RECORD_HEADER) as a packed numpy record type.
_HEADER_DTYPE = np.dtype([(name, _NUMPY_CODES.get(code, f"V{count}")) for name, (count, code) in
                          zip(RECORD_FIELDS, re.findall(r"(\d*)([Iiqs])", RECORD_HEADER.format), strict=True)])
assert _HEADER_DTYPE.itemsize == RECORD_HEADER_SIZE
# Built from typed empty arrays: from_pylist would import pandas (pyarrow checks lists for pandas objects),
# 0.4 s here in every process that imports this module, Spark's Python workers among them.
EMPTY_PULL_BATCH = pa.record_batch([pa.nulls(0, field.type) for field in PULL_SCHEMA], schema=PULL_SCHEMA)
_PROPERTY_MAP = PULL_SCHEMA.field("properties").type
#: Bytes an Arrow binary/string view element holds inline (longer values point into a buffer).
_INLINE = 12
_VIEW_TYPES = {pa.binary(): pa.binary_view(), pa.string(): pa.string_view()}
#: Masks keeping the first k bytes of a little-endian word: 8-byte words (k = 0..8), 4-byte ones (k = 0..4).
_KEEP8 = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
_KEEP4 = np.array([(1 << (8 * k)) - 1 for k in range(5)], dtype=np.uint32)
#: Above this many runs of equal hosts in a batch, distinct hosts are found by sorting instead.
_MAX_HOST_RUNS = 256


def _words(buf: np.ndarray, dtype: str) -> np.ndarray:
    """``buf`` read as little-endian words of ``dtype`` starting at every byte (unaligned, no copy)."""
    size = np.dtype(dtype).itemsize
    return np.ndarray((len(buf) - size + 1,), dtype=dtype, buffer=buf, strides=(1,))


def _first_bytes(buf: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes at each of ``starts`` as an 8-byte and a 4-byte word (past the buffer's end: zeros)."""
    late = starts + _INLINE > len(buf)
    if len(buf) < 2 * _INLINE or late.any():
        # Values near the end: read them from a zero-padded copy of the last bytes.
        base = max(0, len(buf) - 2 * _INLINE)
        tail = np.zeros(4 * _INLINE, dtype=np.uint8)
        tail[:len(buf) - base] = buf[base:]
        if len(buf) < 2 * _INLINE:  # base is 0: every value is read from the copy
            return _words(tail, "<u8")[starts], _words(tail, "<u4")[starts + 8]
        at = starts[late] - base
        safe = np.where(late, 0, starts)
        lo, hi = _words(buf, "<u8")[safe], _words(buf, "<u4")[safe + 8]
        lo[late], hi[late] = _words(tail, "<u8")[at], _words(tail, "<u4")[at + 8]
        return lo, hi
    return _words(buf, "<u8")[starts], _words(buf, "<u4")[starts + 8]


def _gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A binary/string array of the byte ranges ``[starts, starts + lengths)`` of ``buf`` (in bounds).

    Made as an Arrow view array over ``buf`` -- 16 bytes per row: the length, then the value
    inline when it has at most 12 bytes, else its first 4 bytes and its offset -- cast to the
    contiguous type: Arrow copies each range with one ``memcpy`` instead of numpy indexing
    every byte (a third of the time for 100-byte bodies).
    """
    n = len(starts)
    if n == 0 or len(buf) == 0:
        return pa.array([b""] * n, type_)
    lo, hi = _first_bytes(buf, starts)
    lo &= _KEEP8[np.minimum(lengths, 8)]  # inline bytes past a value must be zero
    hi &= _KEEP4[np.clip(lengths - 8, 0, 4)]
    long = lengths > _INLINE
    words = np.empty((n, 4), dtype=np.uint32)  # length, prefix | inline bytes, buffer index, offset
    words[:, 0] = lengths
    words[:, 1] = lo & 0xFFFFFFFF
    words[:, 2] = np.where(long, 0, lo >> np.uint64(32))
    words[:, 3] = np.where(long, starts, hi)
    view = pa.Array.from_buffers(_VIEW_TYPES[type_], n, [None, pa.py_buffer(words), pa.py_buffer(buf)])
    return view.cast(type_)


def _headers(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The fixed headers of the records at ``starts`` (each in bounds) as one contiguous record array.

    Each header is copied whole (an Arrow view cast, as in :func:`_gather`) rather than indexed
    byte by byte; the view's prefix is the header's first 4 bytes (its total size).
    """
    n = len(starts)
    words = np.zeros((n, 4), dtype=np.uint32)
    words[:, 0] = RECORD_HEADER_SIZE
    words[:, 1] = _words(buf, "<u4")[starts]
    words[:, 3] = starts
    view = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(words), pa.py_buffer(buf)])
    return np.frombuffer(view.cast(pa.binary()).buffers()[2], dtype=_HEADER_DTYPE, count=n)


def _repeated(value: str, n: int) -> pa.StringArray:
    """``value`` ``n`` times as a string array (built in numpy, not from a list of n references)."""
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _hosts(raw: np.ndarray) -> tuple[pa.Array, list[str]]:
    """The 20-byte host fields as "ip:port" strings; each distinct host is parsed once."""
    n = len(raw)
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(n, 20)
    words = rows.view("<u4")  # (n, 5): five compares a row instead of twenty
    if (words == words[0]).all():  # the usual case: one store host, one producer host per batch
        name = unpack_host(rows[0].tobytes())
        return _repeated(name, n), [name]
    # Producers on several connections, their batches in runs: parse the host of each run once.
    heads = np.flatnonzero(np.concatenate([[True], (words[1:] != words[:-1]).any(axis=1)]))
    if len(heads) <= _MAX_HOST_RUNS:
        ids: dict[bytes, int] = {}
        run_ids = [ids.setdefault(rows[h].tobytes(), len(ids)) for h in heads.tolist()]
        index = np.repeat(np.array(run_ids, dtype=np.int32), np.diff(np.append(heads, n)))
        names = [unpack_host(host) for host in ids]
    else:  # interleaved producers: sort out the distinct hosts
        distinct, inverse = np.unique(rows.view("V20").ravel(), return_inverse=True)
        names = [unpack_host(bytes(d)) for d in distinct]
        index = inverse.ravel().astype(np.int32)
    return pa.array(names, pa.string()).take(pa.array(index)), names


_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _offset_msg_ids(prefix: str, clog: np.ndarray) -> pa.Array:
    """``prefix + f"{offset:016X}"`` for every commit-log offset (ids.encode_offset_msg_id), in numpy."""
    n = len(clog)
    digits = np.ascontiguousarray(clog.astype(">u8")).view(np.uint8).reshape(n, 8)
    width = len(prefix) + 16
    chars = np.empty((n, width), dtype=np.uint8)
    chars[:, :len(prefix)] = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    chars[:, len(prefix)::2] = _HEX[digits >> 4]
    chars[:, len(prefix) + 1::2] = _HEX[digits & 0xF]
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])


def _property_map(data: np.ndarray, bounds: np.ndarray) -> pa.MapArray:
    """Rows ``data[bounds[i]:bounds[i + 1]]`` of ``key\\x01value\\x02`` pairs (codec.encode_properties) as a map.

    Vectorised over the separators' positions: a pair ends at a ``\\x02`` or at its row's end
    (empty pairs are skipped); its key ends at its first ``\\x01`` -- a pair without one is a
    key with an empty value, as ``decode_properties`` reads it.
    """
    pair_ends = np.flatnonzero(data == 2)
    names_end = np.flatnonzero(data == 1)
    pieces = _well_formed_pairs(data, bounds, pair_ends, names_end)
    if pieces is None:
        pieces = _any_pairs(data, bounds, pair_ends, names_end)
    offsets, start, sep, has, stop = pieces
    key_stop = np.where(has, sep, stop) if has is not None else sep
    value_start = np.where(has, sep + 1, stop) if has is not None else sep + 1
    keys = _gather(data, start, key_stop - start, pa.string())
    values = _gather(data, value_start, stop - value_start, pa.string())
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values).cast(_PROPERTY_MAP)


_Pairs = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", np.ndarray]


def _well_formed_pairs(data: np.ndarray, bounds: np.ndarray, pair_ends: np.ndarray,
                       names_end: np.ndarray) -> _Pairs | None:
    """(map offsets, pair starts, name separators, None, pair ends) when every row is what
    ``encode_properties`` writes -- non-empty ``key\\x01value\\x02`` pairs, each with one
    ``\\x01`` -- which the stored properties always are; else None.
    """
    if len(pair_ends) != len(names_end):
        return None
    if len(pair_ends) == 0:
        return (np.zeros(len(bounds), dtype=np.int32), pair_ends, names_end, None, pair_ends) \
            if bounds[-1] == bounds[0] else None
    # Rows are back to back: each pair starts right after the previous \x02 (or at 0) ...
    start = np.empty(len(pair_ends), dtype=np.int64)
    start[0] = 0
    start[1:] = pair_ends[:-1] + 1
    # ... provided every row ends with a \x02 (or is empty) and every pair has its name before its one \x01.
    row_ends = bounds[1:][bounds[1:] > bounds[:-1]]
    if bounds[0] != 0 or not (data[row_ends - 1] == 2).all() or not (names_end > start).all() \
            or not (names_end < pair_ends).all():
        return None
    offsets = np.searchsorted(pair_ends, bounds).astype(np.int32)  # pairs before each row's start
    return offsets, start, names_end, None, pair_ends


def _any_pairs(data: np.ndarray, bounds: np.ndarray, pair_ends: np.ndarray, names_end: np.ndarray) -> _Pairs:
    """(map offsets, pair starts, first-separator positions, has-separator mask, pair ends) of any rows."""
    n = len(bounds) - 1
    # Every row boundary and every position after a \x02 starts a piece; the merge of two sorted runs.
    cuts = np.sort(np.concatenate([bounds.astype(np.int64), pair_ends + 1]), kind="stable")
    start, stop = cuts[:-1], cuts[1:]
    trailing = np.zeros(len(start), dtype=bool)
    nonempty = np.flatnonzero(stop > start)
    trailing[nonempty] = data[stop[nonempty] - 1] == 2
    stop = stop - trailing
    keep = stop > start
    start, stop = start[keep], stop[keep]
    rows = np.searchsorted(bounds, start, side="right") - 1
    if len(names_end):
        first = np.searchsorted(names_end, start)
        sep = names_end[np.minimum(first, len(names_end) - 1)]
        has = (first < len(names_end)) & (sep < stop)
    else:
        sep, has = stop, np.zeros(len(start), dtype=bool)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    return offsets, start, sep, has, stop


def map_value(props: pa.MapArray, name: str, occurrence: str = "first") -> pa.Array:
    """Each row's value of key ``name`` in a map array (the ``occurrence``, "first" or "last", when repeated;
    NULL when absent).

    What ``pc.map_lookup(props, name, occurrence)`` gives, in a few vectorised steps over the
    flattened keys instead of a per-row search (about a tenth of the time).
    """
    return map_values(props, (name,), occurrence)[0]


def map_values(props: pa.MapArray, names: Sequence[str], occurrence: str = "first") -> list[pa.Array]:
    """:func:`map_value` of each of ``names``, the row of every key found once for them all."""
    if occurrence not in ("first", "last"):
        raise ValueError(f"occurrence must be 'first' or 'last', got {occurrence!r}")
    n = len(props)
    bounds = props.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    lo, hi = int(bounds[0]), int(bounds[-1])
    keys, items = props.keys.slice(lo, hi - lo), props.items.slice(lo, hi - lo)
    key_rows: np.ndarray | None = None
    out = []
    for name in names:
        hits = np.flatnonzero(pc.fill_null(pc.equal(keys, name), False).to_numpy(zero_copy_only=False))
        if hits.size == 0:
            out.append(pa.nulls(n, items.type))
            continue
        if key_rows is None:
            key_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(bounds))
        rows = key_rows[hits]
        # hits ascend, so each row's hits are one run: its first starts the run, its last ends it
        change = rows[1:] != rows[:-1]
        ends = np.flatnonzero(np.concatenate([[True], change]) if occurrence == "first"
                              else np.concatenate([change, [True]]))
        index = np.full(n, -1, dtype=np.int64)
        index[rows[ends]] = hits[ends]
        out.append(items.take(pa.array(index, mask=index < 0)))
    return out


def records_array(records: Sequence[bytes | memoryview]) -> pa.BinaryArray:
    """Whole records as one binary array (one copy of the bytes, no parsing)."""
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    offsets = np.zeros(len(records) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(records),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(records))])


_TOTAL = struct.Struct("<I").unpack_from
#: A record's magic without its low byte (the format version): "QMS" in bytes 5..7 of every record.
_MAGIC_MASK = np.uint32(0xFFFFFF00)
_MAGIC_HIGH = np.uint32(RECORD_MAGIC & 0xFFFFFF00)


def _record_bounds(buf: np.ndarray) -> np.ndarray | None:
    """Where each record of ``buf`` starts (and the end), found in bulk; None when that cannot be proven.

    The candidates are the positions 4 bytes before a record magic; they are the records exactly
    when the first is at 0 and each next one is where the previous one's size says (the chain
    walk below), so a body that happens to hold the magic's bytes only sends the caller back to
    the walk.
    """
    if len(buf) < RECORD_HEADER_SIZE:
        return None
    words = _words(buf, "<u4")
    near = np.flatnonzero(buf[7:] == np.uint8(RECORD_MAGIC >> 24))  # the magic's top byte, then the whole word
    starts = near[(words[near + 4] & _MAGIC_MASK) == _MAGIC_HIGH]
    if len(starts) == 0 or starts[0] != 0:
        return None
    sizes = words[starts].astype(np.int64)
    if (sizes < RECORD_HEADER_SIZE).any() or starts[-1] + sizes[-1] != len(buf) \
            or not np.array_equal(starts[1:], starts[:-1] + sizes[:-1]):
        return None
    bounds = np.empty(len(starts) + 1, dtype=np.int32)
    bounds[:-1] = starts
    bounds[-1] = len(buf)
    return bounds


def _walk_bounds(data: bytes | memoryview, count: int | None) -> np.ndarray:
    """Where each record of ``data`` starts (and the end), walking the sizes one record at a time."""
    end = len(data)
    bounds = [0]
    append = bounds.append
    pos = 0
    try:
        while pos < end:
            size = _TOTAL(data, pos)[0]
            if size < RECORD_HEADER_SIZE:
                break
            pos += size
            append(pos)
    except struct.error:  # fewer than 4 bytes left: a truncated record
        pass
    n = len(bounds) - 1
    if pos != end or (count is not None and n != count):
        expected = "" if count is None else f", {count} expected"
        raise SparkMQError(ErrorCode.STORE_CORRUPT, f"packed records do not add up: their sizes reach byte {pos} "
                                                    f"of {end} ({n} records{expected})")
    return np.array(bounds, dtype=np.int32)


def packed_records_array(data: bytes | memoryview, count: int | None = None) -> pa.BinaryArray:
    """Records stored back to back (a remoting pull's body) as one binary array, one record per row; no copy.

    A record's start depends on every size before it.  The offsets are found in bulk from the
    records' magic numbers and proven against the sizes (:func:`_record_bounds`), else by
    walking the sizes one by one; the bytes stay in ``data``'s buffer.  ``count``, when given,
    must match.  STORE_CORRUPT when a size is impossible or the records do not fill ``data``.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    bounds = _record_bounds(buf)
    if bounds is None or (count is not None and len(bounds) - 1 != count):
        bounds = _walk_bounds(data, count)
    return pa.Array.from_buffers(pa.binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)])


def records_to_arrow(records: Sequence[bytes | memoryview], broker_name: str) -> pa.RecordBatch:
    """Whole commit-log records as one ``PULL_SCHEMA`` batch (:func:`decode_records` of :func:`records_array`)."""
    return decode_records(records_array(records), broker_name)


def _utf8(strings: pa.StringArray, error: str) -> pa.StringArray:
    """``strings`` once proven UTF-8 (they are cut out of the records unchecked); STORE_CORRUPT ``error`` when not."""
    try:
        strings.validate(full=True)
    except pa.ArrowInvalid:
        raise SparkMQError(ErrorCode.STORE_CORRUPT, error) from None
    return strings


def decode_records(records: pa.BinaryArray | pa.ChunkedArray, broker_name: str) -> pa.RecordBatch:
    """Whole commit-log records (one per element) as one ``PULL_SCHEMA`` batch, column by column.

    The fixed headers are read as one numpy record array and the variable parts (body,
    topic, properties) are gathered into Arrow buffers, so the cost per message is a few
    numpy/Arrow kernel elements instead of a decoded ``StoredMessage``.  The rows are those of
    the row decoder (``storage_native.decode_records``, the twin of the C one; a test holds it):
    a property named twice gives its last value to ``msg_id``, ``tags`` and ``keys``, as in a
    dict.  STORE_CORRUPT when a record's lengths do not add up, its magic is not the record
    magic, or its topic or properties are not UTF-8.
    """
    if isinstance(records, pa.ChunkedArray):
        records = records.combine_chunks() if records.num_chunks != 1 else records.chunk(0)
    n = len(records)
    if n == 0:
        return EMPTY_PULL_BATCH
    # (binary arrays expose no .offsets: read the offsets buffer, minding a sliced array's start)
    bounds = np.frombuffer(records.buffers()[1], dtype=np.int32)[records.offset:records.offset + n + 1]
    bounds = bounds.astype(np.int64)
    base = bounds[0]
    starts = bounds[:-1] - base
    lengths = np.diff(bounds)
    raw = records.buffers()[2]
    buf = np.frombuffer(raw, dtype=np.uint8)[base:base + int(lengths.sum())]
    ends = starts + lengths
    # Every read below stays inside its record: each length is checked before it is used.
    if not (lengths >= RECORD_HEADER_SIZE + 3).all():
        raise SparkMQError(ErrorCode.STORE_CORRUPT, "a record is shorter than its fixed part")
    header = _headers(buf, starts)
    if not (header["magic"] == RECORD_MAGIC).all():
        raise SparkMQError(ErrorCode.STORE_CORRUPT, "a record has a bad magic")
    body_start = starts + RECORD_HEADER_SIZE
    body_len = header["body_length"].astype(np.int64)
    topic_len_at = body_start + body_len
    if not (topic_len_at + 3 <= ends).all():
        raise SparkMQError(ErrorCode.STORE_CORRUPT, "a record's body runs past its size")
    topic_start = topic_len_at + 1
    topic_len = buf[topic_len_at].astype(np.int64)
    props_len_at = topic_start + topic_len
    if not (props_len_at + 2 <= ends).all():
        raise SparkMQError(ErrorCode.STORE_CORRUPT, "a record's topic runs past its size")
    props_len = buf[props_len_at].astype(np.int64) | (buf[props_len_at + 1].astype(np.int64) << 8)
    if not np.array_equal(props_len_at + 2 + props_len, ends):
        raise SparkMQError(ErrorCode.STORE_CORRUPT, "a record's lengths do not add up to its size")
    topic = _utf8(_gather(buf, topic_start, topic_len, pa.string()), "a record's topic is not UTF-8")
    props = _utf8(_gather(buf, props_len_at + 2, props_len, pa.string()),
                  "a record's properties are not UTF-8")
    props_bounds = np.frombuffer(props.buffers()[1], dtype=np.int32)[props.offset:props.offset + n + 1]
    props_data = props.buffers()[2]
    properties = _property_map(np.frombuffer(props_data, dtype=np.uint8) if props_data is not None
                               else np.empty(0, dtype=np.uint8), props_bounds)
    store_host, store_names = _hosts(header["store_host"])
    born_host, _ = _hosts(header["born_host"])
    clog = header["commitlog_offset"]
    if len(store_names) == 1 and (clog >= 0).all():
        offset_ids = _offset_msg_ids(offset_msg_id_prefix(store_names[0] or "0.0.0.0:0"), clog)
    else:  # several store hosts, or a (damaged) negative offset, written "-..." as ids.encode_offset_msg_id does
        prefixes = {h: offset_msg_id_prefix(h or "0.0.0.0:0") for h in store_names}
        offset_ids = pa.array([prefixes[h] + f"{c:016X}" for h, c in zip(store_host.to_pylist(), clog.tolist(),
                                                                         strict=True)], pa.string())
    msg_ids, tags, keys = map_values(properties, (PROPERTY_UNIQUE_ID, PROPERTY_TAGS, PROPERTY_KEYS), "last")
    columns = [
        topic,
        _repeated(broker_name, n),
        pa.array(header["queue_id"]),
        pa.array(header["queue_offset"]),
        pc.fill_null(msg_ids, ""),
        offset_ids,
        pa.array(clog),
        pa.array(header["total_size"].astype(np.int32)),
        _gather(buf, body_start, body_len, pa.binary()),
        tags,
        keys,
        properties,
        pa.array(header["born_timestamp"]),
        born_host,
        pa.array(header["store_timestamp"]),
        store_host,
        pa.array(header["reconsume_times"]),
        pa.array(header["sys_flag"]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=PULL_SCHEMA)



"""On-disk formats of the commit log and the consume queue (format version 1).

This module is the single description of the bytes; the C core
(``_commitlog.c``) and the pure-Python twin (``pycommitlog.py``) both follow it,
and the parity tests prove they write identical files.

All integers are little-endian.  Offsets are absolute byte positions in the
logical commit log (segment start offset + position inside the segment).

Commit-log record (``RECORD_HEADER_SIZE`` = 120 fixed bytes, then the variable part)::

    offset  size  field
    ------  ----  -----------------------------------------------------------
         0     4  total_size         uint32, whole record including this field
         4     4  magic              uint32, RECORD_MAGIC (low byte = format version)
         8     4  crc32              uint32, zlib CRC-32 of bytes [12, total_size):
                                     everything after this field, body included
        12     4  queue_id           int32
        16     4  flag               int32, the producer's free-form flag
        20     8  queue_offset       int64, position of the record in its consume queue
        28     8  commitlog_offset   int64, this record's own offset (resync marker)
        36     4  sys_flag           int32, SYS_FLAG_* bits
        40     8  born_timestamp     int64, ms since the epoch, set by the producer
        48    20  born_host          16-byte IPv6 address (IPv4-mapped for v4) + uint32 port
        68     8  store_timestamp    int64, ms since the epoch, set at append
        76    20  store_host         as born_host
        96     4  reconsume_times    int32
       100     8  prepared_offset    int64, prepared-transaction offset (0 if none)
       108     8  tag_hash           int64, the consume-queue tag hash (kept so recovery
                                     can rewrite a lost unit)
       116     4  body_length        uint32
       120     B  body
     120+B     1  topic_length       uint8
     121+B     T  topic              UTF-8
   121+B+T     2  properties_length  uint16
   123+B+T     P  properties         "key\\x01value\\x02" pairs (see platform.common.codec)

Decoders of a record, one per form it is read into (``tests/test_native_codec.py`` holds that they give the
same messages): ``decode_record`` / ``decode_records`` of the C core and of its twin ``pycommitlog.py`` (rows:
a tuple, or one message a record -- a client's pull), and ``platform.common.record_columns.decode_records``
(Arrow columns, numpy over the whole batch -- the lake and the Spark source; at 1,024 records a call 1.6x, at
16,384 7.5x the speed of columns built from the C core's rows, which win only below a few hundred).  Nothing
else reads these bytes as messages: ``wire.received_from_arrow`` and ``wire.received_from_json`` read the HTTP
pull's Arrow and JSON forms.

A record never straddles two segments.  When the next record does not fit, the
rest of the segment is closed by a blank marker (8 bytes: total_size = bytes left
in the segment, magic = BLANK_MAGIC) and the record goes to the next segment.
Every record leaves at least ``BLANK_MARKER_SIZE`` bytes free or ends exactly at
the segment end, so a blank marker always fits.  A total_size of 0 marks the end
of the written log (segments are created zero-filled).

Consume-queue unit (``CQ_UNIT_SIZE`` = 20 bytes)::

         0     8  commitlog_offset   int64
         8     4  size               int32, total_size of the record (> 0 when written)
        12     8  tag_hash           int64, platform.common.codec.tag_hash(tag) or 0

RocketMQ's encodings (``rmq_codec.c``; RocketMQ's ``MessageDecoder``; all integers **big-endian**).
A pull answered over RocketMQ's remoting protocol carries each record re-encoded as RocketMQ's
stored message (``encode_rocketmq_records``; its one Python decoder is
``platform.common.rocketmq_records.decode_rocketmq_records``, for the answers sparkmq's client reads in it)::

    size  field
    ----  ---------------------------------------------------------------------------------
       4  TOTALSIZE          int32, the whole message
       4  MAGIC              RMQ_MAGIC_V1, or RMQ_MAGIC_V2 when the topic is longer than 127 bytes
       4  BODYCRC            int32, zlib CRC-32 of the body & 0x7FFFFFFF
       4  QUEUEID            int32
       4  FLAG               int32
       8  QUEUEOFFSET        int64
       8  PHYSICALOFFSET     int64, the commit-log offset (what an offsetMsgId encodes)
       4  SYSFLAG            int32: sys_flag, plus RMQ_BORNHOST_V6 / RMQ_STOREHOST_V6 for a host that is
                             not IPv4 (an IPv4-mapped or all-zero host is written as IPv4)
       8  BORNTIMESTAMP      int64
     8|20 BORNHOST           IPv4 (4) or IPv6 (16) address, int32 port
       8  STORETIMESTAMP     int64
     8|20 STOREHOST          as BORNHOST
       4  RECONSUMETIMES     int32
       8  PREPARED_TX_OFFSET int64
     4+B  body               int32 length, the body as stored (zlib when SYSFLAG bit 0 is set)
   1|2+T  topic              int8 length (V1) or int16 (V2), UTF-8
     2+P  properties         int16 length, "key\x01value\x02" pairs as stored

A SEND_BATCH_MESSAGE body (``MessageDecoder.encodeMessages``) is, per message::

       4  TOTALSIZE          int32, the whole entry (RMQ_BATCH_HEAD + B + 2 + P)
       4  MAGIC              0 (ignored)
       4  BODYCRC            0 (ignored)
       4  FLAG               int32
     4+B  body               int32 length
     2+P  properties         int16 length (their own UNIQ_KEY each)

``decode_rocketmq_batch`` turns it into a packed batch (below) for ``CommitLog.append_packed``.

Files::

    <root>/commitlog/<20-digit start offset>                 segment_size bytes each
    <root>/consumequeue/<topic>/<queue_id>/<20-digit start>  cq_units_per_file * 20 bytes each
                                                             (start = first unit index * 20)
"""
from __future__ import annotations

import struct
import zlib

__all__ = [
    "FORMAT_VERSION",
    "RECORD_MAGIC",
    "BLANK_MAGIC",
    "RECORD_FIELDS",
    "RECORD_HEADER",
    "RECORD_HEADER_SIZE",
    "QUEUE_ID_AT",
    "STORE_TIMESTAMP_AT",
    "BODY_LENGTH_AT",
    "BLANK_MARKER_SIZE",
    "MIN_RECORD_SIZE",
    "CQ_UNIT",
    "CQ_UNIT_SIZE",
    "HOST_SIZE",
    "MAX_TOPIC_BYTES",
    "MAX_PROPERTIES_BYTES",
    "MAX_QUEUE_ID",
    "DEFAULT_SEGMENT_SIZE",
    "DEFAULT_CQ_UNITS_PER_FILE",
    "MIN_SEGMENT_SIZE",
    "SYS_FLAG_COMPRESSED",
    "SYS_FLAG_MULTI_TAGS",
    "SYS_FLAG_TRANSACTION_PREPARED",
    "SYS_FLAG_TRANSACTION_COMMIT",
    "SYS_FLAG_TRANSACTION_ROLLBACK",
    "PACKED_ENTRY",
    "PACKED_ENTRY_SIZE",
    "MAX_UNIQ_KEY_BYTES",
    "RMQ_MAGIC_V1",
    "RMQ_MAGIC_V2",
    "RMQ_BORNHOST_V6",
    "RMQ_STOREHOST_V6",
    "RMQ_V1_MAX_TOPIC",
    "RMQ_BATCH_HEAD",
    "record_size",
    "segment_file_name",
    "encode_record",
]

FORMAT_VERSION = 1
#: "SMQ" + version byte.  A reader refuses any other value.
RECORD_MAGIC = 0x534D5100 | FORMAT_VERSION
#: Closes a segment whose remaining space cannot hold the next record.
BLANK_MAGIC = 0x534D51FF

#: The fields of the fixed header (RECORD_HEADER), in order.
RECORD_FIELDS = ("total_size", "magic", "crc32", "queue_id", "flag", "queue_offset", "commitlog_offset", "sys_flag",
                 "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times", "prepared_offset",
                 "tag_hash", "body_length")
RECORD_HEADER = struct.Struct("<IIIiiqqiq20sq20siqqI")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 120
assert RECORD_HEADER_SIZE == 120

#: Where the fields that partial readers look up sit in a record (the diagram above).
QUEUE_ID_AT = 12
STORE_TIMESTAMP_AT = 68
BODY_LENGTH_AT = 116
assert (QUEUE_ID_AT, STORE_TIMESTAMP_AT, BODY_LENGTH_AT) == tuple(
    struct.calcsize(RECORD_HEADER.format[:n]) for n in (4, 13, 20))

BLANK_MARKER_SIZE = 8
#: header + topic_length + properties_length with an empty body, topic and properties.
MIN_RECORD_SIZE = RECORD_HEADER_SIZE + 1 + 2

CQ_UNIT = struct.Struct("<qiq")
CQ_UNIT_SIZE = CQ_UNIT.size  # 20
assert CQ_UNIT_SIZE == 20

HOST_SIZE = 20
MAX_TOPIC_BYTES = 255
MAX_PROPERTIES_BYTES = 65535
MAX_QUEUE_ID = 65535

DEFAULT_SEGMENT_SIZE = 1 << 30
DEFAULT_CQ_UNITS_PER_FILE = 300_000
#: Segments are mmap'd, so they are whole pages.
MIN_SEGMENT_SIZE = 4096

#: One entry of a packed batch (docs/remoting.md "Packed batch"): body_length,
#: properties_length, flag, born_timestamp; then the body and the properties.
PACKED_ENTRY = struct.Struct("<IHiq")
PACKED_ENTRY_SIZE = PACKED_ENTRY.size  # 18
assert PACKED_ENTRY_SIZE == 18
#: A UNIQ_KEY is 1..128 bytes of printable ASCII without spaces (0x21..0x7E).
MAX_UNIQ_KEY_BYTES = 128

# RocketMQ's encodings (drawn above; rmq_codec.h holds the same values for the C core).
#: MessageDecoder.MESSAGE_MAGIC_CODE: a stored message whose topic length is one byte.
RMQ_MAGIC_V1 = 0xDAA320A7
#: MESSAGE_MAGIC_CODE_V2: the topic length is two bytes (topics longer than RMQ_V1_MAX_TOPIC bytes).
RMQ_MAGIC_V2 = 0xDAA320AB
#: SYSFLAG bits of a host written as IPv6 (16 bytes) instead of IPv4 (4 bytes).
RMQ_BORNHOST_V6 = 0x10
RMQ_STOREHOST_V6 = 0x20
#: The longest topic a V1 message names: its length is a signed byte.
RMQ_V1_MAX_TOPIC = 127
#: A batch entry's bytes before its body: TOTALSIZE, MAGIC, BODYCRC, FLAG, body length.
RMQ_BATCH_HEAD = 20

# sys_flag bits (mirroring RocketMQ's MessageSysFlag where it has one).
SYS_FLAG_COMPRESSED = 0x1
SYS_FLAG_MULTI_TAGS = 0x2
SYS_FLAG_TRANSACTION_PREPARED = 0x4
SYS_FLAG_TRANSACTION_COMMIT = 0x8
SYS_FLAG_TRANSACTION_ROLLBACK = 0xC


def record_size(body_len: int, topic_len: int, properties_len: int) -> int:
    """Total bytes a record with these variable parts occupies in the log."""
    return RECORD_HEADER_SIZE + body_len + 1 + topic_len + 2 + properties_len


def encode_record(*, topic: str, queue_id: int, flag: int, queue_offset: int, commitlog_offset: int, sys_flag: int,
                  born_timestamp: int, born_host: bytes, store_timestamp: int, store_host: bytes,
                  reconsume_times: int, prepared_offset: int, tag_hash: int, body: bytes,
                  properties: bytes) -> bytes:
    """One whole record in the format above, CRC included (for answers made of records that are not in the
    local log, e.g. read back from the lake tier; the log's own appends are written by the core)."""
    raw_topic = topic.encode("utf-8")
    tail = bytes((len(raw_topic),)) + raw_topic + len(properties).to_bytes(2, "little") + properties
    size = RECORD_HEADER_SIZE + len(body) + len(tail)
    record = bytearray(RECORD_HEADER.pack(
        size, RECORD_MAGIC, 0, queue_id, flag, queue_offset, commitlog_offset, sys_flag, born_timestamp,
        born_host, store_timestamp, store_host, reconsume_times, prepared_offset, tag_hash, len(body)))
    record += body
    record += tail
    record[8:12] = zlib.crc32(memoryview(record)[12:]).to_bytes(4, "little")
    return bytes(record)


def segment_file_name(start_offset: int) -> str:
    """The 20-digit zero-padded name of the file that starts at ``start_offset``."""
    return f"{start_offset:020d}"

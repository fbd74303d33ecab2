"""POP consumption state: what each (group, topic, queue) handed out, and how it survives a crash.

RocketMQ 5 keeps POP checkpoints and acks as records of a system topic in the commit log (the
REVIVE topic), so HA replication carries them and a restart rebuilds the state by replaying them.
sparkmq does the same with two record kinds (plus a reset) in ``rmq_sys_REVIVE_LOG``
(``POP_REVIVE_TOPIC``, a system topic: not dispatched to the lake), queue 0::

    LeaseRecord   group topic queue_id start end [lease...]   the cursor moved start -> end; each lease is
                                                             one delivery (offset, attempt, token,
                                                             invisible_until, max_attempts, msg_id); offsets in
                                                             [start, end) without a lease were filtered out
    SettleRecord  group topic queue_id [offset...]            acked or dead-lettered: no longer in flight
    ResetRecord   group topic queue_id offset                 an admin offset reset: cursor there, nothing in flight

The state of one queue is only a *cursor* (the next offset never handed out) and the *leases* in
flight: every offset below the cursor without a lease is settled, so the group's consumed frontier
(its committed offset) is the lowest leased offset, or the cursor.  Records are applied by one
function (:meth:`PopState.apply`) at run time and at replay, so the two cannot disagree.

A snapshot (magic + version, the states and the revive-queue offset they cover) is written every
second when something changed; a start loads it and replays the records written after it, or,
when it is missing or corrupt, replays the whole revive queue.
"""
from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ..common.errors import ErrorCode, SparkMQError
from ..common.system_topics import POP_REVIVE_TOPIC

__all__ = ["REVIVE_TOPIC", "Lease", "LeaseRecord", "SettleRecord", "ResetRecord", "Record", "QueueState",
           "PopState", "Handle", "encode_handle", "decode_handle", "encode_record", "decode_record"]

log = logging.getLogger("sparkmq.broker.pop")

#: The system topic of POP records (RocketMQ: ``rmq_sys_REVIVE_LOG_<cluster>``); one queue.
REVIVE_TOPIC = POP_REVIVE_TOPIC

#: (group, topic, queue_id)
Key = tuple[str, str, int]


class Lease(msgspec.Struct, array_like=True, frozen=True):
    """One delivery of one message to a group."""

    offset: int
    attempt: int
    #: Random 63-bit number; a receipt handle names it, so only the newest delivery's handle works.
    token: int
    invisible_until: int
    max_attempts: int
    #: The message's unique id (trace events of its ack name it).
    msg_id: str = ""


class LeaseRecord(msgspec.Struct, array_like=True, tag="L"):
    """Messages handed out (or renewed): the cursor moved ``start`` -> ``end`` and ``leases`` are in flight."""

    group: str
    topic: str
    queue_id: int
    start: int
    end: int
    leases: list[Lease]


class SettleRecord(msgspec.Struct, array_like=True, tag="S"):
    """Deliveries settled (acked, or dead-lettered): these offsets are no longer in flight."""

    group: str
    topic: str
    queue_id: int
    offsets: list[int]


class ResetRecord(msgspec.Struct, array_like=True, tag="R"):
    """An admin reset the group's offset: the cursor moves to ``offset`` and nothing is in flight."""

    group: str
    topic: str
    queue_id: int
    offset: int


Record = LeaseRecord | SettleRecord | ResetRecord

_RECORD_ENCODER = msgspec.msgpack.Encoder()
_RECORD_DECODER = msgspec.msgpack.Decoder(Record)


def encode_record(record: Record) -> bytes:
    """A record's body in the revive topic (msgpack)."""
    return _RECORD_ENCODER.encode(record)


def decode_record(body: bytes) -> Record:
    """A record from its body; STORE_CORRUPT when it is not one."""
    try:
        return _RECORD_DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SparkMQError(ErrorCode.STORE_CORRUPT, f"a POP revive record does not decode: {exc}") from None


@dataclass
class QueueState:
    """One (group, topic, queue): the cursor and the deliveries in flight."""

    cursor: int
    leases: dict[int, Lease] = field(default_factory=dict)
    #: The frontier last committed to the consumer offsets (run time only).
    committed: int = -1

    @property
    def frontier(self) -> int:
        """Every offset below this is settled: the lowest one in flight, or the cursor."""
        return min(self.leases) if self.leases else self.cursor


# -- snapshot -------------------------------------------------------------------------------------

_SNAPSHOT_MAGIC = "sparkmq-pop-state"
_SNAPSHOT_VERSION = 1


class _SnapshotQueue(msgspec.Struct, array_like=True):
    group: str
    topic: str
    queue_id: int
    cursor: int
    leases: list[Lease]


class _Snapshot(msgspec.Struct):
    magic: str
    version: int
    #: The revive queue's offset the states cover: replay starts here.
    revive_offset: int
    queues: list[_SnapshotQueue]


class PopState:
    """Every queue's POP state, the records that change it, and its snapshot file.  Not thread-safe: the
    POP processor serialises access."""

    def __init__(self, snapshot_path: Path) -> None:
        self.snapshot_path = snapshot_path
        self.queues: dict[Key, QueueState] = {}

    def get(self, key: Key) -> QueueState | None:
        """The state of ``key``, None when the group never received from that queue (since its last reset)."""
        return self.queues.get(key)

    def apply(self, record: Record) -> QueueState:
        """Apply one record (at run time after writing it, and at replay); returns the queue's state."""
        key = (record.group, record.topic, record.queue_id)
        state = self.queues.get(key)
        if isinstance(record, LeaseRecord):
            if state is None:
                state = self.queues[key] = QueueState(record.start)
            for lease in record.leases:
                state.leases[lease.offset] = lease
            state.cursor = max(state.cursor, record.end)
        elif isinstance(record, SettleRecord):
            if state is None:
                return QueueState(0)  # settles of a queue reset since: nothing to do
            for offset in record.offsets:
                state.leases.pop(offset, None)
        else:
            if state is None:
                state = self.queues[key] = QueueState(record.offset)
            state.cursor = record.offset
            state.leases.clear()
        return state

    # -- the snapshot file ----------------------------------------------------------------
    def load_snapshot(self) -> int | None:
        """Load the snapshot; the revive offset replay starts at, or None (no usable snapshot: replay all)."""
        try:
            data = self.snapshot_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            snap = msgspec.json.decode(data, type=_Snapshot)
            if snap.magic != _SNAPSHOT_MAGIC or snap.version != _SNAPSHOT_VERSION:
                raise ValueError(f"magic/version {snap.magic!r}/{snap.version}")
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            log.warning("POP state snapshot %s is corrupt (%s): replaying the whole revive log", self.snapshot_path,
                        exc)
            return None
        self.queues = {(q.group, q.topic, q.queue_id): QueueState(q.cursor, {lease.offset: lease
                                                                               for lease in q.leases})
                       for q in snap.queues}
        return snap.revive_offset

    def snapshot_bytes(self, revive_offset: int) -> bytes:
        """The snapshot of the current states, covering the revive queue below ``revive_offset``."""
        queues = [_SnapshotQueue(g, t, q, s.cursor, sorted(s.leases.values(), key=lambda lease: lease.offset))
                  for (g, t, q), s in self.queues.items()]
        return msgspec.json.encode(_Snapshot(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, revive_offset, queues))

    def write_snapshot(self, data: bytes) -> None:
        """Write a snapshot atomically (tmp file + rename)."""
        self.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.snapshot_path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.snapshot_path)


# -- receipt handles ------------------------------------------------------------------------------
#
#   0      1        3        11       13                21       29       33 bytes
#   +------+--------+--------+--------+-----------------+--------+--------+
#   | ver  | queue  | offset | attempt| invisible_until | token  | check  |   big-endian, then hex (66 characters)
#   +------+--------+--------+--------+-----------------+--------+--------+
#
# ``check`` = crc32 of "group\0topic\0" + the 29 bytes before it: a handle of another group or topic
# (or a tampered one) is told apart before any state is looked at.  It is not a secret: the token,
# which must match the delivery in flight, is what makes a handle unguessable.

_HANDLE_VERSION = 1
_HANDLE_BODY = struct.Struct(">BHqHqQ")
_HANDLE_SIZE = _HANDLE_BODY.size + 4
#: Longest handle string accepted (the 33 bytes in hex are 66 characters).
MAX_HANDLE_LENGTH = 2 * _HANDLE_SIZE


@dataclass(frozen=True, slots=True)
class Handle:
    """What a receipt handle names."""

    queue_id: int
    offset: int
    attempt: int
    invisible_until: int
    token: int


def _check(group: str, topic: str, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(f"{group}\0{topic}\0".encode()))


def encode_handle(group: str, topic: str, queue_id: int, lease: Lease) -> str:
    """The receipt handle of ``lease`` (a delivery of ``group`` on ``topic``)."""
    body = _HANDLE_BODY.pack(_HANDLE_VERSION, queue_id, lease.offset, lease.attempt, lease.invisible_until,
                             lease.token)
    # Hex, not base64: bytes.hex / bytes.fromhex are one C call each (an ack decodes one per message).
    return (body + struct.pack(">I", _check(group, topic, body))).hex()


def decode_handle(group: str, topic: str, handle: object) -> Handle:
    """What ``handle`` names; INVALID_RECEIPT_HANDLE when it is malformed or belongs to another group/topic."""
    if not isinstance(handle, str) or not 0 < len(handle) <= MAX_HANDLE_LENGTH:
        raise SparkMQError(ErrorCode.INVALID_RECEIPT_HANDLE,
                           f"a receipt handle is a string of 1-{MAX_HANDLE_LENGTH} characters")
    try:
        raw = bytes.fromhex(handle)
    except ValueError:
        raw = b""
    if len(raw) != _HANDLE_SIZE or raw[0] != _HANDLE_VERSION:
        raise SparkMQError(ErrorCode.INVALID_RECEIPT_HANDLE, "malformed receipt handle")
    body = raw[:_HANDLE_BODY.size]
    if struct.unpack(">I", raw[_HANDLE_BODY.size:])[0] != _check(group, topic, body):
        raise SparkMQError(ErrorCode.INVALID_RECEIPT_HANDLE,
                           f"the receipt handle is not one of group {group!r} on topic {topic!r} (or was altered)")
    _, queue_id, offset, attempt, invisible_until, token = _HANDLE_BODY.unpack(body)
    return Handle(queue_id, offset, attempt, invisible_until, token)

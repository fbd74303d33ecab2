"""MessageStore: the store's public face over the native commit log.

It validates messages (stable error codes, nothing written on bad input), stamps
them (unique id, tags, keys), appends them, makes them durable according to the
flush mode, keeps the checkpoint and abort marker that recovery needs, applies
retention, and reads them back through the consume queues.
"""
from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import functools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import pyarrow as pa

from ...storage_native import CommitLog, StoreError, decode_batch, decode_record
from ...storage_native import errors as native_errors
from ...storage_native.layout import (
    BODY_LENGTH_AT,
    CQ_UNIT_SIZE,
    QUEUE_ID_AT,
    RECORD_HEADER_SIZE,
    RECORD_MAGIC,
    encode_record,
    record_size,
)
from ..common.codec import decode_properties, encode_properties, pack_host, tag_hash
from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import FailureLog
from ..common.ids import UniqueIdGenerator, decode_offset_msg_id, encode_offset_msg_id, offset_msg_id_prefix
from ..common.message import (
    BODY_TYPES,
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    StoredMessage,
)
from ..common.record_columns import EMPTY_PULL_BATCH, RECORDS_SCHEMA, records_array, records_to_arrow
from ..common.validation import check, check_int, validate_topic
from .checkpoint import read_checkpoint, write_checkpoint
from .config import FlushMode, StoreConfig
from .disk import DiskGuard, DiskState, RetentionFloor
from .flush import FlushService
from .paths import StorePaths
from .retention import RetentionDecision, RetentionPolicy
from .status import (
    AppendEvent,
    AppendGate,
    AppendNote,
    GetResult,
    GetStatus,
    LogOffsets,
    PackedGetResult,
    PackedPutResult,
    PutResult,
    PutStatus,
)

__all__ = ["MessageStore", "translate_store_error", "raw_record_properties", "RawProperties", "records_to_arrow",
           "records_of", "stored_messages_of", "unpack_batch", "REPLICATION_BATCH_BYTES", "PREFETCH_MAX_BYTES"]

_T = TypeVar("_T")
_EMPTY_RECORDS = pa.RecordBatch.from_pylist([], schema=RECORDS_SCHEMA)
#: What a master ships per replication fetch by default (RocketMQ's HA transfers 32 KiB batches).
REPLICATION_BATCH_BYTES = 32 * 1024
#: The most log bytes one :meth:`MessageStore.prefetch` reads (a queue's records lie among other queues').
PREFETCH_MAX_BYTES = 16 << 20
#: Each prefetching thread reads through one scratch buffer of this size.
_PREFETCH_CHUNK = 1 << 20
_scratch = threading.local()

log = logging.getLogger(__name__)

_NATIVE_TO_CODE = {
    native_errors.INVALID_ARGUMENT: ErrorCode.INVALID_ARGUMENT,
    native_errors.OFFSET_ILLEGAL: ErrorCode.OFFSET_ILLEGAL,
    native_errors.OFFSET_TOO_SMALL: ErrorCode.OFFSET_ILLEGAL,
    native_errors.OFFSET_OVERFLOW: ErrorCode.OFFSET_ILLEGAL,
    native_errors.OFFSET_MISMATCH: ErrorCode.OFFSET_ILLEGAL,
    native_errors.CORRUPT_RECORD: ErrorCode.STORE_CORRUPT,
    native_errors.CORRUPT_STORE: ErrorCode.STORE_CORRUPT,
    native_errors.DISK_FULL: ErrorCode.DISK_FULL,
    native_errors.IO_ERROR: ErrorCode.INTERNAL_ERROR,
    native_errors.CLOSED: ErrorCode.SERVICE_NOT_AVAILABLE,
    native_errors.MESSAGE_ILLEGAL: ErrorCode.MESSAGE_ILLEGAL,
    native_errors.MESSAGE_TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    native_errors.PROPERTIES_TOO_LARGE: ErrorCode.PROPERTIES_TOO_LARGE,
}


def translate_store_error(exc: StoreError) -> SparkMQError:
    """The platform error for a native ``StoreError`` (translated once, here)."""
    return SparkMQError(_NATIVE_TO_CODE.get(exc.code, ErrorCode.INTERNAL_ERROR), exc.message)


def _check_offset(name: str, value: object) -> int:
    return check_int(name, value, 0, error=ErrorCode.OFFSET_ILLEGAL)


class MessageStore:
    """Put, get and find messages in one broker's store.

    Example::

        store = MessageStore(StoreConfig(root="/data/store"))
        store.start()
        result = store.put(Message("orders", b"hello", tags="new"), queue_id=0)
        got = store.get_messages("orders", 0, result.queue_offset, 32)
        store.shutdown()
    """

    def __init__(self, config: StoreConfig,
                 queue_count_of: Callable[[str], int | None] | None = None,
                 commit_log_class: type | None = None) -> None:
        """``queue_count_of(topic)`` gives a topic's queue count so puts can check the
        queue id (the broker passes its topic table); without it any id in [0, 65535] goes.
        ``commit_log_class`` picks an implementation (tests run both); by default the
        one ``storage_native`` selected."""
        self.config = config
        self._commit_log_class = commit_log_class or CommitLog
        self.paths = StorePaths(config.root)
        self._queue_count_of = queue_count_of
        self._ids = UniqueIdGenerator()
        self._store_host = pack_host(config.store_host)
        self._id_prefix = offset_msg_id_prefix(config.store_host)
        self._log: CommitLog | None = None
        self._lock_fd: int | None = None
        self._flusher: FlushService | None = None
        self._stop = threading.Event()
        self._retention_thread: threading.Thread | None = None
        self._checkpoint_lock = threading.Lock()
        self._last_checkpoint_ms = 0
        self._retention = RetentionPolicy(config)
        #: The disk watermarks: refuses writes (DISK_FULL) from disk_warning_ratio on (see .disk).
        self._disk = DiskGuard(config)
        #: The oldest offset a consumer still needs (set_retention_floor); None: nobody is known to.
        self._floor: Callable[[], RetentionFloor | None] | None = None
        self._housekeeping_failures = FailureLog(log, f"store {config.root}: retention")
        self._floor_failures = FailureLog(log, f"store {config.root}: asking the retention floor")
        self.clean_start: bool | None = None
        self.recovery: dict[str, int] = {}
        self._append_listeners: list[Callable[[AppendEvent], None]] = []
        #: The commit index of a Raft group (set_visible_offset): consumer reads stop below it; None: no limit.
        self._visible: int | None = None
        #: A truncation happened since the limit was last set: the next set may lower it.
        self._visible_rewind = False
        self._visible_lock = threading.Lock()
        self._truncate_lock = threading.Lock()
        #: Admits local appends and hears where each ended (a DLedger member); None: appends are free.
        self._gate: AppendGate | None = None

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> MessageStore:
        """Lock the directory, recover, and start the flush and retention threads."""
        root = self.config.root
        root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise SparkMQError(ErrorCode.STORE_LOCKED, f"{root} is open in another process") from None
        self.clean_start = not self.paths.abort.exists()
        checkpoint = read_checkpoint(self.paths.checkpoint)
        check_from = checkpoint.flushed_offset if checkpoint else 0
        try:
            self._log = self._open_log(check_from)
        except SparkMQError:
            self._release_lock()
            raise
        # large folios ahead of the appends: cheaper per byte, but each sync writes back a whole folio
        self._log.prefault_readahead = self.config.flush_mode is FlushMode.ASYNC_FLUSH
        self.recovery = self._log.recovery
        if not self.clean_start:
            log.warning("store %s was not shut down cleanly; recovered from offset %d: %s",
                        root, check_from, self.recovery)
        self.paths.abort.write_bytes(b"")
        write_checkpoint(self.paths.checkpoint, self._log.flushed_offset)
        self._visible = None
        self._disk.check()  # a store opened on a full disk refuses writes from the first one
        if self.config.background_services:
            self._flusher = self._new_flusher(self._log)
            self._flusher.start()
            self._retention_thread = threading.Thread(target=self._housekeeping_loop, name="sparkmq-retention",
                                                      daemon=True)
            self._retention_thread.start()
        return self

    def _new_flusher(self, log_: CommitLog) -> FlushService:
        return FlushService(log_, self.config.flush_interval_ms, self._after_full_flush,
                            group_commit=self.config.flush_mode is FlushMode.SYNC_FLUSH)

    def _open_log(self, check_from: int) -> CommitLog:
        cfg = self.config
        try:
            return self._commit_log_class(str(cfg.root), segment_size=cfg.segment_size,
                                          cq_units_per_file=cfg.cq_units_per_file, check_from=check_from)
        except StoreError as exc:
            if exc.code == native_errors.CORRUPT_STORE and check_from:
                # a checkpoint that disagrees with the files: trust the files, scan them all
                log.warning("checkpoint %d rejected (%s); scanning the whole log", check_from, exc)
                try:
                    return self._commit_log_class(str(cfg.root), segment_size=cfg.segment_size,
                                                  cq_units_per_file=cfg.cq_units_per_file, check_from=0)
                except StoreError as exc2:
                    raise translate_store_error(exc2) from None
            raise translate_store_error(exc) from None

    def shutdown(self) -> None:
        """Flush, write the final checkpoint, remove the abort marker, release the directory."""
        if self._log is None:
            return
        self._stop.set()
        if self._flusher is not None:
            self._flusher.stop()
        if self._retention_thread is not None:
            self._retention_thread.join()
        flushed = self._log.flush()
        self._log.close()
        write_checkpoint(self.paths.checkpoint, flushed)
        self.paths.abort.unlink(missing_ok=True)
        self._log = None
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> MessageStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def commit_log(self) -> CommitLog:
        """The native log (for dispatchers, replication and tools)."""
        if self._log is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, "the store is not started")
        return self._log

    @property
    def is_open(self) -> bool:
        """Whether the store is started and not shut down."""
        return self._log is not None

    def log_offsets(self) -> LogOffsets:
        """The commit log's min, max and flushed offsets, and the visibility limit (SERVICE_NOT_AVAILABLE when
        not started)."""
        log_ = self.commit_log
        return LogOffsets(log_.min_offset, log_.max_offset, log_.flushed_offset, self._visible)

    def queues(self) -> list[tuple[str, int]]:
        """Every (topic, queue_id) that was ever written, sorted."""
        return self.commit_log.queues()

    def queue_unit(self, topic: str, queue_id: int, queue_offset: int) -> tuple[int, int, int]:
        """(commitlog_offset, size, tag_hash) of one consume-queue unit; OFFSET_ILLEGAL outside the queue."""
        cq = self.commit_log.consume_queue(topic, queue_id)
        if cq is None:
            raise SparkMQError(ErrorCode.OFFSET_ILLEGAL, f"queue {topic}/{queue_id} was never written")
        try:
            return cq.unit(queue_offset)
        except StoreError as exc:
            raise translate_store_error(exc) from None

    def read_queue_message(self, topic: str, queue_id: int, queue_offset: int) -> StoredMessage:
        """The message at ``queue_offset`` of a queue (errors as :meth:`queue_unit` and :meth:`read_message`).

        A message at or past the visibility limit (:meth:`set_visible_offset`) is not there yet:
        OFFSET_ILLEGAL, as past the queue's end.
        """
        clog_offset = self.queue_unit(topic, queue_id, queue_offset)[0]
        visible = self._visible
        if visible is not None and clog_offset >= visible:
            raise SparkMQError(ErrorCode.OFFSET_ILLEGAL,
                               f"queue offset {queue_offset} is at or past the maximum queue offset "
                               f"{self.max_offset(topic, queue_id)}")
        return self.read_message(clog_offset)

    def last_store_timestamp(self, topic: str, queue_id: int) -> int:
        """Store time of a queue's newest retained (and visible) message; 0 when it has none."""
        log_ = self.commit_log
        cq = log_.consume_queue(topic, queue_id)
        if cq is None:
            return 0
        hi = cq.visible_max_offset
        if hi <= cq.min_offset:
            return 0
        try:
            return log_.store_timestamp_at(cq.unit(hi - 1)[0])
        except StoreError:  # retention removed it meanwhile
            return 0

    def store_timestamp_of(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """Store time of the message at ``queue_offset`` of a queue; 0 when the queue has none there (never
        written, retained no more, or not visible yet)."""
        log_ = self.commit_log
        cq = log_.consume_queue(topic, queue_id)
        if cq is None or not cq.min_offset <= queue_offset < cq.visible_max_offset:
            return 0
        try:
            return log_.store_timestamp_at(cq.unit(queue_offset)[0])
        except StoreError:  # retention removed it meanwhile
            return 0

    # -- append listeners ----------------------------------------------------
    def add_append_listener(self, listener: Callable[[AppendEvent], None]) -> None:
        """Call ``listener(event)`` after every append, once its records are readable (before a flush wait).

        What an append sets off elsewhere (waking held pulls, trace, replication) registers here.
        A listener runs on the appending thread and must be quick; its exceptions are logged and
        never fail the append.
        """
        self._append_listeners.append(listener)

    def _notify(self, event: AppendEvent) -> None:
        for listener in self._append_listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not turn a stored message into a failed send
                log.exception("append listener %r failed", listener)

    # -- durability -----------------------------------------------------------
    # Two offsets: ``flushed_offset`` (log AND consume queues durable, the full flush) and
    # ``log_flushed_offset`` (the log durable: what a SYNC_FLUSH send waits for).  The checkpoint
    # only ever gets the first: recovery scans the log from it and rewrites the queue units of
    # every record past it, which brings back the units a log-only sync left unsynced.
    # A truncation (truncate_log) lowers the log's flushed_offset: a checkpoint is written with the lock
    # held and never above the log's current flushed_offset, so a flush that finished before a truncation
    # cannot name bytes the truncation removed.
    def _after_full_flush(self, flushed: int) -> None:
        """The flush service's hook, run after each full flush with its ``flushed_offset``: drops the
        durable pages far behind the end from the page cache, and moves the checkpoint when it is due."""
        if self.config.page_cache_keep:
            self.commit_log.release_page_cache(self.config.page_cache_keep)
        now = time.monotonic_ns() // 1_000_000
        with self._checkpoint_lock:
            if now - self._last_checkpoint_ms < self.config.checkpoint_interval_ms:
                return
            self._last_checkpoint_ms = now
            write_checkpoint(self.paths.checkpoint, min(flushed, self.commit_log.flushed_offset))

    def flush(self) -> int:
        """Sync the log and the queues now and move the checkpoint; returns the flushed offset."""
        log_ = self.commit_log
        flushed = log_.flush()
        with self._checkpoint_lock:
            flushed = min(flushed, log_.flushed_offset)
            write_checkpoint(self.paths.checkpoint, flushed)
        return flushed

    def _await_durable(self, end_offset: int) -> PutStatus:
        if self.config.flush_mode is not FlushMode.SYNC_FLUSH:
            return PutStatus.PUT_OK
        if self._flusher is None:
            self.commit_log.flush_log()  # the log suffices: recovery rebuilds the units past the checkpoint
            return PutStatus.PUT_OK
        ok = self._flusher.wait_flushed(end_offset, self.config.sync_flush_timeout_ms / 1000.0)
        return PutStatus.PUT_OK if ok else PutStatus.FLUSH_DISK_TIMEOUT

    # -- writing --------------------------------------------------------------
    def _check_queue(self, topic: str, queue_id: object) -> int:
        validate_topic(topic)
        if type(queue_id) is not int:  # the append path: the declared check only when it can fail
            queue_id = cast(int, check("queue id", queue_id, int, ErrorCode.QUEUE_ID_ILLEGAL))
        count = self._queue_count_of(topic) if self._queue_count_of else 65536
        if count is None:
            raise SparkMQError(ErrorCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        if not 0 <= queue_id < count:
            raise SparkMQError(ErrorCode.QUEUE_ID_ILLEGAL,
                               f"queue id {queue_id} is out of range for topic {topic!r} ({count} queues)")
        return queue_id

    def _encode(self, msg: Message, now_ms: int) -> tuple[bytes, bytes, int, str]:
        """(body, properties, tag_hash, unique id) of a validated message."""
        validate_topic(msg.topic)
        body = msg.body
        if not isinstance(body, BODY_TYPES):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the body must be bytes, got {type(body).__name__}")
        if len(body) == 0:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the body must not be empty")
        if len(body) > self.config.max_message_size:
            raise SparkMQError(ErrorCode.MESSAGE_TOO_LARGE,
                               f"the body is {len(body)} bytes, the limit is {self.config.max_message_size}")
        props = dict(msg.properties)
        if msg.tags is not None:
            if not isinstance(msg.tags, str) or not msg.tags or "||" in msg.tags or msg.tags.strip() != msg.tags:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"the tag {msg.tags!r} is empty, padded or has '||'")
            props[PROPERTY_TAGS] = msg.tags
        if msg.keys:
            keys = [msg.keys] if isinstance(msg.keys, str) else list(msg.keys)
            if any(not isinstance(k, str) or not k or KEY_SEPARATOR in k for k in keys):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "keys must be non-empty strings without spaces")
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
        unique_id = props.get(PROPERTY_UNIQUE_ID) or self._ids.next_id(now_ms)
        props[PROPERTY_UNIQUE_ID] = unique_id
        raw_props = encode_properties(props)
        if len(raw_props) > self.config.max_properties_size:
            raise SparkMQError(ErrorCode.PROPERTIES_TOO_LARGE,
                               f"the properties are {len(raw_props)} bytes encoded, "
                               f"the limit is {self.config.max_properties_size}")
        return bytes(body), raw_props, tag_hash(msg.tags), unique_id

    def set_append_gate(self, gate: AppendGate | None) -> None:
        """Route every local append through ``gate`` (see :class:`AppendGate`); None lifts it."""
        self._gate = gate

    def _gated(self, append: Callable[[], _T], end_of: Callable[[_T], int]) -> _T:
        """Run a native append (its errors translated) inside the append gate, if there is one; DISK_FULL
        without appending while the disk is past its warning ratio (every local append passes here)."""
        if self._disk.full:
            raise self._disk.refusal()
        gate = self._gate
        try:
            if gate is None:
                return append()
            with gate.lock:
                token = gate.admit()
                appended = append()
                gate.appended(token, end_of(appended))
                return appended
        except StoreError as exc:
            if exc.code == native_errors.DISK_FULL:  # the file system itself is full: stop writing now
                self._disk.mark_full(exc.message)
            raise translate_store_error(exc) from None

    def put(self, msg: Message, queue_id: int, *, born_host: str | None = None,
            born_timestamp: int | None = None, reconsume_times: int = 0, sys_flag: int = 0,
            prepared_offset: int = 0, cq_tag_hash: int | None = None, note: AppendNote | None = None,
            wait: bool = True) -> PutResult:
        """Append one message to ``queue_id`` of its topic.

        ``wait=False`` returns before a SYNC_FLUSH sync covers it (the caller waits for
        ``commitlog_offset + store_size`` with :meth:`wait_durable`).

        Bad input raises ``SparkMQError`` and writes nothing.  Under SYNC_FLUSH the
        call returns after a sync covers the message (FLUSH_DISK_TIMEOUT if none
        did in time: the message is stored all the same).  ``cq_tag_hash`` replaces
        the tag hash in the consume-queue unit: the schedule and timer topics keep
        the delivery time there, so their services read due times without decoding.
        ``note`` goes to the append listeners untouched.
        """
        now_ms = time.time_ns() // 1_000_000
        qid = self._check_queue(msg.topic, queue_id)
        body, props, thash, unique_id = self._encode(msg, now_ms)
        if cq_tag_hash is not None:
            thash = cq_tag_hash
        born = born_timestamp if born_timestamp is not None else now_ms
        size = _record_size(body, msg.topic, props)
        offset, queue_offset, store_ts = self._gated(
            lambda: self.commit_log.append(msg.topic, qid, body, props, thash, msg.flag, sys_flag, born,
                                           pack_host(born_host), 0, self._store_host, reconsume_times,
                                           prepared_offset),
            lambda appended: appended[0] + size)
        offset_msg_id = encode_offset_msg_id(self.config.store_host, offset, self._id_prefix)
        stored = PutResult(PutStatus.PUT_OK, unique_id, offset_msg_id, msg.topic, qid, queue_offset, offset,
                           store_ts, size)
        self._notify(AppendEvent(msg.topic, qid, (stored,), (msg,), born, note))
        status = self._await_durable(offset + size) if wait else PutStatus.PUT_OK
        return stored if status is PutStatus.PUT_OK else dataclasses.replace(stored, status=status)

    def put_batch(self, topic: str, queue_id: int, messages: Sequence[Message], *,
                  born_host: str | None = None, born_timestamp: int | None = None,
                  sys_flag: int = 0, note: AppendNote | None = None, wait: bool = True) -> list[PutResult]:
        """Append messages of one topic to one queue in one call (consecutive queue offsets).

        Every message is validated first; one bad message rejects the whole batch.
        ``sys_flag`` applies to every record (e.g. COMPRESSED for a batch whose bodies
        the producer compressed).
        """
        validate_topic(topic)
        qid = self._check_queue(topic, queue_id)
        if not messages:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the batch is empty")
        now_ms = time.time_ns() // 1_000_000
        born = born_timestamp if born_timestamp is not None else now_ms
        host = pack_host(born_host)
        items = []
        ids = []
        sizes = []
        for i, msg in enumerate(messages):
            if msg.topic != topic:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                                   f"message {i} is for topic {msg.topic!r}, the batch is for {topic!r}")
            try:
                body, props, thash, unique_id = self._encode(msg, now_ms)
            except SparkMQError as exc:
                raise SparkMQError(exc.code, f"message {i}: {exc.message}") from None
            items.append((body, props, thash, msg.flag, sys_flag, born, host, 0, 0))
            ids.append(unique_id)
            sizes.append(_record_size(body, topic, props))
        first, store_ts, offsets = self._gated(
            lambda: self.commit_log.append_batch(topic, qid, items, 0, self._store_host),
            lambda appended: appended[2][-1] + sizes[-1])
        host_text = self.config.store_host
        stored = [PutResult(PutStatus.PUT_OK, ids[i], encode_offset_msg_id(host_text, off, self._id_prefix), topic,
                            qid, first + i, off, store_ts, sizes[i]) for i, off in enumerate(offsets)]
        self._notify(AppendEvent(topic, qid, stored, messages, born, note))
        status = self._await_durable(offsets[-1] + sizes[-1]) if wait else PutStatus.PUT_OK
        if status is not PutStatus.PUT_OK:
            stored = [dataclasses.replace(r, status=status) for r in stored]
        return stored

    def put_packed(self, topic: str, queue_id: int, data: bytes | memoryview, count: int, *,
                   born_host: str | None = None, sys_flag: int = 0, reserved_keys: tuple[str, ...] = (),
                   note: AppendNote | None = None, wait: bool = True) -> PackedPutResult:
        """Append a packed batch (``docs/remoting.md``) to one queue: validated and written by the native core.

        No Python object is made per message.  One bad entry rejects the batch (MESSAGE_ILLEGAL,
        MESSAGE_TOO_LARGE, PROPERTIES_TOO_LARGE naming the entry) and writes nothing; a property
        named in ``reserved_keys`` is refused (MESSAGE_ILLEGAL).  ``wait=False`` returns at once
        under SYNC_FLUSH too (status PUT_OK): the caller waits for ``end_offset`` to be flushed itself.
        """
        validate_topic(topic)
        qid = self._check_queue(topic, queue_id)
        check_int("the batch's message count", count, 1, error=ErrorCode.MESSAGE_ILLEGAL)
        first, store_ts, end, offsets = self._gated(
            lambda: self.commit_log.append_packed(
                topic, qid, data, count, sys_flag=sys_flag, born_host=pack_host(born_host),
                store_host=self._store_host, max_body=self.config.max_message_size,
                max_properties=self.config.max_properties_size, reserved_keys=reserved_keys),
            lambda appended: appended[2])
        result = PackedPutResult(PutStatus.PUT_OK, topic, qid, first, count, store_ts, end, offsets)
        self._notify(AppendEvent(topic, qid, (), None, None, note, result, data))
        if wait:
            status = self._await_durable(end)
            if status is not PutStatus.PUT_OK:
                result = dataclasses.replace(result, status=status)
        return result

    def await_durable(self, end_offset: int) -> PutStatus:
        """Block until the log is flushed up to ``end_offset`` under SYNC_FLUSH (PUT_OK at once otherwise,
        FLUSH_DISK_TIMEOUT after ``sync_flush_timeout_ms``)."""
        return self._await_durable(end_offset)

    def wait_durable(self, end_offset: int,
                     loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[PutStatus]:
        """The event loop's :meth:`await_durable`: a future of the status, with no thread per waiter.

        Call it on the loop's thread (``loop`` defaults to the running one) with the ``end_offset``
        of an append made with ``wait=False`` (``PackedPutResult.end_offset``; for a ``PutResult``,
        ``commitlog_offset + store_size``).  Under SYNC_FLUSH the future resolves with PUT_OK once
        an fdatasync of the commit log covers ``end_offset`` (all sends in flight share one: group
        commit; the consume queues follow with the periodic full flush), or with
        FLUSH_DISK_TIMEOUT after ``sync_flush_timeout_ms`` (the message is stored all the same);
        it is resolved already under ASYNC_FLUSH or when the offset is flushed.  Without the
        background flush thread (``background_services=False``) it syncs inline.  An offset past
        the end of the log raises OFFSET_ILLEGAL (nothing would ever cover it).

        Example::

            result = store.put_packed(topic, queue_id, data, count, wait=False)
            status = await store.wait_durable(result.end_offset)
        """
        loop = loop if loop is not None else asyncio.get_running_loop()
        flusher = self._flusher
        if self.config.flush_mode is not FlushMode.SYNC_FLUSH or flusher is None:
            fut: asyncio.Future[PutStatus] = loop.create_future()
            fut.set_result(self._await_durable(end_offset))
            return fut
        if flusher.log_flushed_offset < end_offset:
            end = self.commit_log.max_offset
            if end_offset > end:
                raise SparkMQError(ErrorCode.OFFSET_ILLEGAL,
                                   f"end offset {end_offset} is past the end of the log ({end})")
        return flusher.wait_async(end_offset, loop, self.config.sync_flush_timeout_ms / 1000.0)

    # -- replication (RocketMQ HA) ---------------------------------------------
    # A slave's log is a byte-for-byte copy of its master's: the master reads whole records from
    # the offset the slave reports (its max offset) and ships them; the slave appends them at the
    # same offsets and indexes them at the queue offsets they carry, so commit-log offsets, queue
    # offsets and offsetMsgIds agree on both.  Both stores need the same segment_size.
    def read_replication(self, offset: int, max_bytes: int = REPLICATION_BATCH_BYTES) -> bytes:
        """The master's side: whole records of the log from ``offset`` (a record boundary, usually the
        slave's max offset), up to ``max_bytes`` but at least one record when there is one; b"" when
        ``offset`` is the end of the log.

        A segment's closing blank marker comes whole (with its padding) and the answer goes on in the
        next segment, so it is exactly the log's bytes [offset, offset + len(answer)): the next fetch
        starts at ``offset + len(answer)``.  An offset that is not a record boundary, is below the
        oldest retained byte or past the end raises OFFSET_ILLEGAL (the message says which);
        ``max_bytes`` < 1 INVALID_ARGUMENT.
        """
        offset = _check_offset("offset", offset)
        check("max_bytes", max_bytes, int)
        try:
            return self.commit_log.read_replication(offset, max_bytes)
        except StoreError as exc:
            raise translate_store_error(exc) from None

    def append_replicated(self, offset: int, data: bytes | memoryview, *, notify: bool = True) -> int:
        """The slave's side: append ``data`` (what the master's :meth:`read_replication` returned for
        ``offset``) at ``offset``, which must be this log's max offset; returns the new max offset.

        Every record is checked (magic, size, CRC, its own offset, its queue offset being the next of
        its queue) before anything is written: a damaged, cut or misplaced run raises and changes
        nothing.  OFFSET_ILLEGAL: ``offset`` is not the end of this log or a record's commit-log or
        queue offset disagrees with it (the slave should report its max offset and fetch again);
        STORE_CORRUPT: a record of ``data`` is damaged or cut short.  Then the append listeners get one
        event per queue written, ``AppendEvent(topic, queue_id, (), None, None, replicated=True)``, so
        held pulls of the slave wake; no note, so the trace records nothing.  ``notify=False`` skips those
        events (a DLedger follower: its records become readable at commit, and it learns their queues then
        with :meth:`queues_in_range`, in C, rather than walking every record here in Python).  Durability
        follows the flush service as for any append (:meth:`await_durable` with the returned offset to wait).
        """
        offset = _check_offset("offset", offset)
        try:
            end = self.commit_log.append_replicated(offset, data)
        except StoreError as exc:
            raise translate_store_error(exc) from None
        if not notify:
            return end
        for topic, queue_id in _replicated_queues(data):
            self._notify(AppendEvent(topic, queue_id, (), None, None, replicated=True))
        return end

    # -- Raft (DLedger): the commit log is the Raft log ---------------------------------
    # A Raft member appends its leader's records with append_replicated (a leader its own with put*), cuts
    # an uncommitted tail a new leader does not have with truncate_log, and moves the commit index with
    # set_visible_offset: consumers see only what lies below it.  Replication (read_replication,
    # append_replicated), recovery and retention always see the whole log.
    def truncate_log(self, offset: int) -> int:
        """Cut the log back to ``offset`` (a deposed leader's or a follower's uncommitted tail); returns the new
        max offset, ``offset`` itself.

        ``offset`` must be an entry boundary of the log (a record's start, a segment-closing blank marker's
        start, or the max offset) at or above its min offset; anything else raises OFFSET_ILLEGAL and changes
        nothing.  Every record at and after ``offset`` goes: the max offset becomes ``offset``, the consume
        queues lose the units of those records (each queue's max offset goes back, its next message gets the
        queue offset after its last kept unit; a queue that keeps no message from queue offset 0 on disappears
        from :meth:`queues`, its files with it),
        later segment files are deleted and the rest of the segment holding ``offset`` is zeroed.  The kept
        bytes do not change, so appending (or replicating) the new leader's records from ``offset`` gives
        its log byte for byte.  A visibility limit above ``offset`` comes down to it, and the next
        :meth:`set_visible_offset` may set any value.

        Durable on return: the checkpoint is lowered first (a crash at any point recovers the old log or the
        truncated one, never the cut records behind a checkpoint past the end), the log is flushed after, and
        the flush service restarts from the new offsets (its waiters are answered by its last sync before).
        Truncations are serialized; they are meant for a store whose only writer is the caller (a Raft
        follower appends what its leader ships): a put running alongside may be answered on the old flushed
        offset.
        """
        offset = _check_offset("offset", offset)
        log_ = self.commit_log
        with self._truncate_lock:
            try:
                if offset != log_.max_offset:
                    log_.read_replication(offset, 1)  # the boundary check, before anything is written
            except StoreError as exc:
                raise translate_store_error(exc) from None
            flusher = self._flusher
            if flusher is not None:
                flusher.stop()  # answers its waiters; a new one starts below from the lowered offsets
            try:
                with self._checkpoint_lock:
                    before = read_checkpoint(self.paths.checkpoint)
                    # a segment's start at or below the new end, a record boundary whatever happens next
                    floor = min(max(offset // log_.segment_size * log_.segment_size, log_.min_offset),
                                log_.max_offset)
                    lowered = before is not None and before.flushed_offset > floor
                    if lowered:
                        write_checkpoint(self.paths.checkpoint, floor)
                    try:
                        with self._visible_lock:
                            end = log_.truncate(offset)
                            self._visible = log_.visible_offset
                            self._visible_rewind = True
                    except StoreError as exc:
                        if lowered and before is not None and exc.code != native_errors.IO_ERROR:  # refused: unchanged
                            write_checkpoint(self.paths.checkpoint, before.flushed_offset)
                        raise translate_store_error(exc) from None
                    try:
                        flushed = log_.flush()  # the zeroed tail and the deleted files, before anyone is told
                    except StoreError as exc:
                        raise translate_store_error(exc) from None
                    write_checkpoint(self.paths.checkpoint, min(flushed, log_.flushed_offset))
            finally:
                if flusher is not None:
                    self._flusher = self._new_flusher(log_)
                    self._flusher.start()
        log.info("store %s truncated to %d", self.config.root, end)
        return end

    def set_visible_offset(self, offset: int | None) -> int | None:
        """Set the commit index: consumer reads see only the records at commit-log offsets below ``offset``;
        None removes the limit (the default, also after a restart: the limit is not persisted).  Returns
        the limit in effect.

        Limited: :meth:`get_messages`, :meth:`get_packed`, :meth:`get_arrow`, :meth:`get_messages_matching`
        (a unit pointing at or past the limit ends the read, ``next_offset`` stays on it), :meth:`max_offset`
        and the max offset of every ``GetResult`` (one past the last visible unit: NO_NEW_MSG there, long
        polls keep waiting), :meth:`read_queue_message`, :meth:`read_message` (and by offsetMsgId),
        :meth:`read_records`, :meth:`offset_by_time`, :meth:`last_store_timestamp`.  Not limited: the log's
        offsets (:meth:`log_offsets`), :meth:`queue_unit`, replication, recovery, retention, and the
        commit log object itself apart from its ``get``/``read_packed``.

        While a limit is set it only grows: a lower ``offset`` is ignored (a late, stale update must not hide
        committed records), except for the first one after :meth:`truncate_log` or after None.  It may lie
        beyond the max offset (a follower that knows a commit index it has not received yet).  When the limit
        moves from ``a`` to ``b``, :meth:`queues_in_range` ``(a, b)`` names the queues whose held pulls to wake.
        """
        if offset is not None:
            offset = _check_offset("visible offset", offset)
            if offset >= _NO_LIMIT:
                raise SparkMQError(ErrorCode.OFFSET_ILLEGAL, f"visible offset must be below {_NO_LIMIT}, got {offset}")
        log_ = self.commit_log
        with self._visible_lock:
            current = self._visible
            if offset is not None and current is not None and offset < current and not self._visible_rewind:
                return current
            try:
                log_.set_visible_offset(offset)
            except StoreError as exc:
                raise translate_store_error(exc) from None
            self._visible = offset
            self._visible_rewind = False
            return offset

    @property
    def visible_offset(self) -> int | None:
        """The commit index consumer reads stop at (:meth:`set_visible_offset`); None when there is no limit."""
        return self._visible

    def queues_in_range(self, start: int, end: int) -> list[tuple[str, int]]:
        """(topic, queue_id) of every record starting in the log range [start, end), each once, in log order:
        the queues whose max offset a move of the visibility limit from ``start`` to ``end`` raised.

        The range is clamped to the log's [min offset, max offset]; [] when empty.  The clamped ``start``
        must be an entry boundary (a record's start, a blank marker's, the max offset): else OFFSET_ILLEGAL,
        as for negative offsets.  Walks record headers natively, a chunk per lock hold.
        """
        start = _check_offset("start", start)
        end = _check_offset("end", end)
        try:
            return self.commit_log.queues_in_range(start, end)
        except StoreError as exc:
            raise translate_store_error(exc) from None

    @property
    def store_host(self) -> str:
        """The "ip:port" stamped on every record (the prefix of every offsetMsgId)."""
        return self.config.store_host

    # -- reading --------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest queue offset still served (0 for a queue never written)."""
        cq = self.commit_log.consume_queue(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Queue offset the next message will get (0 for a queue never written), as consumers see it: under a
        visibility limit (:meth:`set_visible_offset`) one past the last visible message."""
        cq = self.commit_log.consume_queue(topic, queue_id)
        return cq.visible_max_offset if cq is not None else 0

    def _locate(self, topic: str, queue_id: int, offset: int,
                max_count: int) -> tuple[CommitLog, Any, int] | GetResult:
        """Validate a read and place ``offset`` in its queue: (log, consume queue, min offset) when there is
        something to read, else the answer (no such queue, offset too small, at the end, past the end)."""
        validate_topic(topic)
        offset = _check_offset("offset", offset)
        check_int("queue id", queue_id, 0, 65535, ErrorCode.QUEUE_ID_ILLEGAL)
        check_int("max_count", max_count, 1)
        log_ = self.commit_log
        cq = log_.consume_queue(topic, queue_id)
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset, cq.visible_max_offset
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.NO_NEW_MSG, hi, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW, hi, lo, hi)
        return log_, cq, lo

    def prefetch(self, topic: str, queue_id: int, offset: int, max_count: int,
                 max_bytes: int = PREFETCH_MAX_BYTES) -> int:
        """Bring into the page cache what a read of up to ``max_count`` messages of a queue from ``offset`` copies:
        the consume-queue units and the log records they point to (at most ``max_bytes`` of log from the first);
        returns the bytes read.

        Reads of cold history copy out of the mmap'd files holding the GIL (the units also the log's lock): each
        page fault there stops every thread of the broker until the disk answers.  Called first, on the thread
        that then reads, it waits for the disk with plain reads of the files instead (no lock, the GIL released),
        so the read itself copies from memory.  Best effort: what retention deleted meanwhile is skipped.
        """
        log_ = self.commit_log
        cq = log_.consume_queue(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = max(offset, cq.min_offset), min(offset + max_count, cq.visible_max_offset)
        if hi <= lo:
            return 0
        per_file = self.config.cq_units_per_file
        done = 0
        unit = lo
        while unit < hi:  # the units, file by file
            file_start = unit // per_file * per_file
            end = min(hi, file_start + per_file)
            done += _read_ahead(self.paths.consume_queue_file(topic, queue_id, file_start * CQ_UNIT_SIZE),
                                (unit - file_start) * CQ_UNIT_SIZE, (end - unit) * CQ_UNIT_SIZE)
            unit = end
        try:
            first = cq.unit(lo)[0]
            last, size, _tag = cq.unit(hi - 1)
        except StoreError:  # retention moved the queue meanwhile
            return done
        at, end = first, min(last + size, first + max_bytes)
        segment_size = log_.segment_size
        while at < end:  # the records, segment by segment
            start = at // segment_size * segment_size
            upto = min(end, start + segment_size)
            done += _read_ahead(self.paths.segment(start), at - start, upto - at)
            at = upto
        return done

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                     tags: Collection[str] | None = None, max_bytes: int = 0) -> GetResult:
        """Up to ``max_count`` messages of a queue from ``offset``.

        ``tags``: deliver only messages with one of these tags (None = all); the
        consume queue's tag hash is matched first, then the tag string re-checked.
        """
        where = self._locate(topic, queue_id, offset, max_count)
        if isinstance(where, GetResult):
            return where
        log_, cq, lo = where
        wanted = frozenset(tags) if tags is not None else None
        hashes = frozenset(tag_hash(t) for t in wanted) if wanted is not None else None
        try:
            next_offset, records = log_.get(topic, queue_id, offset, max_count, hashes, max_bytes)
        except StoreError as exc:
            if exc.code == native_errors.OFFSET_TOO_SMALL:  # retention moved the queue meanwhile
                lo = cq.min_offset
                return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, cq.visible_max_offset)
            raise translate_store_error(exc) from None
        messages = [StoredMessage.from_decoded(decode_record(rec)) for _q, _c, rec in records]
        if wanted is not None:
            messages = [m for m in messages if m.tags in wanted]
        status = GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MSG
        return GetResult(status, next_offset, lo, cq.visible_max_offset, messages)

    def get_arrow(self, topic: str, queue_id: int, offset: int, max_count: int = 32, max_bytes: int = 0,
                  broker_name: str = "", *, decode: bool = True) -> tuple[GetResult, pa.RecordBatch]:
        """Like :meth:`get_messages` without a filter, but the messages as one Arrow record batch.

        ``decode``: a ``PULL_SCHEMA`` batch, the columns cut straight out of the raw records
        (:func:`~..common.record_columns.records_to_arrow`, no ``StoredMessage`` built); else a
        ``RECORDS_SCHEMA`` batch of the records as stored, for the reader to decode.  The
        ``GetResult`` carries status and offsets, ``messages`` empty.
        """
        empty = EMPTY_PULL_BATCH if decode else _EMPTY_RECORDS
        where = self._locate(topic, queue_id, offset, max_count)
        if isinstance(where, GetResult):
            return where, empty
        log_, cq, lo = where
        try:
            next_offset, records = log_.get(topic, queue_id, offset, max_count, None, max_bytes)
        except StoreError as exc:
            if exc.code == native_errors.OFFSET_TOO_SMALL:  # retention moved the queue meanwhile
                lo = cq.min_offset
                return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, cq.visible_max_offset), empty
            raise translate_store_error(exc) from None
        raw = [rec for _q, _c, rec in records]
        if decode:
            batch = records_to_arrow(raw, broker_name)
        else:
            batch = pa.RecordBatch.from_arrays([records_array(raw)], schema=RECORDS_SCHEMA)
        status = GetStatus.FOUND if batch.num_rows else GetStatus.NO_MATCHED_MSG
        return GetResult(status, next_offset, lo, cq.visible_max_offset), batch

    def get_packed(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                   tags: Collection[str] | None = None, max_bytes: int = 0) -> PackedGetResult:
        """Like :meth:`get_messages`, but the records as stored, back to back, copied out in one native call.

        ``tags`` filters by the consume queue's tag hash only: the reader re-checks the tag
        string (a hash collision costs it a skipped message, as in RocketMQ).
        """
        where = self._locate(topic, queue_id, offset, max_count)
        if isinstance(where, GetResult):
            return PackedGetResult(where.status, where.next_offset, where.min_offset, where.max_offset)
        log_, cq, lo = where
        hashes = frozenset(tag_hash(t) for t in tags) if tags is not None else None
        try:
            next_offset, count, data = log_.read_packed(topic, queue_id, offset, max_count, hashes, max_bytes)
        except StoreError as exc:
            if exc.code == native_errors.OFFSET_TOO_SMALL:  # retention moved the queue meanwhile
                lo = cq.min_offset
                return PackedGetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, cq.visible_max_offset)
            raise translate_store_error(exc) from None
        status = GetStatus.FOUND if count else GetStatus.NO_MATCHED_MSG
        return PackedGetResult(status, next_offset, lo, cq.visible_max_offset, count, data)

    def read_records(self, commitlog_offsets: Iterable[int]) -> bytes:
        """The stored records at these commit-log offsets, back to back (a filtered pull's answer); one at or past
        the visibility limit raises OFFSET_ILLEGAL."""
        log_ = self.commit_log
        visible = self._visible
        offsets = list(commitlog_offsets) if visible is not None else commitlog_offsets
        if visible is not None:
            for offset in offsets:
                if offset >= visible:
                    raise SparkMQError(ErrorCode.OFFSET_ILLEGAL,
                                       f"offset {offset} is at or past the visible offset {visible}")
        try:
            return b"".join(log_.read(offset) for offset in offsets)
        except StoreError as exc:
            raise translate_store_error(exc) from None

    def get_messages_matching(self, topic: str, queue_id: int, offset: int, max_count: int,
                              matches: Callable[[Mapping[str, str]], bool], max_examined: int = 32_768,
                              max_bytes: int = 0) -> GetResult:
        """Like :meth:`get_messages`, but deliver only messages whose *properties* satisfy ``matches``.

        Built for broker-side SQL92 filtering: records are read in large batches and only
        the properties the predicate asks for are searched (:class:`RawProperties`); a
        body is decoded only for a message that matches.  Scans past non-matching runs until ``max_count``
        matched, ``max_examined`` units were examined, or the queue ends; the result's
        ``next_offset`` is one past the last unit examined (NO_MATCHED_MSG when none matched).
        """
        where = self._locate(topic, queue_id, offset, max_count)
        if isinstance(where, GetResult):
            return where
        log_, cq, lo = where
        found: list[StoredMessage] = []
        size = 0
        next_offset = offset
        examined = 0
        # Start small (a selective filter still finds max_count soon) and double: records read past the
        # last match of a pull are read again by the next one, so a fixed large batch wastes copies.
        step = max(64, 4 * max_count)
        while len(found) < max_count and examined < max_examined and next_offset < cq.visible_max_offset:
            batch = min(step, _SCAN_BATCH, max_examined - examined)
            step *= 2
            try:
                after, records = log_.get(topic, queue_id, next_offset, batch, None, _SCAN_BYTES)
            except StoreError as exc:
                if exc.code == native_errors.OFFSET_TOO_SMALL:  # retention moved the queue meanwhile
                    lo = cq.min_offset
                    return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, cq.visible_max_offset)
                raise translate_store_error(exc) from None
            if after <= next_offset:
                break
            for queue_offset, _clog, rec in records:
                if matches(raw_record_properties(rec)):
                    if max_bytes and found and size + len(rec) > max_bytes:
                        after = queue_offset  # the rest of the batch is examined again next time
                        break
                    found.append(StoredMessage.from_decoded(decode_record(rec)))
                    size += len(rec)
                    if len(found) >= max_count:
                        after = queue_offset + 1
                        break
            examined += after - next_offset
            next_offset = after
        status = GetStatus.FOUND if found else GetStatus.NO_MATCHED_MSG
        return GetResult(status, next_offset, lo, cq.visible_max_offset, found)

    def read_message(self, commitlog_offset: int) -> StoredMessage:
        """The message stored at ``commitlog_offset``; MESSAGE_NOT_FOUND when none starts there (or it is at or
        past the visibility limit)."""
        offset = _check_offset("commitlog offset", commitlog_offset)
        visible = self._visible
        if visible is not None and offset >= visible:
            raise SparkMQError(ErrorCode.MESSAGE_NOT_FOUND,
                               f"offset {offset} is at or past the visible offset {visible}")
        try:
            return StoredMessage.from_decoded(decode_record(self.commit_log.read(offset)))
        except StoreError as exc:
            if exc.code in (native_errors.OFFSET_ILLEGAL, native_errors.OFFSET_TOO_SMALL,
                            native_errors.OFFSET_OVERFLOW):
                raise SparkMQError(ErrorCode.MESSAGE_NOT_FOUND, exc.message) from None
            raise translate_store_error(exc) from None

    def read_by_offset_msg_id(self, offset_msg_id: str) -> StoredMessage:
        """The message an offsetMsgId points to, if it was stored here."""
        decoded = decode_offset_msg_id(offset_msg_id)
        if decoded.store_host != self.config.store_host:
            raise SparkMQError(ErrorCode.MESSAGE_NOT_FOUND,
                               f"{offset_msg_id} was stored on {decoded.store_host}, not on {self.config.store_host}")
        return self.read_message(decoded.commitlog_offset)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose store time is >= ``timestamp_ms`` (max offset as :meth:`max_offset` if none)."""
        log_ = self.commit_log
        cq = log_.consume_queue(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.visible_max_offset
        while lo < hi:  # invariant: every offset < lo is too early; hi is a candidate
            mid = (lo + hi) // 2
            try:
                ts = log_.store_timestamp_at(cq.unit(mid)[0])
            except StoreError as exc:
                if exc.code == native_errors.OFFSET_TOO_SMALL:
                    lo = mid + 1  # deleted under us: earlier than anything retained
                    continue
                raise translate_store_error(exc) from None
            if ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- disk and retention ----------------------------------------------------
    def set_retention_floor(self, floor: Callable[[], RetentionFloor | None] | None) -> None:
        """Tell the store how to learn the oldest commit-log offset a consumer still needs: ``floor()`` answers
        it (with who holds it) or None when nobody needs anything.  Early deletion under disk pressure stops
        there (unless ``disk_clean_unconsumed``); the broker passes its consumer groups' committed offsets and
        its delay, timer and transaction services' progress.  Called from the retention thread, only while the
        disk is at ``disk_max_used_ratio`` or above."""
        self._floor = floor

    @property
    def writable(self) -> bool:
        """False while writes are refused with DISK_FULL (the disk is past its warning ratio)."""
        return not self._disk.full

    def disk_status(self) -> dict[str, Any]:
        """The disk watermarks' state: the file system's use (``total_bytes``, ``used_bytes``, ``free_bytes``,
        ``used_ratio``), ``state`` (OK, CLEAN, FORCE_CLEAN, FULL), ``writable``, ``refused_writes``, the ratios,
        and ``held_by`` (what kept early deletion from a segment at the last retention pass)."""
        return self._disk.status()

    def check_disk(self) -> DiskState:
        """Measure the disk now (the retention thread does every ``disk_check_interval_ms``); the new state."""
        self._disk.check()
        return self._disk.state

    def run_retention(self, now_ms: int | None = None) -> RetentionDecision:
        """One retention pass: measure the disk, delete what is due (and, under disk pressure, what may go
        early), and measure again when something went, so refused writes resume at once."""
        log_ = self.commit_log
        used = self._disk.check().used_ratio
        floor = None
        if used >= self.config.disk_max_used_ratio and not self.config.disk_clean_unconsumed:
            floor = self._retention_floor()
        decision = self._retention.decide(log_.segments(), log_.segment_size, used, floor, now_ms)
        self._disk.held_by = decision.held_by
        if decision.segments:
            deleted = log_.delete_segments_before(decision.delete_before)
            log.info("retention deleted %d segment(s) (%s; disk %.1f%% used); min offset now %d", deleted,
                     decision.reason, used * 100, log_.min_offset)
            self._disk.check()
        return decision

    def _retention_floor(self) -> RetentionFloor | None:
        floor = self._floor
        if floor is None:
            return None
        try:
            found = floor()
        except Exception as exc:  # unknown: delete nothing early rather than what a group still needs
            self._floor_failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
            return RetentionFloor(0, "an unknown consumer (the retention floor failed)")
        self._floor_failures.success()
        return found

    def _housekeeping_loop(self) -> None:
        """Measure the disk every ``disk_check_interval_ms``; run retention every ``retention_interval_ms``,
        and at every check while the disk is at ``disk_max_used_ratio`` or above."""
        cfg = self.config
        last_retention = time.monotonic()
        while not self._stop.wait(cfg.disk_check_interval_ms / 1000.0):
            try:
                now = time.monotonic()
                pressed = self._disk.state is not DiskState.OK
                if pressed or (now - last_retention) * 1000 >= cfg.retention_interval_ms:
                    last_retention = now
                    self.run_retention()
                else:
                    self._disk.check()
                    if self._disk.state is not DiskState.OK:
                        self.run_retention()
            except Exception as exc:  # retried next interval
                self._housekeeping_failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
            else:
                self._housekeeping_failures.success()


_SIZE_MAGIC = struct.Struct("<II")
#: No offset reaches it (the native core's "no limit").
_NO_LIMIT = (1 << 63) - 1


def _read_ahead(path: Path, start: int, length: int) -> int:
    """Read ``length`` bytes of ``path`` from ``start`` into this thread's scratch buffer (so into the page
    cache), the GIL released during each read; the bytes read (0 for a file retention deleted)."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None:
        buffer = _scratch.buffer = memoryview(bytearray(_PREFETCH_CHUNK))
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        done = 0
        while done < length:
            got = os.preadv(fd, [buffer[:min(len(buffer), length - done)]], start + done)
            if got <= 0:
                break
            done += got
        return done
    finally:
        os.close(fd)


def _replicated_queues(data: bytes | memoryview) -> list[tuple[str, int]]:
    """(topic, queue_id) of each queue the records of a replicated run (checked by the log) go to, in order
    of first appearance; blank markers are skipped."""
    view = memoryview(data).cast("B")
    seen: dict[tuple[bytes, int], None] = {}
    at = 0
    while at < len(view):
        total, magic = _SIZE_MAGIC.unpack_from(view, at)
        if magic == RECORD_MAGIC:
            topic_at = at + RECORD_HEADER_SIZE + _U32.unpack_from(view, at + BODY_LENGTH_AT)[0]
            topic = bytes(view[topic_at + 1:topic_at + 1 + view[topic_at]])
            seen.setdefault((topic, _I32.unpack_from(view, at + QUEUE_ID_AT)[0]))
        at += total
    return [(topic.decode("utf-8"), queue_id) for topic, queue_id in seen]


#: Units read per native call while filtering on properties, and the byte cap of one such read.
_SCAN_BATCH = 1024
_SCAN_BYTES = 8 << 20
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")


class RawProperties(Mapping[str, str]):
    """A read-only view of encoded properties that finds one property without decoding the others.

    Filters call ``get(name)`` for the few names an expression mentions; searching the
    raw ``key\\x01value\\x02`` bytes for those is several times cheaper than building a dict.
    Keys and values cannot contain the separators, so a search cannot match across pairs.
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        """The value of ``name``, or ``default``."""
        first, inner = _needles(name)
        raw = self._raw
        if raw.startswith(first):
            start = len(first)
        else:
            at = raw.find(inner)
            if at < 0:
                return default
            start = at + len(inner)
        end = raw.find(b"\x02", start)
        return raw[start:end if end >= 0 else len(raw)].decode("utf-8")

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(decode_properties(self._raw))

    def __len__(self) -> int:
        return len(decode_properties(self._raw))


@functools.lru_cache(maxsize=4096)
def _needles(name: str) -> tuple[bytes, bytes]:
    key = name.encode("utf-8")
    return key + b"\x01", b"\x02" + key + b"\x01"


def raw_record_properties(record: bytes | memoryview) -> RawProperties:
    """The properties of one whole record as a lazy :class:`RawProperties` view."""
    at = RECORD_HEADER_SIZE + _U32.unpack_from(record, BODY_LENGTH_AT)[0]
    at += 1 + record[at]
    length = _U16.unpack_from(record, at)[0]
    return RawProperties(bytes(record[at + 2:at + 2 + length]))


def unpack_batch(data: bytes | memoryview, count: int) -> list[tuple[bytes, dict[str, str]]]:
    """(body, properties) of each message of a packed batch (a delayed batch's slow path); MESSAGE_ILLEGAL
    when the batch is not well framed."""
    try:
        items = decode_batch(data, count)
    except StoreError as exc:
        raise translate_store_error(exc) from None
    return [(body, decode_properties(props)) for body, props, _flag, _born in items]


def stored_messages_of(records: bytes | memoryview) -> list[StoredMessage]:
    """The messages of records back to back (a packed pull's answer), decoded one by one (not a hot path)."""
    view = memoryview(records)
    out = []
    at = 0
    while at < len(view):
        size = _U32.unpack_from(view, at)[0]
        try:
            out.append(StoredMessage.from_decoded(decode_record(view[at:at + size])))
        except StoreError as exc:
            raise translate_store_error(exc) from None
        at += size
    return out


def records_of(messages: Iterable[StoredMessage]) -> bytes:
    """Stored messages as records back to back, in the log's format (``storage_native.layout``)."""
    return b"".join(encode_record(
        topic=m.topic, queue_id=m.queue_id, flag=m.flag, queue_offset=m.queue_offset,
        commitlog_offset=m.commitlog_offset, sys_flag=m.sys_flag, born_timestamp=m.born_timestamp,
        born_host=pack_host(m.born_host or None), store_timestamp=m.store_timestamp,
        store_host=pack_host(m.store_host or None), reconsume_times=m.reconsume_times,
        prepared_offset=m.prepared_offset, tag_hash=m.tag_hash, body=m.body,
        properties=encode_properties(m.properties)) for m in messages)


def _record_size(body: bytes, topic: str, props: bytes) -> int:
    return record_size(len(body), len(topic.encode("utf-8")), len(props))


def iter_all(store: MessageStore, topic: str, queue_id: int, batch: int = 256) -> Iterable[StoredMessage]:
    """Every retained message of a queue, in order (a convenience for tools and tests)."""
    offset = store.min_offset(topic, queue_id)
    while True:
        got = store.get_messages(topic, queue_id, offset, batch)
        if got.status is not GetStatus.FOUND and got.status is not GetStatus.NO_MATCHED_MSG:
            return
        yield from got.messages
        offset = got.next_offset

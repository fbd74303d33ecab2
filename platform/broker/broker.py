"""The broker controller: topic table, store, clients, offsets, locks, long polling, registration.

:class:`Broker` is what the HTTP app (``sparkmq.api.broker_app``) calls; it has no
HTTP in it, so tests and tools drive it in-process.  Every public method validates
its input first and raises :class:`~sparkmq.platform.common.errors.SparkMQError`
with a stable code, leaving nothing changed; a send's topic is auto-created only
after its message was stored.

Lifecycle: :meth:`Broker.start` loads the topic table, opens the store, restores
consumer offsets and starts the background threads (offset persist, client expiry,
name server registration).  :meth:`Broker.shutdown` stops accepting sends and pulls,
releases held pulls, waits for sends in flight, unregisters from the name servers,
persists offsets and closes the store -- in that order.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from ...storage_native import StoreError
from ..common.errors import ErrorCode, SparkMQError
from ..common.filtering import parse_tags
from ..common.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    SendStatus,
    StoredMessage,
)
from ..common.sysflag import COMPRESSED
from ..common.system_topics import retry_topic
from ..common.validation import validate_group, validate_topic
from ..namesrv.perm import is_readable, is_writeable
from ..store import FlushMode, GetResult, GetStatus, MessageStore, PutResult, PutStatus
from .client_manager import ClientManager, ConsumerData, GroupInfo, MessageModel
from .config import BrokerConfig, BrokerRole
from .locks import QueueLockManager, QueueRef
from .long_polling import PullHoldService
from .metrics import BrokerMetrics
from .offsets import CONSUMER_OFFSETS_TABLE, ConsumerOffsetManager
from .registration import RegistrationService
from .topics import TopicConfig, TopicConfigManager

__all__ = [
    "Broker",
    "OutgoingMessage",
    "SendStatus",
    "SendResult",
    "BatchSendResult",
    "MAX_PULL_BATCH",
]

log = logging.getLogger("sparkmq.broker")

#: The most messages one pull answers.
MAX_PULL_BATCH = 1024
#: A tag-filtered pull keeps scanning past non-matching messages for at most this many store reads.
_MAX_FILTER_ROUNDS = 16
_MAX_MSG_ID_LENGTH = 128
#: How long shutdown waits for sends and reads in flight before closing the store anyway.
_DRAIN_TIMEOUT_S = 10.0


@dataclass(slots=True)
class OutgoingMessage:
    """One message as a producer sends it (before validation).

    ``properties`` may carry ``TAGS``, ``KEYS`` or ``UNIQ_KEY`` (a re-sent pulled
    message does); they must then agree with ``tags``, ``keys`` and ``msg_id``.
    """

    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    #: The producer's unique id (UNIQ_KEY); None = the broker makes one.
    msg_id: str | None = None


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where one sent message was stored."""

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    store_timestamp: int
    commitlog_offset: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of ``POST /topics/{topic}/messages``."""
        return {"status": str(self.status), "msg_id": self.msg_id, "offset_msg_id": self.offset_msg_id,
                "topic": self.topic, "broker_name": self.broker_name, "queue_id": self.queue_id,
                "queue_offset": self.queue_offset, "store_timestamp": self.store_timestamp}


@dataclass(frozen=True, slots=True)
class BatchSendResult:
    """Where a batch was stored (one queue, consecutive offsets)."""

    status: SendStatus
    topic: str
    broker_name: str
    queue_id: int
    results: list[PutResult]

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of ``POST /topics/{topic}/batch``."""
        return {"status": str(self.status), "topic": self.topic, "broker_name": self.broker_name,
                "queue_id": self.queue_id,
                "results": [{"msg_id": r.msg_id, "offset_msg_id": r.offset_msg_id, "queue_offset": r.queue_offset}
                            for r in self.results]}


def _check_int(name: str, value: object, low: int, high: int, code: ErrorCode = ErrorCode.INVALID_ARGUMENT) -> int:
    # bool is an int subclass; True must not mean queue 1.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SparkMQError(code, f"{name} must be an integer in {low}..{high}, got {value!r}")
    return value


def _looks_like_zlib(body: bytes) -> bool:
    # RFC 1950 header: deflate method, and CMF*256+FLG divisible by 31.  A cheap check that a
    # "compressed" body is not plain text by mistake (inflating every body would cost too much).
    return len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0


class Broker:
    """One broker: the controller the HTTP app calls (see the module docstring for the lifecycle)."""

    def __init__(self, config: BrokerConfig) -> None:
        """Build every component; nothing touches the disk or network until :meth:`start`."""
        self.config = config
        self.topics = TopicConfigManager(config.topics_path, default_queue_nums=config.default_topic_queue_nums,
                                         auto_create=config.auto_create_topic)
        self.store = MessageStore(config.store_config(), queue_count_of=self.topics.queue_count)
        self.clients = ClientManager(config.client_expiry_s, config.client_scan_interval_s)
        self.locks = QueueLockManager(config.queue_lock_expiry_s)
        self.offsets = ConsumerOffsetManager(config.lake_table_path(CONSUMER_OFFSETS_TABLE), config.broker_name,
                                             config.offset_persist_interval_s)
        self.holds = PullHoldService()
        self.metrics = BrokerMetrics(self._scrape_commitlog_max, self._scrape_queue_max, self._scrape_group_lag)
        self.registration = RegistrationService(config.namesrv_addrs, self.registration_payload,
                                                self._unregister_payload, config.register_interval_s,
                                                config.register_timeout_s)
        self._state = "new"
        self._state_lock = threading.Lock()
        self._inflight = 0
        self._drained = threading.Condition(self._state_lock)
        self._round_robin: dict[str, Iterator[int]] = {}
        self.topics.add_listener(lambda _version: self.registration.trigger())
        self.clients.add_leave_listener(self._on_clients_left)

    # ================================================================== lifecycle
    @property
    def name(self) -> str:
        """The broker name."""
        return self.config.broker_name

    @property
    def addr(self) -> str:
        """The address clients and name servers are told."""
        return self.config.addr

    @property
    def running(self) -> bool:
        """Whether sends and pulls are accepted."""
        return self._state == "running"

    def start(self, register: bool = True) -> Broker:
        """Load topics, open the store, restore offsets, start the background threads; returns self.

        ``register=False`` defers name server registration to :meth:`start_registration`
        (a runner calls it once its socket accepts connections, so no client is routed to
        an address that refuses them).
        """
        if self._state != "new":
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"the broker is {self._state}, it cannot start")
        if self.config.port == 0 and not self.config.advertised_addr:
            raise ValueError("port 0: bind the listening socket first and pass config.bound_to(real_port)")
        self.topics.load()
        self.store.start()
        try:
            loaded = self.offsets.load()
            self.offsets.start()
            self.clients.start()
        except BaseException:
            self.offsets.stop()
            self.store.shutdown()
            raise
        self._state = "running"
        if register:
            self.registration.start()
        log.info("broker %s (%s) started at %s: %d topics, %d consumer offsets, store clean start %s",
                 self.name, self.config.role, self.addr, len(self.topics), loaded, self.store.clean_start)
        return self

    def start_registration(self) -> None:
        """Start registering with the name servers (idempotent)."""
        if self.running:
            self.registration.start()

    def begin_shutdown(self) -> None:
        """Stop accepting sends and pulls and release held pulls and change polls (non-blocking, idempotent)."""
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            was_new = self._state == "new"
            self._state = "stopped" if was_new else "stopping"
        self.holds.close()
        self.clients.release_waiters()

    def shutdown(self) -> None:
        """Stop in order: accepting, in-flight work, registration (unregister), client scan, offsets, store."""
        with self._state_lock:
            if self._state == "stopped":
                return
            started = self._state != "new"
        self.begin_shutdown()
        if not started:
            return
        with self._drained:
            if not self._drained.wait_for(lambda: self._inflight == 0, _DRAIN_TIMEOUT_S):
                log.warning("shutdown: %d operation(s) still in flight after %.0f s", self._inflight, _DRAIN_TIMEOUT_S)
        self.registration.stop(unregister=True)
        self.clients.stop()
        if not self.offsets.stop():
            log.error("shutdown: the final consumer offset persist failed (see above)")
        self.store.shutdown()
        with self._state_lock:
            self._state = "stopped"
        log.info("broker %s stopped", self.name)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        """Count a store operation in flight; SERVICE_NOT_AVAILABLE unless running."""
        with self._state_lock:
            if self._state != "running":
                raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"the broker is {self._state}")
            self._inflight += 1
        try:
            yield
        finally:
            with self._state_lock:
                self._inflight -= 1
                if self._inflight == 0:
                    self._drained.notify_all()

    # ================================================================== sending
    @property
    def send_may_block(self) -> bool:
        """Whether a send waits for a disk sync (SYNC_FLUSH), so callers should run it off the event loop."""
        return self.store.config.flush_mode is FlushMode.SYNC_FLUSH

    def send(self, topic: str, message: OutgoingMessage, *, queue_id: int | None = None,
             sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
             born_timestamp: int | None = None, born_host: str | None = None) -> SendResult:
        """Store one message; the topic is auto-created (after storing) when allowed.

        Queue choice: ``queue_id`` (a write queue), else a stable hash of ``sharding_key``
        over the write queues, else round-robin.
        """
        started = time.perf_counter()
        try:
            with self._operation():
                cfg, qid = self._prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
                msg, sys_flag = self._to_message(topic, message, compressed)
                result = self.store.put(msg, qid, born_host=born_host, born_timestamp=born_timestamp,
                                        sys_flag=sys_flag)
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        self._after_store(topic, qid, cfg)
        self.metrics.sent(topic, 1, len(msg.body), time.perf_counter() - started)
        return SendResult(self._send_status(result.status), result.msg_id, result.offset_msg_id, topic, self.name,
                          qid, result.queue_offset, result.store_timestamp, result.commitlog_offset)

    def send_batch(self, topic: str, messages: Sequence[OutgoingMessage], *, queue_id: int | None = None,
                   sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
                   born_timestamp: int | None = None, born_host: str | None = None) -> BatchSendResult:
        """Store many messages in one queue with consecutive offsets; one bad message rejects the batch."""
        started = time.perf_counter()
        try:
            with self._operation():
                if compressed:
                    # The store's batch put writes sys_flag 0 (RocketMQ does not compress batches either).
                    raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                                       "compressed batches are not supported; send compressed messages one by one")
                if not isinstance(messages, Sequence) or not messages:
                    raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the batch is empty")
                cfg, qid = self._prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
                batch = []
                for i, message in enumerate(messages):
                    try:
                        batch.append(self._to_message(topic, message, False)[0])
                    except SparkMQError as exc:
                        raise SparkMQError(exc.code, f"message {i}: {exc.message}") from None
                results = self.store.put_batch(topic, qid, batch, born_host=born_host, born_timestamp=born_timestamp)
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        self._after_store(topic, qid, cfg)
        self.metrics.sent(topic, len(batch), sum(len(m.body) for m in batch), time.perf_counter() - started)
        return BatchSendResult(self._send_status(results[-1].status), topic, self.name, qid, results)

    def _prepare_send(self, topic: str, queue_id: int | None, sharding_key: str | None,
                      producer_group: str | None, born_timestamp: int | None) -> tuple[TopicConfig, int]:
        validate_topic(topic)
        if self.config.role is BrokerRole.SLAVE:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} is a slave; send to its master")
        if producer_group is not None:
            validate_group(producer_group)
        if born_timestamp is not None:
            _check_int("born_timestamp", born_timestamp, 0, 2**63 - 1)
        cfg = self.topics.for_send(topic)
        if not is_writeable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not writeable on {self.name} "
                                                        f"(perm {cfg.perm})")
        return cfg, self._select_queue(cfg, queue_id, sharding_key)

    def _select_queue(self, cfg: TopicConfig, queue_id: int | None, sharding_key: str | None) -> int:
        writes = cfg.write_queue_nums
        if queue_id is not None:
            return _check_int("queue_id", queue_id, 0, writes - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        if sharding_key is not None:
            if not isinstance(sharding_key, str) or not sharding_key:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "sharding_key must be a non-empty string")
            # crc32 is stable across processes and versions (Python's hash() is salted per process).
            return zlib.crc32(sharding_key.encode("utf-8")) % writes
        counter = self._round_robin.get(cfg.topic)
        if counter is None:
            counter = self._round_robin.setdefault(cfg.topic, itertools.count())
        return next(counter) % writes

    def _to_message(self, topic: str, message: OutgoingMessage, compressed: bool) -> tuple[Message, int]:
        """The store's Message for ``message`` with TAGS/KEYS/UNIQ_KEY reconciled; (message, sys_flag)."""
        if not isinstance(message, OutgoingMessage):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"expected OutgoingMessage, got {type(message).__name__}")
        if not isinstance(message.properties, dict):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "properties must be a mapping of strings to strings")
        props = dict(message.properties)
        tags = message.tags
        prop_tags = props.pop(PROPERTY_TAGS, None)
        if prop_tags is not None:
            if tags is not None and tags != prop_tags:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                                   f"tags {tags!r} disagree with property TAGS {prop_tags!r}")
            tags = prop_tags
        if isinstance(message.keys, str):
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "keys must be a list of strings, not one string")
        keys = tuple(message.keys)
        prop_keys = props.pop(PROPERTY_KEYS, None)
        if prop_keys is not None:
            from_props = tuple(k for k in str(prop_keys).split(KEY_SEPARATOR) if k)
            if keys and keys != from_props:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"keys {list(keys)} disagree with property KEYS")
            keys = from_props
        msg_id = message.msg_id
        prop_id = props.pop(PROPERTY_UNIQUE_ID, None)
        if prop_id is not None:
            if msg_id is not None and msg_id != prop_id:
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"msg_id {msg_id!r} disagrees with property UNIQ_KEY")
            msg_id = prop_id
        if msg_id is not None:
            if not isinstance(msg_id, str) or not 0 < len(msg_id) <= _MAX_MSG_ID_LENGTH or not msg_id.isprintable() \
                    or any(c.isspace() for c in msg_id):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                                   f"msg_id must be 1-{_MAX_MSG_ID_LENGTH} printable characters without spaces")
            props[PROPERTY_UNIQUE_ID] = msg_id
        sys_flag = 0
        if compressed:
            if not isinstance(message.body, bytes | bytearray) or not _looks_like_zlib(bytes(message.body)):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "compressed is set but the body is not zlib data")
            sys_flag |= COMPRESSED
        return Message(topic, message.body, tags, keys, props), sys_flag

    def _after_store(self, topic: str, queue_id: int, cfg: TopicConfig) -> None:
        if self.topics.get(topic) is None:
            try:
                self.topics.auto_create_topic(topic)
            except SparkMQError:  # the message is stored; the next send creates the topic again
                log.exception("auto-creating topic %s failed", topic)
        self.holds.notify_put(topic, queue_id)

    def _send_status(self, status: PutStatus) -> SendStatus:
        if status is PutStatus.FLUSH_DISK_TIMEOUT:
            return SendStatus.FLUSH_DISK_TIMEOUT
        if self.config.role is BrokerRole.SYNC_MASTER:
            # No replication service yet, so no slave can have acknowledged the message.
            return SendStatus.SLAVE_NOT_AVAILABLE
        return SendStatus.SEND_OK

    # ================================================================== pulling
    def _check_pull(self, topic: str, queue_id: int, offset: int, max_count: int) -> TopicConfig:
        cfg = self.topics.require(topic)
        if not is_readable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not readable on {self.name} "
                                                        f"(perm {cfg.perm})")
        _check_int("queue_id", queue_id, 0, cfg.read_queue_nums - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        _check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
        _check_int("max", max_count, 1, MAX_PULL_BATCH)
        return cfg

    def pull_once(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                  tags: frozenset[str] | None = None, *, group: str | None = None,
                  commit_offset: int | None = None) -> GetResult:
        """Read up to ``max_count`` messages without waiting; also commits ``commit_offset`` for ``group``.

        With a tag filter, a read that matched nothing keeps scanning towards the
        queue's end (bounded), so consumers do not round-trip over long runs of other tags.
        """
        started = time.perf_counter()
        with self._operation():
            self._check_pull(topic, queue_id, offset, max_count)
            if group is not None:
                validate_group(group)
            if commit_offset is not None:
                if group is None:
                    raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "commit_offset needs a group")
                self.offsets.commit(group, topic, queue_id, commit_offset)
            result = self.store.get_messages(topic, queue_id, offset, max_count, tags, self.config.pull_max_bytes)
            rounds = 1
            while (result.status is GetStatus.NO_MATCHED_MSG and result.next_offset < result.max_offset
                   and rounds < _MAX_FILTER_ROUNDS):
                result = self.store.get_messages(topic, queue_id, result.next_offset, max_count, tags,
                                                 self.config.pull_max_bytes)
                rounds += 1
            if result.status is GetStatus.NO_NEW_MSG and result.next_offset > offset:
                result = GetResult(GetStatus.NO_MATCHED_MSG, result.next_offset, result.min_offset,
                                   result.max_offset)  # filtered to the end: the caller must still advance
        self.metrics.pulled(topic, group, len(result.messages), sum(len(m.body) for m in result.messages),
                            time.perf_counter() - started)
        return result

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags: str | None = None, *,
                   wait_ms: int = 0, group: str | None = None, commit_offset: int | None = None) -> GetResult:
        """Pull with long polling: when nothing (matching) is new, hold up to ``min(wait_ms, long_polling_max_ms)``.

        A held pull answers as soon as a message lands on the queue (and matches), or
        at the deadline with the status it would have had.  Store reads run in a worker
        thread; the hold itself costs no thread.
        """
        wanted = parse_tags(tags)
        _check_int("wait_ms", wait_ms, 0, 2**31 - 1)
        deadline = time.monotonic() + min(wait_ms, self.config.long_polling_max_ms) / 1000.0
        result = await anyio.to_thread.run_sync(
            lambda: self.pull_once(topic, queue_id, offset, max_count, wanted, group=group,
                                   commit_offset=commit_offset))
        while True:
            status = result.status
            at_end = (status is GetStatus.NO_NEW_MSG
                      or (status is GetStatus.NO_MATCHED_MSG and result.next_offset >= result.max_offset)
                      or (status is GetStatus.NO_MATCHED_QUEUE and offset == 0))
            remaining = deadline - time.monotonic()
            if not at_end or remaining <= 0 or not self.running:
                return result
            start = result.next_offset
            await self.holds.hold(topic, queue_id, remaining,
                                  lambda s=start: self.running and self.store.max_offset(topic, queue_id) > s)
            if not self.running:
                return result
            again = await anyio.to_thread.run_sync(
                lambda s=start: self.pull_once(topic, queue_id, s, max_count, wanted, group=group))
            if again.status is GetStatus.NO_NEW_MSG and start > offset:
                # Earlier rounds skipped non-matching messages: tell the caller to advance.
                again = GetResult(GetStatus.NO_MATCHED_MSG, again.next_offset, again.min_offset, again.max_offset)
            result = again

    def queue_offsets(self, topic: str, queue_id: int, timestamp: int | None = None) -> dict[str, int]:
        """``{"min_offset", "max_offset"}`` of a queue, plus ``"offset"`` (first stored at or after ``timestamp``)."""
        cfg = self.topics.require(topic)
        _check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        out = {"min_offset": self.store.min_offset(topic, queue_id),
               "max_offset": self.store.max_offset(topic, queue_id)}
        if timestamp is not None:
            _check_int("timestamp", timestamp, 0, 2**63 - 1)
            out["offset"] = self.store.offset_by_time(topic, queue_id, timestamp)
        return out

    def message_by_offset_msg_id(self, offset_msg_id: str) -> StoredMessage:
        """The message an offsetMsgId points to (MESSAGE_ID_ILLEGAL, MESSAGE_NOT_FOUND)."""
        return self.store.read_by_offset_msg_id(offset_msg_id)

    # ================================================================== consumer offsets
    def commit_offsets(self, group: str, entries: Iterable[tuple[str, int, int]]) -> int:
        """Commit ``(topic, queue_id, offset)`` entries for ``group``, all or nothing; returns how many."""
        validate_group(group)
        checked = []
        for entry in entries:
            topic, queue_id, offset = entry
            cfg = self.topics.require(topic)
            _check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
            _check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
            checked.append((topic, queue_id, offset))
        for topic, queue_id, offset in checked:
            self.offsets.commit(group, topic, queue_id, offset)
        return len(checked)

    def query_offsets(self, group: str, topic: str | None = None) -> dict[str, dict[int, int]]:
        """``{topic: {queue_id: offset}}`` of ``group`` (one topic when given)."""
        if topic is not None:
            return {topic: self.offsets.offsets_of(group, topic)}
        return self.offsets.offsets_of(group)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when ``group`` never committed one there."""
        committed = self.offsets.query(group, topic, queue_id)
        return -1 if committed is None else committed

    def lag(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """Per read queue: broker offset, consumer offset (-1 = none) and lag; topics of the group when none given."""
        validate_group(group)
        if topic is not None:
            configs = [self.topics.require(topic)]
        else:
            names = set(self.offsets.topics_of(group)) | set(self.clients.subscribed_topics(group))
            configs = [cfg for n in sorted(names) if (cfg := self.topics.get(n)) is not None]
        queues = []
        for cfg in configs:
            for queue_id in range(cfg.read_queue_nums):
                max_offset = self.store.max_offset(cfg.topic, queue_id)
                min_offset = self.store.min_offset(cfg.topic, queue_id)
                lag = self.offsets.lag(group, cfg.topic, queue_id, max_offset, min_offset)
                queues.append({"topic": cfg.topic, "queue_id": queue_id, "broker_offset": max_offset,
                               "consumer_offset": self.query_offset(group, cfg.topic, queue_id), "lag": lag})
        return {"group": group, "total_lag": sum(q["lag"] for q in queues), "queues": queues}

    # ================================================================== topics
    def create_or_update_topic(self, topic: str, read_queue_nums: int = 16, write_queue_nums: int = 16,
                               perm: int = 6, order: bool = False, topic_sys_flag: int = 0) -> TopicConfig:
        """Create or update an ordinary topic (NO_PERMISSION for system topics); registration follows at once."""
        return self.topics.create_or_update(topic, read_queue_nums, write_queue_nums, perm, order, topic_sys_flag)

    def delete_topic(self, topic: str) -> bool:
        """Delete a topic's config and every group's offsets of it; False when it did not exist.

        Its stored messages stay in the commit log until retention removes them.
        """
        deleted = self.topics.delete(topic)
        self.offsets.remove_topic(topic)
        self._round_robin.pop(topic, None)
        return deleted

    def get_topic(self, topic: str) -> TopicConfig:
        """One topic's config (TOPIC_NOT_EXIST)."""
        return self.topics.require(topic)

    def list_topics(self) -> list[TopicConfig]:
        """Every topic, sorted."""
        return self.topics.list()

    def topic_stats(self, topic: str) -> dict[str, Any]:
        """Min/max offset and last store time of each of the topic's queues."""
        cfg = self.topics.require(topic)
        log_ = self.store.commit_log
        queues = []
        for queue_id in range(cfg.queue_count):
            cq = log_.consume_queue(topic, queue_id)
            lo, hi, last = (cq.min_offset, cq.max_offset, 0) if cq is not None else (0, 0, 0)
            if hi > lo:
                try:
                    last = log_.store_timestamp_at(cq.unit(hi - 1)[0])  # type: ignore[union-attr]
                except StoreError:  # retention removed it meanwhile
                    last = 0
            queues.append({"queue_id": queue_id, "min_offset": lo, "max_offset": hi, "last_store_timestamp": last})
        return {"topic": topic, "queues": queues}

    # ================================================================== clients and groups
    def heartbeat(self, client_id: str, producer_groups: Iterable[str] = (),
                  consumers: Sequence[ConsumerData] = ()) -> dict[str, int]:
        """Record a client heartbeat; returns each consumer group's membership version.

        Clustering groups get their retry topic ``%RETRY%<group>`` (1 queue), as in RocketMQ.
        """
        versions = self.clients.heartbeat(client_id, producer_groups, consumers)
        for data in consumers:
            if data.message_model is MessageModel.CLUSTERING:
                self.topics.ensure_system_topic(retry_topic(data.group))
        return versions

    def unregister_client(self, client_id: str, producer_groups: Iterable[str] = (),
                          consumer_groups: Iterable[str] = ()) -> dict[str, int]:
        """Remove a client from groups (it is shutting down); returns the consumer groups' versions."""
        return self.clients.unregister(client_id, producer_groups, consumer_groups)

    def group_info(self, group: str) -> GroupInfo:
        """A consumer group's members, version and subscriptions."""
        return self.clients.group_info(group)

    async def wait_group_change(self, group: str, version: int, wait_ms: int) -> tuple[int, list[str]]:
        """Long-poll a group's membership: answers when its version differs from ``version`` or at ``wait_ms``."""
        _check_int("version", version, 0, 2**63 - 1)
        _check_int("wait_ms", wait_ms, 0, 2**31 - 1)
        timeout = wait_ms / 1000.0 if self.running else 0.0
        return await self.clients.wait_change(group, version, timeout)

    def _on_clients_left(self, group: str, client_ids: list[str]) -> None:
        # A client that left cannot consume: free its orderly locks for the next owner at once.
        for client_id in client_ids:
            self.locks.unlock_client(group, client_id)

    # ================================================================== queue locks
    def lock_queues(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> list[QueueRef]:
        """Lock (or renew) queues for orderly consumption; returns those now held by ``client_id``."""
        return self.locks.lock(group, client_id, queues)

    def unlock_queues(self, group: str, client_id: str, queues: Iterable[QueueRef]) -> list[QueueRef]:
        """Release queues ``client_id`` holds; returns those released."""
        return self.locks.unlock(group, client_id, queues)

    # ================================================================== registration
    def registration_payload(self) -> dict[str, Any]:
        """The ``POST /brokers/register`` body: identity, data version and the whole topic table."""
        version, topics = self.topics.snapshot()
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "broker_addr": self.addr, "ha_addr": None, "data_version": version,
                "topic_configs": {t: cfg.to_route_dict() for t, cfg in topics.items()}}

    def _unregister_payload(self) -> dict[str, Any]:
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "broker_addr": self.addr}

    # ================================================================== info, health, metrics
    def info(self) -> dict[str, Any]:
        """What ``GET /broker`` answers."""
        commitlog: dict[str, int | None] = {"min_offset": None, "max_offset": None, "flushed_offset": None}
        with contextlib.suppress(SparkMQError):
            log_ = self.store.commit_log
            commitlog = {"min_offset": log_.min_offset, "max_offset": log_.max_offset,
                         "flushed_offset": log_.flushed_offset}
        return {"cluster": self.config.cluster, "broker_name": self.name, "broker_id": self.config.broker_id,
                "addr": self.addr, "role": str(self.config.role), "namesrv_addrs": list(self.config.namesrv_addrs),
                "commitlog": commitlog, "topics": len(self.topics), "clients": self.clients.client_count()}

    def health(self) -> dict[str, Any]:
        """``{"status": "ok"|"degraded", ...}`` with the state of each component."""
        store_ok = self.running
        if store_ok:
            try:
                self.store.commit_log  # noqa: B018  # raises SERVICE_NOT_AVAILABLE when the store is closed
            except SparkMQError:
                store_ok = False
        persist_error = self.offsets.last_persist_error
        namesrvs = {addr: s.to_dict() for addr, s in self.registration.status().items()}
        # Before the first registration round finishes a name server counts as healthy.
        registration_ok = all(s["ok"] or (s["registrations"] == 0 and s["failures"] == 0) for s in namesrvs.values())
        ok = store_ok and persist_error is None and registration_ok
        return {"status": "ok" if ok else "degraded", "state": self._state,
                "store": {"ok": store_ok, "clean_start": self.store.clean_start},
                "offsets": {"ok": persist_error is None, "pending": self.offsets.dirty_count(),
                            "last_error": None if persist_error is None else str(persist_error)},
                "namesrv": namesrvs, "held_pulls": self.holds.held()}

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition."""
        return self.metrics.render()

    def _scrape_commitlog_max(self) -> int:
        try:
            return self.store.commit_log.max_offset
        except SparkMQError:
            return 0

    def _scrape_queue_max(self) -> Iterator[tuple[str, int, int]]:
        try:
            log_ = self.store.commit_log
            refs = log_.queues()
        except SparkMQError:
            return
        for topic, queue_id in refs:
            cq = log_.consume_queue(topic, queue_id)
            if cq is not None and self.topics.get(topic) is not None:
                yield topic, queue_id, cq.max_offset

    def _scrape_group_lag(self) -> Iterator[tuple[str, str, int]]:
        if not self.running:
            return
        for group in self.offsets.groups():
            for topic in self.offsets.topics_of(group):
                with contextlib.suppress(SparkMQError):
                    yield group, topic, self.lag(group, topic)["total_lag"]

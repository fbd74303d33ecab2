"""Sends: single and batch, delay and timer parking, redelivery of due messages, send-back to retry or DLQ."""
from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ...common.errors import ErrorCode, SparkMQError
from ...common.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    SendResult,
    SendStatus,
    StoredMessage,
)
from ...common.perm import is_writeable
from ...common.protocol import MAX_MSG_ID_LENGTH
from ...common.sysflag import COMPRESSED
from ...common.system_topics import DELAY_PROPERTIES, PROPERTY_DELAY_LEVEL
from ...common.validation import MAX_RECONSUME_TIMES, check_int, validate_group, validate_topic
from ...store import AppendNote, FlushMode, MessageStore, PutResult, PutStatus
from ..client_manager import ClientManager, MessageModel
from ..config import BrokerConfig
from ..metrics import BrokerMetrics
from ..overload import OverloadGuard
from ..retry import DEFAULT_MAX_RECONSUME_TIMES, plan_send_back
from ..schedule import ScheduleService
from ..timer import TimerService
from ..topics import TopicConfig, TopicConfigManager
from ..trace import TraceRecorder
from .base import BrokerState, Processor, StartedServices, looks_like_zlib

if TYPE_CHECKING:
    from ...ha import ReplicationMaster
    from ...ha.dledger import DLedgerMember

__all__ = ["SendProcessor", "Replication", "OutgoingMessage", "BatchSendResult", "PackedSendResult"]

log = logging.getLogger("sparkmq.broker")

_HAS_SPACE = re.compile(r"\s")

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
    #: The producer's free-form flag (RocketMQ's ``Message.flag``), stored with the message.
    flag: int = 0


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


@dataclass(frozen=True, slots=True)
class PackedSendResult:
    """Where a packed batch was stored: consecutive queue offsets, each message's commit-log offset packed."""

    status: SendStatus
    topic: str
    broker_name: str
    queue_id: int
    first_queue_offset: int
    count: int
    store_timestamp: int
    store_host: str
    #: The log offset just past the batch (a SYNC_FLUSH waiter's target).
    end_offset: int
    #: ``count`` little-endian int64 commit-log offsets.
    offsets: bytes


class Replication(Protocol):
    """What a send waits for besides the disk (``Broker`` is one): read at each send, as both change with the role."""

    @property
    def dledger(self) -> DLedgerMember | None:
        """This broker's DLedger member (built at start), None outside a DLedger group."""
        ...

    @property
    def replication_master(self) -> ReplicationMaster | None:
        """The master side of master/slave replication, None on a slave and in a DLedger group."""
        ...


class SendProcessor(Processor):
    """Sends: single and batch, delay and timer parking, redelivery of due messages, send-back to retry or DLQ."""

    def __init__(self, state: BrokerState, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 clients: ClientManager, metrics: BrokerMetrics, tracer: TraceRecorder, overload: OverloadGuard,
                 replication: Replication, services: StartedServices) -> None:
        super().__init__(state)
        self.config = config
        self.store = store
        self.topics = topics
        self.clients = clients
        self.metrics = metrics
        self.tracer = tracer
        self.overload = overload
        self.replication = replication
        self.services = services
        #: The delay levels' delays (level n waits ``levels_ms[n - 1]`` ms).
        self.levels_ms = config.delay_levels_ms
        #: The round-robin position of each topic's queue choice (sends that name no queue or key).
        self._round_robin: dict[str, Iterator[int]] = {}

    @property
    def max_message_size(self) -> int:
        """The largest body a send may carry (the store's limit): what adapters check before decoding a batch."""
        return self.store.config.max_message_size

    def forget_topic(self, topic: str) -> None:
        """Drop what this processor keeps about a deleted topic."""
        self._round_robin.pop(topic, None)

    @property
    def send_may_block(self) -> bool:
        """Whether a send waits for a disk sync (SYNC_FLUSH), a slave (SYNC_MASTER) or a DLedger commit, so
        callers should run it off the event loop (or use the ``wait=False`` forms and :meth:`acknowledge`)."""
        return (self.store.config.flush_mode is FlushMode.SYNC_FLUSH or self._sync_master is not None
                or self.replication.dledger is not None)

    @property
    def _sync_master(self) -> ReplicationMaster | None:
        master = self.replication.replication_master
        return master if master is not None and master.sync else None

    async def acknowledge(self, end_offset: int, loop: asyncio.AbstractEventLoop) -> SendStatus:
        """The status of a send stored with ``wait=False`` once it may be acknowledged, on the event loop
        (no thread per waiter): after a SYNC_FLUSH sync covers ``end_offset`` (else FLUSH_DISK_TIMEOUT), and
        on a SYNC_MASTER after a slave holds it (else FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE); in a DLedger
        group once the group committed it (else FLUSH_SLAVE_TIMEOUT, or SERVICE_NOT_AVAILABLE raised when this
        member lost the leadership first)."""
        status = self.send_status(await self._durable(end_offset, loop))
        master = self._sync_master
        dledger = self.replication.dledger
        if status is SendStatus.SEND_OK and master is not None:
            status = await master.wait_replicated(end_offset, loop)
        elif status is SendStatus.SEND_OK and dledger is not None:
            status = _raise_error(await dledger.wait_committed(end_offset, loop))
        return status

    def acknowledgement(self, end_offset: int, loop: asyncio.AbstractEventLoop
                        ) -> tuple[asyncio.Future[Any], Callable[[asyncio.Future[Any]], SendStatus]] | None:
        """The one loop future a send stored with ``wait=False`` waits for, and how its done future reads as
        the send's status (raising SERVICE_NOT_AVAILABLE like :meth:`acknowledge`), so its done callback may
        answer without a task: the SYNC_FLUSH sync, or the DLedger commit of an ASYNC_FLUSH member.  None
        when the acknowledgement waits for more than one thing (a sync slave; DLedger under SYNC_FLUSH):
        await :meth:`acknowledge` then."""
        if self._sync_master is not None:
            return None
        dledger = self.replication.dledger
        if dledger is None:
            return self._durable(end_offset, loop), lambda synced: self.send_status(synced.result())
        if self.store.config.flush_mode is FlushMode.SYNC_FLUSH:
            return None
        return dledger.wait_committed(end_offset, loop), lambda committed: _raise_error(committed.result())

    def _durable(self, end_offset: int, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        """The store's future of ``end_offset``'s disk sync, counted among the broker's pending acknowledgements
        while it is not done (the overload guard refuses sends while they stall, platform/broker/overload.py)."""
        future = self.store.wait_durable(end_offset, loop)
        if not future.done():
            guard = self.overload
            guard.ack_waiting()
            future.add_done_callback(guard.ack_done)
        return future

    def send(self, topic: str, message: OutgoingMessage, *, queue_id: int | None = None,
             sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
             born_timestamp: int | None = None, born_host: str | None = None, delay_level: int | None = None,
             deliver_at_ms: int | None = None, delay_ms: int | None = None, reconsume_times: int = 0) -> SendResult:
        """Store one message; the topic is auto-created (after storing) when allowed.

        Under SYNC_FLUSH this waits for the disk sync (see :meth:`send_nowait` for an event loop).

        Queue choice: ``queue_id`` (a write queue), else a stable hash of ``sharding_key``
        over the write queues, else round-robin.

        Delay: ``delay_level`` (1..levels), ``deliver_at_ms`` or ``delay_ms`` (or the message
        properties ``DELAY``, ``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC``) park the message in
        the schedule or timer topic until due; the answer's queue id and offset are then
        those of the parked copy, its msg_id the message's own.
        """
        return self._send(topic, message, queue_id, sharding_key, compressed, producer_group, born_timestamp,
                          born_host, delay_level, deliver_at_ms, delay_ms, reconsume_times, wait=True)[0]

    def send_nowait(self, topic: str, message: OutgoingMessage, *, queue_id: int | None = None,
                    sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
                    born_timestamp: int | None = None, born_host: str | None = None, delay_level: int | None = None,
                    deliver_at_ms: int | None = None, delay_ms: int | None = None,
                    reconsume_times: int = 0) -> tuple[SendResult, int]:
        """:meth:`send` without waiting for a SYNC_FLUSH sync: (the result, the log offset to wait for).

        The caller waits with ``store.wait_durable(end_offset)`` (an event loop, no thread) and
        answers FLUSH_DISK_TIMEOUT itself when that says so.
        """
        return self._send(topic, message, queue_id, sharding_key, compressed, producer_group, born_timestamp,
                          born_host, delay_level, deliver_at_ms, delay_ms, reconsume_times, wait=False)

    def _send(self, topic: str, message: OutgoingMessage, queue_id: int | None, sharding_key: str | None,
              compressed: bool, producer_group: str | None, born_timestamp: int | None, born_host: str | None,
              delay_level: int | None, deliver_at_ms: int | None, delay_ms: int | None, reconsume_times: int, *,
              wait: bool) -> tuple[SendResult, int]:
        started = time.perf_counter()
        try:
            with self._operation():
                self.overload.check_send()
                cfg, qid = self.prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
                msg, sys_flag = self.to_message(topic, message, compressed)
                extra: dict[str, Any] = {}
                if reconsume_times:  # a consumer re-sending to its retry topic (RocketMQ's fallback of send-back)
                    extra["reconsume_times"] = check_int("reconsume_times", reconsume_times, 0, 2**31 - 1)
                result = self._put_or_park(msg, qid, self._delay_of(msg, delay_level, deliver_at_ms, delay_ms),
                                           born_host=born_host, born_timestamp=born_timestamp, sys_flag=sys_flag,
                                           note=AppendNote("send", topic), wait=wait, **extra)
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        if not wait or not self.send_may_block:  # the append alone (not a wait for its sync, nor a topic's creation)
            self.overload.stored(time.perf_counter() - started)
        self.ensure_topic(topic)
        # A parked message counts under its system topic now and under its own topic when delivered.
        self.metrics.sent(result.topic, 1, len(msg.body), time.perf_counter() - started)
        end = result.commitlog_offset + result.store_size
        return (SendResult(self.send_status(result.status, end if wait else None), result.msg_id,
                           result.offset_msg_id, topic, self.name,
                           result.queue_id, result.queue_offset, result.store_timestamp, result.commitlog_offset),
                end)

    @property
    def store_host(self) -> str:
        """The ``host:port`` the store stamps on every message it stores."""
        return self.store.store_host

    def send_packed(self, topic: str, data: bytes | memoryview, count: int, *, queue_id: int | None = None,
                    sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
                    born_host: str | None = None, wait: bool = True) -> PackedSendResult:
        """Store a packed batch (docs/remoting.md) in one queue: validated and appended by the native core.

        The remoting hot path: no Python object per message.  Delay properties are refused
        (a delayed batch goes through :meth:`send_batch`); one bad entry rejects the batch.
        ``wait=False`` answers before a SYNC_FLUSH sync covers the batch: the caller waits for
        ``result.end_offset`` to be durable itself (without a thread).
        """
        started = time.perf_counter()
        try:
            with self._operation():
                self.overload.check_send()
                cfg, qid = self.prepare_send(topic, queue_id, sharding_key, producer_group, None)
                stored = self.store.put_packed(topic, qid, data, count, born_host=born_host,
                                               sys_flag=COMPRESSED if compressed else 0,
                                               reserved_keys=DELAY_PROPERTIES, note=AppendNote("send", topic),
                                               wait=wait)
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        if not wait or not self.send_may_block:  # the append alone (not a wait for its sync, nor a topic's creation)
            self.overload.stored(time.perf_counter() - started)
        self.ensure_topic(topic)
        self.metrics.sent(topic, count, len(data), time.perf_counter() - started)
        return PackedSendResult(self.send_status(stored.status, stored.end_offset if wait else None), topic,
                                self.name, qid, stored.first_queue_offset,
                                count, stored.store_timestamp, self.store.store_host, stored.end_offset,
                                stored.offsets)

    def send_batch(self, topic: str, messages: Sequence[OutgoingMessage], *, queue_id: int | None = None,
                   sharding_key: str | None = None, compressed: bool = False, producer_group: str | None = None,
                   born_timestamp: int | None = None, born_host: str | None = None, delay_level: int | None = None,
                   deliver_at_ms: int | None = None, delay_ms: int | None = None) -> BatchSendResult:
        """Store many messages in one queue with consecutive offsets; one bad message rejects the batch.

        A delayed batch (a delay argument, or any message with a delay property) parks each
        message on its own: the results then give the parked copies' offsets.
        """
        started = time.perf_counter()
        try:
            with self._operation():
                if not isinstance(messages, Sequence) or not messages:
                    raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "the batch is empty")
                self.overload.check_send()
                cfg, qid = self.prepare_send(topic, queue_id, sharding_key, producer_group, born_timestamp)
                batch = []
                for i, message in enumerate(messages):
                    try:
                        batch.append(self.to_message(topic, message, compressed)[0])
                    except SparkMQError as exc:
                        raise SparkMQError(exc.code, f"message {i}: {exc.message}") from None
                delays = []
                for i, msg in enumerate(batch):
                    try:
                        delays.append(self._delay_of(msg, delay_level, deliver_at_ms, delay_ms))
                    except SparkMQError as exc:
                        raise SparkMQError(exc.code, f"message {i}: {exc.message}") from None
                # A producer compresses all bodies of a batch or none (one flag per request).
                sys_flag = COMPRESSED if compressed else 0
                if any(d is not None for d in delays):
                    results = [self._put_or_park(m, qid, d, born_host=born_host, born_timestamp=born_timestamp,
                                                 sys_flag=sys_flag, note=AppendNote("send", topic))
                               for m, d in zip(batch, delays, strict=True)]
                else:
                    results = self.store.put_batch(topic, qid, batch, born_host=born_host,
                                                   born_timestamp=born_timestamp, sys_flag=sys_flag,
                                                   note=AppendNote("send", topic))
        except SparkMQError as exc:
            self.metrics.send_failed(exc.code.name)
            raise
        self.ensure_topic(topic)
        self.metrics.sent(topic, len(batch), sum(len(m.body) for m in batch), time.perf_counter() - started)
        last = max(results, key=lambda r: r.commitlog_offset)
        return BatchSendResult(self.send_status(last.status, last.commitlog_offset + last.store_size), topic,
                               self.name, qid, results)

    # ================================================================== delay, timers, redelivery
    def _delay_of(self, msg: Message, delay_level: int | None, deliver_at_ms: int | None,
                  delay_ms: int | None) -> tuple[str, int] | None:
        """``("level", L)``, ``("timer", due_ms)`` or None (deliver now); strips the delay properties from ``msg``.

        INVALID_ARGUMENT for a level outside 1..levels, a negative delay, a time beyond
        ``timer_max_delay_s``, or two ways of delaying at once.  Validates before anything is stored.
        """
        props = msg.properties
        asked = {name: props.pop(name) for name in DELAY_PROPERTIES if name in props}
        given = [n for n, v in (("delay_level", delay_level), ("deliver_at_ms", deliver_at_ms),
                                ("delay_ms", delay_ms)) if v is not None] + list(asked)
        if len(given) > 1:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"delay the message one way only, got {given}")
        if not given:
            return None
        now = int(time.time() * 1000)
        if PROPERTY_DELAY_LEVEL in asked:
            try:
                delay_level = int(asked[PROPERTY_DELAY_LEVEL])
            except ValueError:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                                   f"property DELAY must be an integer level, got {asked[PROPERTY_DELAY_LEVEL]!r}"
                                   ) from None
        if delay_level is not None:
            check_int("delay_level", delay_level, 0, len(self.levels_ms))
            return ("level", delay_level) if delay_level > 0 else None  # RocketMQ: level 0 = no delay
        if asked:
            due = self._timers().due_time(asked, now)
            assert due is not None
        elif deliver_at_ms is not None:
            due = check_int("deliver_at_ms", deliver_at_ms, 0, 2**63 - 1)
        else:
            due = now + check_int("delay_ms", delay_ms, 0, 2**62)
        if due - now > self.config.timer_max_delay_s * 1000:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"the delivery time is {(due - now) / 1000:.0f} s ahead; the maximum is "
                               f"{self.config.timer_max_delay_s:.0f} s (timer_max_delay_s)")
        return ("timer", due) if due > now else None

    def _timers(self) -> TimerService:
        timers = self.services.timers
        if timers is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} runs no timer service")
        return timers

    def _schedule(self) -> ScheduleService:
        schedule = self.services.schedule
        if schedule is None:
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} runs no schedule service")
        return schedule

    def _put_or_park(self, msg: Message, qid: int, delay: tuple[str, int] | None, **put_args: Any) -> PutResult:
        if delay is None:
            return self.store.put(msg, qid, **put_args)
        kind, value = delay
        if kind == "level":
            result = self._schedule().park(msg, qid, value, **put_args)
        else:
            result = self._timers().park(msg, qid, value, **put_args)
        return result

    def redeliver(self, message: Message, queue_id: int, parked: StoredMessage) -> PutResult:
        """Put a due (or committed) message to its real topic through the normal put path.

        Long polling wakes, metrics count, and the real topic is created when allowed.
        """
        started = time.perf_counter()
        cfg = self.topics.get(message.topic) or self.topics.for_send(message.topic)
        if queue_id >= cfg.write_queue_nums:  # the topic shrank meanwhile: keep the message anyway
            queue_id %= cfg.write_queue_nums
        result = self.store.put(message, queue_id, born_host=parked.born_host or None,
                                born_timestamp=parked.born_timestamp, reconsume_times=parked.reconsume_times,
                                sys_flag=parked.sys_flag & COMPRESSED,
                                note=AppendNote("redeliver", detail=f"from {parked.topic}"))
        self.ensure_topic(message.topic)
        self.metrics.sent(message.topic, 1, len(message.body), time.perf_counter() - started)
        return result

    def put_trace(self, message: Message) -> PutResult:
        """Store one trace message (the recorder's thread): a direct put, so it is never traced itself."""
        return self.store.put(message, 0)

    def recall_timer(self, msg_id: str) -> bool:
        """Cancel a pending timer message by its msg_id; False when fired, recalled or unknown."""
        if not isinstance(msg_id, str) or not 0 < len(msg_id) <= MAX_MSG_ID_LENGTH:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"msg_id must be 1-{MAX_MSG_ID_LENGTH} characters")
        with self._operation():
            timers = self._timers()
            recalled = timers.recall(msg_id)
            if recalled:
                # Persist now, not at the next interval: a crash right after must not resurrect it.
                timers.persist()
            return recalled

    def prepare_send(self, topic: str, queue_id: int | None, sharding_key: str | None,
                      producer_group: str | None, born_timestamp: int | None) -> tuple[TopicConfig, int]:
        validate_topic(topic)
        if not self.broker_state.is_master:
            dledger = self.replication.dledger
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, dledger.refusal() if dledger is not None
                               else f"broker {self.name} is a slave; send to its master")
        if producer_group is not None:
            validate_group(producer_group)
        if born_timestamp is not None:
            check_int("born_timestamp", born_timestamp, 0, 2**63 - 1)
        cfg = self.topics.for_send(topic)
        if not is_writeable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not writeable on {self.name} "
                                                        f"(perm {cfg.perm})")
        return cfg, self.select_queue(cfg, queue_id, sharding_key)

    def select_queue(self, cfg: TopicConfig, queue_id: int | None, sharding_key: str | None) -> int:
        writes = cfg.write_queue_nums
        if queue_id is not None:
            return check_int("queue_id", queue_id, 0, writes - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        if sharding_key is not None:
            if not isinstance(sharding_key, str) or not sharding_key:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "sharding_key must be a non-empty string")
            # crc32 is stable across processes and versions (Python's hash() is salted per process).
            return zlib.crc32(sharding_key.encode("utf-8")) % writes
        counter = self._round_robin.get(cfg.topic)
        if counter is None:
            counter = self._round_robin.setdefault(cfg.topic, itertools.count())
        return next(counter) % writes

    def to_message(self, topic: str, message: OutgoingMessage, compressed: bool) -> tuple[Message, int]:
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
            if not isinstance(msg_id, str) or not 0 < len(msg_id) <= MAX_MSG_ID_LENGTH or not msg_id.isprintable() \
                    or _HAS_SPACE.search(msg_id):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL,
                                   f"msg_id must be 1-{MAX_MSG_ID_LENGTH} printable characters without spaces")
            props[PROPERTY_UNIQUE_ID] = msg_id
        sys_flag = 0
        if compressed:
            if not isinstance(message.body, bytes | bytearray) or not looks_like_zlib(bytes(message.body)):
                raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, "compressed is set but the body is not zlib data")
            sys_flag |= COMPRESSED
        flag = message.flag
        if flag:
            check_int("flag", flag, -(2**31), 2**31 - 1, ErrorCode.MESSAGE_ILLEGAL)
        return Message(topic, message.body, tags, keys, props, flag), sys_flag

    def ensure_topic(self, topic: str) -> None:
        """Auto-create ``topic`` after a message was stored to it, when it does not exist yet."""
        if self.topics.get(topic) is None:
            try:
                self.topics.auto_create_topic(topic)
            except SparkMQError:  # the message is stored; the next send creates the topic again
                log.exception("auto-creating topic %s failed", topic)

    def send_status(self, status: PutStatus, end_offset: int | None = None) -> SendStatus:
        """A stored send's status: FLUSH_DISK_TIMEOUT when its sync timed out; with ``end_offset`` (a send
        that waits) on a SYNC_MASTER, what the slaves say (blocks up to the flush-slave timeout)."""
        if status is PutStatus.FLUSH_DISK_TIMEOUT:
            return SendStatus.FLUSH_DISK_TIMEOUT
        master = self._sync_master
        if master is not None and end_offset is not None:
            return master.await_replicated(end_offset)
        dledger = self.replication.dledger
        if dledger is not None and end_offset is not None:
            return _raise_error(dledger.await_committed(end_offset))
        return SendStatus.SEND_OK

    def send_back(self, group: str, offset_msg_id: str | None, *, delay_level: int = 0, reason: str = "",
                  max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                  commitlog_offset: int | None = None) -> dict[str, Any]:
        """A consumer of ``group`` failed on a message: retry it through ``%RETRY%<group>`` or dead-letter it.

        The message is named by its ``offset_msg_id``, or by its ``commitlog_offset`` here (RocketMQ's
        CONSUMER_SEND_MSG_BACK names it so).

        ``delay_level`` 0 = level 3 + reconsume count, > 0 = that level, -1 = straight to the
        DLQ.  After ``max_reconsume_times`` retries the message goes to ``%DLQ%<group>`` (one
        queue, perm 6, created on the first dead letter).  Broadcasting groups do not retry
        (INVALID_ARGUMENT).
        """
        validate_group(group)
        check_int("delay_level", delay_level, -1, 2**31 - 1)
        check_int("max_reconsume_times", max_reconsume_times, 0, MAX_RECONSUME_TIMES)
        if not isinstance(reason, str):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "reason must be a string")
        if self.clients.group_info(group).message_model is MessageModel.BROADCASTING \
                and self.clients.members(group):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"group {group!r} consumes by broadcasting; broadcasting consumers do not retry")
        with self._operation():
            if offset_msg_id is not None:
                stored = self.store.read_by_offset_msg_id(offset_msg_id)
            elif commitlog_offset is not None:
                stored = self.store.read_message(commitlog_offset)
            else:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "name the message by offset_msg_id or commitlog_offset")
            plan = plan_send_back(stored, group, reason=reason, delay_level=delay_level,
                                  max_reconsume_times=max_reconsume_times, level_count=len(self.levels_ms))
            put_args: dict[str, Any] = {"born_timestamp": stored.born_timestamp,
                                        "born_host": stored.born_host or None,
                                        "reconsume_times": plan.reconsume_times,
                                        "sys_flag": stored.sys_flag & COMPRESSED}
            topic = plan.message.topic
            if plan.dead_letter:
                self.topics.ensure_system_topic(topic, 1)
                result = self.store.put(plan.message, 0, **put_args)
            else:
                self.topics.ensure_system_topic(topic, 1)
                assert plan.delay_level is not None
                result = self._schedule().park(plan.message, plan.queue_id, plan.delay_level, **put_args)
        delay_ms = None if plan.dead_letter else self.levels_ms[plan.delay_level - 1]  # type: ignore[operator]
        self.tracer.sent_back(stored, group, dead_letter=plan.dead_letter, destination=topic,
                              result=result, reconsume_times=plan.reconsume_times,
                              delay_ms=delay_ms, reason=reason)
        return {"status": "DLQ" if plan.dead_letter else "RETRY", "topic": topic,
                "delay_level": plan.delay_level or 0, "reconsume_times": plan.reconsume_times,
                "msg_id": result.msg_id, "offset_msg_id": result.offset_msg_id}


def _raise_error(outcome: SendStatus | SparkMQError) -> SendStatus:
    """A DLedger wait's outcome as a status, or raised when it is an error."""
    if isinstance(outcome, SparkMQError):
        raise outcome
    return outcome

"""POP consumption (RocketMQ 5's server-side consumption): receive, ack, change invisible time, dead-letter, lag.

The broker, not the client, decides what a consumer of a group gets: a receive hands out
messages of the group's queues and makes each *invisible* to the group's other receives for
``invisible_ms``.  An ack settles it; a message not acked in time is delivered again (from its
own queue offset: no copy is made) with ``delivery_attempt`` + 1 and a new receipt handle, and
after ``max_attempts`` deliveries it goes to ``%DLQ%<group>`` through the broker's send-back
path instead.  FIFO (``request.fifo``, or a topic configured ``order``) hands out at most one
unsettled message per queue, in queue order.

Every change is first written as a record of the revive topic (:mod:`..pop_state`), then
applied; a start replays the records after the last snapshot, so a kill -9 loses nothing acked
and nothing in flight.  The group's consumed frontier per queue is committed as its consumer
offset (``sparkmq admin`` lag, ``/metrics``).  A group new to a queue starts at the queue's
committed offset, else its first retained message.

Threads: receives run their store work in a worker thread and wait on the loop; a reviver thread
dead-letters deliveries past their last attempt, wakes held receives when an invisible time
ends, and writes the snapshot.  One lock serialises every state change with its record.
"""
from __future__ import annotations

import heapq
import logging
import random
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import anyio.to_thread
import msgspec

from ...common.errors import ErrorCode, SparkMQError
from ...common.filtering import SqlFilter
from ...common.message import Message, StoredMessage
from ...common.perm import is_readable
from ...common.protocol import (
    MAX_POP_BATCH,
    POP_DEFAULT_MAX_ATTEMPTS,
    POP_MAX_INVISIBLE_MS,
    POP_MAX_LONG_POLL_MS,
    PopLag,
    PoppedMessage,
    PopQueueLag,
    PopRequest,
    PullStatus,
)
from ...common.trace import TraceEvent
from ...common.validation import check, check_int, validate_group
from ...common.waiters import WaiterRegistry
from ...store import AppendEvent, FlushMode, MessageStore
from ..background import PeriodicService
from ..config import BrokerConfig
from ..metrics import BrokerMetrics
from ..offsets import ConsumerOffsetManager
from ..pop_state import (
    REVIVE_TOPIC,
    Key,
    Lease,
    LeaseRecord,
    PopState,
    QueueState,
    Record,
    ResetRecord,
    SettleRecord,
    decode_handle,
    decode_record,
    encode_handle,
    encode_record,
)
from ..topics import TopicConfig, TopicConfigManager
from ..trace import TraceRecorder
from .base import BrokerState, Processor
from .pull import PullProcessor
from .send import SendProcessor

__all__ = ["PopProcessor"]

log = logging.getLogger("sparkmq.broker.pop")

#: Most receipt handles one ack_batch call may settle.
_MAX_ACK_BATCH = 1024
#: Most attempts a request may allow before dead-lettering.
_MAX_ATTEMPTS_LIMIT = 1000
#: The reviver looks at due invisible times at least this often (s); it is woken earlier when a
#: delivery's invisible time ends sooner.
_REVIVE_IDLE_S = 1.0
#: The snapshot is rewritten this often when something changed (s).
_SNAPSHOT_INTERVAL_S = 1.0
#: Revive records replayed per store read at start.
_REPLAY_BATCH = 1024
#: A dead letter that failed (store full, stopping) is tried again after this long (ms).
_DLQ_RETRY_MS = 1000
#: Store errors that mean a message is gone (retention): its delivery is settled.
_GONE = (ErrorCode.OFFSET_ILLEGAL, ErrorCode.MESSAGE_NOT_FOUND)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class _Plan:
    """A validated receive."""

    group: str
    topic: str
    queues: tuple[int, ...]
    max_messages: int
    invisible_ms: int
    fifo: bool
    tags: frozenset[str] | None
    sql: SqlFilter | None
    client_id: str | None
    max_attempts: int


@dataclass
class _Counts:
    received: int = 0
    redelivered: int = 0
    acked: int = 0
    renewed: int = 0
    dead_lettered: int = 0


class _Reviver(PeriodicService):
    """Ends invisible times (dead-letters past the last attempt, wakes receives) and writes the snapshot."""

    thread_name = "sparkmq-pop-revive"

    def __init__(self, pop: PopProcessor) -> None:
        super().__init__(_SNAPSHOT_INTERVAL_S, _REVIVE_IDLE_S)
        self._pop = pop

    def tick(self) -> int:
        return self._pop.revive()

    def persist(self) -> None:
        self._pop.persist_snapshot()


class PopProcessor(Processor):
    """POP consumption for consumer groups (RocketMQ's Pop/Ack/ChangeInvisibleTime processors and revive service).

    Example::

        popped = await broker.pop_processor.receive(PopRequest("g1", "Orders", invisible_ms=30_000))
        for p in popped:
            handle(p.message.body)
            broker.pop_processor.ack("g1", "Orders", p.receipt_handle)
    """

    def __init__(self, state: BrokerState, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 offsets: ConsumerOffsetManager, metrics: BrokerMetrics, tracer: TraceRecorder,
                 puller: PullProcessor, sender: SendProcessor) -> None:
        super().__init__(state)
        self.config = config
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.tracer = tracer
        #: Receives read as pulls do (filters, the store); a delivery past its last attempt is sent back to the DLQ.
        self.puller = puller
        self.sender = sender
        self._lock = threading.RLock()
        # Delivery tokens: a fast generator seeded from the OS (one os.urandom per token costs ~10 us).
        self._random = random.Random(secrets.randbits(128))
        self._state = PopState(config.progress_path("pop_state"))
        #: Held receives by topic, woken by appends, ended invisible times and settled FIFO messages.
        self._arrivals: WaiterRegistry[str] = WaiterRegistry()
        #: (invisible_until, key, offset, token) of every delivery; stale entries are skipped when due.
        self._due: list[tuple[int, Key, int, int]] = []
        self._next_due = 2**63
        self._reviver: _Reviver | None = None
        self._active = False
        self._dirty = False
        self._rotation: dict[tuple[str, str], int] = {}
        self._counts: dict[tuple[str, str], _Counts] = {}
        store.add_append_listener(self._on_append)
        metrics.add_component_gauges("pop", self._gauges)

    # ================================================================== lifecycle
    def start(self) -> None:
        """Rebuild the state (snapshot + revive records after it) and start the reviver; a no-op off a master."""
        if not self.broker_state.is_master:
            return  # a slave's log carries its master's records; it serves no POP
        self.topics.ensure_system_topic(REVIVE_TOPIC, 1)
        with self._lock:
            replayed = self._replay(self._state.load_snapshot())
            now = _now_ms()
            for key, state in self._state.queues.items():
                for lease in state.leases.values():
                    heapq.heappush(self._due, (lease.invisible_until, key, lease.offset, lease.token))
                self._commit(key, state)
            in_flight = sum(len(s.leases) for s in self._state.queues.values())
        log.info("POP state rebuilt: %d queues, %d in flight, %d revive records replayed (%d ms)",
                 len(self._state.queues), in_flight, replayed, _now_ms() - now)
        self._active = True
        self._reviver = _Reviver(self)
        self._reviver.start()

    def release_waiters(self) -> None:
        """Release every held receive and hold no more (the broker is shutting down)."""
        self._active = False
        self._arrivals.close()

    def stop(self) -> None:
        """Stop the reviver and write the snapshot (before the store closes)."""
        self._active = False
        self._arrivals.close()
        if self._reviver is not None:
            self._reviver.stop()
            self._reviver = None

    def _replay(self, start: int | None) -> int:
        low = self.store.min_offset(REVIVE_TOPIC, 0)
        end = self.store.max_offset(REVIVE_TOPIC, 0)
        if start is not None and start < low:
            log.warning("POP revive records %d..%d were removed by retention before a snapshot covered them",
                        start, low)
        offset = max(start or 0, low)
        replayed = 0
        while offset < end:
            got = self.store.get_messages(REVIVE_TOPIC, 0, offset, _REPLAY_BATCH)
            for stored in got.messages:
                try:
                    self._state.apply(decode_record(stored.body))
                    replayed += 1
                except SparkMQError as exc:  # one bad record must not lose the others
                    log.error("POP revive record at %d skipped: %s", stored.queue_offset, exc)
            if got.next_offset <= offset:
                break
            offset = got.next_offset
        return replayed

    # ================================================================== receive
    async def receive(self, request: PopRequest) -> list[PoppedMessage]:
        """Hand out up to ``request.max_messages`` messages of the group's queues, invisible for ``invisible_ms``.

        Expired deliveries (their invisible time passed unacked) come first, with
        ``delivery_attempt`` + 1; then messages never delivered, matching the filter (those
        that do not match are settled as RocketMQ does).  While nothing is deliverable the
        call is held up to ``long_poll_ms``, woken by a new message, an ended invisible time
        or (FIFO) a settled one; ``[]`` when nothing came.  Store work runs in a worker thread.

        Errors (nothing changed): GROUP_ILLEGAL, TOPIC_NOT_EXIST, NO_PERMISSION (not readable),
        INVALID_ARGUMENT (max_messages 1..32, long_poll_ms 0..60000, max_attempts 1..1000),
        INVISIBLE_TIME_ILLEGAL (``pop_min_invisible_ms``..12 h), QUEUE_ID_ILLEGAL,
        FILTER_EXPRESSION_ILLEGAL, SERVICE_NOT_AVAILABLE (stopping, or not a master).
        """
        plan = self._plan(request)
        deadline = time.monotonic() + request.long_poll_ms / 1000.0
        while True:
            popped = (await anyio.to_thread.run_sync(self._receive_once, plan) if self.may_block
                      else self._receive_once(plan))
            remaining = deadline - time.monotonic()
            if popped or remaining <= 0 or not self._active:
                return popped
            await self._arrivals.wait(plan.topic, remaining,
                                      lambda: not self._active or self._deliverable(plan))

    def _plan(self, request: PopRequest) -> _Plan:
        if not isinstance(request, PopRequest):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"expected a PopRequest, got {type(request).__name__}")
        self._require_serving()
        cfg = self._topic(request.group, request.topic)
        check_int("max_messages", request.max_messages, 1, MAX_POP_BATCH)
        self._check_invisible(request.invisible_ms)
        check_int("long_poll_ms", request.long_poll_ms, 0, POP_MAX_LONG_POLL_MS)
        if request.queue_id is None:
            queues = tuple(range(cfg.read_queue_nums))
        else:
            queues = (check_int("queue_id", request.queue_id, 0, cfg.read_queue_nums - 1,
                                ErrorCode.QUEUE_ID_ILLEGAL),)
        max_attempts = POP_DEFAULT_MAX_ATTEMPTS if request.max_attempts is None else request.max_attempts
        check_int("max_attempts", max_attempts, 1, _MAX_ATTEMPTS_LIMIT)
        check("fifo", request.fifo, bool)
        if request.client_id is not None and (not isinstance(request.client_id, str) or len(request.client_id) > 255):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "client_id must be a string of at most 255 characters")
        tags, sql = self.puller.pull_filter(str(request.filter_type), None, request.expression)
        return _Plan(request.group, request.topic, queues, request.max_messages, request.invisible_ms,
                     request.fifo or cfg.order, tags, sql, request.client_id, max_attempts)

    def _receive_once(self, plan: _Plan) -> list[PoppedMessage]:
        """One pass over the plan's queues (rotating the first one, so no queue starves); no waiting."""
        popped: list[PoppedMessage] = []
        end = 0
        with self._operation(), self._lock:
            now = _now_ms()
            first = self._rotation.get((plan.group, plan.topic), 0)
            self._rotation[(plan.group, plan.topic)] = first + 1
            n = len(plan.queues)
            for i in range(n):
                room = plan.max_messages - len(popped)
                if room <= 0:
                    break
                end = max(end, self._pop_queue(plan, plan.queues[(first + i) % n], now, room, popped))
        self._durable(end)
        if popped:
            counts = self._count(plan.group, plan.topic)
            redelivered = [p.message for p in popped if p.delivery_attempt > 1]
            counts.received += len(popped)
            counts.redelivered += len(redelivered)
            # First deliveries were traced as queue ranges by _pop_queue; redeliveries one by one here.
            self.tracer.delivered(plan.topic, plan.group, plan.client_id, redelivered)
        return popped

    def _pop_queue(self, plan: _Plan, queue_id: int, now: int, room: int, out: list[PoppedMessage]) -> int:
        """Deliver from one queue into ``out``; the log end offset to wait for (0: nothing written)."""
        key = (plan.group, plan.topic, queue_id)
        state = self._state.get(key)
        cursor = state.cursor if state is not None else self._initial_cursor(key)
        leases = state.leases if state is not None else {}
        written = 0
        reset_to = self.offsets.settle_reset(plan.group, plan.topic, queue_id, cursor)
        if reset_to is not None:
            # An admin reset this group's offset: start over there, forgetting what was in flight.
            written = self._write(ResetRecord(plan.group, plan.topic, queue_id, reset_to))
            state = self._state.queues[key]
            self._commit(key, state)
            cursor, leases = state.cursor, state.leases
            self.offsets.settle_reset(plan.group, plan.topic, queue_id, cursor)  # taken up: the fence drops
        if plan.fifo:
            if any(lease.invisible_until > now or lease.attempt >= lease.max_attempts for lease in leases.values()):
                return written  # an earlier message is in flight, or waits for the DLQ: nothing more of this queue
            room = 1
        expired = sorted(o for o, lease in leases.items()
                         if lease.invisible_until <= now and lease.attempt < lease.max_attempts)
        new_leases: list[Lease] = []
        messages: list[StoredMessage] = []
        gone: list[int] = []
        for offset in expired[:room]:
            try:
                message = self.store.read_queue_message(plan.topic, queue_id, offset)
            except SparkMQError as exc:
                if exc.code not in _GONE:
                    raise
                gone.append(offset)  # removed by retention: nothing left to deliver
                continue
            old = leases[offset]
            new_leases.append(Lease(offset, old.attempt + 1, self._token(), now + plan.invisible_ms,
                                    old.max_attempts, old.msg_id))
            messages.append(message)
        end_offset = cursor
        room -= len(messages)
        if room > 0 and not (plan.fifo and leases):
            # No group here: the pull would trace one event per message; a range record is traced below.
            result = self.puller.pull_once(plan.topic, queue_id, cursor, room, plan.tags, sql=plan.sql)
            if result.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG, PullStatus.OFFSET_TOO_SMALL):
                end_offset = max(cursor, result.next_offset)
            for message in result.messages:
                new_leases.append(Lease(message.queue_offset, 1, self._token(), now + plan.invisible_ms,
                                        plan.max_attempts, message.msg_id))
                messages.append(message)
            if result.messages:
                if plan.sql is None:
                    self.tracer.delivered_range(plan.topic, plan.group, plan.client_id, queue_id, cursor,
                                                end_offset, len(result.messages), plan.tags)
                else:
                    self.tracer.delivered(plan.topic, plan.group, plan.client_id, result.messages)
        if gone:
            written = self._write(SettleRecord(plan.group, plan.topic, queue_id, gone))
        if new_leases or end_offset != cursor:
            written = self._write(LeaseRecord(plan.group, plan.topic, queue_id, cursor, end_offset, new_leases))
        if written:
            self._commit(key, self._state.queues[key])
        for message, lease in zip(messages, new_leases, strict=True):
            out.append(PoppedMessage(message, encode_handle(plan.group, plan.topic, queue_id, lease), lease.attempt,
                                     lease.invisible_until))
        return written

    def _initial_cursor(self, key: Key) -> int:
        """Where a group new to a queue starts: its committed offset, else the queue's first retained message."""
        group, topic, queue_id = key
        committed = self.offsets.query(group, topic, queue_id)
        low = self.store.min_offset(topic, queue_id)
        return low if committed is None else max(committed, low)

    def _deliverable(self, plan: _Plan) -> bool:
        """Whether a receive of ``plan`` would find something now (a held receive's wake-up check)."""
        now = _now_ms()
        with self._lock:
            for queue_id in plan.queues:
                key = (plan.group, plan.topic, queue_id)
                state = self._state.get(key)
                cursor = state.cursor if state is not None else self._initial_cursor(key)
                leases = state.leases.values() if state is not None else ()
                if plan.fifo and any(lease.invisible_until > now or lease.attempt >= lease.max_attempts
                                     for lease in leases):
                    continue
                if any(lease.invisible_until <= now and lease.attempt < lease.max_attempts for lease in leases):
                    return True
                if self.store.max_offset(plan.topic, queue_id) > cursor:
                    return True
        return False

    # ================================================================== ack, renew, dead-letter
    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        """Settle the delivery ``receipt_handle`` names: the message is not delivered to ``group`` again.

        INVALID_RECEIPT_HANDLE (nothing changed) for a malformed handle, one of another group
        or topic, a stale one (acked, redelivered or renewed since) or one past its invisible
        time.  Waits for the disk under SYNC_FLUSH: call it off the event loop there.
        """
        outcome = self.ack_batch(group, topic, [receipt_handle])[0]
        if outcome is not None:
            raise outcome

    def ack_batch(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[SparkMQError | None]:
        """:meth:`ack` for many handles with one record per queue; per handle None (acked) or its error.

        Errors of the call itself (a bad group or topic, the broker stopping) are raised.
        """
        self._topic(group, topic)
        if isinstance(receipt_handles, str | bytes) or not isinstance(receipt_handles, Sequence):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "receipt_handles must be a list of handles")
        if len(receipt_handles) > _MAX_ACK_BATCH:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"at most {_MAX_ACK_BATCH} receipt handles per call")
        outcomes: list[SparkMQError | None] = []
        settled: dict[int, dict[int, Lease]] = {}
        end = 0
        with self._operation(), self._lock:
            now = _now_ms()
            for raw in receipt_handles:
                try:
                    queue_id, lease = self._lease_of(group, topic, raw, now)
                    if lease.offset in settled.get(queue_id, {}):
                        raise SparkMQError(ErrorCode.INVALID_RECEIPT_HANDLE, "the handle was acked twice in one call")
                except SparkMQError as exc:
                    outcomes.append(exc)
                    continue
                settled.setdefault(queue_id, {})[lease.offset] = lease
                outcomes.append(None)
            for queue_id, leases in settled.items():
                end = max(end, self._write(SettleRecord(group, topic, queue_id, list(leases))))
                self._commit((group, topic, queue_id), self._state.queues[(group, topic, queue_id)])
        self._durable(end)
        if settled:
            self._arrivals.notify(topic)  # a FIFO queue may deliver its next message now
            self._count(group, topic).acked += sum(len(v) for v in settled.values())
            self._trace_settled(group, topic, settled, "ACK", "POP ack")
        return outcomes

    def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Make the delivery invisible for ``invisible_ms`` from now; returns its new handle (the old one dies).

        The delivery attempt stays.  INVALID_RECEIPT_HANDLE as :meth:`ack`; INVISIBLE_TIME_ILLEGAL
        outside ``pop_min_invisible_ms``..12 h.
        """
        self._topic(group, topic)
        self._check_invisible(invisible_ms)
        with self._operation(), self._lock:
            now = _now_ms()
            queue_id, old = self._lease_of(group, topic, receipt_handle, now)
            lease = self._relet(old, now + invisible_ms)
            cursor = self._state.queues[(group, topic, queue_id)].cursor
            end = self._write(LeaseRecord(group, topic, queue_id, cursor, cursor, [lease]))
        self._durable(end)
        self._count(group, topic).renewed += 1
        return encode_handle(group, topic, queue_id, lease)

    def release(self, group: str, topic: str, receipt_handles: Sequence[str], delay_ms: int) -> int:
        """Make deliveries their consumer never got visible again ``delay_ms`` from now, not at the end of
        their invisible time; how many were released.

        For a receive whose answer could not be written (the client cancelled it or gave up), as RocketMQ's
        proxy nacks those messages.  The attempt stays; handles no longer current (acked, renewed, expired)
        are skipped.
        """
        self._topic(group, topic)
        released: dict[int, list[Lease]] = {}
        end = 0
        with self._operation(), self._lock:
            now = _now_ms()
            for raw in receipt_handles:
                try:
                    queue_id, old = self._lease_of(group, topic, raw, now)
                except SparkMQError:
                    continue
                released.setdefault(queue_id, []).append(self._relet(old, now + delay_ms))
            for queue_id, leases in released.items():
                cursor = self._state.queues[(group, topic, queue_id)].cursor
                end = max(end, self._write(LeaseRecord(group, topic, queue_id, cursor, cursor, leases)))
        self._durable(end)
        return sum(len(leases) for leases in released.values())

    def forward_to_dlq(self, group: str, topic: str, receipt_handle: str) -> None:
        """Send the delivery's message to ``%DLQ%<group>`` now (the send-back path) and settle it.

        INVALID_RECEIPT_HANDLE as :meth:`ack`.
        """
        self._topic(group, topic)
        with self._operation(), self._lock:
            queue_id, lease = self._lease_of(group, topic, receipt_handle, _now_ms())
            end = self._dead_letter(group, topic, queue_id, [lease], "forwarded to the DLQ by the consumer")
        self._durable(end)

    def _lease_of(self, group: str, topic: str, raw: object, now: int) -> tuple[int, Lease]:
        """The queue and delivery a handle names, if it is the current one and still invisible."""
        handle = decode_handle(group, topic, raw)
        state = self._state.get((group, topic, handle.queue_id))
        lease = state.leases.get(handle.offset) if state is not None else None
        if lease is None or lease.token != handle.token:
            raise SparkMQError(ErrorCode.INVALID_RECEIPT_HANDLE,
                               f"stale receipt handle (queue {handle.queue_id}, offset {handle.offset}, attempt "
                               f"{handle.attempt}): acked, redelivered or renewed since")
        if lease.invisible_until <= now:
            raise SparkMQError(ErrorCode.INVALID_RECEIPT_HANDLE,
                               f"the receipt handle expired {now - lease.invisible_until} ms ago; the message is "
                               "delivered again")
        return handle.queue_id, lease

    def _dead_letter(self, group: str, topic: str, queue_id: int, leases: list[Lease], reason: str) -> int:
        """Send the leased messages to the group's DLQ (send_back traces ``dlq``) and settle them (lock held)."""
        settled: dict[int, Lease] = {}
        for lease in leases:
            try:
                message = self.store.read_queue_message(topic, queue_id, lease.offset)
            except SparkMQError as exc:
                if exc.code not in _GONE:
                    raise
                settled[lease.offset] = lease  # removed by retention: nothing left to dead-letter
                continue
            self.sender.send_back(group, message.offset_msg_id, delay_level=-1,
                                  reason=f"POP: {reason} (attempt {lease.attempt})")
            settled[lease.offset] = lease
        end = self._write(SettleRecord(group, topic, queue_id, list(settled)))
        self._commit((group, topic, queue_id), self._state.queues[(group, topic, queue_id)])
        self._count(group, topic).dead_lettered += len(settled)
        self._arrivals.notify(topic)
        return end

    # ================================================================== the reviver's work
    def revive(self) -> int:
        """End due invisible times: dead-letter deliveries past their last attempt, wake receives for the others.

        Returns ms until the next invisible time ends (-1: none in flight).  Called by the reviver thread.
        """
        if not self._active:
            return -1
        now = _now_ms()
        woken: set[str] = set()
        end = 0
        with self._lock:
            last: dict[Key, list[Lease]] = {}
            while self._due and self._due[0][0] <= now:
                _, key, offset, token = heapq.heappop(self._due)
                state = self._state.get(key)
                lease = state.leases.get(offset) if state is not None else None
                if lease is None or lease.token != token:
                    continue  # settled or delivered again since
                if lease.attempt >= lease.max_attempts:
                    last.setdefault(key, []).append(lease)
                else:
                    woken.add(key[1])
            for (group, topic, queue_id), leases in last.items():
                try:
                    end = max(end, self._dead_letter(group, topic, queue_id, leases,
                                                     "exceeded the max delivery attempts"))
                except SparkMQError as exc:
                    log.warning("POP: dead-lettering %d message(s) of %s on %s failed, retrying: %s", len(leases),
                                group, topic, exc)
                    for lease in leases:
                        heapq.heappush(self._due, (now + _DLQ_RETRY_MS, (group, topic, queue_id), lease.offset,
                                                   lease.token))
            self._next_due = self._due[0][0] if self._due else 2**63
            wait = -1 if not self._due else max(1, self._next_due - now)
        self._durable(end)
        for topic in woken:
            self._arrivals.notify(topic)
        return wait

    def persist_snapshot(self) -> None:
        """Write the state snapshot when something changed since the last one (the reviver, and at stop)."""
        with self._lock:
            if not self._dirty:
                return
            data = self._state.snapshot_bytes(self.store.max_offset(REVIVE_TOPIC, 0))
            self._dirty = False
        self._state.write_snapshot(data)

    # ================================================================== lag
    def topics_of(self, group: str) -> set[str]:
        """Topics ``group`` has POP-consumed here (its lag is :meth:`lag`, not the pull offsets')."""
        with self._lock:
            return {topic for (g, topic, _q) in self._state.queues if g == group}

    def lag(self, group: str, topic: str) -> PopLag:
        """Per read queue and in total: deliveries in flight (unsettled) and messages not yet received.

        Messages the group's filter would skip count as not received until a receive passes them.
        """
        cfg = self._topic(group, topic)
        queues = []
        with self._lock:
            for queue_id in range(cfg.read_queue_nums):
                key = (group, topic, queue_id)
                state = self._state.get(key)
                top = self.store.max_offset(topic, queue_id)
                if state is None:
                    start = self._initial_cursor(key)
                    queues.append(PopQueueLag(queue_id, top, start, 0, max(0, top - start)))
                else:
                    queues.append(PopQueueLag(queue_id, top, state.frontier, len(state.leases),
                                              max(0, top - state.cursor)))
        return PopLag(group, topic, queues)

    # ================================================================== helpers
    @property
    def may_block(self) -> bool:
        """Whether receive and settle calls wait for the disk (SYNC_FLUSH), so callers on an event loop should
        run them in a worker thread; otherwise they only take short locks and run inline (a thread hop costs
        more than a whole batch's bookkeeping)."""
        return self.store.config.flush_mode is FlushMode.SYNC_FLUSH

    def _require_serving(self) -> None:
        if not self._active or not self.running:
            why = "it is not a master" if self.running and not self.broker_state.is_master else "it is not running"
            raise SparkMQError(ErrorCode.SERVICE_NOT_AVAILABLE, f"broker {self.name} serves no POP: {why}")

    def _topic(self, group: str, topic: str) -> TopicConfig:
        validate_group(group)
        cfg: TopicConfig = self.topics.require(topic)
        if not is_readable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not readable on {self.name} "
                                                        f"(perm {cfg.perm})")
        return cfg

    def _check_invisible(self, invisible_ms: object) -> int:
        return check_int("invisible_ms", invisible_ms, self.config.pop_min_invisible_ms, POP_MAX_INVISIBLE_MS,
                         ErrorCode.INVISIBLE_TIME_ILLEGAL)

    def _write(self, record: Record) -> int:
        """Append ``record`` to the revive topic, then apply it (lock held); the log offset to wait for."""
        put = self.store.put(Message(REVIVE_TOPIC, encode_record(record)), 0, wait=False)
        self._state.apply(record)
        self._dirty = True
        if isinstance(record, LeaseRecord):
            key = (record.group, record.topic, record.queue_id)
            for lease in record.leases:
                heapq.heappush(self._due, (lease.invisible_until, key, lease.offset, lease.token))
                if lease.invisible_until < self._next_due:
                    self._next_due = lease.invisible_until
                    if self._reviver is not None:
                        self._reviver.wake()
        return put.commitlog_offset + put.store_size

    def _durable(self, end: int) -> None:
        """Under SYNC_FLUSH, wait until the records up to ``end`` are on disk (outside the lock)."""
        if end:
            status = self.store.await_durable(end)
            if status.name != "PUT_OK":
                log.warning("POP record not flushed in time (%s); it is stored all the same", status)

    def _commit(self, key: Key, state: QueueState) -> None:
        """Commit the queue's consumed frontier as the group's offset when it moved (lock held)."""
        frontier = state.frontier
        if frontier != state.committed:
            group, topic, queue_id = key
            self.offsets.commit(group, topic, queue_id, frontier)
            state.committed = frontier

    def _relet(self, old: Lease, invisible_until: int) -> Lease:
        """The same delivery (attempt kept) under a new token, invisible until ``invisible_until`` (lock held)."""
        return msgspec.structs.replace(old, token=self._token(), invisible_until=invisible_until)

    def _token(self) -> int:
        """A new delivery's token (lock held: the generator is not shared across threads otherwise)."""
        return self._random.getrandbits(63)

    def _on_append(self, event: AppendEvent) -> None:
        # Every append, on the appending thread: one truth test unless a receive waits.
        self._arrivals.notify(event.topic)

    def _count(self, group: str, topic: str) -> _Counts:
        counts = self._counts.get((group, topic))
        if counts is None:
            counts = self._counts.setdefault((group, topic), _Counts())
        return counts

    def _trace_settled(self, group: str, topic: str, settled: dict[int, dict[int, Lease]], status: str,
                       detail: str) -> None:
        if not self.tracer.enabled:
            return
        now = _now_ms()
        self.tracer.add_events([TraceEvent(lease.msg_id, topic, "consume", status, now, group=group,
                                           broker=self.name, queue_id=queue_id, queue_offset=offset,
                                           reconsume_times=lease.attempt - 1,
                                           detail=f"{detail}, attempt {lease.attempt}")
                                for queue_id, leases in settled.items() for offset, lease in leases.items()
                                if lease.msg_id])

    def _gauges(self) -> Iterator[tuple[str, dict[str, float]]]:
        with self._lock:
            in_flight: dict[tuple[str, str], int] = {}
            for (group, topic, _), state in self._state.queues.items():
                in_flight[(group, topic)] = in_flight.get((group, topic), 0) + len(state.leases)
            rows = [(f"{g}/{t}", {"in_flight": float(in_flight.get((g, t), 0)), "received": float(c.received),
                                  "redelivered": float(c.redelivered), "acked": float(c.acked),
                                  "renewed": float(c.renewed), "dead_lettered": float(c.dead_lettered)})
                    for (g, t), c in self._counts.items()]
        yield from rows

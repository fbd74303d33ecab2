"""Pulls: tag and SQL92 filters, long polling, bulk Arrow pulls, the lake tier, queue offsets."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time

import anyio.to_thread
import pyarrow as pa

from ...common.errors import ErrorCode, SparkMQError
from ...common.filtering import FILTER_SQL92, FILTER_TAG, SqlFilter, compile_filter, parse_tags
from ...common.perm import is_readable
from ...common.protocol import MAX_BULK_PULL_BATCH, MAX_LONG_POLL_MS, MAX_PULL_BATCH, PackedPull, PullResult, PullStatus
from ...common.validation import check_int, validate_group
from ...store import GetResult, MessageStore, PackedGetResult
from ...store.message_store import PREFETCH_MAX_BYTES, records_of
from ..client_manager import ClientManager
from ..config import BrokerConfig
from ..lake_index import LakeIndex
from ..long_polling import PullHoldService
from ..metrics import BrokerMetrics
from ..offsets import ConsumerOffsetManager
from ..overload import OverloadGuard
from ..topics import TopicConfig, TopicConfigManager
from ..trace import TraceRecorder
from .base import BrokerState, Processor, cached_filter

__all__ = ["PullProcessor"]

log = logging.getLogger("sparkmq.broker")

#: A tag-filtered pull keeps scanning past non-matching messages for at most this many store reads.
_MAX_FILTER_ROUNDS = 16
#: An SQL92-filtered pull examines at most this many consume-queue units (then answers NO_MATCHED_MSG
#: with next_offset past them, so the consumer moves on).
_MAX_SQL_EXAMINED = 65_536
#: A pull starting more messages than this behind its queue's end, or at log bytes further back than the store
#: keeps in the page cache (``page_cache_keep``; 1 GiB when the OS decides), reads cold history: its pages are
#: read in first by a worker thread (:meth:`MessageStore.prefetch`), never on the event loop.
COLD_READ_MESSAGES = 1024
_COLD_READ_BYTES_DEFAULT = 1 << 30
#: Worker threads serving cold remoting pulls: a few disks' worth of reads in flight, no more.
COLD_READ_THREADS = 4
#: A cold pull reads in this many messages of its queue (within the store's PREFETCH_MAX_BYTES), not just its own:
#: the pulls that follow it inside that window copy from the pages it brought in, on the loop, without a worker
#: thread's round trip or a read of their own (a consumer draining a backlog pulls 32 at a time).
COLD_READ_AHEAD_MESSAGES = 1024


def as_pull(got: GetResult) -> PullResult:
    """The broker's answer for what the store found (the statuses share their names)."""
    return PullResult(PullStatus(got.status.value), got.next_offset, got.min_offset, got.max_offset, got.messages)


def as_packed(got: PackedGetResult) -> PackedPull:
    """The broker's packed answer for what the store found."""
    return PackedPull(PullStatus(got.status.value), got.next_offset, got.min_offset, got.max_offset, got.count,
                      got.data)


def _at_end(status: PullStatus, next_offset: int, max_offset: int, offset: int) -> bool:
    """Whether a pull found nothing because the queue has nothing (matching) yet: a long poll waits then."""
    return (status is PullStatus.NO_NEW_MSG
            or (status is PullStatus.NO_MATCHED_MSG and next_offset >= max_offset)
            or (status is PullStatus.NO_MATCHED_QUEUE and offset == 0))


class PullProcessor(Processor):
    """Pulls: tag and SQL92 filters, long polling, bulk Arrow pulls, the lake tier, queue offsets.

    Hot pulls (near their queue's end: pages in memory) are read inline; a pull of cold history has its pages
    read in by a worker thread first (:meth:`is_cold`), so a consumer reading old data from disk never stops the
    event loop, or the GIL, for the consumers at the tail.
    """

    def __init__(self, state: BrokerState, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 clients: ClientManager, offsets: ConsumerOffsetManager, holds: PullHoldService,
                 metrics: BrokerMetrics, tracer: TraceRecorder, lake_index: LakeIndex, overload: OverloadGuard) -> None:
        super().__init__(state)
        self.config = config
        self.store = store
        self.topics = topics
        self.clients = clients
        self.offsets = offsets
        self.holds = holds
        self.metrics = metrics
        self.tracer = tracer
        self.lake_index = lake_index
        self.overload = overload
        self._cold_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._cold_pool_lock = threading.Lock()
        #: (topic, queue) -> [first, end) offsets a cold pull last read in (COLD_READ_AHEAD_MESSAGES)
        self._read_in: dict[tuple[str, int], tuple[int, int]] = {}

    def close(self) -> None:
        """Stop the cold-read threads (the broker's shutdown, after the last pull)."""
        with self._cold_pool_lock:
            pool, self._cold_pool = self._cold_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _cold_reads(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._cold_pool_lock:
            if self._cold_pool is None:
                self._cold_pool = concurrent.futures.ThreadPoolExecutor(COLD_READ_THREADS,
                                                                        thread_name_prefix="sparkmq-cold-read")
            return self._cold_pool

    def is_cold(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether a read of a queue at ``offset`` reads history that may not be in the page cache: more than
        :data:`COLD_READ_MESSAGES` behind the queue's end, or further back in the log than ``page_cache_keep``.
        Cheap (the queue's bounds, and one unit near its end); False for anything it cannot place."""
        store = self.store
        try:
            end = store.max_offset(topic, queue_id)
            if offset >= end:
                return False
            if end - offset > COLD_READ_MESSAGES:
                return True
            record = store.queue_unit(topic, queue_id, max(offset, store.min_offset(topic, queue_id)))[0]
            keep = store.config.page_cache_keep or _COLD_READ_BYTES_DEFAULT
            return store.log_offsets().max_offset - record > keep
        except SparkMQError:
            return False

    def _prefetch_if_cold(self, topic: str, queue_id: int, offset: int, max_count: int) -> None:
        """On a worker thread, before a read: the cold read's pages into the page cache (see ``is_cold``), and
        those of the ``COLD_READ_AHEAD_MESSAGES`` after it (see :meth:`was_read_in`)."""
        if self.is_cold(topic, queue_id, offset):
            ahead = max(max_count, COLD_READ_AHEAD_MESSAGES)
            try:
                self.store.prefetch(topic, queue_id, offset, ahead)
                self._note_read_in(topic, queue_id, offset, ahead)
            except (SparkMQError, OSError):  # best effort: the read itself reports what is wrong
                pass

    def _note_read_in(self, topic: str, queue_id: int, offset: int, count: int) -> None:
        """Remember ``[offset, offset + count)`` (to the queue's end) as read in -- unless its records span more
        than the store's prefetch reads (PREFETCH_MAX_BYTES): then only the pull's own pages were."""
        store = self.store
        end = min(offset + count, store.max_offset(topic, queue_id))
        if end <= offset:
            return
        first = store.queue_unit(topic, queue_id, offset)[0]
        last, size, _tag = store.queue_unit(topic, queue_id, end - 1)
        if last + size - first <= PREFETCH_MAX_BYTES:
            self._read_in[(topic, queue_id)] = (offset, end)

    def was_read_in(self, topic: str, queue_id: int, offset: int, max_count: int) -> bool:
        """Whether a cold pull read in ``offset .. offset + max_count`` of the queue moments ago (its window)."""
        window = self._read_in.get((topic, queue_id))
        return window is not None and window[0] <= offset and offset + max_count <= window[1]

    def _check_pull(self, topic: str, queue_id: int, offset: int, max_count: int,
                    max_batch: int = MAX_PULL_BATCH) -> TopicConfig:
        cfg = self.topics.require(topic)
        if not is_readable(cfg.perm):
            raise SparkMQError(ErrorCode.NO_PERMISSION, f"topic {topic!r} is not readable on {self.name} "
                                                        f"(perm {cfg.perm})")
        check_int("queue_id", queue_id, 0, cfg.read_queue_nums - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
        check_int("max", max_count, 1, max_batch)
        return cfg

    def pull_once(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                  tags: frozenset[str] | None = None, *, group: str | None = None,
                  commit_offset: int | None = None, sql: SqlFilter | None = None,
                  client_id: str | None = None) -> PullResult:
        """Read up to ``max_count`` messages without waiting; also commits ``commit_offset`` for ``group``.

        With a tag filter, a read that matched nothing keeps scanning towards the
        queue's end (bounded), so consumers do not round-trip over long runs of other tags.
        With ``sql`` (a compiled SQL92 filter; ``tags`` is then ignored) only each
        candidate's properties are decoded and evaluated, scanning up to
        ``_MAX_SQL_EXAMINED`` units past non-matching ones.  Messages returned to a ``group``
        are traced as ``deliver`` events (with ``client_id``, the puller).
        """
        started = time.perf_counter()
        with self._operation():
            self._check_pull(topic, queue_id, offset, max_count)
            reset_to = self._commit_and_settle(topic, queue_id, offset, group, commit_offset)
            if reset_to is not None:
                # An admin reset the group's offset here: the consumer restarts there, nothing is read.
                return PullResult(PullStatus.OFFSET_RESET, reset_to, self.store.min_offset(topic, queue_id),
                              self.store.max_offset(topic, queue_id))
            if sql is not None:
                result = as_pull(self.store.get_messages_matching(topic, queue_id, offset, max_count, sql.matches,
                                                                  _MAX_SQL_EXAMINED, self.config.pull_max_bytes))
                if result.status is PullStatus.OFFSET_TOO_SMALL:
                    result = self._from_lake_tier(topic, queue_id, offset, max_count, None, sql, result)
                self.metrics.pulled(topic, group, len(result.messages), sum(len(m.body) for m in result.messages),
                                    time.perf_counter() - started)
                if group is not None:
                    self.tracer.delivered(topic, group, client_id, result.messages)
                return result
            result = as_pull(self.store.get_messages(topic, queue_id, offset, max_count, tags,
                                                     self.config.pull_max_bytes))
            rounds = 1
            while (result.status is PullStatus.NO_MATCHED_MSG and result.next_offset < result.max_offset
                   and rounds < _MAX_FILTER_ROUNDS):
                result = as_pull(self.store.get_messages(topic, queue_id, result.next_offset, max_count, tags,
                                                         self.config.pull_max_bytes))
                rounds += 1
            if result.status is PullStatus.NO_NEW_MSG and result.next_offset > offset:
                result = PullResult(PullStatus.NO_MATCHED_MSG, result.next_offset, result.min_offset,
                                    result.max_offset)  # filtered to the end: the caller must still advance
            if result.status is PullStatus.OFFSET_TOO_SMALL:
                result = self._from_lake_tier(topic, queue_id, offset, max_count, tags, None, result)
        self.metrics.pulled(topic, group, len(result.messages), sum(len(m.body) for m in result.messages),
                            time.perf_counter() - started)
        if group is not None:
            self.tracer.delivered(topic, group, client_id, result.messages)
        return result

    def pull_arrow_once(self, topic: str, queue_id: int, offset: int, max_count: int = 32, *,
                        records: bool = False) -> tuple[PullResult, pa.RecordBatch]:
        """An unfiltered pull answered as one Arrow record batch, without waiting (up to 16384 messages).

        The fast path of bulk pulls (the Spark source, the dispatch job): no ``StoredMessage``
        objects.  ``records``: the records as stored (``RECORDS_SCHEMA``), decoded by the reader,
        so the broker only copies bytes; else ``PULL_SCHEMA`` columns cut from the records here.
        A pull below the log's retention goes through :meth:`pull_once` (the lake tier) and is
        answered in ``PULL_SCHEMA`` either way.
        """
        started = time.perf_counter()
        with self._operation():
            self._check_pull(topic, queue_id, offset, max_count, MAX_BULK_PULL_BATCH)
            self._prefetch_if_cold(topic, queue_id, offset, max_count)  # adapters call this off the loop
            got, batch = self.store.get_arrow(topic, queue_id, offset, max_count, self.config.pull_max_bytes,
                                              self.name, decode=not records)
        result = as_pull(got)
        if result.status is PullStatus.OFFSET_TOO_SMALL:
            from ...common.wire import stored_to_arrow  # only this rare path builds rows

            result = self.pull_once(topic, queue_id, offset, min(max_count, MAX_PULL_BATCH))
            return result, stored_to_arrow(result.messages, self.name)
        size = batch.column(0 if records else "body").nbytes if batch.num_rows else 0
        self.metrics.pulled(topic, None, batch.num_rows, size, time.perf_counter() - started)
        return result, batch

    def _from_lake_tier(self, topic: str, queue_id: int, offset: int, max_count: int,
                        tags: frozenset[str] | None, sql: SqlFilter | None, log_result: PullResult) -> PullResult:
        """A pull below the log's retention, served from the lake's ``messages`` table when it has the range.

        History outlives local disk: the dispatch job copied every message there.  Without
        the rows (no lake, or not dispatched) the log's OFFSET_TOO_SMALL answer stands.
        """
        limit = min(max_count, log_result.min_offset - offset)  # never past where the log takes over
        rows = self.lake_index.messages_range(topic, self.name, queue_id, offset, limit)
        if not rows or rows[0].queue_offset != offset:
            return log_result
        next_offset = rows[-1].queue_offset + 1
        if tags is not None:
            rows = [m for m in rows if m.tags in tags]
        if sql is not None:
            rows = [m for m in rows if sql.matches(m.properties)]
        status = PullStatus.FOUND if rows else PullStatus.NO_MATCHED_MSG
        return PullResult(status, next_offset, log_result.min_offset, log_result.max_offset, rows)


    def pull_filter(self, filter_type: str | None, tags: str | None,
                    expression: str | None) -> tuple[frozenset[str] | None, SqlFilter | None]:
        """(tag set, SQL filter) of a pull: ``TAG`` reads ``tags`` (or ``expression``), ``SQL92`` ``expression``.

        FILTER_EXPRESSION_ILLEGAL (with the error's position) for a malformed expression or an unknown type.
        """
        kind = (filter_type or FILTER_TAG).upper()
        if kind == FILTER_SQL92:
            compiled = cached_filter(expression, FILTER_SQL92)
            assert isinstance(compiled, SqlFilter)
            return None, compiled
        if kind == FILTER_TAG:
            return parse_tags(tags if tags is not None else expression), None
        compile_filter(expression, kind)  # raises FILTER_EXPRESSION_ILLEGAL naming the known types
        raise AssertionError("unreachable")

    async def pull(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags: str | None = None, *,
                   wait_ms: int = 0, group: str | None = None, commit_offset: int | None = None,
                   filter_type: str | None = None, expression: str | None = None,
                   client_id: str | None = None) -> PullResult:
        """Pull with long polling: when nothing (matching) is new, hold up to ``min(wait_ms, long_polling_max_ms)``.

        A held pull answers as soon as a message lands on the queue (and matches), or
        at the deadline with the status it would have had.  Store reads run in a worker
        thread; the hold itself costs no thread.  ``filter_type`` ``SQL92`` filters on the
        broker with ``expression`` over message properties (see :meth:`pull_filter`).
        """
        wanted, sql = self.pull_filter(filter_type, tags, expression)

        def pull_at(at: int, commit: int | None) -> PullResult:
            self._prefetch_if_cold(topic, queue_id, at, max_count)
            return self.pull_once(topic, queue_id, at, max_count, wanted, group=group, commit_offset=commit, sql=sql,
                                  client_id=client_id)

        async def read(at: int, commit: int | None) -> PullResult:
            return await anyio.to_thread.run_sync(lambda: pull_at(at, commit))
        return await self._long_poll(read, topic, queue_id, offset, wait_ms, group, commit_offset)

    async def pull_packed(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                          tags: str | None = None, *, wait_ms: int = 0, group: str | None = None,
                          commit_offset: int | None = None, filter_type: str | None = None,
                          expression: str | None = None, client_id: str | None = None) -> PackedPull:
        """:meth:`pull`, answered with the stored records copied out by the native core (the remoting path).

        A hot read runs on the calling event loop: the copy is one native call from memory.  A cold one
        (:meth:`is_cold`) runs on a worker thread that reads its pages in first, so the loop never waits
        for the disk.  A tag filter matches the consume queue's tag hashes only; the client re-checks the tag
        string.  A pull without a group may ask for up to ``MAX_BULK_PULL_BATCH`` messages (the Spark
        source's reads).
        """
        wanted, sql = self.pull_filter(filter_type, tags, expression)

        def pull_at(at: int, commit: int | None) -> PackedPull:
            return self.pull_packed_once(topic, queue_id, at, max_count, wanted, group=group, commit_offset=commit,
                                         sql=sql, client_id=client_id)

        def cold_pull_at(at: int, commit: int | None, queued_at: float) -> PackedPull:
            # A read that waited for a worker longer than wait_time_ms_in_pull_queue: SYSTEM_BUSY (RocketMQ's
            # pull thread pool queue), the disk is behind the pulls; the consumer backs off.
            self.overload.check_waited(time.monotonic() - queued_at, pull=True)
            self._prefetch_if_cold(topic, queue_id, at, max_count)
            return pull_at(at, commit)

        # A pull inside the window a cold pull read in copies from memory; a filtered one may scan past it.
        unfiltered = wanted is None and sql is None

        async def read(at: int, commit: int | None) -> PackedPull:
            if (unfiltered and self.was_read_in(topic, queue_id, at, max_count)) or not self.is_cold(topic, queue_id,
                                                                                                    at):
                return pull_at(at, commit)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._cold_reads(), cold_pull_at, at, commit, time.monotonic())
        return await self._long_poll(read, topic, queue_id, offset, wait_ms, group, commit_offset)

    async def _long_poll(self, read, topic: str, queue_id: int, offset: int, wait_ms: int,
                         group: str | None, commit_offset: int | None):
        """Read at ``offset``; while nothing (matching) is new, hold until an append or a reset wakes the queue."""
        check_int("wait_ms", wait_ms, 0, MAX_LONG_POLL_MS)
        deadline = time.monotonic() + min(wait_ms, self.config.long_polling_max_ms) / 1000.0
        result = await read(offset, commit_offset)
        while True:
            remaining = deadline - time.monotonic()
            if (not _at_end(result.status, result.next_offset, result.max_offset, offset) or remaining <= 0
                    or not self.running):
                return result
            start = result.next_offset
            self.overload.check_hold(self.holds.held())  # SYSTEM_BUSY beyond max_held_pulls

            def ready(s: int = start) -> bool:
                return self.running and (self.store.max_offset(topic, queue_id) > s
                                         or self._reset_moves(group, topic, queue_id, s))

            await self.holds.hold(topic, queue_id, remaining, ready)
            if not self.running:
                return result
            again = await read(start, None)
            if again.status is PullStatus.NO_NEW_MSG and start > offset:
                # Earlier rounds skipped non-matching messages: tell the caller to advance.
                again.status = PullStatus.NO_MATCHED_MSG
            result = again

    def pull_packed_once(self, topic: str, queue_id: int, offset: int, max_count: int = 32,
                         tags: frozenset[str] | None = None, *, group: str | None = None,
                         commit_offset: int | None = None, sql: SqlFilter | None = None,
                         client_id: str | None = None) -> PackedPull:
        """:meth:`pull_once` with the records packed (no message objects on the tag-filtered path)."""
        started = time.perf_counter()
        with self._operation():
            bulk = group is None and sql is None
            self._check_pull(topic, queue_id, offset, max_count, MAX_BULK_PULL_BATCH if bulk else MAX_PULL_BATCH)
            reset_to = self._commit_and_settle(topic, queue_id, offset, group, commit_offset)
            if reset_to is not None:
                return PackedPull(PullStatus.OFFSET_RESET, reset_to, self.store.min_offset(topic, queue_id),
                                  self.store.max_offset(topic, queue_id))
            max_bytes = self.config.pull_max_bytes
            if sql is not None:
                found = as_pull(self.store.get_messages_matching(topic, queue_id, offset, max_count, sql.matches,
                                                                 _MAX_SQL_EXAMINED, max_bytes))
                if found.status is PullStatus.OFFSET_TOO_SMALL:
                    found = self._from_lake_tier(topic, queue_id, offset, max_count, None, sql, found)
                result = self._packed_from_messages(found)
            else:
                result = as_packed(self.store.get_packed(topic, queue_id, offset, max_count, tags, max_bytes))
                rounds = 1
                while (result.status is PullStatus.NO_MATCHED_MSG and result.next_offset < result.max_offset
                       and rounds < _MAX_FILTER_ROUNDS):
                    result = as_packed(self.store.get_packed(topic, queue_id, result.next_offset, max_count, tags,
                                                             max_bytes))
                    rounds += 1
                if result.status is PullStatus.NO_NEW_MSG and result.next_offset > offset:
                    result.status = PullStatus.NO_MATCHED_MSG  # filtered to the end: the caller must still advance
                if result.status is PullStatus.OFFSET_TOO_SMALL:
                    result = self._packed_from_messages(
                        self._from_lake_tier(topic, queue_id, offset, max_count, tags, None,
                                             PullResult(result.status, result.next_offset, result.min_offset,
                                                        result.max_offset)))
        self.metrics.pulled(topic, group, result.count, len(result.data), time.perf_counter() - started)
        if group is not None and result.count:
            if sql is not None:  # SQL92 found message objects already: per-message events, as pull_once
                self.tracer.delivered(topic, group, client_id, found.messages)
            else:  # one record for the answer (no decoding): the trace job expands the queue range
                self.tracer.delivered_range(topic, group, client_id, queue_id, offset, result.next_offset,
                                            result.count, tags)
        return result

    def _commit_and_settle(self, topic: str, queue_id: int, offset: int, group: str | None,
                           commit_offset: int | None) -> int | None:
        """Apply a pull's piggy-backed commit; the offset to restart at when an admin reset waits here, else None."""
        if group is not None:
            validate_group(group)
        if commit_offset is not None:
            if group is None:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "commit_offset needs a group")
            self.offsets.commit(group, topic, queue_id, commit_offset)
        return None if group is None else self.offsets.settle_reset(group, topic, queue_id, offset)

    def _packed_from_messages(self, found: PullResult) -> PackedPull:
        """A packed answer for messages found as objects (SQL92 filtering, the lake tier): records re-made."""
        data = records_of(found.messages) if found.messages else b""
        return PackedPull(found.status, found.next_offset, found.min_offset, found.max_offset, len(found.messages),
                          data)

    def _reset_moves(self, group: str | None, topic: str, queue_id: int, offset: int) -> bool:
        """Whether a pending offset reset sends ``group``'s puller at ``offset`` elsewhere (wakes a held pull)."""
        return group is not None and self.offsets.pending_reset(group, topic, queue_id) not in (None, offset)

    def search_offset(self, topic: str, queue_id: int, timestamp: int, boundary: str = "LOWER") -> int:
        """RocketMQ's SEARCH_OFFSET_BY_TIMESTAMP: ``LOWER`` the first offset stored at or after ``timestamp`` (the
        max offset when none is), ``UPPER`` the last one stored at or before it (the min offset when none is)."""
        cfg = self.topics.require(topic)
        check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        check_int("timestamp", timestamp, 0, 2**63 - 2)
        kind = str(boundary).upper()
        if kind == "LOWER":
            return self.store.offset_by_time(topic, queue_id, timestamp)
        if kind != "UPPER":
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"boundaryType must be LOWER or UPPER, got {boundary!r}")
        after = self.store.offset_by_time(topic, queue_id, timestamp + 1)
        return max(after - 1, self.store.min_offset(topic, queue_id))

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """The store time (epoch ms) of the oldest message a queue still holds; -1 when it holds none."""
        cfg = self.topics.require(topic)
        check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        low = self.store.min_offset(topic, queue_id)
        if low >= self.store.max_offset(topic, queue_id):
            return -1
        try:
            return int(self.store.read_queue_message(topic, queue_id, low).store_timestamp)
        except SparkMQError:  # retention took it meanwhile
            return -1

    def group_subscription(self, group: str, topic: str) -> tuple[str, str]:
        """(filter type, expression) the members of ``group`` last heartbeat for ``topic``: the filter of a pull
        that carries none (RocketMQ's broker uses the group's registered subscription then);
        SUBSCRIPTION_NOT_EXIST when no member subscribes to it here."""
        validate_group(group)
        for sub in self.clients.group_info(group).subscriptions:
            if sub.topic == topic:
                return str(sub.type), sub.expression
        raise SparkMQError(ErrorCode.SUBSCRIPTION_NOT_EXIST,
                           f"no member of group {group!r} subscribes to {topic!r} on {self.name}")

    def queue_offsets(self, topic: str, queue_id: int, timestamp: int | None = None) -> dict[str, int]:
        """``{"min_offset", "max_offset"}`` of a queue, plus ``"offset"`` (first stored at or after ``timestamp``)."""
        cfg = self.topics.require(topic)
        check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
        out = {"min_offset": self.store.min_offset(topic, queue_id),
               "max_offset": self.store.max_offset(topic, queue_id)}
        if timestamp is not None:
            check_int("timestamp", timestamp, 0, 2**63 - 1)
            out["offset"] = self.store.offset_by_time(topic, queue_id, timestamp)
        return out



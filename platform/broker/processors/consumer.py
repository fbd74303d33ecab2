"""Consumer management: heartbeats, groups, queue locks, committed offsets, lag and offset reset."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from ...common.errors import ErrorCode, SparkMQError
from ...common.protocol import MAX_LONG_POLL_MS, PopLag, parse_held_queue
from ...common.system_topics import (
    retry_topic,
)
from ...common.validation import check_int, validate_group
from ...store import MessageStore
from ..client_manager import ClientManager, ConsumerData, GroupInfo, MessageModel
from ..locks import QueueLockManager, QueueRef
from ..long_polling import PullHoldService
from ..offsets import ConsumerOffsetManager
from ..topics import TopicConfigManager
from .base import BrokerState, Processor, cached_filter

__all__ = ["ConsumerProcessor", "PopLagSource"]

log = logging.getLogger("sparkmq.broker")


class PopLagSource(Protocol):
    """What consumer lag reads of POP consumption (the POP processor is one)."""

    def topics_of(self, group: str) -> set[str]:
        """Topics ``group`` has POP-consumed here."""
        ...

    def lag(self, group: str, topic: str) -> PopLag:
        """Per read queue and in total: deliveries in flight and messages not yet received."""
        ...


class ConsumerProcessor(Processor):
    """Consumer management: heartbeats, groups, queue locks, committed offsets, lag and offset reset."""

    def __init__(self, state: BrokerState, store: MessageStore, topics: TopicConfigManager, clients: ClientManager,
                 offsets: ConsumerOffsetManager, locks: QueueLockManager, holds: PullHoldService,
                 pop_lag: PopLagSource) -> None:
        super().__init__(state)
        self.store = store
        self.topics = topics
        self.clients = clients
        self.offsets = offsets
        self.locks = locks
        self.holds = holds
        #: The lag of topics a group consumes by POP (the POP processor's, not the pull offsets').
        self.pop_lag = pop_lag
        self._reset_listeners: list[Callable[[str, str, dict[int, int]], None]] = []

    def add_reset_listener(self, listener: Callable[[str, str, dict[int, int]], None]) -> None:
        """Call ``listener(group, topic, {queue_id: offset})`` after an offset reset (the remoting adapter pushes
        it to the group's members)."""
        self._reset_listeners.append(listener)

    def reset_offsets(self, group: str, topic: str, *, timestamp: int | None = None,
                      offsets: dict[int, int] | None = None) -> dict[str, Any]:
        """Move ``group``'s offsets on ``topic`` to the first message at/after ``timestamp`` or to ``offsets``.

        The group's version moves (``/consumers/{group}/changes`` answers), so running
        consumers re-read their offsets, and a pull of the group elsewhere on a reset queue
        answers ``OFFSET_RESET`` with the new offset; until the consumer pulls there, its
        commits of other offsets are ignored (a stale commit cannot undo the reset).
        GROUP_NOT_EXIST when the group has no members and no committed offsets here;
        QUEUE_ID_ILLEGAL / OFFSET_ILLEGAL for bad entries (an offset beyond the queue's
        max); nothing changes on error.
        """
        validate_group(group)
        cfg = self.topics.require(topic)
        if (timestamp is None) == (offsets is None):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "give either timestamp or offsets")
        if not self.clients.members(group) and not self.offsets.topics_of(group):
            raise SparkMQError(ErrorCode.GROUP_NOT_EXIST, f"consumer group {group!r} is not known on {self.name}")
        new: dict[int, int] = {}
        if timestamp is not None:
            check_int("timestamp", timestamp, 0, 2**63 - 1)
            for queue_id in range(cfg.read_queue_nums):
                new[queue_id] = self.store.offset_by_time(topic, queue_id, timestamp)
        else:
            assert offsets is not None
            if not offsets:
                raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "offsets is empty")
            for queue_id, offset in offsets.items():
                check_int("queue_id", queue_id, 0, cfg.read_queue_nums - 1, ErrorCode.QUEUE_ID_ILLEGAL)
                high = self.store.max_offset(topic, queue_id)
                check_int(f"offset of queue {queue_id}", offset, 0, high, ErrorCode.OFFSET_ILLEGAL)
                new[queue_id] = offset
        # Clustering: the new offsets are fenced until each queue's consumer pulls there (ConsumerOffsetManager).
        # Broadcasting consumers keep their offsets themselves, one per member: no fence to settle.
        broadcasting = self.clients.group_info(group).message_model is MessageModel.BROADCASTING \
            and bool(self.clients.members(group))
        self.offsets.reset(group, topic, new, fence=not broadcasting)
        for queue_id in new:
            self.holds.notify_put(topic, queue_id)  # held pulls of the group come back with OFFSET_RESET
        for listener in list(self._reset_listeners):
            try:
                listener(group, topic, dict(new))
            except Exception:  # a listener's bug must not fail a reset that is done
                log.exception("offset reset listener failed")
        version = self.clients.bump_version(group)
        log.info("group %s reset on %s to %s", group, topic, new)
        return {"group": group, "topic": topic, "offsets": {str(q): o for q, o in sorted(new.items())},
                "version": version}

    # ================================================================== consumer offsets
    def commit_offsets(self, group: str, entries: Iterable[tuple[str, int, int]]) -> int:
        """Commit ``(topic, queue_id, offset)`` entries for ``group``, all or nothing; returns how many were applied.

        An entry is not applied while an offset reset of its queue waits for the consumer (see
        :meth:`reset_offsets`); every entry is validated before any is applied.
        """
        validate_group(group)
        checked = []
        for entry in entries:
            topic, queue_id, offset = entry
            cfg = self.topics.require(topic)
            check_int("queue_id", queue_id, 0, cfg.queue_count - 1, ErrorCode.QUEUE_ID_ILLEGAL)
            check_int("offset", offset, 0, 2**63 - 1, ErrorCode.OFFSET_ILLEGAL)
            checked.append((topic, queue_id, offset))
        return sum(self.offsets.commit(group, topic, queue_id, offset) for topic, queue_id, offset in checked)

    def query_offsets(self, group: str, topic: str | None = None) -> dict[str, dict[int, int]]:
        """``{topic: {queue_id: offset}}`` of ``group`` (one topic when given)."""
        if topic is not None:
            return {topic: self.offsets.offsets_of(group, topic)}
        return self.offsets.offsets_of(group)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when ``group`` never committed one there."""
        committed = self.offsets.query(group, topic, queue_id)
        return -1 if committed is None else committed

    def last_consumed_timestamp(self, topic: str, queue_id: int, consumer_offset: int) -> int:
        """The store time (epoch ms) of the last message before ``consumer_offset``; 0 when nothing was consumed
        (RocketMQ's ``lastTimestamp`` of a queue in GET_CONSUME_STATS)."""
        if consumer_offset <= 0:
            return 0
        return self.store.store_timestamp_of(topic, queue_id, consumer_offset - 1)

    def reset_offsets_back(self, group: str, topic: str, timestamp: int, *, force: bool) -> dict[str, Any]:
        """RocketMQ's ``Broker2Client.resetOffset``: every read queue of ``topic`` to the first message at or after
        ``timestamp`` (-1: the queue's end); without ``force`` a queue that has a committed offset only moves back.
        Then as :meth:`reset_offsets`."""
        cfg = self.topics.require(topic)
        wanted: dict[int, int] = {}
        for queue_id in range(cfg.read_queue_nums):
            target = (self.store.max_offset(topic, queue_id) if timestamp < 0
                      else self.store.offset_by_time(topic, queue_id, timestamp))
            committed = self.query_offset(group, topic, queue_id)
            wanted[queue_id] = target if force or committed < 0 else min(target, committed)
        return self.reset_offsets(group, topic, offsets=wanted)

    def query_offset_or_start(self, group: str, topic: str, queue_id: int, zero_if_not_found: bool | None) -> int:
        """RocketMQ's QUERY_CONSUMER_OFFSET: the committed offset; else 0 when the queue still holds its first
        message (offset 0) and ``zero_if_not_found`` is not False -- a group new to a young queue starts at its
        beginning, as RocketMQ's broker answers; else -1 (QUERY_NOT_FOUND: the client decides where to start)."""
        committed = self.query_offset(group, topic, queue_id)
        if committed >= 0 or zero_if_not_found is False:
            return committed
        if self.store.min_offset(topic, queue_id) == 0 and self.store.max_offset(topic, queue_id) > 0:
            return 0
        return -1

    def lag(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """Per read queue: broker offset, consumer offset (-1 = none) and lag; topics of the group when none given.

        On a topic the group consumes by POP (RocketMQ 5 clients over gRPC), the lag is the real one
        (in flight + not yet received, both also given) and the consumer offset is the settled frontier.
        """
        validate_group(group)
        popped = self.pop_lag.topics_of(group)
        if topic is not None:
            configs = [self.topics.require(topic)]
        else:
            names = set(self.offsets.topics_of(group)) | set(self.clients.subscribed_topics(group)) | popped
            configs = [cfg for n in sorted(names) if (cfg := self.topics.get(n)) is not None]
        queues = []
        for cfg in configs:
            if cfg.topic in popped:
                for q in self.pop_lag.lag(group, cfg.topic).queues:
                    queues.append({"topic": cfg.topic, "queue_id": q.queue_id, "broker_offset": q.broker_offset,
                                   "consumer_offset": q.consumer_offset, "lag": q.lag, "in_flight": q.in_flight,
                                   "not_received": q.not_received})
                continue
            for queue_id in range(cfg.read_queue_nums):
                max_offset = self.store.max_offset(cfg.topic, queue_id)
                min_offset = self.store.min_offset(cfg.topic, queue_id)
                lag = self.offsets.lag(group, cfg.topic, queue_id, max_offset, min_offset)
                queues.append({"topic": cfg.topic, "queue_id": queue_id, "broker_offset": max_offset,
                               "consumer_offset": self.query_offset(group, cfg.topic, queue_id), "lag": lag})
        return {"group": group, "total_lag": sum(q["lag"] for q in queues), "queues": queues}


    def heartbeat(self, client_id: str, producer_groups: Iterable[str] = (),
                  consumers: Sequence[ConsumerData] = ()) -> dict[str, int]:
        """Record a client heartbeat; returns each consumer group's membership version.

        Clustering groups get their retry topic ``%RETRY%<group>`` (1 queue), as in RocketMQ.
        Every subscription's expression is compiled first: a malformed one refuses the whole
        heartbeat with FILTER_EXPRESSION_ILLEGAL and changes nothing.  Of the queues a member says
        it holds, those of this broker are kept (``group_info`` shows them).
        """
        for data in consumers:
            for sub in getattr(data, "subscriptions", ()):
                try:
                    cached_filter(sub.expression, str(sub.type))
                except SparkMQError as exc:
                    raise SparkMQError(exc.code, f"group {data.group}, topic {sub.topic}: {exc.message}") from None
        # A client sends every broker the same heartbeat: each keeps its own queues, so views merged over the
        # masters name each queue once.
        consumers = [dataclasses.replace(d, held_queues=tuple(q for q in d.held_queues
                                                              if parse_held_queue(q)[1] == self.name))
                     if isinstance(d, ConsumerData) and d.held_queues else d for d in consumers]
        versions = self.clients.heartbeat(client_id, producer_groups, consumers)
        self.topics.ensure_system_topics(
            retry_topic(data.group) for data in consumers if data.message_model is MessageModel.CLUSTERING)
        return versions

    def unregister_client(self, client_id: str, producer_groups: Iterable[str] = (),
                          consumer_groups: Iterable[str] = ()) -> dict[str, int]:
        """Remove a client from groups (it is shutting down); returns the consumer groups' versions."""
        return self.clients.unregister(client_id, producer_groups, consumer_groups)

    def group_info(self, group: str) -> GroupInfo:
        """A consumer group's members, version and subscriptions, and each member's protocol and held queues."""
        return self.clients.group_info(group)

    async def wait_group_change(self, group: str, version: int, wait_ms: int) -> tuple[int, list[str]]:
        """Long-poll a group's membership: answers when its version differs from ``version`` or at ``wait_ms``."""
        check_int("version", version, 0, 2**63 - 1)
        check_int("wait_ms", wait_ms, 0, MAX_LONG_POLL_MS)
        timeout = wait_ms / 1000.0 if self.running else 0.0
        return await self.clients.wait_change(group, version, timeout)

    def on_clients_left(self, group: str, client_ids: list[str]) -> None:
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



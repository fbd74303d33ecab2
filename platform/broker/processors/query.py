"""Query and trace: messages by key, id or time, message view, client trace events, a message's path."""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ...common.errors import ErrorCode, SparkMQError
from ...common.message import (
    StoredMessage,
)
from ...store import MessageStore
from ..lake_index import DEFAULT_MAX_HITS, LakeIndex, lake_row_to_stored
from ..trace import MAX_POSTED_EVENTS, TraceLookup, TraceRecorder, validate_event
from .base import BrokerState, Processor

__all__ = ["QueryProcessor", "STORE_SCAN_LIMIT"]

#: Without the lake's key index, a query by key or unique id reads the topic's queues: at most this many messages.
STORE_SCAN_LIMIT = 200_000
SCAN_BATCH = 512

log = logging.getLogger("sparkmq.broker")


class QueryProcessor(Processor):
    """Query and trace: messages by key, id or time, message view, client trace events, a message's path."""

    def __init__(self, state: BrokerState, store: MessageStore, tracer: TraceRecorder, lake_index: LakeIndex,
                 trace_lookup: TraceLookup) -> None:
        super().__init__(state)
        self.store = store
        self.tracer = tracer
        self.lake_index = lake_index
        self.trace_lookup = trace_lookup

    def query_messages(self, *, topic: str | None = None, key: str | None = None, msg_id: str | None = None,
                       begin_ms: int | None = None, end_ms: int | None = None,
                       max_hits: int = DEFAULT_MAX_HITS) -> list[StoredMessage]:
        """Messages found through the lake's index: by ``msg_id``, by ``topic`` + ``key``, or by ``topic``
        and a store-time range; each read from the log, or from the lake tier when retention removed it."""
        index = self.lake_index
        if msg_id is not None:
            locations = index.by_msg_id(msg_id, max_hits)
        elif key is not None:
            locations = index.by_key(topic or "", key, max_hits)
        elif begin_ms is not None and end_ms is not None:
            locations = index.by_time(topic or "", begin_ms, end_ms, max_hits)
        else:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               "query by msg_id, by topic and key, or by topic, begin and end")
        found = []
        for location in locations:
            if location.broker == self.name:
                try:
                    stored = self.store.read_message(location.commitlog_offset)
                    if stored.topic == location.topic and stored.queue_offset == location.queue_offset:
                        found.append(stored)
                        continue
                except SparkMQError:
                    pass  # retention removed it: the lake tier has it
            row = index.stored_message(location)
            if row is not None:
                found.append(lake_row_to_stored(row))
        return found


    def query_by_key(self, topic: str, key: str, *, unique: bool = False, max_hits: int = DEFAULT_MAX_HITS,
                     begin_ms: int = 0, end_ms: int = 2**63 - 1) -> list[StoredMessage]:
        """RocketMQ's QUERY_MESSAGE: the messages of ``topic`` with ``key`` among their keys -- or, ``unique``,
        whose unique id (UNIQ_KEY) is ``key`` -- stored in ``[begin_ms, end_ms]``; at most ``max_hits``
        (1..DEFAULT_MAX_HITS * 2)."""
        if not isinstance(key, str) or not key:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "the key to query must be a non-empty string")
        hits = max(1, min(int(max_hits), DEFAULT_MAX_HITS * 2))
        try:
            if unique:
                found = [m for m in self.query_messages(msg_id=key, max_hits=hits) if m.topic == topic or not topic]
            else:
                found = self.query_messages(topic=topic, key=key, max_hits=hits)
        except SparkMQError as exc:
            if exc.code is not ErrorCode.LAKE_NOT_AVAILABLE or not topic:
                raise
            # no key index here: read the topic's queues instead (mqadmin's queryMsgByKey and queryMsgById work
            # on a broker without a lake), as long as the topic is small enough to read whole
            if unique:
                found = self._scan_topic(topic, lambda m: m.properties.get("UNIQ_KEY") == key, begin_ms, end_ms, exc)
            else:
                found = self._scan_topic(topic, lambda m: key in m.keys, begin_ms, end_ms, exc)
            found = sorted(found, key=lambda m: m.store_timestamp, reverse=True)[:hits]
        return [m for m in found if begin_ms <= m.store_timestamp <= end_ms]

    def _scan_topic(self, topic: str, match: Callable[[StoredMessage], bool], begin_ms: int, end_ms: int,
                    no_index: SparkMQError) -> list[StoredMessage]:
        """The messages of ``topic`` stored in ``[begin_ms, end_ms]`` that ``match``, read from the store queue by
        queue; ``no_index`` is raised when that would read more than STORE_SCAN_LIMIT messages."""
        budget = STORE_SCAN_LIMIT
        found: list[StoredMessage] = []
        for queue_topic, queue_id in self.store.queues():
            if queue_topic != topic:
                continue
            offset = self.store.offset_by_time(topic, queue_id, begin_ms)
            end = self.store.max_offset(topic, queue_id)
            while offset < end:
                if budget <= 0:
                    raise no_index
                got = self.store.get_messages(topic, queue_id, offset, min(SCAN_BATCH, budget))
                if got.next_offset <= offset:
                    break
                budget -= got.next_offset - offset
                found.extend(m for m in got.messages if m.store_timestamp <= end_ms and match(m))
                if got.messages and got.messages[-1].store_timestamp > end_ms:
                    break
                offset = got.next_offset
        return found

    def message_at(self, commitlog_offset: int) -> StoredMessage:
        """The message stored at ``commitlog_offset`` here (RocketMQ's VIEW_MESSAGE_BY_ID); MESSAGE_NOT_FOUND."""
        return self.store.read_message(commitlog_offset)

    def message_by_offset_msg_id(self, offset_msg_id: str) -> StoredMessage:
        """The message an offsetMsgId points to (MESSAGE_ID_ILLEGAL, MESSAGE_NOT_FOUND)."""
        return self.store.read_by_offset_msg_id(offset_msg_id)


    def record_trace(self, events: Sequence[Any]) -> dict[str, Any]:
        """Buffer client events (``send``, ``consume``) for the trace topic; all validated first.

        INVALID_ARGUMENT (nothing recorded) for a bad event or more than ``MAX_POSTED_EVENTS``.
        ``accepted`` is 0 when tracing is off here, or ``dropped`` counts them when the buffer is full.
        """
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, "events must be a list of trace events")
        if len(events) > MAX_POSTED_EVENTS:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"{len(events)} events in one request; at most {MAX_POSTED_EVENTS}")
        checked = []
        for i, data in enumerate(events):
            try:
                checked.append(validate_event(data))
            except SparkMQError as exc:
                raise SparkMQError(exc.code, f"event {i}: {exc.message}") from None
        if not self.tracer.enabled:
            return {"accepted": 0, "dropped": 0, "enabled": False}
        ok = self.tracer.add_events(checked)
        return {"accepted": len(checked) if ok else 0, "dropped": 0 if ok else len(checked), "enabled": True}

    def trace(self, msg_id: str) -> dict[str, Any]:
        """A message's path from this broker's ``message_trace`` table: events in order with elapsed times."""
        return {"msg_id": msg_id, "broker": self.name, "events": self.trace_lookup.path(msg_id)}



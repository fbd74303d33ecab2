"""Message trace on the broker: recording events into ``RMQ_SYS_TRACE_TOPIC`` and looking a message up.

**Recording.** :class:`TraceRecorder` collects the broker's own events -- ``store`` (a put
succeeded), ``deliver`` (a pull handed messages to a group), ``retry`` / ``dlq`` (send-back),
``transaction`` (COMMIT / ROLLBACK / DISCARD) -- and the events clients post to ``POST /trace``
(``send``, ``consume``).  Packed batches (a remoting batch send appended by the native core, a
pull answered with the stored records) are recorded as ONE
:class:`~sparkmq.platform.common.trace.TraceBatch` each (queue, offset range, time, group,
client): nothing of the broker's work grows with the messages of a batch, and the trace job
expands the batch into per-message rows from the records.  The request path only appends a
cheap closure to a bounded buffer; a daemon thread turns the buffer into
:class:`~sparkmq.platform.common.trace.TraceEvent` s (and batches) every ``flush_interval_s``
(200 ms) or as soon as ``batch_size`` (256) events wait, and stores them as
JSON-lines messages of the trace topic with a direct store put.  When the buffer is full new
events are dropped and counted: tracing never blocks or fails a send.  Trace messages are
never traced themselves.

**Lookup.** :class:`TraceLookup` reads the ``message_trace`` Delta table (written by
``pipelines.trace_job``) with delta-rs: a first pass reads only the ``msg_id`` column to find
the files holding the message, a second reads those files' rows, so a lookup stays cheap as the
table grows.  :func:`trace_path` orders the events and adds the elapsed time between steps.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from ..common.batching import BatchBuffer
from ..common.errors import ErrorCode, SparkMQError
from ..common.failure_log import FailureLog
from ..common.message import Message, StoredMessage
from ..common.system_topics import PROPERTY_REAL_TOPIC, TRACE_TOPIC
from ..common.trace import MAX_EVENTS_PER_MESSAGE, TraceBatch, TraceEvent, encode_events, event_order, trace_path
from ..common.validation import EpochMs, check
from ..store import AppendEvent, PackedPutResult, PutResult
from .transaction import TransactionService

__all__ = [
    "MESSAGE_TRACE_TABLE",
    "MAX_POSTED_EVENTS",
    "TraceLookup",
    "TraceRecorder",
    "TracedTransactionService",
    "event_order",
    "trace_path",
    "validate_event",
]

log = logging.getLogger("sparkmq.broker.trace")

#: The lake table the trace job writes (``pipelines/tables.py`` defines it; the broker may not import it).
MESSAGE_TRACE_TABLE = "message_trace"
#: Most events one ``POST /trace`` may carry.
MAX_POSTED_EVENTS = 10_000

_INT_FIELDS = ("cost_ms", "born_ts", "store_ts", "queue_id", "queue_offset", "reconsume_times")
_STR_FIELDS = ("trace_id", "group", "client_id", "broker", "tags", "keys", "detail")
def validate_event(data: object) -> TraceEvent:
    """A posted event as a :class:`TraceEvent`; INVALID_ARGUMENT names what is wrong.

    ``TraceEvent.from_dict`` checks the names and the event type; this also checks the JSON
    types, so a row the trace job writes can never fail the table's schema.
    """
    if not isinstance(data, Mapping):
        raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"a trace event must be an object, got {data!r}")
    event = TraceEvent.from_dict(data)
    for name in ("msg_id", "topic", "status"):
        value = getattr(event, name)
        if not isinstance(value, str) or not value:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"trace event {name} must be a non-empty string")
    check("event_ts", event.event_ts, EpochMs)
    for name in _INT_FIELDS:
        check(f"trace event {name}", getattr(event, name), int | None)
    for name in _STR_FIELDS:
        value = getattr(event, name)
        if value is not None and not isinstance(value, str):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"trace event {name} must be a string, got {value!r}")
    return event


def _keys_text(keys: Sequence[str]) -> str | None:
    return " ".join(keys) or None


# -- recording ---------------------------------------------------------------------------------------

#: One buffered item: a function that builds its events on the flush thread (the hot path only appends).
_Item = Callable[[], Sequence[TraceEvent | TraceBatch]]


class TraceRecorder:
    """Buffers trace events and stores them in batches as messages of ``RMQ_SYS_TRACE_TOPIC``.

    ``put(message)`` stores one trace message (the broker's direct store put).  Thread-safe;
    :meth:`start` the flush thread, :meth:`stop` it (it flushes what is buffered first).
    A disabled recorder accepts nothing and starts no thread.
    """

    def __init__(self, put: Callable[[Message], PutResult], broker_name: str, *, enabled: bool = True,
                 flush_interval_s: float = 0.2, batch_size: int = 256, max_buffered: int = 65_536) -> None:
        self._put = put
        self.broker_name = broker_name
        self.enabled = enabled
        # One writer at a time (the buffer's delivery): trace messages stay in event order.
        self._buffer: BatchBuffer[_Item] = BatchBuffer(f"sparkmq-trace-{broker_name}", self._write,
                                                       interval_s=flush_interval_s, batch_size=batch_size,
                                                       max_buffered=max_buffered)
        self.written = self.failed = self.messages = 0
        # A full disk or a closing store fails every batch: the first failure in full, then a summary a minute.
        self._store_failures = FailureLog(log, f"storing trace events of {broker_name}")
        self._build_failures = FailureLog(log, f"building trace events of {broker_name}")

    @property
    def recorded(self) -> int:
        """Events (and batch records, one each) accepted into the buffer."""
        return self._buffer.offered

    @property
    def dropped(self) -> int:
        """Events refused because the buffer was full."""
        return self._buffer.dropped

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the flush thread (no-op when disabled or started)."""
        if self.enabled:
            self._buffer.start()

    def stop(self) -> None:
        """Stop the flush thread after writing what is buffered (call before the store closes)."""
        self._buffer.stop()
        self._store_failures.flush()
        self._build_failures.flush()

    def flush(self) -> int:
        """Write every buffered event now; returns how many were written."""
        return self._buffer.flush()

    def status(self) -> dict[str, Any]:
        """Counters for ``/health``: events recorded, dropped (buffer full), written, failed to write."""
        return {"enabled": self.enabled, "recorded": self.recorded, "dropped": self.dropped,
                "written": self.written, "failed": self.failed, "messages": self.messages,
                "buffered": self._buffer.buffered, "last_error": self._store_failures.last_error}

    # -- the request path ---------------------------------------------------------------
    def _add(self, count: int, build: _Item) -> bool:
        if not self.enabled or count <= 0:
            return False
        return self._buffer.offer(build, count)

    def add_events(self, events: Sequence[TraceEvent]) -> bool:
        """Buffer ready-made events (posted by clients); all or none (False: buffer full or disabled)."""
        events = [e for e in events if e.topic != TRACE_TOPIC]
        return self._add(len(events), lambda: events)

    def stored(self, topic: str, results: Sequence[PutResult], messages: Sequence[Message],
               born_ts: int | None, status: str | None = None, detail: str | None = None) -> None:
        """``store`` events for messages put to ``topic`` (``results`` in the order of ``messages``).

        Status ``STORED``, or ``DELAYED`` for a message parked in the schedule or timer topic
        (its queue and offset are then the parked copy's); ``status`` overrides both.
        """
        if topic == TRACE_TOPIC or not self.enabled:
            return
        now = int(time.time() * 1000)

        def one(r: PutResult, m: Message) -> TraceEvent:
            parked = r.topic != topic
            return TraceEvent(r.msg_id, topic, "store", status or ("DELAYED" if parked else "STORED"),
                              r.store_timestamp or now, broker=self.broker_name, queue_id=r.queue_id,
                              queue_offset=r.queue_offset, store_ts=r.store_timestamp,
                              born_ts=born_ts if born_ts is not None else r.store_timestamp, tags=m.tags,
                              keys=_keys_text(m.keys), detail=detail or (f"parked in {r.topic}" if parked else None))

        def build() -> list[TraceEvent]:
            return [one(r, m) for r, m in zip(results, messages, strict=True) if r.msg_id]
        self._add(len(results), build)

    def appended(self, event: AppendEvent) -> None:
        """``store`` events for an append the broker noted as a send, a redelivery or a half message.

        A packed append becomes one ``store_batch`` record (see :meth:`stored_batch`).  Appends
        without a note (transaction ops, retry parking, dead letters, the trace topic itself) are
        not store events: their own events (``retry``, ``dlq``) tell their story.
        """
        note = event.note
        if note is None:
            return
        if event.packed is not None:
            self.stored_batch(note.topic or event.topic, event.packed, status=note.status, detail=note.detail)
        elif event.messages is not None:
            self.stored(note.topic or event.topic, event.results, event.messages, event.born_timestamp,
                        status=note.status, detail=note.detail)

    def stored_batch(self, topic: str, packed: PackedPutResult, status: str | None = None,
                     detail: str | None = None) -> None:
        """One ``store_batch`` record for a packed append to ``topic`` (as :meth:`stored` would say per message).

        Status ``STORED``, or ``DELAYED`` when the records went to another topic than ``topic``
        (a parked copy); ``status`` overrides both.  Costs the appending thread one closure.
        """
        if topic == TRACE_TOPIC or packed.topic == TRACE_TOPIC or not self.enabled:
            return

        def build() -> list[TraceBatch]:
            parked = packed.topic != topic
            first = packed.first_queue_offset
            return [TraceBatch("store_batch", topic, self.broker_name, packed.queue_id, first, first + packed.count,
                               packed.count, status or ("DELAYED" if parked else "STORED"), packed.store_timestamp,
                               store_ts=packed.store_timestamp, stored_topic=packed.topic if parked else None,
                               detail=detail or (f"parked in {packed.topic}" if parked else None))]
        self._add(1, build)

    def delivered(self, topic: str, group: str, client_id: str | None, messages: Sequence[StoredMessage]) -> None:
        """``deliver`` events: a pull of ``group`` returned ``messages``."""
        if topic == TRACE_TOPIC or not messages or not self.enabled:
            return
        now = int(time.time() * 1000)

        def build() -> list[TraceEvent]:
            return [TraceEvent(m.msg_id, topic, "deliver", "DELIVERED", now, group=group, client_id=client_id,
                               broker=self.broker_name, queue_id=m.queue_id, queue_offset=m.queue_offset,
                               store_ts=m.store_timestamp, born_ts=m.born_timestamp,
                               reconsume_times=m.reconsume_times, tags=m.tags, keys=_keys_text(m.keys))
                    for m in messages if m.msg_id]
        self._add(len(messages), build)

    def delivered_range(self, topic: str, group: str, client_id: str | None, queue_id: int, first_offset: int,
                        end_offset: int, count: int, tags: frozenset[str] | None = None) -> None:
        """One ``deliver_batch`` record: a packed pull of ``group`` answered ``count`` messages read from
        ``[first_offset, end_offset)`` of queue ``queue_id`` (with ``tags``, the ones whose tag hash matched).

        Nothing is decoded here: the trace job reads the range back and expands it.
        """
        if topic == TRACE_TOPIC or count <= 0 or not self.enabled:
            return
        now = int(time.time() * 1000)

        def build() -> list[TraceBatch]:
            return [TraceBatch("deliver_batch", topic, self.broker_name, queue_id, first_offset, end_offset, count,
                               "DELIVERED", now, group=group, client_id=client_id,
                               filter_tags=None if tags is None else sorted(tags))]
        self._add(1, build)

    def sent_back(self, original: StoredMessage, group: str, *, dead_letter: bool, destination: str,
                  result: PutResult, reconsume_times: int, delay_ms: int | None, reason: str) -> None:
        """A ``retry`` event (parked for ``delay_ms`` on its way to ``%RETRY%<group>``) or a ``dlq`` event."""
        if not self.enabled:
            return
        now = int(time.time() * 1000)
        topic = original.properties.get("RETRY_TOPIC", original.topic)
        if dead_letter:
            detail = f"to {destination}" + (f": {reason}" if reason else "")
        else:
            detail = f"to {destination} after {delay_ms} ms" + (f": {reason}" if reason else "")

        def build() -> list[TraceEvent]:
            return [TraceEvent(original.msg_id or result.msg_id, topic, "dlq" if dead_letter else "retry",
                               "DLQ" if dead_letter else "RETRY", now, group=group, broker=self.broker_name,
                               queue_id=result.queue_id, queue_offset=result.queue_offset,
                               store_ts=result.store_timestamp, born_ts=original.born_timestamp,
                               reconsume_times=reconsume_times, tags=original.tags,
                               keys=_keys_text(original.keys), detail=detail[:1024])]
        self._add(1, build)

    def transaction(self, half: StoredMessage, producer_group: str, action: str) -> None:
        """A ``transaction`` event: the half message was committed, rolled back or discarded."""
        if not self.enabled:
            return
        now = int(time.time() * 1000)
        topic = half.properties.get(PROPERTY_REAL_TOPIC, half.topic)

        def build() -> list[TraceEvent]:
            return [TraceEvent(half.msg_id, topic, "transaction", action, now, group=producer_group,
                               broker=self.broker_name, store_ts=half.store_timestamp, born_ts=half.born_timestamp,
                               tags=half.tags, keys=_keys_text(half.keys), detail="half message settled")]
        self._add(1, build)

    # -- the flush thread -----------------------------------------------------------------
    def _write(self, builders: list[_Item]) -> int:
        """Build the buffered events and batches and store them as trace messages; how many were written."""
        written = 0
        events: list[TraceEvent | TraceBatch] = []
        for index, build in enumerate(builders, 1):
            try:
                events.extend(build())
            except Exception as exc:  # a malformed event must not take the others with it
                self._build_failures.failure("%s: %s", type(exc).__name__, exc, exc_info=True)
            if len(events) >= MAX_EVENTS_PER_MESSAGE or (index == len(builders) and events):
                chunk, events = events[:MAX_EVENTS_PER_MESSAGE], events[MAX_EVENTS_PER_MESSAGE:]
                written += self._store_events(chunk)
                # Hand the GIL over between trace messages: the serving loop must not wait a whole
                # switch interval (5 ms) behind a long flush.
                time.sleep(0)
        while events:
            chunk, events = events[:MAX_EVENTS_PER_MESSAGE], events[MAX_EVENTS_PER_MESSAGE:]
            written += self._store_events(chunk)
        self.written += written
        return written

    def _store_events(self, chunk: list[TraceEvent | TraceBatch]) -> int:
        """Store ``chunk`` as one trace message (halves of it when it is larger than the store's
        ``max_message_size``); how many events that wrote (0 when the put failed)."""
        try:
            self._put(Message(TRACE_TOPIC, encode_events(chunk)))
        except Exception as exc:  # e.g. the disk is full or the store closing: count, do not retry forever
            if isinstance(exc, SparkMQError) and exc.code is ErrorCode.MESSAGE_TOO_LARGE and len(chunk) > 1:
                half = len(chunk) // 2
                return self._store_events(chunk[:half]) + self._store_events(chunk[half:])
            self.failed += len(chunk)
            self._store_failures.failure("%d events lost: %s", len(chunk), exc)
            return 0
        self._store_failures.success()
        self.messages += 1
        return len(chunk)


class TracedTransactionService(TransactionService):
    """The transaction service reporting every settled half (COMMIT, ROLLBACK, DISCARD) to a recorder."""

    def __init__(self, *args: Any, recorder: TraceRecorder, **kwargs: Any) -> None:
        self._recorder = recorder
        super().__init__(*args, **kwargs)

    def _settle(self, half: Any, action: str) -> None:
        # _settle is the one place all three outcomes pass (end() and the discard in run_once).
        super()._settle(half, action)
        if self._recorder.enabled:
            try:
                self._recorder.transaction(self._read_half(half.offset), half.group, action)
            except Exception:  # tracing must never fail a transaction that is already settled
                log.exception("tracing transaction %s failed", half.transaction_id)


# -- lookup --------------------------------------------------------------------------------------------

def _ms(value: dt.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


class TraceLookup:
    """Queries of ``<lake_root>/message_trace`` with delta-rs (no Spark on the request path)."""

    def __init__(self, lake_root: str | Path) -> None:
        self.lake_root = Path(lake_root)

    def events(self, msg_id: str) -> list[dict[str, Any]]:
        """Every event of ``msg_id`` as a JSON-ready dict (times in epoch ms), unordered; [] without a table."""
        if not isinstance(msg_id, str) or not msg_id or len(msg_id) > 256:
            raise SparkMQError(ErrorCode.MESSAGE_ID_ILLEGAL, "the message id must be 1-256 characters")
        try:
            dataset = DeltaTable(str(self.lake_root / MESSAGE_TRACE_TABLE)).to_pyarrow_dataset()
        except TableNotFoundError:
            return []  # the trace job has not written yet
        wanted = ds.field("msg_id") == msg_id
        # Pass 1 reads one column to find the files with the message; pass 2 reads only their rows.
        files = {batch.fragment.path for batch in dataset.scanner(columns=["msg_id"], filter=wanted).scan_batches()
                 if batch.record_batch.num_rows}
        if not files:
            return []
        found = pa.concat_tables([f.to_table(schema=dataset.schema, filter=wanted)
                                  for f in dataset.get_fragments() if f.path in files])
        found = found.drop_columns([c for c in ("event_date",) if c in found.column_names])
        for name in ("event_ts", "born_ts", "store_ts"):
            if name in found.column_names:
                millis = pc.divide(pc.cast(found[name], pa.int64()), 1000)
                found = found.set_column(found.column_names.index(name), name, millis)
        return [{k: v for k, v in row.items() if v is not None} for row in found.to_pylist()]

    def path(self, msg_id: str) -> list[dict[str, Any]]:
        """The message's path: :meth:`events` ordered, with elapsed times (see :func:`trace_path`)."""
        return trace_path(self.events(msg_id))

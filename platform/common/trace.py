"""Trace events: what happened to a message, when, where and how long it took.

Producers, consumers and brokers record :class:`TraceEvent` s; they travel as JSON
lines in the bodies of messages of ``RMQ_SYS_TRACE_TOPIC`` (many events per message),
and the trace job turns them into rows of the ``message_trace`` table, whose columns
are the fields below (times as epoch milliseconds here, timestamps in the table).

Event types follow a message's life: ``send`` (producer, with its cost), ``store``
(broker: queue and offset), ``deliver`` (broker: handed to a group in a pull),
``consume`` (consumer: status and cost), ``retry`` and ``dlq`` (broker, on send-back),
``transaction`` (broker: COMMIT / ROLLBACK / DISCARD of a half message).

A broker records a packed batch (a remoting batch send, a pull answered with the stored
records) as ONE :class:`TraceBatch` -- ``store_batch`` / ``deliver_batch``: the queue, the range
of queue offsets and what every message of it shares (time, group, client) -- instead of one
event per message, so tracing costs it no work per message.  The per-message fields only the
records hold (msg id, tags, keys, born time, reconsume count) are filled in by the trace job,
which reads that range back from the broker and expands the batch into the very rows the
per-message events would have given (``pipelines.trace_job.expand_batches``).  Batches travel in
the same JSON-lines bodies as events; :func:`decode_trace` reads both.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import msgspec

from .errors import ErrorCode, SparkMQError

__all__ = ["TraceEvent", "TraceBatch", "EVENT_TYPES", "BATCH_TYPES", "encode_events", "event_line", "decode_events",
           "decode_trace",
           "MAX_EVENTS_PER_MESSAGE", "event_order", "trace_path"]

EVENT_TYPES = ("send", "store", "deliver", "consume", "retry", "dlq", "transaction")
#: Batch records, each the events of one queue range (``store_batch`` -> ``store``, ``deliver_batch`` -> ``deliver``).
BATCH_TYPES = ("store_batch", "deliver_batch")
#: Events packed into one trace message (keeps trace messages well under the body limit).
MAX_EVENTS_PER_MESSAGE = 256


@dataclass(slots=True)
class TraceEvent:
    """One step of one message's path."""

    msg_id: str
    topic: str
    event_type: str
    status: str
    event_ts: int                      # epoch ms
    trace_id: str = ""                 # one send / one consume attempt; defaults to msg_id:event_type:event_ts
    group: str | None = None           # producer or consumer group
    client_id: str | None = None
    cost_ms: int | None = None
    born_ts: int | None = None
    store_ts: int | None = None
    broker: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    reconsume_times: int | None = None
    tags: str | None = None
    keys: str | None = None
    detail: str | None = None

    def __post_init__(self) -> None:
        if self.event_type not in EVENT_TYPES:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"trace event type must be one of {', '.join(EVENT_TYPES)}, got {self.event_type!r}")
        if not self.trace_id:
            self.trace_id = f"{self.msg_id}:{self.event_type}:{self.event_ts}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TraceEvent:
        """From JSON; unknown keys are ignored (newer writers), missing required ones are INVALID_ARGUMENT."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad trace event {dict(data)!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """JSON form without the empty fields.

        Every field is a plain value, so no ``dataclasses.asdict`` deep copy (~10x the cost, and
        brokers encode one event per stored and per delivered message).
        """
        return {name: value for name in _FIELD_NAMES if (value := getattr(self, name)) is not None}


_FIELD_NAMES = tuple(f.name for f in fields(TraceEvent))


@dataclass(slots=True)
class TraceBatch:
    """The ``store`` or ``deliver`` events of a run of one queue, recorded as one line.

    ``store_batch``: a packed append put ``count`` messages at queue offsets
    ``[first_offset, end_offset)`` (``end_offset = first_offset + count``) of ``stored_topic``
    (default ``topic``, the topic the producer addressed), all at ``store_ts``.
    ``deliver_batch``: a pull of ``group`` by ``client_id`` answered ``count`` messages read
    from ``[first_offset, end_offset)`` (``end_offset`` is the pull's next offset); with
    ``filter_tags`` those are the range's messages whose consume-queue tag hash matches one of
    the tags (the store's filter), else the whole range.  ``event_ts`` is the time every
    expanded event gets (store: the store time, deliver: the pull's time).
    """

    event_type: str
    topic: str
    broker: str
    queue_id: int
    first_offset: int
    end_offset: int
    count: int
    status: str
    event_ts: int                      # epoch ms
    store_ts: int | None = None
    group: str | None = None
    client_id: str | None = None
    filter_tags: list[str] | None = None
    stored_topic: str | None = None
    detail: str | None = None

    def __post_init__(self) -> None:
        if self.event_type not in BATCH_TYPES:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT,
                               f"trace batch type must be one of {', '.join(BATCH_TYPES)}, got {self.event_type!r}")

    @property
    def expands_to(self) -> str:
        """The event type of the rows this batch becomes: ``store`` or ``deliver``."""
        return self.event_type.removesuffix("_batch")

    @property
    def source_topic(self) -> str:
        """The topic whose queue holds the records."""
        return self.stored_topic or self.topic

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TraceBatch:
        """From JSON; INVALID_ARGUMENT for a missing field, a wrong type or a range that does not add up."""
        known = {f.name for f in fields(cls)}
        try:
            batch = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad trace batch {dict(data)!r}: {exc}") from None
        def count_like(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        ok = (all(map(count_like, (batch.queue_id, batch.first_offset, batch.end_offset, batch.count, batch.event_ts)))
              and all(isinstance(v, str) and v for v in (batch.topic, batch.broker, batch.status))
              and 0 < batch.count <= batch.end_offset - batch.first_offset
              and (batch.store_ts is None or count_like(batch.store_ts))
              and all(v is None or isinstance(v, str)
                      for v in (batch.group, batch.client_id, batch.stored_topic, batch.detail))
              and (batch.filter_tags is None or (isinstance(batch.filter_tags, list)
                                                 and all(isinstance(t, str) for t in batch.filter_tags))))
        if not ok:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"bad trace batch {dict(data)!r}")
        return batch

    def to_dict(self) -> dict[str, Any]:
        """JSON form without the empty fields."""
        return {name: value for name in _BATCH_FIELD_NAMES if (value := getattr(self, name)) is not None}


_BATCH_FIELD_NAMES = tuple(f.name for f in fields(TraceBatch))


_encode_json = msgspec.json.Encoder().encode


def event_line(event: TraceEvent | TraceBatch) -> bytes:
    """One event or batch as one compact JSON line (msgspec: a third of ``json.dumps``' cost, and the
    broker's trace thread encodes a line for every batch it stores and delivers)."""
    return _encode_json(event.to_dict())


def encode_events(events: Iterable[TraceEvent | TraceBatch]) -> bytes:
    """JSON lines, one event or batch each (a trace message's body)."""
    return b"\n".join(map(event_line, events))


def decode_trace(body: bytes) -> list[TraceEvent | TraceBatch]:
    """The events and batches of a trace message's body, in order; INVALID_ARGUMENT for a line that is neither."""
    out: list[TraceEvent | TraceBatch] = []
    for number, line in enumerate(body.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"trace line {number} is not JSON: {exc}") from None
        if not isinstance(data, Mapping):
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"trace line {number} is not an object")
        out.append(TraceBatch.from_dict(data) if data.get("event_type") in BATCH_TYPES else TraceEvent.from_dict(data))
    return out


def decode_events(body: bytes) -> list[TraceEvent]:
    """The events of a trace message's body; INVALID_ARGUMENT for a line that is not an event.

    Batch lines (:class:`TraceBatch`, what a broker records for packed batches) are left out:
    only the trace job can expand them; :func:`decode_trace` returns them too.
    """
    return [e for e in decode_trace(body) if isinstance(e, TraceEvent)]


# -- a message's path ---------------------------------------------------------------------

_STEP_RANK = {name: rank for rank, name in enumerate(("send", "transaction", "store", "deliver", "consume",
                                                      "retry", "dlq"))}


def event_order(event: Mapping[str, Any]) -> tuple[int, int]:
    """Sort key of an event: its time, then its place in a message's life (send before store, ...)."""
    return int(event["event_ts"]), _STEP_RANK.get(str(event["event_type"]), len(EVENT_TYPES))


def trace_path(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Events in order, each with ``elapsed_ms`` since the previous step and ``since_first_ms``.

    Identical events (the same event found in two brokers' tables) are kept once.
    """
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in events:
        row = {k: v for k, v in event.items() if v is not None and k not in ("elapsed_ms", "since_first_ms")}
        unique.setdefault(tuple(sorted(row.items())), row)
    ordered = sorted(unique.values(), key=event_order)
    out: list[dict[str, Any]] = []
    for i, row in enumerate(ordered):
        ts = int(row["event_ts"])
        row["elapsed_ms"] = 0 if i == 0 else ts - int(ordered[i - 1]["event_ts"])
        row["since_first_ms"] = ts - int(ordered[0]["event_ts"])
        out.append(row)
    return out

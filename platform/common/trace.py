"""Trace events: what happened to a message, when, where and how long it took.

Producers, consumers and brokers record :class:`TraceEvent` s; they travel as JSON
lines in the bodies of messages of ``RMQ_SYS_TRACE_TOPIC`` (many events per message),
and the trace job turns them into rows of the ``message_trace`` table, whose columns
are the fields below (times as epoch milliseconds here, timestamps in the table).

Event types follow a message's life: ``send`` (producer, with its cost), ``store``
(broker: queue and offset), ``deliver`` (broker: handed to a group in a pull),
``consume`` (consumer: status and cost), ``retry`` and ``dlq`` (broker, on send-back),
``transaction`` (broker: COMMIT / ROLLBACK / DISCARD of a half message).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import ErrorCode, SparkMQError

__all__ = ["TraceEvent", "EVENT_TYPES", "encode_events", "decode_events", "MAX_EVENTS_PER_MESSAGE", "event_order",
           "trace_path"]

EVENT_TYPES = ("send", "store", "deliver", "consume", "retry", "dlq", "transaction")
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


def encode_events(events: Iterable[TraceEvent]) -> bytes:
    """JSON lines, one event each (a trace message's body)."""
    return "\n".join(json.dumps(e.to_dict(), separators=(",", ":")) for e in events).encode("utf-8")


def decode_events(body: bytes) -> list[TraceEvent]:
    """The events of a trace message's body; INVALID_ARGUMENT for a line that is not an event."""
    out = []
    for number, line in enumerate(body.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SparkMQError(ErrorCode.INVALID_ARGUMENT, f"trace line {number} is not JSON: {exc}") from None
        out.append(TraceEvent.from_dict(data))
    return out


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

"""Trace events round-trip through trace-message bodies; bad ones are refused with stable codes."""
from __future__ import annotations

import pytest

from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.trace import TraceEvent, decode_events, encode_events


def test_events_round_trip_and_default_trace_id() -> None:
    events = [TraceEvent("ID1", "Orders", "send", "SEND_OK", 1000, group="pg", cost_ms=3, tags="A"),
              TraceEvent("ID1", "Orders", "store", "OK", 1001, broker="broker-a", queue_id=2, queue_offset=7),
              TraceEvent("ID1", "Orders", "consume", "RECONSUME_LATER", 1500, group="cg", detail="boom")]
    decoded = decode_events(encode_events(events))
    assert decoded == events
    assert decoded[0].trace_id == "ID1:send:1000"
    assert "queue_id" not in events[0].to_dict()  # empty fields stay off the wire


def test_bad_events_are_refused() -> None:
    with pytest.raises(SparkMQError) as err:
        TraceEvent("ID1", "Orders", "teleport", "OK", 1)
    assert err.value.code is ErrorCode.INVALID_ARGUMENT
    for body in (b"not json", b'{"msg_id": "x"}', b'{"msg_id":"x","topic":"t","event_type":"nope","status":"s",'
                                                   b'"event_ts":1}'):
        with pytest.raises(SparkMQError) as err:
            decode_events(body)
        assert err.value.code is ErrorCode.INVALID_ARGUMENT
    assert decode_events(b'{"msg_id":"x","topic":"t","event_type":"send","status":"s","event_ts":1,"new":1}\n')

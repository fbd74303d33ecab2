"""Trace events and batch records round-trip through trace-message bodies; bad ones are refused with stable
codes; the trace job's expansion of batch records gives the rows per-message events give."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkmq.pipelines.tables import MESSAGE_TRACE, get_spec
from sparkmq.pipelines.trace_job import events_table, expand_batches
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import Message
from sparkmq.platform.common.system_topics import TRACE_TOPIC
from sparkmq.platform.common.trace import TraceBatch, TraceEvent, decode_events, decode_trace, encode_events
from sparkmq.platform.common.wire import PULL_SCHEMA
from sparkmq.platform.store import PutResult, PutStatus
from sparkmq.storage_native import encode_batch

BORN = 1_700_000_000_000
MONTH = 1_698_796_800_000  # 2023-11-01T00:00Z
PREFIX = "7F00000112349ABCDEF0"


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


# -- batch records: one per packed batch, expanded by the trace job ------------------------------------

def test_batch_records_round_trip_and_bad_ones_are_refused() -> None:
    store = TraceBatch("store_batch", "Orders", "broker-a", 2, 10, 15, 5, "STORED", 1000, store_ts=1000)
    deliver = TraceBatch("deliver_batch", "Orders", "broker-a", 2, 10, 20, 3, "DELIVERED", 1010, group="cg",
                         client_id="c1", filter_tags=["A", "B"])
    event = TraceEvent("ID1", "Orders", "send", "SEND_OK", 1000)
    body = encode_events([event, store, deliver])
    assert decode_trace(body) == [event, store, deliver]
    assert decode_events(body) == [event]  # batches only mean something to the trace job
    assert (store.expands_to, deliver.expands_to) == ("store", "deliver")
    assert "group" not in store.to_dict()
    good = store.to_dict()
    for bad in ({**good, "count": 0}, {**good, "count": 6}, {**good, "queue_id": True}, {**good, "topic": ""},
                {**good, "filter_tags": "A"}, {**good, "event_type": "teleport_batch"}, {"event_type": "store_batch"}):
        with pytest.raises(SparkMQError) as err:
            decode_trace(json.dumps(bad).encode())
        assert err.value.code is ErrorCode.INVALID_ARGUMENT, bad


def _pulled(rows: list[dict[str, Any]]) -> pa.Table:
    full = [{"topic": "T", "broker_name": "broker-a", "queue_id": 0, "offset_msg_id": "x", "commitlog_offset": 0,
             "store_size": 1, "body": b"", "properties": [], "born_host": "h", "store_host": "h", "sys_flag": 0,
             "tags": None, "keys": None, **r} for r in rows]
    return pa.Table.from_pylist(full, schema=PULL_SCHEMA)


def test_expansion_reads_each_queue_range_once_and_cuts_out_each_batch() -> None:
    # Queue 0 holds offsets 0..9; 7..9 are gone (retention) by the time the job reads.
    stored = [{"queue_offset": i, "msg_id": "" if i == 3 else f"M{i}", "tags": "A" if i % 2 else "B",
               "keys": "  k1   k2 " if i == 1 else ("" if i == 2 else f"k{i}"), "born_timestamp": 100 + i,
               "store_timestamp": 500, "reconsume_times": 1 if i == 4 else 0} for i in range(7)]
    reads: list[tuple[Any, ...]] = []

    def read(broker: str, topic: str, queue_id: int, start: int, end: int) -> tuple[pa.Table, list[tuple[int, int]]]:
        reads.append((broker, topic, queue_id, start, end))
        table = _pulled([r for r in stored if start <= r["queue_offset"] < end])
        return table, [(7, end)] if end > 7 else []

    batches = [TraceBatch("store_batch", "T", "broker-a", 0, 0, 5, 5, "STORED", 500, store_ts=500),
               TraceBatch("store_batch", "T", "broker-a", 0, 5, 10, 5, "STORED", 500, store_ts=500),
               TraceBatch("deliver_batch", "T", "broker-a", 0, 0, 6, 3, "DELIVERED", 900, group="g", client_id="c",
                          filter_tags=["A"])]
    table = expand_batches(batches, read)
    assert reads == [("broker-a", "T", 0, 0, 10)]  # three batches, one read of the merged range
    rows = sorted(table.to_pylist(), key=lambda r: (r["event_type"], r["queue_offset"]))
    store = [r for r in rows if r["event_type"] == "store"]
    deliver = [r for r in rows if r["event_type"] == "deliver"]
    assert [r["msg_id"] for r in store] == ["M0", "M1", "M2", "M4", "M5", "M6"]  # no id (3): no row; 7..9 gone
    assert [r["msg_id"] for r in deliver] == ["M1", "M5"]  # the tag filter (hash of "A") over [0, 6)
    assert [r["keys"] for r in store[:3]] == ["k0", "k1 k2", None]  # as " ".join(m.keys) or None
    assert {r["client_id"] for r in deliver} == {"c"} and {r["group"] for r in store} == {None}
    assert [r["reconsume_times"] for r in store] == [None] * 6
    assert [r["trace_id"] for r in deliver] == ["M1:deliver:900", "M5:deliver:900"]
    assert table.schema == get_spec(MESSAGE_TRACE).schema
    assert expand_batches([], read).num_rows == 0


def test_packed_batches_trace_one_record_each_and_expand_to_the_per_message_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker records a packed send and a packed pull as one record each; expanded, they give exactly
    the rows the per-message events (the recorder's Python paths) give for the same messages."""
    from sparkmq.platform.broker import trace as broker_trace
    from sparkmq.platform.broker.broker import Broker
    from sparkmq.platform.broker.config import BrokerConfig

    broker = Broker(BrokerConfig(port=10911, data_dir=tmp_path, store={"segment_size": 8 << 20})).start(register=False)
    try:
        sends = [[Message("Packed", f"{b}-{i}".encode(), tags="TagA" if i % 2 else "TagB",
                          keys=(f"order-{b}-{i}", "shared")) for i in range(n)] for b, n in enumerate((5, 3, 4))]
        for b, batch in enumerate(sends):
            data, _ids, _ = encode_batch(batch, PREFIX, MONTH, b * 100, BORN + b)
            broker.send_processor.send_packed("Packed", data, len(batch), queue_id=0)
        pulls = broker.pull_processor
        everything = pulls.pull_packed_once("Packed", 0, 0, 32, group="g1", client_id="client-1")
        tag_a = pulls.pull_packed_once("Packed", 0, 2, 32, frozenset({"TagA"}), group="g2", client_id="client-2")
        assert (everything.count, tag_a.count) == (12, 4)  # TagA: offsets 3, 6, 9, 11
        broker.tracer.flush()
        records = [r for m in broker.pull_processor.pull_once(TRACE_TOPIC, 0, 0, 100).messages
                   for r in decode_trace(m.body)]
        # One record per batch sent and per pull answered: nothing per message.
        assert [r.event_type for r in records] == ["store_batch"] * 3 + ["deliver_batch"] * 2
        assert [(r.first_offset, r.end_offset, r.count) for r in records] == [(0, 5, 5), (5, 8, 3), (8, 12, 4),
                                                                                (0, 12, 12), (2, 12, 4)]
        assert (records[3].client_id, records[4].client_id, records[4].filter_tags) == ("client-1", "client-2",
                                                                                        ["TagA"])

        def read(name: str, topic: str, queue_id: int, start: int, end: int) -> tuple[pa.Table, list[Any]]:
            _result, batch = pulls.pull_arrow_once(topic, queue_id, start, end - start)
            return pa.Table.from_batches([batch]), []

        expanded = expand_batches([r for r in records if isinstance(r, TraceBatch)], read)

        # The same messages through the per-message paths (HTTP sends, Python pulls).
        written: list[Any] = []
        per_message = broker_trace.TraceRecorder(lambda m: written.append(m), broker.name)  # type: ignore[arg-type]
        stored = broker.store.get_messages("Packed", 0, 0, 32).messages
        for b in range(3):
            of_batch = [m for m in stored if records[b].first_offset <= m.queue_offset < records[b].end_offset]
            per_message.stored("Packed", [PutResult(PutStatus.PUT_OK, m.msg_id, m.offset_msg_id, m.topic, m.queue_id,
                                                    m.queue_offset, m.commitlog_offset, m.store_timestamp,
                                                    m.store_size) for m in of_batch],
                               of_batch, BORN + b)
        for record, group, client, messages in ((records[3], "g1", "client-1", stored),
                                                (records[4], "g2", "client-2",
                                                 [m for m in stored if m.queue_offset >= 2 and m.tags == "TagA"])):
            monkeypatch.setattr(broker_trace.time, "time", lambda ts=record.event_ts: (ts + 0.5) / 1000)
            per_message.delivered("Packed", group, client, messages)
            monkeypatch.undo()
        per_message.flush()
        expected = events_table([e for m in written for e in decode_events(m.body)])

        def rows(table: pa.Table) -> list[dict[str, Any]]:
            return sorted(table.to_pylist(), key=lambda r: (r["event_type"], r["group"] or "", r["queue_offset"]))
        assert expected.num_rows == expanded.num_rows == 12 + 12 + 4
        assert rows(expanded) == rows(expected)
        assert {r["keys"] for r in rows(expanded)} >= {"order-0-1 shared"}
    finally:
        broker.shutdown()

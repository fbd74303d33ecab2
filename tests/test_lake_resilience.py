"""Principle 1: delivery never waits for Spark.  Kill the broker's JVM; messages keep flowing.

A real broker process with ``--lake``: once its dispatch job runs, the broker's ``java``
child (the Spark driver JVM, spawned by PySpark) is killed with SIGKILL.  Sends and pulls
through the broker go on without an error, ``/health`` reports the lake as not healthy while
the broker itself still serves, and SIGTERM then stops the broker cleanly (exit 0).

Also here: the columnar Arrow pull (``MessageStore.get_arrow``, what the Spark source reads)
gives exactly the rows of the object path (``get_messages`` + ``wire.stored_to_arrow``).
"""
from __future__ import annotations

import os
import signal
import time
import zlib
from pathlib import Path

import httpx
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procs import ProcessHarness, wait_until
from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.common import wire
from sparkmq.platform.common.message import Message
from sparkmq.platform.common.record_columns import RECORDS_SCHEMA, decode_records, map_value
from sparkmq.platform.common.sysflag import COMPRESSED

LAKE = """
[lake]
trigger_interval_s = 0.5
jobs = ["dispatch"]   # the job the test watches; the rest would only share the core
[lake.spark_conf]
"spark.master" = "local[1]"
"""



def _jvm_children(pid: int) -> list[psutil.Process]:
    out = []
    for child in psutil.Process(pid).children(recursive=False):
        try:
            if child.name() == "java" or (child.cmdline()[:1] and child.cmdline()[0].endswith("java")):
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_messages_flow_after_spark_is_killed(procs: ProcessHarness, tmp_path: Path) -> None:
    (tmp_path / "lake.toml").write_text(LAKE)
    broker = procs.start("broker", "sparkmq.api.broker_main", "--config", str(tmp_path / "lake.toml"), "--lake",
                         "--data-dir", str(tmp_path / "broker"), "--broker-name", "broker-a")
    http = httpx.Client(base_url=broker.url, timeout=10)
    client = BrokerClient(broker.addr, 10.0)
    try:
        client.send("Flow", {"body": "before", "queue_id": 0})
        wait_until(lambda: http.get("/health").json()["lake"]["jobs"]["dispatch"]["state"] == "running", 180,
                   "the dispatch job to run")
        jvms = wait_until(lambda: _jvm_children(broker.proc.pid), 30, "the broker's java child")
        assert len(jvms) == 1, jvms
        jvm = jvms[0]
        # The lake's default priority: SCHED_IDLE, Spark takes only the CPU the broker leaves idle.
        assert os.sched_getscheduler(jvm.pid) == os.SCHED_IDLE
        os.kill(jvm.pid, signal.SIGKILL)
        # The JVM is the broker's child, not ours: dead means gone or a zombie until the broker reaps it.
        wait_until(lambda: not jvm.is_running() or jvm.status() == psutil.STATUS_ZOMBIE, 10, "the JVM to die")

        # Messages keep flowing: a few hundred sent and consumed (group offsets committed) without an error.
        sent, received = 0, []
        offset = 1  # "before" is at offset 0
        deadline = time.monotonic() + 6.0
        while sent < 300 or time.monotonic() < deadline:
            for _ in range(10):
                client.send("Flow", {"body": f"m{sent}", "queue_id": 0})
                sent += 1
            page = client.pull("Flow", 0, offset, 64, group="flow-group")
            received.extend(m.body for m in page.messages)
            offset = page.next_offset
            client.commit_offsets("flow-group", [{"topic": "Flow", "queue_id": 0, "offset": offset}])
            time.sleep(0.01)
        while offset < sent + 1:
            page = client.pull("Flow", 0, offset, 256, group="flow-group")
            received.extend(m.body for m in page.messages)
            offset = page.next_offset
        assert received == [f"m{i}".encode() for i in range(sent)]
        assert sent >= 300

        # The lake is reported down; the broker is up and still serving.
        health = wait_until(lambda: (h := http.get("/health").json()) and not h["lake"]["ok"] and h, 120,
                            "the lake to be reported unhealthy")
        assert health["status"] == "degraded" and health["state"] == "running"
        assert health["store"]["ok"] is True
        assert client.send("Flow", {"body": "after", "queue_id": 0})["queue_offset"] == sent + 1
    finally:
        http.close()
        client.close()
    assert broker.stop(timeout=60) == 0, broker.log()[-4000:]


def test_columnar_pull_matches_the_object_path(impl, store_factory) -> None:
    store = store_factory(impl_module=impl)
    big = b"compressible " * 500
    for i in range(300):
        body = zlib.compress(big) if i == 7 else b"body-%d" % i
        props = {"n": str(i), "empty": ""} if i % 3 else {}
        msg = Message("Cols", body, tags="TagA" if i % 2 else None, keys=(f"k{i}", "x") if i % 4 else (),
                      properties=props)
        store.put(msg, 1, born_host="10.1.2.3:4567" if i % 5 else "[::1]:99", sys_flag=COMPRESSED if i == 7 else 0,
                  reconsume_times=i % 3)
    for offset, count in ((0, 300), (5, 17), (299, 10)):
        expected = store.get_messages("Cols", 1, offset, count)
        result, batch = store.get_arrow("Cols", 1, offset, count, broker_name="broker-z")
        assert (result.status, result.next_offset, result.min_offset, result.max_offset) == \
            (expected.status, expected.next_offset, expected.min_offset, expected.max_offset)
        assert batch.equals(wire.stored_to_arrow(expected.messages, "broker-z"))
        # The records form: the stored bytes, decoded by the reader into the same rows.
        same, records = store.get_arrow("Cols", 1, offset, count, decode=False)
        assert same.next_offset == result.next_offset and records.schema.equals(RECORDS_SCHEMA)
        assert decode_records(records.column("record"), "broker-z").equals(batch)
        # ... also from a slice of a larger array (offsets not starting at zero).
        if count > 2:
            assert decode_records(records.column("record").slice(1), "broker-z").equals(batch.slice(1))
    empty, batch = store.get_arrow("Cols", 1, 300, 5)
    assert str(empty.status) == "NO_NEW_MSG" and batch.num_rows == 0 and batch.schema == wire.PULL_SCHEMA


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["A", "B", "KEYS", ""]), st.text(max_size=3)),
                                              max_size=4)), max_size=30),
       st.integers(0, 5))
def test_map_value_is_map_lookup(maps: list, cut: int) -> None:
    """map_value gives pc.map_lookup(..., "first" / "last") on any map array, NULL maps and slices included."""
    array = pa.array(maps, pa.map_(pa.string(), pa.string()))
    array = array.slice(min(cut, len(array)))
    for key in ("A", "KEYS", "", "missing"):
        assert map_value(array, key).equals(pc.map_lookup(array, key, "first"))
        for occurrence in ("first", "last"):
            assert map_value(array, key, occurrence).equals(pc.map_lookup(array, key, occurrence))

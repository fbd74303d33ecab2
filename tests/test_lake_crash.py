"""Exactly once and the visibility rule through crashes: Spark drivers killed with SIGKILL mid-batch.

1. A real broker process runs its lake (``--lake``: a SparkSession with the dispatch, trace and dlq jobs in
   the broker process) over a backlog cut into small micro-batches.  The test watches the dispatch job's
   Spark checkpoint and, while a batch is in flight (its ``offsets/N`` written, its ``commits/N`` not yet),
   waits a random moment and SIGKILLs the broker with its Spark JVM and Python workers -- landing in the
   tasks' file writes, between the tables' commits, or before the checkpoint's commit.  After each kill,
   with nothing running, no ``consume_queue`` or ``message_keys`` row lacks its ``messages`` row.  The
   broker is restarted on the same data directory and checkpoints (the store recovers, Spark replays the
   interrupted batch, Delta's txnAppId/txnVersion skip what a table already holds) and killed again,
   several times.  At the end every acknowledged message is in ``messages``, ``consume_queue`` and
   ``message_keys`` exactly once, every dead letter in ``dead_letters`` once, and ``message_trace`` holds
   exactly the rows the trace topic's records give.
2. A dispatch driver (a child process) kills itself right after the ``messages`` commit of a batch, before
   ``consume_queue`` and ``message_keys``: the tables then hold that batch in ``messages`` only; a reader
   polling the tables the whole time (``consume_queue`` / ``message_keys`` first, ``messages`` after) never
   saw an index row without its message; a restart with the same checkpoint completes the batch, once.
3. A report run killed between its ``group_stats`` and ``topic_stats`` commits is completed once by the next.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from procs import LAKE_TABLE, ProcessHarness, ServiceProcess, jvm_child_env, wait_until
from sparkmq.pipelines import tables
from sparkmq.pipelines.cluster_io import Endpoints, pull_queue_range
from sparkmq.pipelines.dispatch import dispatch_app_id
from sparkmq.pipelines.trace_job import BrokerRangeReader, trace_rows
from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.common.system_topics import TRACE_TOPIC

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

TESTS = Path(__file__).resolve().parent
TOPIC = "CrashLake"
GROUP = "crash-group"
QUEUES = 4
KILLS = 3
# A round commits one batch (the replay of the batch killed before) and kills the next, so the lake falls
# PER_ROUND - BATCH_LIMIT further behind each round and the last restart catches up on the rest: 4,500 messages
# (3 batches) with 3,000 a round; 6,000 a round left 13,500 (~10 batches, 60-90 s here) and proved nothing more.
# Two batches a round still leave data waiting beyond the batch in flight: a replay reading past its planned
# range would show.
PER_ROUND = 3000
PER_REQUEST = 250
DEAD_PER_ROUND = 20
BATCH_LIMIT = 1500  # messages per micro-batch: a round's backlog takes two batches
# The visibility reader pauses between reads: reading the three tables takes a core for about as long, and the
# Spark drivers it watches need the cores (without the pause its process took 89 s of its test's ~285 s of CPU).
READER_PAUSE_S = 0.1

CONFIG = f"""
[store]
segment_size = 4194304
{LAKE_TABLE}trigger_interval_s = 0.2
max_messages_per_trigger = {BATCH_LIMIT}
jobs = ["dispatch", "trace", "dlq"]
[lake.spark_conf]
"spark.master" = "local[1]"
"""

Place = tuple[str, str, int, int]   # topic, broker, queue_id, queue_offset
_PLACE = ["topic", "broker", "queue_id", "queue_offset"]


def _batch_ids(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.is_dir() else set()


def _in_flight(checkpoint: Path, done_before: set[int]) -> int | None:
    """A batch the job has planned (offsets/N) but not finished (no commits/N), not seen finished before."""
    planned = _batch_ids(checkpoint / "offsets") - _batch_ids(checkpoint / "commits") - done_before
    return max(planned) if planned else None


def _kill_with_children(broker: ServiceProcess) -> None:
    """SIGKILL the broker, then whatever it started (Spark's JVM and Python workers): a whole-process crash."""
    try:
        children = psutil.Process(broker.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    broker.kill9()
    for child in children:
        try:
            child.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(children, timeout=10)


def _send_round(addr: str, round_no: int) -> dict[str, tuple[int, int, str]]:
    """PER_ROUND messages over the queues, each with one key; msg_id -> (queue_id, queue_offset, key).  The
    first DEAD_PER_ROUND go on to the dead-letter queue too."""
    client = BrokerClient(addr, 30.0)
    acked: dict[str, tuple[int, int, str]] = {}
    try:
        for request in range(PER_ROUND // PER_REQUEST):
            queue_id = request % QUEUES
            keys = [f"r{round_no}-m{request * PER_REQUEST + i}" for i in range(PER_REQUEST)]
            answer = client.send_batch(TOPIC, {"queue_id": queue_id},
                                       messages=[{"body": f"body of {k}", "keys": [k]} for k in keys])
            assert answer["status"] == "SEND_OK", answer
            for key, result in zip(keys, answer["results"], strict=True):
                acked[result["msg_id"]] = (queue_id, result["queue_offset"], key)
                if len(acked) <= DEAD_PER_ROUND:
                    client.send_back(GROUP, result["offset_msg_id"], delay_level=-1, reason=f"poison {key}")
    finally:
        client.close()
    return acked


def _places(lake: Path, name: str) -> list[Place]:
    table = DeltaTable(tables.table_path(lake, name)).to_pyarrow_table(columns=_PLACE)
    return list(zip(*(table.column(c).to_pylist() for c in _PLACE), strict=True))


def _assert_visibility(lake: Path, context: str) -> None:
    """Every consume_queue and message_keys row read now has its message in messages read after it."""
    index = set(_places(lake, tables.CONSUME_QUEUE)) | set(_places(lake, tables.MESSAGE_KEYS))
    messages = set(_places(lake, tables.MESSAGES))
    missing = index - messages
    assert not missing, f"{len(missing)} index rows without their message, e.g. {sorted(missing)[:3]}; {context}"


def _count(lake: Path, name: str) -> int:
    """Rows in a table now (0 before it exists)."""
    try:
        return DeltaTable(tables.table_path(lake, name)).to_pyarrow_table(columns=["msg_id"]).num_rows
    except Exception:  # noqa: BLE001 -- not created yet
        return 0


def _table(lake: Path, name: str, columns: list[str], topic: str = TOPIC) -> pa.Table:
    return DeltaTable(str(tables.table_path(lake, name))).to_pyarrow_table(
        columns=columns, filters=[("topic", "=", topic)])


def test_every_table_once_through_repeated_sigkills_mid_batch(procs: ProcessHarness, tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    (tmp_path / "broker.toml").write_text(CONFIG)
    data_dir = tmp_path / "broker"
    lake = data_dir / "lake"
    checkpoint = lake / "_checkpoints" / "dispatch"
    # Restarts reuse the HTTP port; remoting takes any free port (a default of port + 2 was never reserved, and
    # another process's connection may hold it by then) and there is no slave to serve HA to.
    args = ["--config", str(tmp_path / "broker.toml"), "--lake", "--data-dir", str(data_dir),
            "--broker-name", "broker-a", "--remoting-port", "0", "--ha-port", "-1"]
    broker = procs.start("broker", "sparkmq.api.broker_main", *args)
    port = broker.port
    client = BrokerClient(broker.addr, 30.0)
    client.create_topic({"topic": TOPIC, "read_queue_nums": QUEUES, "write_queue_nums": QUEUES})
    client.close()

    acked: dict[str, tuple[int, int, str]] = {}
    finished: set[int] = set()          # batches seen committed in the checkpoint before a kill
    interrupted: list[tuple[int, float]] = []
    for round_no in range(KILLS):
        acked.update(_send_round(broker.addr, round_no))
        started = time.monotonic()
        while True:  # wait for a batch in flight, a random moment into it, then kill
            assert time.monotonic() - started < 400, f"no batch in flight within 400 s (seed {seed})\n" + \
                broker.log()[-3000:]
            # Not a batch interrupted before: its replay is planned at the restart, before Spark even runs.
            batch = _in_flight(checkpoint, finished | {b for b, _ in interrupted})
            if batch is None:
                time.sleep(0.005)
                continue
            delay = rng.uniform(0.0, 1.5)
            time.sleep(delay)
            _kill_with_children(broker)
            _assert_visibility(lake, f"seed {seed}, killed in batch {batch} after {delay:.3f} s")
            if (checkpoint / "commits" / str(batch)).exists():  # it finished first: the next batch then
                finished |= _batch_ids(checkpoint / "commits")
                broker = procs.start("broker", "sparkmq.api.broker_main", *args, "--port", str(port))
                continue
            interrupted.append((batch, round(delay, 3)))
            break
        finished |= _batch_ids(checkpoint / "commits")
        broker = procs.start("broker", "sparkmq.api.broker_main", *args, "--port", str(port))

    assert len(interrupted) == KILLS
    assert len(acked) == KILLS * PER_ROUND
    # The last restart catches up; then every table holds each message once.
    wait_until(lambda: len(_table(lake, tables.CONSUME_QUEUE, ["queue_offset"])) >= len(acked), 400,
               "the lake to catch up after the last restart")
    dead_expected = KILLS * DEAD_PER_ROUND
    wait_until(lambda: _count(lake, tables.DEAD_LETTERS) >= dead_expected, 400, "the dead letters")
    time.sleep(3.0)  # a replay that would write twice gets its chance
    trace_expected = _expected_trace_rows(broker.addr)
    assert broker.stop(timeout=60) == 0
    context = f"seed {seed}, interrupted batches (id, delay s) {interrupted}"
    _assert_visibility(lake, context)

    expected = Counter((q, off) for q, off, _ in acked.values())
    cq = _table(lake, tables.CONSUME_QUEUE, ["queue_id", "queue_offset"])
    got = Counter(zip(cq.column("queue_id").to_pylist(), cq.column("queue_offset").to_pylist(), strict=True))
    assert got == expected, context

    msgs = _table(lake, tables.MESSAGES, ["msg_id", "queue_id", "queue_offset", "body"])
    assert msgs.num_rows == len(acked), context
    rows = {m: (q, o, b) for m, q, o, b in zip(*(msgs.column(c).to_pylist() for c in msgs.column_names),
                                                 strict=True)}
    assert rows == {m: (q, o, f"body of {k}".encode()) for m, (q, o, k) in acked.items()}, context

    keys = _table(lake, tables.MESSAGE_KEYS, ["key", "key_type", "queue_id", "queue_offset"])
    by_type = {t: keys.filter(pc.equal(keys.column("key_type"), t)) for t in ("msg_id", "key")}
    assert by_type["msg_id"].num_rows + by_type["key"].num_rows == keys.num_rows
    assert Counter(by_type["msg_id"].column("key").to_pylist()) == Counter(acked.keys()), context
    key_rows = Counter(zip(*(by_type["key"].column(c).to_pylist() for c in ("key", "queue_id", "queue_offset")),
                           strict=True))
    assert key_rows == Counter((k, q, o) for q, o, k in acked.values()), context

    dead = DeltaTable(tables.table_path(lake, tables.DEAD_LETTERS)).to_pyarrow_table(
        columns=["msg_id", "dlq_queue_id", "dlq_offset", "original_topic"])
    dead_ids = [m for round_no in range(KILLS) for m in list(acked)[round_no * PER_ROUND:][:DEAD_PER_ROUND]]
    assert Counter(dead.column("msg_id").to_pylist()) == Counter(dead_ids), context
    assert len(set(zip(dead.column("dlq_queue_id").to_pylist(), dead.column("dlq_offset").to_pylist(),
                       strict=True))) == dead.num_rows == dead_expected, context

    trace = DeltaTable(tables.table_path(lake, tables.MESSAGE_TRACE)).to_pyarrow_table(
        columns=["trace_id", "msg_id", "event_type"])
    got_trace = Counter(zip(*(trace.column(c).to_pylist() for c in trace.column_names), strict=True))
    assert sum(trace_expected.values()) > 0 and got_trace == trace_expected, context


def _expected_trace_rows(addr: str) -> Counter:
    """The message_trace rows the trace topic's records give (every record expanded once), read back now."""
    client = BrokerClient(addr, 30.0)
    try:
        queues = client.topic_stats(TRACE_TOPIC)["queues"]
    finally:
        client.close()
    bodies: list[bytes] = []
    for q in queues:
        stored, _gone = pull_queue_range(addr, TRACE_TOPIC, int(q["queue_id"]), int(q["min_offset"]),
                                         int(q["max_offset"]), broker_name="broker-a")
        for body, flag in zip(stored.column("body").to_pylist(), stored.column("sys_flag").to_pylist(), strict=True):
            bodies.append(zlib.decompress(body) if flag & 1 else body)   # as stored: maybe compressed
    reader = BrokerRangeReader(Endpoints.parse(brokers=f"broker-a={addr}"))
    try:
        rows = trace_rows(pa.table({"body": pa.array(bodies, pa.binary())}), read=reader)
    finally:
        reader.close()
    return Counter(zip(*(rows.column(c).to_pylist() for c in ("trace_id", "msg_id", "event_type")), strict=True))


# -- a kill between the commits of one micro-batch ----------------------------------------------------

def _child(spec: dict[str, Any], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TESTS / "lake_job_child.py"), json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout, env=jvm_child_env(),
                          stdin=subprocess.DEVNULL)


def _txn(lake: Path, name: str, app_id: str) -> int | None:
    return DeltaTable(tables.table_path(lake, name)).transaction_version(app_id)


def test_a_reader_never_sees_an_index_row_before_its_message(procs: ProcessHarness, tmp_path: Path) -> None:
    broker = procs.start("broker", "sparkmq.api.broker_main", "--data-dir", str(tmp_path / "broker"),
                         "--broker-name", "broker-a", "--no-trace")
    client = BrokerClient(broker.addr, 30.0)
    client.create_topic({"topic": TOPIC, "read_queue_nums": QUEUES, "write_queue_nums": QUEUES})
    total = 0
    for request in range(16):
        client.send_batch(TOPIC, {"queue_id": request % QUEUES},
                          messages=[{"body": f"m{request}-{i}", "keys": [f"k{request}-{i}"]} for i in range(250)])
        total += 250
    client.close()
    lake, checkpoint = tmp_path / "lake", tmp_path / "ckpt"
    spec = {"job": "dispatch", "brokers": {"broker-a": broker.addr}, "lake": str(lake),
            "checkpoint": str(checkpoint), "max_per_trigger": 1000}

    # A reader the whole time: index rows first, messages after -- never an index row ahead of its message.
    seen: list[int] = []
    failures: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                index = set(_places(lake, tables.CONSUME_QUEUE)) | set(_places(lake, tables.MESSAGE_KEYS))
                messages = set(_places(lake, tables.MESSAGES))
            except Exception:  # noqa: BLE001 -- a table not created yet
                time.sleep(0.05)
                continue
            seen.append(len(index))
            if index - messages:
                failures.append(f"{len(index - messages)} index rows ahead of messages")
            stop.wait(READER_PAUSE_S)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        killed = _child({**spec, "kill_after": tables.MESSAGES, "kill_batch": 1})
        assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-3000:]
        assert "KILLING messages" in killed.stdout
        batch = int(killed.stdout.split("KILLING messages ")[1].split()[0])
        # Between the commits: the batch is in messages only.
        assert _txn(lake, tables.MESSAGES, dispatch_app_id("broker-a", tables.MESSAGES)) == batch
        for name in (tables.CONSUME_QUEUE, tables.MESSAGE_KEYS):
            assert _txn(lake, name, dispatch_app_id("broker-a", name)) == batch - 1
        ahead = len(_places(lake, tables.MESSAGES)) - len(_places(lake, tables.CONSUME_QUEUE))
        assert ahead > 0
        _assert_visibility(lake, f"killed after the messages commit of batch {batch}")

        resumed = _child({**spec, "until_rows": total})
        assert resumed.returncode == 0 and "DONE" in resumed.stdout, resumed.stderr[-3000:]
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures[:3]
    assert len(seen) > 10            # the reader really read throughout
    # Completed by the replay of the same batch id: each message once in every table.
    for name in (tables.MESSAGES, tables.CONSUME_QUEUE):
        places = _places(lake, name)
        assert len(places) == len(set(places)) == total, name
    keys = _places(lake, tables.MESSAGE_KEYS)
    assert len(keys) == 2 * total and Counter(Counter(keys).values()) == Counter({2: total})
    _assert_visibility(lake, "after the restart")


def test_a_report_killed_between_its_two_commits_is_completed_once(spark: Any, tmp_path: Path) -> None:
    """run_report commits group_stats, then topic_stats; a SIGKILL in between, then the next run completes it."""
    from lake_rows import append_rows

    lake = tmp_path / "lake"
    t0 = dt.datetime(2026, 1, 5, 10, 0, tzinfo=dt.UTC)
    append_rows(spark, lake, tables.CONSUME_QUEUE, [
        {"topic": "orders", "broker": "broker-a", "queue_id": 0, "queue_offset": o, "commitlog_offset": o,
         "size": 10, "tag_hash": 0, "store_ts": t0 + dt.timedelta(seconds=o)} for o in range(30)], 0)
    spec = {"job": "report", "lake": str(lake), "now_ms": int((t0 + dt.timedelta(minutes=1, seconds=20))
                                                               .timestamp() * 1000),
            "backfill": 1, "samples": [["g1", "orders", "broker-a", 0, 12, 30, 18]]}
    killed = _child({**spec, "kill_after": tables.GROUP_STATS}, timeout=300)
    assert killed.returncode == -signal.SIGKILL and "KILLING group_stats" in killed.stdout, killed.stderr[-3000:]
    group_path, topic_path = (tables.table_path(lake, n) for n in (tables.GROUP_STATS, tables.TOPIC_STATS))
    assert DeltaTable(group_path).to_pyarrow_table().num_rows == 1
    assert DeltaTable(topic_path).to_pyarrow_table().num_rows == 0
    for _ in range(2):   # the repair, then a plain re-run: neither adds a row twice
        done = _child(spec, timeout=300)
        assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]
    groups = DeltaTable(group_path).to_pyarrow_table().to_pylist()
    topics = DeltaTable(topic_path).to_pyarrow_table().to_pylist()
    assert [(r["group"], r["messages_in"], r["lag"]) for r in groups] == [("g1", 30, 18)]
    assert [(r["topic"], r["messages_in"], r["bytes_in"]) for r in topics] == [("orders", 30, 300)]

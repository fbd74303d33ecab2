"""Exactly once through crashes: a lake broker killed with SIGKILL in the middle of dispatch batches.

A real broker process runs its lake (``--lake``: a SparkSession and the dispatch job in the
broker process) over a backlog cut into small micro-batches.  The test watches the job's
Spark checkpoint and, while a batch is in flight (its ``offsets/N`` written, its
``commits/N`` not yet), waits a random moment and SIGKILLs the broker with its Spark JVM and
Python workers -- landing in the tasks' file writes, between the three tables' commits, or
before the checkpoint's commit.  The broker is restarted on the same data directory (the
store recovers, Spark replays the interrupted batch from its checkpoint) and killed again,
several times.  At the end every acknowledged message is in ``consume_queue``, ``messages``
and ``message_keys`` exactly once: the app-transaction guard kept the replays out.
"""
from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from procs import ProcessHarness, ServiceProcess, wait_until
from sparkmq.pipelines import tables
from sparkmq.platform.client.remoting import BrokerClient

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

TOPIC = "CrashLake"
QUEUES = 4
KILLS = 3
PER_ROUND = 6000
PER_REQUEST = 250
BATCH_LIMIT = 1500  # messages per micro-batch: a round's backlog takes several batches

CONFIG = f"""
[store]
segment_size = 4194304
[lake]
trigger_interval_s = 0.2
max_messages_per_trigger = {BATCH_LIMIT}
jobs = ["dispatch"]
[lake.spark_conf]
"spark.master" = "local[1]"
"""


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
    """PER_ROUND messages over the queues, each with one key; msg_id -> (queue_id, queue_offset, key)."""
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
    finally:
        client.close()
    return acked


def _table(lake: Path, name: str, columns: list[str]):
    return DeltaTable(str(tables.table_path(lake, name))).to_pyarrow_table(
        columns=columns, filters=[("topic", "=", TOPIC)])


def test_every_message_once_in_the_lake_through_repeated_sigkills_mid_batch(procs: ProcessHarness,
                                                                           tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    (tmp_path / "broker.toml").write_text(CONFIG)
    data_dir = tmp_path / "broker"
    checkpoint = data_dir / "lake" / "_checkpoints" / "dispatch"
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
            assert time.monotonic() - started < 240, f"no batch in flight within 240 s (seed {seed})\n" + \
                broker.log()[-3000:]
            # Not a batch interrupted before: its replay is planned at the restart, before Spark even runs.
            batch = _in_flight(checkpoint, finished | {b for b, _ in interrupted})
            if batch is None:
                time.sleep(0.005)
                continue
            delay = rng.uniform(0.0, 0.4)
            time.sleep(delay)
            _kill_with_children(broker)
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
    lake = data_dir / "lake"
    wait_until(lambda: DeltaTable(str(tables.table_path(lake, tables.CONSUME_QUEUE))).to_pyarrow_table(
        columns=["queue_offset"]).num_rows >= len(acked), 240, "the lake to catch up after the last restart")
    time.sleep(1.0)  # a replay that would write twice gets its chance
    assert broker.stop(timeout=60) == 0

    expected = Counter((q, off) for q, off, _ in acked.values())
    cq = _table(lake, tables.CONSUME_QUEUE, ["queue_id", "queue_offset"])
    got = Counter(zip(cq.column("queue_id").to_pylist(), cq.column("queue_offset").to_pylist(), strict=True))
    context = f"seed {seed}, interrupted batches (id, delay s) {interrupted}"
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

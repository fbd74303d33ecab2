"""A broker as a long-running Spark service: its lake jobs, query through the index, and the lake tier.

A real broker process runs with ``--lake`` (a SparkSession and the dispatch job in the broker
process); messages become findable by key; ``/health`` and ``/metrics`` report the job.  Then
the broker restarts with an aggressive retention and *without* Spark: pulls below the log's
new minimum are served from the ``messages`` table (delta-rs), so history outlives the log.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from procs import LAKE_TABLE, ProcessHarness, broker_restart_ports, child_env, wait_until
from sparkmq.platform.broker.lake_index import LakeIndex
from sparkmq.platform.client import ClientConfig, Message, Producer
from sparkmq.platform.common import wire
from sparkmq.platform.common.errors import ErrorCode, SparkMQError

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.timeout(600)]

STORE = """
[store]
segment_size = 1048576
max_message_size = 65536
max_properties_size = 8192
"""
AGGRESSIVE_RETENTION = STORE + """
file_reserved_hours = 0.00001
delete_when_hours = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
retention_interval_ms = 200
"""
LAKE = f"""
{LAKE_TABLE}trigger_interval_s = 0.5
[lake.spark_conf]
"spark.master" = "local[1]"
"""



def test_lake_jobs_index_and_the_lake_tier(procs: ProcessHarness, tmp_path: Path) -> None:
    ns = procs.start("namesrv", "sparkmq.api.namesrv_main", "--scan-interval-s", "0.5")
    (tmp_path / "lake.toml").write_text(STORE + LAKE)
    (tmp_path / "retention.toml").write_text(AGGRESSIVE_RETENTION)
    data_dir = tmp_path / "broker"
    common = ["--data-dir", str(data_dir), "--namesrv", ns.addr, "--broker-name", "broker-a",
              "--segment-size", "1048576", "--register-interval-s", "0.5"]
    broker = procs.start("broker", "sparkmq.api.broker_main", "--config", str(tmp_path / "lake.toml"), "--lake",
                         *common)
    http = httpx.Client(base_url=broker.url, timeout=10)
    body = os.urandom(8000)  # incompressible: 300 of them span three 1 MiB segments
    with Producer("lake-test", ClientConfig(namesrv_addrs=ns.addr)) as producer:
        results = [producer.send(Message("History", body + b"%d" % i, keys=(f"key-{i}",)), sharding_key="one")
                   for i in range(300)]
    queue_id = results[0].queue_id
    assert {r.queue_id for r in results} == {queue_id} and results[-1].queue_offset == 299

    # Findable through the index within seconds of the lake job running.
    found = wait_until(lambda: http.get("/query/messages", params={"topic": "History", "key": "key-7"}).json()
                       .get("messages"), 300, "key-7 to be indexed")
    assert [wire.received_from_json(m).body for m in found] == [body + b"7"]
    by_id = http.get("/query/messages", params={"msg_id": results[3].msg_id}).json()["messages"]
    assert [m["queue_offset"] for m in by_id] == [results[3].queue_offset]
    health = http.get("/health").json()
    assert health["lake"]["state"] == "running" and health["lake"]["jobs"]["dispatch"]["state"] == "running"
    assert health["lake"]["jobs"]["reports"]["state"] == "running"
    assert http.get("/alerts").json() == {"alerts": []}
    status = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", ns.addr, "--json",
                             "lake", "status"], capture_output=True, text=True, timeout=60, env=child_env())
    assert json.loads(status.stdout)["broker-a"]["jobs"]["dispatch"]["state"] == "running", status.stderr
    query = subprocess.run([sys.executable, "-m", "sparkmq.api.cli", "admin", "--namesrv", ns.addr, "--json",
                            "msg", "query", "--topic", "History", "--key", "key-9"],
                           capture_output=True, text=True, timeout=60, env=child_env())
    assert [m["queue_offset"] for m in json.loads(query.stdout)] == [results[9].queue_offset], query.stderr
    metrics = http.get("/metrics").text
    assert 'sparkmq_lake_job_up{name="dispatch"} 1.0' in metrics
    wait_until(lambda: http.get("/query/messages", params={"topic": "History", "key": "key-299"}).json()
               .get("messages"), 60, "the last message to be indexed")
    http.close()
    assert broker.stop(timeout=60) == 0

    # Restart without Spark and with a retention that deletes every closed segment at once.
    broker = procs.start("broker", "sparkmq.api.broker_main", "--config", str(tmp_path / "retention.toml"),
                         *broker_restart_ports(broker.port), *common)
    http = httpx.Client(base_url=broker.url, timeout=10)
    low = wait_until(lambda: http.get(f"/topics/History/queues/{queue_id}/offsets").json()["min_offset"], 30,
                     "retention to remove the oldest segments")
    assert 0 < low < 300
    pulled = http.get(f"/topics/History/queues/{queue_id}/messages", params={"offset": 0, "max": 32}).json()
    assert pulled["status"] == "FOUND" and pulled["next_offset"] == 32
    assert [wire.received_from_json(m).body for m in pulled["messages"]] == [body + b"%d" % i for i in range(32)]
    # Reading on from the lake reaches the log without a gap.
    offset, seen = 0, []
    while offset < 300:
        page = http.get(f"/topics/History/queues/{queue_id}/messages", params={"offset": offset, "max": 64}).json()
        assert page["status"] == "FOUND", page["status"]
        seen += [m["queue_offset"] for m in page["messages"]]
        offset = page["next_offset"]
    assert seen == list(range(300))
    old = http.get("/query/messages", params={"topic": "History", "key": "key-1"}).json()["messages"]
    assert [wire.received_from_json(m).body for m in old] == [body + b"1"]
    http.close()


def test_sparkmq_lake_runs_the_jobs_for_a_whole_cluster(procs: ProcessHarness, tmp_path: Path) -> None:
    ns = procs.start("namesrv", "sparkmq.api.namesrv_main", "--scan-interval-s", "0.5")
    brokers = procs.start_many([("broker", "sparkmq.api.broker_main",
                                 ["--data-dir", str(tmp_path / name), "--namesrv", ns.addr, "--broker-name", name,
                                  "--register-interval-s", "0.5"]) for name in ("broker-a", "broker-b")])
    wait_until(lambda: len(httpx.get(f"{ns.url}/cluster", timeout=5).json()["live_brokers"]) == 2, 30,
               "both brokers registered")
    with Producer("lake-cluster", ClientConfig(namesrv_addrs=ns.addr)) as producer:
        sent = [producer.send(Message("Everywhere", b"m%d" % i, keys=(f"k{i}",))) for i in range(40)]
    assert {r.broker_name for r in sent} == {"broker-a", "broker-b"}
    lake_root = tmp_path / "lake"
    job = procs.spawn("lake", [sys.executable, "-m", "sparkmq.api.cli", "lake", "--namesrv", ns.addr, "--lake-root",
                               str(lake_root), "--spark-master", "local[1]", "--status-interval-s", "2"],
                      log_path=tmp_path / "lake.log")
    try:
        index = LakeIndex(lake_root)
        wait_until(lambda: all(_indexed(index, r.msg_id) for r in sent[-4:]), 180, "the cluster's messages indexed")
        hits = {h.broker for r in sent for h in index.by_msg_id(r.msg_id)}
        assert hits == {"broker-a", "broker-b"}
        assert [h.queue_offset for h in index.by_key("Everywhere", "k5")] == [sent[5].queue_offset]
    finally:
        assert job.stop(timeout=120) == 0, job.log()[-3000:]
    assert brokers[0].proc.poll() is None


def _indexed(index: LakeIndex, msg_id: str) -> bool:
    """Whether the lake's key index has ``msg_id`` (False while the dispatch job has not written the index yet)."""
    try:
        return bool(index.by_msg_id(msg_id))
    except SparkMQError as exc:
        if exc.code is not ErrorCode.LAKE_NOT_AVAILABLE:
            raise
        return False

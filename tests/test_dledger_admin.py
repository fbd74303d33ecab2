"""Operating a DLedger group: ``GET /broker/dledger``, ``POST /broker/dledger/transfer``, the ``sparkmq admin
dledger`` commands, ``sparkmq admin cluster list`` on members, and the embedded group (``sparkmq dev --ha
dledger``).

Real processes on loopback (a name server and the three members n0, n1, n2 of ``broker-a``), heartbeat 300 ms
so elections and transfers take about a second.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from procs import (
    BROKER,
    NAMESRV,
    ProcessHarness,
    ServiceProcess,
    child_env,
    fast_client_config,
    read_all,
    wait_until,
    write_conf,
)
from sparkmq.platform.client import Message, Producer
from sparkmq.platform.common.errors import SparkMQError
from sparkmq.platform.common.message import SendStatus

pytestmark = pytest.mark.cluster

TOPIC = "DLedgerAdminTopic"
MEMBERS = ("n0", "n1", "n2")
HEARTBEAT_MS = 300
CLI = [sys.executable, "-m", "sparkmq.api.cli"]


def free_port() -> int:
    """A port free now on 127.0.0.1 (a member binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Members:
    """A name server and the three members of ``broker-a`` (no proxies: the links are direct)."""

    def __init__(self, procs: ProcessHarness, tmp: Path) -> None:
        self.namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
        peers = ";".join(f"{member}-127.0.0.1:{free_port()}" for member in MEMBERS)
        specs = []
        for member in MEMBERS:
            conf = write_conf(tmp / f"{member}.toml", tmp / member, dledger_enabled=True, dledger_self_id=member,
                              dledger_peers=peers, dledger_heartbeat_ms=HEARTBEAT_MS, ha_slave_sync_interval_s=0.5)
            specs.append(("broker", BROKER, ["--config", str(conf), "--namesrv", self.namesrv.addr,
                                             "--register-interval-s", "0.5"]))
        self.brokers: dict[str, ServiceProcess] = dict(zip(MEMBERS, procs.start_many(specs), strict=True))

    def status(self, member: str) -> dict[str, Any]:
        return httpx.get(self.brokers[member].url + "/broker/dledger", timeout=5).json()

    def leader(self) -> str | None:
        """The member that says it leads (the highest term among those that do)."""
        leading = [(s["term"], m) for m in MEMBERS if (s := self.status(m)).get("role") == "LEADER"]
        return max(leading)[1] if leading else None

    def routed_master(self) -> str | None:
        """``broker_addrs["0"]`` of ``broker-a`` in the name server's cluster view."""
        info = httpx.get(self.namesrv.url + "/cluster", timeout=5).json()
        return ((info.get("brokers") or {}).get("broker-a") or {}).get("broker_addrs", {}).get("0")

    def wait_master(self, member: str | None = None, timeout: float = 30) -> str:
        """Wait until ``member`` (any member when None) leads and the name server routes to it; returns it."""
        def routed() -> str | None:
            leader = self.leader()
            ok = leader is not None and (member is None or leader == member)
            return leader if ok and self.routed_master() == self.brokers[leader].addr else None
        return wait_until(routed, timeout, f"{member or 'a leader'} routed as master of broker-a")

    def everyone_has(self, topic: str) -> bool:
        """Whether every member's topic table holds ``topic`` (followers copy the leader's)."""
        return all(httpx.get(f"{b.url}/topics/{topic}", timeout=5).status_code == 200 for b in self.brokers.values())

    def transfer(self, at: str, to: str, timeout: float = 30) -> httpx.Response:
        return httpx.post(self.brokers[at].url + "/broker/dledger/transfer", json={"to": to}, timeout=timeout)


@pytest.fixture
def group(procs: ProcessHarness, tmp_path: Path) -> Members:
    return Members(procs, tmp_path)


class SteadyProducer:
    """One producer thread sending one message at a time (with its usual retries), counting outcomes."""

    def __init__(self, namesrv: str, offsets: Path) -> None:
        self.producer = Producer("dledger-admin", fast_client_config(namesrv, offsets, send_timeout_s=5.0)).start()
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            seq += 1
            try:
                result = self.producer.send(Message(TOPIC, b"steady-%d" % seq))
            except SparkMQError as exc:
                self.failed.append(str(exc))
                continue
            if result.status is SendStatus.SEND_OK:
                self.ok += 1
            else:
                self.failed.append(str(result.status))

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.producer.shutdown()


def cli(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "admin", "--namesrv", namesrv, *args], capture_output=True, text=True,
                          timeout=120, env=child_env(COLUMNS="250"), stdin=subprocess.DEVNULL)


def test_status_and_refusals_name_the_leader_and_the_bad_member(group: Members) -> None:
    leader = group.wait_master()
    follower = next(m for m in MEMBERS if m != leader)
    status = group.status(follower)
    assert status["role"] == "FOLLOWER" and status["leader"] == leader and status["self_id"] == follower
    assert set(status["members"]) == set(MEMBERS) and status["term"] == group.status(leader)["term"]
    assert group.status(leader)["broker_addr"] == group.brokers[leader].addr

    refused = group.transfer(follower, leader)
    assert refused.status_code == 503 and refused.json()["code"] == "SERVICE_NOT_AVAILABLE"
    assert f"the leader is {leader}" in refused.json()["message"]
    unknown = group.transfer(leader, "n9")
    assert unknown.status_code == 400 and unknown.json()["code"] == "INVALID_ARGUMENT" and "n9" in unknown.text
    shapeless = httpx.post(group.brokers[leader].url + "/broker/dledger/transfer", json={"to": 1}, timeout=5)
    assert shapeless.json()["code"] == "INVALID_ARGUMENT"
    assert group.leader() == leader  # nothing moved

    # The CLI says the same, as CODE: message and exit status 1.
    result = cli(group.namesrv.addr, "dledger", "transfer", "--broker", group.brokers[follower].addr, "--to", "n9")
    assert result.returncode == 1 and "INVALID_ARGUMENT" in result.stderr
    result = cli(group.namesrv.addr, "--json", "dledger", "status", "--broker", group.brokers[follower].addr)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["leader"] == leader

    # The cluster table shows each member's Raft role and term.
    result = cli(group.namesrv.addr, "cluster", "list")
    assert result.returncode == 0, result.stderr
    term = group.status(leader)["term"]
    assert f"LEADER ({leader}, term {term})" in result.stdout
    assert result.stdout.count(f"follows {leader}") == 2


def test_a_broker_outside_any_group_answers_dledger_not_enabled(tmp_path: Path) -> None:
    from sparkmq.api.broker_app import create_app
    from sparkmq.platform.broker.broker import Broker
    from sparkmq.platform.broker.config import BrokerConfig

    client = TestClient(create_app(Broker(BrokerConfig(data_dir=tmp_path))))
    for answer in (client.get("/broker/dledger"), client.post("/broker/dledger/transfer", json={"to": "n1"})):
        assert answer.status_code == 404 and answer.json()["code"] == "DLEDGER_NOT_ENABLED"


def test_transfer_moves_the_master_while_a_producer_keeps_sending(group: Members, tmp_path: Path) -> None:
    leader = group.wait_master()
    target, third = (m for m in MEMBERS if m != leader)
    with SteadyProducer(group.namesrv.addr, tmp_path / "offsets") as producer:
        wait_until(lambda: producer.ok >= 20, 20, "sends to the first leader")
        # A member elected before it copied an auto-created topic registers without it, and the deposed leader,
        # copying the new one's table, deletes it too: the route loses the topic.  Let the followers copy it first.
        wait_until(lambda: group.everyone_has(TOPIC), 15, f"{TOPIC} on every member")

        answer = group.transfer(leader, target)
        assert answer.status_code == 200, answer.text
        moved = answer.json()
        assert moved["leader"] == target and moved["from"] == leader and moved["term"] > moved["previous_term"]
        group.wait_master(target)
        assert group.status(leader)["role"] == "FOLLOWER"
        before = producer.ok
        wait_until(lambda: producer.ok >= before + 50, 20, "sends to the new leader")

        # Once more through the CLI: back from the new leader to the third member.
        result = cli(group.namesrv.addr, "dledger", "transfer", "--broker", group.brokers[target].addr,
                     "--to", third)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"{third} leads DLedger group broker-a" in result.stdout
        group.wait_master(third)
        before = producer.ok
        wait_until(lambda: producer.ok >= before + 50, 20, "sends to the third leader")
    # Sends refused while the leadership moved were retried by the producer: at most a few gave up.
    assert len(producer.failed) <= 3, producer.failed[:5]
    acked = producer.ok
    wait_until(lambda: len(read_all(group.brokers[third], TOPIC)) >= acked, 15, "every acknowledged send readable")


def test_the_embedded_group_elects_a_master_and_another_when_it_stops(tmp_path: Path) -> None:
    """``sparkmq dev --ha dledger`` in-process: send and receive through the leader; stop it; a new one leads."""
    from sparkmq.api.embedded import EmbeddedPlatform

    with EmbeddedPlatform.from_toml(None, data_dir=tmp_path / "dev", namesrv_port=0, broker_port=0, lake=False,
                                    ha="dledger", dledger_heartbeat_ms=HEARTBEAT_MS) as platform:
        assert sorted(platform.member_addrs) == list(MEMBERS)
        leader = platform.wait_leader(30)
        config = fast_client_config(platform.namesrv_addr, tmp_path / "o")
        with Producer("dev-dledger", config) as producer:
            first = producer.send_batch([Message(TOPIC, f"first-{i}".encode()) for i in range(50)])
            assert {r.status for r in first} == {SendStatus.SEND_OK}

            platform.stop_member(leader)
            assert platform.running  # the others go on
            successor = platform.wait_leader(30)
            assert successor != leader
            second = wait_until(lambda: _try_batch(producer, "second"), 20, "a send to the new leader")
        assert {r.status for r in second} == {SendStatus.SEND_OK}
        found = read_all(f"http://{platform.member_addrs[successor]}", TOPIC)
        assert {r.msg_id for r in first + second} <= set(found)


def _try_batch(producer: Producer, tag: str) -> list[Any] | None:
    try:
        return producer.send_batch([Message(TOPIC, f"{tag}-{i}".encode()) for i in range(50)])
    except SparkMQError:
        return None  # the route still named the stopped leader


def test_dev_ha_dledger_prints_the_group_and_runs_the_demo(tmp_path: Path) -> None:
    result = subprocess.run([*CLI, "dev", "--ha", "dledger", "--namesrv-port", "0", "--broker-port", "0", "--no-lake",
                             "--exit-after-demo", "--messages", "100", "--data-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                            env=child_env(COLUMNS="250"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DLedger group" in result.stdout and result.stdout.count("FOLLOWER (slave)") == 2
    assert "LEADER (master)" in result.stdout and "received 100 of 100" in result.stdout

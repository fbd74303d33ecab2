"""DLedger groups with real processes on loopback: a Jepsen-style set checker under kill -9, SIGSTOP and cut links.

Each test starts a name server and three brokers of one DLedger group (``broker-a``: members n0, n1, n2).
Every Raft link between two members runs through a TCP proxy the test controls (``tcp_proxy.ProxyMesh``),
so a member can be cut off without touching its process.  Timings are scaled down for the suite
(heartbeat 300 ms, leader lost after 3 missed beats); ``python3 build.py bench ha`` measures failover
with the production defaults (2 s).

A send counts as acknowledged only when the producer got SEND_OK.  Producers do not retry (each attempt
has its own body), so the checker can demand that every acknowledged body is in the committed log of
every member exactly once, and that no body is there twice.
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from tcp_proxy import ProxyMesh

from procs import (
    BROKER,
    NAMESRV,
    ProcessHarness,
    ServiceProcess,
    fast_client_config,
    read_all,
    wait_until,
    write_conf,
)
from sparkmq.platform.client import ConsumeStatus, Message, Producer, PushConsumer
from sparkmq.platform.common.errors import SparkMQError
from sparkmq.platform.common.message import SendStatus
from sparkmq.platform.ha.dledger.messages import AppendReply, AppendRequest, Entry, Refusal, decode_reply, encode_frame

pytestmark = pytest.mark.cluster

TOPIC = "RaftTopic"
QUEUES = 4
MEMBERS = ("n0", "n1", "n2")
#: Nemesis events per run in the suite (SPARKMQ_DLEDGER_EVENTS changes it; at least 3: one of each kind).
EVENTS = int(os.environ.get("SPARKMQ_DLEDGER_EVENTS", "10"))
NEMESES = ("kill", "pause", "isolate")
HEARTBEAT_MS = 300


def free_port() -> int:
    """A port free now on 127.0.0.1 (the member binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MeshThread:
    """A :class:`ProxyMesh` on a loop of its own thread, driven from the test's thread."""

    def __init__(self, members: tuple[str, ...]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="proxy-mesh", daemon=True)
        self.thread.start()
        self.mesh: ProxyMesh = self._run(ProxyMesh(members).start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def do(self, action: Callable[[], object]) -> None:
        """Run ``action`` (a mesh method call) on the mesh's loop and wait for it."""
        async def run() -> None:
            action()
        self._run(run())

    def close(self) -> None:
        self._run(self.mesh.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Group:
    """A name server and the three members of ``broker-a``, each restartable; Raft links through proxies."""

    def __init__(self, procs: ProcessHarness, tmp: Path, **conf: Any) -> None:
        self.procs = procs
        self.tmp = tmp
        self.conf = {"dledger_heartbeat_ms": HEARTBEAT_MS, **conf}
        self.namesrv = procs.start("namesrv", NAMESRV, "--scan-interval-s", "0.5")
        self.raft_ports = {member: free_port() for member in MEMBERS}
        self.mesh = MeshThread(MEMBERS)
        for member, port in self.raft_ports.items():
            self.mesh.do(lambda m=member, p=port: self.mesh.mesh.set_target(m, ("127.0.0.1", p)))
        started = procs.start_many([("broker", BROKER, self._args(member)) for member in MEMBERS])
        self.brokers: dict[str, ServiceProcess] = dict(zip(MEMBERS, started, strict=True))
        self.paused: set[str] = set()

    def _args(self, member: str) -> list[str]:
        peers = {member: ("127.0.0.1", self.raft_ports[member]), **self.mesh.mesh.peers_for(member)}
        conf = write_conf(self.tmp / f"{member}.toml", self.tmp / member, dledger_enabled=True,
                          dledger_self_id=member,
                          dledger_peers=";".join(f"{m}-{h}:{p}" for m, (h, p) in sorted(peers.items())), **self.conf)
        return ["--config", str(conf), "--namesrv", self.namesrv.addr, "--register-interval-s", "0.5"]

    def restart(self, member: str) -> None:
        self.brokers[member] = self.procs.start("broker", BROKER, *self._args(member))

    def status(self, member: str) -> dict[str, Any] | None:
        """``GET /broker/ha`` of a member; None while it cannot answer (killed, paused)."""
        if member in self.paused:
            return None
        try:
            return httpx.get(self.brokers[member].url + "/broker/ha", timeout=2).json()
        except httpx.HTTPError:
            return None

    def leader(self, exclude: tuple[str, ...] = ()) -> str | None:
        """The member leading in the highest term among those answering, not one of ``exclude``."""
        best: tuple[int, str] | None = None
        for member in MEMBERS:
            status = self.status(member)
            if member not in exclude and status is not None and status.get("role") == "LEADER":
                best = max(best or (-1, ""), (status["term"], member))
        return best[1] if best else None

    def wait_leader(self, exclude: tuple[str, ...] = (), timeout: float = 30) -> str:
        wait_until(lambda: self.leader(exclude) is not None, timeout, f"a leader other than {exclude}")
        leader = self.leader(exclude)
        assert leader is not None
        return leader

    def converged(self) -> bool:
        """Every member answers and holds the same log, all of it committed and visible."""
        statuses = [self.status(member) for member in MEMBERS]
        if any(s is None for s in statuses):
            return False
        ends = {(s["log_end"], s["commit_offset"], s["visible_offset"]) for s in statuses}  # type: ignore[index]
        return len(ends) == 1 and len({*next(iter(ends))}) == 1

    def close(self) -> None:
        for member in list(self.paused):
            os.kill(self.brokers[member].proc.pid, signal.SIGCONT)
        self.mesh.close()


def committed_log(data_dir: Path, end: int) -> bytes:
    """The commit log's bytes [0, end) as the member's segment files hold them."""
    out = bytearray()
    for segment in sorted((data_dir / "store" / "commitlog").iterdir()):
        if len(out) >= end:
            break
        start = int(segment.name)
        assert start == len(out), f"segment {segment.name} does not follow byte {len(out)}"
        with segment.open("rb") as f:
            out += f.read(end - start)
    return bytes(out[:end])


class Senders:
    """Producer threads sending one message at a time without retries, recording what was acknowledged."""

    def __init__(self, namesrv: str, tmp: Path, threads: int = 3) -> None:
        self.producers = [Producer(f"raft-sender-{i}", fast_client_config(namesrv, tmp / f"offsets-{i}", retry_times=0,
                                                                          send_timeout_s=3.0)).start()
                          for i in range(threads)]
        #: body -> (when the send began, when SEND_OK came)
        self.acked: dict[bytes, tuple[float, float]] = {}
        self.failed = 0
        self.not_ok: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> Senders:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, index: int) -> None:
        producer = self.producers[index]
        seq = 0
        while not self._stop.is_set():
            body = f"s{index}-{seq}".encode()
            seq += 1
            began = time.monotonic()
            try:
                result = producer.send(Message(TOPIC, body))
            except SparkMQError:
                with self._lock:
                    self.failed += 1
                time.sleep(0.02)
                continue
            with self._lock:
                if result.status is SendStatus.SEND_OK:
                    self.acked[body] = (began, time.monotonic())
                else:
                    self.not_ok[str(result.status)] = self.not_ok.get(str(result.status), 0) + 1

    def acked_now(self) -> dict[bytes, tuple[float, float]]:
        with self._lock:
            return dict(self.acked)

    def first_ack_begun_after(self, moment: float) -> float | None:
        """When the first send that began after ``moment`` was acknowledged."""
        times = [done for began, done in self.acked_now().values() if began > moment]
        return min(times) if times else None

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
        for producer in self.producers:
            producer.shutdown()


def create_topic(group: Group, leader: str) -> None:
    httpx.post(group.brokers[leader].url + "/topics", json={"topic": TOPIC, "read_queue_nums": QUEUES,
                                                            "write_queue_nums": QUEUES}, timeout=10).raise_for_status()


@pytest.fixture()
def group(procs: ProcessHarness, tmp_path: Path) -> Any:
    built = Group(procs, tmp_path)
    yield built
    built.close()


def test_acknowledged_sends_survive_kills_pauses_and_partitions_of_the_leader(group: Group, procs: ProcessHarness,
                                                                             tmp_path: Path) -> None:
    assert EVENTS >= len(NEMESES), f"SPARKMQ_DLEDGER_EVENTS={EVENTS}: the leader must meet every nemesis {NEMESES}"
    leader = group.wait_leader()
    create_topic(group, leader)
    received: dict[bytes, int] = {}
    received_lock = threading.Lock()

    def listener(messages: list[Any]) -> ConsumeStatus:
        with received_lock:
            for message in messages:
                received[message.body] = received.get(message.body, 0) + 1
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("raft-readers", fast_client_config(group.namesrv.addr, tmp_path / "consumer"),
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe(TOPIC)
    consumer.register_listener(listener)
    consumer.start()
    senders = Senders(group.namesrv.addr, tmp_path).start()
    failovers: list[tuple[str, float]] = []
    try:
        wait_until(lambda: len(senders.acked_now()) >= 50, 30, "the first acknowledged sends")
        for event in range(EVENTS):
            kind = NEMESES[event % len(NEMESES)]
            old = group.wait_leader()
            before = len(senders.acked_now())
            moment = time.monotonic()
            if kind == "kill":
                group.brokers[old].kill9()
            elif kind == "pause":
                group.brokers[old].pause()
                group.paused.add(old)
            else:
                group.mesh.do(lambda o=old: group.mesh.mesh.isolate(o))
            new = group.wait_leader(exclude=(old,))
            wait_until(lambda m=moment: senders.first_ack_begun_after(m) is not None, 30,
                       f"a send acknowledged by the new leader {new}")
            acked_at = senders.first_ack_begun_after(moment)
            assert acked_at is not None
            failovers.append((kind, acked_at - moment))
            # Heal: the old leader comes back as a follower and can acknowledge nothing of its old term.
            if kind == "kill":
                group.restart(old)
            elif kind == "pause":
                os.kill(group.brokers[old].proc.pid, signal.SIGCONT)
                group.paused.discard(old)
            else:
                group.mesh.do(group.mesh.mesh.heal)
            wait_until(lambda o=old: (group.status(o) or {}).get("role") == "FOLLOWER", 30,
                       f"{old} following again after the {kind}")
            wait_until(lambda b=before: len(senders.acked_now()) > b + 20, 30, "sends acknowledged after the event")
    finally:
        senders.stop()
    acked = senders.acked_now()
    wait_until(group.converged, 180, lambda: f"the members converging: {[group.status(m) for m in MEMBERS]}")

    # Every member's committed log holds every acknowledged body exactly once, and nothing twice.
    per_member = {}
    for member in MEMBERS:
        bodies: dict[bytes, int] = {}
        for body in read_all(group.brokers[member], TOPIC, QUEUES).values():
            bodies[body] = bodies.get(body, 0) + 1
        assert not [b for b in acked if bodies.get(b) != 1], f"{member} lacks or doubles acknowledged sends"
        assert not [b for b, n in bodies.items() if n > 1], f"{member} holds a body twice"
        per_member[member] = set(bodies)
    assert per_member["n0"] == per_member["n1"] == per_member["n2"]
    # The logs are byte-identical up to the commit index.
    end = group.status("n0")["commit_offset"]  # type: ignore[index]
    logs = {member: committed_log(tmp_path / member, end) for member in MEMBERS}
    assert logs["n0"] == logs["n1"] == logs["n2"]
    # The consumer group received every acknowledged message (duplicates allowed: at-least-once).
    wait_until(lambda: not [b for b in acked if b not in received], 60,
               lambda: f"the consumers receiving every acknowledged send ({len(set(acked) - set(received))} missing)")
    consumer.shutdown()
    delays = sorted(d for _, d in failovers)
    print(f"\nDLedger failovers ({len(delays)}): "
          + ", ".join(f"{k} {d:.2f}s" for k, d in failovers)
          + f"; p50 {statistics.median(delays):.2f}s max {delays[-1]:.2f}s; acknowledged {len(acked)}, "
          f"failed {senders.failed}, not ok {senders.not_ok}")
    # Every event ended in a failover, and the leader met every kind of nemesis.
    assert len(failovers) == EVENTS and {kind for kind, _ in failovers} == set(NEMESES), failovers
    # Scaled timings (leader lost after 0.9 s): a failover is a few seconds, never the 30 s of a route refresh.
    assert delays[-1] < 10, failovers


def test_a_topic_auto_created_just_before_the_leader_dies_stays_routable(group: Group, tmp_path: Path) -> None:
    leader = group.wait_leader()
    config = fast_client_config(group.namesrv.addr, tmp_path / "p", retry_times=0, send_timeout_s=3.0)
    with Producer("raft-auto", config) as producer:
        assert producer.send(Message("BornLate", b"first")).status is SendStatus.SEND_OK
        group.brokers[leader].kill9()  # before any follower could copy the leader's topic table
        new = group.wait_leader(exclude=(leader,))

        def sent() -> bool:
            try:
                return producer.send(Message("BornLate", b"second")).status is SendStatus.SEND_OK
            except SparkMQError:
                return False
        wait_until(sent, 30, f"a send to the topic through the new leader {new}")
    route = httpx.get(f"{group.namesrv.url}/routes/BornLate", timeout=5).json()
    assert route["broker_datas"][0]["broker_addrs"]["0"] == group.brokers[new].addr
    assert sorted(read_all(group.brokers[new], "BornLate").values()) == [b"first", b"second"]


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` to a member's Raft port; what it answers before closing (b"" for nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def test_bad_input_on_the_raft_port_is_refused_and_changes_nothing(group: Group, tmp_path: Path) -> None:
    leader = group.wait_leader()
    follower = next(m for m in MEMBERS if m != leader)
    create_topic(group, leader)
    config = fast_client_config(group.namesrv.addr, tmp_path / "p", retry_times=0)
    with Producer("raft-bad-input", config) as producer:
        assert producer.send(Message(TOPIC, b"before")).status is SendStatus.SEND_OK
        wait_until(group.converged, 20, "the members converging")
        before = {m: group.status(m) for m in MEMBERS}
        term = before[leader]["term"]  # type: ignore[index]
        port = group.raft_ports[follower]
        assert _exchange(port, os.urandom(4096)) == b""  # garbage: closed unanswered
        assert _exchange(port, b"RF\x01\x00\xff\xff\xff\x7f") == b""  # a frame longer than any allowed
        wrong_group = AppendRequest("broker-z", leader, 1, term, 0, 0, 0, [])
        stale = AppendRequest("broker-a", leader, 2, term - 1, 0, 0, 10**9, [Entry(term - 1, b"forged")])
        stranger = AppendRequest("broker-a", "n9", 3, term + 5, 0, 0, 0, [Entry(term + 5, b"forged")])
        for request, reason in ((wrong_group, "wrong group"), (stranger, "not a member")):
            answer = decode_reply(_exchange(port, encode_frame(request))[8:])
            assert isinstance(answer, Refusal) and answer.reason == reason
        answer = decode_reply(_exchange(port, encode_frame(stale))[8:])
        assert isinstance(answer, AppendReply) and not answer.success and answer.term == term  # a stale term
        after = {m: group.status(m) for m in MEMBERS}
        for member in MEMBERS:  # nothing stored, no term raised, the same leader
            assert (after[member]["log_end"], after[member]["term"], after[member]["leader"]) == (  # type: ignore[index]
                before[member]["log_end"], term, leader)  # type: ignore[index]
        assert group.status(follower)["refused"] == {  # type: ignore[index]
            "garbage frame": 2, "wrong group": 1, "not a member": 1}
        assert producer.send(Message(TOPIC, b"after")).status is SendStatus.SEND_OK
    assert sorted(read_all(group.brokers[follower], TOPIC, QUEUES).values()) == [b"after", b"before"]

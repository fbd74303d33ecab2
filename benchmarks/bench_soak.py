"""Soak: a 2-name-server, 2-master/2-slave (SYNC_MASTER) cluster with the lake on, under steady load for a long time.

    python benchmarks/bench_soak.py [--minutes 30]          (python3 build.py bench soak --minutes 30)

Every service is a real process on a free 127.0.0.1 port (tests/procs.py starts and stops them, by pid, pass
or fail); each master runs its lake (a SparkSession and the dispatch job into Delta tables).  This process is
the load: producers (four sending threads each) and a consumer on each door -- remoting (sparkmq's client), HTTP
(the broker's endpoints) and gRPC (the official ``rocketmq`` client) -- at half of the rate each door reached flat
out in a 15 s ramp at the start (then 30 s at that rate, so the ramp's backlog clears before the clock starts).
The lakes' Spark runs at niceness 10 (``--lake-nice``; the brokers' default, SCHED_IDLE, may never get a core on
a shared machine) and the soak begins once each lake dispatched a batch.
Every message carries its door's sequence number and its send time, so each acknowledged message is checked off
when consumed and its end-to-end latency is known.  During the run:

* a consumer group (``soak-churn``, remoting) joins and leaves: at 15 %, 30 %, 65 % and 80 % of the run;
* broker-b's master is killed with SIGKILL at 50 % and restarted 15 s later on the same ports;
* every 10 s: each broker's RSS, open files and threads (``/proc/<pid>``), the consumer lag the masters report
  (``/consumers/<group>/lag``), the messages overdue (acknowledged over 5 s ago and not yet consumed), and the
  e2e p99 of the last 10 s, also per door (``<door>_overdue``, ``<door>_e2e_p99_ms``, and ``<door>_send_p99_ms``,
  the producer's share: its acknowledged sends' round trips), and the gRPC client's
  acks (``grpc_ack_p99_ms``, ``grpc_ack_max_ms``, ``grpc_ack_errors``, ``grpc_receive_errors``).

A message counts as consumed when its consumer's application gets it: the push consumers' listener call, the
HTTP pull's answer, the gRPC ``receive``'s batch (four threads receive; four acknowledge what they received).

The run lasts ``--minutes`` of steady load, longer only when the last disturbance's 60 s window needs it.
Then producers stop, consumers drain, and the figures are printed (after ``machine.python_echo``):

* ``soak.rss_growth pct=`` -- broker RSS, the mean of the last 10 minutes over the mean of minutes 5-15 (the
  windows scale with shorter runs; the line says which), as growth in percent: the worst broker that was not
  restarted.  Target <= 5.
* ``soak.lost count=`` -- acknowledged messages never consumed, over the three doors.  Target 0.
* ``soak.e2e_p99_ms worst_over_median=`` -- the worst minute's e2e p99 over the median minute's, with every
  minute's p99.  Target <= 3.
* ``soak.lag_p99 messages=`` -- p99 of the sampled consumer lag, and whether the overdue count was back at 0
  within 60 s after every disturbance.

Samples go to ``var/bench/soak-<time>.csv`` (analysis: benchmarks/soak_analysis.py), the disturbances to
``soak-<time>-events.csv`` and a chart to ``soak-<time>.png``; the services' logs stay in
``var/bench/soak-<time>-work/`` (their data directories are removed).
"""
from __future__ import annotations

import argparse
import array
import asyncio
import base64
import bisect
import csv
import datetime as dt
import itertools
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from bench_lake import line, python_echo, wait_lake_running  # run as a script: this folder is on the path
from soak_analysis import minute_p99s, percentile, recoveries, rss_growth, worst_over_median, write_samples

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's process harness
from spark_standalone import free_port  # noqa: E402

from procs import BROKER, NAMESRV, ProcessHarness, ServiceProcess, wait_until  # noqa: E402
from sparkmq.platform.client import ClientConfig, ConsumeStatus, Message, Producer, PushConsumer  # noqa: E402
from sparkmq.platform.client.admin import AdminClient  # noqa: E402
from sparkmq.platform.common.message import SendStatus  # noqa: E402
from sparkmq.platform.common.wire import ReceivedMessage  # noqa: E402

OUT_DIR = ROOT / "var" / "bench"
#: The issue's targets (../shared/targets.txt; the names are fixed).
TARGET_RSS_GROWTH_PCT = 5.0
TARGET_LOST = 0
TARGET_WORST_OVER_MEDIAN = 3.0

SAMPLE_INTERVAL_S = 10.0
#: Overdue: acknowledged this long ago and not yet consumed (the e2e latency is milliseconds when all is well).
OVERDUE_GRACE_S = 5.0
#: After each disturbance the overdue count must be back at 0 within this.
RECOVERY_WINDOW_S = 60.0
#: Each door's producer runs flat out this long at the start; the soak then runs at half the rate reached.
RAMP_S = 15.0
#: After the ramp, the load runs at the soak's rate this long before the clock (and every figure) starts.
SETTLE_S = 30.0
#: Sending threads per door (each sends synchronously, one message at a time).
SENDERS_PER_DOOR = 4
#: Threads receiving the gRPC door's messages: a receive long-polls one broker (up to 2 s) while messages wait on
#: the other, so two per broker: the client's round robin may send two consecutive receives to the same broker.
GRPC_RECEIVE_THREADS = 4
#: After a failed receive (its broker is down: it fails at once), the next receive goes to the next broker; a short
#: pause only keeps a thread from spinning when every broker is down.
GRPC_RECEIVE_RETRY_S = 0.1
#: Threads acknowledging the gRPC door's messages, so that the receiving threads go back to receive at once.
GRPC_ACK_THREADS = 4
#: The killed master stays down this long.
RESTART_DELAY_S = 15.0
#: After the producers stop, consumers get this long to drain before what is left counts as lost.
DRAIN_S = 60.0
#: Fractions of the run at which the churn group joins and leaves, and at which broker-b's master is killed.
CHURN_AT = (("join", 0.15), ("leave", 0.30), ("join", 0.65), ("leave", 0.80))
KILL_AT = 0.50
KILLED = "broker-b"
QUEUES = 4
#: A service's ready line may take this long on a shared machine.
READY_TIMEOUT_S = 180.0
#: How long each master's lake may take to dispatch its first batch (a SparkSession starts in a minute or more
#: when the machine is busy).
LAKE_START_S = 600.0
PAD = b"." * 200  # bodies of about 230 bytes
DOORS = ("remoting", "http", "grpc")
TOPICS = {"remoting": "SoakRemoting", "http": "SoakHttp", "grpc": "SoakGrpc"}
GROUPS = {"remoting": "soak-remoting", "http": "soak-http", "grpc": "soak-grpc"}
CHURN_GROUP = "soak-churn"


# -- message bodies -----------------------------------------------------------------------------------------------
def encode_body(seq: int) -> bytes:
    """``<seq> <send time ns> <padding>``: what a consumer needs to check the message off and time it."""
    return b"%d %d %s" % (seq, time.time_ns(), PAD)


def decode_body(body: bytes) -> tuple[int, float]:
    """The sequence number and the e2e latency in ms (now minus the send time) of a body of :func:`encode_body`."""
    seq, sent_ns, _ = body.split(b" ", 2)
    return int(seq), (time.time_ns() - int(sent_ns)) / 1e6


# -- what was acknowledged and consumed ---------------------------------------------------------------------------
class Tracker:
    """Acknowledged and consumed sequence numbers of one door (or group), and the e2e latencies of its deliveries.

    Sequence numbers are dense from 0, so a bitmap (a byte each) holds what was consumed in the whole run;
    ``pending`` -- acknowledged, not yet consumed -- stays small while consumers keep up.
    """

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        # Never reset (the run's clock starts over after the ramp): pending and latency times stay comparable.
        self._clock = clock
        self._lock = threading.Lock()
        self._consumed = bytearray()
        self.pending: dict[int, float] = {}
        self.acked_total = 0
        self.consumed_total = 0
        self.duplicates = 0
        #: Acks before this moment (``clock`` seconds) are not expected here: a group that joined later.
        self.accept_from = -math.inf
        self.latency_t = array.array("d")
        self.latency_ms = array.array("d")

    @staticmethod
    def _grow(bits: bytearray, seq: int) -> None:
        if seq >= len(bits):
            bits.extend(bytes(max(seq + 1 - len(bits), 1 << 16)))

    def acked(self, seq: int) -> None:
        """The producer got SEND_OK for ``seq``."""
        now = self._clock()
        if now < self.accept_from:
            return
        with self._lock:
            self.acked_total += 1
            # A consumer may see a message before its producer sees the ack.
            if seq >= len(self._consumed) or not self._consumed[seq]:
                self.pending[seq] = now

    def consumed(self, seq: int, latency_ms: float) -> None:
        """A consumer got ``seq`` (once more, if it had before: a duplicate, not timed again)."""
        with self._lock:
            now = self._clock()  # read under the lock: latency_t stays sorted
            self._grow(self._consumed, seq)
            if self._consumed[seq]:
                self.duplicates += 1
                return
            self._consumed[seq] = 1
            self.consumed_total += 1
            self.pending.pop(seq, None)
            self.latency_t.append(now)
            self.latency_ms.append(latency_ms)

    def overdue(self, grace_s: float = OVERDUE_GRACE_S) -> int:
        """Acknowledged more than ``grace_s`` ago and not consumed yet."""
        limit = self._clock() - grace_s
        with self._lock:
            return sum(1 for at in self.pending.values() if at < limit)

    def latencies_since(self, t_s: float) -> list[float]:
        """The e2e latencies (ms) of first deliveries at or after ``t_s`` (in the tracker's clock)."""
        with self._lock:
            # Appended under the lock from one monotonic clock: the times are sorted.
            return list(self.latency_ms[bisect.bisect_left(self.latency_t, t_s):])


# -- the cluster --------------------------------------------------------------------------------------------------
@dataclass
class Broker:
    """One broker of the cluster: how to start it again, and the process running now."""

    name: str  # broker-a, broker-a-s, ...
    args: list[str]
    master: bool
    proc: ServiceProcess | None = None


class Cluster:
    """Two name servers and two SYNC_MASTER/slave pairs (masters with the lake), each a process on 127.0.0.1."""

    def __init__(self, work: Path, lake_master: str, lake_nice: int | str) -> None:
        self.work = work
        self.procs = ProcessHarness(work)
        self.namesrvs = self.procs.start_many([("namesrv", NAMESRV, ["--scan-interval-s", "1"])] * 2,
                                              ready_timeout=READY_TIMEOUT_S)
        self.namesrv_addrs = ";".join(ns.addr for ns in self.namesrvs)
        lake_conf = work / "lake.toml"
        nice = f'"{lake_nice}"' if lake_nice == "idle" else lake_nice
        lake_conf.write_text(f'[lake]\njobs = ["dispatch"]\nspark_master = "{lake_master}"\nnice = {nice}\n')
        # Fixed ports, so that a restarted master is where clients, its slave and the gRPC routes expect it.
        self.brokers: dict[str, Broker] = {}
        common = ["--namesrv", self.namesrv_addrs, "--register-interval-s", "1", "--segment-size", str(64 << 20)]
        for pair in ("broker-a", "broker-b"):
            port, ha_port, grpc_port = free_port(), free_port(), free_port()
            self.brokers[pair] = Broker(pair, [
                "--config", str(lake_conf), "--lake", "--data-dir", str(work / pair), "--broker-name", pair,
                "--role", "SYNC_MASTER", "--port", str(port), "--ha-port", str(ha_port), "--grpc-port", str(grpc_port),
                *common], master=True)
            self.brokers[f"{pair}-s"] = Broker(f"{pair}-s", [
                "--data-dir", str(work / f"{pair}-s"), "--broker-name", pair, "--broker-id", "1", "--role", "SLAVE",
                "--ha-master-addr", f"127.0.0.1:{ha_port}", *common], master=False)
        started = self.procs.start_many([("broker", BROKER, b.args) for b in self.brokers.values()],
                                        ready_timeout=READY_TIMEOUT_S)
        for broker, proc in zip(self.brokers.values(), started, strict=True):
            broker.proc = proc
        for name in self.masters:
            wait_until(lambda n=name: self.ha(n).get("in_sync_slaves") == 1, 90, f"{name}'s slave in sync")

    @property
    def masters(self) -> list[str]:
        """The masters' names."""
        return [b.name for b in self.brokers.values() if b.master]

    def url(self, name: str) -> str:
        """``http://host:port`` of broker ``name`` (the same across a restart)."""
        proc = self.brokers[name].proc
        assert proc is not None
        return proc.url

    def grpc_addr(self, name: str) -> str:
        """The gRPC endpoint broker ``name`` was started with."""
        args = self.brokers[name].args
        return f"127.0.0.1:{args[args.index('--grpc-port') + 1]}"

    def ha(self, name: str) -> dict[str, Any]:
        """``GET /broker/ha`` of ``name`` ({} when it does not answer)."""
        try:
            return httpx.get(f"{self.url(name)}/broker/ha", timeout=5).json()
        except httpx.HTTPError:
            return {}

    def alive(self, name: str) -> bool:
        """Whether ``name``'s process runs."""
        proc = self.brokers[name].proc
        return proc is not None and proc.proc.poll() is None

    def client_config(self, **overrides: Any) -> ClientConfig:
        """Sub-second discovery so that a kill or a group change shows quickly; tracing off (it is not soaked)."""
        settings: dict[str, Any] = dict(namesrv_addrs=self.namesrv_addrs, trace_enabled=False,
                                        heartbeat_interval_s=1.0, rebalance_interval_s=2.0,
                                        route_refresh_interval_s=2.0, offset_commit_interval_s=1.0,
                                        long_poll_wait_ms=5000, send_timeout_s=5.0,
                                        offset_store_dir=str(self.work / "client-offsets"))
        settings.update(overrides)
        return ClientConfig(**settings)

    def create_topics(self) -> None:
        """The doors' topics on both masters, routed by both name servers."""
        admin = AdminClient(self.client_config())
        try:
            for topic in TOPICS.values():
                admin.create_topic(topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        finally:
            admin.close()
        for ns in self.namesrvs:
            for topic in TOPICS.values():
                wait_until(lambda ns=ns, t=topic: _routed_masters(ns, t) == 2, 30, f"the route of {topic}")

    def descendants(self) -> list[psutil.Process]:
        """Every child of every broker: the lakes' JVMs and Python workers."""
        found = []
        for broker in self.brokers.values():
            if broker.proc is not None and broker.proc.proc.poll() is None:
                try:
                    found += psutil.Process(broker.proc.proc.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    pass
        return found

    def kill(self, name: str) -> None:
        """SIGKILL ``name``; its lake's JVM notices its parent gone and exits -- else it is killed by pid too."""
        proc = self.brokers[name].proc
        assert proc is not None
        children = psutil.Process(proc.proc.pid).children(recursive=True)
        proc.kill9()
        _reap(children, 20.0)

    def restart(self, name: str) -> None:
        """Start ``name`` again with the arguments (ports, data directory) it first had."""
        self.brokers[name].proc = self.procs.start("broker", BROKER, *self.brokers[name].args,
                                                   ready_timeout=READY_TIMEOUT_S)

    def stop(self) -> None:
        """Stop every process started (newest first, by pid), and whatever a broker left behind."""
        children = self.descendants()
        for service in reversed(self.procs.started):
            service.stop(timeout=90)  # a lake broker stops its streaming job first
        _reap(children, 10.0)
        for broker in self.brokers.values():
            shutil.rmtree(self.work / broker.name, ignore_errors=True)  # the logs stay


def _routed_masters(ns: ServiceProcess, topic: str) -> int:
    """How many masters the name server ``ns`` routes ``topic`` to."""
    answer = httpx.get(f"{ns.url}/routes/{topic}", timeout=5)
    return len(answer.json().get("broker_datas", [])) if answer.status_code == 200 else 0


def _reap(children: list[psutil.Process], timeout: float) -> None:
    """Wait for ``children`` to exit; SIGKILL those still there after ``timeout`` (each by its pid)."""
    _gone, alive = psutil.wait_procs(children, timeout=timeout)
    for child in alive:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- the doors ----------------------------------------------------------------------------------------------------
class Door:
    """A producer and a consumer of one topic through one protocol; subclasses say how to send and receive."""

    name = ""

    def __init__(self, cluster: Cluster, trackers: list[Tracker]) -> None:
        self.cluster = cluster
        self.topic = TOPICS[self.name]
        self.group = GROUPS[self.name]
        #: The door's own tracker first; the churn group's too on the remoting door.
        self.trackers = trackers
        self._seqs = itertools.count()  # shared by the door's sending threads (next() is atomic)
        self.send_errors = 0
        self.stopping = threading.Event()
        #: Each acknowledged send's round trip (ms) since the last sample: the producer's share of the e2e latency.
        self._send_ms: list[float] = []
        self._send_lock = threading.Lock()

    def send(self, body: bytes) -> bool:
        """Send one message; whether it was acknowledged (SEND_OK)."""
        raise NotImplementedError

    def start_consumer(self) -> None:
        """Start consuming ``self.topic`` in ``self.group``, checking messages off the door's tracker."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the consumer and close the producer."""
        self.stopping.set()

    def send_one(self) -> bool:
        """Send the next sequence number; trackers hear of it when it was acknowledged."""
        seq = next(self._seqs)
        started = time.monotonic()
        try:
            ok = self.send(encode_body(seq))
        except Exception:  # a broker is down or slow: not acknowledged, so not expected anywhere
            ok = False
        if ok:
            with self._send_lock:
                self._send_ms.append((time.monotonic() - started) * 1000)
            for tracker in self.trackers:
                tracker.acked(seq)
        else:
            self.send_errors += 1
        return ok

    def deliver(self, body: bytes) -> None:
        """A consumer of this door's group got ``body``."""
        seq, latency_ms = decode_body(body)
        self.trackers[0].consumed(seq, latency_ms)

    def take_figures(self) -> dict[str, float | int | None]:
        """Figures of the door's own client since the last call, for the sample's row: the p99 of its
        acknowledged sends' round trips (``<door>_send_p99_ms``); subclasses add their own."""
        with self._send_lock:
            send_ms, self._send_ms = self._send_ms, []
        return {f"{self.name}_send_p99_ms": round(percentile(send_ms, 0.99), 2) if send_ms else None}


class RemotingDoor(Door):
    """sparkmq's Python client over RocketMQ remoting: ``Producer.send`` and a ``PushConsumer``."""

    name = "remoting"

    def __init__(self, cluster: Cluster, trackers: list[Tracker]) -> None:
        super().__init__(cluster, trackers)
        self.producer = Producer("soak-remoting-producer", cluster.client_config()).start()
        self.consumer: PushConsumer | None = None

    def send(self, body: bytes) -> bool:
        return self.producer.send(Message(self.topic, body)).status is SendStatus.SEND_OK

    def start_consumer(self) -> None:
        self.consumer = push_consumer(self.cluster, self.group, self.topic, self.deliver)

    def stop(self) -> None:
        super().stop()
        if self.consumer is not None:
            self.consumer.shutdown()
        self.producer.shutdown()


def push_consumer(cluster: Cluster, group: str, topic: str, deliver: Callable[[bytes], None],
                  from_where: str = "CONSUME_FROM_FIRST_OFFSET") -> PushConsumer:
    """A started PushConsumer of ``topic`` in ``group`` calling ``deliver`` with each body.

    ``from_where`` applies only to a group without offsets: the door's groups start at the first (their topics
    are new), the churn group at the last (it joins a topic already in use) and later where it left.
    """
    consumer = PushConsumer(group, cluster.client_config(), consume_from_where=from_where)
    consumer.subscribe(topic, "*")

    def listener(messages: list[ReceivedMessage]) -> ConsumeStatus:
        for message in messages:
            deliver(message.body)
        return ConsumeStatus.CONSUME_SUCCESS
    consumer.register_listener(listener)
    consumer.start()
    return consumer


class HttpDoor(Door):
    """The brokers' HTTP endpoints: ``POST /topics/{t}/messages`` to the masters in turn, and long-polling pulls of
    every queue with the group's offset committed on each pull (what an HTTP-only client can do)."""

    name = "http"

    def __init__(self, cluster: Cluster, trackers: list[Tracker]) -> None:
        super().__init__(cluster, trackers)
        self.http = httpx.Client(timeout=10)
        self._turn = 0
        self._down_until: dict[str, float] = {}
        self._thread: threading.Thread | None = None

    def send(self, body: bytes) -> bool:
        masters = self.cluster.masters
        for _ in masters:  # a failed master is skipped a few seconds, as the remoting client's fault isolation does
            self._turn += 1
            name = masters[self._turn % len(masters)]
            if self._down_until.get(name, 0) > time.monotonic():
                continue
            try:
                answer = self.http.post(f"{self.cluster.url(name)}/topics/{self.topic}/messages",
                                        json={"body": body.decode()})
            except httpx.HTTPError:
                self._down_until[name] = time.monotonic() + 3
                continue
            return answer.status_code == 200 and answer.json().get("status") == "SEND_OK"
        return False

    def start_consumer(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._consume()), name="soak-http-consumer",
                                        daemon=True)
        self._thread.start()

    async def _consume(self) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            await asyncio.gather(*(self._consume_queue(http, name, q) for name in self.cluster.masters
                                   for q in range(QUEUES)))

    async def _consume_queue(self, http: httpx.AsyncClient, name: str, queue_id: int) -> None:
        url = self.cluster.url(name)
        offset: int | None = None
        while not self.stopping.is_set():
            try:
                if offset is None:  # where the group left off (-1: never committed; the topic is new)
                    answer = await http.get(f"{url}/consumers/{self.group}/offsets/{self.topic}/{queue_id}")
                    offset = max(0, answer.json()["offset"])
                answer = await http.get(f"{url}/topics/{self.topic}/queues/{queue_id}/messages", params={
                    "offset": offset, "max": 64, "group": self.group, "commit_offset": offset, "wait_ms": 2000})
                page = answer.json()
                for message in page.get("messages", ()):
                    self.deliver(base64.b64decode(message["body"]))
                offset = page.get("next_offset", offset)
            except (httpx.HTTPError, KeyError, ValueError):  # the master is down (the kill) or restarting
                await asyncio.sleep(1.0)

    def stop(self) -> None:
        super().stop()
        if self._thread is not None:
            self._thread.join(30)
        self.http.close()


class GrpcDoor(Door):
    """The official RocketMQ 5 client over gRPC: ``Producer.send`` and a ``SimpleConsumer`` (receive, ack)."""

    name = "grpc"

    def __init__(self, cluster: Cluster, trackers: list[Tracker]) -> None:
        super().__init__(cluster, trackers)
        from rocketmq import ClientConfiguration, Credentials, Producer

        # broker-a's endpoint: the routes it serves name broker-b's, which the client then uses directly.
        self.configuration = ClientConfiguration(cluster.grpc_addr("broker-a"), Credentials(), request_timeout=5)
        self.producer = Producer(self.configuration, (self.topic,))
        self.producer.startup()
        self._consumer: Any = None
        self._receivers: list[threading.Thread] = []
        self._acker = ThreadPoolExecutor(GRPC_ACK_THREADS, thread_name_prefix="soak-grpc-ack")
        #: Each ack's round trip (ms) since the last sample, and the calls that failed (under the lock: several
        #: threads count).
        self._figures_lock = threading.Lock()
        self._ack_ms: list[float] = []
        self._ack_errors = 0
        self._receive_errors = 0

    def send(self, body: bytes) -> bool:
        from rocketmq import Message as GrpcMessage

        message = GrpcMessage()
        message.topic = self.topic
        message.body = body
        self.producer.send(message)  # raises unless the broker answered OK
        return True

    def start_consumer(self) -> None:
        from rocketmq import FilterExpression, SimpleConsumer

        consumer = SimpleConsumer(self.configuration, self.group, {self.topic: FilterExpression()}, await_duration=2)
        consumer.startup()
        self._consumer = consumer

        def ack(message: Any) -> None:
            started = time.monotonic()
            try:
                consumer.ack(message)
                failed = 0
            except Exception:  # not settled: it comes back after its invisible time (a duplicate)
                failed = 1
            with self._figures_lock:
                self._ack_errors += failed
                self._ack_ms.append((time.monotonic() - started) * 1000)

        def loop() -> None:
            while not self.stopping.is_set():
                try:
                    messages = consumer.receive(32, 30) or []
                except Exception:  # a broker is down: receive again
                    with self._figures_lock:
                        self._receive_errors += 1
                    time.sleep(GRPC_RECEIVE_RETRY_S)
                    continue
                # The application holds the whole batch once receive returns; acking each message in this thread
                # before looking at the next would put the batch's earlier acks into the later messages' latency.
                for message in messages:
                    self.deliver(message.body)
                for message in messages:
                    self._acker.submit(ack, message)
        self._receivers = [threading.Thread(target=loop, name=f"soak-grpc-receive-{i}", daemon=True)
                           for i in range(GRPC_RECEIVE_THREADS)]
        for thread in self._receivers:
            thread.start()

    def take_figures(self) -> dict[str, float | int | None]:
        """The acks' round trips (p99 and max) and the failed receives and acks since the last call."""
        with self._figures_lock:
            ack_ms, ack_errors, receive_errors = self._ack_ms, self._ack_errors, self._receive_errors
            self._ack_ms, self._ack_errors, self._receive_errors = [], 0, 0
        return {**super().take_figures(),
                "grpc_ack_p99_ms": round(percentile(ack_ms, 0.99), 2) if ack_ms else None,
                "grpc_ack_max_ms": round(max(ack_ms), 2) if ack_ms else None,
                "grpc_ack_errors": ack_errors, "grpc_receive_errors": receive_errors}

    def stop(self) -> None:
        super().stop()
        for thread in self._receivers:
            thread.join(30)
        self._acker.shutdown(wait=True)
        if self._consumer is not None:
            self._consumer.shutdown()
        self.producer.shutdown()


# -- load ---------------------------------------------------------------------------------------------------------
class Load:
    """SENDERS_PER_DOOR sending threads per door, flat out or sharing a set rate (messages per second).

    Several threads, because one synchronous sender measures the round trip, not the most a door can take.
    """

    def __init__(self, doors: list[Door]) -> None:
        self.doors = doors
        self.rates: dict[str, float | None] = {d.name: None for d in doors}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(d,), name=f"soak-send-{d.name}-{i}", daemon=True)
                         for d in doors for i in range(SENDERS_PER_DOOR)]

    def start(self) -> Load:
        """Start sending."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop sending (each thread finishes its send in flight)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, door: Door) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            rate = self.rates[door.name]
            if rate:
                due += SENDERS_PER_DOOR / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -1.0:
                    due = time.monotonic()  # after a stall (the kill) go on at the rate, not in a burst
            door.send_one()


# -- samples ------------------------------------------------------------------------------------------------------
def proc_figures(pid: int) -> dict[str, int]:
    """RSS (kB), threads and open files of ``pid`` from /proc."""
    figures = {}
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = row.partition(":")
        if key == "VmRSS":
            figures["rss_kb"] = int(value.split()[0])
        elif key == "Threads":
            figures["threads"] = int(value)
    figures["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return figures


@dataclass
class Run:
    """The run's state shared by the sampler and the disturbances: the clock starts when the steady load does."""

    cluster: Cluster
    started: float = field(default_factory=lambda: time.monotonic() + RAMP_S)
    churn_joined: bool = False
    events: list[tuple[str, float]] = field(default_factory=list)
    samples: list[dict[str, float | int | None]] = field(default_factory=list)
    #: The doors, once made: each adds its client's own figures to every sample.
    doors: dict[str, Door] = field(default_factory=dict)
    trackers: dict[str, Tracker] = field(init=False)
    churn: Tracker = field(init=False)

    def __post_init__(self) -> None:
        self.trackers = {door: Tracker(door) for door in DOORS}
        self.churn = Tracker(CHURN_GROUP)
        self.churn.accept_from = math.inf  # until it first joins, it expects nothing

    def clock(self) -> float:
        """Seconds since the steady load began."""
        return time.monotonic() - self.started

    def event(self, name: str) -> None:
        """Note a disturbance now."""
        self.events.append((name, round(self.clock(), 1)))
        print(f"  t={self.clock():6.0f}s {name}", file=sys.stderr, flush=True)

    def lag(self) -> tuple[int, int]:
        """The consumer lag the live masters report for the doors' groups (and the churn group while it is
        there), and how many masters answered."""
        groups = [(GROUPS[d], TOPICS[d]) for d in DOORS] + ([(CHURN_GROUP, TOPICS["remoting"])]
                                                            if self.churn_joined else [])
        total, answered = 0, 0
        for name in self.cluster.masters:
            try:
                for group, topic in groups:
                    answer = httpx.get(f"{self.cluster.url(name)}/consumers/{group}/lag", params={"topic": topic},
                                       timeout=5)
                    total += answer.json()["total_lag"]
                answered += 1
            except (httpx.HTTPError, KeyError, ValueError):
                pass
        return total, answered

    def lake_rows(self, name: str) -> int | None:
        """Rows master ``name``'s lake has dispatched into its tables (None: no answer)."""
        try:
            health = httpx.get(f"{self.cluster.url(name)}/health", timeout=5).json()
            return health["lake"]["jobs"]["dispatch"].get("rows_total")
        except (httpx.HTTPError, KeyError, ValueError):
            return None

    def sample(self, since: float) -> None:
        """Record one sample: the brokers' processes, lag, overdue messages, the e2e p99 since ``since``
        (monotonic seconds)."""
        row: dict[str, float | int | None] = {"t_s": round(self.clock(), 1)}
        for name, broker in self.cluster.brokers.items():
            if broker.proc is None or not self.cluster.alive(name):
                continue
            pid = broker.proc.proc.pid
            try:
                figures = proc_figures(pid)
                children = psutil.Process(pid).children(recursive=True)
                lake_kb = sum(c.memory_info().rss for c in children) // 1024
            except (OSError, psutil.Error):
                continue
            row[f"{name}_pid"] = pid
            row.update({f"{name}_{k}": v for k, v in figures.items()})
            row[f"{name}_children_rss_kb"] = lake_kb
        for name in self.cluster.masters:
            row[f"{name}_lake_rows"] = self.lake_rows(name)
        row["lag"], row["masters_answering"] = self.lag()
        overdue = sum(t.overdue() for t in self.trackers.values())
        row["overdue"] = overdue + (self.churn.overdue() if self.churn_joined else 0)
        latencies: list[float] = []
        for door, tracker in self.trackers.items():  # per door too: which protocol's consumers a disturbance held
            door_latencies = tracker.latencies_since(since)
            latencies += door_latencies
            row[f"{door}_overdue"] = tracker.overdue()
            row[f"{door}_e2e_p99_ms"] = round(percentile(door_latencies, 0.99), 2) if door_latencies else None
        row["e2e_p99_ms"] = round(percentile(latencies, 0.99), 2) if latencies else None
        row["delivered"] = len(latencies)
        row["acked_total"] = sum(t.acked_total for t in self.trackers.values())
        row["churn_joined"] = int(self.churn_joined)
        for door in self.doors.values():
            row.update(door.take_figures())
        self.samples.append(row)


def schedule(duration_s: float) -> list[tuple[float, str]]:
    """The disturbances of a run of ``duration_s`` seconds, in order: (clock seconds, what)."""
    plan = [(frac * duration_s, f"churn-{what}") for what, frac in CHURN_AT]
    plan += [(KILL_AT * duration_s, f"kill-{KILLED}"), (KILL_AT * duration_s + RESTART_DELAY_S, f"restart-{KILLED}")]
    return sorted(plan)


class Disturbances:
    """The churn group's joins and leaves and the kill and restart of broker-b's master, each applied on a thread
    of its own so that sampling stays on time (a restart waits for the broker's ready line)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.churn: PushConsumer | None = None
        self._last: threading.Thread | None = None

    def start(self, what: str) -> None:
        """Note ``what`` now (its recovery window starts here) and apply it once the previous one is done."""
        self.run.event(what)
        previous = self._last
        self._last = threading.Thread(target=self._apply, args=(what, previous), name=f"soak-{what}", daemon=True)
        self._last.start()

    def _apply(self, what: str, previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()
        run = self.run
        if what == "churn-join":
            if run.churn.accept_from == math.inf:
                # Its first offsets are taken when queues are first assigned: expect what is acked after that.
                run.churn.accept_from = time.monotonic() + 10.0
            self.churn = push_consumer(run.cluster, CHURN_GROUP, TOPICS["remoting"],
                                       lambda body: run.churn.consumed(*decode_body(body)), "CONSUME_FROM_LAST_OFFSET")
            run.churn_joined = True
        elif what == "churn-leave":
            self.finish_churn()
        elif what.startswith("kill-"):
            run.cluster.kill(KILLED)
        elif what.startswith("restart-"):
            run.cluster.restart(KILLED)

    def finish_churn(self) -> None:
        """The churn group leaves (if it is there)."""
        if self.churn is not None:
            self.churn.shutdown()
            self.churn, self.run.churn_joined = None, False

    def wait(self) -> None:
        """Wait for the last disturbance to be applied."""
        if self._last is not None:
            self._last.join()


def soak(run: Run, duration_s: float) -> None:
    """Run the disturbances on schedule, sampling every 10 s, until the run and every recovery window are over."""
    plan = schedule(duration_s)
    end = max(duration_s, plan[-1][0] + RECOVERY_WINDOW_S + SAMPLE_INTERVAL_S)
    disturbances = Disturbances(run)
    next_sample = SAMPLE_INTERVAL_S
    while run.clock() < end:
        now = run.clock()
        if plan and plan[0][0] <= now:
            disturbances.start(plan.pop(0)[1])
        elif now >= next_sample:
            run.sample(run.started + next_sample - SAMPLE_INTERVAL_S)
            next_sample += SAMPLE_INTERVAL_S
        else:
            time.sleep(min(0.2, max(0.0, min(next_sample, plan[0][0] if plan else end) - now)))
    disturbances.wait()
    disturbances.finish_churn()


# -- report -------------------------------------------------------------------------------------------------------
def write_chart(path: Path, run: Run, brokers: list[str]) -> bool:
    """A PNG of RSS, threads, open files, lag/overdue and e2e p99 over time; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = [s["t_s"] for s in run.samples]

    def series(key: str) -> list[float]:
        return [math.nan if s.get(key) is None else float(s[key]) for s in run.samples]  # type: ignore[arg-type]

    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    for name in brokers:
        axes[0].plot(t, [v / 1024 for v in series(f"{name}_rss_kb")], label=name)
        axes[1].plot(t, series(f"{name}_threads"), label=f"{name} threads")
        axes[1].plot(t, series(f"{name}_fds"), linestyle="--", label=f"{name} fds")
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].set_ylabel("threads / open files")
    axes[2].plot(t, series("lag"), label="consumer lag (masters)")
    axes[2].plot(t, series("overdue"), label=f"overdue (acked > {OVERDUE_GRACE_S:.0f} s, not consumed)")
    axes[2].set_ylabel("messages")
    axes[3].plot(t, series("e2e_p99_ms"), label="e2e p99 per 10 s")
    axes[3].set_ylabel("ms")
    axes[3].set_xlabel("seconds of steady load")
    for ax in axes:
        for _name, at in run.events:
            ax.axvline(at, color="grey", linestyle=":", linewidth=1)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_title("sparkmq soak: " + ", ".join(f"{name}@{at:.0f}s" for name, at in run.events), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def report(run: Run, duration_s: float, echo: float, rates: dict[str, tuple[float, float]], send_errors: int) -> None:
    """Print the soak's lines (names fixed by the issue)."""
    brokers = list(run.cluster.brokers)
    growth = rss_growth(run.samples, brokers, duration_s)  # type: ignore[arg-type]
    scaled = "" if duration_s == 1800 else f" (scaled from min 5-15 vs 20-30 for a {duration_s / 60:g}-minute run)"
    line("soak.rss_growth", pct=round(growth.pct, 2), target_pct=TARGET_RSS_GROWTH_PCT,
         reached=growth.passed(TARGET_RSS_GROWTH_PCT), windows=repr(growth.windows.describe() + scaled),
         **{g.broker: (round(g.pct, 2) if g.pct is not None else g.reason) for g in growth.brokers},
         echo_msgs_per_s=round(echo))
    lost = {name: len(t.pending) for name, t in run.trackers.items()}
    line("soak.lost", count=sum(lost.values()), target=TARGET_LOST, reached=sum(lost.values()) <= TARGET_LOST,
         **{f"{name}_lost": n for name, n in lost.items()},
         acked=sum(t.acked_total for t in run.trackers.values()),
         duplicates=sum(t.duplicates for t in run.trackers.values()), echo_msgs_per_s=round(echo))
    # Tracker times are monotonic seconds; the minutes count from the steady load's start.
    pairs = [(t - run.started, ms) for tracker in run.trackers.values()
             for t, ms in zip(tracker.latency_t, tracker.latency_ms, strict=True)]
    p99s = minute_p99s(pairs, duration_s)
    ratio = worst_over_median(p99s)
    line("soak.e2e_p99_ms", worst_over_median=round(ratio, 2), target=TARGET_WORST_OVER_MEDIAN,
         reached=ratio <= TARGET_WORST_OVER_MEDIAN, p99_ms=round(percentile((ms for _, ms in pairs), 0.99), 2),
         per_minute_p99_ms="/".join(f"{v:.1f}" for v in p99s), echo_msgs_per_s=round(echo))
    lags = [s["lag"] for s in run.samples if s.get("lag") is not None]
    # A restart is part of the kill's disturbance: the kill's window runs from the kill.
    disturbances = [e for e in run.events if not e[0].startswith("restart-")]
    found = recoveries(run.samples, "overdue", disturbances, RECOVERY_WINDOW_S)  # type: ignore[arg-type]
    back = all(r.recovered for r in found)
    line("soak.lag_p99", messages=round(percentile(lags, 0.99)) if lags else "nan",
         overdue_p99=round(percentile([s["overdue"] for s in run.samples], 0.99)),  # type: ignore[misc]
         returned_to_0=back, recovered=f"{sum(r.recovered for r in found)}/{len(found)}",
         after=repr(",".join(f"{r.event}@{r.at_s:.0f}s:" + (f"{r.after_s:.0f}s" if r.recovered else "no")
                             for r in found)),
         churn_duplicates=run.churn.duplicates, echo_msgs_per_s=round(echo))
    line("soak.load", **{f"{door}_max_msgs_per_s": round(mx) for door, (mx, _) in rates.items()},
         **{f"{door}_msgs_per_s": round(r) for door, (_, r) in rates.items()},
         send_errors=send_errors, minutes=round(run.clock() / 60, 1), echo_msgs_per_s=round(echo))


def write_outputs(run: Run, stamp: str) -> tuple[Path, Path | None]:
    """The samples' CSV, the events' CSV and the chart under var/bench/; the CSV's and chart's paths."""
    csv_path = OUT_DIR / f"soak-{stamp}.csv"
    write_samples(csv_path, run.samples)
    with (OUT_DIR / f"soak-{stamp}-events.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["event", "t_s"])
        writer.writerows(run.events)
    png = OUT_DIR / f"soak-{stamp}.png"
    return csv_path, png if write_chart(png, run, list(run.cluster.brokers)) else None


# -- main ---------------------------------------------------------------------------------------------------------
def ramp(load: Load, doors: dict[str, Door]) -> dict[str, tuple[float, float]]:
    """Each door flat out for RAMP_S: (the rate reached, half of it) per door; the load goes on at the half."""
    before = {name: door.trackers[0].acked_total for name, door in doors.items()}
    started = time.monotonic()
    time.sleep(RAMP_S)
    elapsed = time.monotonic() - started
    rates = {}
    for name, door in doors.items():
        reached = (door.trackers[0].acked_total - before[name]) / elapsed
        rates[name] = (reached, max(1.0, reached / 2))
        load.rates[name] = rates[name][1]
    return rates


def settle(run: Run) -> None:
    """Run at the soak's rate for SETTLE_S before the clock starts: the flat-out ramp leaves sends, replication
    and consumers backed up, and minute 0's e2e p99 would measure the ramp, not the soak."""
    since = time.monotonic()
    time.sleep(SETTLE_S)
    latencies = [ms for t in run.trackers.values() for ms in t.latencies_since(since + SETTLE_S / 2)]
    print(f"  settled: e2e p99 {percentile(latencies, 0.99):.0f} ms in the last {SETTLE_S / 2:.0f} s", file=sys.stderr)


def drain(trackers: dict[str, Tracker], timeout: float) -> None:
    """Wait until every acknowledged message was consumed, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(t.pending for t in trackers.values()) and time.monotonic() < deadline:
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of steady load (default 30)")
    parser.add_argument("--quick", action="store_true", help="a 2-minute run (build.py bench --quick)")
    parser.add_argument("--lake-master", default="local[1]", help="spark.master of each master's lake")
    parser.add_argument("--lake-nice", default="10",
                        help='priority of the lakes\' Spark: a niceness 1..19 or "idle" (default 10: on a busy '
                             "shared machine an idle-priority lake may not start at all)")
    args = parser.parse_args()
    duration_s = (2.0 if args.quick else args.minutes) * 60
    echo = python_echo()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work = OUT_DIR / f"soak-{stamp}-work"
    work.mkdir(parents=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the lakes' Python workers: this venv's
    cluster: Cluster | None = None
    doors: dict[str, Door] = {}
    run: Run | None = None
    try:
        cluster = Cluster(work, args.lake_master, args.lake_nice if args.lake_nice == "idle" else int(args.lake_nice))
        cluster.create_topics()
        run = Run(cluster)
        churn = run.churn
        doors = {"remoting": RemotingDoor(cluster, [run.trackers["remoting"], churn]),
                 "http": HttpDoor(cluster, [run.trackers["http"]]),
                 "grpc": GrpcDoor(cluster, [run.trackers["grpc"]])}
        run.doors = doors
        for door in doors.values():
            door.start_consumer()
            for _ in range(20):  # something for each master's lake to dispatch before it counts as running
                door.send_one()
        for name in cluster.masters:
            wait_lake_running(cluster.url(name).removeprefix("http://"), LAKE_START_S)
        load = Load(list(doors.values())).start()
        rates = ramp(load, doors)
        settle(run)
        run.started = time.monotonic()
        soak(run, duration_s)
        load.stop()
        drain(run.trackers, DRAIN_S)
    except Exception as exc:  # the figures cannot be judged: say why on each line
        for name in ("soak.rss_growth", "soak.lost", "soak.e2e_p99_ms", "soak.lag_p99"):
            line(name, error=repr(f"{type(exc).__name__}: {exc}"[:300]), echo_msgs_per_s=round(echo))
        raise
    finally:
        for door in doors.values():
            try:
                door.stop()
            except Exception as exc:  # stopping the rest matters more
                print(f"stopping the {door.name} door: {exc!r}", file=sys.stderr)
        if cluster is not None:
            cluster.stop()
    csv_path, png = write_outputs(run, stamp)
    report(run, duration_s, echo, rates, sum(d.send_errors for d in doors.values()))
    print(f"soak: samples {csv_path.relative_to(ROOT)}, chart "
          f"{png.relative_to(ROOT) if png else '(none: matplotlib is not installed)'}, logs {work.relative_to(ROOT)}",
          flush=True)


if __name__ == "__main__":
    main()

"""sparkmq side by side with Apache RocketMQ 5.5.0 and Apache Kafka 4.4.0 on this machine (issue 28).

    python benchmarks/bench_peers.py [--quick] [--rounds N] [--only NAME[,NAME]]     (python3 build.py bench peers)

First the line of ../shared/tools/python_echo.py, then one line per figure (``ratio=`` sparkmq / peer), then a
markdown table and a bar chart under ``var/bench/``.  Each figure's two sides are measured in the same run, A B A B
(sparkmq, then the peer, each round), one system running at a time, every process stopped by pid; a side's
figure is the median of its rounds.  Setups, versions and client settings: docs/benchmarks.md.

RocketMQ figures (1 KiB bodies; the same Java program against both: benchmarks/java/):

* ``peers.rocketmq_produce_batch`` -- DefaultMQProducer, batches of 64, 32 threads: msgs/s (ASYNC_FLUSH);
* ``peers.rocketmq_produce_sync`` -- single sync sends, 64 threads: msgs/s;
* ``peers.rocketmq_consume`` -- DefaultLitePullConsumer draining 1,000,000: msgs/s;
* ``peers.rocketmq_e2e`` -- DefaultMQPushConsumer at 2,000 msgs/s: p50/p99 ms from the send call to the
  listener (one JVM), ``p99_ratio``;
* ``peers.rocketmq_sync_flush`` -- SYNC_FLUSH, 64 threads of single sync sends: msgs/s;
* ``peers.rocketmq_sync_master`` -- SYNC_MASTER with a slave, batches of 64, 32 threads: msgs/s;
* ``peers.rocketmq_dledger`` -- a 3-member DLedger group, batches of 64, 32 threads: msgs/s;
* ``peers.rocketmq_pop`` -- rocketmq-client-java SimpleConsumer, receive 32 + ack, 4 threads, draining a
  backlog (RocketMQ: the proxy in local mode): msgs/s;
* ``peers.rocketmq_grpc_send`` -- rocketmq-client-java Producer, single sends, 32 threads: msgs/s.

Kafka figures (each with its own best client, the same durability: acks=all on one node is the page cache,
as sparkmq's ASYNC_FLUSH):

* ``peers.kafka_produce`` -- ProducerPerformance (acks=all, 1 KiB, unthrottled) vs sparkmq's ``Producer.send_async``
  (its own batching): msgs/s;
* ``peers.kafka_consume`` -- ConsumerPerformance draining 1,000,000 vs sparkmq's ``PullConsumer``: msgs/s;
* ``peers.kafka_spark_source`` -- one SparkSession (local[2]): a ``readStream`` with ``trigger(availableNow)`` into
  the ``noop`` sink, over Spark's Kafka source (1,000,000 records) vs the ``sparkmq`` source (1,000,000
  messages): rows (the query's numInputRows) per second.

The sparkmq side runs as RocketMQ does here: a name server process and broker processes (``SparkmqCluster``), the
Java clients speaking RocketMQ's remoting protocol (or gRPC) to them exactly as to RocketMQ.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench_messaging import BODY, line  # the benchmarks' one line format and 1 KiB body

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import peers  # noqa: E402  (benchmarks/: the peers' processes)
import remoting_capture  # noqa: E402  (tests/: a remoting request, to probe a server)
from java_clients import JAVA_DIR, JavaProgram, java_command, mqadmin  # noqa: E402

from sparkmq.platform.common import jars  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH_JAVA = ROOT / "benchmarks" / "java"
ECHO = ROOT.parent / "shared" / "tools" / "python_echo.py"
OUT_DIR = ROOT / "var" / "bench"
TARGETS = ROOT.parent / "shared" / "targets.txt"
#: The jar sets this benchmark runs (fetched once into the jar cache).
SETS = ("rocketmq-client", "rocketmq-server", "rocketmq-grpc-client", "kafka", "spark-kafka")
#: The Java benchmark drivers: remoting (rocketmq-client) and gRPC (rocketmq-client-java), each with tests/java's
#: small utilities (arguments, JSON lines, latency samples).
REMOTING_BENCH = JavaProgram("bench-remoting", (JAVA_DIR / "sparkmq" / "jutil", BENCH_JAVA / "remoting"),
                             ("rocketmq-client",))
GRPC_BENCH = JavaProgram("bench-grpc", (JAVA_DIR / "sparkmq" / "jutil", BENCH_JAVA / "grpc"),
                         ("rocketmq-grpc-client",))


@dataclass(frozen=True)
class Sizes:
    """How much each figure does (full run or ``--quick``)."""

    seconds: float
    warmup_s: float
    drain: int
    e2e_s: float
    pop: int
    kafka: int
    spark: int

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        if quick:
            return cls(seconds=5, warmup_s=2, drain=100_000, e2e_s=8, pop=20_000, kafka=100_000, spark=100_000)
        return cls(seconds=20, warmup_s=5, drain=1_000_000, e2e_s=30, pop=100_000, kafka=1_000_000, spark=1_000_000)


@dataclass
class Measure:
    """One side's figure in one round: its values (``msgs_per_s``, ``p99_ms``, ...) or why there is none."""

    values: dict[str, float] = field(default_factory=dict)
    status: str = "ok"

    @classmethod
    def unavailable(cls, status: str) -> Measure:
        return cls({}, status)


# -- running things ---------------------------------------------------------------------------------------------------
def java_bench(program: JavaProgram, main: str, args: list[str], work: Path, *, heap: str = "1g",
               timeout: float = 1200.0) -> dict[str, object]:
    """Run a Java benchmark driver to its end; its ``result`` JSON line."""
    work.mkdir(parents=True, exist_ok=True)
    name = f"{args[0]}-{time.monotonic_ns()}"
    argv = java_command(program.classpath(), main, args, heap=heap, log_file=work / f"{name}.rocketmq.log",
                        log_level="WARN", fast_start=False)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    (work / f"{name}.stderr").write_text(result.stderr)
    for text in reversed(result.stdout.splitlines()):
        if text.startswith("{"):
            event = json.loads(text)
            if event.get("event") == "result":
                return event
    raise RuntimeError(f"{main} {args[0]} printed no result (exit {result.returncode}): {result.stderr[-1500:]}")


def remoting(args: list[str], work: Path, **kw: object) -> dict[str, object]:
    """RemotingBench (rocketmq-client 5.5.0)."""
    return java_bench(REMOTING_BENCH, "sparkmq.bench.RemotingBench", args, work, **kw)  # type: ignore[arg-type]


def grpc(args: list[str], work: Path, **kw: object) -> dict[str, object]:
    """GrpcBench (rocketmq-client-java 5.2.0)."""
    return java_bench(GRPC_BENCH, "sparkmq.bench.GrpcBench", args, work, **kw)  # type: ignore[arg-type]


def values(result: dict[str, object], *keys: str) -> dict[str, float]:
    """The numeric figures of a result line."""
    return {k: float(result[k]) for k in keys if isinstance(result.get(k), (int, float))}  # type: ignore[arg-type]


class SparkmqCluster:
    """sparkmq deployed as RocketMQ is here: a name server process and broker processes (``python -m
    sparkmq.api.namesrv_main`` / ``broker_main``), on free loopback ports under ``root``, each stopped by its pid.

    ``shape``: ``single`` (one master), ``sync_master`` (a SYNC_MASTER and its SLAVE, two processes, as RocketMQ's
    two broker JVMs) or ``dledger`` (three DLedger members, three processes).  Every broker runs as RocketMQ's
    broker does by default: ``flush`` (ASYNC_FLUSH unless SYNC_FLUSH is compared), no broker-side trace topic
    (RocketMQ's ``traceTopicEnable`` is false by default; sparkmq's is on, so ``--no-trace``), no lake, 1 GiB
    commit-log segments (RocketMQ's ``mappedFileSizeCommitLog``), registration every ``REGISTER_S``.
    ``grpc`` also serves the RocketMQ 5 gRPC endpoint (``grpc_addr``)."""

    REGISTER_S = "5"
    #: Where ``py-spy record`` writes each broker's collapsed stacks (``--profile``); None: no profiling.
    profile_dir: Path | None = None

    def __init__(self, root: Path, *, shape: str = "single", flush: str = "ASYNC_FLUSH", grpc: bool = False) -> None:
        from procs import BROKER, NAMESRV, ProcessHarness, write_conf

        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.procs = ProcessHarness(root)
        self.grpc_addr: str | None = None
        self.shape = shape
        self.profilers: list[subprocess.Popen[bytes]] = []
        try:
            self.namesrv_proc = self.procs.start("namesrv", NAMESRV)
            self.namesrv = self.namesrv_proc.addr  # HTTP and RocketMQ remoting on one port
            common = ["--namesrv", self.namesrv, "--register-interval-s", self.REGISTER_S, "--no-trace",
                      "--no-lake", "--flush-mode", flush, "--segment-size", str(1 << 30), "--log-level", "warning"]
            if shape == "single":
                extra = []
                if grpc:
                    self.grpc_addr = f"127.0.0.1:{peers.free_port()}"
                    extra = ["--grpc-port", self.grpc_addr.rsplit(":", 1)[1]]
                self.brokers = [self.procs.start("broker", BROKER, "--data-dir", str(root / "broker-a"), *common,
                                                 *extra)]
                expect = {"broker-a": {0}}
            elif shape == "sync_master":
                master = self.procs.start("broker", BROKER, "--data-dir", str(root / "master"), *common,
                                          "--role", "SYNC_MASTER", "--ha-port", "0")
                slave = self.procs.start("broker", BROKER, "--data-dir", str(root / "slave"), *common,
                                         "--role", "SLAVE", "--broker-id", "1")
                self.brokers = [master, slave]
                expect = {"broker-a": {0, 1}}
            elif shape == "dledger":
                raft = {m: peers.free_port() for m in ("n0", "n1", "n2")}
                group = ";".join(f"{m}-127.0.0.1:{p}" for m, p in raft.items())
                specs = []
                for member in raft:
                    conf = write_conf(root / f"{member}.toml", root / member, dledger_enabled=True,
                                      dledger_self_id=member, dledger_peers=group)
                    specs.append(("broker", BROKER, ["--config", str(conf), *common]))
                self.brokers = self.procs.start_many(specs)
                expect = {"broker-a": {0}}
            else:
                raise ValueError(shape)
            self.wait_brokers(expect, members=len(self.brokers))
            if shape == "sync_master":
                deadline = time.monotonic() + 60
                while _http_json(f"{self.brokers[0].url}/broker/ha").get("in_sync_slaves") != 1:
                    if time.monotonic() > deadline:
                        raise RuntimeError("sparkmq: the slave never got in sync")
                    time.sleep(0.3)
            if self.profile_dir is not None:
                self._profile(self.profile_dir)
        except BaseException:
            self.stop()
            raise

    def _profile(self, out: Path) -> None:
        """``py-spy record`` on each broker until :meth:`stop` (collapsed stacks, one file per broker)."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            raise RuntimeError("--profile needs py-spy: .venv/bin/python -m pip install py-spy")
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%H%M%S")
        for i, pid in enumerate(self.broker_pids()):
            self.profilers.append(subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--nonblocking",
                 "-o", str(out / f"sparkmq-{self.shape}-{stamp}-broker{i}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL))

    def wait_brokers(self, expect: dict[str, set[int]], members: int, timeout: float = 90.0) -> None:
        """Until the name server lists, over remoting, each broker name with the expected ids (and, for a DLedger
        group, every member)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = peers.cluster_info(self.namesrv)
            except (OSError, remoting_capture.FrameError, ValueError):
                info = {}
            if all(ids <= set(info.get(n, {})) and len(info.get(n, {})) >= members for n, ids in expect.items()):
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {b.kind} {b.addr}:\n{b.log()[-1500:]}" for b in self.brokers)
                raise RuntimeError(f"sparkmq: brokers {expect} not registered after {timeout} s: {info}\n{logs}")
            time.sleep(0.3)

    def config(self, **overrides: object):  # type: ignore[no-untyped-def]
        """A client configuration for sparkmq's Python clients."""
        from sparkmq.platform.client import ClientConfig

        return ClientConfig(namesrv_addrs=self.namesrv, rebalance_interval_s=1.0, trace_enabled=False,
                            **overrides)  # type: ignore[arg-type]

    def broker_pids(self) -> list[int]:
        """The broker processes' pids (to profile them)."""
        return [b.proc.pid for b in self.brokers]

    def stop(self) -> None:
        """Stop every process started here (the profilers first: SIGINT writes their output), each by its pid."""
        for spy in self.profilers:
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(10)
        self.profilers.clear()
        self.procs.stop_all()

    def __enter__(self) -> SparkmqCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_json(url: str) -> dict[str, object]:
    import httpx

    try:
        return httpx.get(url, timeout=5).json()  # type: ignore[no-any-return]
    except (httpx.HTTPError, ValueError):
        return {}


# -- the figures, by setup ---------------------------------------------------------------------------------------------
def remoting_figures(namesrv: str, work: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """The figures the single ASYNC_FLUSH setup serves, with the remoting Java client against ``namesrv``."""
    out: dict[str, Measure] = {}
    common = ["--namesrv", namesrv, "--seconds", str(sizes.seconds), "--warmup-s", str(sizes.warmup_s)]
    if "rocketmq_produce_batch" in figures:
        r = remoting(["produce-batch", "--topic", "PeerBatch", "--threads", "32", "--batch", "64", *common], work)
        out["rocketmq_produce_batch"] = Measure(values(r, "msgs_per_s", "call_p50_ms", "call_p99_ms", "failed"))
    if "rocketmq_produce_sync" in figures:
        r = remoting(["produce-sync", "--topic", "PeerSync", "--threads", "64", *common], work)
        out["rocketmq_produce_sync"] = Measure(values(r, "msgs_per_s", "call_p50_ms", "call_p99_ms", "failed"))
    if "rocketmq_consume" in figures:
        fill = remoting(["produce-batch", "--namesrv", namesrv, "--topic", "PeerDrain", "--threads", "8",
                         "--batch", "64", "--total", str(sizes.drain)], work)
        r = remoting(["drain", "--namesrv", namesrv, "--topic", "PeerDrain", "--group", "PeerDrainGroup",
                      "--count", str(sizes.drain)], work)
        got = values(r, "msgs_per_s", "received", "startup_s")
        got["fill_msgs_per_s"] = float(fill["msgs_per_s"])  # type: ignore[arg-type]
        out["rocketmq_consume"] = Measure(got)
    if "rocketmq_e2e" in figures:
        r = remoting(["e2e", "--namesrv", namesrv, "--topic", "PeerE2E", "--group", "PeerE2EGroup", "--rate", "2000",
                      "--seconds", str(sizes.e2e_s), "--warmup-s", str(sizes.warmup_s)], work)
        out["rocketmq_e2e"] = Measure(values(r, "p50_ms", "p99_ms", "b2r_p50_ms", "b2r_p99_ms", "samples"))
    return out


def batch_figure(name: str, namesrv: str, work: Path, sizes: Sizes) -> dict[str, Measure]:
    """Batches of 64 from 32 threads (the HA setups)."""
    r = remoting(["produce-batch", "--namesrv", namesrv, "--topic", "PeerHA", "--threads", "32", "--batch", "64",
                  "--seconds", str(sizes.seconds), "--warmup-s", str(sizes.warmup_s)], work)
    return {name: Measure(values(r, "msgs_per_s", "call_p50_ms", "call_p99_ms", "failed"))}


def sync_flush_figure(namesrv: str, work: Path, sizes: Sizes) -> dict[str, Measure]:
    """64 threads of single sync sends (SYNC_FLUSH setups)."""
    r = remoting(["produce-sync", "--namesrv", namesrv, "--topic", "PeerFlush", "--threads", "64",
                  "--seconds", str(sizes.seconds), "--warmup-s", str(sizes.warmup_s)], work)
    return {"rocketmq_sync_flush": Measure(values(r, "msgs_per_s", "call_p50_ms", "call_p99_ms", "failed"))}


def grpc_figures(endpoint: str, create: Callable[[str], None], fill: Callable[[str, int], None], work: Path,
                 sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """The gRPC client's sends, and its SimpleConsumer draining a backlog.  ``create(topic)`` makes a topic of 4
    queues (the gRPC client does not auto-create one); ``fill(topic, n)`` loads the backlog after the group's
    first receive, so the group starts before the backlog on either server."""
    out: dict[str, Measure] = {}
    for topic in ("PeerGrpcSend", "PeerPop"):
        create(topic)
    if "rocketmq_grpc_send" in figures:
        r = grpc(["send", "--endpoint", endpoint, "--topic", "PeerGrpcSend", "--threads", "32",
                  "--seconds", str(sizes.seconds), "--warmup-s", str(sizes.warmup_s)], work)
        out["rocketmq_grpc_send"] = Measure(values(r, "msgs_per_s", "p50_ms", "p99_ms", "failed"))
    if "rocketmq_pop" in figures:
        grpc(["pop-init", "--endpoint", endpoint, "--topic", "PeerPop", "--group", "PeerPopGroup"], work)
        fill("PeerPop", sizes.pop)
        r = grpc(["pop", "--endpoint", endpoint, "--topic", "PeerPop", "--group", "PeerPopGroup",
                  "--count", str(sizes.pop), "--threads", "4", "--batch", "32"], work)
        out["rocketmq_pop"] = Measure(values(r, "msgs_per_s", "acked", "failed", "empty_receives"))
    return out


#: Which figures each setup serves (one start of each system per round serves all of them).
SETUPS: dict[str, list[str]] = {
    "single": ["rocketmq_produce_batch", "rocketmq_produce_sync", "rocketmq_consume", "rocketmq_e2e"],
    "sync_flush": ["rocketmq_sync_flush"],
    "sync_master": ["rocketmq_sync_master"],
    "dledger": ["rocketmq_dledger"],
    "grpc": ["rocketmq_pop", "rocketmq_grpc_send"],
    "kafka": ["kafka_produce", "kafka_consume"],
    "spark": ["kafka_spark_source"],
}


def rocketmq_side(setup: str, root: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """Apache RocketMQ 5.5.0 in the setup's shape, the figures measured, everything stopped."""
    work = root / "clients"
    with peers.RocketMQ(root / "rocketmq") as rmq:
        rmq.start_namesrv()
        if setup == "single":
            rmq.start_broker("broker-a")
            return remoting_figures(rmq.namesrv, work, sizes, figures)
        if setup == "sync_flush":
            rmq.start_broker("broker-a", flush="SYNC_FLUSH")
            return sync_flush_figure(rmq.namesrv, work, sizes)
        if setup == "sync_master":
            rmq.start_master_slave("broker-a")
            return batch_figure("rocketmq_sync_master", rmq.namesrv, work, sizes)
        if setup == "dledger":
            rmq.broker_heap = "1g"  # three brokers on this machine
            # enableBatchPush: the leader pushes entries to its followers in batches (RocketMQ's faster DLedger
            # replication; off by default): the peer at its best.
            rmq.start_dledger("broker-d", extra={"enableBatchPush": "true"})
            return batch_figure("rocketmq_dledger", rmq.namesrv, work, sizes)
        if setup == "grpc":
            endpoint = rmq.start_proxy_local("broker-p")

            def create(topic: str) -> None:  # and the consumer group: the 5.5 proxy refuses an unknown group
                for command in (["updateTopic", "-t", topic, "-r", "4", "-w", "4"],
                                ["updateSubGroup", "-g", "PeerPopGroup"]):
                    done = mqadmin(rmq.namesrv, command[0], "-c", rmq.cluster, *command[1:], work_dir=work)
                    if "success" not in done.stdout:
                        raise RuntimeError(f"mqadmin {command}: {done.stdout[-500:]} {done.stderr[-500:]}")

            def fill(topic: str, n: int) -> None:
                remoting(["produce-batch", "--namesrv", rmq.namesrv, "--topic", topic, "--threads", "8",
                          "--batch", "64", "--total", str(n)], work)
            return grpc_figures(endpoint, create, fill, work, sizes, figures)
    raise ValueError(setup)


def sparkmq_side(setup: str, root: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """sparkmq in the same shape (a name server process and a broker process; a SYNC_MASTER and its slave; a
    DLedger group of three), the same Java driver against it."""
    work = root / "clients"
    shape = setup if setup in ("sync_master", "dledger") else "single"
    flush = "SYNC_FLUSH" if setup == "sync_flush" else "ASYNC_FLUSH"
    with SparkmqCluster(root / "sparkmq", shape=shape, flush=flush, grpc=setup == "grpc") as dev:
        if setup == "grpc":
            assert dev.grpc_addr is not None

            def create(topic: str) -> None:
                from sparkmq.platform.client import AdminClient

                with AdminClient(dev.config()) as admin:
                    admin.create_topic(topic, 4, 4)
                    deadline = time.monotonic() + 60
                    while not _routed(admin, topic):  # the broker registers the new topic with its next heartbeat
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"sparkmq never routed {topic}")
                        time.sleep(0.2)

            def fill(topic: str, n: int) -> None:
                from sparkmq.platform.client import Message, Producer

                with Producer("bench-peers-fill", dev.config()) as producer:
                    batch = [Message(topic, BODY) for _ in range(256)]
                    for _ in range(0, n, 256):
                        producer.send_batch(batch)
            return grpc_figures(dev.grpc_addr, create, fill, work, sizes, figures)
        namesrv = dev.namesrv
        if setup == "single":
            return remoting_figures(namesrv, work, sizes, figures)
        if setup == "sync_flush":
            return sync_flush_figure(namesrv, work, sizes)
        return batch_figure(SETUPS[setup][0], namesrv, work, sizes)


def _routed(admin, topic: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether sparkmq's name server routes ``topic`` yet."""
    try:
        return bool(admin.topic_route(topic).read_queues)
    except Exception:  # TOPIC_NOT_EXIST until the broker's next registration
        return False


# -- Kafka -------------------------------------------------------------------------------------------------------------
def kafka_side(root: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """ProducerPerformance (acks=all) and ConsumerPerformance against one KRaft node."""
    out: dict[str, Measure] = {}
    with peers.Kafka(root / "kafka") as kafka:
        kafka.start()
        kafka.create_topic("PeerKafka", 4)
        r = kafka.tool("org.apache.kafka.tools.ProducerPerformance",
                       ["--bootstrap-server", kafka.bootstrap, "--topic", "PeerKafka", "--num-records",
                        str(sizes.kafka), "--record-size", "1024", "--throughput", "-1",
                        "--warmup-records", str(sizes.kafka // 10), "--command-property", "acks=all"],
                       name="producer-perf", heap="1g")
        final = [t for t in r.stdout.splitlines() if "records sent" in t and "99th" in t]
        if r.returncode != 0 or not final:
            raise RuntimeError(f"ProducerPerformance failed: {r.stdout[-800:]} {r.stderr[-800:]}")
        # "... records sent, X records/sec (..), A ms avg latency, M ms max latency, P50 ms 50th, ..., P99 ms 99th"
        nums = re.search(r"records sent, ([\d.]+) records/sec.*?([\d.]+) ms 50th.*?([\d.]+) ms 99th", final[-1])
        if "kafka_produce" in figures and nums:
            out["kafka_produce"] = Measure({"msgs_per_s": float(nums.group(1)), "p50_ms": float(nums.group(2)),
                                            "p99_ms": float(nums.group(3))})
        if "kafka_consume" in figures:
            r = kafka.tool("org.apache.kafka.tools.ConsumerPerformance",
                           ["--bootstrap-server", kafka.bootstrap, "--topic", "PeerKafka", "--num-records",
                            str(sizes.kafka), "--group", "peer-consume", "--timeout", "60000"],
                           name="consumer-perf", heap="1g")
            rows = [t for t in r.stdout.splitlines() if re.match(r"\d{4}-", t)]
            if r.returncode != 0 or not rows:
                raise RuntimeError(f"ConsumerPerformance failed: {r.stdout[-800:]} {r.stderr[-800:]}")
            cols = [c.strip() for c in rows[-1].split(",")]
            # start, end, MB, MB/s, nMsg, nMsg/s, rebalance ms, fetch ms, fetch MB/s, fetch nMsg/s
            out["kafka_consume"] = Measure({"msgs_per_s": float(cols[9]), "messages": float(cols[4]),
                                            "with_rebalance_msgs_per_s": float(cols[5])})
    return out


def sparkmq_kafka_side(root: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """sparkmq's Python clients at the same durability (ASYNC_FLUSH): per-message ``send_async`` (the producer
    batches by itself, as Kafka's does) for N messages, then a ``PullConsumer`` draining them."""
    from sparkmq.platform.client import Message, Producer, PullConsumer

    out: dict[str, Measure] = {}
    with SparkmqCluster(root / "sparkmq") as dev:
        topic = "PeerKafka"
        with Producer("bench-peers-kafka", dev.config()) as producer:
            producer.send(Message(topic, BODY))  # route, connection, topic auto-created with 4 queues
            started = time.perf_counter()
            for _ in range(sizes.kafka):
                producer.send_async(Message(topic, BODY))
            producer.flush(120)
            elapsed = time.perf_counter() - started
        out["kafka_produce"] = Measure({"msgs_per_s": sizes.kafka / elapsed})
        if "kafka_consume" in figures:
            consumer = PullConsumer("bench-peers-drain", dev.config(pull_batch_size=256,
                                                                     flow_control_max_messages=20_000,
                                                                     max_offset_span=100_000),
                                    consume_from_where="CONSUME_FROM_FIRST_OFFSET")
            consumer.subscribe(topic)
            consumer.start()
            try:
                got, first = 0, None
                deadline = time.perf_counter() + 600
                total = sizes.kafka + 1
                while got < total and time.perf_counter() < deadline:
                    batch = consumer.poll(1.0)
                    if batch and first is None:
                        first = time.perf_counter()
                    got += len(batch)
                elapsed = time.perf_counter() - (first or time.perf_counter())
            finally:
                consumer.shutdown()
            out["kafka_consume"] = Measure({"msgs_per_s": got / elapsed if elapsed else float("nan"),
                                            "messages": got})
    return out


# -- Spark's Kafka source vs the sparkmq source ------------------------------------------------------------------------
def _spark():  # type: ignore[no-untyped-def]
    from sparkmq.pipelines.session import get_spark

    return get_spark({"spark.master": "local[2]", "spark.jars": ",".join(str(p) for p in jars.jars("spark-kafka"))},
                     app_name="sparkmq-bench-peers", log_level="ERROR")


def _stream_rows(df, work: Path, name: str) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """``df`` streamed with ``trigger(availableNow=True)`` into the noop sink: (rows the query counted, seconds)."""
    ckpt = work / f"ckpt-{name}-{time.monotonic_ns()}"
    started = time.perf_counter()
    query = (df.writeStream.format("noop").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception())[:300])
    rows = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    return rows, elapsed


def spark_kafka_side(root: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """Spark's Kafka source reading ``sizes.spark`` records (1 KiB, 4 partitions) from one KRaft node."""
    spark = _spark()
    with peers.Kafka(root / "kafka") as kafka:
        kafka.start()
        for topic, n in (("SparkWarm", 10_000), ("SparkRead", sizes.spark)):
            kafka.create_topic(topic, 4)
            kafka.tool("org.apache.kafka.tools.ProducerPerformance",
                       ["--bootstrap-server", kafka.bootstrap, "--topic", topic, "--num-records", str(n),
                        "--record-size", "1024", "--throughput", "-1", "--command-property", "acks=all"],
                       name="fill", heap="1g")

        def read(topic: str) -> tuple[int, float]:
            df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest").load())
            return _stream_rows(df, root, topic)
        read("SparkWarm")  # the session's first query of this source: code paths, connections
        rows, elapsed = read("SparkRead")
    return {"kafka_spark_source": Measure({"msgs_per_s": rows / elapsed, "rows": rows, "seconds": elapsed})}


def spark_sparkmq_side(root: Path, sizes: Sizes, figures: list[str]) -> dict[str, Measure]:
    """The ``sparkmq`` source reading ``sizes.spark`` messages (1 KiB, 4 queues) from ``sparkmq dev``."""
    from sparkmq.pipelines.source import register
    from sparkmq.platform.client import Message, Producer

    spark = _spark()
    register(spark)
    with SparkmqCluster(root / "sparkmq") as dev:
        with Producer("bench-peers-spark", dev.config()) as producer:
            for topic, n in (("SparkWarm", 10_000), ("SparkRead", sizes.spark)):
                batch = [Message(topic, BODY) for _ in range(256)]
                for _ in range(0, n, 256):
                    producer.send_batch(batch)

        def read(topic: str) -> tuple[int, float]:
            df = (spark.readStream.format("sparkmq").option("namesrv", dev.namesrv)
                  .option("subscribe", topic).option("startingOffsets", "earliest").load())
            return _stream_rows(df, root, topic)
        read("SparkWarm")
        rows, elapsed = read("SparkRead")
    return {"kafka_spark_source": Measure({"msgs_per_s": rows / elapsed, "rows": rows, "seconds": elapsed})}


# -- rounds, lines, report ---------------------------------------------------------------------------------------------
PEER_NAME = {"kafka": "kafka", "spark": "kafka"}  # the peer's label in a line's keys (default rocketmq)


def run_setup(setup: str, figures: list[str], rounds: int, sizes: Sizes,
              root: Path) -> dict[str, tuple[list[Measure], list[Measure]]]:
    """A B A B: each round runs the sparkmq side, then the peer's; returns (sparkmq rounds, peer rounds) per figure."""
    if setup == "kafka":
        sides = (sparkmq_kafka_side, lambda r, s, f: kafka_side(r, s, f))
    elif setup == "spark":
        sides = (spark_sparkmq_side, spark_kafka_side)
    else:
        sides = (lambda r, s, f: sparkmq_side(setup, r, s, f), lambda r, s, f: rocketmq_side(setup, r, s, f))
    got: dict[str, tuple[list[Measure], list[Measure]]] = {f: ([], []) for f in figures}
    for n in range(rounds):
        for i, side in enumerate(sides):
            work = root / f"{setup}-r{n}-{'ab'[i]}"
            try:
                results = side(work, sizes, figures)
                shutil.rmtree(work, ignore_errors=True)  # a round's data is gigabytes; a failed one keeps its logs
            except Exception as exc:  # one failed side must not hide the other figures
                print(f"# {setup} round {n + 1} {'sparkmq' if i == 0 else 'peer'} failed: {exc!r:.600} "
                      f"(logs under {work})", file=sys.stderr, flush=True)
                results = {f: Measure.unavailable("error") for f in figures}
            for f in figures:
                got[f][i].append(results.get(f, Measure.unavailable("not_measured")))
    return got


def median_of(measures: list[Measure], key: str) -> float:
    """The median of the rounds that measured ``key`` (NaN if none did)."""
    vals = [m.values[key] for m in measures if m.status == "ok" and key in m.values]
    return statistics.median(vals) if vals else float("nan")


def ratio(ours: float, theirs: float) -> float:
    """``ours / theirs``; NaN when either side is missing (NaN) or the peer's is 0."""
    if ours != ours or theirs != theirs or theirs == 0:
        return float("nan")
    return ours / theirs


def peer_of(figure: str) -> str:
    """The peer's label in a figure's keys: ``kafka`` for the Kafka setups, else ``rocketmq``."""
    return PEER_NAME.get(next((s for s, fs in SETUPS.items() if figure in fs), ""), "rocketmq")


def figure_fields(figure: str, ours: list[Measure], theirs: list[Measure], echo: float) -> dict[str, object]:
    """A figure's fields from both sides' rounds: medians, ``ratio`` (e2e: ``p99_ratio`` and ``p50_ratio``), each
    round's value, a status (``ok``, else the first failed side's: ``sparkmq_<why>`` or ``peer_<why>``)."""
    peer = peer_of(figure)
    key = "p99_ms" if figure == "rocketmq_e2e" else "msgs_per_s"
    fields: dict[str, object] = {}
    if figure == "rocketmq_e2e":
        for q in ("p50_ms", "p99_ms"):
            fields[f"sparkmq_{q}"] = median_of(ours, q)
            fields[f"{peer}_{q}"] = median_of(theirs, q)
        fields["p99_ratio"] = ratio(fields["sparkmq_p99_ms"], fields[f"{peer}_p99_ms"])  # type: ignore[arg-type]
        fields["p50_ratio"] = ratio(fields["sparkmq_p50_ms"], fields[f"{peer}_p50_ms"])  # type: ignore[arg-type]
    else:
        ours_v, theirs_v = median_of(ours, key), median_of(theirs, key)
        fields["ratio"] = ratio(ours_v, theirs_v)
        fields["sparkmq_msgs_per_s"] = ours_v
        fields[f"{peer}_msgs_per_s"] = theirs_v
        for extra in ("p50_ms", "p99_ms", "call_p99_ms"):
            if any(extra in m.values for m in theirs):
                fields[f"{peer}_{extra}"] = median_of(theirs, extra)
    failed = [f"sparkmq_{m.status}" for m in ours if m.status != "ok"] + \
             [f"peer_{m.status}" for m in theirs if m.status != "ok"]
    fields["status"] = failed[0] if failed else "ok"

    def rounds_of(measures: list[Measure]) -> str:
        return "/".join(f"{m.values.get(key, float('nan')):.4g}" if m.status == "ok" else m.status for m in measures)
    fields[f"{peer}_rounds"] = rounds_of(theirs)
    fields["sparkmq_rounds"] = rounds_of(ours)
    fields["rounds"] = max(len(ours), len(theirs))
    fields["echo_msgs_per_s"] = echo
    return fields


def report_line(figure: str, ours: list[Measure], theirs: list[Measure], echo: float) -> dict[str, object]:
    """Print the figure's line; return its fields for the table."""
    fields = figure_fields(figure, ours, theirs, echo)
    line(f"peers.{figure}", **fields)
    return fields


def python_echo() -> float:
    """Run ../shared/tools/python_echo.py, print its line, return its msgs_per_s (NaN without it)."""
    if not ECHO.exists():
        print(f"machine.python_echo error='{ECHO} not found'", flush=True)
        return float("nan")
    result = subprocess.run([sys.executable, str(ECHO)], capture_output=True, text=True, timeout=600)
    text = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(text or f"machine.python_echo error='exit {result.returncode}'", flush=True)
    match = re.search(r"msgs_per_s=([\d.]+)", text)
    return float(match.group(1)) if match else float("nan")


def render_table(rows: dict[str, dict[str, object]], *, stamp: str, echo: float, sizes: Sizes, rounds: int,
                 targets: dict[str, str], load: str = "") -> tuple[str, list[str], list[float]]:
    """The run's markdown table (with its heading line) and the chart's labels and ratios (e2e: its p99 ratio)."""
    head = ["figure", "sparkmq", "peer", "ratio (sparkmq/peer)", "target", "met", "measured"]
    lines = [f"# sparkmq vs Apache RocketMQ {peers.ROCKETMQ_VERSION} and Apache Kafka {peers.KAFKA_VERSION}",
             "", f"{stamp}; python_echo {echo:,.0f} msgs/s; medians of {rounds} rounds (A B A B); "
             f"sizes {sizes}" + (f"; load average {load}" if load else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    labels, ratios = [], []
    for figure, f in rows.items():
        peer = peer_of(figure)
        if figure == "rocketmq_e2e":
            ours = f"p50 {f['sparkmq_p50_ms']:.3g} / p99 {f['sparkmq_p99_ms']:.3g} ms"
            theirs = f"p50 {f[f'{peer}_p50_ms']:.3g} / p99 {f[f'{peer}_p99_ms']:.3g} ms"
            value = float(f["p99_ratio"])  # type: ignore[arg-type]
        else:
            ours = f"{float(f['sparkmq_msgs_per_s']):,.0f} msgs/s"  # type: ignore[arg-type]
            theirs = f"{float(f[f'{peer}_msgs_per_s']):,.0f} msgs/s"  # type: ignore[arg-type]
            value = float(f["ratio"])  # type: ignore[arg-type]
        target = targets.get(figure, "")
        lines.append(f"| peers.{figure} | {ours} | {theirs} | {value:.3g} | {target} | {target_met(value, target)} | "
                     f"{f['status']} |")
        labels.append(figure)
        ratios.append(value)
    return "\n".join(lines) + "\n", labels, ratios


def target_met(value: float, target: str) -> str:
    """``yes`` or ``no``: whether ``value`` meets ``target`` (``ratio >= 1.5``, ``p99_ratio <= 1.0``); empty when
    there is no target or no value (NaN)."""
    parts = target.split()
    if len(parts) != 3 or parts[1] not in (">=", "<=") or value != value:
        return ""
    bound = float(parts[2])
    return "yes" if (value >= bound if parts[1] == ">=" else value <= bound) else "no"


def write_chart(labels: list[str], ratios: list[float], title: str, paths: list[Path]) -> None:
    """A horizontal bar per figure (its ratio; grey and "not measured" for NaN), a line at 1.0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(labels) + 1.5))
    shown = [r if r == r else 0.0 for r in ratios]
    bars = ax.barh(labels, shown, color=["#4c72b0" if r == r else "#cccccc" for r in ratios])
    for bar, r in zip(bars, ratios, strict=True):
        ax.text(bar.get_width() + 0.02, bar.get_y() + bar.get_height() / 2,
                f"{r:.2f}" if r == r else "not measured", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("sparkmq / peer (e2e: p99 ratio, lower is better)")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(rows: dict[str, dict[str, object]], echo: float, sizes: Sizes, rounds: int, load: str = "",
                 quiet: bool = False) -> None:
    """The run's markdown table and bar chart under var/bench/ (dated, and as peers-latest.*); printed too unless
    ``quiet``."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    stamp, file_stamp = now.strftime("%Y-%m-%d %H:%M UTC"), now.strftime("%Y%m%d-%H%M")
    text, labels, ratios = render_table(rows, stamp=stamp, echo=echo, sizes=sizes, rounds=rounds,
                                        targets=parse_targets(TARGETS.read_text() if TARGETS.exists() else ""),
                                        load=load)
    (OUT_DIR / f"peers-{file_stamp}.md").write_text(text)
    (OUT_DIR / "peers-latest.md").write_text(text)
    if not quiet:
        print(text, flush=True)
    try:
        write_chart(labels, ratios, f"sparkmq vs RocketMQ {peers.ROCKETMQ_VERSION} / Kafka {peers.KAFKA_VERSION}, "
                    f"{stamp}", [OUT_DIR / f"peers-{file_stamp}.png", OUT_DIR / "peers-latest.png"])
    except Exception as exc:  # the table stands without the chart
        print(f"# chart not written: {exc!r}", file=sys.stderr)


def parse_targets(text: str) -> dict[str, str]:
    """The ``peers.*`` lines of targets.txt: figure (without ``peers.``) -> its target (``ratio >= 1.5``)."""
    out = {}
    for text_line in text.splitlines():
        parts = text_line.split()
        if len(parts) >= 4 and parts[0].startswith("peers."):
            out[parts[0].removeprefix("peers.")] = " ".join(parts[1:])
    return out


def load_average() -> str:
    """The 1, 5 and 15 minute load averages now (the machine is shared)."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and one round (CI smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per figure (default 3, quick 1)")
    parser.add_argument("--only", default="", help="comma list of figure names (without 'peers.') or setups")
    for size in ("seconds", "warmup_s", "drain", "e2e_s", "pop", "kafka", "spark"):
        parser.add_argument(f"--{size.replace('_', '-')}", type=float, default=None,
                            help=f"override the {size} size (default: {getattr(Sizes.of(False), size):g}, "
                                 f"quick {getattr(Sizes.of(True), size):g})")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy record every sparkmq broker while it serves (collapsed stacks under var/bench)")
    args = parser.parse_args()
    if args.profile:
        SparkmqCluster.profile_dir = OUT_DIR / "profiles"
    sizes = Sizes.of(args.quick)
    overrides = {k: getattr(args, k) for k in ("seconds", "warmup_s", "drain", "e2e_s", "pop", "kafka", "spark")
                 if getattr(args, k) is not None}
    sizes = dataclasses.replace(sizes, **{k: v if k in ("seconds", "warmup_s", "e2e_s") else int(v)
                                          for k, v in overrides.items()})
    rounds = args.rounds or (1 if args.quick else 3)
    only = {n.strip().removeprefix("peers.") for n in args.only.split(",") if n.strip()}
    echo = python_echo()  # the run's first line
    with contextlib.redirect_stdout(sys.stderr):  # the jar cache's notes are not figures
        for name in SETS:
            jars.fetch(name)
    rows: dict[str, dict[str, object]] = {}
    loads: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="sparkmq-peers-"))  # kept when a side failed: its logs are there
    try:
        for setup, figures in SETUPS.items():
            wanted = [f for f in figures if not only or f in only or setup in only]
            if not wanted:
                continue
            loads.append(load_average())
            print(f"machine.load setup={setup} loadavg={loads[-1]}", flush=True)
            got = run_setup(setup, wanted, rounds, sizes, root)
            for figure in wanted:
                rows[figure] = report_line(figure, *got[figure], echo)
            write_report(rows, echo, sizes, rounds, load=", ".join(loads), quiet=True)  # so far (a cut run keeps it)
    finally:
        if not any(root.iterdir()):
            root.rmdir()
        else:
            print(f"# logs of failed sides kept under {root}", file=sys.stderr)
    if rows:
        loads.append(load_average())
        print(f"machine.load setup=end loadavg={loads[-1]}", flush=True)
        write_report(rows, echo, sizes, rounds, load=", ".join(loads))


if __name__ == "__main__":
    main()

"""The peers on this machine: Apache RocketMQ 5.5.0 and Apache Kafka 4.4.0 on loopback, run from the jar cache.

Every process is a ``java`` started here, with its data and logs under one root folder (give it a temp folder
on the disk sparkmq's data lives on), on free loopback ports, and is stopped by its pid (SIGTERM, then SIGKILL).
Nothing is written under ``~``: each RocketMQ JVM gets ``-Duser.home=<root>`` (its fallbacks, e.g. the RocksDB
LOG, land there) and ``-Drmq.logback.configurationFile`` naming one log file per process.

    with RocketMQ(root) as rmq:                     # a name server and one ASYNC_FLUSH master
        rmq.start_namesrv()
        rmq.start_broker("broker-a")
        rmq.wait_brokers({"broker-a": {0}})
        ...                                         # clients use rmq.namesrv
    with RocketMQ(root) as rmq:                     # SYNC_MASTER with a slave
        rmq.start_namesrv(); rmq.start_master_slave("broker-a")
    with RocketMQ(root) as rmq:                     # a 3-member DLedger group (commit-log mode)
        rmq.start_namesrv(); rmq.start_dledger("broker-d")
    with RocketMQ(root) as rmq:                     # the proxy in local mode (gRPC), its broker embedded
        rmq.start_namesrv(); rmq.start_proxy_local("broker-p")
    with Kafka(root) as kafka:                      # one KRaft node (broker + controller), formatted first
        kafka.start(); kafka.create_topic("t", 4)

The verified facts behind each setting are in ``docs/benchmarks.md``.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import remoting_capture  # noqa: E402  (tests/: the remoting frame codec)
from java_clients import LOGBACK_FILE  # noqa: E402

from sparkmq.platform.common import jars  # noqa: E402

__all__ = ["BrokerProc", "JvmProcess", "Kafka", "RocketMQ", "cluster_info", "free_port", "free_ports"]

#: The versions the jar sets of conf/jars.toml pin (shown in reports).
ROCKETMQ_VERSION = "5.5.0"
KAFKA_VERSION = "4.4.0"
#: RocketMQ's broker JVM options (distribution/bin/runbroker.sh), with heaps for this 2-core, 24 GiB machine and
#: without -XX:+AlwaysPreTouch (it would touch the whole heap at start).
BROKER_JVM = ("-server", "-XX:+UseG1GC", "-XX:G1HeapRegionSize=16m", "-XX:G1ReservePercent=25",
              "-XX:InitiatingHeapOccupancyPercent=30", "-XX:SoftRefLRUPolicyMSPerMB=0",
              "-XX:-OmitStackTraceInFastThrow", "-XX:-UseLargePages")
#: Kafka's server JVM options (bin/kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS).
KAFKA_JVM = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
             "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true")


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


#: Ports are drawn below the kernel's ephemeral range (32768-60999 here): a port picked from that range can be
#: taken by any process's outgoing connection before the server binds it (seen once on this busy machine: a
#: DLedger member died with "Address already in use").
_PORT_RANGE = (10000, 32000)
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, below the ephemeral range, not handed out before by this process."""
    return free_ports(1, host)


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """A base port ``p`` such that ``p .. p+count-1`` are free now (a RocketMQ broker takes listenPort and the HA
    port listenPort + 1)."""
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(_PORT_RANGE[0], _PORT_RANGE[1] - count)
        ports = range(base, base + count)
        if not _handed_out.intersection(ports) and all(_port_free(p, host) for p in ports):
            _handed_out.update(ports)
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


@dataclass
class JvmProcess:
    """A started JVM: its name, process and log (stdout and stderr)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str]

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.proc.poll() is None

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM (RocketMQ and Kafka shut down in their hooks), wait; SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        return self.proc.returncode

    def log(self, chars: int = 4000) -> str:
        """The tail of its stdout/stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class _Processes:
    """Processes started under one root, stopped together (newest first)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.processes: list[JvmProcess] = []

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> JvmProcess:
        log_path = self.root / "logs" / f"{name}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.root, env=env)
        jvm = JvmProcess(name, proc, log_path, argv)
        self.processes.append(jvm)
        return jvm

    def stop(self) -> None:
        """Stop every process started here, newest first, each by its pid."""
        while self.processes:
            self.processes.pop().stop()

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class BrokerProc:
    """A RocketMQ broker: its process, name, id, the address clients use, and its config."""

    jvm: JvmProcess
    name: str
    broker_id: int
    addr: str
    conf: dict[str, str] = field(default_factory=dict)


def _write_props(path: Path, props: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


class RocketMQ(_Processes):
    """Apache RocketMQ 5.5.0 (jar set ``rocketmq-server``) under ``root``: name servers, brokers, a proxy.

    ``bind_host`` is where the servers listen, ``advertise_host`` the address they register (``brokerIP1``;
    RocketMQ otherwise advertises the machine's first non-loopback address).  A capture relay listens on
    ``advertise_host`` at the same ports when the two differ (tests/remoting_capture.py).
    """

    def __init__(self, root: Path, *, cluster: str = "PeerCluster", bind_host: str = "127.0.0.1",
                 advertise_host: str = "127.0.0.1", broker_heap: str = "2g", namesrv_heap: str = "256m",
                 commitlog_file_bytes: int = 1 << 30) -> None:
        super().__init__(root)
        self.cluster = cluster
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.broker_heap = broker_heap
        self.namesrv_heap = namesrv_heap
        self.commitlog_file_bytes = commitlog_file_bytes
        self.namesrv_addrs: list[str] = []
        self._namesrv_ports: list[int] = []
        self.brokers: list[BrokerProc] = []
        self.grpc_endpoint: str | None = None
        self._classpath = jars.classpath("rocketmq-server")

    @property
    def namesrv(self) -> str:
        """The name servers as clients take them (``a:9876;b:9876``), advertised addresses."""
        return ";".join(self.namesrv_addrs)

    def _java(self, name: str, heap: str, main: str, args: Sequence[str], jvm: Sequence[str] = ()) -> list[str]:
        home = self.root / "home"
        (home / "conf").mkdir(parents=True, exist_ok=True)
        return ["java", f"-Xms{heap}", f"-Xmx{heap}", *jvm,
                f"-Duser.home={self.root}", f"-Drocketmq.home.dir={home}",
                f"-Drmq.logback.configurationFile={LOGBACK_FILE}",
                f"-Dsparkmq.log.file={self.root / 'logs' / f'{name}.log'}", "-Dsparkmq.log.level=INFO",
                "-cp", self._classpath, main, *args]

    def start_namesrv(self, port: int | None = None) -> str:
        """Start a name server; returns its (advertised) address once it answers."""
        port = port or free_port(self.bind_host)
        index = len(self.namesrv_addrs)
        conf = _write_props(self.root / "conf" / f"namesrv{index}.conf", {
            "listenPort": port, "bindAddress": self.bind_host,
            "kvConfigPath": self.root / f"namesrv{index}" / "kvConfig.json",
            "configStorePath": self.root / f"namesrv{index}" / "namesrv.properties"})
        jvm = self._spawn(f"namesrv{index}", self._java(f"namesrv{index}", self.namesrv_heap,
                                                        "org.apache.rocketmq.namesrv.NamesrvStartup",
                                                        ["-c", str(conf)], ("-XX:+UseG1GC",)))
        addr = f"{self.bind_host}:{port}"
        self._wait(lambda: remoting_capture.request(addr, 106, timeout=2).code == 0, 60, f"name server {addr}", jvm)
        self._namesrv_ports.append(port)
        self.namesrv_addrs.append(f"{self.advertise_host}:{port}")
        return self.namesrv_addrs[-1]

    def broker_conf(self, name: str, *, broker_id: int | None = 0, role: str = "ASYNC_MASTER",
                    flush: str = "ASYNC_FLUSH", port: int | None = None, label: str | None = None,
                    extra: dict[str, object] | None = None) -> dict[str, object]:
        """A broker.conf as a dict: cluster, name, id (None: left out, as DLedger members), role, flush, ports,
        store paths under ``<root>/store/<label>``, addresses.  Brokers reach the name servers directly on
        ``bind_host`` (a capture relay sees only what clients say)."""
        port = port or free_ports(2, self.bind_host)
        store = self.root / "store" / (label or f"{name}-{broker_id}")
        conf: dict[str, object] = {"brokerClusterName": self.cluster, "brokerName": name}
        if broker_id is not None:
            conf["brokerId"] = broker_id
        conf.update({
            "namesrvAddr": ";".join(f"{self.bind_host}:{p}" for p in self._namesrv_ports),
            "listenPort": port, "haListenPort": port + 1, "bindAddress": self.bind_host,
            "brokerIP1": self.advertise_host, "brokerIP2": self.advertise_host,
            "storePathRootDir": store, "storePathCommitLog": store / "commitlog",
            "flushDiskType": flush, "brokerRole": role, "autoCreateTopicEnable": "true",
            "mappedFileSizeCommitLog": self.commitlog_file_bytes,
        })
        conf.update(extra or {})
        return conf

    def start_broker(self, name: str, *, broker_id: int | None = 0, role: str = "ASYNC_MASTER",
                     flush: str = "ASYNC_FLUSH", port: int | None = None, label: str | None = None,
                     extra: dict[str, object] | None = None, wait: bool = True) -> BrokerProc:
        """Start a broker (``extra`` adds or overrides broker.conf keys); with ``wait``, returns once the name
        servers list it."""
        label = label or f"{name}-{broker_id}"
        conf = self.broker_conf(name, broker_id=broker_id, role=role, flush=flush, port=port, label=label,
                                extra=extra)
        path = _write_props(self.root / "conf" / f"broker-{label}.conf", conf)
        jvm = self._spawn(f"broker-{label}", self._java(f"broker-{label}", self.broker_heap,
                                                        "org.apache.rocketmq.broker.BrokerStartup",
                                                        ["-c", str(path)], (*BROKER_JVM, "-XX:MaxDirectMemorySize=1g")))
        broker = BrokerProc(jvm, name, -1 if broker_id is None else broker_id,
                            f"{self.advertise_host}:{conf['listenPort']}", {k: str(v) for k, v in conf.items()})
        self.brokers.append(broker)
        if wait and broker_id is not None:
            self.wait_brokers({name: {broker_id}})
        return broker

    def start_master_slave(self, name: str, *, flush: str = "ASYNC_FLUSH",
                           extra: dict[str, object] | None = None) -> tuple[BrokerProc, BrokerProc]:
        """A SYNC_MASTER (id 0) and its SLAVE (id 1) of one broker name; returns once both are registered."""
        master = self.start_broker(name, broker_id=0, role="SYNC_MASTER", flush=flush, extra=extra, wait=False)
        slave = self.start_broker(name, broker_id=1, role="SLAVE", flush=flush, extra=extra, wait=False)
        self.wait_brokers({name: {0, 1}})
        # The slave learns the master's HA address from its registration and connects within ~5 s; until then a
        # SYNC_MASTER answers sends with SLAVE_NOT_AVAILABLE.  Its store logs the connection.
        log = self.root / "logs" / f"broker-{name}-1.log"
        self._wait(lambda: "HAClient connect to master " in log.read_text(errors="replace").replace(
            "HAClient connect to master null", ""), 60, f"slave of {name} connected to its master", slave.jvm)
        return master, slave

    def start_dledger(self, name: str, members: int = 3, *, flush: str = "ASYNC_FLUSH",
                      extra: dict[str, object] | None = None) -> list[BrokerProc]:
        """A DLedger group of ``members`` brokers (RocketMQ's DLedger commit-log mode: the elected leader is the
        master, brokerId 0); returns once a leader and its followers are registered."""
        dledger_ports = [free_port(self.bind_host) for _ in range(members)]
        peers = ";".join(f"n{i}-{self.bind_host}:{p}" for i, p in enumerate(dledger_ports))
        started = []
        for i in range(members):
            conf = {"enableDLegerCommitLog": "true", "dLegerGroup": name, "dLegerPeers": peers,
                    "dLegerSelfId": f"n{i}", **(extra or {})}
            started.append(self.start_broker(name, broker_id=None, flush=flush, label=f"{name}-n{i}", extra=conf,
                                             wait=False))
        self.wait_brokers({name: {0}}, min_members={name: members}, timeout=120)
        return started

    def start_proxy_local(self, name: str, *, flush: str = "ASYNC_FLUSH",
                          extra: dict[str, object] | None = None) -> str:
        """The proxy in local mode: one JVM holding a broker (``name``, master) and the gRPC endpoint RocketMQ 5
        clients (rocketmq-client-java) use.  Returns ``host:grpcPort`` once the broker is registered and the
        gRPC port accepts connections."""
        conf = self.broker_conf(name, flush=flush, extra=extra)
        label = f"proxy-{name}"
        broker_path = _write_props(self.root / "conf" / f"{label}-broker.conf", conf)
        grpc_port, remoting_port = free_port(self.bind_host), free_port(self.bind_host)
        proxy_conf = self.root / "conf" / f"{label}.json"
        proxy_conf.write_text(json.dumps({
            "rocketMQClusterName": self.cluster, "namesrvAddr": conf["namesrvAddr"], "proxyMode": "LOCAL",
            "grpcServerPort": grpc_port, "remotingListenPort": remoting_port, "brokerConfigPath": str(broker_path)}))
        jvm = self._spawn(label, self._java(label, self.broker_heap, "org.apache.rocketmq.proxy.ProxyStartup",
                                            ["-pm", "local", "-pc", str(proxy_conf), "-bc", str(broker_path)],
                                            (*BROKER_JVM, "-XX:MaxDirectMemorySize=1g")))
        self.brokers.append(BrokerProc(jvm, name, 0, f"{self.advertise_host}:{conf['listenPort']}",
                                       {k: str(v) for k, v in conf.items()}))
        self.wait_brokers({name: {0}})

        def grpc_up() -> bool:
            with socket.socket() as s:
                return s.connect_ex((self.bind_host, grpc_port)) == 0
        self._wait(grpc_up, 60, f"proxy gRPC port {grpc_port}", jvm)
        self.grpc_endpoint = f"{self.bind_host}:{grpc_port}"
        return self.grpc_endpoint

    def cluster_info(self) -> dict[str, dict[int, str]]:
        """``{brokerName: {brokerId: addr}}`` as the first name server reports it (GET_BROKER_CLUSTER_INFO)."""
        return cluster_info(f"{self.bind_host}:{self._namesrv_ports[0]}")

    def wait_brokers(self, expect: dict[str, set[int]], *, min_members: dict[str, int] | None = None,
                     timeout: float = 90.0) -> dict[str, dict[int, str]]:
        """Wait until the name server lists each broker name with (at least) the expected ids (and, for a
        DLedger group, ``min_members`` members)."""
        def ready() -> dict[str, dict[int, str]] | None:
            info = self.cluster_info()
            for name, ids in expect.items():
                have = info.get(name, {})
                if not ids <= set(have) or len(have) < (min_members or {}).get(name, 0):
                    return None
            return info
        return self._wait(ready, timeout, f"brokers {expect} registered", *[b.jvm for b in self.brokers])

    def _wait(self, predicate, timeout: float, what: str, *watch: JvmProcess):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = predicate()
            except (OSError, remoting_capture.FrameError, ValueError):
                value = None
            if value:
                return value
            dead = [j for j in watch if not j.alive()]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {j.name} (exit {j.proc.poll()}):\n{j.log(2000)}" for j in (dead or watch))
                raise RuntimeError(f"RocketMQ: {what} not ready after {timeout} s\n{logs}")
            time.sleep(0.3)


def cluster_info(namesrv: str) -> dict[str, dict[int, str]]:
    """``{brokerName: {brokerId: addr}}`` as the name server at ``namesrv`` reports it over RocketMQ's remoting
    (GET_BROKER_CLUSTER_INFO; Apache RocketMQ's and sparkmq's name servers alike)."""
    frame = remoting_capture.request(namesrv, 106, timeout=5)
    if frame.code != 0:
        return {}
    # brokerAddrs keys are bare numbers ({0:"ip:port"}): quote them so json can read the body
    text = re.sub(r'([{,])(-?\d+):', r'\1"\2":', frame.body.decode())
    table = json.loads(text).get("brokerAddrTable", {})
    return {name: {int(k): v for k, v in data.get("brokerAddrs", {}).items()} for name, data in table.items()}


_KAFKA_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:sparkmq.log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = ${sys:sparkmq.log.level:-INFO}
rootLogger.appenderRef.file.ref = FILE
"""


class Kafka(_Processes):
    """Apache Kafka 4.4.0 (jar set ``kafka``): one KRaft node (broker and controller in one process) under
    ``root``, formatted before its first start; and its tools (topics, ProducerPerformance, ConsumerPerformance).
    """

    def __init__(self, root: Path, *, heap: str = "1g", host: str = "127.0.0.1",
                 extra: dict[str, object] | None = None) -> None:
        super().__init__(root)
        self.heap = heap
        self.host = host
        self.extra = dict(extra or {})
        self.port = 0
        self.controller_port = 0
        self._classpath = jars.classpath("kafka")
        self._log4j = self.root / "log4j2.properties"
        self._log4j.write_text(_KAFKA_LOG4J)

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the broker's PLAINTEXT listener."""
        return f"{self.host}:{self.port}"

    def java(self, name: str, main: str, args: Sequence[str], *, heap: str = "512m", jvm: Sequence[str] = (),
             level: str = "WARN") -> list[str]:
        """A Kafka JVM command line with log4j2 writing to ``<root>/logs/<name>.log``."""
        return ["java", f"-Xmx{heap}", *jvm, f"-Dlog4j2.configurationFile={self._log4j}",
                f"-Dsparkmq.log.file={self.root / 'logs' / f'{name}.log'}", f"-Dsparkmq.log.level={level}",
                "-cp", self._classpath, main, *args]

    def start(self) -> str:
        """Write server.properties, format the log dir with a new cluster id, start the node; returns the
        bootstrap address once the broker has started."""
        self.port, self.controller_port = free_port(self.host), free_port(self.host)
        props: dict[str, object] = {
            "process.roles": "broker,controller", "node.id": 1,
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": self.root / "data", "num.partitions": 4,
            "offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1, "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1, "group.initial.rebalance.delay.ms": 0,
            **self.extra}
        conf = _write_props(self.root / "server.properties", props)
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        cluster_id = subprocess.run(self.java("storage", "kafka.tools.StorageTool", ["random-uuid"]),
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        fmt = subprocess.run(self.java("storage", "kafka.tools.StorageTool",
                                       ["format", "-t", cluster_id, "-c", str(conf)]),
                             capture_output=True, text=True)
        if fmt.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed: {fmt.stdout}{fmt.stderr}")
        jvm = self._spawn("kafka", self.java("kafka", "kafka.Kafka", [str(conf)], heap=self.heap,
                                             jvm=(f"-Xms{self.heap}", *KAFKA_JVM), level="INFO"))
        server_log = self.root / "logs" / "kafka.log"
        deadline = time.monotonic() + 90
        while "Kafka Server started" not in (server_log.read_text(errors="replace") if server_log.exists() else ""):
            if not jvm.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"Kafka did not start (exit {jvm.proc.poll()}):\n{jvm.log()}\n"
                                   f"{server_log.read_text(errors='replace')[-3000:] if server_log.exists() else ''}")
            time.sleep(0.3)
        return self.bootstrap

    def tool(self, main: str, args: Sequence[str], *, name: str, heap: str = "512m",
             timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        """Run a Kafka tool (``org.apache.kafka.tools.…``) to its end; stdout and stderr captured."""
        return subprocess.run(self.java(name, main, args, heap=heap), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def create_topic(self, topic: str, partitions: int = 4) -> None:
        """Create a topic (replication factor 1)."""
        result = self.tool("org.apache.kafka.tools.TopicCommand",
                           ["--bootstrap-server", self.bootstrap, "--create", "--topic", topic,
                            "--partitions", str(partitions), "--replication-factor", "1"], name="topics")
        if result.returncode != 0:
            raise RuntimeError(f"creating topic {topic} failed: {result.stdout}{result.stderr}")

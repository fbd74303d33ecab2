"""Lake benchmarks: brokers as real processes, the Spark jobs reading them over remoting and HTTP, the tables
written by delta-spark.

    python benchmarks/bench_lake.py [--quick]          (python3 build.py bench lake)

The first line is the machine's Python speed of the day (``machine.python_echo``, from
``../shared/tools/python_echo.py`` next to the repository, or ``$SPARKMQ_PYTHON_ECHO``): the lake
targets are not scaled by it, but it is reported beside them.  Then one line of figures each (every
figure printed, reached or not, with its target):

* ``lake.source_read`` -- batch read of a backlog (1,000,000 messages, 8 queues) through the
  ``sparkmq`` source into a ``noop`` sink: messages/s.  Target >= 600,000.  The broker registers
  with a name server, whose route names its remoting endpoint, so executors pull over remoting
  (``msgs_per_s``).  A second broker serving HTTP only (``--remoting-port -1``, as an older
  broker would) holds the same backlog; reading it measures the source over HTTP
  (``http_msgs_per_s``).  After an untimed read of each backlog, the two reads alternate for
  ``rounds`` rounds and the best of each is reported; ``remoting_connections`` counts the
  workers' connections to the first broker's remoting port afterwards.  A small read runs first
  (``lake.source_cold_start``): a session's first query pays for the Python workers' start.
* ``lake.dispatch_throughput`` -- ``start_dispatch`` with ``trigger={"availableNow": True}`` over the
  same backlog into ``messages``, ``consume_queue`` and ``message_keys`` (delta-spark, Delta's idempotent
  appends): messages/s.  Target >= 150,000.
* ``lake.produce_with_lake`` -- batched produce (Arrow, 64 messages per request, four client threads)
  against a broker with ``--lake`` running its jobs, divided by the same against a broker without
  the lake.  Both brokers run side by side and take turns, several rounds each: while one is
  measured the other is frozen with SIGSTOP (with its Spark JVM and workers), so the two see the
  same machine, minute by minute, on a shared host.  The figure is the median of the rounds'
  ratios.  Target >= 0.9.
* ``lake.freshness`` -- a steady 20,000 msgs/s into the ``--lake`` broker; for every row of
  ``messages`` (what ``sparkmq.messages`` shows; one per message) the time it became visible (when the
  Delta log entry of the version that added it appeared: that file's modification time) minus its store
  timestamp (the broker acknowledges a send once it is stored): p50/p99/max.  Target p99 <= 1.5 s.

* ``lake.commit_cost`` -- what one micro-batch's commit costs before any row: 1-row appends to a Delta
  table (``consume_queue``'s spec) through delta-spark, alternately with Delta's idempotent-write
  options (``txnAppId``/``txnVersion``, as dispatch writes) and without; the median seconds of each,
  their ratio and the Spark jobs per append (no target: it explains ``lake.freshness``).  Delta looks
  the app id up in the snapshot's reconstructed state, so an idempotent append runs the state
  reconstruction's jobs on top of its write (``docs/lake.md``).

Bodies are 100 bytes with one key each.  Brokers run with ``--no-trace`` so the figures are
about the lake's work, not the trace topic's.  The ``--lake`` broker's Spark runs ``local[1]``
(``--lake-master`` to change it), its dispatch job on a 0.5 s trigger.  The benchmark process holds its own
SparkSession (``local[2]``) for the first two.  The machine is shared (2 cores): the broker,
Spark's JVM and Python workers, and the load generator compete -- compare figures of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import httpx
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkmq.platform.client.remoting import BrokerClient
from sparkmq.platform.common import wire

BODY = os.urandom(50).hex().encode()  # 100 bytes
QUEUES = 8
BATCH = 1000
#: Rounds of the source read (one over remoting, one over HTTP each); the best of each is reported.
SOURCE_ROUNDS = 2
#: The targets of issue 26 (the names are fixed; see ../shared/targets.txt).
TARGET_SOURCE_MSGS_S = 600_000
TARGET_DISPATCH_MSGS_S = 150_000
TARGET_PRODUCE_RATIO = 0.9
TARGET_FRESHNESS_P99_S = 1.5
#: The machine's Python speed of the day, printed first by every benchmark run.
PYTHON_ECHO = Path(os.environ.get("SPARKMQ_PYTHON_ECHO")
                   or Path(__file__).resolve().parents[2] / "shared" / "tools" / "python_echo.py")


def line(name: str, **figures: object) -> None:
    """Print one benchmark line."""
    parts = [name] + [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()]
    print(" ".join(parts), flush=True)


# -- brokers ------------------------------------------------------------------------------------------

class NameServerProc:
    """A name server process on a free port, stopped with SIGTERM."""

    def __init__(self, root: Path) -> None:
        self.log = (root / "namesrv.log").open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "sparkmq.api.namesrv_main", "--host", "127.0.0.1",
                                      "--port", "0", "--scan-interval-s", "0.5"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, stdin=subprocess.DEVNULL)
        match = re.search(r"listening on http://(\S+)", _first_line(self.proc, 60))
        if match is None:
            self.stop()
            raise SystemExit("the name server did not start")
        self.addr = match.group(1)
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()  # type: ignore

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.log.close()


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` prints, or "" after ``timeout`` s."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()  # type: ignore
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


class BrokerProc:
    """A broker process on a free port (``--lake`` optional), stopped with SIGTERM.

    With ``namesrv`` it registers there (every 0.5 s), so routes name its remoting endpoint;
    ``remoting=False`` serves HTTP only.
    """

    def __init__(self, root: Path, name: str, lake: bool, lake_master: str = "local[1]",
                 namesrv: str | None = None, remoting: bool = True) -> None:
        self.root = root
        args = [sys.executable, "-m", "sparkmq.api.broker_main", "--host", "127.0.0.1", "--port", "0",
                "--data-dir", str(root / name), "--broker-name", name, "--no-trace"]
        if namesrv is not None:
            args += ["--namesrv", namesrv, "--register-interval-s", "0.5"]
        if not remoting:
            args += ["--remoting-port", "-1"]
        if lake:
            config = root / f"{name}.toml"
            config.write_text('[lake]\njobs = ["dispatch"]\n'
                              f'[lake.spark_conf]\n"spark.master" = "{lake_master}"\n')
            args += ["--config", str(config), "--lake"]
        self.name = name
        self.log = (root / f"{name}.log").open("w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     stdin=subprocess.DEVNULL)
        ready = _first_line(self.proc, 60)
        match = re.search(r"listening on http://(\S+)", ready)
        if match is None:
            self.stop()
            raise SystemExit(f"broker {name} did not start: {ready!r}")
        self.addr = match.group(1)
        # The next line names the remoting endpoint.
        endpoint = re.search(r"broker remoting on (\S+)", _first_line(self.proc, 10)) if remoting else None
        self.remoting_addr = endpoint.group(1) if endpoint else None
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()  # type: ignore

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def arrow_batch(n: int, tag: str = "") -> bytes:
    """An Arrow IPC batch send of ``n`` 100-byte messages, each with one key."""
    keys = [f"{tag}k{i}" for i in range(n)]
    return wire.to_ipc(pa.RecordBatch.from_arrays([
        pa.array([BODY] * n, pa.binary()), pa.array([None] * n, pa.string()), pa.array(keys, pa.string()),
        pa.array([[]] * n, wire.SEND_SCHEMA.field("properties").type)], schema=wire.SEND_SCHEMA))


def load(addr: str, topic: str, total: int, batch: int = BATCH, threads: int = 2) -> float:
    """Send ``total`` messages in Arrow batches spread over the queues; messages/s."""
    payload = arrow_batch(batch)
    requests = total // batch
    counter = iter(range(requests))
    lock = threading.Lock()

    def worker() -> None:
        client = BrokerClient(addr, 60.0)
        try:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                client.send_batch(topic, {"queue_id": i % QUEUES}, arrow=payload)
        finally:
            client.close()

    started = time.perf_counter()
    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return requests * batch / (time.perf_counter() - started)


def create_topic(addr: str, topic: str) -> None:
    client = BrokerClient(addr, 30.0)
    try:
        client.create_topic({"topic": topic, "read_queue_nums": QUEUES, "write_queue_nums": QUEUES})
    finally:
        client.close()


# -- the benchmarks -----------------------------------------------------------------------------------

def remoting_connections(broker: BrokerProc) -> int:
    """Connections the broker holds on its remoting port: the Spark workers' (proof the reads used it)."""
    if broker.remoting_addr is None:
        return 0
    port = int(broker.remoting_addr.rsplit(":", 1)[1])
    return sum(1 for c in psutil.Process(broker.proc.pid).net_connections("tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def wait_routed(namesrv: str, topic: str, timeout: float = 30.0) -> None:
    """Wait until the name server routes ``topic`` (the broker registers every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"http://{namesrv}/routes/{topic}", timeout=5).status_code == 200:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the name server never routed {topic}")


def bench_source_and_dispatch(spark, broker: BrokerProc, http_broker: BrokerProc, namesrv: NameServerProc,
                              root: Path, n: int, dispatch: bool = True) -> None:
    """The source over remoting (``broker``) and over HTTP (``http_broker``), then the dispatch job on ``broker``."""
    from sparkmq.pipelines.dispatch import dispatch_stats, start_dispatch
    from sparkmq.pipelines.source import register

    create_topic(broker.addr, "LakeBacklog")
    rate = load(broker.addr, "LakeBacklog", n)
    line("lake.backlog_load", messages=n, msgs_per_s=rate)
    create_topic(broker.addr, "LakeWarmUp")
    load(broker.addr, "LakeWarmUp", 8 * BATCH)
    # The same backlog on the HTTP-only broker, under topics of its own (a route per broker).
    create_topic(http_broker.addr, "LakeBacklogHttp")
    load(http_broker.addr, "LakeBacklogHttp", n)
    create_topic(http_broker.addr, "LakeWarmUpHttp")
    load(http_broker.addr, "LakeWarmUpHttp", 8 * BATCH)
    register(spark)
    for topic in ("LakeBacklog", "LakeWarmUp", "LakeBacklogHttp", "LakeWarmUpHttp"):
        wait_routed(namesrv.addr, topic)

    def read(topic: str) -> float:
        df = (spark.read.format("sparkmq").option("namesrv", namesrv.addr)
              .option("subscribe", topic).option("endingOffsets", "latest"))
        started = time.perf_counter()
        df.load().write.format("noop").mode("overwrite").save()
        return time.perf_counter() - started

    try:
        # A warm-up read of a small topic: the first query of a session pays for the JVM's code
        # paths and the Python workers' start (a lake service pays it once); reported on its own.
        line("lake.source_cold_start", messages=8 * BATCH, seconds=read("LakeWarmUp"))
        read("LakeWarmUpHttp")  # the HTTP side's connections and code paths too
        # One untimed read of each backlog: the JVM compiles its paths for big batches and the
        # brokers finish writing the load, which would otherwise tax whichever read comes first.
        read("LakeBacklog")
        read("LakeBacklogHttp")
        rows = n
        timed: dict[str, list[float]] = {"LakeBacklog": [], "LakeBacklogHttp": []}
        for _ in range(SOURCE_ROUNDS):  # alternate, so both see the same machine; best of each
            for topic, times in timed.items():
                times.append(read(topic))
        elapsed, http_elapsed = min(timed["LakeBacklog"]), min(timed["LakeBacklogHttp"])
        line("lake.source_read", messages=rows, seconds=elapsed, msgs_per_s=rows / elapsed,
             http_msgs_per_s=rows / http_elapsed, rounds=SOURCE_ROUNDS,
             remoting_connections=remoting_connections(broker), target_msgs_per_s=TARGET_SOURCE_MSGS_S,
             reached=rows / elapsed >= TARGET_SOURCE_MSGS_S)
    except Exception as exc:
        line("lake.source_read", error=repr(str(exc)[:200]))
    if not dispatch:
        return
    try:
        lake, ckpt = root / "lake-dispatch", root / "ckpt-dispatch"
        started = time.perf_counter()
        query = start_dispatch(spark, {broker.name: broker.addr}, lake, ckpt, {"availableNow": True})
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        stats = dispatch_stats(query)
        rows = stats.rows if stats else 0
        if query.exception() is not None:
            raise RuntimeError(str(query.exception())[:200])
        batches = list(stats.history) if stats else []
        write_s = sum(b.duration_s for b in batches)
        line("lake.dispatch_throughput", messages=rows, batches=len(batches), seconds=elapsed,
             msgs_per_s=rows / elapsed, batch_s=write_s, target_msgs_per_s=TARGET_DISPATCH_MSGS_S,
             reached=rows / elapsed >= TARGET_DISPATCH_MSGS_S)
    except Exception as exc:
        line("lake.dispatch_throughput", error=repr(str(exc)[:200]))


def produce_rate(addr: str, topic: str, seconds: float) -> float:
    """Batched produce (Arrow, 64 per request), four threads over four queues, for ``seconds``: messages/s."""
    payload = arrow_batch(64, "p")
    stop = time.monotonic() + seconds
    counts: list[int] = []

    def worker(q: int) -> None:
        client = BrokerClient(addr, 30.0)
        sent = 0
        try:
            while time.monotonic() < stop:
                client.send_batch(topic, {"queue_id": q}, arrow=payload)
                sent += 64
        finally:
            client.close()
            counts.append(sent)

    started = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(q,)) for q in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - started)


class Frozen:
    """SIGSTOP a process and everything it started for the ``with`` block, then SIGCONT them."""

    def __init__(self, pid: int) -> None:
        root = psutil.Process(pid)
        self.procs = [root, *root.children(recursive=True)]

    def __enter__(self) -> Frozen:
        for p in self.procs:
            p.suspend()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                continue


def bench_produce_with_lake(plain: BrokerProc, laked: BrokerProc, rounds: int, seconds: float) -> None:
    """Alternate rounds of produce against the plain and the lake broker, the other one frozen."""
    for broker in (plain, laked):
        create_topic(broker.addr, "LakeProduce")
        produce_rate(broker.addr, "LakeProduce", 1.0)  # warm-up: connections, first segment pages
    without, with_lake = [], []
    for _ in range(rounds):
        with Frozen(laked.proc.pid):
            without.append(produce_rate(plain.addr, "LakeProduce", seconds))
        with Frozen(plain.proc.pid):
            with_lake.append(produce_rate(laked.addr, "LakeProduce", seconds))
    ratios = [w / o for w, o in zip(with_lake, without, strict=True)]
    ratio = float(np.median(ratios))
    line("lake.produce_with_lake", rounds=rounds, without_msgs_per_s=float(np.median(without)),
         with_msgs_per_s=float(np.median(with_lake)), ratio=ratio, ratio_min=min(ratios), ratio_max=max(ratios),
         target_ratio=TARGET_PRODUCE_RATIO, reached=ratio >= TARGET_PRODUCE_RATIO)


def wait_lake_running(addr: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            lake = httpx.get(f"http://{addr}/health", timeout=5).json().get("lake", {})
            if lake.get("jobs", {}).get("dispatch", {}).get("state") == "running" and \
                    lake["jobs"]["dispatch"].get("batches_total"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the broker's lake did not start")


def visible_lags_ms(table_path: Path, since_version: int, topic: str) -> np.ndarray:
    """For every row of ``topic`` committed after ``since_version``: when its log entry appeared minus its store
    time, ms.  Rows of other topics (the produce benchmark's backlog, still being dispatched) are left out."""
    log_dir = table_path / "_delta_log"
    lags = []
    for entry in sorted(log_dir.glob("*.json")):
        version = int(entry.stem)
        if version <= since_version:
            continue
        visible_ms = entry.stat().st_mtime_ns / 1e6      # the version exists for readers from this moment
        files = [json.loads(raw)["add"]["path"] for raw in entry.read_text().splitlines() if '"add"' in raw]
        files = [f for f in files if f]
        for f in files:
            t = pq.read_table(table_path / unquote(f), columns=["topic", "store_ts"])
            t = t.filter(pc.equal(t.column("topic"), topic))
            lags.append(visible_ms - t.column("store_ts").cast(pa.int64()).to_numpy() / 1000.0)
    return np.concatenate(lags) if lags else np.array([])


def bench_freshness(broker: BrokerProc, rate: int, seconds: float) -> None:
    """A steady ``rate`` msgs/s for ``seconds``; p99 of store -> visible in messages (sparkmq.messages)."""
    path = Path(broker.root) / broker.name / "lake" / "messages"
    from deltalake import DeltaTable

    create_topic(broker.addr, "LakeFresh")
    time.sleep(2.0)  # let the dispatch job notice the new topic
    start_version = DeltaTable(str(path)).version()
    per_request = 200
    interval = per_request / rate
    payload = arrow_batch(per_request, "f")
    client = BrokerClient(broker.addr, 30.0)
    sent, behind = 0, 0.0
    started = time.monotonic()
    try:
        i = 0
        while time.monotonic() - started < seconds:
            due = started + i * interval
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            else:
                behind = max(behind, now - due)
            client.send_batch("LakeFresh", {"queue_id": i % QUEUES}, arrow=payload)
            sent += per_request
            i += 1
    finally:
        client.close()
    achieved = sent / (time.monotonic() - started)
    # Wait for the tail to be dispatched (bounded), then measure from the Delta log.
    deadline = time.monotonic() + 60
    lags = visible_lags_ms(path, start_version, "LakeFresh")
    while lags.size < sent and time.monotonic() < deadline:
        time.sleep(1.0)
        lags = visible_lags_ms(path, start_version, "LakeFresh")
    if lags.size == 0:
        line("lake.freshness", error="no rows became visible", sent=sent)
        return
    p50, p99 = np.percentile(lags, [50, 99])
    line("lake.freshness", sent=sent, visible=int(lags.size), target_rate=rate, achieved_rate=achieved,
         sender_behind_s=behind, p50_s=p50 / 1000, p99_s=p99 / 1000, max_s=float(lags.max()) / 1000,
         target_p99_s=TARGET_FRESHNESS_P99_S,
         reached=bool(p99 <= TARGET_FRESHNESS_P99_S * 1000 and lags.size >= sent and achieved >= 0.95 * rate))


def bench_commit_cost(spark, root: Path, rounds: int) -> None:
    """1-row appends with and without ``txnAppId``/``txnVersion``, alternating; medians, ratio, jobs each."""
    from datetime import UTC, datetime

    from sparkmq.pipelines import tables

    tables.ensure_tables(spark, str(root / "lake-commit"), [tables.CONSUME_QUEUE])
    path = tables.table_path(root / "lake-commit", tables.CONSUME_QUEUE)
    schema = spark.table(f"delta.`{path}`").schema
    tracker = spark.sparkContext.statusTracker()

    def append(version: int, idempotent: bool) -> tuple[float, int]:
        frame = spark.createDataFrame([("T", "b", 0, version, version, 1, 0, datetime.now(UTC))], schema)
        writer = frame.write.format("delta").mode("append")
        if idempotent:
            writer = writer.option("txnAppId", "bench-commit").option("txnVersion", str(version))
        group = f"bench-commit-{version}"
        spark.sparkContext.setJobGroup(group, group)   # Delta's helper threads carry it to their jobs
        started = time.perf_counter()
        writer.save(path)
        return time.perf_counter() - started, len(tracker.getJobIdsForGroup(group))

    for version in range(3):  # warm-up: the first appends of a session pay for Delta's code paths
        append(version, idempotent=version % 2 == 0)
    timed: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for version in range(3, 3 + 2 * rounds):
        idempotent = version % 2 == 1
        timed[idempotent].append(append(version, idempotent))
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    with_txn = float(np.median([s for s, _ in timed[True]]))
    without = float(np.median([s for s, _ in timed[False]]))
    line("lake.commit_cost", rounds=rounds, txn_s=with_txn, plain_s=without, txn_over_plain=with_txn / without,
         txn_jobs=int(np.median([j for _, j in timed[True]])), plain_jobs=int(np.median([j for _, j in timed[False]])))


def python_echo() -> float:
    """Print the machine's Python speed line (``machine.python_echo ...``) first, as every benchmark run does;
    returns its ``msgs_per_s`` (NaN when it could not run), to report beside other figures."""
    if not PYTHON_ECHO.exists():
        line("machine.python_echo", error=repr(f"{PYTHON_ECHO} not found (set SPARKMQ_PYTHON_ECHO)"))
        return float("nan")
    done = subprocess.run([sys.executable, str(PYTHON_ECHO)], capture_output=True, text=True, timeout=600)
    echoed = [x for x in done.stdout.splitlines() if x.startswith("machine.python_echo")]
    print(echoed[-1] if echoed else f"machine.python_echo error={done.stderr[-200:]!r}", flush=True)
    figure = re.search(r"msgs_per_s=([\d.]+)", echoed[-1]) if echoed else None
    return float(figure.group(1)) if figure else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts for a CI smoke run")
    parser.add_argument("--only", default="",
                        help="comma list: read,produce,freshness,commit (default all); source = read without dispatch")
    parser.add_argument("--lake-master", default="local[1]",
                        help="spark.master of the broker's lake (default local[1]: one core left to delivery)")
    args = parser.parse_args()
    n = 50_000 if args.quick else 1_000_000
    produce_rounds, produce_s = (2, 1.0) if args.quick else (5, 3.0)
    fresh_rate, fresh_s = (5_000, 5.0) if args.quick else (20_000, 30.0)
    only = set(filter(None, args.only.split(","))) or {"read", "produce", "freshness", "commit"}
    python_echo()
    root = Path(tempfile.mkdtemp(prefix="sparkmq-bench-lake-"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        if only & {"read", "source", "commit"}:
            from sparkmq.pipelines.session import get_spark, stop_spark

            namesrv = NameServerProc(root)
            brokers: list[BrokerProc] = []
            try:
                spark = get_spark({"spark.master": "local[2]"}, app_name="sparkmq-bench-lake", log_level="ERROR")
                try:
                    if only & {"read", "source"}:
                        brokers.append(BrokerProc(root, "bench-a", lake=False, namesrv=namesrv.addr))
                        brokers.append(BrokerProc(root, "bench-h", lake=False, namesrv=namesrv.addr, remoting=False))
                        bench_source_and_dispatch(spark, brokers[0], brokers[1], namesrv, root, n,
                                                  dispatch="read" in only)
                    if "commit" in only:
                        bench_commit_cost(spark, root, 3 if args.quick else 10)
                finally:
                    stop_spark()
            finally:
                for broker in brokers:
                    broker.stop()
                namesrv.stop()
        if only & {"produce", "freshness"}:
            plain = BrokerProc(root, "bench-plain", lake=False) if "produce" in only else None
            laked = BrokerProc(root, "bench-lake", lake=True, lake_master=args.lake_master)
            try:
                create_topic(laked.addr, "LakeProduce")
                laked_client = BrokerClient(laked.addr, 10.0)
                laked_client.send("LakeProduce", {"body": "start", "queue_id": 0})
                laked_client.close()
                wait_lake_running(laked.addr)
                if plain is not None:
                    bench_produce_with_lake(plain, laked, produce_rounds, produce_s)
                    plain.stop()
                    plain = None
                if "freshness" in only:
                    time.sleep(5.0)  # let the job catch up with the produce benchmark's backlog
                    bench_freshness(laked, fresh_rate, fresh_s)
            finally:
                laked.stop()
                if plain is not None:
                    plain.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

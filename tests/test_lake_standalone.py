"""The lake's jobs on a real Spark standalone cluster: a master and two workers, not local[*].

The test starts Spark's own daemons with ``spark-class`` (:mod:`spark_standalone`: one master,
two 1-core workers, each in its own process group), a name server and two brokers (real
processes, :mod:`test_lake_source`'s cluster) and sends a few thousand messages over four
queues.  Then two Spark applications run on the standalone master, one after the other,
each in its own driver process:

1. ``sparkmq lake --spark-master spark://... --job dispatch`` -- the command that runs the lake jobs for a
   cluster (:class:`~sparkmq.pipelines.lake_service.LakeService`, :func:`~sparkmq.pipelines.dispatch.start_dispatch`),
   here the index job only: the others would share the two 1-core executors (``test_lake_broker`` runs them all).
   It runs until the Delta tables ``messages``, ``consume_queue`` and ``message_keys`` (written by
   delta-spark on the executors, read here with delta-rs) hold every message exactly once, including a
   wave sent while it runs.
2. A streaming subscriber, ``readStream.format("sparkmq")`` with a checkpoint, whose
   ``foreachBatch`` appends each micro-batch to a Delta table of its own with ``txnAppId`` /
   ``txnVersion`` (a replayed batch cannot add rows); it must receive every message exactly once.

Both applications get the Delta jars through ``spark.jars`` only (nothing is installed on the workers):
each executor's directory in its worker holds the jar the driver served, and the executors ran Delta's
writer (the tasks of every micro-batch succeeded there).

That the work ran on the executors in the workers' processes, not in the driver, is read
from the running application's REST API (``/api/v1/applications/<app>/...`` of the driver's
UI): every task of the job's micro-batches (their jobs carry the query name in their
description) ran, and succeeded, on the two executors and none on the driver; each of those
executors is listed by a different worker's own status page (``/json``) and is a live
``CoarseGrainedExecutorBackend`` JVM whose parent process is that worker's JVM.

Run as a script (``python test_lake_standalone.py subscribe SPEC``) this file is the
subscriber's driver: a PySpark driver is one per process, and the test process may hold
the suite's local[2] session.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # run as a script: the helpers next to it
    sys.path.insert(0, str(TESTS))

SUBSCRIBER = "standalone-subscriber"
DISPATCH = "sparkmq-dispatch-cluster"   # the dispatch query of `sparkmq lake` (job name "cluster")


# -- the subscriber's driver (this file run as a script) ---------------------------------------------------

def subscriber_main(spec: dict[str, Any]) -> int:
    """A streaming subscriber on ``spec["conf"]``'s master until the file ``spec["stop"]`` appears."""
    from sparkmq.pipelines.session import get_spark
    from sparkmq.pipelines.source import register

    spark = get_spark(spec["conf"], app_name=SUBSCRIBER, log_level="WARN")
    register(spark)
    out = Path(spec["out"])

    def write(df: Any, batch_id: int) -> None:
        # Executors read the queues and write Delta's files; Delta skips a replayed batch id.
        (df.select("topic", "broker", "queue_id", "queue_offset", "msg_id", "body")
         .write.format("delta").mode("append").option("txnAppId", SUBSCRIBER).option("txnVersion", batch_id)
         .save(str(out)))

    query = (spark.readStream.format("sparkmq").option("namesrv", spec["namesrv"]).option("subscribe", spec["topic"])
             .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", str(spec["per_trigger"]))
             .load().writeStream.queryName(SUBSCRIBER).option("checkpointLocation", spec["checkpoint"])
             .foreachBatch(write).trigger(processingTime="500 milliseconds").start())
    sc = spark.sparkContext
    print(json.dumps({"app_id": sc.applicationId, "ui": sc.uiWebUrl, "master": sc.master}), flush=True)
    stop = Path(spec["stop"])
    while query.isActive and not stop.exists():
        time.sleep(0.2)
    error = query.exception()
    query.stop()
    spark.stop()
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "subscribe":
        sys.exit(f"usage: {sys.argv[0]} subscribe SPEC_JSON")
    sys.exit(subscriber_main(json.loads(sys.argv[2])))


# -- the test ------------------------------------------------------------------------------------------------

import pyarrow.compute as pc  # noqa: E402
import test_lake_source as lake_source  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from spark_standalone import StandaloneCluster, get_json  # noqa: E402
from test_lake_source import Cluster  # noqa: E402

from procs import SLOWNESS, jvm_child_env, wait_until  # noqa: E402
from sparkmq.pipelines import tables  # noqa: E402
from sparkmq.platform.client import Message, SendResult  # noqa: E402
from sparkmq.platform.common import jars  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

# A name server + broker-a + broker-b (real processes) for this module.
cluster = lake_source.cluster

TOPIC = "standalone-orders"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark master and two 1-core, 1 GiB workers; their JVMs boot while the brokers start."""
    spark_cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=1,
                                      memory="1g").start(wait=False)
    try:
        yield spark_cluster
    finally:
        spark_cluster.stop()


class Driver:
    """A Spark driver in a child process (its own process group: its JVM goes with it).

    Its JVM compiles with C1 only, as the tests' services do: A B A B on one day, this file used 483 and 500 s of
    CPU with the drivers on C2, 440 and 416 s with C1."""

    def __init__(self, argv: list[str], log_dir: Path, name: str) -> None:
        self.out_path, self.log_path = log_dir / f"{name}.out", log_dir / f"{name}.log"
        with self.out_path.open("wb") as out, self.log_path.open("wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         env=jvm_child_env(),
                                         start_new_session=True)
        self.reaped = False

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the driver exited with {self.proc.returncode}; its log:\n{self.log()}")
        return True

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (a clean stop) unless it already ended; SIGKILL its process group after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> int | None:
        """Wait for it to exit, then SIGKILL whatever is left of its process group (its JVM, Python workers)."""
        if self.reaped:
            return self.proc.returncode
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if self.proc.poll() is None:
                self.proc.wait(timeout=10)
            self.reaped = True


def send_many(c: Cluster, n: int, start: int = 0) -> list[tuple[Message, SendResult]]:
    """``n`` messages with two keys each, a tag on every other one, in batches of 100 (one queue per batch)."""
    out = []
    for first in range(start, start + n, 100):
        msgs = [Message(TOPIC, b"standalone-%d" % i, tags="odd" if i % 2 else None, keys=(f"k{i}", f"order-{i}"))
                for i in range(first, min(first + 100, start + n))]
        out.extend(zip(msgs, c.producer.send_batch(msgs), strict=True))
    return out


def lake_rows(lake: Path, name: str, columns: list[str]) -> list[tuple]:
    """The rows of table ``name`` for the test's topic (delta-rs, the latest version), sorted."""
    data = DeltaTable(tables.table_path(lake, name)).to_pyarrow_table(columns=columns)
    data = data.filter(pc.equal(data.column("topic"), TOPIC))
    return sorted(zip(*(data.column(c).to_pylist() for c in columns), strict=True))


def positions(sent: list[tuple[Message, SendResult]]) -> list[tuple]:
    return sorted((r.topic, r.broker_name, r.queue_id, r.queue_offset) for _, r in sent)


def assert_lake_holds_each_message_once(lake: Path, sent: list[tuple[Message, SendResult]]) -> None:
    assert lake_rows(lake, tables.CONSUME_QUEUE, ["topic", "broker", "queue_id", "queue_offset"]) == positions(sent)
    got = lake_rows(lake, tables.MESSAGES, ["topic", "broker", "queue_id", "queue_offset", "msg_id", "body",
                                            "sys_flag"])
    assert [row[:5] for row in got] == sorted((r.topic, r.broker_name, r.queue_id, r.queue_offset, r.msg_id)
                                              for _, r in sent)
    bodies = {r.msg_id: m.body for m, r in sent}
    assert all((zlib.decompress(body) if flag & 1 else body) == bodies[msg_id]
               for *_, msg_id, body, flag in got)
    keys = [(r.msg_id, "msg_id", r.topic, r.broker_name, r.queue_id, r.queue_offset) for _, r in sent]
    keys += [(k, "key", r.topic, r.broker_name, r.queue_id, r.queue_offset) for m, r in sent for k in m.keys]
    assert lake_rows(lake, tables.MESSAGE_KEYS, ["key", "key_type", "topic", "broker", "queue_id",
                                                 "queue_offset"]) == sorted(keys)


def dispatched(lake: Path) -> int:
    """Messages the lake holds in both index tables: ``consume_queue`` and ``message_keys`` are committed
    concurrently after ``messages``, so one can be a micro-batch ahead of the other."""
    try:
        queue_rows = len(lake_rows(lake, tables.CONSUME_QUEUE, ["topic", "broker", "queue_id", "queue_offset"]))
        id_rows = sum(1 for key_type, _topic in lake_rows(lake, tables.MESSAGE_KEYS, ["key_type", "topic"])
                      if key_type == "msg_id")
        return min(queue_rows, id_rows)
    except Exception:  # the tables are not created yet  # noqa: BLE001
        return 0


def api(ui: str, path: str) -> Any:
    """GET the driver UI's REST ``path``.  Generous: in CI, beside the lake crash test, the driver's JVM shares two
    cores with five others, and one answer took longer than 10 s."""
    return get_json(f"{ui}/api/v1/applications{path}", timeout=60 * SLOWNESS)


def the_app(ui: str) -> str:
    """The id of the one application the driver UI at ``ui`` serves."""
    apps = api(ui, "")
    assert len(apps) == 1, apps
    return apps[0]["id"]


def tasks_of_query(ui: str, app: str, query_name: str) -> list[dict[str, Any]]:
    """Every task of every job a streaming query ran (its jobs' descriptions start with the query's name)."""
    stage_ids = sorted({s for job in api(ui, f"/{app}/jobs")
                        if (job.get("description") or "").startswith(query_name) for s in job["stageIds"]})
    tasks = []
    for stage in stage_ids:
        for attempt in api(ui, f"/{app}/stages/{stage}?details=true"):
            tasks.extend((attempt.get("tasks") or {}).values())
    return tasks


def assert_ran_on_the_workers_executors(spark_cluster: StandaloneCluster, ui: str, query_name: str,
                                        driver_pid: int) -> dict[str, int]:
    """Every task of ``query_name`` ran on one of the two executors, both worked, none ran in the driver;
    each executor belongs to a different worker and is a JVM under that worker's process.  Returns the
    number of tasks per executor id."""
    app = the_app(ui)
    executors = {e["id"]: e for e in api(ui, f"/{app}/allexecutors")}
    assert executors["driver"]["totalTasks"] == 0, executors["driver"]    # no task ran in the driver
    # The driver listens on loopback (get_spark's default for a master on 127.0.0.1), so did the executors.
    assert executors["driver"]["hostPort"].startswith("127.0.0.1:"), executors["driver"]
    remote = sorted(e for e in executors if e != "driver")
    assert len(remote) == 2, executors

    tasks = tasks_of_query(ui, app, query_name)
    assert tasks, f"no tasks of {query_name} in {app}"
    per_executor: dict[str, int] = {}
    for task in tasks:
        assert task["status"] == "SUCCESS", task
        per_executor[task["executorId"]] = per_executor.get(task["executorId"], 0) + 1
    assert sorted(per_executor) == remote, per_executor                  # both executors, and only they

    # The workers launched them: each worker's own status lists one executor of this application ...
    placed = spark_cluster.executors_of(app)
    assert sorted(worker for worker, _ in placed) == [0, 1], placed
    assert sorted(ex for _, ex in placed) == remote, placed
    # ... and each is a live JVM whose parent is that worker's JVM (not the driver's, not this process's).
    pids = spark_cluster.executor_pids(app)
    assert sorted(pids) == [0, 1] and all(len(p) == 1 for p in pids.values()), pids
    assert driver_pid not in {p for ps in pids.values() for p in ps}
    return per_executor


def test_lake_dispatch_and_a_subscriber_on_a_standalone_cluster(cluster: Cluster, standalone: StandaloneCluster,
                                                                tmp_path: Path) -> None:
    """`sparkmq lake` and a sparkmq readStream run on a master + two workers; every message once, each;
    their tasks ran on both workers' executors and none in the driver."""
    began = time.monotonic()
    cluster.create_topic(TOPIC, queues=2)                  # two queues on each broker
    sent = send_many(cluster, 2000)
    assert len({(r.broker_name, r.queue_id) for _, r in sent}) == 4
    standalone.wait_alive()
    status = standalone.master_json()
    assert status["aliveworkers"] == 2 and not status["activeapps"]

    # 1. The lake's jobs: `sparkmq lake` with spark.master = the standalone master.
    lake = tmp_path / "lake"
    conf = standalone.app_conf()
    lake_ui = f"http://127.0.0.1:{conf['spark.ui.port']}"
    argv = [sys.executable, "-m", "sparkmq.api.cli", "lake", "--namesrv", cluster.namesrv.addr,
            "--lake-root", str(lake), "--spark-master", conf.pop("spark.master"), "--status-interval-s", "5",
            "--job", "dispatch",   # the index only: other jobs would take its two cores (test_lake_broker runs them)
            *(f"--conf={k}={v}" for k, v in conf.items())]
    driver = Driver(argv, tmp_path, "lake")
    try:
        wait_until(lambda: driver.alive() and dispatched(lake) >= len(sent), timeout=600,
                   what=lambda: f"the first wave in the lake; the lake's log:\n{driver.log()}", interval=0.5)
        more = send_many(cluster, 1000, start=2000)         # while the job runs: later micro-batches
        sent += more
        wait_until(lambda: driver.alive() and dispatched(lake) >= len(sent), timeout=180,
                   what="the second wave in the lake", interval=0.5)
        time.sleep(1.5)                                     # a trigger or two more: nothing may be added twice
        assert_lake_holds_each_message_once(lake, sent)
        per_executor = assert_ran_on_the_workers_executors(standalone, lake_ui, DISPATCH, driver.proc.pid)
        lake_app = the_app(lake_ui)
    finally:
        code = driver.stop()
    assert code == 0, driver.log()
    print(f"dispatch tasks per executor: {per_executor}")

    # The cores come free once the lake's application ends.
    wait_until(lambda: not standalone.master_json()["activeapps"], timeout=60, what="the lake app to end")
    assert lake_app in {a["id"] for a in standalone.master_json()["completedapps"]}
    # What stays on disk: each worker's dir holds its executor's log, with the tasks it ran, and the Delta
    # jars the driver served it (spark.jars): the executors loaded Delta from there, not from the workers.
    logs = standalone.executor_logs(lake_app)
    assert sorted(worker for worker, _ in logs) == [0, 1], sorted(logs)
    assert all("Running task" in text for text in logs.values())
    assert_delta_jars_shipped(standalone, lake_app)

    # 2. A streaming subscriber on the same cluster.
    out, stop = tmp_path / "subscriber", tmp_path / "subscriber.stop"
    sub_conf = standalone.app_conf()
    spec = {"conf": sub_conf, "namesrv": cluster.namesrv.addr, "topic": TOPIC, "checkpoint": str(tmp_path / "sub-ck"),
            "out": str(out), "stop": str(stop), "per_trigger": 1000}
    sub = Driver([sys.executable, str(Path(__file__).resolve()), "subscribe", json.dumps(spec)], tmp_path,
                 "subscriber")
    try:
        first_line = wait_until(lambda: sub.alive() and sub.out().strip(), timeout=180, interval=0.5,
                                what=lambda: f"the subscriber's driver; its log:\n{sub.log()}").splitlines()[0]
        info = json.loads(first_line)
        assert info["master"] == standalone.master_url
        # Generous: the suite runs the heaviest Spark files first, two at a time; beside another one the
        # subscriber's micro-batches on this cluster took 18 and 55 s in CI (90 s was not enough there).
        wait_until(lambda: sub.alive() and len(received(out)) >= len(sent), timeout=300,
                   what=lambda: f"the subscriber to receive the backlog; its log:\n{sub.log()}", interval=0.5)
        more = send_many(cluster, 500, start=3000)          # while it runs
        sent += more
        wait_until(lambda: sub.alive() and len(received(out)) >= len(sent), timeout=180,
                   what="the subscriber to receive the new messages", interval=0.5)
        time.sleep(1.5)
        sub_per_executor = assert_ran_on_the_workers_executors(standalone, info["ui"], SUBSCRIBER, sub.proc.pid)
        assert_delta_jars_shipped(standalone, info["app_id"])
        stop.touch()
        assert sub.wait(60) == 0, sub.log()
    finally:
        sub.stop()
    print(f"subscriber tasks per executor: {sub_per_executor}")

    got = received(out)
    assert sorted(row[:5] for row in got) == sorted((r.topic, r.broker_name, r.queue_id, r.queue_offset, r.msg_id)
                                                    for _, r in sent)        # every message, exactly once
    bodies = {r.msg_id: m.body for m, r in sent}
    assert all(body == bodies[msg_id] for *_, msg_id, body in got)
    # The lake's tables still hold the first 3,000 exactly once (the lake was stopped before the last wave).
    assert_lake_holds_each_message_once(lake, sent[:3000])
    print(f"standalone test body: {time.monotonic() - began:.1f} s")


def received(out: Path) -> list[tuple]:
    """The subscriber's rows so far: its Delta table's latest version (delta-rs)."""
    # The sink makes _delta_log before its first commit lands there: until then there is no table yet.
    if not any((out / "_delta_log").glob("*.json")):
        return []
    data = DeltaTable(str(out)).to_pyarrow_table()
    return list(zip(*(data.column(c).to_pylist() for c in ("topic", "broker", "queue_id", "queue_offset", "msg_id",
                                                           "body")), strict=True))


def assert_delta_jars_shipped(spark_cluster: StandaloneCluster, app_id: str) -> None:
    """Each worker's directory of the application's executor holds the Delta jars the driver served."""
    wanted = {p.name for p in jars.jars("delta")}
    for worker in spark_cluster.workers:
        assert worker.work_dir is not None
        executor_dirs = [d for d in (worker.work_dir / app_id).iterdir() if d.is_dir()]
        assert executor_dirs, f"no executor of {app_id} under {worker.work_dir}"
        for directory in executor_dirs:
            assert wanted <= {p.name for p in directory.glob("*.jar")}, (directory, sorted(wanted))


def test_a_loopback_master_gets_a_loopback_driver() -> None:
    """get_spark binds the driver to 127.0.0.1 for a standalone master on loopback only."""
    from sparkmq.pipelines.session import _on_loopback

    for master in ("spark://127.0.0.1:7077", "spark://localhost:7077", "spark://127.0.0.1:7077,localhost:7078"):
        assert _on_loopback(master), master
    for master in ("spark://10.0.0.5:7077", "spark://127.0.0.1:7077,db1:7077", "local[2]", "yarn", "spark://"):
        assert not _on_loopback(master), master

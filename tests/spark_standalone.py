"""A real Spark standalone cluster for tests: one master and N workers, started with ``spark-class``.

Spark's own daemons (``org.apache.spark.deploy.master.Master`` and ``...worker.Worker``) run
from PySpark's install directory (it ships ``bin/spark-class`` and the jars), each in its own
process group, bound to 127.0.0.1 on free ports, with small heaps.  Executors the workers
launch run this interpreter for their Python workers (``PYSPARK_PYTHON``), so they import the
same sparkmq, pyarrow and deltalake as the tests::

    with StandaloneCluster(tmp_path / "spark", workers=2) as cluster:
        conf = cluster.app_conf()            # spark.master = spark://127.0.0.1:PORT and small settings
        ...
        cluster.master_json()["aliveworkers"]                  # 2
        cluster.executors_of(app_id)          # [(worker index, executor id)] from the workers' own JSON

:meth:`StandaloneCluster.stop` ends every process it started (SIGTERM to each process group,
SIGKILL after a grace period): the daemons and the executors and Python workers below them.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procs import SLOWNESS

__all__ = ["Daemon", "StandaloneCluster", "free_port", "spark_home"]


def spark_home() -> Path:
    """PySpark's install directory: ``bin/spark-class`` and ``jars/`` (``$SPARK_HOME`` when set)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(os.environ.get("SPARK_HOME") or _find_spark_home())


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and parse its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback test URLs)
        return json.loads(response.read())


#: The line a Spark daemon logs once its web UI listens: "Bound MasterWebUI to 127.0.0.1, and started at URL".
_BOUND_UI = re.compile(r"Bound \w+WebUI to \S+, and started at (http://\S+)")


@dataclass
class Daemon:
    """One Spark daemon process (the leader of its own process group)."""

    kind: str
    proc: subprocess.Popen[bytes]
    planned_ui_url: str
    log_path: Path
    work_dir: Path | None = None

    @property
    def ui_url(self) -> str:
        """Where its web UI listens: what it logged once bound, else the port it was given.

        Spark moves a UI to the next port when its port is taken meanwhile (another process of a parallel
        run can take a port between :func:`free_port` and the bind), so the planned URL may be another
        Spark's page.
        """
        bound = _BOUND_UI.search(self.log())
        return bound.group(1) if bound else self.planned_ui_url

    def json(self) -> Any:
        """The daemon's status page as JSON (``/json``)."""
        return get_json(f"{self.ui_url}/json")

    def log(self) -> str:
        """What it logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM its process group (SIGKILL after ``grace_s``) and reap it."""
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None and pgid == self.proc.pid:
            _signal_group(pgid, signal.SIGTERM)
        elif self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if pgid is not None and pgid == self.proc.pid:
            _signal_group(pgid, signal.SIGKILL)  # executors or Python workers left behind


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers (``cores`` and ``memory`` each) under ``root``."""

    def __init__(self, root: Path, workers: int = 2, *, cores: int = 1, memory: str = "1g",
                 daemon_memory: str = "256m", python: str | None = None) -> None:
        self.root = Path(root)
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.python = python or sys.executable
        self.home = spark_home()
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        self.master_url = ""

    # -- lifecycle -------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The daemons' environment: PySpark's SPARK_HOME, an empty conf dir, loopback, small heaps."""
        conf_dir = self.root / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        for key in ("SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY",
                    "PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
            env.pop(key, None)
        env.update({
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(conf_dir),              # no spark-env.sh / spark-defaults.conf from elsewhere
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            # The master and workers only schedule: C2's compiling is most of their CPU (34 s to come alive with
            # it, 18 s without, measured on this machine); executors and drivers keep the default JIT.
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            "SPARK_NO_DAEMONIZE": "1",
            "PYSPARK_PYTHON": self.python,                # executors' Python workers: this venv
        })
        return env

    def _spawn(self, kind: str, args: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            return subprocess.Popen([str(self.home / "bin" / "spark-class"), *args], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)  # its own process group: stop() reaches executors

    def start(self, timeout_s: float = 90.0, *, wait: bool = True) -> StandaloneCluster:
        """Start the master and the workers; return once every worker is ALIVE at the master.

        ``wait=False`` returns at once (the JVMs boot meanwhile); call :meth:`wait_alive` before use.
        """
        env = self.env()
        try:
            port, ui = free_port(), free_port()
            log_path = self.root / "logs" / "master.log"
            proc = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                          "--port", str(port), "--webui-port", str(ui)], log_path, env)
            self.master = Daemon("master", proc, f"http://127.0.0.1:{ui}", log_path)
            self.master_url = f"spark://127.0.0.1:{port}"
            for i in range(self.n_workers):
                work_dir = self.root / f"worker-{i}"
                work_dir.mkdir(parents=True, exist_ok=True)
                wui = free_port()
                log_path = self.root / "logs" / f"worker-{i}.log"
                proc = self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.master_url,
                                              "--host", "127.0.0.1", "--cores", str(self.cores),
                                              "--memory", self.memory, "--webui-port", str(wui),
                                              "--work-dir", str(work_dir)],
                                   log_path, {**env, "SPARK_WORKER_DIR": str(work_dir)})
                self.workers.append(Daemon("worker", proc, f"http://127.0.0.1:{wui}", log_path, work_dir))
            if wait:
                self.wait_alive(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_alive(self, timeout_s: float = 90.0) -> StandaloneCluster:
        """Wait until every worker is ALIVE at the master (the master's ``/json``) and knows its master."""
        try:
            self._wait_alive(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_alive(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s * SLOWNESS
        last: Any = None
        while time.monotonic() < deadline:
            for daemon in [self.master, *self.workers]:
                assert daemon is not None
                if daemon.proc.poll() is not None:
                    raise RuntimeError(f"the Spark {daemon.kind} exited with {daemon.proc.returncode}:\n"
                                       f"{daemon.log()[-4000:]}")
            try:
                last = self.master_json()
            except (OSError, ValueError):  # not listening yet, or not yet logged where it listens
                last = None
            if last is not None:
                alive = [w for w in last.get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= self.n_workers and all(self._worker_registered(w) for w in self.workers):
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the workers did not register with {self.master_url} in {timeout_s} s; master says "
                           f"{last!r}\nmaster log:\n{self.master.log()[-3000:] if self.master else ''}")

    @staticmethod
    def _worker_registered(worker: Daemon) -> bool:
        try:
            return bool(worker.json().get("masterurl"))
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master; every process group this started."""
        for daemon in reversed(self.workers):
            daemon.stop()
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what applications use -------------------------------------------------------
    def app_conf(self, **overrides: str) -> dict[str, str]:
        """Spark settings of a small application on this cluster: one 1-core 512m executor per worker."""
        conf = {
            "spark.master": self.master_url,
            "spark.executor.memory": "512m",
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.n_workers),
            "spark.driver.memory": "1g",
            # Executors that live a few minutes: C2 compiling took half their CPU, more than C1's code loses.
            "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
            "spark.sql.shuffle.partitions": "2",
            # Jobs start only once every executor registered (else the first batch may run on one).
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
            "spark.ui.port": str(free_port()),    # the driver's REST API: which executor ran what
        }
        conf.update(overrides)
        return conf

    def master_json(self) -> Any:
        """The master's status (``workers``, ``aliveworkers``, ``activeapps``, ``completedapps``)."""
        assert self.master is not None
        return self.master.json()

    def executors_of(self, app_id: str) -> list[tuple[int, str]]:
        """``(worker index, executor id)`` of every executor a worker runs (or ran) for ``app_id``."""
        out = []
        for i, worker in enumerate(self.workers):
            status = worker.json()
            for ex in status.get("executors", []) + status.get("finishedexecutors", []):
                if ex.get("appid") == app_id:
                    out.append((i, str(ex.get("id"))))
        return out

    def executor_logs(self, app_id: str) -> dict[tuple[int, str], str]:
        """``(worker index, executor id)`` -> the executor's stderr, from the worker's dir ``<app_id>/<id>/``."""
        out = {}
        for i, worker in enumerate(self.workers):
            assert worker.work_dir is not None
            for stderr in sorted((worker.work_dir / app_id).glob("*/stderr")):
                out[(i, stderr.parent.name)] = stderr.read_text(errors="replace")
        return out

    def executor_pids(self, app_id: str) -> dict[int, list[int]]:
        """Worker index -> pids of the live executor JVMs of ``app_id`` whose parent is that worker's JVM."""
        parents = {w.proc.pid: i for i, w in enumerate(self.workers)}
        out: dict[int, list[int]] = {i: [] for i in range(len(self.workers))}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" not in cmd or app_id.encode() not in cmd:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid in parents:
                out[parents[ppid]].append(int(entry.name))
        return out

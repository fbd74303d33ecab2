"""Real service processes for integration tests: name servers, brokers, gateways, clients.

Every service is started with ``--host 127.0.0.1 --port 0`` and prints one ready line
``<kind> listening on http://127.0.0.1:PORT``; the harness reads the real URL from it.
Children that print no ready line (consumer processes, ``sparkmq lake``) are started with
:meth:`ProcessHarness.spawn`.  The ``procs`` fixture (conftest; ``module_procs`` for a module's
shared services) stops everything it started, by pid, and :meth:`ServiceProcess.kill9` is the
crash tests' SIGKILL.  A test using either fixture is marked ``cluster`` (conftest does it).

:func:`wait_until` is the suite's one polling helper: every wait waits for a condition,
with a deadline.
"""
from __future__ import annotations

import base64
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import sparkmq

__all__ = ["BROKER", "NAMESRV", "ProcessHarness", "ServiceProcess", "child_env", "jvm_child_env", "fast_client_config",
           "route_has", "wait_until"]

#: The modules of the services (``python -m MODULE``).
NAMESRV = "sparkmq.api.namesrv_main"
BROKER = "sparkmq.api.broker_main"
#: The head of a test broker's ``[lake]`` table: its lake runs at the broker's own priority.  At the default
#: (SCHED_IDLE) a test's lake would wait until a parallel test leaves a core idle.
LAKE_TABLE = "[lake]\nnice = 0\n"
#: How much slower the machine runs today than the day the suite's waits were set (build.py test measures it with
#: python_echo): :func:`wait_until` bounds and pytest time limits (conftest.py) multiply by it.  Only bounds of
#: waits stretch; what a test asserts about timings compares figures measured in the same run.
SLOWNESS = max(1.0, float(os.environ.get("SPARKMQ_TEST_SLOWNESS") or 1.0))


#: Spark's interpreted expressions instead of generated code, in every Spark JVM of the tests (Spark's own suites
#: run both; the results are the same).  The tests' Delta commits are a few rows each, and generating the code of
#: the projections over Delta's log actions, again in every task, was a quarter of a session JVM's CPU samples
#: (JFR, one-row idempotent appends).  A B on one day: test_lake_maintenance.py 418 s of CPU, 353 s with it.
#: A test setting, as Spark documents it: users' lakes keep generated code.
TEST_SPARK_SQL_CONF = {"spark.sql.codegen.factoryMode": "NO_CODEGEN"}

#: The JVMs the tests start (services' Spark drivers, and those of child processes and notebook kernels) compile
#: with C1 only: they live a few minutes and process little, and C2's compiling was most of their CPU.
#: A B A B on one day: test_lake_broker.py 287 and 267 s of CPU by default, 206 and 200 s with this.
#: They also get :data:`TEST_SPARK_SQL_CONF`, as system properties (a SparkConf reads ``spark.*`` ones).
TEST_JAVA_OPTIONS = " ".join(["-XX:TieredStopAtLevel=1", *(f"-D{k}={v}" for k, v in TEST_SPARK_SQL_CONF.items())])

#: Settings every test service gets unless the test says otherwise: 8 MiB segments (a broker's
#: default 1 GiB segment is allocated up front; dozens of test brokers would write tens of GiB).
_TEST_DEFAULTS = {BROKER: ["--segment-size", str(8 << 20)]}


def child_env(**extra: str) -> dict[str, str]:
    """Environment for children: they import the same sparkmq as the tests (source tree first)."""
    root = str(Path(sparkmq.__file__).parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def jvm_child_env(**extra: str) -> dict[str, str]:
    """:func:`child_env` for a child that starts a short-lived JVM (a Spark driver): with
    :data:`TEST_JAVA_OPTIONS` in ``JDK_JAVA_OPTIONS``."""
    return child_env(JDK_JAVA_OPTIONS=TEST_JAVA_OPTIONS, **extra)


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once each of its threads is in the stopped state (``T`` in /proc)."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in "tT" for t in tasks)
        except (FileNotFoundError, ProcessLookupError):
            return True  # gone: nothing of it runs
    wait_until(stopped, timeout, f"process {pid} stopped")


@dataclass
class ServiceProcess:
    """A running service: its process, base URL (``http://127.0.0.1:PORT``) and log file."""

    kind: str
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def addr(self) -> str:
        """``host:port`` (what name servers and brokers exchange)."""
        return self.url.removeprefix("http://")

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.addr.rsplit(":", 1)[1])

    def kill9(self) -> None:
        """SIGKILL, then reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP, and wait until every thread is stopped (under load a process may run a while after the kill)."""
        freeze(self.proc.pid)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def log(self) -> str:
        """What the process wrote to stderr so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class ProcessHarness:
    """Starts services under ``work_dir`` and remembers them so the fixture can stop them.

    ``java_options``: given to every JVM its services start (``JDK_JAVA_OPTIONS``: a broker's lake, a driver);
    the tests' fixtures pass :data:`TEST_JAVA_OPTIONS`, benchmarks nothing (their JVMs run as users' do).
    """

    def __init__(self, work_dir: Path, java_options: str = "") -> None:
        self.work_dir = work_dir
        self.java_options = java_options
        self.started: list[ServiceProcess] = []

    def start(self, kind: str, module: str, *args: str, ready_timeout: float = 60.0,
              env: dict[str, str] | None = None) -> ServiceProcess:
        """Run ``python -m module --host 127.0.0.1 --port 0 *args`` and wait for its ready line."""
        return self.start_many([(kind, module, list(args))], ready_timeout=ready_timeout, env=env)[0]

    def start_many(self, specs: list[tuple[str, str, list[str]]], ready_timeout: float = 60.0,
                   env: dict[str, str] | None = None) -> list[ServiceProcess]:
        """Start several services at once (they boot in parallel), then wait for each ready line."""
        pending = []
        for kind, module, args in specs:
            log_path = self.work_dir / f"{kind}-{len(self.started) + len(pending)}.log"
            defaults = _TEST_DEFAULTS.get(module, [])  # before args: argparse keeps the last value given
            argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *defaults, *args]
            child = dict(env or child_env())
            if self.java_options:
                child.setdefault("JDK_JAVA_OPTIONS", self.java_options)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log_path.open("w"), text=True,
                                    env=child, stdin=subprocess.DEVNULL)
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=lambda p=proc, q=lines: q.put(p.stdout.readline()), daemon=True).start()
            pending.append((kind, proc, lines, log_path, argv))
        services = []
        for kind, proc, lines, log_path, argv in pending:
            try:
                line = lines.get(timeout=ready_timeout * SLOWNESS)
            except queue.Empty:
                line = ""
            service_url = line.split(" on ", 1)[1].strip() if " listening on http://" in line else ""
            service = ServiceProcess(kind, proc, service_url, log_path, argv)
            self.started.append(service)
            if not service_url:
                raise AssertionError(f"{kind} printed no ready line ({line!r}); log:\n{service.log()[-4000:]}")
            # Keep draining stdout so a chatty child never blocks on a full pipe.
            threading.Thread(target=lambda p=proc: p.stdout.read(), daemon=True).start()
            services.append(service)
        return services

    def start_platform(self, data_dir: Path, *broker_args: str,
                       namesrv_args: tuple[str, ...] = ("--scan-interval-s", "0.5"),
                       ) -> tuple[ServiceProcess, ServiceProcess]:
        """A name server and one broker registered with it every 0.5 s (``broker_args`` added, later ones win)."""
        namesrv = self.start("namesrv", NAMESRV, *namesrv_args)
        broker = self.start("broker", BROKER, "--data-dir", str(data_dir), "--namesrv", namesrv.addr,
                            "--register-interval-s", "0.5", *broker_args)
        return namesrv, broker

    def spawn(self, kind: str, argv: list[str], *, log_path: Path | None = None, stdout: int | None = None,
              env: dict[str, str] | None = None) -> ServiceProcess:
        """Start a child that prints no ready line (a consumer process, a CLI job); stopped by pid with the rest.

        Its stderr, and its stdout unless ``stdout`` is given (``subprocess.PIPE`` to read it), go to ``log_path``
        (``<work_dir>/<kind>-<n>.log`` by default).
        """
        log_path = log_path or self.work_dir / f"{kind}-{len(self.started)}.log"
        with log_path.open("w") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, stdout=log if stdout is None else stdout, stderr=log, text=True,
                                    env=env or child_env(), stdin=subprocess.DEVNULL)
        service = ServiceProcess(kind, proc, "", log_path, list(argv))
        self.started.append(service)
        return service

    def stop_all(self) -> None:
        """Stop every process this harness started (newest first), each by its pid."""
        for service in reversed(self.started):
            service.stop()


@dataclass
class HttpsService:
    """A service started serving TLS: its process, HTTPS address, and the other endpoints it printed."""

    proc: ServiceProcess
    addr: str
    remoting: str | None = None
    grpc: str | None = None

    @property
    def url(self) -> str:
        return f"https://{self.addr}"


def start_https(procs: ProcessHarness, kind: str, module: str, *args: str, want: tuple[str, ...] = ()) -> HttpsService:
    """Start ``module`` on a free port; wait for its ``listening on https://`` line and the ``want`` lines."""
    argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args]
    proc = procs.spawn(kind, argv, stdout=subprocess.PIPE)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for text in proc.proc.stdout:  # type: ignore[union-attr]
            lines.put(text)
        lines.put("")
    threading.Thread(target=pump, daemon=True).start()
    found: dict[str, str] = {}
    while "https" not in found or any(w not in found for w in want):
        try:
            text = lines.get(timeout=60)
        except queue.Empty:
            text = ""
        if not text:
            raise AssertionError(f"{kind} did not start ({found}); log:\n{proc.log()[-4000:]}")
        if " listening on https://" in text:
            found["https"] = text.split("https://", 1)[1].strip()
        for key in want:
            if text.startswith(f"broker {key} on "):
                found[key] = text.split(" on ", 1)[1].strip()
    return HttpsService(proc, found["https"], found.get("remoting"), found.get("grpc"))


#: :func:`wait_until` pauses at least this many times the CPU a predicate call cost before the next call ...
POLL_PAUSE_PER_CALL = 2.0
#: ... but not longer than this for that reason (a longer ``interval`` still holds).
MAX_COST_PAUSE_S = 1.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> float:
    """CPU used so far by this process (every thread: delta-rs reads on threads of its own) and by the JVM of its
    Spark session, if it has one (a child process PySpark started: its queries run there)."""
    spent = time.process_time()
    if "pyspark" in sys.modules:
        from pyspark import SparkContext

        jvm = getattr(SparkContext._gateway, "proc", None)
        if jvm is not None:
            try:
                fields = Path(f"/proc/{jvm.pid}/stat").read_text().rsplit(")", 1)[1].split()
                spent += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS   # utime + stime
            except (OSError, IndexError, ValueError):
                pass    # the JVM has exited
    return spent


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str | Callable[[], str] = "condition",
               interval: float = 0.05) -> Any:
    """Poll ``predicate`` every ``interval`` s until it returns something truthy, and return that.

    A predicate that costs CPU (reading Delta tables with delta-rs, a query of this process's Spark session) is
    polled less often: the pause after a call is at least :data:`POLL_PAUSE_PER_CALL` times the CPU this process
    and its Spark driver spent meanwhile (up to :data:`MAX_COST_PAUSE_S`), so polling takes at most about a third
    of the CPU and the processes it waits for keep the cores.  A call that only waits (a request, a long poll)
    costs little and keeps ``interval``.
    After ``timeout`` s (times :data:`SLOWNESS`) an AssertionError names ``what`` (a string, or a callable giving
    one: logs, partial results) and the last value the predicate returned.  The suite's one polling helper.
    """
    timeout *= SLOWNESS
    deadline = time.monotonic() + timeout
    while True:
        cpu_before = _cpu_seconds()
        value = predicate()
        if value:
            return value
        cost = _cpu_seconds() - cpu_before
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {said}; last value: {value!r:.500}")
        time.sleep(max(interval, min(POLL_PAUSE_PER_CALL * cost, MAX_COST_PAUSE_S)))


def route_read_queues(admin: Any, topic: str) -> list[Any]:
    """The read queues the name server's route of ``topic`` lists, or none while no broker has registered it yet
    (a broker registers a new topic on its next heartbeat, so right after creating it the route is TOPIC_NOT_EXIST;
    CI saw that under load)."""
    from sparkmq.platform.common.errors import ErrorCode, SparkMQError

    try:
        return list(admin.topic_route(topic).read_queues)
    except SparkMQError as exc:
        if exc.code is ErrorCode.TOPIC_NOT_EXIST:
            return []
        raise


def broker_restart_ports(port: int) -> tuple[str, ...]:
    """Broker flags to start again on its old ``port`` (HTTP and remoting) with no HA port: the port beside it
    (HTTP + 1, the default) was never reserved, and after the first broker let go of it another socket may hold
    it (CI saw ``address already in use`` on HTTP + 1)."""
    return ("--port", str(port), "--ha-port", "-1")


def fast_client_config(namesrv_addrs: str, offset_dir: Path, **overrides: Any) -> Any:
    """A ClientConfig with sub-second intervals for tests against real processes (``overrides`` win)."""
    from sparkmq.platform.client import ClientConfig

    settings: dict[str, Any] = dict(
        namesrv_addrs=namesrv_addrs, heartbeat_interval_s=0.3, rebalance_interval_s=0.5,
        offset_commit_interval_s=0.2, route_refresh_interval_s=0.5, long_poll_wait_ms=1000, change_wait_ms=2000,
        reconsume_delay_s=0.2, pull_error_backoff_s=0.2, offset_store_dir=offset_dir)
    settings.update(overrides)
    return ClientConfig(**settings)


def route_has(admin: Any, topic: str, queues: int) -> bool:
    """Whether the name servers already route ``topic`` with ``queues`` read queues."""
    from sparkmq.platform.common.errors import SparkMQError

    try:
        return len(admin.topic_route(topic).read_queues) == queues
    except SparkMQError:
        return False


def write_conf(path: Path, data_dir: Path, **broker: Any) -> Path:
    """A broker config file: ``[broker]`` settings the CLI has no flag for."""
    lines = ["[broker]", f'data_dir = "{data_dir}"']
    for key, value in broker.items():
        lines.append(f"{key} = {value!r}" if not isinstance(value, bool) else f"{key} = {str(value).lower()}")
    path.write_text("\n".join(lines) + "\n")
    return path


def url_of(broker: ServiceProcess | str) -> str:
    """A broker's base URL (a process, or an ``http://`` URL already)."""
    return broker if isinstance(broker, str) else broker.url


def read_all(broker: ServiceProcess | str, topic: str, queues: int = 4) -> dict[str, bytes]:
    """Every message of ``topic`` on ``broker``: msg_id -> body."""
    found: dict[str, bytes] = {}
    with httpx.Client(base_url=url_of(broker), timeout=10) as http:
        for queue_id in range(queues):
            offset = 0
            while True:
                answer = http.get(f"/topics/{topic}/queues/{queue_id}/messages",
                                  params={"offset": offset, "max": 1024}).json()
                if "messages" not in answer:
                    break  # the topic is not (yet) on this broker
                for m in answer["messages"]:
                    found[m["msg_id"]] = base64.b64decode(m["body"])
                if answer["next_offset"] == offset or not answer["messages"]:
                    break
                offset = answer["next_offset"]
    return found

"""RocketMQ's own Java clients, driven from Python: compile the drivers, run them, read their JSON lines.

The drivers (``tests/java/``; ``sparkmq.jclient.Driver``) are RocketMQ 5.5.0's remoting clients run from the
command line; each event is one JSON line on stdout (``started``, ``sent``, ``received``, ``check``,
``assignment``, ``committed``, ``error``, ``stopping``, ``exit``; see the Java sources).  They are compiled
once with ``javac`` into the jar cache, in a folder named by a digest of the sources and the classpath, and
reused until a source changes.

    >>> program = DRIVERS                                              # doctest: +SKIP
    >>> client = JavaClient.start(program, "push", "--namesrv", ns, "--group", "g", "--topic", "T",
    ...                           work_dir=tmp_path)
    >>> client.wait_for(lambda e: e["event"] == "received")
    >>> client.stop()                                                  # closes stdin: the driver shuts down
    >>> result = run_driver("produce", "--namesrv", ns, "--topic", "T", "--count", "10", work_dir=tmp_path)
    >>> [e["msgId"] for e in result.events_of("sent")]
    >>> mqadmin(ns, "topicList", work_dir=tmp_path).stdout

Standard library and ``sparkmq.platform.common.jars`` only: the benchmarks import this module too.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procs import SLOWNESS
from sparkmq.platform.common import jars

__all__ = ["DRIVERS", "JAVA_DIR", "LOGBACK_FILE", "DriverResult", "JavaClient", "JavaProgram", "java_command",
           "mqadmin", "run_driver"]

#: The test drivers' sources.
JAVA_DIR = Path(__file__).resolve().parent / "java"
#: The logback configuration every RocketMQ JVM here gets: one file per process (``-Dsparkmq.log.file``).
LOGBACK_FILE = JAVA_DIR / "logback-file.xml"
#: Where compiled classes are cached (beside the jar sets).
_CLASSES = "classes"


@dataclass(frozen=True)
class JavaProgram:
    """Java sources (folders or files) compiled together against the jar sets they need."""

    name: str
    sources: tuple[Path, ...]
    jar_sets: tuple[str, ...]

    def source_files(self) -> list[Path]:
        """Every ``.java`` file of the program, sorted."""
        files: list[Path] = []
        for src in self.sources:
            files.extend(sorted(src.rglob("*.java")) if src.is_dir() else [src])
        return sorted(set(files))

    def jar_classpath(self) -> str:
        """The jars of its sets (:class:`jars.MissingJarsError` when a set is not fetched)."""
        return jars.classpath(list(self.jar_sets))

    def digest(self) -> str:
        """A digest of the sources (names and contents), the classpath and the compiler."""
        h = hashlib.sha256()
        for path in self.source_files():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        h.update(self.jar_classpath().encode())
        javac = shutil.which("javac") or ""
        h.update(os.path.realpath(javac).encode())
        return h.hexdigest()[:12]

    def classes_dir(self) -> Path:
        """The compiled classes: compiled now unless the cache holds this digest's folder."""
        target = jars.cache_root() / _CLASSES / f"{self.name}-{self.digest()}"
        if (target / ".complete").exists():
            return target
        javac = shutil.which("javac")
        if javac is None:
            raise RuntimeError("javac is not on PATH: a JDK 17+ is needed to compile the Java drivers")
        staging = target.with_name(f"{target.name}.tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        cmd = [javac, "-nowarn", "-encoding", "UTF-8", "--release", "17", "-d", str(staging),
               "-cp", self.jar_classpath(), *map(str, self.source_files())]
        result = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"javac failed for {self.name}:\n{result.stdout}{result.stderr}")
        (staging / ".complete").write_text("\n".join(p.name for p in self.source_files()) + "\n")
        try:
            staging.rename(target)
        except OSError:  # another process compiled the same digest first
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def classpath(self) -> str:
        """Its classes, then its jars."""
        return os.pathsep.join([str(self.classes_dir()), self.jar_classpath()])


#: The test drivers: RocketMQ's remoting clients (rocketmq-client 5.5.0) with the ACL hook and mqadmin's jars.
DRIVERS = JavaProgram("jclient", (JAVA_DIR,), ("rocketmq-client",))


def java_command(classpath: str, main: str, args: Sequence[str], *, heap: str = "384m", log_file: Path | None = None,
                 log_level: str = "INFO", sysprops: dict[str, str] | None = None, jvm_args: Sequence[str] = (),
                 fast_start: bool = True) -> list[str]:
    """``java`` with a small heap, RocketMQ's logging sent to ``log_file`` (or discarded) and ``main args``.

    ``fast_start`` (tests, mqadmin) uses the serial collector and the C1 compiler only: a short-lived client
    starts in less CPU.  Benchmarks pass False (G1 and the full JIT, as a real application runs)."""
    props = {"rmq.logback.configurationFile": str(LOGBACK_FILE),
             "sparkmq.log.file": str(log_file) if log_file else os.devnull,
             "sparkmq.log.level": log_level,
             # the clients' own fallbacks (their log root, the rocksdb LOG) stay beside the log, not in ~/logs
             "rocketmq.log.root": str(log_file.parent) if log_file else os.devnull,
             **(sysprops or {})}
    fast = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"] if fast_start else []
    return ["java", f"-Xmx{heap}", *fast, *jvm_args,
            *(f"-D{k}={v}" for k, v in props.items()), "-cp", classpath, main, *args]


@dataclass
class DriverResult:
    """A finished driver: its events (parsed JSON lines), exit code, and the tail of its stderr."""

    events: list[dict[str, Any]]
    returncode: int
    stderr: str

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind, in order."""
        return [e for e in self.events if e.get("event") == kind]

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The ``error`` and ``usage_error`` events."""
        return [e for e in self.events if e.get("event") in ("error", "usage_error")]


@dataclass
class JavaClient:
    """A running driver process: its events arrive on a reader thread; stopped by pid."""

    proc: subprocess.Popen[str]
    log_path: Path
    argv: list[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stdout_done: bool = False

    @classmethod
    def start(cls, program: JavaProgram | None, mode: str, *args: str, work_dir: Path, heap: str = "384m",
              main: str = "sparkmq.jclient.Driver", name: str | None = None,
              sysprops: dict[str, str] | None = None, stdin_stop: bool = True) -> JavaClient:
        """Start ``main mode args``; its logs go to work_dir.

        With ``stdin_stop`` the driver also stops when its stdin closes (:meth:`stop` closes it): a consumer, or a
        producer that must stay online (transaction check-backs), runs until then."""
        program = program or DRIVERS
        work_dir.mkdir(parents=True, exist_ok=True)
        stem = name or f"java-{mode}-{time.monotonic_ns()}"
        log_path = work_dir / f"{stem}.log"
        argv = java_command(program.classpath(), main, [mode, *args, *(["--stdin-stop"] if stdin_stop else [])],
                            heap=heap,
                            log_file=work_dir / f"{stem}.rocketmq.log", sysprops=sysprops)
        with log_path.open("w") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                    bufsize=1)
        client = cls(proc, log_path, argv)
        threading.Thread(target=client._pump, name=f"{stem}-stdout", daemon=True).start()
        return client

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "unparsed", "line": line}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._stdout_done = True
            self._cond.notify_all()

    def snapshot(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The events so far (of one kind)."""
        with self._cond:
            return [e for e in self.events if kind is None or e.get("event") == kind]

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float = 60.0,
                 what: str = "events") -> Any:
        """Wait until ``predicate(events)`` is truthy and return its value; AssertionError (with the stderr tail)
        after ``timeout`` s (times the day's :data:`procs.SLOWNESS`) or when the process ended first."""
        timeout *= SLOWNESS
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self.events)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0 or self._stdout_done:
                    raise AssertionError(f"java {self.argv[-1:]}: {what} not seen after {timeout} s "
                                         f"(exit {self.proc.poll()}); last events {self.events[-5:]}; "
                                         f"stderr: {self.stderr_tail()}")
                self._cond.wait(min(left, 1.0))

    def wait_count(self, kind: str, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until ``n`` events of ``kind`` arrived; returns them."""
        return self.wait_for(lambda evs: (lambda got: got if len(got) >= n else None)(
            [e for e in evs if e.get("event") == kind]), timeout, f"{n} {kind} events")

    def stop(self, timeout: float = 30.0) -> DriverResult:
        """Close stdin (a driver started with ``stdin_stop`` shuts its client down and exits) and wait; then
        SIGTERM, and SIGKILL after another ``timeout``."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.result()

    def kill9(self) -> None:
        """SIGKILL by pid, then reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def result(self, timeout: float = 10.0) -> DriverResult:
        """The finished driver's result (waits for its stdout to end)."""
        self.proc.wait(timeout)
        with self._cond:
            self._cond.wait_for(lambda: self._stdout_done, timeout)
            events = list(self.events)
        return DriverResult(events, self.proc.returncode, self.stderr_tail())

    def stderr_tail(self, chars: int = 3000) -> str:
        """The last ``chars`` of its stderr."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def run_driver(mode: str, *args: str, work_dir: Path, timeout: float = 120.0, program: JavaProgram | None = None,
               heap: str = "384m", sysprops: dict[str, str] | None = None) -> DriverResult:
    """Run a driver to its end (a producer, a consumer with ``--count``/``--duration-s``) and return its result;
    after ``timeout`` s it is stopped (SIGTERM, then SIGKILL)."""
    client = JavaClient.start(program, mode, *args, work_dir=work_dir, heap=heap, sysprops=sysprops,
                              stdin_stop=False)
    try:
        client.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return client.stop()
    return client.result()


def mqadmin(namesrv: str, command: str, *args: str, work_dir: Path, timeout: float = 120.0,
            extra_sets: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``mqadmin command -n namesrv args`` (``org.apache.rocketmq.tools.command.MQAdminStartup`` of
    rocketmq-tools 5.5.0) and return it finished, stdout and stderr captured as text."""
    work_dir.mkdir(parents=True, exist_ok=True)
    classpath = jars.classpath(["rocketmq-client", *extra_sets])
    argv = java_command(classpath, "org.apache.rocketmq.tools.command.MQAdminStartup",
                        [command, "-n", namesrv, *args], heap="256m",
                        log_file=work_dir / f"mqadmin-{command}.rocketmq.log")
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

"""The process's one SparkSession, configured the way the lake needs it.

Brokers (lake enabled), ``sparkmq lake``, ``sparkmq sql``, notebooks, benchmarks and tests all get
their session here, so every one runs with the same settings: Delta Lake (:data:`DELTA_CONF`: the
delta-spark jars in ``spark.jars``, shipped to the executors, with Delta's SQL extension and catalog),
Parquet timestamps as microseconds (what delta-rs, the broker's reader, expects), UTC session time
zone (lake timestamps are UTC instants), Arrow transfers, few shuffle partitions on a local master,
the venv's Python on the workers, quiet logs.  With ``lake_root`` the lake's tables are registered
under the database ``sparkmq`` (:func:`.tables.register_tables`), so ``spark.table("sparkmq.messages")``
works.  A machine without the jars gets :class:`~sparkmq.platform.common.jars.MissingJarsError` (one
message saying how to provide them) before any JVM starts.

``local[*]`` by default; ``spark.master`` in ``conf`` selects a cluster and
``spark.remote`` (``sc://host:15002``) Spark Connect.  Spark Connect needs PySpark's
connect extras (grpcio, grpcio-status, googleapis-common-protos, zstandard), which this
environment does not have.

A Spark Connect session gets the runtime settings only: the Connect server must run with Delta itself
(the lines a user adds to their own session are in ``docs/lake.md``).

A cluster master (``spark://host:7077``, standalone) keeps Spark's defaults except: on a
master at a loopback address (``spark://127.0.0.1:7077``, ``localhost``) the driver binds to
127.0.0.1 too, like a local master, so the executors reach it whatever the hostname resolves
to.  The executors' Python workers run the interpreter named by ``PYSPARK_PYTHON`` (this
one by default; ``spark.pyspark.python`` in ``conf`` names another, e.g. the venv's path on
the worker machines), which must import sparkmq and pyarrow; the Delta jars reach the executors
through ``spark.jars`` (the driver serves them); the lake root and
checkpoints must be paths every executor and the driver see alike (one machine, or a shared
file system).  The local-only settings (few shuffle partitions, no UI, Hadoop
FileSystem checkpoints) are not applied; the class-data archive only concerns the driver's JVM.

Example::

    from sparkmq.pipelines.session import get_spark
    spark = get_spark({"spark.master": "local[2]"})
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_APP_NAME", "DELTA_CATALOG", "DELTA_EXTENSION", "IDLE", "delta_conf", "get_spark",
           "lower_priority", "stop_spark"]

log = logging.getLogger(__name__)

DEFAULT_APP_NAME = "sparkmq"

#: Delta's SQL extension and catalog: static settings, so they are given before the session starts.
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: The jar set of ``conf/jars.toml`` every session loads (fetched by ``build.py setup``).
_DELTA_JARS = "delta"

#: Runtime SQL settings, applied to local, cluster and Connect sessions alike.
_SQL_DEFAULTS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark writes INT96 timestamps by default, which delta-rs (the broker's reader) reads as nanoseconds.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}

#: Delta settings for a local master: tables here are small per commit, and every Spark job costs a
#: task per partition (Delta's default of 50 state partitions made a 10-row append take 1 s on 2 cores).
_LOCAL_DELTA_DEFAULTS: dict[str, str] = {
    "spark.databricks.delta.snapshotPartitions": "2",
}

#: Settings for a classic (non-Connect) driver.
_CLASSIC_DEFAULTS: dict[str, str] = {
    "spark.ui.showConsoleProgress": "false",   # progress bars garble broker logs
    # CREATE DATABASE sparkmq makes a directory in the warehouse, by default ./spark-warehouse wherever the
    # process runs; the lake's tables are external (their data stays under the lake root) and the
    # in-memory catalog forgets the database with the JVM, so a temporary directory serves.
    "spark.sql.warehouse.dir": os.path.join(tempfile.gettempdir(), "sparkmq-spark", "warehouse"),
}

#: Settings for a local master: one machine, small data per micro-batch.
_LOCAL_DEFAULTS: dict[str, str] = {
    # 200 shuffle partitions means 200 tasks for a GROUP BY over a few rows.
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",               # no port 4040 race between brokers and tests
    # Loopback: sandboxes and laptops often have hostnames that do not resolve.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # Streaming checkpoints through Hadoop's FileSystem API: the default FileContext manager asks a
    # forked `readlink` process about every file it renames (the local file system without Hadoop's
    # native library), two per micro-batch -- 70 ms of a trigger's 115 ms on this machine.  Rename
    # stays atomic on a local disk.
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}

#: Settings for a cluster master on this machine's loopback (``spark://127.0.0.1:7077``): executors
#: connect back to the driver, which must then listen on loopback too (see the local defaults).
_LOOPBACK_CLUSTER_DEFAULTS: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _on_loopback(master: str) -> bool:
    """Whether every master of a ``spark://`` URL (``spark://h1:7077,h2:7077``) is a loopback address."""
    if not master.startswith("spark://"):
        return False
    hosts = [addr.rsplit(":", 1)[0] for addr in master.removeprefix("spark://").split(",") if addr]
    return bool(hosts) and all(h.lower() in _LOOPBACK_HOSTS for h in hosts)


#: log4j2 settings that silence Spark's start-up chatter (its default profile logs at INFO
#: until setLogLevel runs, which is only after the JVM is up).
_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.hadoop_native.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop_native.level = error
"""

_lock = threading.Lock()
_session: SparkSession | None = None


def _alive(session: SparkSession) -> bool:
    if getattr(session, "is_stopped", False):         # Spark Connect
        return False
    sc = getattr(session, "_sc", None)                 # classic: the JVM context is gone once stopped
    return sc is None or getattr(sc, "_jsc", None) is not None


def _log4j_file(level: str) -> str:
    directory = os.path.join(tempfile.gettempdir(), "sparkmq-spark")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"log4j2-{level.lower()}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(_LOG4J2.format(level=level.lower()))
        os.replace(tmp, path)  # atomic: concurrent processes never see half a file
    return path


def get_spark(conf: Mapping[str, Any] | None = None, app_name: str = DEFAULT_APP_NAME, *,
              log_level: str = "WARN", class_archive: bool = True,
              lake_root: str | os.PathLike[str] | None = None) -> SparkSession:
    """The process's SparkSession, created on the first call with ``conf`` (a mapping of Spark settings).

    Later calls return the same session and ignore ``conf``/``app_name`` (Spark cannot
    change a running driver's static settings); after :func:`stop_spark` the next call
    creates a new one.  ``conf`` overrides every default.  Sets ``PYSPARK_PYTHON`` and
    ``PYSPARK_DRIVER_PYTHON`` to this interpreter when they are unset, so Python workers
    import the same packages (pyarrow, sparkmq).  A classic driver maps this environment's
    class-data archive when it has one (:mod:`.class_archive`; ``class_archive=False`` does not);
    ``spark.driver.extraJavaOptions`` in ``conf`` is added to the options set here.
    ``spark.pyspark.python`` in ``conf`` sets ``PYSPARK_PYTHON`` (the executors' Python) first.
    ``lake_root``: register that lake's tables under the database ``sparkmq`` (on every call, so a
    later call with another root re-points the names).  A classic session always has Delta Lake
    (:func:`delta_conf`); :class:`~sparkmq.platform.common.jars.MissingJarsError` when its jars are missing.

    >>> spark = get_spark({"spark.master": "local[2]"})          # doctest: +SKIP
    >>> spark.conf.get("spark.sql.session.timeZone")              # doctest: +SKIP
    'UTC'
    """
    level = log_level.upper()
    if level not in {"ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"}:
        raise ValueError(f"log_level must be a log4j level such as WARN or ERROR, got {log_level!r}")
    with _lock:
        session = _session if _session is not None and _alive(_session) else _start(conf, app_name, level,
                                                                                     class_archive)
    if lake_root is not None:
        from .tables import register_tables

        register_tables(session, lake_root)
    return session


def _start(conf: Mapping[str, Any] | None, app_name: str, level: str, class_archive: bool) -> SparkSession:
    """Start the process's session (the caller holds ``_lock``)."""
    global _session
    settings = {str(k): str(v) for k, v in (conf or {}).items()}
    if settings.get("spark.pyspark.python"):   # PySpark reads the executors' Python from the environment
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    remote = settings.pop("spark.remote", None)
    if remote:
        builder = builder.remote(remote)
        defaults = dict(_SQL_DEFAULTS)
    else:
        master = settings.pop("spark.master", "local[*]")
        builder = builder.master(master)
        defaults = {**_SQL_DEFAULTS, **_CLASSIC_DEFAULTS,
                    **(_LOCAL_DEFAULTS if master.startswith("local") else {}),
                    **(_LOOPBACK_CLUSTER_DEFAULTS if _on_loopback(master) else {})}
        settings["spark.driver.extraJavaOptions"] = _driver_java_options(
            level, class_archive, settings.get("spark.driver.extraJavaOptions", ""))
        settings = {**settings, **delta_conf(settings)}  # MissingJarsError here, before a JVM starts
        if master.startswith("local"):
            defaults.update(_LOCAL_DELTA_DEFAULTS)
    for key, value in {**defaults, **settings}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not remote:
        session.sparkContext.setLogLevel(level)
    log.info("started SparkSession %r (%s)", app_name, remote or session.sparkContext.master)
    _session = session
    return session


def _merged(given: str | None, wanted: list[str]) -> str:
    """A comma list: ``given`` (the caller's entries first) plus those of ``wanted`` it lacks."""
    items = [i.strip() for i in (given or "").split(",") if i.strip()]
    return ",".join(items + [w for w in wanted if w not in items])


def delta_conf(settings: Mapping[str, str] | None = None) -> dict[str, str]:
    """The static settings that give a classic session Delta Lake, merged into ``settings``' own.

    ``spark.jars`` gets the jar set ``delta`` (:func:`sparkmq.platform.common.jars.jars`; the driver serves
    them to the executors of a cluster), ``spark.sql.extensions`` Delta's extension, and the session
    catalog becomes Delta's.  Raises :class:`~sparkmq.platform.common.jars.MissingJarsError` (what is
    missing, how to provide it) when the jars are not there.

    >>> delta_conf({"spark.jars": "/opt/my.jar"})["spark.jars"]          # doctest: +SKIP
    '/opt/my.jar,/root/.cache/sparkmq/jars/delta-fd459922d11e/delta-spark_4.2_2.13-4.4.0.jar,...'
    """
    from sparkmq.platform.common import jars

    given = dict(settings or {})
    paths = [str(p) for p in jars.jars(_DELTA_JARS)]
    return {"spark.jars": _merged(given.get("spark.jars"), paths),
            "spark.sql.extensions": _merged(given.get("spark.sql.extensions"), [DELTA_EXTENSION]),
            "spark.sql.catalog.spark_catalog": given.get("spark.sql.catalog.spark_catalog", DELTA_CATALOG)}


def _driver_java_options(level: str, class_archive: bool, given: str) -> str:
    """The driver JVM's options: quiet log4j, the class-data archive when there is one, then ``given``."""
    options = [f"-Dlog4j2.configurationFile=file:{_log4j_file(level)}"]
    if class_archive:
        from .class_archive import java_options

        options.append(java_options())
    options.append(given)
    return " ".join(o for o in options if o)


#: ``lower_priority``'s lowest setting: Linux's SCHED_IDLE scheduling class.
IDLE = "idle"


def lower_priority(session: SparkSession, nice: int | str) -> int:
    """Run the session's JVM (and the Python workers it starts later) at a lower CPU priority; return how
    many threads were changed.

    A broker's lake shares the machine with the broker: at a lower priority, Spark gets the
    CPU the broker leaves, so sends and pulls never queue behind a micro-batch (principle 1:
    delivery never waits for Spark).  ``nice`` is a niceness (1..19; 0 changes nothing) or
    :data:`IDLE`: the SCHED_IDLE class, whose threads run only on a core nothing else wants --
    the lake then falls behind while the broker keeps every core busy and catches up after
    (niceness 10 still takes about a tenth of a busy core).  Only a JVM this process launched
    (a local master) is changed; Linux priorities are per thread, so every current thread is
    set, and threads and worker processes the JVM starts later inherit it.  Without /proc (not
    Linux) nothing happens.
    """
    if nice != IDLE and (not isinstance(nice, int) or nice <= 0):
        return 0
    proc = getattr(getattr(session.sparkContext, "_gateway", None), "proc", None)
    if proc is None:
        return 0
    tasks = Path(f"/proc/{proc.pid}/task")
    if not tasks.is_dir():
        return 0
    changed = 0
    for tid in tasks.iterdir():
        try:
            if nice == IDLE:
                os.sched_setscheduler(int(tid.name), os.SCHED_IDLE, os.sched_param(0))
            else:
                os.setpriority(os.PRIO_PROCESS, int(tid.name), int(nice))
            changed += 1
        except OSError:  # the thread ended meanwhile
            continue
    log.info("Spark's JVM (pid %d) runs at %s (%d threads)", proc.pid,
             "SCHED_IDLE" if nice == IDLE else f"nice {nice}", changed)
    return changed


def stop_spark() -> None:
    """Stop the process's SparkSession if one is running (the next :func:`get_spark` starts a new one)."""
    global _session
    with _lock:
        session, _session = _session, None
        if session is not None and _alive(session):
            session.stop()

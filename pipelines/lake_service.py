"""A broker's lake: its SparkSession and streaming jobs under a supervisor.

A broker with the lake enabled (the embedded default) builds one :class:`LakeService`
over *itself* (``brokers={"broker-a": "127.0.0.1:10911"}``); ``sparkmq lake`` builds one
over a whole cluster (``namesrv="a:9876;b:9876"``) as a standalone Spark application.
The SparkSession starts on a background thread, so the broker serves messages at once
and the tables catch up when Spark is ready (delivery never waits for Spark).

Jobs: ``dispatch`` (commit log → ``messages``, ``consume_queue``, ``message_keys``), ``trace``
(→ ``message_trace``), ``dlq`` (→ ``dead_letters``), ``reports`` (→ ``topic_stats``, ``group_stats``,
``alerts``) and ``maintenance``; every table is written by delta-spark and registered in the session's
catalog as ``sparkmq.<table>``.  Checkpoints live under ``checkpoint_root/<job>``.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.common.validation import Positive, Seconds, check_fields

from .supervisor import JobSpec, Supervisor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["LakeService", "LakeSettings", "LAKE_JOBS"]

log = logging.getLogger("sparkmq.lake")

#: Jobs a lake service can run: the streaming ``dispatch``, ``trace`` and ``dlq`` queries, ``reports``
#: (per-minute stats and alerts) and ``maintenance`` (compaction, vacuum, checkpoints), both threads.
LAKE_JOBS = ("dispatch", "trace", "dlq", "reports", "maintenance")


def _dispatch_figures(query: StreamingQuery) -> dict[str, Any]:
    from .dispatch import dispatch_stats
    from .trace_job import trace_stats

    stats = dispatch_stats(query) or trace_stats(query)
    if stats is None:
        return {}
    last = stats.last
    return {"rows_total": stats.rows, "batches_total": stats.batches, "job_error": stats.last_error,
            "lag_ms_max": None if last is None else last.lag_ms_max,
            "lag_ms_p99": None if last is None else last.lag_ms_p99}


@dataclass(frozen=True)
class LakeSettings:
    """The ``[lake]`` table of a config file: whether a broker runs its lake, and how."""

    enabled: bool = False
    #: spark.master (None = local[*]); other Spark settings go in ``spark_conf``.
    spark_master: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    #: Micro-batch interval of the streaming jobs.
    trigger_interval_s: Seconds = 1.0
    #: Upper bound of one dispatch micro-batch (its tasks hold it in memory while they write).
    max_messages_per_trigger: Positive = 500_000
    #: CPU priority of Spark's JVM and Python workers on a local master: "idle" (Linux SCHED_IDLE: only
    #: the CPU the broker leaves idle) or a niceness 0..19 (0: the broker's own priority).
    nice: int | str = "idle"
    jobs: tuple[str, ...] = LAKE_JOBS
    #: The ``[alerts]`` table (webhook_url, [[alerts.rules]]); read from the top level of the file.
    alerts: Mapping[str, Any] = field(default_factory=dict)
    #: The user the jobs sign their reads with (both or neither; a broker with ACL on refuses unsigned reads).
    #: It needs ``Sub`` and ``Get`` on the topics the jobs read (every topic, ``RMQ_SYS_TRACE_TOPIC``, ``%DLQ%*``):
    #: a super user is simplest.
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, **overrides: Any) -> LakeSettings:
        """From a TOML table; ValueError names unknown keys."""
        data = {**dict(values or {}), **{k: v for k, v in overrides.items() if v is not None}}
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown [lake] settings {sorted(unknown)}; known: {sorted(known)}")
        if "jobs" in data:
            data["jobs"] = tuple(data["jobs"])
        settings = cls(**data)
        check_fields(settings)  # enabled, trigger_interval_s, max_messages_per_trigger
        nice = settings.nice
        if nice != "idle" and (isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19):
            raise ValueError(f'nice must be "idle" or an integer from 0 to 19, got {nice!r}')
        if (settings.access_key is None) != (settings.secret_key is None):
            raise ValueError("[lake] access_key and secret_key go together: set both or neither")
        _ = settings.credentials  # validates both now
        unknown_jobs = set(settings.jobs) - set(LAKE_JOBS)
        if unknown_jobs:
            raise ValueError(f"unknown lake jobs {sorted(unknown_jobs)}; known: {list(LAKE_JOBS)}")
        return settings

    @property
    def credentials(self) -> Credentials | None:
        """What the jobs sign their reads with (None: unsigned)."""
        if self.access_key is None or self.secret_key is None:
            return None
        return Credentials(self.access_key, self.secret_key)

    def spark_settings(self) -> dict[str, str]:
        """``spark_conf`` with ``spark.master`` when given."""
        conf = {k: str(v) for k, v in self.spark_conf.items()}
        if self.spark_master:
            conf["spark.master"] = self.spark_master
        return conf

    def service_for_broker(self, data_dir: str | os.PathLike[str], broker_name: str, addr: str) -> LakeService:
        """The lake service of one broker: its own tables under ``data_dir/lake``, reading itself."""
        root = Path(data_dir) / "lake"
        return LakeService(root, root / "_checkpoints", brokers={broker_name: addr},
                           spark_conf=self.spark_settings(), jobs=self.jobs,
                           trigger={"processingTime": f"{self.trigger_interval_s} seconds"}, job_name=broker_name,
                           alerts=self.alerts, nice=self.nice, max_messages_per_trigger=self.max_messages_per_trigger,
                           credentials=self.credentials)


class LakeService:
    """SparkSession + supervised streaming jobs for one broker or one cluster."""

    def __init__(self, lake_root: str | os.PathLike[str], checkpoint_root: str | os.PathLike[str], *,
                 namesrv: str | None = None, brokers: Mapping[str, str] | None = None,
                 spark_conf: Mapping[str, str] | None = None, jobs: tuple[str, ...] = LAKE_JOBS,
                 trigger: Mapping[str, Any] | None = None, job_name: str | None = None,
                 backoff_initial_s: float = 1.0, backoff_max_s: float = 60.0,
                 alerts: Mapping[str, Any] | None = None, report_interval_s: float = 60.0,
                 maintenance_interval_s: float = 3600.0, nice: int | str = 0,
                 max_messages_per_trigger: int | None = None, credentials: Credentials | None = None) -> None:
        """Exactly one of ``namesrv`` (a cluster) and ``brokers`` (name -> host:port) says what to read.

        ``nice``: run a local Spark at this priority (a niceness, or ``"idle"``:
        :func:`.session.lower_priority`), for a lake that shares its machine with a broker.
        ``max_messages_per_trigger``: the dispatch job's batch bound (None: its default).
        ``credentials``: what the jobs sign their reads with (brokers with ACL on).
        """
        if (namesrv is None) == (brokers is None):
            raise ValueError("give exactly one of namesrv and brokers")
        unknown = set(jobs) - set(LAKE_JOBS)
        if unknown:
            raise ValueError(f"unknown lake jobs {sorted(unknown)}; known: {list(LAKE_JOBS)}")
        self.lake_root = Path(lake_root)
        self.checkpoint_root = Path(checkpoint_root)
        self.endpoints: str | Mapping[str, str] = namesrv if namesrv is not None else dict(brokers or {})
        self.spark_conf = dict(spark_conf or {})
        self.job_names = jobs
        self.trigger = dict(trigger) if trigger else None
        self.job_name = job_name
        self._backoff = (backoff_initial_s, backoff_max_s)
        self.alerts = dict(alerts or {})
        self.report_interval_s = report_interval_s
        self.reporter: Any = None  # pipelines.reports.Reporter once started
        self.maintainer: Any = None  # pipelines.maintenance.Maintainer once started
        self.maintenance_interval_s = maintenance_interval_s
        self.nice = nice
        self.max_messages_per_trigger = max_messages_per_trigger
        self.credentials = credentials
        self._report_stop = threading.Event()
        self._report_thread: threading.Thread | None = None
        self.spark: SparkSession | None = None
        self.supervisor: Supervisor | None = None
        self._state = "created"
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def _jobs(self) -> list[JobSpec]:
        # Imported here: a broker without the lake never loads PySpark or the jobs.
        from .dispatch import start_dispatch
        from .dlq_job import start_dlq_job
        from .trace_job import start_trace_job

        assert self.spark is not None
        spark = self.spark
        specs = []
        limit: dict[str, Any] = {} if self.max_messages_per_trigger is None else {
            "max_messages_per_trigger": self.max_messages_per_trigger}
        if "dispatch" in self.job_names:
            specs.append(JobSpec(
                "dispatch",
                lambda: start_dispatch(spark, self.endpoints, self.lake_root, self.checkpoint_root / "dispatch",
                                       self.trigger, job_name=self.job_name, **limit,
                                       credentials=self.credentials),
                describe=_dispatch_figures))
        if "trace" in self.job_names:
            specs.append(JobSpec(
                "trace",
                lambda: start_trace_job(spark, self.endpoints, self.lake_root, self.checkpoint_root / "trace",
                                        self.trigger, job_name=self.job_name, credentials=self.credentials),
                describe=_dispatch_figures))
        if "dlq" in self.job_names:
            # Dead letters are rare: their own slower trigger (the job's default) is enough.
            specs.append(JobSpec(
                "dlq",
                lambda: start_dlq_job(spark, self.endpoints, self.lake_root, self.checkpoint_root / "dlq", None,
                                      job_name=self.job_name, credentials=self.credentials)))
        return specs

    # -- lifecycle --------------------------------------------------------------------
    def start(self, background: bool = True) -> LakeService:
        """Start Spark and the jobs (on a background thread unless ``background`` is False)."""
        with self._lock:
            self._state = "starting"
        if background:
            self._thread = threading.Thread(target=self._start, name="sparkmq-lake-start", daemon=True)
            self._thread.start()
        else:
            self._start()
        return self

    def _start(self) -> None:
        try:
            from .session import get_spark, lower_priority  # here: a broker without the lake never loads PySpark

            # The lake's tables are registered as sparkmq.<table> (the jobs add those they create).
            self.spark = spark = get_spark(self.spark_conf, lake_root=self.lake_root)
            lower_priority(spark, self.nice)
            if self._stopping.is_set():
                return
            supervisor = Supervisor(self._jobs(), backoff_initial_s=self._backoff[0], backoff_max_s=self._backoff[1])
            with self._lock:
                self.supervisor = supervisor
            supervisor.start()
            if "reports" in self.job_names:
                self._start_reports(spark)
            if "maintenance" in self.job_names:
                from .maintenance import Maintainer

                self.maintainer = Maintainer(spark, self.lake_root,
                                             interval_s=self.maintenance_interval_s).start()
            with self._lock:
                self._state = "running"
        except Exception as exc:  # the broker keeps serving; the lake reports why it is down
            log.exception("the lake did not start")
            with self._lock:
                self._state = "failed"
                self._error = f"{type(exc).__name__}: {exc}"

    def _start_reports(self, spark: SparkSession) -> None:
        # Not a streaming query: a thread reporting each closed minute (see pipelines.reports).
        from .reports import Reporter, offsets_source

        brokers = list(self.endpoints) if isinstance(self.endpoints, Mapping) else None
        offsets = offsets_source(self.endpoints, credentials=self.credentials)
        self.reporter = Reporter(self.lake_root, offsets, spark=spark,
                                 job=self.job_name or "cluster", brokers=brokers, alerts=self.alerts)
        self._report_thread = threading.Thread(target=self.reporter.loop,
                                               args=(self._report_stop, self.report_interval_s),
                                               name="sparkmq-lake-reports", daemon=True)
        self._report_thread.start()

    def wait_started(self, timeout_s: float = 120.0) -> bool:
        """Wait for the start thread; True when the jobs are running."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self._state == "running"

    def stop(self) -> None:
        """Stop the jobs cleanly (each finishes its batch in flight); the SparkSession stays for reuse."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(120)
        self._report_stop.set()
        if self._report_thread is not None:
            self._report_thread.join(60)
        if self.maintainer is not None:
            self.maintainer.stop()
        with self._lock:
            supervisor = self.supervisor
        if supervisor is not None:
            supervisor.stop()
        with self._lock:
            self._state = "stopped"

    # -- status -----------------------------------------------------------------------
    def healthy(self) -> bool:
        """Starting, or running with every job running (a job waiting to restart is not healthy)."""
        status = self.status()
        if status["state"] == "starting":
            return True
        return status["state"] == "running" and all(j["state"] == "running" for j in status["jobs"].values())

    def gauge_rows(self) -> Iterable[tuple[str, Mapping[str, float | None]]]:
        """Per job: up, restarts, last batch rows, dispatch lag (for the broker's /metrics)."""
        for name, job in self.status()["jobs"].items():
            yield name, {"up": 1.0 if job["state"] == "running" else 0.0, "restarts": job["restarts"],
                         "last_batch_rows": job.get("last_batch_rows"), "lag_ms_p99": job.get("lag_ms_p99"),
                         "rows_total": job.get("rows_total")}

    def status(self) -> dict[str, Any]:
        """``{"state", "error", "jobs": {name: JobStatus}}`` for /health, /metrics and the CLI."""
        with self._lock:
            state, error, supervisor = self._state, self._error, self.supervisor
        if supervisor is not None:
            jobs = supervisor.status()
        else:  # Spark still starting (or it failed): every configured job is listed all the same
            jobs = {name: {"name": name, "state": "starting" if state == "starting" else "stopped", "restarts": 0,
                           "last_error": error} for name in self.job_names if name not in ("reports", "maintenance")}
        if self.reporter is not None:
            report = self.reporter.status()
            alive = self._report_thread is not None and self._report_thread.is_alive()
            jobs["reports"] = {"name": "reports", "state": "running" if alive else "stopped", "restarts": 0,
                               "last_error": report.get("last_error"), **report}
        if self.maintainer is not None:
            jobs["maintenance"] = {"name": "maintenance", "restarts": 0, **self.maintainer.status()}
        return {"state": state, "error": error, "lake_root": str(self.lake_root), "jobs": jobs}

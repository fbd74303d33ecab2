"""``sparkmq lake`` (the lake jobs as a standalone Spark application) and ``sparkmq sql``.

Against brokers with ACL on, ``sparkmq lake`` signs its reads with ``--access-key`` / ``--secret-key`` (or
``SPARKMQ_ACCESS_KEY`` / ``SPARKMQ_SECRET_KEY``, as ``sparkmq admin``): a user with ``Sub`` and ``Get`` on every topic
(the broker's own lake takes ``[lake] access_key`` / ``secret_key``, the Spark source ``accessKey`` / ``secretKey``).
"""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import click
from rich.table import Table

from ...pipelines.lake_service import LAKE_JOBS
from .credentials import credential_options, credentials_of
from .output import console

__all__ = ["lake", "sql"]


@click.command()
@click.option("--namesrv", envvar="SPARKMQ_NAMESRV", default="127.0.0.1:9876", show_default=True,
              help="the cluster's name servers (env SPARKMQ_NAMESRV)")
@click.option("--lake-root", type=click.Path(path_type=Path), default=Path("var/lake"), show_default=True)
@click.option("--checkpoint-root", type=click.Path(path_type=Path), default=None,
              help="streaming checkpoints (default LAKE_ROOT/_checkpoints)")
@click.option("--spark-master", default=None, help="spark.master (default local[*])")
@click.option("--conf", "confs", multiple=True, help="extra Spark setting key=value (repeatable)")
@click.option("--job", "jobs", multiple=True, type=click.Choice(LAKE_JOBS),
              help="run only this job (repeatable; default: every job, as a broker's [lake] jobs)")
@click.option("--status-interval-s", type=float, default=30.0, show_default=True, help="print job status this often")
@credential_options
def lake(namesrv: str, lake_root: Path, checkpoint_root: Path | None, spark_master: str | None,
         confs: tuple[str, ...], jobs: tuple[str, ...], status_interval_s: float, access_key: str | None,
         secret_key: str | None) -> None:
    """Run the lake jobs for a whole cluster until Ctrl-C: one Spark application for many brokers.

    ``--job`` picks some of them, e.g. one application for ``dispatch`` and another for the rest, each
    on executors of its own."""
    from ...pipelines.lake_service import LakeService

    credentials = credentials_of(access_key, secret_key)
    spark_conf = dict(item.split("=", 1) for item in confs)
    if spark_master:
        spark_conf["spark.master"] = spark_master
    service = LakeService(lake_root, checkpoint_root or lake_root / "_checkpoints", namesrv=namesrv,
                          spark_conf=spark_conf, job_name="cluster", credentials=credentials,
                          jobs=tuple(dict.fromkeys(jobs)) or LAKE_JOBS)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    service.start(background=False)
    console.print(f"lake jobs running over {namesrv} into {lake_root}; Ctrl-C stops")
    try:
        next_report = time.monotonic()
        while not stop.wait(0.5):
            if time.monotonic() >= next_report:
                console.print(json.dumps(service.status(), default=str))
                next_report = time.monotonic() + status_interval_s
    finally:
        service.stop()


@click.command()
@click.argument("query")
@click.option("--lake-root", type=click.Path(path_type=Path), default=Path("var/dev/broker-a/lake"),
              show_default=True, help="where the tables are (a broker's data_dir/lake, or a lake job's root)")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines")
@click.option("--limit", type=int, default=100, show_default=True, help="rows to print")
def sql(query: str, lake_root: Path, as_json: bool, limit: int) -> None:
    """Run a Spark SQL QUERY over the lake's Delta tables (``sparkmq.<table>``; the short names work too)."""
    from ...pipelines.session import get_spark
    from ...pipelines.sql import run_sql

    spark = get_spark(log_level="ERROR")
    df = run_sql(spark, lake_root, query)
    rows = [r.asDict(recursive=True) for r in df.limit(limit).collect()]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, default=str))
        return
    table = Table(*df.columns)
    for row in rows:
        table.add_row(*("" if row[c] is None else str(row[c]) for c in df.columns))
    console.print(table)

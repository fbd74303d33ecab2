"""A class-data-sharing archive of Spark's JVM classes: every Spark driver of this environment starts faster.

Spark's driver JVM loads and verifies thousands of classes from about 280 jars before the
first job runs; on a 2-core machine that is most of its 10 s start.  Java's application
class-data sharing (AppCDS) keeps those classes, already parsed and verified, in an archive
that later JVMs map into memory: measured here, a session starts in 4.5-5.2 s instead of
8.0-9.2 s and its first job takes 2.3 s instead of 3.8 s.  Brokers with a lake, ``sparkmq lake``,
``sparkmq sql``, notebooks and the test suite all start Spark drivers, often.

The archive belongs to one environment: one Java, one PySpark with its jars, one set of Delta jars.
It lives in the environment (``<sys.prefix>/share/sparkmq/``) under a name that fingerprints them
(the Delta jars by name and size, not by folder: the same jars elsewhere are the same classes), so
another Java, a reinstalled PySpark or another Delta simply finds none.  ``build.py setup`` builds it
(:func:`build`, about a minute, once) by running a small workload that touches what the lake
uses -- Python data sources (batch, stream, sink), ``foreachBatch``, Arrow transfers,
Parquet reads, SQL, Delta writes, reads, history, MERGE and OPTIMIZE -- in a JVM that writes the
classes it loaded at exit.  Delta's classes come from ``spark.jars`` (Spark's own class loader for
added jars): the JVM archives them too, and maps each back only for the very same class file.
:func:`~.session.get_spark` uses it when it is there (:func:`java_options`); without it
Spark starts as usual.

    python -m sparkmq.pipelines.class_archive build      # what build.py setup runs
    python -m sparkmq.pipelines.class_archive status
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["archive_path", "build", "java_options", "main"]

log = logging.getLogger(__name__)

#: JVM options that dump the loaded classes at exit / map an archive (JDK 13+ dynamic archives).
_DUMP_OPTION = "-XX:ArchiveClassesAtExit={path}"
_USE_OPTION = "-XX:SharedArchiveFile={path}"


def _java() -> Path | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is None or not candidate.exists():
        found = shutil.which("java")
        candidate = Path(found) if found else None
    return candidate.resolve() if candidate is not None else None


def _fingerprint() -> str | None:
    """A short hash of this environment's Java binary, PySpark jars and Delta jars (None without Java, PySpark
    or the Delta jars)."""
    from sparkmq.platform.common import jars

    java = _java()
    try:
        import pyspark

        delta = jars.jars("delta")
    except (ImportError, jars.MissingJarsError):
        return None
    if java is None:
        return None
    digest = hashlib.sha256(pyspark.__version__.encode())
    for path in [java, *sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))]:
        st = path.stat()
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    for path in delta:
        digest.update(f"{path.name}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def _directory() -> Path:
    return Path(sys.prefix) / "share" / "sparkmq"


def archive_path() -> Path | None:
    """Where this environment's archive lives (it may not exist yet); None without Java or PySpark."""
    fingerprint = _fingerprint()
    return _directory() / f"spark-classes-{fingerprint}.jsa" if fingerprint else None


def _manifest(archive: Path) -> Path:
    return archive.with_suffix(".json")


def _usable(archive: Path) -> bool:
    # A truncated archive crashes the JVM (SIGBUS) rather than being refused: use one only when
    # its manifest, written after the archive was complete, gives its exact size.
    try:
        expected = json.loads(_manifest(archive).read_text())["size"]
        return archive.stat().st_size == expected
    except (OSError, ValueError, KeyError, TypeError):
        return False


def java_options() -> str:
    """The driver JVM option that maps the archive, or ``""`` when there is none to use."""
    archive = archive_path()
    return _USE_OPTION.format(path=archive) if archive is not None and _usable(archive) else ""


# -- building ------------------------------------------------------------------------------------------

def _training_source() -> Any:
    """A tiny Python data source (batch reader, stream reader, writers) for the training workload."""
    import pyarrow as pa
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadLimit

    schema = pa.schema([("id", pa.int64()), ("body", pa.binary()), ("tags", pa.map_(pa.string(), pa.string()))])

    def rows(start: int, end: int) -> pa.RecordBatch:
        ids = pa.array(range(start, end), pa.int64())
        return pa.RecordBatch.from_arrays([ids, pa.array([b"x" * 16] * (end - start)),
                                           pa.array([[("k", "v")]] * (end - start), schema.field("tags").type)],
                                          schema=schema)

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield rows(partition.value * 100, partition.value * 100 + 100)

    class StreamReader(DataSourceStreamReader):
        def initialOffset(self) -> dict:
            return {"n": 0}

        def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # Spark 4.2's form (with admission control)
            return {"n": 300}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            return [InputPartition((start["n"], end["n"]))]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield rows(*partition.value)

    class Writer(DataSourceArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            return WriterCommitMessage()

    class TrainingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "sparkmq-class-training"

        def schema(self) -> str:
            return "id bigint, body binary, tags map<string,string>"

        def reader(self, schema: Any) -> Reader:
            return Reader()

        def streamReader(self, schema: Any) -> StreamReader:
            return StreamReader()

        def writer(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    return TrainingSource


def _train_delta(spark: Any, work: Path) -> None:
    """What the lake does with Delta, in small: create, idempotent appends, read, history, MERGE, OPTIMIZE."""
    from delta.tables import DeltaTable
    from pyspark.sql.types import DateType, LongType, StructField, StructType, TimestampType

    path = str(work / "delta")
    schema = StructType([StructField("id", LongType(), False), StructField("ts", TimestampType()),
                         StructField("d", DateType())])
    (DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
     .partitionedBy("d").property("delta.minWriterVersion", "2").execute())
    rows = spark.sql("SELECT id, current_timestamp() AS ts, current_date() AS d FROM range(100)")
    for version in range(2):
        rows.write.format("delta").mode("append").option("txnAppId", "train").option("txnVersion", version).save(path)
    spark.sql("CREATE DATABASE IF NOT EXISTS sparkmq_training")
    spark.sql(f"CREATE TABLE IF NOT EXISTS sparkmq_training.t USING DELTA LOCATION '{path}'")
    spark.table("sparkmq_training.t").groupBy("d").count().collect()
    spark.sql("DESCRIBE HISTORY sparkmq_training.t").collect()
    table = DeltaTable.forPath(spark, path)
    table.alias("t").merge(rows.limit(5).alias("s"), "t.id = s.id").whenMatchedUpdate(set={"ts": "s.ts"}).execute()
    table.optimize().executeCompaction()
    spark.sql("DROP DATABASE sparkmq_training CASCADE")


def _train(spark: Any, work: Path) -> None:
    """What the lake does, in small: Python sources and sinks, a stream with foreachBatch, Arrow, Parquet, SQL,
    Delta."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spark.dataSource.register(_training_source())
    df = spark.read.format("sparkmq-class-training").load()
    df.toArrow()
    df.groupBy((df.id % 7).alias("k")).count().collect()
    df.write.format("sparkmq-class-training").mode("append").save()
    pq.write_table(pa.table({"id": list(range(1000)), "v": [float(i) for i in range(1000)]}), work / "t.parquet")
    spark.read.schema("id bigint, v double").parquet(str(work / "t.parquet")).createOrReplaceTempView("t")
    spark.sql("SELECT id % 10 AS k, sum(v), max(id), count(*) FROM t GROUP BY 1 ORDER BY 1").collect()
    spark.sql("SELECT id, row_number() OVER (PARTITION BY id % 3 ORDER BY v DESC) AS r FROM t").toArrow()
    spark.createDataFrame(pa.table({"a": [1, 2], "b": ["x", "y"]}).to_pandas()).collect()

    def each_batch(batch: Any, batch_id: int) -> None:
        batch.toArrow()

    query = (spark.readStream.format("sparkmq-class-training").load().writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(work / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    _train_delta(spark, work)


def _dump(target: Path) -> None:
    """Run the training workload in this process's new Spark driver, which writes ``target`` at exit."""
    from .session import get_spark, stop_spark

    work = Path(tempfile.mkdtemp(prefix="sparkmq-class-training-"))
    try:
        spark = get_spark({"spark.master": "local[1]",
                           "spark.driver.extraJavaOptions": _DUMP_OPTION.format(path=target)},
                          app_name="sparkmq-class-training", log_level="ERROR", class_archive=False)
        gateway = getattr(spark.sparkContext._gateway, "proc", None)  # the JVM process this session launched
        if gateway is None:
            raise RuntimeError("the class archive needs a local JVM launched by this process")
        _train(spark, work)
        stop_spark()
        # The JVM exits (and writes the archive) when its standard input closes.
        gateway.stdin.close()
        gateway.wait(timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(force: bool = False) -> Path | None:
    """Build this environment's archive if it has none (a Spark driver runs a small workload; about a minute).

    Returns the archive's path, or None when it cannot be built here (no Java or PySpark, or the
    workload failed: Spark then starts without it).  Archives of other environments are removed.
    """
    archive = archive_path()
    if archive is None:
        log.warning("no Java or no PySpark: no class-data archive")
        return None
    if _usable(archive) and not force:
        return archive
    log.info("[sparkmq] building the class-data archive of Spark's driver (once per environment, about a minute)")
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
               PYSPARK_DRIVER_PYTHON=os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable))
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "sparkmq.pipelines.class_archive", "_dump", str(tmp)],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
            log.warning("building the class-data archive failed (Spark starts without it):\n%s",
                        (done.stdout + done.stderr)[-3000:])
            return None
        for old in archive.parent.glob("spark-classes-*"):
            old.unlink(missing_ok=True)
        size = tmp.stat().st_size
        os.replace(tmp, archive)
        _manifest(archive).write_text(json.dumps({"size": size, "built_in_s": round(time.monotonic() - began, 1)}))
        return archive
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """``build [--force]`` | ``status``; exit 0 (a failed build only warns: it is an optimisation)."""
    parser = argparse.ArgumentParser(prog="python -m sparkmq.pipelines.class_archive",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build the archive if this environment has none")
    build_cmd.add_argument("--force", action="store_true", help="build it again")
    sub.add_parser("status", help="where the archive is and whether Spark uses it")
    dump = sub.add_parser("_dump", help=argparse.SUPPRESS)
    dump.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    if args.command == "_dump":
        _dump(args.target)
        return 0
    archive = archive_path()
    if args.command == "build":
        began = time.monotonic()
        already = archive is not None and _usable(archive) and not args.force
        built = build(force=args.force)
        if built is not None:
            print(f"[sparkmq] class-data archive {'up to date' if already else 'built'}: {built} "
                  f"({built.stat().st_size >> 20} MiB, {time.monotonic() - began:.0f} s)")
        return 0
    print(json.dumps({"archive": str(archive) if archive else None,
                      "used": bool(archive and _usable(archive))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

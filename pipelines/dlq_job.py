"""The dead-letters job: every ``%DLQ%<group>`` topic into the Delta table ``dead_letters``.

A Structured Streaming query reads the dead-letter topics through the ``sparkmq`` source
(``subscribePattern`` over ``%DLQ%.+`` with ``includeSystemTopics``) and, per micro-batch
(``foreachBatch``), appends one ``dead_letters`` row per message with delta-spark (the rows are Spark
column expressions over the source's: the executors build and write them)::

    query = start_dlq_job(spark, "127.0.0.1:9876", "/data/lake", "/data/checkpoints/dlq",
                          trigger={"processingTime": "5 seconds"})

What a row says (schema in :mod:`.tables`): the group (the topic name without ``%DLQ%``),
the original topic, the original msgId and the failure reason -- the ``DLQ_ORIGIN_TOPIC``,
``ORIGIN_MESSAGE_ID`` and ``DLQ_REASON`` properties the broker's send-back put on the
dead copy (:mod:`sparkmq.platform.broker.retry`) -- the reconsume count, when it reached the
DLQ, and where it sits in the DLQ topic (broker, queue, offset), so it can be re-driven.

Exactly once: each append carries Delta's ``txnAppId = dlq-{job}`` and ``txnVersion = batch_id``
(:func:`~.dispatch.append_once`); a replayed or re-run batch adds nothing.  Like the dispatch job,
:func:`start_dlq_job` refuses a checkpoint that is behind the table.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.common.system_topics import (
    DLQ_PREFIX,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MSG_ID,
    PROPERTY_RETRY_TOPIC,
)

from . import tables
from .dispatch import _endpoint_options, append_once, check_checkpoint, job_name_of, with_credentials
from .source import FORMAT, register

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["DLQ_PATTERN", "dead_letter_frame", "dlq_app_id", "dlq_batch", "dlq_source_options", "start_dlq_job"]

log = logging.getLogger(__name__)

#: Every dead-letter topic (the source's pattern is a full match).
DLQ_PATTERN = "%DLQ%.+"
DEFAULT_TRIGGER: Mapping[str, Any] = {"processingTime": "5 seconds"}
#: Dead letters are rare; a bound still keeps one batch small.
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 50_000


def dlq_app_id(job: str) -> str:
    """The Delta app id of ``job``'s appends to ``dead_letters``: ``dlq-{job}``."""
    return f"dlq-{job}"


def _prop(props: Column, name: str) -> Column:
    return props.getItem(name)


def dead_letter_frame(rows: DataFrame) -> DataFrame:
    """The ``dead_letters`` rows of source rows read from ``%DLQ%`` topics (``SOURCE_SCHEMA``, not ``raw``).

    Falls back where a property is missing (a message produced to a DLQ topic by hand):
    original topic ``RETRY_TOPIC`` then the DLQ topic itself, msgId the copy's own.
    """
    from pyspark.sql import functions as F

    c, props = F.col, F.col("properties")
    keys = F.array_join(c("keys"), " ")
    values = {
        "group": F.substring(c("topic"), len(DLQ_PREFIX) + 1, 1 << 20),
        "original_topic": F.coalesce(_prop(props, PROPERTY_DLQ_ORIGIN_TOPIC), _prop(props, PROPERTY_RETRY_TOPIC),
                                     c("topic")),
        "msg_id": F.coalesce(_prop(props, PROPERTY_ORIGIN_MSG_ID), c("msg_id")),
        "reconsume_times": c("reconsume_times"), "reason": _prop(props, PROPERTY_DLQ_REASON),
        "dlq_ts": c("store_timestamp"), "broker": c("broker"), "dlq_topic": c("topic"), "dlq_queue_id": c("queue_id"),
        "dlq_offset": c("queue_offset"), "tags": c("tags"), "keys": F.when(keys != "", keys), "properties": props,
        "body": c("body"),
    }
    return rows.select(*(values[f.name].alias(f.name) for f in tables.get_spec(tables.DEAD_LETTERS).schema))


def dlq_batch(rows: DataFrame, batch_id: int, lake_root: str | os.PathLike[str], job: str) -> None:
    """Append one micro-batch's dead letters once per ``(job, batch_id)``.

    The body of the job's ``foreachBatch``, public so a batch can be re-run (Delta then skips it).
    """
    append_once(dead_letter_frame(rows), lake_root, tables.DEAD_LETTERS, dlq_app_id(job), batch_id)


def dlq_source_options(namesrv_or_brokers: str | Mapping[str, str],
                       max_messages_per_trigger: int | None = DEFAULT_MAX_MESSAGES_PER_TRIGGER) -> dict[str, str]:
    """The ``sparkmq`` source options of the job (every ``%DLQ%`` topic, from the start)."""
    options, _ = _endpoint_options(namesrv_or_brokers)
    options.update({"subscribePattern": DLQ_PATTERN, "includeSystemTopics": "true",
                    "startingOffsets": "earliest", "failOnDataLoss": "false"})
    if max_messages_per_trigger is not None:
        options["maxMessagesPerTrigger"] = str(max_messages_per_trigger)
    return options



def start_dlq_job(spark: SparkSession, namesrv_or_brokers: str | Mapping[str, str],
                  lake_root: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str],
                  trigger: Mapping[str, Any] | None = None, *, job_name: str | None = None,
                  credentials: Credentials | None = None) -> StreamingQuery:
    """Start the dead-letters query and return it (running; stop it with ``query.stop()``).

    ``namesrv_or_brokers`` and ``trigger`` as for :func:`~.dispatch.start_dispatch` (default
    trigger every 5 s).  ``job_name`` names the app id ``dlq-{job_name}`` (default: the
    broker's name when one broker is given, else ``cluster``); keep it for a checkpoint.
    Creates ``dead_letters`` if needed (registered as ``sparkmq.dead_letters``); :class:`LakeError` when the
    checkpoint is behind it.
    """
    options = dlq_source_options(namesrv_or_brokers)
    job = job_name_of(namesrv_or_brokers, job_name)
    lake_root = os.fspath(lake_root)
    checkpoint = os.fspath(checkpoint_dir)
    tables.ensure_table(spark, lake_root, tables.DEAD_LETTERS)
    check_checkpoint(checkpoint, lake_root, {tables.DEAD_LETTERS: dlq_app_id(job)})
    register(spark)

    def run_batch(df: DataFrame, batch_id: int) -> None:
        dlq_batch(df, batch_id, lake_root, job)
        log.debug("dead letters %s batch %d written", job, batch_id)

    reader = spark.readStream.format(FORMAT)
    for key, value in with_credentials(options, credentials).items():
        reader = reader.option(key, value)
    return (reader.load().writeStream
            .queryName(f"sparkmq-dlq-{job}")
            .option("checkpointLocation", checkpoint)
            .foreachBatch(run_batch)
            .trigger(**dict(trigger or DEFAULT_TRIGGER))
            .start())

"""The dead-letters job: every ``%DLQ%<group>`` topic into the Delta table ``dead_letters``.

A Structured Streaming query reads the dead-letter topics through the ``sparkmq`` source
(``subscribePattern`` over ``%DLQ%.+`` with ``includeSystemTopics``) and, per micro-batch
(``foreachBatch``), appends one ``dead_letters`` row per message with delta-rs::

    query = start_dlq_job(spark, "127.0.0.1:9876", "/data/lake", "/data/checkpoints/dlq",
                          trigger={"processingTime": "5 seconds"})

What a row says (schema in :mod:`.tables`): the group (the topic name without ``%DLQ%``),
the original topic, the original msgId and the failure reason -- the ``DLQ_ORIGIN_TOPIC``,
``ORIGIN_MESSAGE_ID`` and ``DLQ_REASON`` properties the broker's send-back put on the
dead copy (:mod:`sparkmq.platform.broker.retry`) -- the reconsume count, when it reached the
DLQ, and where it sits in the DLQ topic (broker, queue, offset), so it can be re-driven.

Exactly once: each append carries the Delta app transaction ``(f"dlq-{job}", batch_id)``
(:func:`~.delta_io.append_exactly_once`); a replayed or re-run batch adds nothing.  Like
the dispatch job, :func:`start_dlq_job` refuses a checkpoint that is behind the table.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.common.system_topics import (
    DLQ_PREFIX,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_DLQ_REASON,
    PROPERTY_ORIGIN_MSG_ID,
    PROPERTY_RETRY_TOPIC,
)

from . import tables
from .delta_io import append_exactly_once
from .dispatch import _endpoint_options, check_checkpoint, with_credentials
from .source import FORMAT, register

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["DLQ_PATTERN", "dead_letter_rows", "dlq_app_id", "dlq_arrow", "dlq_source_options", "start_dlq_job"]

log = logging.getLogger(__name__)

#: Every dead-letter topic (the source's pattern is a full match).
DLQ_PATTERN = "%DLQ%.+"
DEFAULT_TRIGGER: Mapping[str, Any] = {"processingTime": "5 seconds"}
#: Dead letters are rare; a bound still keeps one batch (collected on the driver) small.
DEFAULT_MAX_MESSAGES_PER_TRIGGER = 50_000

_TS = pa.timestamp("us", tz="UTC")


def dlq_app_id(job: str) -> str:
    """The Delta app id of ``job``'s appends to ``dead_letters``: ``dlq-{job}``."""
    return f"dlq-{job}"


def _prop(props: pa.Array, name: str) -> pa.Array:
    return pc.map_lookup(props, pa.scalar(name), "first")


def dead_letter_rows(rows: pa.Table) -> pa.Table:
    """The ``dead_letters`` rows of source rows read from ``%DLQ%`` topics (``SOURCE_SCHEMA``, not ``raw``).

    Falls back where a property is missing (a message produced to a DLQ topic by hand):
    original topic ``RETRY_TOPIC`` then the DLQ topic itself, msgId the copy's own.
    """
    col = {name: rows.column(name).combine_chunks() for name in rows.column_names}
    topic, props = col["topic"], col["properties"]
    group = pc.utf8_slice_codeunits(topic, len(DLQ_PREFIX))
    original = pc.coalesce(_prop(props, PROPERTY_DLQ_ORIGIN_TOPIC), _prop(props, PROPERTY_RETRY_TOPIC), topic)
    msg_id = pc.coalesce(_prop(props, PROPERTY_ORIGIN_MSG_ID), col["msg_id"])
    keys = pc.binary_join(col["keys"].cast(pa.list_(pa.string())), " ")  # the kernel wants nullable items
    keys = pc.if_else(pc.equal(pc.utf8_length(keys), 0), pa.scalar(None, pa.string()), keys)
    schema = tables.get_spec(tables.DEAD_LETTERS).schema
    values = {
        "group": group, "original_topic": original, "msg_id": msg_id, "reconsume_times": col["reconsume_times"],
        "reason": _prop(props, PROPERTY_DLQ_REASON), "dlq_ts": col["store_timestamp"].cast(_TS),
        "broker": col["broker"], "dlq_topic": topic, "dlq_queue_id": col["queue_id"],
        "dlq_offset": col["queue_offset"], "tags": col["tags"], "keys": keys,
        "properties": props.cast(schema.field("properties").type), "body": col["body"],
    }
    return pa.Table.from_arrays([values[f.name].cast(f.type) for f in schema], schema=schema)


def dlq_arrow(rows: pa.Table, batch_id: int, lake_root: str | os.PathLike[str], job: str) -> bool:
    """Append one micro-batch's dead letters once per ``(job, batch_id)``; whether it wrote.

    The body of the job's ``foreachBatch``, public so a batch can be re-run (it then writes
    nothing).  An empty batch writes nothing.
    """
    if not rows.num_rows:
        return False
    return append_exactly_once(tables.table_path(lake_root, tables.DEAD_LETTERS), dead_letter_rows(rows),
                               app_id=dlq_app_id(job), version=batch_id)


def dlq_source_options(namesrv_or_brokers: str | Mapping[str, str],
                       max_messages_per_trigger: int | None = DEFAULT_MAX_MESSAGES_PER_TRIGGER) -> dict[str, str]:
    """The ``sparkmq`` source options of the job (every ``%DLQ%`` topic, from the start)."""
    options, _ = _endpoint_options(namesrv_or_brokers)
    options.update({"subscribePattern": DLQ_PATTERN, "includeSystemTopics": "true",
                    "startingOffsets": "earliest", "failOnDataLoss": "false"})
    if max_messages_per_trigger is not None:
        options["maxMessagesPerTrigger"] = str(max_messages_per_trigger)
    return options


def _check_checkpoint(checkpoint_dir: str, lake_root: str, job: str) -> None:
    check_checkpoint(checkpoint_dir, lake_root, {tables.DEAD_LETTERS: dlq_app_id(job)})

def start_dlq_job(spark: SparkSession, namesrv_or_brokers: str | Mapping[str, str],
                  lake_root: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str],
                  trigger: Mapping[str, Any] | None = None, *, job_name: str | None = None,
                  credentials: Credentials | None = None) -> StreamingQuery:
    """Start the dead-letters query and return it (running; stop it with ``query.stop()``).

    ``namesrv_or_brokers`` and ``trigger`` as for :func:`~.dispatch.start_dispatch` (default
    trigger every 5 s).  ``job_name`` names the app id ``dlq-{job_name}`` (default: the
    broker's name when one broker is given, else ``cluster``); keep it for a checkpoint.
    Creates ``dead_letters`` if needed; :class:`LakeError` when the checkpoint is behind it.
    """
    options = dlq_source_options(namesrv_or_brokers)
    _, endpoints = _endpoint_options(namesrv_or_brokers)
    job = job_name or (endpoints.brokers[0][0] if len(endpoints.brokers) == 1 else "cluster")
    lake_root = os.fspath(lake_root)
    checkpoint = os.fspath(checkpoint_dir)
    tables.ensure_table(lake_root, tables.DEAD_LETTERS)
    _check_checkpoint(checkpoint, lake_root, job)
    register(spark)

    def run_batch(df: DataFrame, batch_id: int) -> None:
        rows = df.toArrow()
        if dlq_arrow(rows, batch_id, lake_root, job):
            log.info("dead letters %s batch %d: %d rows", job, batch_id, rows.num_rows)

    reader = spark.readStream.format(FORMAT)
    for key, value in with_credentials(options, credentials).items():
        reader = reader.option(key, value)
    return (reader.load().writeStream
            .queryName(f"sparkmq-dlq-{job}")
            .option("checkpointLocation", checkpoint)
            .foreachBatch(run_batch)
            .trigger(**dict(trigger or DEFAULT_TRIGGER))
            .start())

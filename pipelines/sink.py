"""The ``sparkmq`` sink: ``df.write.format("sparkmq")`` and ``df.writeStream.format("sparkmq")``.

Every row becomes one message::

    (df.selectExpr("'orders' AS topic", "CAST(id AS STRING) AS keys", "to_json(struct(*)) AS body")
       .write.format("sparkmq").option("namesrv", "127.0.0.1:9876").save())

Columns (any others are an error, so a misspelt column is not silently dropped)
==============  ==============================  ==============================================
column          type                            meaning
==============  ==============================  ==============================================
topic           string                          the topic (or the ``topic`` option for all rows)
body            binary or string (UTF-8)        the body; required, non-empty
keys            string (space-separated) or     the message keys
                array<string>
tags            string                          the tag
properties      map<string,string>              user properties
==============  ==============================  ==============================================

Options: ``namesrv`` or ``brokers`` (as for the source); ``topic`` (overrides the column, as
with Kafka); ``producerGroup`` (default ``sparkmq-spark-sink``); ``batchSize`` (messages per
request, default 256; a request also ends at 4 MiB of bodies); ``sendTimeoutMs`` (per request,
retries included; default 10000); ``accessKey`` and ``secretKey`` (together: every send is signed,
for brokers with ACL on; the user needs ``Pub`` on the topics).  Spark's data source writers take
``mode("append")``.

Sends go through the client :class:`~sparkmq.platform.client.Producer` (routes from the
name servers, round-robin over write queues, retries on another broker; bodies are
not compressed: brokers refuse compressed batches) as Arrow batch sends -- one request per
``batchSize`` rows of one topic.  With
``brokers`` (no name server) batches go round-robin to the named brokers, which pick the queue.

Delivery is at least once, as with Kafka's sink: a task Spark retries sends its rows again.
A failed send fails the task with the client's ``SparkMQError`` (``CODE: message``, e.g.
``TOPIC_ILLEGAL: ...``), which Spark reports as the job's error.  Each task reports how many
messages it stored; the driver logs the totals per topic when the write commits.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from sparkmq.platform.auth.signing import Credentials
from sparkmq.platform.client import BrokerClient, ClientConfig, Message, Producer
from sparkmq.platform.common.errors import ErrorCode, SparkMQError
from sparkmq.platform.common.message import KEY_SEPARATOR
from sparkmq.platform.common.validation import validate_group, validate_topic
from sparkmq.platform.common.wire import SendRow, send_rows_to_arrow, to_ipc

from .cluster_io import CREDENTIAL_OPTIONS, Endpoints, OptionError, access_error, credentials_option
from .source import canonical_options

__all__ = ["SINK_OPTIONS", "SinkCommitMessage", "SinkOptions", "SparkMQStreamWriter", "SparkMQWriter"]

log = logging.getLogger(__name__)

#: Every option the sink knows.  ``checkpointLocation`` is Spark's, passed along on writeStream.
SINK_OPTIONS = ("namesrv", "brokers", "topic", "producerGroup", "batchSize", "sendTimeoutMs", "checkpointLocation",
                *CREDENTIAL_OPTIONS)

DEFAULT_PRODUCER_GROUP = "sparkmq-spark-sink"

_BODY_TYPES = (BinaryType, StringType)
#: A request is sent once its bodies reach this many bytes, whatever batchSize says.
MAX_BATCH_BYTES = 4 << 20
_NEVER_COMPRESS = 2**62


def _column_ok(name: str, data_type: DataType) -> bool:
    if name == "body":
        return isinstance(data_type, _BODY_TYPES)
    if name in ("topic", "tags"):
        return isinstance(data_type, StringType)
    if name == "keys":
        return isinstance(data_type, StringType) or (isinstance(data_type, ArrayType)
                                                    and isinstance(data_type.elementType, StringType))
    if name == "properties":
        return isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType) \
            and isinstance(data_type.valueType, StringType)
    return False


_COLUMN_TYPES = {"topic": "string", "body": "binary or string", "keys": "string or array<string>",
                 "tags": "string", "properties": "map<string,string>"}


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options and the input's columns, checked on the driver.  Picklable."""

    endpoints: Endpoints
    topic: str | None
    producer_group: str
    batch_size: int
    send_timeout_s: float
    columns: tuple[str, ...]
    #: Signs every send (brokers with ACL on); travels to the executors with the plan.
    credentials: Credentials | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        """Check ``options`` and the DataFrame's ``schema``; :class:`OptionError` names what is wrong."""
        opts = canonical_options(options, SINK_OPTIONS, "sink")
        endpoints = Endpoints.parse(opts.get("namesrv"), opts.get("brokers"))
        topic = opts.get("topic")
        if topic is not None:
            try:
                topic = validate_topic(topic.strip())
            except SparkMQError as exc:
                raise OptionError("topic", exc.message) from None
        try:
            group = validate_group(opts.get("producerGroup", DEFAULT_PRODUCER_GROUP).strip())
        except SparkMQError as exc:
            raise OptionError("producerGroup", exc.message) from None
        batch_size = _positive(opts, "batchSize", 256, 10_000)
        timeout_ms = _positive(opts, "sendTimeoutMs", 10_000, 3_600_000)
        names = schema.fieldNames()
        for f in schema.fields:
            if f.name not in _COLUMN_TYPES:
                raise OptionError("schema", f"column {f.name!r} is not one the sink writes "
                                            f"({', '.join(_COLUMN_TYPES)}); drop or rename it")
            if not _column_ok(f.name, f.dataType):
                raise OptionError("schema", f"column {f.name!r} must be {_COLUMN_TYPES[f.name]}, "
                                            f"not {f.dataType.simpleString()}")
        if "body" not in names:
            raise OptionError("schema", "the DataFrame needs a 'body' column (binary or string)")
        if topic is None and "topic" not in names:
            raise OptionError("topic", "give the 'topic' option or a 'topic' column")
        return cls(endpoints, topic, group, batch_size, timeout_ms / 1000, tuple(names), credentials_option(opts))


def _positive(opts: Mapping[str, str], name: str, default: int, high: int) -> int:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(name, f"expected an integer, got {text!r}") from None
    if not 1 <= value <= high:
        raise OptionError(name, f"must be between 1 and {high}, got {value}")
    return value


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task stored: message counts by topic."""

    by_topic: dict[str, int] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        """Messages this task stored."""
        return sum(self.by_topic.values())


# -- rows to messages ----------------------------------------------------------------------------------

def _keys(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(k for k in value.split(KEY_SEPARATOR) if k)
    return tuple(k for k in value if k)


def messages_of(batch: pa.RecordBatch, default_topic: str | None) -> Iterator[Message]:
    """The messages of one input batch, in row order (``default_topic``: the ``topic`` option)."""
    for i, row in enumerate(batch.to_pylist()):
        topic = default_topic or row.get("topic")
        if not topic:
            raise SparkMQError(ErrorCode.TOPIC_ILLEGAL, f"row {i} has no topic (NULL in the 'topic' column)")
        body = row["body"]
        if body is None:
            raise SparkMQError(ErrorCode.MESSAGE_ILLEGAL, f"row {i} of topic {topic!r} has a NULL body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        props = row.get("properties")
        yield Message(topic, body, tags=row.get("tags"), keys=_keys(row.get("keys")),
                      properties=dict(props) if props else {})


class _Sender:
    """Sends batches of one topic: through a Producer (name servers) or round-robin to named brokers."""

    def __init__(self, options: SinkOptions) -> None:
        self._options = options
        self._producer: Producer | None = None
        self._brokers: list[BrokerClient] = []
        if options.endpoints.namesrv:
            # Producer.send_batch compresses a batch whose bodies pass compress_threshold, but brokers
            # refuse compressed batches (INVALID_ARGUMENT); keep batches uncompressed.
            creds = options.credentials
            cfg = ClientConfig(namesrv_addrs=options.endpoints.namesrv, send_timeout_s=options.send_timeout_s,
                               request_timeout_s=options.send_timeout_s, compress_threshold=_NEVER_COMPRESS,
                               access_key=creds.access_key if creds else None,
                               secret_key=creds.secret_key if creds else None)
            self._producer = Producer(options.producer_group, cfg).start()
        else:
            self._brokers = [BrokerClient(addr, options.send_timeout_s, credentials=options.credentials)
                             for _, addr in options.endpoints.brokers]
        self._next = itertools.cycle(range(max(1, len(self._brokers))))

    def send(self, topic: str, messages: Sequence[Message]) -> int:
        """Store ``messages`` (one topic) in one request; how many were stored."""
        try:
            return self._send(topic, messages)
        except SparkMQError as exc:
            if exc.code in (ErrorCode.AUTHENTICATION_FAILED, ErrorCode.NO_PERMISSION):
                raise access_error(exc) from None
            raise

    def _send(self, topic: str, messages: Sequence[Message]) -> int:
        if self._producer is not None:
            return len(self._producer.send_batch(list(messages), arrow=True))
        rows = [SendRow(m.body, m.tags, tuple(m.keys), dict(m.properties)) for m in messages]
        validate_topic(topic)
        client = self._brokers[next(self._next)]
        params = {"producer_group": self._options.producer_group}
        # The topic is percent-encoded here: BrokerClient.send_batch puts it into the path as is.
        answer = client.send_batch(topic, params, arrow=to_ipc(send_rows_to_arrow(rows)))  # the client quotes it
        return len(answer["results"])

    def close(self) -> None:
        """Shut the producer down / close the connections."""
        if self._producer is not None:
            self._producer.shutdown()
        for client in self._brokers:
            client.close()


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
    """Send every row of ``batches``: chunks of ``batch_size`` messages of one topic per request."""
    sender = _Sender(options)
    stored: dict[str, int] = {}
    pending: dict[str, list[Message]] = {}
    pending_bytes: dict[str, int] = {}
    try:
        for batch in batches:
            for message in messages_of(batch, options.topic):
                topic = message.topic
                chunk = pending.setdefault(topic, [])
                chunk.append(message)
                pending_bytes[topic] = pending_bytes.get(topic, 0) + len(message.body)
                if len(chunk) >= options.batch_size or pending_bytes[topic] >= MAX_BATCH_BYTES:
                    stored[topic] = stored.get(topic, 0) + sender.send(topic, chunk)
                    pending[topic], pending_bytes[topic] = [], 0
        for topic, chunk in pending.items():
            if chunk:
                stored[topic] = stored.get(topic, 0) + sender.send(topic, chunk)
    finally:
        sender.close()
    return SinkCommitMessage(stored)


def _totals(messages: Sequence[WriterCommitMessage | None]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            for topic, n in m.by_topic.items():
                totals[topic] = totals.get(topic, 0) + n
    return dict(sorted(totals.items()))


class SparkMQWriter(DataSourceArrowWriter):
    """``df.write.format("sparkmq")``: each task sends its rows as Arrow batch sends."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Send one partition's rows (on an executor); the counts it stored."""
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: log the totals."""
        totals = _totals(messages)
        log.info("sparkmq sink stored %d messages: %s", sum(totals.values()), totals)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed: log what the others stored (sent messages are not taken back)."""
        log.warning("sparkmq sink write failed; tasks that finished stored %s", _totals(messages))


class SparkMQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("sparkmq")``: each micro-batch's rows become messages (at least once)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Send one partition's rows of a micro-batch (on an executor)."""
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 (Spark's name)
        """The micro-batch is written: log the totals."""
        totals = _totals(messages)
        log.info("sparkmq sink batch %d stored %d messages: %s", batchId, sum(totals.values()), totals)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """A task of the micro-batch failed: log what was stored (Spark retries the batch)."""
        log.warning("sparkmq sink batch %d failed; tasks that finished stored %s", batchId, _totals(messages))

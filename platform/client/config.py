"""Configuration of a client (producer, consumer or admin), validated once at construction.

Defaults follow RocketMQ's client defaults; every interval
is a field so tests can run the same machinery with sub-second timings.

Example::

    >>> cfg = ClientConfig(namesrv_addrs="127.0.0.1:9876;127.0.0.1:9877", heartbeat_interval_s=0.5)
    >>> cfg.namesrv_addrs
    ('127.0.0.1:9876', '127.0.0.1:9877')
    >>> cfg.pull_timeout_s  # the long poll the broker may hold, plus a margin
    20.0
"""
from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from msgspec import Meta

from ..auth.signing import Credentials
from ..common.protocol import MAX_LONG_POLL_MS
from ..common.tls import TlsSettings
from ..common.validation import (
    MillisOrZero,
    NonNegative,
    Positive,
    Seconds,
    SecondsOrZero,
    check_fields,
    split_addrs,
)

__all__ = [
    "ClientConfig",
    "default_client_id",
    "local_ip",
    "DEFAULT_SEND_TIMEOUT_S",
    "DEFAULT_COMPRESS_THRESHOLD",
    "DEFAULT_CONSUME_TIMESTAMP_BACK_S",
]

#: RocketMQ's sendMsgTimeout (3000 ms).
DEFAULT_SEND_TIMEOUT_S = 3.0
#: Bodies larger than this are zlib-compressed (compressMsgBodyOverHowmuch, 4 KiB).
DEFAULT_COMPRESS_THRESHOLD = 4 * 1024
#: CONSUME_FROM_TIMESTAMP without a timestamp starts half an hour back (consumeTimestamp).
DEFAULT_CONSUME_TIMESTAMP_BACK_S = 30 * 60


def local_ip() -> str:
    """This machine's IPv4 address as the resolver sees it (127.0.0.1 when it cannot tell)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def default_client_id() -> str:
    """``ip@pid@random``: unique per client object, so two consumers in one process stay two members.

    RocketMQ uses ``ip@instanceName``; the random part replaces the instance name so tests and
    scripts that start several clients in one process need no extra setting.
    """
    return f"{local_ip()}@{os.getpid()}@{secrets.token_hex(4)}"


@dataclass(frozen=True)
class ClientConfig:
    """Settings shared by :class:`Producer`, :class:`PushConsumer`, :class:`PullConsumer` and :class:`AdminClient`.

    ``namesrv_addrs`` is the only required field.  All durations are seconds.
    """

    #: Name servers as ``"host:port;host:port"`` or a list; clients stick to one that answers.
    namesrv_addrs: tuple[str, ...] | list[str] | str = ()
    #: This client's id in heartbeats and group member lists; None = :func:`default_client_id` per client object.
    client_id: str | None = None

    # -- requests -----------------------------------------------------------------------
    #: Timeout of admin, heartbeat, offset and route requests.
    request_timeout_s: Seconds = 5.0
    #: Total time budget of one synchronous send, retries included.
    send_timeout_s: Seconds = DEFAULT_SEND_TIMEOUT_S
    #: Extra attempts (on another broker) after a failed send; ordered sends never move.
    retry_times: NonNegative = 2
    #: Bodies strictly larger than this many bytes are zlib-compressed.
    compress_threshold: NonNegative = DEFAULT_COMPRESS_THRESHOLD
    #: zlib level for compressed bodies.
    compress_level: Annotated[int, Meta(ge=0, le=9)] = 5
    #: Largest body a producer accepts (the broker checks again).
    max_message_size: Positive = 4 * 1024 * 1024
    #: Threads of the producer's async / one-way send pool.
    async_send_threads: Positive = 4
    #: ``send_async`` gathers messages per topic into batches (``send_batch`` requests) instead of one
    #: request each; ordered (sharding key, selector) and delayed sends are never batched.
    async_batching: bool = True
    #: A batch holds at most this many messages ...
    batch_max_messages: Positive = 256
    #: ... and this many body bytes.
    batch_max_bytes: Positive = 1 << 20
    #: How long a batch may wait to fill (Kafka's linger.ms); 0 = leave as soon as a send slot is free.
    linger_ms: MillisOrZero = 0.0
    #: Batches in flight at once (each on one of ``async_send_threads``).
    max_in_flight_batches: Positive = 4
    #: Body bytes of batched ``send_async`` messages not yet answered (Kafka's buffer.memory): a caller that
    #: outruns the brokers waits for room ...  Smaller than Kafka's 32 MiB: queued messages are Python objects
    #: here, and the more of them live, the longer each of Python's full garbage collections takes.
    buffer_memory_bytes: Positive = 8 << 20
    #: ... at most this long, then gets PRODUCER_BUFFER_FULL (Kafka's max.block.ms).
    max_block_ms: MillisOrZero = 60_000.0
    #: Avoid brokers whose sends were slow or failed, for a latency-dependent time.
    send_latency_fault_enable: bool = True
    #: How often the producer probes isolated brokers to lift the isolation early (RocketMQ 5's detector).
    fault_detect_interval_s: Seconds = 2.0

    # -- periodic work ------------------------------------------------------------------
    #: Topic routes are refetched from a name server this often.
    route_refresh_interval_s: Seconds = 30.0
    #: A topic with no route is asked for again at most this often while a client needs it.
    route_miss_retry_s: Seconds = 1.0
    #: Heartbeats (with subscriptions) to every broker serving the client's topics.
    heartbeat_interval_s: Seconds = 30.0
    #: Periodic rebalance (consumers also rebalance on a broker's membership notice).
    rebalance_interval_s: Seconds = 20.0
    #: Consumer offsets are committed this often (and on shutdown and when a queue is taken away).
    offset_commit_interval_s: Seconds = 5.0

    # -- pulling ------------------------------------------------------------------------
    #: Messages asked for per pull request.
    pull_batch_size: Positive = 32
    #: How long the broker may hold a pull that finds nothing (the broker caps it at 15 s).
    long_poll_wait_ms: Annotated[int, Meta(ge=0, le=MAX_LONG_POLL_MS)] = 15_000
    #: Client-side slack on top of the long-poll wait before a pull counts as timed out.
    long_poll_margin_s: Seconds = 5.0
    #: "Pull" responses in Arrow IPC instead of JSON (the HTTP transport only).
    pull_format: str = "json"
    #: How to reach brokers: "remoting" (the binary protocol, where the route names a broker's remoting
    #: endpoint; HTTP otherwise) or "http" (always HTTP).  Admin calls always use HTTP.
    transport: str = "remoting"
    #: Wait after a failed pull (RocketMQ: 3 s) before trying that queue again.
    pull_error_backoff_s: Seconds = 1.0
    #: Wait while a queue is over its flow-control limits (RocketMQ: 50 ms).
    flow_control_backoff_s: Seconds = 0.05
    #: Per-queue flow control: messages pulled but not consumed ...
    flow_control_max_messages: Positive = 1000
    #: ... their total body bytes ...
    flow_control_max_bytes: Positive = 100 * 1024 * 1024
    #: ... and the spread between the smallest and largest of their offsets (concurrent consumers).
    max_offset_span: Positive = 2000
    #: Wait of the membership long poll ``/consumers/{group}/changes``.
    change_wait_ms: Annotated[int, Meta(ge=0, le=MAX_LONG_POLL_MS)] = 20_000

    # -- consuming ----------------------------------------------------------------------
    #: Listener threads of a push consumer.
    consume_threads: Positive = 20
    #: Most messages handed to one listener call (consumeMessageBatchMaxSize).
    consume_batch_size: Positive = 1
    #: Delay before a message the listener refused is delivered to it again (local redelivery).
    reconsume_delay_s: SecondsOrZero = 5.0
    #: CONSUME_FROM_TIMESTAMP start (epoch ms); None = now - 30 min when the consumer starts.
    consume_timestamp_ms: NonNegative | None = None
    #: Where broadcasting consumers keep their offsets (``<dir>/<group>/offsets.json``).
    offset_store_dir: str | Path = field(default_factory=lambda: Path.home() / ".sparkmq_offsets")

    # -- message trace -------------------------------------------------------------------
    #: Producers post ``send`` and push consumers ``consume`` trace events (batched, ``POST /trace``).
    trace_enabled: bool = True

    # -- TLS (docs/security-tls.md) ------------------------------------------------------------
    #: Reach name servers and brokers over TLS (HTTPS and TLS remoting); needed when they require it.
    tls: bool = False
    #: PEM CAs trusted to sign the servers' certificates (the cluster's CA); None = the system's trust store.
    tls_ca_file: str | Path | None = None
    #: Check that a server's certificate names the host or IP address connected to.
    tls_check_hostname: bool = True

    # -- credentials (brokers with ACL on, docs/security.md) ---------------------------------
    #: The access key every request is signed with; None (with ``secret_key``) = requests go unsigned.
    access_key: str | None = None
    #: Its secret key; never printed (not in ``repr``).
    secret_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "namesrv_addrs", split_addrs(self.namesrv_addrs))
        if not self.namesrv_addrs:
            raise ValueError("namesrv_addrs must name at least one name server")
        if self.client_id is not None and (not isinstance(self.client_id, str) or not self.client_id.strip()):
            raise ValueError(f"client_id must be a non-empty string or None, got {self.client_id!r}")
        check_fields(self)  # durations, counts, sizes, switches
        if self.transport not in ("remoting", "http"):
            raise ValueError(f"transport must be 'remoting' or 'http', got {self.transport!r}")
        if self.pull_format not in ("json", "arrow"):
            raise ValueError(f"pull_format must be 'json' or 'arrow', got {self.pull_format!r}")
        object.__setattr__(self, "offset_store_dir", Path(self.offset_store_dir))
        # Built (and the CA file checked) now, not at the first connection.
        object.__setattr__(self, "_tls", TlsSettings.of_files(ca_file=self.tls_ca_file, connect=self.tls,
                                                              check_hostname=self.tls_check_hostname))
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("access_key and secret_key go together: set both or neither")
        if self.access_key is not None:
            Credentials(self.access_key, self.secret_key)  # type: ignore[arg-type]  # validates both

    @property
    def tls_settings(self) -> TlsSettings:
        """The TLS of every connection this client opens (plaintext unless :attr:`tls`)."""
        return self._tls  # type: ignore[attr-defined]  # set in __post_init__

    @property
    def pull_timeout_s(self) -> float:
        """Client-side timeout of one pull: the long-poll wait plus :attr:`long_poll_margin_s`."""
        return self.long_poll_wait_ms / 1000 + self.long_poll_margin_s

    @property
    def change_timeout_s(self) -> float:
        """Client-side timeout of one membership long poll."""
        return self.change_wait_ms / 1000 + self.long_poll_margin_s

    @property
    def credentials(self) -> Credentials | None:
        """The credentials requests are signed with (None = unsigned)."""
        if self.access_key is None or self.secret_key is None:
            return None
        return Credentials(self.access_key, self.secret_key)

    def new_client_id(self) -> str:
        """The id a new client object uses: :attr:`client_id` when set, else a fresh :func:`default_client_id`."""
        return self.client_id or default_client_id()

"""The broker's remoting adapter: RocketMQ's remoting protocol over the broker's processors (``docs/remoting.md``).

:class:`BrokerRemoting` is the dispatcher: request code -> handler, the ACL check, and the client connections its
heartbeats bound (where pushes go).  The handlers live in one module per request family -- :mod:`.send`,
:mod:`.pull`, :mod:`.consumer`, :mod:`.transaction`, :mod:`.query`, and the admin requests behind ``mqadmin`` in
:mod:`.admin` when present -- and only decode, call a processor (``platform/broker/processors``) and encode.

Pushes (ONEWAY, to the connection a client's last HEART_BEAT came on): NOTIFY_CONSUMER_IDS_CHANGED to a group's
members when its membership moves, RESET_CONSUMER_CLIENT_OFFSET when an admin reset its offsets, and
CHECK_TRANSACTION_STATE to one live producer of a group with a half message left open.  Unknown codes are answered
REQUEST_CODE_NOT_SUPPORTED.

Every broker serves remoting on its main port, told apart from HTTP by the first byte (``api/serving.py``,
:meth:`BrokerRemoting.start_shared`), and optionally on a dedicated port too (:meth:`BrokerRemoting.start`).
"""
from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...platform.broker.broker import Broker
from ...platform.common import protocol as p
from ...platform.common.errors import SparkMQError
from ...platform.common.limits import ConnectionLimits
from ...platform.common.message import SendStatus
from ...platform.common.protocol import LanguageCode, RequestCode
from ...platform.common.tls import TlsSettings
from ...platform.remoting import Deferred, Frame, RemotingServer, Reply, ServerConnection, unsupported_reply
from ..acl import broker_guard
from . import consumer, pull, query, send, transaction
from ._common import CLIENT_ID, SIGNED, Family, Handler, NeedsOf

__all__ = ["BrokerRemoting", "Handler", "NeedsOf", "SIGNED"]

log = logging.getLogger("sparkmq.broker.remoting")

#: The request families every broker serves, each ``family(remoting) -> (handlers, needs)``.
_FAMILIES: tuple[Family, ...] = (send.family, pull.family, consumer.family, transaction.family, query.family)
#: The admin requests' module (``admin_handlers(remoting)``, optionally ``admin_needs(remoting)``), when present.
_ADMIN_MODULE = f"{__name__}.admin"
#: Connection attributes recorded from a client's heartbeat (``GET_CONSUMER_CONNECTION_LIST`` shows them).
LANGUAGE = "language"
VERSION = "version"


class BrokerRemoting:
    """Serves one broker's processors over RocketMQ's remoting protocol.

    Example (on the serving event loop)::

        remoting = BrokerRemoting(broker)
        await serve_app(app, sock, on_ready, remoting=remoting.start_shared())   # the main port
        await remoting.start("127.0.0.1", 10913)                                 # optional: a dedicated port too
        ...
        await remoting.stop()
    """

    def __init__(self, broker: Broker, *, max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES,
                 idle_timeout_s: float = p.DEFAULT_IDLE_TIMEOUT_S, tls: TlsSettings | None = None,
                 limits: ConnectionLimits | None = None) -> None:
        self.broker = broker
        self._server_options: dict[str, Any] = {"max_frame_bytes": max_frame_bytes, "idle_timeout_s": idle_timeout_s,
                                                "tls": tls, "limits": limits}
        #: The server of the connections the main (HTTP) port hands over.
        self.server = RemotingServer(self.handle, **self._server_options)
        self.server.on_busy = broker.metrics.busy
        #: The dedicated listener (``remoting_port``), when one is configured.
        self.dedicated: RemotingServer | None = None
        self._lock = threading.Lock()
        #: client id -> the connection its last heartbeat came on (where its pushes go).
        self._bound: dict[str, ServerConnection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard = broker_guard(broker)
        self._handlers: dict[int, Handler] = {}
        self._needs: dict[int, NeedsOf | str] = {}
        for family in _FAMILIES:
            handlers, needs = family(self)
            self._handlers.update(handlers)
            self._needs.update(needs)
        self._add_admin()
        broker.clients.add_change_listener(self._on_group_change)
        broker.consumer_processor.add_reset_listener(self._on_offset_reset)
        broker.checks.add_offer_listener(self.push_pending_checks)

    def _add_admin(self) -> None:
        """Merge the admin requests (``mqadmin``'s) when their module is part of this build."""
        if importlib.util.find_spec(_ADMIN_MODULE) is None:
            return
        admin = importlib.import_module(_ADMIN_MODULE)
        self._handlers.update(admin.admin_handlers(self))
        needs_of = getattr(admin, "admin_needs", None)
        if needs_of is not None:  # codes it leaves out need a super user
            self._needs.update(needs_of(self))

    @property
    def codes(self) -> frozenset[int]:
        """Every request code served (the rest are answered REQUEST_CODE_NOT_SUPPORTED)."""
        return frozenset(self._handlers)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def port(self) -> int | None:
        """The dedicated listener's port (after :meth:`start`), else None."""
        return self.dedicated.port if self.dedicated is not None else None

    def start_shared(self) -> RemotingServer:
        """Serve the remoting connections the main port's HTTP server hands over (on the running loop); returns
        the server to give ``serve_app(..., remoting=...)``."""
        self._loop = asyncio.get_running_loop()
        return self.server.start_shared()

    async def start(self, host: str, port: int) -> BrokerRemoting:
        """Also listen on a dedicated ``host:port`` (0 = a free port) on the running loop."""
        self._loop = asyncio.get_running_loop()
        server = RemotingServer(self.handle, **self._server_options)
        server.on_busy = self.broker.metrics.busy
        await server.start(host, port)
        self.dedicated = server
        log.info("broker %s serves remoting on %s:%d too", self.broker.name, host, server.port)
        return self

    async def stop(self, grace_s: float = 5.0) -> None:
        """Answer what is in flight, then close every connection (both servers)."""
        servers = [self.server] + ([self.dedicated] if self.dedicated is not None else [])
        await asyncio.gather(*(s.stop(grace_s) for s in servers))

    def stats(self) -> dict[str, int]:
        """The servers' counters summed (connections, requests, protocol errors, ...)."""
        out: dict[str, int] = {}
        for server in [self.server] + ([self.dedicated] if self.dedicated is not None else []):
            for key, value in server.stats().items():
                out[key] = out.get(key, 0) + value
        return out

    # -- dispatch -------------------------------------------------------------------------
    def handle(self, conn: ServerConnection, frame: Frame) -> Reply | Awaitable[Reply | None] | Deferred | None:
        """Route one request to its handler (REQUEST_CODE_NOT_SUPPORTED for an unknown code); with ACL on, only once
        its credentials and the ACL allow it (AUTHENTICATION_FAILED / NO_PERMISSION otherwise, nothing changed)."""
        handler = self._handlers.get(frame.code)
        if handler is None:
            return unsupported_reply(frame)
        queue = _QUEUED.get(frame.code)
        if queue is not None:  # a send or a pull that waited too long in this broker: SYSTEM_BUSY at once
            self.broker.overload.check_waited(time.monotonic() - conn.received_at, pull=queue)
        if self._guard.enabled:
            self._authorize(conn, frame)
        return handler(conn, frame)

    def queued(self, *, pull: bool) -> Callable[[], None]:
        """For a request handed to a worker thread now: a check its worker runs first, answering SYSTEM_BUSY
        when the request waited for the thread longer than ``wait_time_ms_in_send_queue`` (``_pull_``)."""
        queued_at = time.monotonic()
        guard = self.broker.overload
        return lambda: guard.check_waited(time.monotonic() - queued_at, pull=pull)

    def _authorize(self, conn: ServerConnection, frame: Frame) -> None:
        """Verify the credentials in the frame's extFields (they are removed from it), then what the code needs:
        its entry in the needs table, any signed user for :data:`SIGNED`, a super user for a code without one."""
        guard = self._guard
        principal = guard.authenticate_remoting(frame, conn.peer)
        if principal.super_user:
            return
        what = f"remoting {_code_name(frame.code)}"
        needs_of = self._needs.get(frame.code)
        if needs_of is None:
            guard.require_super_user(principal, conn.peer, what)
        elif needs_of != SIGNED:
            guard.authorize(principal, needs_of(frame), conn.peer, what)  # type: ignore[operator]

    def when_acknowledged(self, end_offset: int,
                          answer: Callable[[SendStatus], Reply]) -> Reply | Deferred | Awaitable[Reply]:
        """``answer(status)`` of a send stored with ``wait=False``, once it may be acknowledged (SYNC_FLUSH,
        SYNC_MASTER, DLedger; loop futures, no thread).  When one future is all it waits for (the disk sync, or
        the DLedger commit), that future answers from its done callback (no task)."""
        sending = self.broker.send_processor
        loop = self._loop
        assert loop is not None
        waiting = sending.acknowledgement(end_offset, loop)
        if waiting is None:
            async def acknowledged() -> Reply:
                return answer(await sending.acknowledge(end_offset, loop))
            return acknowledged()
        future, status_of = waiting

        def finish(done: asyncio.Future[Any]) -> Reply:
            return answer(status_of(done))
        return finish(future) if future.done() else Deferred(future, finish)

    # -- bound client connections -----------------------------------------------------------
    def bind(self, client_id: str, conn: ServerConnection, frame: Frame | None = None) -> None:
        """Send ``client_id``'s pushes to ``conn`` from now on (its heartbeat came there), and remember the
        client's language and version from ``frame``."""
        if frame is not None:
            conn.attributes[LANGUAGE] = _language_name(frame.language)
            conn.attributes[VERSION] = frame.version
        with self._lock:
            previous = self._bound.get(client_id)
            if previous is conn:
                return
            self._bound[client_id] = conn
        conn.attributes[CLIENT_ID] = client_id
        conn.on_close(functools.partial(self._unbind, client_id))

    def _unbind(self, client_id: str, conn: ServerConnection) -> None:
        with self._lock:
            if self._bound.get(client_id) is conn:
                del self._bound[client_id]

    def connection_of(self, client_id: str) -> ServerConnection | None:
        """The live connection ``client_id`` heartbeats on, if any."""
        with self._lock:
            conn = self._bound.get(client_id)
        return None if conn is None or conn.closed else conn

    def _member_connections(self, group: str) -> list[ServerConnection]:
        return [c for member in self.broker.clients.members(group) if (c := self.connection_of(member)) is not None]

    # -- pushes (any thread: push() is thread-safe) ------------------------------------------
    def _on_group_change(self, group: str, version: int) -> None:
        ext = p.ext_fields(p.ConsumerGroupRequestHeader(group))
        for conn in self._member_connections(group):
            conn.push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext)

    def _on_offset_reset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        name = self.broker.name
        ext = p.ext_fields(p.ResetOffsetNoticeHeader(topic, group, int(time.time() * 1000), True))
        body = p.mq_keyed_json([(p.MessageQueueData(topic, name, q), o) for q, o in sorted(offsets.items())])
        for conn in self._member_connections(group):
            conn.push(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, ext, body)

    def push_pending_checks(self, producer_group: str) -> None:
        """Hand the group's pending check-backs to its live producer connections (else they wait for a poller)."""
        conns = [c for cid in self.broker.clients.producer_groups().get(producer_group, ())
                 if (c := self.connection_of(cid)) is not None]
        if not conns:
            return
        for check in self.broker.checks.take(producer_group):
            try:
                header, body = transaction.check_push(self.broker, check)
            except SparkMQError as exc:  # the half message is gone (settled meanwhile, or retention)
                log.debug("no check-back for %s: %s", check.transaction_id, exc)
                continue
            conns[hash(check.transaction_id) % len(conns)].push(RequestCode.CHECK_TRANSACTION_STATE, header, body)


#: The requests RocketMQ queues for its send (False) and pull (True) thread pools: each is answered SYSTEM_BUSY
#: when it waited in this broker longer than ``wait_time_ms_in_send_queue`` / ``wait_time_ms_in_pull_queue``.
_QUEUED: dict[int, bool] = {
    RequestCode.SEND_MESSAGE: False, RequestCode.SEND_MESSAGE_V2: False, RequestCode.SEND_BATCH_MESSAGE: False,
    RequestCode.SPARKMQ_SEND_PACKED: False, RequestCode.CONSUMER_SEND_MSG_BACK: False,
    RequestCode.PULL_MESSAGE: True, RequestCode.LITE_PULL_MESSAGE: True, RequestCode.SPARKMQ_PULL_PACKED: True,
}


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


def _language_name(number: int) -> str:
    try:
        return LanguageCode(number).name
    except ValueError:
        return LanguageCode.OTHER.name

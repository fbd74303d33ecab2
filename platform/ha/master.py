"""The master's side of replication: serve slaves the commit log, and tell SYNC_MASTER sends when a slave has them.

:class:`ReplicationMaster` listens on the HA port on the broker's event loop.  Each slave
connection (protocol: :mod:`.protocol`) gets one task streaming the log from the slave's offset
(woken by appends, a heartbeat when idle) and one reading the slave's REPORTs.  What a slave
reported is its acknowledgement: :meth:`ReplicationMaster.wait_replicated` (a loop future) and
:meth:`ReplicationMaster.await_replicated` (a blocking call) answer a SYNC_MASTER send with
``SEND_OK`` once an in-sync slave holds its end offset, ``FLUSH_SLAVE_TIMEOUT`` after
``flush_slave_timeout_s`` (the message stays stored on the master), or ``SLAVE_NOT_AVAILABLE`` at
once when no slave is in sync (RocketMQ's GroupTransferService).

With a :class:`~.cluster_auth.ClusterAuth` that requires it, a slave must prove the cluster secret in
its HELLO (else UNAUTHENTICATED, nothing sent); an authenticated slave also gets this master's ACL
table (``config/acl.json``, the users and policies without the config's bootstrap super user) at once
and again within about a second of every change, so it enforces the same users and policies.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..auth.model import AclTable
from ..auth.store import AclStore
from ..common.errors import SparkMQError
from ..common.failure_log import FailureLog
from ..common.message import SendStatus
from ..common.tls import Listener, TlsSettings, start_stream_server
from ..common.waiters import OffsetWaiters, WaiterRegistry
from ..store import AppendEvent, MessageStore
from .acl_copy import encode_acl
from .cluster_auth import PROOF, ClusterAuth
from .protocol import (
    ACL_FRAME,
    HA_MAGIC,
    HA_VERSION,
    HA_VERSION_AUTH,
    HEARTBEAT_INTERVAL_S,
    HELLO_FIXED,
    MAX_ACL_BYTES,
    MAX_NAME_BYTES,
    REPORT,
    TRANSFER_BYTES,
    TRANSFER_HEADER,
    WELCOME,
    HandshakeStatus,
    ha_identity,
)

__all__ = ["ReplicationMaster", "SlaveState", "DEFAULT_IN_SYNC_MAX_GAP_BYTES", "DEFAULT_FLUSH_SLAVE_TIMEOUT_S"]

log = logging.getLogger("sparkmq.ha")

#: RocketMQ's haMaxGapNotInSync: a slave further behind than this is not in sync.
DEFAULT_IN_SYNC_MAX_GAP_BYTES = 256 << 20
#: RocketMQ's syncFlushTimeout for the slave: a SYNC_MASTER send answers FLUSH_SLAVE_TIMEOUT after it.
DEFAULT_FLUSH_SLAVE_TIMEOUT_S = 3.0
#: A slave must say HELLO this soon after connecting.
HELLO_TIMEOUT_S = 5.0
#: A slave silent this long (no REPORT) is dropped: it reports at least every 5 s.
SLAVE_SILENCE_S = 15.0
_LOG_KEY = "log"


@dataclass
class SlaveState:
    """One connected slave, as the master sees it."""

    addr: str
    broker_id: int
    #: What the slave reported holding (its acknowledgement).
    acked_offset: int
    #: Where the next TRANSFER starts.
    sent_offset: int
    connected_at: float = field(default_factory=time.time)
    last_report: float = field(default_factory=time.monotonic)
    bytes_sent: int = 0
    #: Whether the slave proved the cluster secret (only such a slave gets the ACL table).
    authenticated: bool = False
    #: The ACL table last sent to this slave (compared by identity: the store makes a new one per change).
    acl_sent: AclTable | None = None

    def to_dict(self, master_max: int, max_gap: int) -> dict[str, Any]:
        """JSON form (``/health``, ``GET /broker/ha``)."""
        behind = max(0, master_max - self.acked_offset)
        return {"addr": self.addr, "broker_id": self.broker_id, "acked_offset": self.acked_offset,
                "sent_offset": self.sent_offset, "bytes_behind": behind, "in_sync": behind <= max_gap,
                "connected_at_ms": int(self.connected_at * 1000), "bytes_sent": self.bytes_sent,
                "authenticated": self.authenticated, "last_report_age_s": round(time.monotonic() - self.last_report, 3)}


class ReplicationMaster:
    """Serves the HA port of a master broker; thread-safe for the waits, loop-bound for serving."""

    def __init__(self, store: MessageStore, broker_name: str, *, sync: bool,
                 in_sync_max_gap_bytes: int = DEFAULT_IN_SYNC_MAX_GAP_BYTES,
                 flush_slave_timeout_s: float = DEFAULT_FLUSH_SLAVE_TIMEOUT_S, auth: ClusterAuth | None = None,
                 acl_store: AclStore | None = None) -> None:
        self.store = store
        #: The cluster credential slaves must prove (None: none asked, the stream is open to any slave).
        self.auth = auth
        #: This master's ACL, sent to authenticated slaves (None: not replicated).
        self.acl_store = acl_store
        self.broker_name = broker_name
        #: SYNC_MASTER: sends wait for a slave.
        self.sync = sync
        self.in_sync_max_gap_bytes = in_sync_max_gap_bytes
        self.flush_slave_timeout_s = flush_slave_timeout_s
        self._server: Listener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slaves: dict[int, SlaveState] = {}  # by connection serial
        self._serial = itertools.count(1)
        self._appends: WaiterRegistry[str] = WaiterRegistry()
        #: SYNC_MASTER sends waiting for a slave to hold their end offset.
        self._waiters: OffsetWaiters[SendStatus] = OffsetWaiters(
            self.in_sync_offset, flush_slave_timeout_s, ok=SendStatus.SEND_OK,
            timed_out=SendStatus.FLUSH_SLAVE_TIMEOUT, unavailable=SendStatus.SLAVE_NOT_AVAILABLE)
        self._tasks: set[asyncio.Task[None]] = set()
        #: Handshakes refused, by status name (bad input on the HA port is counted, never served).
        self.refused: dict[str, int] = {}
        # A slave that keeps asking for what retention deleted reconnects (and fails) every few seconds.
        self._read_failures = FailureLog(log, f"{broker_name}: reading the log for a slave")
        self._refusals = FailureLog(log, f"{broker_name}: accepting a slave")
        store.add_append_listener(self._on_append)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound HA port (after :meth:`start`)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int, *, tls: TlsSettings | None = None) -> ReplicationMaster:
        """Listen on ``host:port`` (0 = a free port) on the running loop; TLS as ``tls`` says (see
        :func:`~sparkmq.platform.common.tls.create_server`)."""
        self._loop = asyncio.get_running_loop()
        self._server = await start_stream_server(self._serve, host, port, tls=tls)
        if self.auth is not None and self.auth.required and not self.auth.has_secret:
            log.info("%s: ACL is on but cluster_secret is not set: a slave would be refused", self.broker_name)
        log.info("%s: replication (HA) port %d open%s", self.broker_name, self.port,
                 " (SYNC_MASTER: sends wait for a slave)" if self.sync else "")
        return self

    async def stop(self) -> None:
        """Close the port and every slave connection; sends still waiting answer SLAVE_NOT_AVAILABLE."""
        if self._server is not None:
            self._server.close()
        self._appends.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._waiters.fail_all(SendStatus.SLAVE_NOT_AVAILABLE)

    # -- what sends ask -------------------------------------------------------------------------
    def in_sync_offset(self) -> int | None:
        """The highest offset an in-sync slave acknowledged; None when no slave is in sync."""
        master_max = self.store.log_offsets().max_offset
        best: int | None = None
        for slave in list(self._slaves.values()):
            if master_max - slave.acked_offset <= self.in_sync_max_gap_bytes:
                best = slave.acked_offset if best is None else max(best, slave.acked_offset)
        return best

    def wait_replicated(self, end_offset: int,
                        loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Future[SendStatus]:
        """A loop future of the send's status once a slave holds the log up to ``end_offset``."""
        return self._waiters.wait(end_offset, loop)

    def await_replicated(self, end_offset: int) -> SendStatus:
        """:meth:`wait_replicated` for a thread: blocks up to ``flush_slave_timeout_s``."""
        return self._waiters.await_offset(end_offset)

    # -- status ---------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The master's replication state: its max offset and every slave (JSON form)."""
        master_max = self.store.log_offsets().max_offset
        slaves = [s.to_dict(master_max, self.in_sync_max_gap_bytes) for s in list(self._slaves.values())]
        return {"role": "SYNC_MASTER" if self.sync else "ASYNC_MASTER", "max_offset": master_max,
                "ha_port": self.port if self._server is not None and self._server.sockets else None,
                "slaves": slaves, "in_sync_slaves": sum(1 for s in slaves if s["in_sync"]),
                "max_bytes_behind": max((s["bytes_behind"] for s in slaves), default=None),
                "waiting_sends": len(self._waiters), "refused": dict(self.refused)}

    # -- serving --------------------------------------------------------------------------------
    def _on_append(self, event: AppendEvent) -> None:
        self._appends.notify(_LOG_KEY)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        addr = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        serial = next(self._serial)
        try:
            slave = await self._handshake(reader, writer, addr)
            if slave is None:
                return
            self._slaves[serial] = slave
            log.info("%s: slave %d connected from %s at offset %d", self.broker_name, slave.broker_id, addr,
                     slave.acked_offset)
            reports = asyncio.create_task(self._read_reports(reader, slave))
            self._tasks.add(reports)
            try:
                await self._transfer(writer, slave, reports)
            finally:
                reports.cancel()
                self._tasks.discard(reports)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.info("%s: slave connection %s ended: %s", self.broker_name, addr, type(exc).__name__)
        except asyncio.CancelledError:
            pass
        finally:
            gone = self._slaves.pop(serial, None)
            if gone is not None:
                log.info("%s: slave %d at %s disconnected", self.broker_name, gone.broker_id, addr)
                if self.in_sync_offset() is None:
                    self._waiters.release(None)  # nobody left to acknowledge the waiting sends
            writer.close()
            self._tasks.discard(task)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         addr: str) -> SlaveState | None:
        offsets = self.store.log_offsets()
        fixed = await asyncio.wait_for(reader.readexactly(HELLO_FIXED.size), HELLO_TIMEOUT_S)
        magic, version, broker_id, slave_max, name_len = HELLO_FIXED.unpack(fixed)
        status = HandshakeStatus.OK
        name = ""
        proof: bytes | None = None
        raw = b""
        if magic != HA_MAGIC or version not in (HA_VERSION, HA_VERSION_AUTH) or name_len > MAX_NAME_BYTES:
            status = HandshakeStatus.BAD_HELLO
        else:
            raw = await asyncio.wait_for(reader.readexactly(name_len), HELLO_TIMEOUT_S)
            if version == HA_VERSION_AUTH:
                proof = await asyncio.wait_for(reader.readexactly(PROOF.size), HELLO_TIMEOUT_S)
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                status = HandshakeStatus.BAD_HELLO
        authenticated, reason = False, ""
        identity = ha_identity(name, broker_id)
        if status is HandshakeStatus.OK and self.auth is not None and (self.auth.required or proof is not None):
            # Checked first: a slave that cannot prove the secret learns nothing about this log.
            why = self.auth.check("HA", identity, proof, fixed + raw)
            if why is None:
                authenticated = True
            elif self.auth.required or self.auth.has_secret:
                status, reason = HandshakeStatus.UNAUTHENTICATED, why
        if status is HandshakeStatus.OK:
            if name != self.broker_name:
                status = HandshakeStatus.WRONG_BROKER_NAME
            elif slave_max > offsets.max_offset:
                status = HandshakeStatus.SLAVE_AHEAD
            elif slave_max < offsets.min_offset or slave_max < 0:
                status = HandshakeStatus.SLAVE_BEHIND_RETENTION
        shown_max = 0 if status is HandshakeStatus.UNAUTHENTICATED else offsets.max_offset
        welcome = WELCOME.pack(HA_MAGIC, HA_VERSION_AUTH if authenticated else HA_VERSION, int(status), shown_max)
        writer.write(welcome)
        if authenticated and status is HandshakeStatus.OK:
            assert self.auth is not None and proof is not None
            writer.write(self.auth.answer("HA", identity, proof, fixed + raw + welcome))
        await writer.drain()
        if status is not HandshakeStatus.OK:
            self.refused[status.name] = self.refused.get(status.name, 0) + 1
            if status is HandshakeStatus.UNAUTHENTICATED:
                assert self.auth is not None
                self.auth.note_refusal(f"{self.broker_name} HA port", addr, reason)
            else:
                self._refusals.failure("%s: %s (its broker name %r, offset %d; this log %d..%d)", addr, status.name,
                                       name, slave_max, offsets.min_offset, offsets.max_offset)
            return None
        self._refusals.success()
        return SlaveState(addr, broker_id, slave_max, slave_max, authenticated=authenticated)

    def _send_acl_if_changed(self, writer: asyncio.StreamWriter, slave: SlaveState) -> None:
        """Queue an ACL frame when this master's table is not the one the slave last got."""
        store = self.acl_store
        if store is None or not slave.authenticated:
            return
        store.maybe_reload()  # a change made through the API (another AclStore over the same file)
        table = store.stored
        if table is slave.acl_sent:
            return
        data = encode_acl(table)
        slave.acl_sent = table
        if len(data) > MAX_ACL_BYTES:
            log.error("%s: the ACL table is %d bytes, more than %d: not sent to slave %s", self.broker_name,
                      len(data), MAX_ACL_BYTES, slave.addr)
            return
        writer.write(TRANSFER_HEADER.pack(ACL_FRAME, len(data)))
        writer.write(data)
        log.info("%s: sent the ACL table (version %d, %d users) to slave %s", self.broker_name, table.version,
                 len(table.users), slave.addr)

    async def _read_reports(self, reader: asyncio.StreamReader, slave: SlaveState) -> None:
        try:
            while True:
                data = await asyncio.wait_for(reader.readexactly(REPORT.size), SLAVE_SILENCE_S)
                (offset,) = REPORT.unpack(data)
                if offset < slave.acked_offset or offset > slave.sent_offset:
                    # A slave cannot hold what it was not sent, nor lose what it reported: refuse the stream.
                    log.warning("%s: slave %s reported offset %d outside %d..%d; disconnecting it",
                                self.broker_name, slave.addr, offset, slave.acked_offset, slave.sent_offset)
                    return
                slave.acked_offset = offset
                slave.last_report = time.monotonic()
                if self._waiters:
                    self._waiters.release(self.in_sync_offset())
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            return

    async def _transfer(self, writer: asyncio.StreamWriter, slave: SlaveState, reports: asyncio.Task[None]) -> None:
        store = self.store
        while not reports.done():
            self._send_acl_if_changed(writer, slave)
            try:
                data = store.read_replication(slave.sent_offset, TRANSFER_BYTES)
            except SparkMQError as exc:  # retention deleted what the slave still needs
                self._read_failures.failure("at %d for slave %s: %s", slave.sent_offset, slave.addr, exc)
                return
            self._read_failures.success()
            if data:
                writer.write(TRANSFER_HEADER.pack(slave.sent_offset, len(data)))
                writer.write(data)
                slave.sent_offset += len(data)
                slave.bytes_sent += len(data)
                await writer.drain()
                continue
            start = slave.sent_offset

            def grown(s: int = start) -> bool:
                return store.log_offsets().max_offset > s
            woken = await self._appends.wait(_LOG_KEY, HEARTBEAT_INTERVAL_S, grown)
            if not woken and not reports.done():
                writer.write(TRANSFER_HEADER.pack(slave.sent_offset, 0))  # heartbeat
                await writer.drain()

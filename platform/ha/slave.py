"""The slave's side of replication: follow the master's commit log byte for byte.

:class:`ReplicationSlave` is one thread with a blocking socket to the master's HA port
(protocol: :mod:`.protocol`): it says HELLO with its max offset, appends every TRANSFER at
exactly its start offset (``MessageStore.append_replicated`` checks every record and rebuilds the
consume queues from them) and REPORTs its new max offset after each.  A lost connection, a dead
master (no heartbeat for 3 intervals) or a refused handshake is retried with a growing pause;
where the master's HA port is comes from ``master_addr()`` (config, or the name servers' answer to
the slave's registration), asked again before every attempt.

With a cluster secret (:class:`~.cluster_auth.ClusterAuth`) the HELLO carries a proof of it and the
master must answer with its own (else nothing is taken from it); over such a session the master also
sends its ACL table, which the slave writes to its own ``config/acl.json`` (its access guard reloads it),
so the slave enforces the master's users and policies -- after a restart too.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..auth.store import AclStore
from ..common.backoff import Backoff, RetryDelays
from ..common.errors import SparkMQError
from ..common.failure_log import FailureLog
from ..common.tls import TlsSettings
from ..common.validation import split_addr
from ..store import MessageStore
from .acl_copy import apply_acl
from .cluster_auth import MAC_BYTES, ClusterAuth
from .protocol import (
    ACL_FRAME,
    HA_VERSION,
    HA_VERSION_AUTH,
    HEARTBEAT_INTERVAL_S,
    MAX_ACL_BYTES,
    REPORT,
    REPORT_INTERVAL_S,
    TRANSFER_BYTES,
    TRANSFER_HEADER,
    WELCOME,
    HandshakeStatus,
    encode_hello,
    ha_identity,
)

__all__ = ["ReplicationSlave"]

log = logging.getLogger("sparkmq.ha")

_CONNECT_TIMEOUT_S = 3.0
#: No frame (not even a heartbeat) for this long: the master is gone.
_DEAD_MASTER_S = 3 * HEARTBEAT_INTERVAL_S
#: The pause before reconnecting: 0.2 s doubling to 5 s, from 0.2 s again after a session that ended cleanly.
_RECONNECT = Backoff(initial_s=0.2, max_s=5.0)


class HandshakeRefused(Exception):
    """The master answered the HELLO with a status other than OK (or did not prove the cluster secret)."""

    def __init__(self, status: HandshakeStatus, master_max: int, detail: str | None = None) -> None:
        super().__init__(detail or f"{status.name} (master max offset {master_max})")
        self.status = status


class ReplicationSlave:
    """Replicates a master's log into ``store`` on a daemon thread."""

    def __init__(self, store: MessageStore, broker_name: str, broker_id: int,
                 master_addr: Callable[[], str | None], *, tls: TlsSettings | None = None,
                 auth: ClusterAuth | None = None, acl_store: AclStore | None = None) -> None:
        self.store = store
        #: The cluster secret proven in the HELLO (None or no secret: a plain version-1 HELLO).
        self.auth = auth
        #: Where the master's ACL table is written (None: an ACL frame is ignored).
        self.acl_store = acl_store
        #: ACL tables received from the master.
        self.acl_updates = 0
        #: Connect to the master over TLS when ``tls.connects`` (verified against ``tls.ca_file``).
        self.tls = tls or TlsSettings()
        self.broker_name = broker_name
        self.broker_id = broker_id
        self._master_addr = master_addr
        # A master that is down fails every reconnect (every few seconds): logged quietly.
        self._failures = FailureLog(log, f"{broker_name}: replication from the master")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._buffer = bytearray(TRANSFER_BYTES + TRANSFER_HEADER.size)
        #: Where the current connection goes, and whether the handshake succeeded.
        self.master: str | None = None
        self.connected = False
        #: The master's max offset as last heard (WELCOME, then each TRANSFER's end).
        self.master_offset: int | None = None
        self.bytes_received = 0
        self.sessions = 0
        self.last_error: str | None = None
        self.last_transfer: float | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> ReplicationSlave:
        """Start the replication thread (idempotent)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"sparkmq-ha-slave-{self.broker_name}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop replicating: close the connection, join the thread."""
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's blocking recv
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def status(self) -> dict[str, Any]:
        """The slave's replication state (JSON form)."""
        local = self.store.log_offsets().max_offset if self.store.is_open else None
        behind = None if local is None or self.master_offset is None else max(0, self.master_offset - local)
        return {"role": "SLAVE", "master_ha_addr": self.master, "connected": self.connected,
                "max_offset": local, "master_max_offset": self.master_offset, "bytes_behind": behind,
                "bytes_received": self.bytes_received, "sessions": self.sessions, "last_error": self.last_error,
                "authenticated": self.auth is not None and self.auth.has_secret, "acl_updates": self.acl_updates,
                "last_transfer_age_s": None if self.last_transfer is None
                else round(time.monotonic() - self.last_transfer, 3)}

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        delays = RetryDelays(_RECONNECT)
        while not self._stop.is_set():
            addr = self._master_addr()
            if addr is None:
                self._stop.wait(1.0)  # the master has not registered yet
                continue
            try:
                self._session(addr)
                delays.reset()
            except (OSError, SparkMQError, HandshakeRefused) as exc:
                message = f"{type(exc).__name__}: {exc}"
                if not self._stop.is_set():
                    self._failures.failure("%s: %s", addr, message)
                self.last_error = message
                if isinstance(exc, HandshakeRefused):
                    delays.hold_at_max()  # retrying at once cannot change the master's answer
            finally:
                self.connected = False
                sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
            self._stop.wait(delays.next_s())

    def _session(self, addr: str) -> None:
        host, port = split_addr(addr, "master HA address")
        self.master = addr
        sock = self._sock = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S)
        if self._stop.is_set():
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self._sock = self.tls.wrap_client_socket(sock, host)  # an ssl.SSLError is an OSError: retried
        store = self.store
        auth = self.auth if self.auth is not None and self.auth.has_secret else None
        hello = encode_hello(self.broker_name, self.broker_id, store.log_offsets().max_offset,
                             version=HA_VERSION_AUTH if auth is not None else HA_VERSION)
        identity = ha_identity(self.broker_name, self.broker_id)
        proof = auth.prove("HA", identity, hello) if auth is not None else b""
        sock.sendall(hello + proof)
        welcome = self._recv_exactly(sock, WELCOME.size)
        magic, version, status, master_max = WELCOME.unpack(welcome)
        self.master_offset = master_max
        if status != HandshakeStatus.OK:
            raise HandshakeRefused(HandshakeStatus(status), master_max)
        if auth is not None:
            # Take nothing from a master that cannot prove the secret (an impostor at its address).
            answer = self._recv_exactly(sock, MAC_BYTES) if version == HA_VERSION_AUTH else b""
            if not auth.check_answer("HA", identity, proof, answer, hello + welcome):
                raise HandshakeRefused(HandshakeStatus.UNAUTHENTICATED, master_max,
                                       "the master did not prove the cluster secret (is cluster_secret the same "
                                       "on both brokers?)")
        self.connected = True
        self.sessions += 1
        self.last_error = None
        self._failures.success()
        log.info("%s: replicating from %s (slave at %d, master at %d)", self.broker_name, addr,
                 store.log_offsets().max_offset, master_max)
        sock.settimeout(_DEAD_MASTER_S)
        last_report = time.monotonic()
        view = memoryview(self._buffer)
        while not self._stop.is_set():
            start, length = TRANSFER_HEADER.unpack(self._recv_exactly(sock, TRANSFER_HEADER.size))
            if start == ACL_FRAME:
                if length > MAX_ACL_BYTES:
                    raise ConnectionError(f"an ACL frame of {length} bytes exceeds {MAX_ACL_BYTES}")
                self._apply_acl(self._recv_exactly(sock, length))
                continue
            if length:
                if length > TRANSFER_BYTES:
                    raise ConnectionError(f"a transfer of {length} bytes exceeds {TRANSFER_BYTES}: not a master")
                data = self._recv_into(sock, view, length)
                end = store.append_replicated(start, data)  # checks start == this log's end
                self.bytes_received += length
                self.master_offset = max(self.master_offset or 0, end)
                self.last_transfer = time.monotonic()
                sock.sendall(REPORT.pack(end))
                last_report = self.last_transfer
            elif time.monotonic() - last_report >= REPORT_INTERVAL_S:
                sock.sendall(REPORT.pack(store.log_offsets().max_offset))
                last_report = time.monotonic()

    def _apply_acl(self, data: bytes) -> None:
        """Make the master's ACL table this slave's (written to its ``config/acl.json``)."""
        if self.auth is None or not self.auth.has_secret:
            return  # only an authenticated session carries one; a plain one never should
        if self.acl_store is None:
            return
        try:
            table = apply_acl(self.acl_store, data)
        except ValueError as exc:
            raise ConnectionError(f"the master sent an ACL table that does not parse: {exc}") from None
        self.acl_updates += 1
        log.info("%s: ACL table from the master applied (%d users, %d policies)", self.broker_name,
                 len(table.users), len(table.policies))

    @staticmethod
    def _recv_exactly(sock: socket.socket, size: int) -> bytes:
        chunks = []
        while size:
            chunk = sock.recv(size)
            if not chunk:
                raise ConnectionError("the master closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    @staticmethod
    def _recv_into(sock: socket.socket, view: memoryview, size: int) -> memoryview:
        got = 0
        while got < size:
            n = sock.recv_into(view[got:size])
            if not n:
                raise ConnectionError("the master closed the connection")
            got += n
        return view[:size]

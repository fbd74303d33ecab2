"""TCP between the members of a DLedger group: a listening port, and one outgoing connection per peer.

Each node listens on its own port.  A node sends its requests to a peer over the connection *it*
opened to that peer and reads the replies from it (matched by RPC id, so several calls may be in
flight); the peer's requests come over the peer's own connection.  Frames: :mod:`.messages`.

What comes in is checked before the node sees it, and bad input never reaches the node's state:

* a frame header with the wrong magic or version, a body longer than :data:`~.messages.MAX_FRAME_BYTES`,
  a body that does not decode as a request: the connection is closed, unanswered;
* a request naming another group, or a sender that is not a member: a ``refused`` reply, then close;
* a reply naming another group or another sender than the peer called: the connection is closed.

Every refusal is counted in :attr:`RaftTransport.refused` by reason.  A call that fails (refused
connection, reset, timeout) closes that connection; the next call opens a new one.

**Cluster credential** (:mod:`..cluster_auth`).  A node with a ``cluster_secret`` opens every connection
with ``"RA" | version u8 = 1 | node id length u8 | node id | proof`` (timestamp, nonce, mac over the
group and its id) and waits for ``status u8 | mac (32 bytes)``: status 0 and the peer's own mac over its
nonce, else it closes (the peer refused it, or cannot prove the secret itself).  A node that requires the
credential (ACL on, or a secret set) refuses a connection that starts with anything else, or with a wrong,
stale or replayed proof (logged once per address and reason, audited, counted as ``unauthenticated``),
and serves an authenticated connection only requests whose sender is the node that proved itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

from ...common.tls import Listener, TlsSettings, start_stream_server
from ..cluster_auth import MAC_BYTES, PROOF, ClusterAuth
from .messages import (
    FRAME_HEADER,
    FRAME_MAGIC,
    FRAME_VERSION,
    MAX_FRAME_BYTES,
    Refusal,
    Reply,
    Request,
    decode_reply,
    decode_request,
    frame_parts,
)

__all__ = ["RaftTransport", "RpcError"]

log = logging.getLogger("sparkmq.ha.dledger")

_M = TypeVar("_M")
#: Opening a connection to a peer takes at most this long (within the call's own timeout).
_CONNECT_TIMEOUT_S = 2.0
#: Stream buffers sized for whole batches of entries (a 1 MiB AppendEntries arrives without the reader
#: pausing and resuming its socket every 64 KiB, asyncio's default).
_STREAM_LIMIT = 4 << 20


#: The cluster-credential preamble a connecting node sends first, and the answer (see the module docstring).
AUTH_MAGIC = b"RA"
_AUTH_VERSION = 1
_AUTH_ANSWER = struct.Struct(f"<B{MAC_BYTES}s")
#: A connection must finish the credential exchange this soon.
_AUTH_TIMEOUT_S = 5.0


def _auth_identity(group: str, node_id: str) -> str:
    return f"{group}/{node_id}"


class RpcError(ConnectionError):
    """A call to a peer failed: no connection, connection lost, or no reply in time."""


#: ``callback(reply, None)`` or ``callback(None, error)``: how a sent request's outcome is told.
ReplyCallback = Callable[["Reply | None", "RpcError | None"], None]


class _PeerLink:
    """The connection this node opened to one peer, and the calls waiting on it."""

    def __init__(self, transport: RaftTransport, peer_id: str) -> None:
        self.transport = transport
        self.peer_id = peer_id
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        #: What waits for each reply by RPC id: called with (reply, None) or (None, the error).
        self.pending: dict[int, ReplyCallback] = {}
        self.lock = asyncio.Lock()

    async def connected(self) -> asyncio.StreamWriter:
        async with self.lock:
            if self.writer is not None and not self.writer.is_closing():
                return self.writer
            host, port = self.transport.peers[self.peer_id]
            ctx = self.transport.tls.client_context_if_connecting()
            tls: dict[str, Any] = {} if ctx is None else {"ssl": ctx, "server_hostname": host}
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=_STREAM_LIMIT, **tls),
                                                    _CONNECT_TIMEOUT_S)
            auth = self.transport.auth
            if auth is not None and auth.has_secret:
                try:
                    await asyncio.wait_for(self._prove(reader, writer, auth), _AUTH_TIMEOUT_S)
                except BaseException:
                    writer.transport.abort()
                    raise
            writer.transport.set_write_buffer_limits(high=_STREAM_LIMIT)
            self.writer = writer
            self.reader_task = asyncio.create_task(self._read_replies(reader, writer),
                                                   name=f"raft-{self.transport.node_id}-to-{self.peer_id}")
            return writer

    async def _prove(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, auth: ClusterAuth) -> None:
        """Prove the cluster secret to the peer and check its proof back; ConnectionError when either fails."""
        t = self.transport
        me = t.node_id.encode()
        proof = auth.prove("DLEDGER", _auth_identity(t.group, t.node_id))
        writer.write(AUTH_MAGIC + bytes((_AUTH_VERSION, len(me))) + me + proof)
        try:
            status, mac = _AUTH_ANSWER.unpack(await reader.readexactly(_AUTH_ANSWER.size))
        except asyncio.IncompleteReadError:  # a peer without a cluster secret closes on the preamble
            status, mac = 2, b""
        why = None
        if status == 2:
            why = "the peer closed the connection on the cluster credential (has it a cluster_secret?)"
        elif status != 0:
            why = "the peer refused this node's cluster credential (is cluster_secret the same on every member?)"
        elif not auth.check_answer("DLEDGER", _auth_identity(t.group, self.peer_id), proof, mac):
            why = "the peer did not prove the cluster secret"
        if why is not None:
            t._count("peer unauthenticated")
            if (self.peer_id, why) not in t._logged:
                t._logged.add((self.peer_id, why))
                log.warning("%s/%s: connection to %s: %s", t.group, t.node_id, self.peer_id, why)
            raise ConnectionError(why)

    async def _read_replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = "closed"
        try:
            while True:
                reply = await _read_frame(reader, decode_reply)
                if reply is None:
                    why = "garbage reply"
                    self.transport._count("garbage reply")
                    return
                if reply.group != self.transport.group or reply.sender != self.peer_id:
                    why = f"reply from {reply.sender!r} of group {reply.group!r}"
                    self.transport._count("reply from a stranger")
                    return
                waiting = self.pending.pop(reply.rpc_id, None)
                if waiting is not None:
                    waiting(reply, None)  # at once, not a loop pass later: the leader's commit waits on it
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            why = type(exc).__name__
        finally:
            self.drop(writer, why)

    def drop(self, writer: asyncio.StreamWriter | None, why: str) -> None:
        """Abort ``writer`` (the current connection if None) and fail every call waiting on it."""
        writer = writer if writer is not None else self.writer
        if writer is None:
            return
        writer.transport.abort()
        if writer is self.writer:
            self.writer = None
            pending, self.pending = self.pending, {}
            error = RpcError(f"connection to {self.peer_id} lost: {why}")
            loop = asyncio.get_running_loop()
            for waiting in pending.values():  # in the order they were sent; never inside the caller's own step
                loop.call_soon(waiting, None, error)

    def write(self, writer: asyncio.StreamWriter, request: Request, timeout: float, on_reply: ReplyCallback,
              frame: tuple[bytes, bytes] | None = None) -> None:
        """Write ``request`` (already encoded as ``frame``, if given) now and have ``on_reply`` called with its
        reply (or the error) within ``timeout``."""
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout, self._timed_out, writer, request.rpc_id, timeout)

        def answered(reply: Reply | None, error: RpcError | None) -> None:
            timer.cancel()
            on_reply(reply, error)
        self.pending[request.rpc_id] = answered
        try:
            writer.writelines(frame if frame is not None else frame_parts(request))
        except (RuntimeError, OSError) as exc:  # the transport closed under us
            self.drop(writer, type(exc).__name__)

    def _timed_out(self, writer: asyncio.StreamWriter, rpc_id: int, timeout: float) -> None:
        if rpc_id in self.pending and writer is self.writer:
            # A silent peer: start over on a new connection rather than queue behind what it never read.
            self.drop(writer, f"no reply within {timeout:.3f} s")


class RaftTransport:
    """The listening port and the peer connections of one node; loop-bound.

    ``handler`` answers each request synchronously (no await between reading and replying, so a
    request is handled whole before the next one).
    """

    def __init__(self, group: str, node_id: str, peers: Mapping[str, tuple[str, int]],
                 handler: Callable[[Request], Reply], *, max_frame_bytes: int = MAX_FRAME_BYTES,
                 tls: TlsSettings | None = None, auth: ClusterAuth | None = None) -> None:
        self.group = group
        #: The cluster credential this node proves and, when required, asks of every connection.
        self.auth = auth
        self._logged: set[tuple[str, str]] = set()
        #: The port's TLS, and whether (and how) connections to peers use it.
        self.tls = tls or TlsSettings()
        self.node_id = node_id
        #: Where each peer listens (changeable: :meth:`set_peer_address`).
        self.peers: dict[str, tuple[str, int]] = dict(peers)
        self.handler = handler
        self.max_frame_bytes = max_frame_bytes
        self._links = {peer: _PeerLink(self, peer) for peer in self.peers}
        self._server: Listener | None = None
        self._inbound: set[asyncio.StreamWriter] = set()
        self._rpc_ids = itertools.count(1)
        #: Sends waiting for a connection to open.
        self._connecting: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Connections or requests refused, by reason.
        self.refused: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (0 = a free port)."""
        self._server = await start_stream_server(self._serve, host, port, tls=self.tls, limit=_STREAM_LIMIT)

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``."""
        assert self._server is not None and self._server.sockets, "not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def set_peer_address(self, peer_id: str, address: tuple[str, int]) -> None:
        """Where ``peer_id`` listens from now on; the current connection to it is dropped."""
        if peer_id not in self.peers:
            raise ValueError(f"{peer_id!r} is not a peer of {self.node_id!r}")
        self.peers[peer_id] = address
        self._links[peer_id].drop(None, "peer address changed")

    async def close(self) -> None:
        """Abort every connection and stop listening: no goodbye is sent to anyone."""
        self._closed = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._inbound):
            writer.transport.abort()
        tasks = list(self._connecting)
        for task in tasks:
            task.cancel()
        for link in self._links.values():
            link.drop(None, "transport closed")
            if link.reader_task is not None:
                link.reader_task.cancel()
                tasks.append(link.reader_task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    # -- calls ----------------------------------------------------------------------------------
    def next_rpc_id(self) -> int:
        """A fresh RPC id for a request this node sends."""
        return next(self._rpc_ids)

    async def call(self, peer_id: str, request: Request, timeout: float) -> Reply:
        """Send ``request`` to ``peer_id`` and wait for its reply; :class:`RpcError` when none comes in time."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

        def settle(reply: Reply | None, error: RpcError | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(reply)  # type: ignore[arg-type]
        self.send(peer_id, request, timeout, settle)
        return await fut

    def send(self, peer_id: str, request: Request, timeout: float, on_reply: ReplyCallback,
             frame: tuple[bytes, bytes] | None = None) -> None:
        """Send ``request`` to ``peer_id`` and call ``on_reply(reply, None)``, or ``on_reply(None, error)``
        (an :class:`RpcError`: no connection, connection lost, no reply within ``timeout``).  ``frame``: the
        request already encoded (:func:`~.messages.frame_parts`), when the same one goes to several peers.

        On an open connection the frame is written in this call and the reply handled as soon as it is
        read (no task, no loop pass between): the leader's replication latency is these hops.  Errors are
        always reported from a later loop step, never from inside this call.
        """
        loop = asyncio.get_running_loop()
        if self._closed:
            loop.call_soon(on_reply, None, RpcError("transport closed"))
            return
        link = self._links[peer_id]
        writer = link.writer
        if writer is not None and not writer.is_closing():
            link.write(writer, request, timeout, on_reply, frame)
            return
        task = loop.create_task(self._connect_and_send(link, request, timeout, on_reply))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect_and_send(self, link: _PeerLink, request: Request, timeout: float,
                                on_reply: ReplyCallback) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                writer = await link.connected()
        except (TimeoutError, OSError) as exc:
            why = f"no connection within {timeout:.3f} s" if isinstance(exc, TimeoutError) else str(exc)
            on_reply(None, RpcError(f"cannot reach {link.peer_id} at {self.peers[link.peer_id]}: {why}"))
            return
        except asyncio.CancelledError:  # the transport is closing
            on_reply(None, RpcError("transport closed"))
            raise
        if self._closed:
            on_reply(None, RpcError("transport closed"))
            return
        link.write(writer, request, max(0.0, deadline - loop.time()), on_reply)  # one timeout covers both

    # -- serving --------------------------------------------------------------------------------
    def _count(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:
            writer.transport.abort()
            return
        self._inbound.add(writer)
        try:
            prefix, proven = await self._authenticate(reader, writer)
            if prefix is None:
                return
            while True:
                request = await _read_frame(reader, decode_request, self.max_frame_bytes, prefix)
                prefix = b""
                if request is None:
                    self._count("garbage frame")
                    log.warning("%s/%s: garbage frame from %s; closing", self.group, self.node_id,
                                writer.get_extra_info("peername"))
                    return
                refusal = self._refusal(request)
                if refusal is None and proven is not None and request.sender != proven:
                    refusal = f"sender is not {proven!r}, the member that proved itself on this connection"
                if refusal is not None:
                    self._count(refusal)
                    log.warning("%s/%s: refused %s from %r of group %r: %s", self.group, self.node_id,
                                type(request).__name__, request.sender, request.group, refusal)
                    await _send(writer, Refusal(self.group, self.node_id, request.rpc_id, 0, refusal))
                    return
                try:
                    reply = self.handler(request)
                except Exception:  # a bug must not take the port down; the sender retries
                    log.exception("%s/%s: handling %s failed", self.group, self.node_id, type(request).__name__)
                    self._count("handler error")
                    return
                if isinstance(reply, Refusal):  # the node would not serve it: answer, count, close
                    self._count(reply.reason)
                    await _send(writer, reply)
                    return
                if not await _send(writer, reply):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, OSError, TimeoutError):
            return
        finally:
            self._inbound.discard(writer)
            writer.transport.abort()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                            ) -> tuple[bytes | None, str | None]:
        """(bytes already read of the first frame, or None to close; the member that proved itself, if any)."""
        auth = self.auth
        if auth is None or not (auth.required or auth.has_secret):
            return b"", None
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else str(peername)
        where = f"{self.group}/{self.node_id} DLedger port"
        first = await asyncio.wait_for(reader.readexactly(len(AUTH_MAGIC)), _AUTH_TIMEOUT_S)
        if first != AUTH_MAGIC:
            if not auth.required:
                return first, None
            self._count("unauthenticated")
            auth.note_refusal(where, peer, auth.check("DLEDGER", "", None) or "no cluster credential")
            return None, None
        version, id_len = await asyncio.wait_for(reader.readexactly(2), _AUTH_TIMEOUT_S)
        sender = (await asyncio.wait_for(reader.readexactly(id_len), _AUTH_TIMEOUT_S)).decode("utf-8", "replace")
        proof = await asyncio.wait_for(reader.readexactly(PROOF.size), _AUTH_TIMEOUT_S)
        if version != _AUTH_VERSION:
            why: str | None = f"unknown credential version {version}"
        elif sender not in self.peers:
            why = f"{sender!r} is not a member"
        else:
            why = auth.check("DLEDGER", _auth_identity(self.group, sender), proof)
        if why is not None:
            self._count("unauthenticated")
            auth.note_refusal(where, peer, why)
            writer.write(_AUTH_ANSWER.pack(1, bytes(MAC_BYTES)))
            await writer.drain()
            return None, None
        writer.write(_AUTH_ANSWER.pack(0, auth.answer("DLEDGER", _auth_identity(self.group, self.node_id), proof)))
        return b"", sender

    def _refusal(self, request: Request) -> str | None:
        if request.group != self.group:
            return "wrong group"
        if request.sender not in self.peers:
            return "not a member"
        return None


async def _send(writer: asyncio.StreamWriter, message: Reply) -> bool:
    """Write one reply frame; False when the connection is already closed (the reply is moot then)."""
    if writer.is_closing():
        return False
    try:
        writer.writelines(frame_parts(message))
    except RuntimeError:  # uvloop raises this for a transport closed under us
        return False
    await writer.drain()
    return True


async def _read_frame(reader: asyncio.StreamReader, decode: Callable[[bytes], _M],
                      max_bytes: int = MAX_FRAME_BYTES, prefix: bytes = b"") -> _M | None:
    """The next decoded message; None when the frame is not one of ours (the caller closes).  ``prefix``: the
    first bytes of its header, already read."""
    header = prefix + await reader.readexactly(FRAME_HEADER.size - len(prefix))
    magic, version, length = FRAME_HEADER.unpack(header)
    if magic != FRAME_MAGIC or version != FRAME_VERSION or length > max_bytes:
        return None
    body = await reader.readexactly(length)
    try:
        return decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError included; a str not UTF-8 is the last
        return None

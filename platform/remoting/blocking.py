"""Blocking request/response on the calling thread: no event loop between the caller and the socket.

A synchronous request on a :class:`~.client.RemotingConnection` crosses two threads: the caller
hands the write to the loop thread, and the loop thread wakes the caller with the answer.  For one
small request at a time (``Producer.send``) those two hand-offs cost about as much as the broker's
work.  :class:`BlockingConnection` is a plain blocking socket used by one thread at a time: it writes
the frame and reads the answer itself, as redis-py's and JDBC's connections do.

:class:`DirectConnections` keeps one per (thread, address), up to ``max_per_addr`` per address;
beyond that (many threads sending at once) callers use the multiplexed connection instead.  The
server never pushes to these connections (pushes go to the connection a client's heartbeat bound),
and a connection idle past the server's idle timeout is noticed closed and reopened before use.
"""
from __future__ import annotations

import select
import socket
import ssl
import threading
import time
import weakref

from ..common.protocol import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_FRAME_BYTES, FLAG_RESPONSE
from ..common.validation import split_addr
from .client import SUCCESS_ONLY, Ext
from .codec import Frame, FrameDecoder, ProtocolError, RemotingError, Response, encode_frame, error_from_frame

__all__ = ["BlockingConnection", "DirectConnections"]

_MASK31 = 0x7FFFFFFF
_RECV_BYTES = 256 * 1024


class BlockingConnection:
    """One TCP connection used by one thread at a time for request/response; not thread-safe."""

    def __init__(self, addr: str, *, connect_timeout_s: float,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, ssl_context: ssl.SSLContext | None = None) -> None:
        self.addr = addr
        host, port = split_addr(addr, "remoting address")
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            raise RemotingError(addr, f"cannot connect: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except OSError as exc:  # ssl.SSLError included: a failed verification, a server without TLS
                sock.close()
                raise RemotingError(addr, f"TLS handshake failed: {exc}") from None
        self._sock = sock
        self._decoder = FrameDecoder(max_frame_bytes)
        self._max_frame_bytes = max_frame_bytes
        self._opaque = 0
        self._used = time.monotonic()
        self.closed = False

    def request(self, code: int, ext: Ext, body: bytes | memoryview, timeout: float | None,
                ok: frozenset[int] = SUCCESS_ONLY) -> Response:
        """Send one request and read its answer on this thread; errors as ``RemotingConnection.request``.

        A failed or timed-out exchange closes the connection (a late answer must never be taken for the
        next request's).
        """
        if self.closed:
            raise RemotingError(self.addr, "connection is closed")
        self._opaque = op = (self._opaque + 1) & _MASK31 or 1
        data = encode_frame(code, 0, op, ext, body)
        sock = self._sock
        try:
            sock.settimeout(timeout)
            if isinstance(data, bytes):
                sock.sendall(data)
            else:
                for part in data:
                    sock.sendall(part)
            frame = self._read_answer(op)
        except TimeoutError:
            self.close()
            raise RemotingError(self.addr, f"request code {code} timed out after {timeout:g}s", timed_out=True) \
                from None
        except (OSError, ProtocolError) as exc:
            self.close()
            raise RemotingError(self.addr, f"connection failed: {exc}") from None
        self._used = time.monotonic()
        if frame.code in ok:
            return frame
        raise error_from_frame(frame)

    def _read_answer(self, op: int) -> Frame:
        sock, decoder = self._sock, self._decoder
        while True:
            data = sock.recv(_RECV_BYTES)
            if not data:
                raise OSError("closed by the peer")
            for frame in decoder.feed(data):
                if frame.flag & FLAG_RESPONSE and frame.opaque == op:
                    return frame  # one request at a time: nothing can follow its answer

    def usable(self, idle_limit_s: float) -> bool:
        """Open, used recently enough that the server keeps it, and not closed by the peer meanwhile."""
        if self.closed:
            return False
        if time.monotonic() - self._used > idle_limit_s:
            self.close()
            return False
        # Readable while idle means EOF or a reset: the server closed it.
        readable, _, _ = select.select([self._sock], [], [], 0)
        if readable and not self._only_tls_records():
            self.close()
            return False
        return True

    def _only_tls_records(self) -> bool:
        """Whether what made an idle TLS socket readable is TLS's own (a TLS 1.3 session ticket), not EOF."""
        sock = self._sock
        if not isinstance(sock, ssl.SSLSocket):
            return False
        try:
            sock.setblocking(False)  # request() sets its own timeout again
            sock.recv(1)  # processes the records; application data here would be a stray: drop the connection
        except ssl.SSLWantReadError:
            return True
        except OSError:
            return False
        return False

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if not self.closed:
            self.closed = True
            try:
                self._sock.close()
            except OSError:  # pragma: no cover - closing never matters here
                pass


class DirectConnections:
    """Per-thread :class:`BlockingConnection` s by address, at most ``max_per_addr`` per address."""

    def __init__(self, *, connect_timeout_s: float, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_per_addr: int = 8, idle_limit_s: float = DEFAULT_IDLE_TIMEOUT_S / 2,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context
        self.max_frame_bytes = max_frame_bytes
        self.max_per_addr = max_per_addr
        self.idle_limit_s = idle_limit_s
        self._local = threading.local()
        self._lock = threading.Lock()
        # Every open connection, so close() reaches those of other threads too.
        self._all: weakref.WeakSet[BlockingConnection] = weakref.WeakSet()
        #: Connections being opened, by address (they count against ``max_per_addr`` already).
        self._opening: dict[str, int] = {}
        self._closed = False

    def connection(self, addr: str) -> BlockingConnection | None:
        """This thread's connection to ``addr`` (opened on first use); None when ``max_per_addr`` other
        threads already hold one (use the multiplexed connection).  Raises RemotingError if it cannot connect."""
        conns: dict[str, BlockingConnection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(addr)
        if conn is not None and conn.usable(self.idle_limit_s):
            return conn
        with self._lock:
            if self._closed:
                raise RemotingError(addr, "client is closed")
            opening = self._opening.get(addr, 0)
            if sum(1 for c in self._all if c.addr == addr and not c.closed) + opening >= self.max_per_addr:
                return None
            # Counted before connecting (outside the lock): threads arriving together cannot all pass the check.
            self._opening[addr] = opening + 1
        try:
            conn = BlockingConnection(addr, connect_timeout_s=self.connect_timeout_s,
                                      max_frame_bytes=self.max_frame_bytes, ssl_context=self.ssl_context)
            with self._lock:
                self._all.add(conn)
        finally:
            with self._lock:
                self._opening[addr] -= 1
        conns[addr] = conn
        return conn

    def close(self) -> None:
        """Close every thread's connections; later calls raise RemotingError."""
        with self._lock:
            self._closed = True
            conns = list(self._all)
        for conn in conns:
            conn.close()

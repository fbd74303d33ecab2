"""Connections by address: :class:`AsyncRemotingClient` for asyncio code and
:class:`SyncRemotingClient`, the threaded facade on the process-wide :class:`~.loop.LoopThread`.

Both pool the same :class:`~.client.RemotingConnection` class, one per address, (re)connecting
on demand.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import ssl
import threading
import weakref
from collections.abc import Callable

from ..common.errors import SparkMQError
from ..common.protocol import DEFAULT_HEARTBEAT_INTERVAL_S, DEFAULT_MAX_FRAME_BYTES
from .blocking import DirectConnections
from .client import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, SUCCESS_ONLY, Ext, RemotingConnection
from .codec import Frame, RemotingError, Reply, Response
from .loop import LoopThread

__all__ = ["AsyncRemotingClient", "SyncRemotingClient"]


class SyncRemotingClient:
    """Connections by address for synchronous code, on the process-wide :class:`LoopThread`.

    Connects on demand and reconnects after a connection closed.  Safe to share between threads;
    a forked child starts with no connections (and its own loop thread on first use).
    ``on_push(addr, frame)`` runs on the loop thread: hand work off, do not block it.
    """

    def __init__(self, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 heartbeat_interval_s: float | None = DEFAULT_HEARTBEAT_INTERVAL_S,
                 on_push: Callable[[str, Frame], Reply | None] | None = None,
                 loop_thread: LoopThread | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.on_push = on_push
        #: Connections are TLS with this context (None = plaintext).
        self.ssl_context = ssl_context
        self._loop_thread = loop_thread
        self._shared_loop = False  # whether this client holds the process-wide loop thread
        self._conns: dict[str, RemotingConnection] = {}
        self._connect_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._direct = DirectConnections(connect_timeout_s=connect_timeout_s, max_frame_bytes=max_frame_bytes,
                                         ssl_context=ssl_context)
        _SYNC_CLIENTS.add(self)

    def _forget_after_fork(self) -> None:
        # A forked child inherits these objects but not the loop thread serving them.
        self._conns = {}
        self._connect_locks = {}
        self._lock = threading.Lock()
        self._loop_thread = None
        self._shared_loop = False
        # The parent's sockets are not this process's to use (nor to close).
        self._direct = DirectConnections(connect_timeout_s=self.connect_timeout_s,
                                         max_frame_bytes=self.max_frame_bytes, ssl_context=self.ssl_context)

    @property
    def loop_thread(self) -> LoopThread:
        """The loop thread the connections run on (the process-wide one unless given)."""
        if self._loop_thread is None:
            with self._lock:
                if self._loop_thread is None:
                    self._loop_thread = LoopThread.acquire()
                    self._shared_loop = True
        return self._loop_thread

    def connection(self, addr: str) -> RemotingConnection:
        """The open connection to ``addr``, connecting (again) if needed; raises RemotingError."""
        conn = self._conns.get(addr)
        if conn is not None and not conn._closed:
            return conn
        if self._closed:
            raise RemotingError(addr, "client is closed")
        with self._lock:
            lock = self._connect_locks.setdefault(addr, threading.Lock())
        with lock:  # one connect per address at a time; the others reuse its connection
            conn = self._conns.get(addr)
            if conn is None or conn._closed:
                loop_thread = self.loop_thread
                handler = self.on_push
                on_push = None if handler is None else functools.partial(handler, addr)
                conn = loop_thread.run(RemotingConnection.connect(
                    addr, timeout=self.connect_timeout_s, max_frame_bytes=self.max_frame_bytes,
                    heartbeat_interval_s=self.heartbeat_interval_s, on_push=on_push, ssl_context=self.ssl_context))
                self._conns[addr] = conn
            return conn

    def request(self, addr: str, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                timeout: float | None = None, ok: frozenset[int] = SUCCESS_ONLY) -> Response:
        """Send a request to ``addr`` and block for its :class:`Response` (``timeout`` defaults to the client's)."""
        conn = self._conns.get(addr)
        if conn is None or conn._closed:
            conn = self.connection(addr)
        return conn.request_blocking(code, ext, body, self.request_timeout_s if timeout is None else timeout, ok)

    def request_direct(self, addr: str, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                       timeout: float | None = None, ok: frozenset[int] = SUCCESS_ONLY) -> Response:
        """:meth:`request` written and answered on the calling thread (a blocking connection of its own),
        which saves the two thread hand-offs of the shared connection: for latency-bound calls made one
        at a time (a synchronous send).  Falls back to :meth:`request` when many threads hold one already.
        """
        if self._closed:
            raise RemotingError(addr, "client is closed")
        conn = self._direct.connection(addr)
        if conn is None:
            return self.request(addr, code, ext, body, timeout, ok)
        return conn.request(code, ext, body, self.request_timeout_s if timeout is None else timeout, ok)

    def request_future(self, addr: str, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                       timeout: float | None = None, ok: frozenset[int] = SUCCESS_ONLY
                       ) -> concurrent.futures.Future[Response]:
        """Send a request without blocking for the answer; a future of its :class:`Response`.

        A connection that cannot be opened fails the future (it does not raise).
        """
        conn = self._conns.get(addr)
        if conn is None or conn._closed:
            try:
                conn = self.connection(addr)
            except SparkMQError as exc:
                future: concurrent.futures.Future[Response] = concurrent.futures.Future()
                future.set_exception(exc)
                return future
        return conn.request_future(code, ext, body, self.request_timeout_s if timeout is None else timeout, ok)

    def oneway(self, addr: str, code: int, ext: Ext = None, body: bytes | memoryview = b"") -> None:
        """Send a ONEWAY request to ``addr``."""
        self.connection(addr).oneway(code, ext, body)

    def close_connection(self, addr: str) -> None:
        """Close the connection to ``addr`` (the next request reconnects)."""
        conn = self._conns.pop(addr, None)
        if conn is not None:
            self._close(conn)

    def close(self) -> None:
        """Close every connection; later requests raise RemotingError."""
        self._closed = True
        self._direct.close()
        while self._conns:
            _, conn = self._conns.popitem()
            self._close(conn)
        with self._lock:
            shared, self._shared_loop = self._shared_loop, False
        if shared:
            LoopThread.release()

    def _close(self, conn: RemotingConnection) -> None:
        if self._loop_thread is not None and self._loop_thread.running and not self._loop_thread.in_loop_thread:
            try:
                self._loop_thread.run(conn.close(), timeout=5.0)
                return
            except Exception:  # pragma: no cover - a loop that is going away
                pass
        conn.close_threadsafe()

    def __enter__(self) -> SyncRemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SYNC_CLIENTS: weakref.WeakSet[SyncRemotingClient] = weakref.WeakSet()


def _sync_clients_after_fork() -> None:
    for client in list(_SYNC_CLIENTS):
        client._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_sync_clients_after_fork)


class AsyncRemotingClient:
    """Connections by address for asyncio code on one loop (the one first using it).

    ``on_push(addr, frame)`` runs on the loop for each notice the servers send.
    """

    def __init__(self, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 heartbeat_interval_s: float | None = DEFAULT_HEARTBEAT_INTERVAL_S,
                 on_push: Callable[[str, Frame], Reply | None] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.on_push = on_push
        #: Connections are TLS with this context (None = plaintext).
        self.ssl_context = ssl_context
        self._conns: dict[str, RemotingConnection] = {}
        self._connecting: dict[str, asyncio.Future[RemotingConnection]] = {}
        self._closed = False

    async def connection(self, addr: str) -> RemotingConnection:
        """The open connection to ``addr``, connecting (again) if needed; raises RemotingError."""
        conn = self._conns.get(addr)
        if conn is not None and not conn._closed:
            return conn
        if self._closed:
            raise RemotingError(addr, "client is closed")
        pending = self._connecting.get(addr)
        if pending is not None:  # another task is connecting: share its outcome
            return await asyncio.shield(pending)
        fut: asyncio.Future[RemotingConnection] = asyncio.get_running_loop().create_future()
        self._connecting[addr] = fut
        try:
            handler = self.on_push
            on_push = None if handler is None else functools.partial(handler, addr)
            conn = await RemotingConnection.connect(
                addr, timeout=self.connect_timeout_s, max_frame_bytes=self.max_frame_bytes,
                heartbeat_interval_s=self.heartbeat_interval_s, on_push=on_push, ssl_context=self.ssl_context)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
                fut.exception()  # mark it retrieved: tasks sharing it (if any) re-raise it
            raise
        finally:
            del self._connecting[addr]
        self._conns[addr] = conn
        fut.set_result(conn)
        return conn

    async def request(self, addr: str, code: int, ext: Ext = None, body: bytes | memoryview = b"",
                      timeout: float | None = None, ok: frozenset[int] = SUCCESS_ONLY) -> Response:
        """Send a request to ``addr`` and await its :class:`Response`."""
        conn = self._conns.get(addr)
        if conn is None or conn._closed:
            conn = await self.connection(addr)
        return await conn.request(code, ext, body, self.request_timeout_s if timeout is None else timeout, ok)

    async def oneway(self, addr: str, code: int, ext: Ext = None, body: bytes | memoryview = b"") -> None:
        """Send a ONEWAY request to ``addr``."""
        (await self.connection(addr)).oneway(code, ext, body)

    async def close(self) -> None:
        """Close every connection."""
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            await conn.close()
